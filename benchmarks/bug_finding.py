"""Figures of bug finding: how often, and how fast, the scenarios catch what they are for.

How this works
--------------
Each figure runs chaos scenarios (chaos/runner.py) against an implementation known to have the bug
and one known not to, on the same seeds, and counts the runs that end in a violation, with the
median time from a run's start to its first violation (`first_violation_s`; a violation of the
final state counts at the run's end):

  seed-bug      legacy against reference on cold-race, deterministic and randomised, 2 and 8 workers
  real-reports  each scenario from real reports against legacy and its matching mutant
  cluster-faults  the same for the faults real clusters inject (a stopped lock holder, a lost lock, a
                torn marker, swapped links, mixed capabilities, a host upgraded under a start)
  cdi           the CDI scenarios against cdi-naive, and cdi on the same seeds
  windows       per scenario, the fraction of seeded-random reference runs that open every fault
                window it declares (a run that opens none proves nothing)
  schedules     the unscripted cold start under each --schedule: legacy caught, reference's cost
                against `free`, and exact replay of a failing pct seed
  runs-to-detection  per mutant (bundled and shell-template), the seeds of the unscripted cold start
                it takes each --schedule to catch it (at most 20)
  unscripted    each scenario whose barriers only time the run, with those barriers dropped
                (Scenario.unscripted), against legacy and the mutant it guards against
                (scenario.GUARDS): the runs `free`, `pct`, `random-walk` and `mixed` take to find the
                order the barrier forced
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from gpujail.benchmarks.measure import Row, median
from gpujail.chaos import runner, scenario
from gpujail.world import history

# -- seed bug ---------------------------------------------------------------------------------------

def seed_bug(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    runs = 3 if quick else 20
    rows, raw = [], {}
    for name in ("cold-race", "cold-race-random"):
        for workers in (2, 8):
            sc = dataclasses.replace(scenario.load(name), gpu_workers=workers)
            result = {}
            for impl in ("legacy", "reference"):
                times, broken = [], 0
                for seed in range(runs):
                    t = first_violation_s(runner.run(sc, impl, tmp / f"{name}-{workers}-{impl}-{seed}", seed=seed))
                    if t is not None:
                        broken += 1
                        times.append(t)
                result[impl] = {"runs": runs, "violations": broken, "median_s_to_violation": median(times)}
            raw[f"{name}/{workers}"] = result
            lg = result["legacy"]
            when = f", median {lg['median_s_to_violation']:.2f} s to the first lost file" if lg["violations"] else ""
            rows.append(Row(f"seed bug, legacy, {name}, {workers} workers", f"{lg['violations']}/{runs}{when}",
                            f"reference {result['reference']['violations']}/{runs}"))
    return rows, raw


# -- real-report scenarios (issue 17) ------------------------------------------------------------

# Each new scenario, and the implementations that lack what it checks: legacy and the matching mutant.
REAL_REPORTS = {n: scenario.GUARDS[n] for n in ("upgraded-jail", "mixed-drivers", "cuda-image", "ldcache-rewrite",
                                                "ldconfig-blind-winner")}


def first_violation_s(r) -> float | None:
    """Seconds from the run's start to its first violation, None when the run found none. A violation
    of the final state (INV-3's jail hygiene, INV-6's residue) has no event: it counts at the run's end."""
    if r.verdict.valid is not False:
        return None
    events = history.load(str(r.history_path))
    begin = next(e["t"] for e in events if e["kind"] == "chaos.begin")
    event = r.verdict.first_violation or next((e for e in reversed(events) if e["kind"] == "chaos.end"), events[-1])
    return event["t"] - begin


def _caught(tmp: Path, name: str, impl: str, runs: int) -> tuple[list[float], int]:
    """Scenario `name`, deterministic form, against `impl` on seeds 0..runs-1: the times from each
    run's start to its first violation (one per run that caught it), and the runs that could not start."""
    sc = scenario.load(name)
    times, errors = [], 0
    for seed in range(runs):
        try:   # a node that cannot be set up (the host changed under it) is counted, not fatal
            t = first_violation_s(runner.run(sc, impl, tmp / f"{name}-{impl}-{seed}".replace(":", "_"), seed=seed))
        except RuntimeError:
            errors += 1
            continue
        if t is not None:
            times.append(t)
    return times, errors


def _caught_row(raw: dict, name: str, impl: str, runs: int, times: list[float], errors: int, comparison: str = "") -> Row:
    raw[f"{name}/{impl}"] = {"runs": runs, "caught": len(times), "errors": errors, "median_s_to_violation": median(times)}
    when = f", median {median(times):.2f} s to the first violation" if times else ""
    return Row(f"{name}, deterministic, {impl}", f"caught {len(times)}/{runs - errors}{when}",
               "; ".join(filter(None, [comparison, f"{errors} runs could not start" if errors else ""])))


def real_reports(tmp: Path, quick: bool, scenarios: dict[str, str] = REAL_REPORTS,
                 runs: int = 20) -> tuple[list[Row], dict]:
    """Each real-report scenario, deterministic form, against legacy and its matching mutant: how
    many runs catch it (a violation) and the median time from the run's start to the first one."""
    runs = 3 if quick else runs
    rows, raw = [], {}
    for name, mutant in scenarios.items():
        for impl in ("legacy", mutant):
            rows.append(_caught_row(raw, name, impl, runs, *_caught(tmp, name, impl, runs)))
    return rows, raw


# The faults real clusters inject (issue 26), each scenario with the mutant that has its bug (legacy
# survives some by construction: it takes no lock and writes no marker).
CLUSTER_FAULTS = {n: scenario.GUARDS[n] for n in ("lock-holder-stopped", "lock-lost", "marker-torn", "links-swapped",
                                                  "mixed-capabilities", "host-upgraded-mid-start", "shared-propagation",
                                                  "shared-propagation-jail-dir")}


def cluster_faults(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """As real-reports, for the cluster-fault scenarios (10 runs each: some wait out lock timeouts)."""
    return real_reports(tmp, quick, CLUSTER_FAULTS, runs=10)


# The CDI path's scenarios (issue 27, SPEC section 9): a runtime applying the spec (cdi-naive) against the
# fixed procedure on the CDI file set (cdi).
CDI_SCENARIOS = ("cdi-half-migrated", "cdi-two-drivers", "cdi-first-starts", "cdi-ref12-fleet")


def cdi(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Each CDI scenario, deterministic form, against cdi-naive: caught n/20 and the median time from
    the run's start to the first violation; cdi on the same seeds."""
    runs = 3 if quick else 20
    rows, raw = [], {}
    for name in CDI_SCENARIOS:
        fixed, fixed_errors = _caught(tmp, name, "cdi", runs)
        raw[f"{name}/cdi"] = {"runs": runs, "caught": len(fixed), "errors": fixed_errors}
        rows.append(_caught_row(raw, name, "cdi-naive", runs, *_caught(tmp, name, "cdi-naive", runs),
                                comparison=f"cdi {len(fixed)}/{runs - fixed_errors}"))
    return rows, raw


def windows(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Per scenario, the fraction of seeded-random runs against reference that open every fault
    window the scenario declares: a random run that opens none proves nothing (it is
    INCONCLUSIVE), so this is what a random run is worth (aim: above one half). The opt-in scale
    scenario (128 workers) runs twice, and not at all with --quick."""
    rows, raw = [], {}
    for name in scenario.names():
        sc = scenario.load(name)
        if not sc.windows or (sc.scale and quick):
            continue
        runs = 2 if quick or sc.scale else 10
        sc = sc.randomised()
        opened = {w: 0 for w in sc.windows}
        done = every = 0
        for seed in range(runs):
            try:
                r = runner.run(sc, "reference", tmp / f"{name}-{seed}", seed=1000 + seed)
            except RuntimeError:
                continue
            done += 1
            every += not r.unopened()
            for w, (ok, _) in r.windows.items():
                opened[w] += ok
        raw[name] = {"runs": done, "opened": opened, "every_window": every}
        rows.append(Row(f"windows opened, {name} (random, reference)", f"{every}/{done} runs opened every window",
                        ", ".join(f"{w} {n}/{done}" for w, n in opened.items()) if len(opened) > 1 else ""))
    return rows, raw


# -- the controlled scheduler (issue 29) ------------------------------------------------------------

SCHEDULES = ("free", "random-walk", "pct", "random-walk:syscalls", "pct:syscalls")
UNSCRIPTED = "cold-race-one-fault"   # issue 29's setup: an empty jail, one random CLI fault


def _order(r) -> list[tuple]:
    """A scheduled run's decisions as the history orders them (what an exact replay must repeat)."""
    return [(e["worker"], e["failpoint"], e["hit"], e["path"])
            for e in history.load(str(r.history_path)) if e["kind"] == "sched.step"]


def schedules(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """The unscripted cold start of the issue (cold-race-one-fault, 2 workers: an empty jail, random
    sleeps, exactly one worker's CLI failing after a random number of mounts) under each --schedule:
    how many seeds catch legacy's seed bug and the median time to its first violation, the median
    wall time of a reference run against `free`'s (the scheduler's cost), and whether 10 replays of
    legacy's first failing pct seed make the same decisions in the same order."""
    runs = 3 if quick else 20
    sc = scenario.load(UNSCRIPTED).with_workers(2)
    rows, raw, free_s = [], {}, None
    for plan in SCHEDULES:
        times, failing, found = [], [], []
        for seed in range(runs):
            t = first_violation_s(runner.run(sc, "legacy", tmp / f"legacy-{plan}-{seed}", seed=seed, scheduled=plan))
            if t is not None:
                failing.append(seed)
                found.append(t)
        for seed in range(runs // 2 or 1):
            t0 = time.monotonic()
            runner.run(sc, "reference", tmp / f"reference-{plan}-{seed}", seed=seed, scheduled=plan)
            times.append(time.monotonic() - t0)
        free_s = median(times) if plan == "free" else free_s
        raw[plan] = {"runs": runs, "caught": len(failing), "failing_seeds": failing, "reference_median_s": median(times),
                     "median_s_to_violation": median(found)}
        when = f", median {median(found):.2f} s to the first violation" if found else ""
        rows.append(Row(f"schedule {plan}: legacy caught, {sc.name}, 2 workers", f"{len(failing)}/{runs}{when}",
                        f"reference run {median(times):.2f} s against free's {free_s:.2f} s", round(median(times) / free_s, 2)))
    failing = raw["pct"]["failing_seeds"]
    if failing:
        replays = 3 if quick else 10
        orders = [_order(runner.run(sc, "legacy", tmp / f"replay-{i}", seed=failing[0], scheduled="pct"))
                  for i in range(replays)]
        same = sum(o == orders[0] for o in orders)
        raw["replay"] = {"seed": failing[0], "replays": replays, "identical": same, "steps": len(orders[0])}
        rows.append(Row(f"schedule pct: replay of legacy's failing seed {failing[0]}",
                        f"{same}/{replays} identical orders", f"{len(orders[0])} decisions each"))
    return rows, raw


def runs_to_first(sc, impl: str, plan: str, limit: int, tmp: Path) -> int | None:
    """How many runs of `sc` against `impl` under --schedule `plan`, seeds 0, 1, ..., until the first
    violation (1: the first run); None when none of the first `limit` has one."""
    return next((seed + 1 for seed in range(limit) if first_violation_s(runner.run(
        sc, impl, tmp.parent / f"{tmp.name}-{plan}-{seed}".replace(":", "_"), seed=seed, scheduled=plan)) is not None), None)


def found_text(found: dict[str, int | None]) -> str:
    """{plan: runs or None} as one cell: "free 7 pct 1" ("-": not within the limit)."""
    return " ".join(f"{p} {n or '-'}" for p, n in found.items())


def runs_to_detection(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Each mutant of reference (reference_impl/mutants.py) and of the shell template
    (reference_impl/template_mutants.py) on the unscripted cold start (cold-race-one-fault, 2 workers),
    seeds 0, 1, 2, ... under `free`, `pct` and `random-walk` (the template's under `free` and `pct`:
    a scheduled shell run costs seconds): the number of runs until the first violation, or "-" when
    none of the first 20 (3 with --quick) catches it. A mutant whose mistake needs a host or fault the
    cold start does not have (a symlinked jail, a warm start, a lock timeout) is caught only by the
    scripted scenario made for it: the table says which are races a scheduler finds unscripted."""
    from gpujail.reference_impl import mutants, template_mutants
    limit = 3 if quick else 20
    sc = scenario.load(UNSCRIPTED).with_workers(2)
    tmp.mkdir(parents=True, exist_ok=True)
    scripts = template_mutants.write(list(template_mutants.MUTANTS), tmp)
    subjects = [(f"mutant:{n}", f"mutant:{n}", ("free", "pct", "random-walk")) for n in mutants.MUTANTS] + [
        (f"template:{n}", f"sh {path}", ("free", "pct")) for n, path in scripts.items()]
    rows, raw = [], {}
    for label, impl, plans in subjects:
        found = {plan: runs_to_first(sc, impl, plan, limit, tmp / label) for plan in plans}
        raw[label] = found
        rows.append(Row(f"runs to detection, {label}", found_text(found), f"of at most {limit} runs each, {sc.name}, 2 workers"))
    return rows, raw


def unscripted(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """The scripted scenarios without their timing script: for each scenario with timing barriers
    (Scenario.timing_barriers; barriers that carry a fault stay), against `legacy` where it breaks and
    the mutant it guards against, the runs until the first violation under `free`, `pct`,
    `random-walk` and `mixed` (seeds 0, 1, ...; at most 20, 3 with --quick). This is the scheduler's
    figure on the worlds the scripted suite builds (a warm jail, other layouts, a symlinked jail, ...),
    not only on the cold start."""
    from gpujail.spec import DEFAULT_WORKERS
    limit = 3 if quick else 20
    rows, raw = [], {}
    for name in scenario.names():
        sc = scenario.load(name)
        dropped = sc.timing_barriers()
        if not dropped or sc.scale:
            continue
        u = sc.unscripted().with_workers(DEFAULT_WORKERS)
        impls = (["legacy"] if sc.legacy_breaks else []) + ([scenario.GUARDS[name]] if name in scenario.GUARDS else [])
        for impl in impls:   # (the CDI scenarios guard against cdi-naive: the cdi figure's)
            found = {plan: runs_to_first(u, impl, plan, limit, tmp / f"{name}-{impl}")
                     for plan in ("free", "pct", "random-walk", "mixed")}
            raw[f"{name}/{impl}"] = {"dropped": dropped, **found}
            rows.append(Row(f"unscripted {name}, {impl}", found_text(found),
                            f"runs to the first violation, of at most {limit}; dropped: {', '.join(dropped)}"))
    return rows, raw
