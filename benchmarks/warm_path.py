"""Time `reference`'s warm path in-process (run inside a worker node, where the jail's dev/ and run/
are node-local): given the `list` output, plan the targets, check them, find nothing missing, take
no lock. Prints JSON: per-iteration seconds, file count, lock events."""
from __future__ import annotations

import json
import os
import sys
import time

from gpujail.reference_impl import core
from gpujail.world.sysops import RealSys


def main() -> None:
    listing, n = sys.argv[1], int(sys.argv[2])
    ctx = core.Ctx(RealSys(), os.environ["GPUJAIL_JAIL"])
    paths = [p for p in open(listing).read().splitlines() if p]
    times = []
    for _ in range(n):
        t = time.perf_counter()
        core.ensure_placeholders(ctx, core.plan(ctx, paths))
        times.append(time.perf_counter() - t)
    missing = len(core.missing(ctx, core.plan(ctx, paths)))
    print(json.dumps({"times": times, "files": len(paths), "missing": missing}))


if __name__ == "__main__":
    main()
