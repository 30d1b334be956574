"""Schedule exploration on the model backend: Hypothesis chooses the interleaving and the faults.

How this works
--------------
A *plan* is everything one simulation (gpujail/backends/model `ModelWorld`) needs besides the
implementation:

* `schedule`: runs of `(worker, steps)` (see the model's `Scheduler`); when they are used up, each
  worker runs to its end in turn, so the empty schedule is "one worker after the other";
* `faults`: per worker, one failpoint term for its first attempt: the N-th hit of a failpoint
  returns EIO, or SIGKILLs that process (a CLI killed mid-mount leaves its mounts and placeholders);
* `crashes`: per worker, its first attempt SIGKILLed before its N-th file-system step.

`simulate` runs a plan with a bundled implementation (`in_process`) and judges the history the
model wrote with the chaos checker, the one every backend's runs are judged by: an `Outcome`. A
plan *breaks an invariant* when the checker fails one. `plans()` is the Hypothesis strategy over
plans. Shrinking goes towards fewer runs, fewer faults and earlier hits: the shortest story that
still breaks an invariant. `find_violation` returns that story (for `legacy`, the seed bug);
Hypothesis keeps failing plans in its example database, and a printed plan replays exactly:
`python -m gpujail.chaos.explore replay legacy '<plan>'`. Why plans and not a
`RuleBasedStateMachine`: docs/model.md.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from gpujail.backends.model import SMALL_DRIVER, ModelWorld
from gpujail.chaos import checker
from gpujail.reference_impl import in_process
from gpujail.world import failpoints

ACTIONS = ("return(EIO)", "kill")
SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


def fault(name: str, hit: int, action: str) -> str:
    """The failpoint spec that makes exactly the `hit`-th hit of `name` do `action`."""
    return f"{name}={hit - 1}*off->1*{action}" if hit > 1 else f"{name}=1*{action}"


def plans(workers: int = 2, points=tuple(failpoints.REGISTRY), max_hit: int = 4, max_steps: int = 400,
          faults: bool = True):
    """Plans for `workers` workers; with faults=False, interleavings only."""
    worker = st.integers(0, workers - 1)
    fault_specs = st.dictionaries(worker, st.builds(fault, st.sampled_from(points), st.integers(1, max_hit),
                                                    st.sampled_from(ACTIONS)), max_size=workers)
    return st.fixed_dictionaries({
        "schedule": st.lists(st.tuples(worker, st.integers(1, 60)), max_size=12),
        "faults": fault_specs if faults else st.just({}),
        "crashes": st.dictionaries(worker, st.integers(1, max_steps), max_size=1) if faults else st.just({}),
    })


def size(plan: dict) -> int:
    """How long a story is: context switches, faults and crashes."""
    return len(plan["schedule"]) + len(plan["faults"]) + len(plan["crashes"])


EMPTY = {"schedule": [], "faults": {}, "crashes": {}}   # one worker after the other, no fault


@dataclass
class Outcome:
    """One simulated run and the checker's verdict on its history."""
    impl: str
    plan: dict
    world: ModelWorld
    verdict: checker.Verdict

    @property
    def violations(self) -> list[checker.Violation]:
        """The violations of every invariant the checker failed, the earliest first."""
        return [v for v in self.verdict.violations() if self.verdict.results[v.invariant].valid is False]

    def report(self, full: bool = False) -> str:
        """The model's trace, then each violation at the step of its event."""
        end = self.world.tick
        lines = [f"{round(v.event['t'] * 1000) if v.event else end:5}  VIOLATION {v.invariant}: {v.explanation}"
                 for v in self.violations]
        return "\n".join([self.world.report(full), *lines])


def entry_for(impl: str):
    """The bundled implementation `impl` as the model runs it (a command string cannot run there)."""
    entry = in_process(impl)
    if entry is None:
        raise ValueError(f"{impl!r} is not a bundled Python implementation (reference, legacy, direct, "
                         "mutant:NAME): the model backend runs those in-process only")
    return entry


def simulate(impl: str, plan: dict, workers: int = 2, driver=SMALL_DRIVER, **world) -> Outcome:
    """Run `plan` with `impl` on the model and judge its history with the chaos checker."""
    w = ModelWorld(entry_for(impl), workers, driver, schedule=plan["schedule"], faults=plan["faults"],
              crashes=plan["crashes"], impl=impl, **world).run()
    return Outcome(impl, plan, w, checker.check(w.history, w.final_state()))


class Exploration:
    """Counts what a search saw: examples, distinct interleavings, steps, time."""

    def __init__(self, impl: str, workers: int, driver):
        self.impl, self.workers, self.driver = impl, workers, driver
        self.examples = self.steps = 0
        self.interleavings: set[tuple[int, ...]] = set()
        self.seconds = 0.0

    def __call__(self, plan: dict) -> Outcome:
        t = time.perf_counter()
        outcome = simulate(self.impl, plan, self.workers, self.driver)
        self.seconds += time.perf_counter() - t
        self.examples += 1
        self.steps += len(outcome.world.order)
        self.interleavings.add(tuple(outcome.world.order))
        return outcome

    def total_interleavings(self) -> int:
        """Interleavings of the fault-free, one-after-the-other run's steps: (n1 + ... + nk)! / (n1! ... nk!)."""
        order = simulate(self.impl, EMPTY, self.workers, self.driver).world.order
        counts = [order.count(i) for i in range(self.workers)]
        total = math.factorial(sum(counts))
        for c in counts:
            total //= math.factorial(c)
        return total


def find_violation(impl: str, workers: int = 2, driver=SMALL_DRIVER, seed: int | None = None,
                   max_examples: int = 2000, database="default") -> tuple[dict | None, Exploration]:
    """The shortest plan that breaks an invariant for `impl` (None if none in max_examples). Found
    plans are kept in Hypothesis's example database (./.hypothesis, unless `database` says otherwise)
    and tried first next time."""
    exploration = Exploration(impl, workers, driver)
    kw = dict(SETTINGS, max_examples=max_examples)
    if database != "default":
        kw["database"] = database
    try:
        plan = find(plans(workers), lambda p: bool(exploration(p).violations), settings=settings(**kw),
                    random=random.Random(seed) if seed is not None else None, database_key=f"explore:{impl}".encode())
    except NoSuchExample:
        return None, exploration
    return plan, exploration


def explore_settings(max_examples: int) -> settings:
    """Settings for a @given property over plans (the conformance tests on the model backend)."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
    return settings(**SETTINGS, max_examples=max_examples, phases=phases)


def describe(outcome: Outcome, full: bool = False) -> str:
    """A failing plan as a person reads it: the plan (replayable), the verdict, then the trace."""
    return (f"{outcome.impl}: {len(outcome.violations)} violation(s) with plan (size {size(outcome.plan)}):\n"
            f"  {json.dumps(outcome.plan)}\n\n{outcome.verdict.summary()}\n\n{outcome.report(full)}")


def _plan(text: str) -> dict:
    plan = json.loads(text)
    return {"schedule": [tuple(r) for r in plan.get("schedule", [])],
            "faults": {int(k): v for k, v in plan.get("faults", {}).items()},
            "crashes": {int(k): v for k, v in plan.get("crashes", {}).items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpujail.chaos.explore", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("find", help="search for a plan that breaks an invariant, shrink it, print its trace")
    r = sub.add_parser("replay", help="run one plan (JSON, as `find` prints it) and print its trace")
    for p in (e, r):
        p.add_argument("impl", help="reference, legacy, direct or mutant:NAME")
        p.add_argument("--workers", type=int, default=2)
        p.add_argument("--full-driver", action="store_true", help="every file of the driver, not the 3-file one")
        p.add_argument("--full", action="store_true", help="print every step, not only the ones that change something")
    e.add_argument("--seed", type=int, default=None)
    e.add_argument("--max-examples", type=int, default=2000)
    r.add_argument("plan")
    args = parser.parse_args(argv)
    driver = None if args.full_driver else SMALL_DRIVER
    if args.command == "replay":
        try:
            plan = _plan(args.plan)
        except (ValueError, AttributeError, TypeError) as err:
            print(f"explore: plan is not a JSON plan object: {err}", file=sys.stderr)
            return 2
        outcome = simulate(args.impl, plan, args.workers, driver)
        print(describe(outcome, args.full) if outcome.violations else f"{args.impl}: no violation")
        return 1 if outcome.violations else 0
    t = time.perf_counter()
    plan, exploration = find_violation(args.impl, args.workers, driver, args.seed, args.max_examples)
    took = time.perf_counter() - t
    print(f"{exploration.examples} examples, {len(exploration.interleavings)} distinct interleavings, "
          f"{exploration.steps} steps ({exploration.steps / max(exploration.seconds, 1e-9):,.0f}/s) in {took:.1f}s")
    if plan is None:
        print(f"{args.impl}: no violation found")
        return 0
    print(describe(simulate(args.impl, plan, args.workers, driver), args.full))
    return 1


if __name__ == "__main__":
    sys.exit(main())
