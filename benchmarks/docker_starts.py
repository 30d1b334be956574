"""Worker starts per second: containers (docker backend) against processes (kernel backend).

    python -m benchmarks.run --only docker-starts

Both backends in one run, on the same warm jail recipe and the same implementation: the median time
of one worker start (node up, `reference` run, ready) in sequence, and the starts per second of 16
workers started at once. Without an engine the docker side is reported as skipped, with the reason.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from fixtures.jail import make_jail
from gpujail import docker_backend, kernel
from gpujail.contract import start_worker


def sequential_start_ms(tmp: Path, fleet_class, n: int, impl: str = "reference") -> float:
    """Median wall time of one worker start on a warm jail, node (process or container) included."""
    with fleet_class(make_jail(tmp / "jail-seq"), {}) as fleet:
        assert start_worker(fleet, "prewarm", impl).ready
        times = []
        for i in range(n):
            t = time.monotonic()
            w = start_worker(fleet, f"s{i}", impl)
            times.append(time.monotonic() - t)
            assert w.ready, w.attempts[-1].stderr
            w.node.kill()
    return round(statistics.median(times) * 1000, 1)


def bench(tmp: Path, n: int, workers: int = 16) -> dict:
    from .run import bench_starts
    out = {}
    reason = docker_backend.precondition()
    for name, fleet_class in (("process", kernel.Fleet), ("container", docker_backend.Fleet)):
        if name == "container" and reason:
            out[name] = {"skipped": reason}
            continue
        out[name] = {"single_start_ms": sequential_start_ms(tmp / name, fleet_class, n),
                     f"parallel_{workers}": bench_starts(tmp / name, workers, True, fleet_class=fleet_class)}
    if "single_start_ms" in out["container"]:
        out["container_over_process_single_start"] = round(out["container"]["single_start_ms"] /
                                                           out["process"]["single_start_ms"], 1)
    return out
