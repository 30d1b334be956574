"""Figures of whole runs: the suites' wall time, the model backend's exploration, a big run's memory.

How this works
--------------
  suites  the default self-test run (from a checkout only: tests/ is not installed) and the
          default chaos set, each under `pytest -n auto` in a process of its own
  model   the model backend's steps/s, time to find and shrink the legacy bug, interleavings
          explored (benchmarks/model.py measures them)
  bounded the model's bounded-preemption search: every schedule within the bound, its counts
  memory  peak memory (PSS: shared pages split between their users, so the sum is real memory) of
          a 128-worker chaos run, the harness and every process below it, sampled every 100 ms
          from /proc (`tree_pss`)
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gpujail
import gpujail.chaos
from gpujail.benchmarks.measure import Row
from gpujail.chaos import runner, scenario

# The suites' folder (holding chaos/: a checkout's root or site-packages/gpujail), and the checkout
# when this gpujail runs from one (the self-tests are not installed).
SUITES_HOME = Path(gpujail.chaos.__file__).resolve().parent.parent
CHECKOUT = gpujail.ROOT if (gpujail.ROOT / "pyproject.toml").is_file() and (gpujail.ROOT / "tests").is_dir() else None

def model(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    from gpujail.benchmarks import model as m
    raw = m.bench(quick)
    s, f, i = raw["steps"], raw["legacy_find_shrink"], raw["interleavings_2x3"]
    return [Row("model steps/s, 8 workers, full driver, one after the other", f"{s['sequential']['median_steps_per_s']:,}/s",
                f"switching every 3 steps {s['switch-every-3']['median_steps_per_s']:,}/s", s["switching_cost_ratio"]),
            Row(f"model: find and shrink the legacy bug ({f['seeds']} seeds)", f"median {f['median_s']} s, max {f['max_s']} s",
                f"plan size <= {f['plan_size_max']}, trace {f['trace_lines_median']} lines"),
            Row(f"model: distinct interleavings, 2 workers, 3 files, {i['examples']} examples", f"{i['distinct']}",
                f"of {i['total']}")], raw


def bounded(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    from gpujail.benchmarks import model as m
    raw = m.bounded(quick)
    return [Row(f"model: {impl}, every schedule with <= {r['preemptions']} preemption(s), 2 workers, 3 files, "
                f"no fault and {r['faults']} single faults", f"{r['schedules']:,} schedules",
                f"{r['failing']:,} broke an invariant; {r['cpu_s']} s CPU") for impl, r in raw.items()], raw


def suites(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    raw, rows = {}, []
    for name, figure, home in (("self-tests", "self-tests", CHECKOUT), ("chaos", "default chaos set", SUITES_HOME)):
        if home is None:
            rows.append(Row(f"{figure}, pytest -n auto", "not measured: the self-tests run from a checkout only"))
            continue
        t = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider",
                            "tests" if name == "self-tests" else "chaos"], cwd=home, capture_output=True, text=True)
        raw[name] = {"wall_s": round(time.monotonic() - t, 1), "result": (p.stdout.strip().splitlines() or [""])[-1]}
        rows.append(Row(f"{figure}, pytest -n auto", f"{raw[name]['wall_s']} s", raw[name]["result"]))
    return rows, raw


def memory(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Peak memory (PSS) of a 128-worker chaos run: the harness and every process below it (nodes,
    implementations, CLIs), sampled every 100 ms."""
    sc = scenario.load("scale-128")
    if quick:
        sc = dataclasses.replace(sc, gpu_workers=16, faults=type(sc.faults)())
    peak, stop = [0, 0], threading.Event()

    def sample():
        while not stop.wait(0.1):
            rss, procs = tree_pss(os.getpid())
            if rss > peak[0]:
                peak[:] = [rss, procs]
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = runner.run(sc, "reference", tmp / "run", seed=0, timeout=600)
    finally:
        stop.set()
        sampler.join()
    workers = sc.gpu_workers
    raw = {"workers": workers, "peak_pss_mib": round(peak[0] / 2**20, 1), "processes_at_peak": peak[1],
           "valid": r.verdict.valid}
    return [Row(f"peak memory (PSS), {workers}-worker chaos run", f"{raw['peak_pss_mib']} MiB ({peak[1]} processes)",
                f"per worker {raw['peak_pss_mib'] / workers:.1f} MiB")], raw


def tree_pss(root: int) -> tuple[int, int]:
    """Proportional set size (shared pages split between their users, so the sum is real memory)
    of `root` and all its descendants, from /proc; and how many processes."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                continue
    total, count, todo = 0, 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
            count += 1
        except (OSError, StopIteration):
            continue
    return total, count
