"""Benchmarks: every performance figure side by side, medians of repeated runs, as a table and JSON.

    python -m benchmarks.run [--quick] [--json reports/benchmarks.json]

Figures (each with its comparison measured in the same run, since absolute times drift):
  warm-inprocess   reference's warm path in-process, given the `list` output (issue 3: < 5 ms)
  warm-process     reference vs example-shell vs direct as whole processes on the same warm jail
  starts-16        worker starts per second, 16 parallel workers, warm and cold jail (issue 4: 50/s)
  docker-starts    worker starts per second, containers (docker backend) against processes (issue 7)
  seed-bug         legacy on the deterministic cold-race scenario: reproduction rate, time to the
                   first violation; reference on the same seeds (issue 4: 50/50, median < 1 s)
Benchmarks never assert a time; they measure and print.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from chaos import runner, scenario
from fixtures.jail import make_jail
from gpujail import kernel
from gpujail.contract import start_worker

REPO = Path(__file__).resolve().parent.parent


def median_ms(xs) -> float:
    return round(statistics.median(xs) * 1000, 2)


def warm_fleet(tmp: Path, impl: str = "reference"):
    jail = make_jail(tmp / "jail")
    fleet = kernel.Fleet.recording(jail, tmp)
    w = start_worker(fleet, "prewarm", impl)
    assert w.ready, w.attempts[-1].stderr
    return fleet, jail, w.node


def bench_warm_inprocess(tmp: Path, n: int) -> dict:
    fleet, jail, node = warm_fleet(tmp)
    with fleet:
        listing = tmp / "list.txt"
        listing.write_text(node.cli("list").stdout)
        env = node.contract_env()
        r = node.run([sys.executable, "-m", "benchmarks.warm_path", str(listing), str(n)], env=env)
        data = json.loads(r.stdout)
    return {"median_ms": median_ms(data["times"]), "p90_ms": round(sorted(data["times"])[int(n * 0.9)] * 1000, 2),
            "files": data["files"], "missing": data["missing"], "runs": n}


def bench_warm_process(tmp: Path, n: int) -> dict:
    out = {}
    fleet, jail, _ = warm_fleet(tmp)
    with fleet:
        for impl in ("reference", "example-shell", "direct"):
            times = []
            for i in range(n):
                w = start_worker(fleet, f"{impl}-{i}", impl)
                assert w.ready, w.attempts[-1].stderr
                times.append(w.attempts[-1].duration)
                w.node.kill()
            out[impl] = median_ms(times)
    out["ratio_example_shell_over_reference"] = round(out["example-shell"] / out["reference"], 2)
    out["ratio_direct_over_reference"] = round(out["direct"] / out["reference"], 2)
    return out


def bench_starts(tmp: Path, workers: int, warm: bool, impl: str = "reference", fleet_class=kernel.Fleet) -> dict:
    jail = make_jail(tmp / f"jail-{impl}-{warm}")
    with fleet_class(jail, {}) as fleet:
        if warm:
            assert start_worker(fleet, "prewarm", impl).ready
        results = {}
        t0 = time.monotonic()
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, start_worker(fleet, f"w{i}", impl)))
                   for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
    ready = sum(w.ready for w in results.values())
    return {"workers": workers, "ready": ready, "wall_s": round(wall, 2), "starts_per_s": round(ready / wall, 1)}


def bench_seed_bug(tmp: Path, runs: int) -> dict:
    out = {}
    sc = scenario.load("cold-race")
    for impl in ("legacy", "reference"):
        times, broken, walls = [], 0, []
        for seed in range(runs):
            t = time.monotonic()
            r = runner.run(sc, impl, tmp / f"{impl}-{seed}", seed=seed)
            walls.append(time.monotonic() - t)
            if r.verdict.valid is False and r.verdict.first_violation:
                broken += 1
                begin = next(e["t"] for e in _load(r.history_path) if e["kind"] == "chaos.begin")
                times.append(r.verdict.first_violation["t"] - begin)
        out[impl] = {"runs": runs, "violations": broken,
                     "median_time_to_violation_s": round(statistics.median(times), 3) if times else None,
                     "median_run_s": round(statistics.median(walls), 2)}
    return out


def _load(path):
    from gpujail import history
    return history.load(str(path))


def chaos_suite_wall() -> dict:
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider", "chaos"],
                       cwd=REPO, capture_output=True, text=True)
    return {"wall_s": round(time.monotonic() - t, 1), "result": (p.stdout.strip().splitlines() or [""])[-1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    ap.add_argument("--json", default="reports/benchmarks.json")
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    reason = kernel.precondition()
    if reason:
        print(f"benchmarks: {reason}", file=sys.stderr)
        return 2
    n = 5 if args.quick else 30
    res = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, {platform.platform()}",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    wanted = set(args.only or ["warm-inprocess", "warm-process", "starts-16", "docker-starts", "seed-bug",
                               "chaos-suite"])
    with tempfile.TemporaryDirectory(prefix="gpujail-bench-") as d:
        tmp = Path(d)
        if "warm-inprocess" in wanted:
            res["warm_inprocess"] = bench_warm_inprocess(tmp / "a", 200 if not args.quick else 20)
        if "warm-process" in wanted:
            res["warm_process_ms"] = bench_warm_process(tmp / "b", n)
        if "starts-16" in wanted:
            res["starts_16_warm"] = bench_starts(tmp / "c", 16, True)
            res["starts_16_cold"] = bench_starts(tmp / "c", 16, False)
            res["starts_16_warm_direct"] = bench_starts(tmp / "c", 16, True, "direct")
        if "docker-starts" in wanted:
            from . import docker_starts
            res["docker_vs_process_starts"] = docker_starts.bench(tmp / "e", 5 if args.quick else 20)
        if "seed-bug" in wanted:
            res["seed_bug_cold_race"] = bench_seed_bug(tmp / "d", 10 if args.quick else 50)
        if "chaos-suite" in wanted:
            res["chaos_suite_n_auto"] = chaos_suite_wall()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        print(f"{k:28} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
