"""SPEC section 6, "What a PASS means": the checker never turns missing evidence into a pass.

Each test feeds the checker (or the probe, or the runner) one hole a reviewer found (issue 30): a
probe that crashed and came back empty or short, a ready span the probes never reached or did not
reach after a neighbour failed, a node retired without an event ending its ready span, a fault
window opened on a node that was not a live ready worker, and an UNKNOWN or INCONCLUSIVE run that
the gate let through. Pure, except the probe and the runner tests (kernel: real nodes).
"""
from __future__ import annotations

import shutil
import subprocess

import pytest
from test_checker import CUDA, FILES, JAIL, NVML, History, good_final, good_run, statuses

from gpujail import options
from gpujail.chaos.checker import UNKNOWN, check, ready_spans
from gpujail.chaos.checkers.queries import Run
from gpujail.chaos.checkers.windows import opened
from gpujail.commands import run as running

FILES_ASKED = len(FILES)


def test_a_probe_that_came_back_empty_is_a_violation_not_clean():
    """A crashing library killed the probe child; its output read as [] counted as clean."""
    h = History()
    h.ready_worker(0.0, "A")
    h.add(0.06, "A", "probe", results=[])
    h.add(0.6, "host", "chaos.end")
    verdict = check(h.events, good_final())
    assert verdict.results["INV-5"].valid is False, verdict.summary()
    assert "returned 0 of" in verdict.explanation


def test_a_probe_round_short_of_files_is_a_violation_for_the_files_it_did_not_clear():
    h = good_run()
    short = h.probe(0.55, "A")
    short["results"] = [r for r in short["results"] if not r["path"].endswith(CUDA)]
    h.probe(0.58, "A")   # a later full round does not excuse the short one
    verdict = check(h.events, good_final())
    assert statuses(verdict)["INV-1"] == "FAIL", verdict.summary()
    assert CUDA in verdict.explanation and f"returned {FILES_ASKED - 1} of {FILES_ASKED}" in verdict.explanation


def test_a_file_the_probe_could_not_clear_says_why():
    from gpujail.backends.probes import NO_RESULT
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A", **{NVML: {"attached": False, "size": None,
                                 "error": NO_RESULT + "the probe process was killed by SIGSEGV while probing this file"}})
    verdict = check(h.events, good_final())
    assert verdict.results["INV-5"].valid is False
    assert "killed by SIGSEGV while probing this file" in verdict.explanation


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc to build a library whose constructor crashes")
def test_probe_answers_every_file_when_a_library_crashes_or_hangs_the_probe(tmp_path, monkeypatch):
    """node_probes.py's probe: one result per file asked, in order; the crashing and the hanging library
    are not cleared and say why; the files after them are still probed (a fresh child)."""
    from gpujail.backends import node_probes
    for name, body in (("crash", "raise(SIGSEGV);"), ("hang", "for (;;) pause();")):
        (tmp_path / f"{name}.c").write_text("#include <signal.h>\n#include <unistd.h>\n"
                                            f"__attribute__((constructor)) static void f(void) {{ {body} }}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", tmp_path / f"lib{name}.so", tmp_path / f"{name}.c"], check=True)
    (tmp_path / "plain").write_bytes(b"x" * 100)
    monkeypatch.setattr(node_probes, "PROBE_TIMEOUT", 2.0)
    files = [{"path": str(tmp_path / "libcrash.so"), "load": True}, {"path": str(tmp_path / "libhang.so"), "load": True},
             {"path": str(tmp_path / "plain"), "host": str(tmp_path / "plain")}]
    results = node_probes.op_probe({"files": files})["results"]
    assert [r["path"] for r in results] == [f["path"] for f in files]
    assert results[0]["size"] is None and "killed by SIGSEGV" in results[0]["error"]
    assert results[1]["size"] is None and "timed out" in results[1]["error"]
    assert results[2]["size"] == 100 and results[2]["same_bytes"] is True


def test_a_ready_span_the_probes_never_reached_is_unknown_not_a_pass():
    h = good_run()
    h.ready_worker(0.3, "C", missing=0)   # ready, never probed
    verdict = check(h.events, good_final())
    for inv in ("INV-1", "INV-5"):
        assert verdict.results[inv].valid == UNKNOWN and "C was never probed" in verdict.results[inv].note


def test_a_ready_span_not_probed_after_a_neighbour_failed_is_unknown():
    h = good_run()
    h.add(0.55, "D", "worker.start", impl="reference", attempt=0)
    h.add(0.57, "D", "worker.exit", code=4, error="configure failed")   # after every probe of A and B
    verdict = check(h.events, good_final())
    assert verdict.results["INV-1"].valid == UNKNOWN
    assert "A was not probed after D's worker.exit" in verdict.results["INV-1"].note
    h.probe(0.58, "A")
    h.probe(0.58, "B")
    assert {statuses(check(h.events, good_final()))[i] for i in ("INV-1", "INV-5")} == {"PASS"}


def test_a_probe_round_is_evidence_only_after_it_began():
    """A round is written when it ends; under GlusterFS latency it takes seconds. One that began
    before a neighbour's failed start and ended after it may have looked at every file before that
    cleanup: no evidence after it (nor at the end of the span, when the fleet settled during it)."""
    h = good_run()
    h.add(0.55, "D", "worker.start", impl="reference", attempt=0)
    h.add(0.57, "D", "worker.exit", code=4, error="configure failed")
    h.probe(0.58, "A", began=0.56)
    h.probe(0.58, "B", began=0.56)
    verdict = check(h.events, good_final())
    assert verdict.results["INV-1"].valid == UNKNOWN
    assert "A was not probed after D's worker.exit" in verdict.results["INV-1"].note
    h.probe(0.59, "A", began=0.575)
    h.probe(0.59, "B", began=0.575)
    assert {statuses(check(h.events, good_final()))[i] for i in ("INV-1", "INV-5")} == {"PASS"}

    h = good_run()
    h.add(0.55, "D", "worker.start", impl="reference", attempt=0)
    h.add(0.57, "D", "worker.exit", code=0)   # no disturbance, but the fleet settled only now
    h.probe(0.58, "A", began=0.56)
    h.probe(0.58, "B", began=0.56)
    note = check(h.events, good_final()).results["INV-1"].note
    assert "A was not probed at the end of its ready span (its last probe began at t=0.560s" in note, note


def test_a_window_needs_a_probe_round_that_began_inside_it():
    """ldconfig-while-ready and net-fault-while-ready open only on a round that began after the
    ldconfig or under the fault; one begun before and written after it saw none of it. A round
    begun under the fault counts even when it ends after the fault cleared."""
    from gpujail.chaos.checkers import network  # noqa: F401  (registers the network windows)
    h = History()
    h.ready_worker(0.0, "A")
    h.add(0.1, "ldconfig-node", "chaos.ldconfig", view="gpu", code=0)
    h.probe(0.2, "A", began=0.05)
    assert opened("ldconfig-while-ready", Run(h.events, None))[0] is False
    h.probe(0.3, "A", began=0.15)
    assert opened("ldconfig-while-ready", Run(h.events, None))[0] is True

    h = History()
    h.ready_worker(0.0, "A")
    h.add(1.0, "host", "jailfs.fault", fault="brick-latency", worker="", pids=[])
    h.probe(1.5, "A", began=0.9)    # began before the fault
    h.add(2.0, "host", "jailfs.clear", fault="brick-latency", worker="")
    h.probe(2.5, "A", began=2.1)    # began after it cleared
    ok, why = opened("net-fault-while-ready", Run(h.events, None))
    assert ok is False, why
    h.probe(2.4, "A", began=1.8)    # began under it, ended after it cleared
    ok, why = opened("net-fault-while-ready", Run(h.events, None))
    assert ok is True and "probed under it" in why, why


def test_k2_still_attached_needs_a_probe_round_begun_after_the_unlink():
    """late_detachment's "its mount outlived the remote unlink" needs a round that began after the
    unlink and still saw the file; one begun before it saw the file before the unlink."""
    from gpujail.chaos.checkers import network
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    removal = h.add(1.0, "B", "cli.cleanup.unlink", pid=7, path=f"{JAIL}/{CUDA}", size=0)
    early = h.probe(1.4, "A", began=0.9)
    gone = h.probe(2.1, "A", **{CUDA: {"attached": False, "size": None, "error": "No such file or directory"}})
    run = Run(h.events, None)
    assert network.late_detachment(run, removal, gone) is None
    late = h.probe(1.6, "A", began=1.1)
    run = Run(sorted(h.events, key=lambda e: e["t"]), None)
    assert network.late_detachment(run, removal, gone) is late
    assert early is not late


def test_the_probe_records_when_its_round_began(tmp_path, monkeypatch):
    """node_probes.op_probe, the real probe: its event carries `began`, before its `t`."""
    from gpujail.backends import node_probes
    from gpujail.world import history
    hist = tmp_path / "history.jsonl"
    monkeypatch.setenv(history.ENV, str(hist))
    (tmp_path / "plain").write_bytes(b"x" * 10)
    node_probes.op_probe({"files": [{"path": str(tmp_path / "plain"), "host": str(tmp_path / "plain")}]})
    [event] = [e for e in history.load(str(hist)) if e["kind"] == "probe"]
    assert event["began"] <= event["t"]


def _retired_prewarm() -> list[dict]:
    """The prewarm node ready and probed, then retired by the harness (a kill at no barrier); w1
    starts afterwards, alone, and fails."""
    h = History()
    h.add(0.0, "host", "chaos.begin", scenario="s", impl="reference", seed=0, schedule={}, versions={})
    h.ready_worker(0.0, "prewarm")
    h.probe(0.05, "prewarm")
    h.add(0.06, "host", "chaos.kill", worker="prewarm", barrier="")
    h.add(0.1, "w1", "worker.start", impl="reference", attempt=0)
    h.add(0.2, "w1", "worker.exit", code=4, error="configure failed")
    return h.events


def test_a_retired_node_opens_no_window():
    run = Run(_retired_prewarm(), None)
    assert opened("failure-while-ready", run)[0] is False
    assert opened("kill-while-ready", run)[0] is False
    ok, why = opened("kill", run)
    assert ok is False, why   # retiring the prewarm node is no fault


def test_an_ldconfig_opens_no_window_on_its_own_node():
    """The GPU ldconfig nemesis is ready and probed at the end: its own ldconfig runs are not a window."""
    h = History()
    h.ready_worker(0.0, "ldconfig-node")
    h.add(0.1, "ldconfig-node", "chaos.ldconfig", view="gpu", code=0)
    h.probe(0.2, "ldconfig-node")
    assert opened("ldconfig-while-ready", Run(h.events, None))[0] is False


@pytest.mark.kernel
def test_the_runner_ends_the_prewarm_span_at_its_kill_and_probes_it(tmp_path):
    from gpujail.chaos import runner, scenario
    from gpujail.world import history
    result = runner.run(scenario.Scenario(name="warm", gpu_workers=1, warm=True), "reference", tmp_path / "run")
    run = Run(history.load(str(result.history_path)), None)
    (prewarm,) = [(ready, end) for node, ready, end in ready_spans(run) if node == "prewarm"]
    assert prewarm[1] != float("inf"), "the prewarm node's ready span never ended"
    assert any(e["kind"] == "probe" and prewarm[0]["t"] <= e["t"] < prewarm[1] for e in run.node_events("prewarm"))
    assert result.verdict.valid is True, result.report()


@pytest.mark.kernel
def test_a_harness_thread_that_dies_fails_the_run_loudly(tmp_path, monkeypatch):
    """The barrier keeper and a network-fault injector run in threads of the harness; one that died
    (a history record cut in mid-write once killed the injector) left a run whose faults never came,
    reported at best as INCONCLUSIVE. Now the run itself fails, naming the thread and its error."""
    from gpujail.backends import jailfs_fleet, kernel
    from gpujail.backends.jailfs import NetFault
    from gpujail.chaos import nemesis, runner, scenario
    from gpujail.fixtures.jail import make_jail
    from gpujail.world import history

    def broken(*args, **kwargs):
        raise ValueError("a record cut in mid-write")

    one = scenario.Scenario(name="one", gpu_workers=1)
    monkeypatch.setattr(nemesis, "keep_barriers", broken)
    with pytest.raises(RuntimeError, match="the barrier keeper failed: a record cut in mid-write"):
        runner.run(one, "reference", tmp_path / "keeper")
    # a latency fault on a local jail, due at the first start: the local file system has no volume
    # to slow, so its injector dies (waited for here: a run may end before the injector's next look)
    fleet_class = jailfs_fleet.fleet_class(kernel.Fleet, "local", (NetFault("latency", after_ready=0, hold=0.1, ms=5),))
    hist = tmp_path / "history.jsonl"
    with pytest.raises(RuntimeError, match="the latency fault's injector failed"):
        with fleet_class(make_jail(tmp_path / "jail"), {history.ENV: str(hist)}) as fleet:
            history.append(str(hist), "worker.start", node="w0", impl="reference", attempt=0)
            for n in fleet._nemesis:
                n.stop(timeout=10)


# -- the gate: UNKNOWN and INCONCLUSIVE are not success ------------------------------------------

def test_an_unlisted_inconclusive_run_fails_the_gate():
    from test_cli import summary_of
    summary = summary_of([{"test": "t0", "status": "passed", "reason": "", "ids": ["INV-1"]},
                          {"test": "t1", "status": "inconclusive", "reason": "INCONCLUSIVE: ...", "ids": ["INV-1"]}])
    assert running.pytest_outcome(1, False, summary) == "inconclusive"
    summary["requirements"]["INV-1"]["tests"][1]["status"] = "expected-inconclusive"
    assert running.pytest_outcome(0, False, summary) == "passed"


def test_an_inconclusive_expectation_needs_a_reason(tmp_path):
    f = tmp_path / "x.toml"
    f.write_text('[inconclusive]\n"test_scenario[failing-neighbour]" = " "\n')
    with pytest.raises(options.BadInput, match=r"\[inconclusive\] test_scenario\[failing-neighbour\]: no reason"):
        options.load_expectations(options.Value("expectations", str(f), "command line"))
