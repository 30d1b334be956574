"""The fault table without a kernel: every generated case is a valid scenario, and the cells a
history exercised are read right (chaos/fault_table.py, chaos/checkers/cells.py; SPEC section 7)."""
from __future__ import annotations

import pytest

from gpujail.chaos import fault_table
from gpujail.chaos.checkers import cells
from gpujail.chaos.checkers.queries import Run
from gpujail.world import failpoints

VERSIONS = {"prewarm": "550.54.15", "w0": "550.54.15", "w1": "550.54.15", "w2": "550.54.15"}


@pytest.mark.parametrize("cell", fault_table.cells(), ids=lambda c: cells.cell_id(*c))
def test_every_case_parses_and_declares_its_cell(cell, monkeypatch, tmp_path):
    monkeypatch.setenv(failpoints.BARRIERS_ENV, str(tmp_path))
    sc = fault_table.case(*cell)
    assert sc.name == cells.PREFIX + cells.cell_id(*cell) and sc.windows == ["cell"]
    for spec in [*sc.schedule(0).values(), *(s for by in sc.restart_schedule().values() for s in by.values())]:
        failpoints.parse(spec)   # raises on a term the failpoints would refuse
    for f in sc.faults:
        assert f.term.count("pause(") + f.term.count("wait(") <= 2
        for barrier in [t.split("(")[1].rstrip(")") for t in f.term.split("->") if "pause(" in t or "wait(" in t]:
            assert barrier in sc.barriers, (f, sc.barriers)


def history(*events, t0=0.0):
    begin = {"kind": "chaos.begin", "node": "host", "t": t0, "scenario": "cell:warm/cli.after_mount/some",
             "versions": VERSIONS}
    return Run([begin, *[dict(e, t=t0 + i + 1) for i, e in enumerate(events)]], {})


def ready(node, attempt=0):
    return {"kind": "worker.ready", "node": node, "attempt": attempt}


def start(node, attempt=0):
    return {"kind": "worker.start", "node": node, "attempt": attempt}


def fails(node, name="cli.after_mount", action="return"):
    return {"kind": "failpoint", "node": node, "name": name, "action": action, "hit": 5}


def test_a_warm_failure_with_one_neighbour_ready_is_warm_some():
    run = history({"kind": "chaos.kill", "node": "host", "worker": "prewarm", "barrier": ""},   # retired: no failure
                  start("w0"), start("w1"), start("w2"), ready("w1"), fails("w0"))
    assert cells.exercised(run) == ["warm/cli.after_mount/some"]
    assert cells.cell_window(run) == (True, "exercised warm/cli.after_mount/some")


def test_roles_creator_waiter_restarting_and_a_kill():
    creator = history(start("w0"), {"kind": "impl.marker", "node": "w0", "path": "x"}, fails("w0", "cli.before_mount"))
    assert cells.exercised(creator) == ["creator/cli.before_mount/none"]
    held = history(start("w0"), {"kind": "failpoint", "node": "w0", "name": "cli.before_mount", "action": "pause",
                                 "arg": "creator"}, start("w1"), ready("w1"), start("w2"), ready("w2"), fails("w0"))
    assert cells.exercised(held) == ["creator/cli.after_mount/all"]   # an uninstrumented one, held by the harness
    waiter = history(start("w0"), {"kind": "impl.lock.acquired", "node": "w0", "waited": 0.2}, fails("w0"))
    assert cells.exercised(waiter) == ["waiter/cli.after_mount/none"]
    restart = history(start("w1"), ready("w1"), start("w2"), ready("w2"), start("w0", 1), fails("w0", "ref.before_verify"))
    assert cells.exercised(restart) == ["restarting/ref.before_verify/all"]
    kill = history(start("w0"), start("w1"), ready("w1"), {"kind": "chaos.kill", "node": "host", "worker": "w0",
                                                          "barrier": "late"})
    assert cells.exercised(kill) == ["warm/kill/some"]


def test_a_wait_or_an_unfired_fault_is_no_failure_and_the_window_says_what_happened():
    run = history(start("w0"), {"kind": "failpoint", "node": "w0", "name": "cli.after_mount", "action": "wait",
                                "arg": "late"}, {"kind": "failpoint", "node": "w0", "name": "cli.after_mount",
                                                 "action": "off"})
    assert cells.exercised(run) == []
    assert cells.cell_window(run) == (False, "wanted warm/cli.after_mount/some, exercised no failure at all")
