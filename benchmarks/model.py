"""Model-backend figures (issue 6): simulated steps per second, time for Hypothesis to find and shrink
the legacy bug, and how many distinct interleavings an exploration covers against the total; and
(issue 29 item 5) the bounded-preemption search's counts: every schedule within the bound, run.

    python -m gpujail.benchmarks.model [--quick]
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

from gpujail.backends.model import ModelWorld
from gpujail.chaos import explore
from gpujail.reference_impl import in_process


def steps_per_second(repeats: int) -> dict:
    """Eight workers on the full driver (all capabilities): one after the other, and with a worker
    switch every 3 steps (the baton handed between threads each time)."""
    out = {}
    for label, schedule in (("sequential", []), ("switch-every-3", [(i % 8, 3) for i in range(4000)])):
        rates, steps = [], 0
        for _ in range(repeats):
            t = time.perf_counter()
            world = ModelWorld(in_process("reference"), 8, driver=None, capabilities="all", schedule=schedule).run()
            rates.append(len(world.order) / (time.perf_counter() - t))
            steps = len(world.order)
            assert all(w.exits == [0] for w in world.workers)
        out[label] = {"steps": steps, "median_steps_per_s": round(statistics.median(rates))}
    out["switching_cost_ratio"] = round(out["sequential"]["median_steps_per_s"]
                                        / out["switch-every-3"]["median_steps_per_s"], 2)
    return out


def find_and_shrink(seeds: int) -> dict:
    times, sizes, lines, examples = [], [], [], []
    for seed in range(seeds):
        t = time.perf_counter()
        plan, exploration = explore.find_violation("legacy", seed=seed, max_examples=5000, database=None)
        times.append(time.perf_counter() - t)
        outcome = explore.simulate("legacy", plan)
        sizes.append(explore.size(plan))
        lines.append(len(outcome.report().splitlines()))
        examples.append(exploration.examples)
    return {"seeds": seeds, "found": len(times), "median_s": round(statistics.median(times), 2),
            "max_s": round(max(times), 2), "median_examples": statistics.median(examples),
            "plan_size_max": max(sizes), "trace_lines_median": statistics.median(lines)}


def interleavings(examples: int) -> dict:
    """2 workers, 3-file driver, reference, faults off: distinct interleavings Hypothesis ran."""
    exploration = explore.Exploration("reference", 2, explore.SMALL_DRIVER)
    from hypothesis import given, settings
    @settings(**explore.SETTINGS, max_examples=examples, database=None)
    @given(plan=explore.plans(2, faults=False))
    def run(plan):
        exploration(plan)
    run()
    total = exploration.total_interleavings()
    return {"examples": exploration.examples, "distinct": len(exploration.interleavings),
            "total": f"{total:.3e}", "fraction": f"{len(exploration.interleavings) / total:.1e}"}


def bounded(quick: bool) -> dict:
    """2 workers, 3-file driver: every schedule with at most 1 preemption (0 with --quick), without a
    fault and with each single fault of the census (chaos/explore.py `bounded`), for legacy,
    reference and direct: schedules run, faults, how many schedules broke an invariant, CPU seconds."""
    out = {}
    for impl in ("legacy", "reference", "direct"):
        cpu = os.times()
        search = explore.bounded(impl, 0 if quick else 1, jobs=os.cpu_count() or 1)
        now = os.times()
        out[impl] = {"preemptions": search.preemptions, "schedules": search.schedules,
                     "faults": len(search.per_fault) - 1, "failing": len(search.failing),
                     "wall_s": round(search.seconds, 1),
                     "cpu_s": round(sum(now[:4]) - sum(cpu[:4]), 1), "summary": search.summary()}
    return out


def bench(quick: bool = False) -> dict:
    return {"steps": steps_per_second(2 if quick else 5), "legacy_find_shrink": find_and_shrink(2 if quick else 10),
            "interleavings_2x3": interleavings(100 if quick else 1000)}


if __name__ == "__main__":
    print(json.dumps(bench("--quick" in sys.argv), indent=1))
