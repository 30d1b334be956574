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
`gpujail explore replay legacy '<plan>'`. Why plans and not a
`RuleBasedStateMachine`: docs/model.md.

`bounded` samples nothing: it runs every schedule with at most c preemptions (CHESS's bound), with
no fault and with each single fault a worker can meet, so "no violation" is a proof for 2 workers,
that bound and that fault set (`gpujail explore bounded reference --preemptions 1`).
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import random
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from gpujail.backends.model import SMALL_DRIVER, Bounded, ModelWorld
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
    """How long a story is: context switches (runs or deviations), faults and crashes."""
    return len(plan["schedule"]) + len(plan.get("deviations", ())) + len(plan["faults"]) + len(plan["crashes"])


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
    """Run `plan` with `impl` on the model and judge its history with the chaos checker. A plan
    with "deviations" (what `bounded` prints: [[n, worker], ...]) is scheduled by them, not by runs."""
    schedule = Bounded(plan["deviations"]) if "deviations" in plan else plan["schedule"]
    w = ModelWorld(entry_for(impl), workers, driver, schedule=schedule, faults=plan["faults"],
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


@dataclass
class Search:
    """What `bounded` did: schedules run per fault (the fault-free census first), the failing plans."""
    impl: str
    preemptions: int
    schedules: int = 0
    per_fault: dict = field(default_factory=dict)
    failing: list = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        bound = f"at most {self.preemptions} preemption(s)"
        if not self.failing:
            return (f"{self.impl}: explored {self.schedules} of {self.schedules} schedules with {bound}, without a "
                    f"fault and with each of {len(self.per_fault) - 1} single faults, in {self.seconds:.0f} s: no violation")
        return (f"{self.impl}: {len(self.failing)} plan(s) broke an invariant among the {self.schedules} schedules "
                f"run with {bound}, in {self.seconds:.0f} s")


CENSUS = ";".join(f"{p}=off" for p in failpoints.REGISTRY)   # every failpoint armed, none acting: hits recorded


def walk(impl: str, spec: str, preemptions: int, workers: int = 2, driver=SMALL_DRIVER, first: bool = False,
         on_run=None):
    """Every schedule with at most `preemptions` preemptions, worker 0 armed with `spec`: a depth-first
    walk of the tree of choices, each path run once (`on_run` sees each Outcome). Returns (schedules
    run, failing plans, and for the census the (failpoint, hit) pairs worker 0 reached)."""
    hits, failing, stack, runs = set(), [], [[]], 0
    while stack:
        deviations = stack.pop()
        plan = {"deviations": deviations, "schedule": [], "faults": {0: spec}, "crashes": {}}
        outcome = simulate(impl, plan, workers, driver)
        runs += 1
        if on_run is not None:
            on_run(outcome)
        if spec == CENSUS:   # only the census's hits name faults; the other walks need not read their histories
            name = outcome.world.workers[0].name
            hits.update((e["name"], e["hit"]) for e in outcome.world.history
                        if e["kind"] == "failpoint" and e["node"] == name)
        if outcome.violations:
            failing.append(plan)
            if first:
                break
        log, last = outcome.world.scheduler.log, deviations[-1][0] if deviations else -1
        spent = 0
        for n, (choices, chosen, now) in enumerate(log):
            if n > last:   # branch only past the last deviation: each schedule is one path of the tree
                stack.extend(deviations + [[n, other]] for other in choices
                             if other != chosen and spent + (now is not None and other != now) <= preemptions)
            spent += now is not None and chosen != now
    return runs, failing, hits


def bounded(impl: str, preemptions: int = 1, workers: int = 2, driver=SMALL_DRIVER, first: bool = False,
            faults=None, jobs: int = 1) -> Search:
    """Every schedule with at most `preemptions` preemptions, without a fault and with each single
    fault of worker 0 (`walk`), on `jobs` processes. A preemption is a pick of another worker while
    the current one could go on; a pick after the current one blocked or ended costs nothing but
    still branches. Every model step is a scheduling point (no partial-order reduction): the count
    is of schedules, and "none broke an invariant" is a proof for this bound, fleet, driver and
    fault set.

    The faults (unless `faults` names them): an EIO and a kill at every (failpoint, hit) that worker 0
    reaches in some fault-free schedule of the bound. The fault-free walk is that census: worker 0
    runs with every failpoint armed `off`, which records each hit and changes nothing. A fault the
    census never saw cannot act within the bound (its run equals a fault-free one up to the fault),
    so leaving it out loses nothing. Worker 0 alone carries faults: the workers run the same
    implementation from the same state, so a fault of worker 1 gives the same schedules, renamed.
    `first`: stop at the first failing plan."""
    search, t = Search(impl, preemptions), time.perf_counter()
    runs, search.failing, census = walk(impl, CENSUS, preemptions, workers, driver, first)
    search.per_fault[CENSUS], search.schedules = runs, runs
    specs = faults if faults is not None else [fault(p, h, a) for p, h in sorted(census) for a in ACTIONS]
    args = [(impl, spec, preemptions, workers, driver, first) for spec in specs]
    results = {}   # spec -> walk's answer, for the walks that ran

    def found() -> bool:   # `first`, and a walk (the census's included) has a failing plan
        return first and bool(search.failing or any(failing for _, failing, _ in results.values()))

    if jobs > 1 and args and not found():
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            running = {pool.submit(walk, *a): a[1] for a in args}
            for done in concurrent.futures.as_completed(running):
                results[running[done]] = done.result()
                if found():   # `first`: the walks not started yet are dropped, the running ones end
                    pool.shutdown(cancel_futures=True)
                    break
    else:
        for a in args:
            if found():
                break
            results[a[1]] = walk(*a)
    for spec in (s for s in specs if s in results):   # in the order of the specs, whichever job ended first
        runs, failing, _ = results[spec]
        search.per_fault[spec] = runs
        search.schedules += runs
        search.failing += failing
    search.seconds = time.perf_counter() - t
    return search


def explore_settings(max_examples: int) -> settings:
    """Settings for a @given property over plans (the conformance tests on the model backend)."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
    return settings(**SETTINGS, max_examples=max_examples, phases=phases)


def describe(outcome: Outcome, full: bool = False) -> str:
    """A failing plan as a person reads it: the plan (replayable), the verdict, then the trace."""
    return (f"{outcome.impl}: {len(outcome.violations)} violation(s) with plan (size {size(outcome.plan)}):\n"
            f"  {json.dumps(outcome.plan)}\n\n{outcome.verdict.summary()}\n\n{outcome.report(full)}")


def parse_plan(text: str) -> dict:
    """A plan as `find` and `bounded` print it; ValueError (JSON's or ours) when it is not one."""
    plan = json.loads(text)
    if not isinstance(plan, dict):
        raise ValueError(f"not a JSON object but {type(plan).__name__}")
    return {**({"deviations": [list(d) for d in plan["deviations"]]} if "deviations" in plan else {}),
            "schedule": [tuple(r) for r in plan.get("schedule", [])],
            "faults": {int(k): v for k, v in plan.get("faults", {}).items()},
            "crashes": {int(k): v for k, v in plan.get("crashes", {}).items()}}


def run(args) -> int:
    """`gpujail explore find|bounded|replay` (gpujail/commands/tools.py declares and checks the
    arguments, the one parser of this tool): 0 no violation, 1 a violation with its plan and trace;
    `args.plan` is parse_plan's plan."""
    driver = None if args.full_driver else SMALL_DRIVER
    if args.how == "bounded":
        search = bounded(args.impl, args.preemptions, args.workers, driver, first=True, jobs=args.jobs)
        print(search.summary())
        if search.failing:
            print(describe(simulate(args.impl, search.failing[0], args.workers, driver), args.full))
        return 1 if search.failing else 0
    if args.how == "replay":
        outcome = simulate(args.impl, args.plan, args.workers, driver)
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
