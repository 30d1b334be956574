"""The bounded-preemption search of chaos/explore.py (`bounded`, issue 29 item 5) on the model backend:
each schedule within the bound runs once, the fault-free census names the faults that can act, the
seed bug in `legacy` needs no preemption, a bug that needs one is found at bound 1 and not at bound
0, and a failing plan replays as printed. No privileges needed."""
from __future__ import annotations

import json

from gpujail.chaos import explore


def preemptions(outcome) -> int:
    """Preemptions of a run, counted again from its scheduler's log."""
    return sum(now is not None and chosen != now for _, chosen, now in outcome.world.scheduler.log)


def test_each_schedule_within_the_bound_runs_once():
    seen = []
    runs, _, hits = explore.walk("legacy", explore.CENSUS, 1,
                                 on_run=lambda o: seen.append((tuple(o.world.order), preemptions(o))))
    assert runs == len(seen) == len({order for order, _ in seen}), "a schedule ran twice"
    assert {count for _, count in seen} == {0, 1}
    assert ("cli.before_mount", 1) in hits   # the census saw worker 0's CLI reach its first mount


def test_the_seed_bug_needs_no_preemption_and_its_plan_replays():
    """INV-1: one worker ready, then the other's CLI fails after a mount and its cleanup unlinks the
    0-byte placeholder the first is mounted over. One worker after the other is enough."""
    search = explore.bounded("legacy", 0)
    assert search.failing, search.summary()
    plan = explore.parse_plan(json.dumps(search.failing[0]))   # as `bounded` prints it and `replay` reads it
    outcome = explore.simulate("legacy", plan)
    assert outcome.violations[0].invariant == "INV-1"
    assert [e["kind"] for e in outcome.verdict.chain][-1] == "cli.cleanup.unlink"
    assert explore.simulate("legacy", plan).world.order == outcome.world.order


def test_reference_and_direct_hold_for_every_single_fault_without_preemption():
    for impl in ("reference", "direct"):
        search = explore.bounded(impl, 0)
        assert not search.failing, explore.describe(explore.simulate(impl, search.failing[0]))
        assert len(search.per_fault) > 30 and "no violation" in search.summary()


def test_a_fault_the_census_never_saw_never_acts():
    """Why leaving such faults out of the search loses nothing: reference never reaches a CDI
    failpoint, so that fault's tree is the fault-free one and nothing fails."""
    census_runs, _, hits = explore.walk("reference", explore.CENSUS, 0)
    assert not any(name.startswith("cdi.") for name, _ in hits)
    acted = []
    runs, _, _ = explore.walk("reference", explore.fault("cdi.before_generate", 1, "return(EIO)"), 0,
                              on_run=lambda o: acted.extend(e for e in o.world.history
                                                            if e["kind"] == "failpoint" and e["action"] != "off"))
    assert runs == census_runs and not acted


def test_undoing_ones_own_markers_needs_one_preemption():
    """INV-1 against issue 30's `undo-own-markers` (reference, plus "when configure fails, remove the
    markers this start created"). One worker after the other never shows it; one preemption does:
    w1 creates the markers and releases the lock, w2 mounts over them and is ready, then w1's CLI
    fails and w1 removes them."""
    impl, spec = "mutant:undo-own-markers", explore.fault("cli.after_mount", 1, "return(EIO)")
    assert not explore.walk(impl, spec, 0)[1]
    runs, failing, _ = explore.walk(impl, spec, 1, first=True)
    assert failing, f"{runs} schedules with one preemption, none failed"
    outcome = explore.simulate(impl, failing[0])
    assert outcome.violations[0].invariant == "INV-1" and preemptions(outcome) == 1


def test_first_stops_every_job_at_the_first_failing_plan():
    """`explore bounded` stops at the first failing plan with --jobs above 1 too: the walks of the
    faults not started yet are dropped (legacy at bound 0 first fails with the census's 6th fault)."""
    everything = explore.bounded("legacy", 0)
    for jobs in (1, 2):
        search = explore.bounded("legacy", 0, first=True, jobs=jobs)
        assert search.failing and len(search.per_fault) < len(everything.per_fault), (jobs, search.summary())
