"""Figures of the jail file systems (SPEC section 8): local, GlusterFS, node-local locks.

How this works
--------------
Each kind is provided by gpujail/backends/jailfs.py (a kind this host cannot provide is a row
saying why, not an error):

  qualify  `gpujail qualify` wall time (two processes, start to both exits), each through its own
           client of the jail file system, per kind, against local
  jail-fs  legacy on cold-race with the jail on GlusterFS against local: caught n/20, median time
           to the first violation; reference starts/s, 16 workers, GlusterFS against local
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpujail.backends import kernel
from gpujail.benchmarks.bug_finding import first_violation_s
from gpujail.benchmarks.measure import Row, median, ms, ratio, start_many
from gpujail.chaos import runner, scenario
from gpujail.contract import start_worker
from gpujail.fixtures.jail import make_jail


def qualify(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """`gpujail qualify` run by two processes, each through its own client of the jail filesystem
    (gpujail/backends/jailfs.py): wall time from both starting to both exiting, and the exit code."""
    from gpujail.backends import jailfs
    walls: dict[str, list[float]] = {}
    codes: dict[str, set[int]] = {}
    rows = []
    for kind in jailfs.KINDS:
        reason = jailfs.unavailable(kind)
        if reason:
            rows.append(Row(f"qualify wall time, {kind}", f"not measured: {reason}"))
            continue
        with jailfs.provide(kind, tmp / kind, nodes=["n1", "n2"]) as fs:
            for _ in range(1 if quick else 3):
                t = time.monotonic()
                procs = [subprocess.Popen(([] if kind == "local" else ["nsenter", f"--mount={fs.node_options(n)['mount_ns']}"])
                                          + [sys.executable, "-m", "gpujail", "qualify", str(fs.jail), "--timeout", "60"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in ("n1", "n2")]
                codes.setdefault(kind, set()).update(p.wait(timeout=300) for p in procs)
                walls.setdefault(kind, []).append(time.monotonic() - t)
        base = median(walls.get("local", []))
        rows.append(Row(f"qualify wall time, {kind} (exit {'/'.join(map(str, sorted(codes[kind])))})",
                        ms(median(walls[kind])), "" if kind == "local" else f"local {ms(base)}",
                        None if kind == "local" else ratio(median(walls[kind]), base)))
    return rows, {"wall_s": walls, "exit_codes": {k: sorted(v) for k, v in codes.items()}}


# -- the jail on GlusterFS (issue 18) ---------------------------------------------------------------

def jail_fs(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """`legacy` on cold-race (deterministic) with the jail on GlusterFS, one FUSE client per node
    (gpujail/backends/jailfs.py), against a local directory: caught n/20 and the median time from
    the run's start to the first violation; then worker starts/s, reference, 16 workers at once on
    a warm jail, GlusterFS against local (median of 3)."""
    from gpujail.backends import jailfs, jailfs_fleet
    reason = jailfs.unavailable("gluster")
    if reason:
        return [Row("jail on GlusterFS", f"not measured: {reason}")], {"unavailable": reason}
    runs, reps = (3, 1) if quick else (20, 3)
    rows, raw = [], {}
    sc = scenario.load("cold-race")
    caught = {}
    for kind in ("gluster", "local"):
        fleet_class = jailfs_fleet.fleet_class(kernel.Fleet, kind)
        times = []
        for seed in range(runs):
            t = first_violation_s(runner.run(sc, "legacy", tmp / f"cold-race-{kind}-{seed}", seed=seed,
                                              fleet_class=fleet_class))
            if t is not None:
                times.append(t)
        caught[kind] = times
        raw[f"cold-race/legacy/{kind}"] = {"runs": runs, "caught": len(times), "median_s_to_violation": median(times)}
    g, loc = caught["gluster"], caught["local"]
    rows.append(Row("cold-race, deterministic, legacy, jail on GlusterFS",
                    f"caught {len(g)}/{runs}" + (f", median {median(g):.2f} s to the first violation" if g else ""),
                    f"local: caught {len(loc)}/{runs}" + (f", median {median(loc):.2f} s" if loc else ""),
                    ratio(median(g), median(loc)) if g and loc else None))
    rate = {}
    for kind in ("gluster", "local"):
        rates = []
        for rep in range(reps):
            run_dir = tmp / f"starts-{kind}-{rep}"
            jail = make_jail(run_dir / "jail")
            with jailfs_fleet.fleet_class(kernel.Fleet, kind).recording(jail, run_dir) as fleet:
                assert start_worker(fleet, "prewarm", "reference").ready
                ready, wall = start_many(fleet, "reference", 16, "w")
            rates.append(ready / wall)
        rate[kind] = median(rates)
        raw[f"starts/reference/warm/16/{kind}"] = {"starts_per_s": [round(r, 2) for r in rates]}
    rows.append(Row("starts/s, reference, warm, 16 workers, jail on GlusterFS", f"{rate['gluster']:.1f}/s",
                    f"local {rate['local']:.1f}/s", ratio(rate["gluster"], rate["local"])))
    return rows, raw
