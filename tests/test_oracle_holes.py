"""Self-tests that kill the oracle mutants the other self-tests let through (tests/oracle_mutants.py).

How this works
--------------
scripts/oracle-killmatrix runs the oracle's self-tests once per mutant of the checker, the probes
and the gate; each test here was written because a mutant survived them, and its docstring names that
mutant and the SPEC rule it guards. Pure tests on small histories built like tests/test_checker.py's
(a reference start, probe rounds), except the probe tests, which run `node_probes.op_probe` in this process
on plain files (no gcc, no kernel backend) so that a mutant of the probe is seen here.

The last two tests are the oracle's own holes, found while writing the mutants: histories the
checker calls VALID although SPEC section 6 says they prove nothing. They are non-strict xfails
until the checker learns the rule (docs/oracle-kill-matrix.md has the details).
"""
from __future__ import annotations

from test_checker import CUDA, GSP, JAIL, NVML, T0, History, good_final, good_run, statuses

from gpujail.chaos.checker import UNKNOWN, check, is_bad
from gpujail.chaos.checkers import windows
from gpujail.chaos.checkers.queries import Run

CUT = {"attached": False, "size": None, "error": "Transport endpoint is not connected"}   # ENOTCONN


# -- what a probe result means (INV-1, INV-5) ----------------------------------------------------

def test_an_attached_mount_with_placeholder_content_is_not_the_driver_file():
    """INV-5, REF-7, K-3 (mutant placeholder-content-accepted): a worker whose firmware mount shows a
    26-byte marker (attached, readable, not the host's bytes; firmware is never loaded, so no
    loader speaks) reported ready with a placeholder, not the driver file."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A", **{GSP: {"attached": True, "size": 26, "same_bytes": False}})
    verdict = check(h.events, good_final())
    assert verdict.results["INV-5"].valid is False, verdict.summary()
    assert f"{GSP}: 26-byte file that is not the host file (a placeholder)" in verdict.explanation


def test_a_library_the_loader_refuses_is_lost_even_with_the_hosts_bytes():
    """INV-1 ("loads with the real loader"), K-3 (mutant loader-ignored): the file is the host's,
    byte for byte, but the loader refuses it (a dependency it needs became a placeholder): a GPU job
    cannot use it, so the worker lost it."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.probe(0.3, "A", **{NVML: {"loader": f"{JAIL}/{CUDA}: file too short"}})
    verdict = check(h.events, good_final())
    assert verdict.results["INV-1"].valid is False, verdict.summary()
    assert verdict.explanation.startswith(f"worker A lost {NVML}: loader failed")


def test_another_nodes_network_fault_excuses_nothing():
    """INV-1, K-2 (mutant any-network-fault-excuses): an ENOTCONN is the harness's doing only on the
    node whose client it killed, or while the brick is down; the same error on another node, or
    after the brick came back, is a loss."""
    for fault, clear in (({"fault": "lose-client", "worker": "B", "pids": [4321]}, None),
                         ({"fault": "brick-down", "worker": "", "pids": [1234]}, 0.2)):
        h = History()
        h.ready_worker(0.0, "A")
        h.probe(0.06, "A")
        h.add(0.1, "host", "jailfs.fault", began=T0 + 0.1, **fault)
        if clear:
            h.add(clear, "host", "jailfs.clear", fault=fault["fault"], worker="")
        h.probe(0.3, "A", **{NVML: CUT})
        verdict = check(h.events, good_final(transient_only=False))
        assert verdict.results["INV-1"].valid is False, (fault, verdict.summary())


# -- fault windows (SPEC section 6) --------------------------------------------------------------

def test_a_window_that_raises_is_not_opened(monkeypatch):
    """SPEC 6, "a fault that never happened is no pass" (mutant broken-window-opens): a window
    predicate that raises proves nothing happened; `opened` says it stayed closed, and why."""
    def broken(run):
        raise KeyError("worker")
    monkeypatch.setitem(windows.WINDOWS, "broken", ("a window whose predicate raises", broken))
    ok, why = windows.opened("broken", Run(good_run().events, None))
    assert ok is False and why == "window broken raised KeyError: 'worker'"


# -- the chaos run's status: UNKNOWN and INCONCLUSIVE are not success (SPEC section 6) ------------

def _chaos_run(tmp_path, events: list[dict], **fields):
    from gpujail.chaos import runner, scenario
    return runner.ChaosRun(scenario=scenario.Scenario(name="s"), impl="reference", seed=0, run_dir=tmp_path,
                           verdict=check(events, good_final()), **fields)


def test_an_undecided_invariant_fails_the_chaos_run(tmp_path):
    """SPEC 6, "UNKNOWN and INCONCLUSIVE are not success" (mutant runner-excuses-unknown): a ready
    worker the probes never reached leaves INV-1 and INV-5 UNKNOWN, and the run is UNKNOWN, not
    PASS; only INV-4 (an uninstrumented implementation) is excused."""
    h = good_run()
    h.ready_worker(0.3, "C", missing=0)   # never probed
    result = _chaos_run(tmp_path, h.events)
    assert result.judge() == ([], ["INV-1", "INV-5"]) and result.status == "UNKNOWN"
    quiet = [e for e in good_run().events if e["kind"] != "impl.placeholders"]   # INV-4 UNKNOWN: excused
    assert statuses(_chaos_run(tmp_path, quiet).verdict)["INV-4"] == "UNKNOWN"
    assert _chaos_run(tmp_path, quiet).status == "PASS"


def test_a_run_whose_fault_window_never_opened_is_inconclusive(tmp_path):
    """SPEC 6 (mutant inconclusive-is-pass): every invariant held, but the scenario's declared kill
    never happened: the run proved nothing about its fault, so it is INCONCLUSIVE."""
    result = _chaos_run(tmp_path, good_run().events,
                        windows={"overlap": (True, "A and B started at once"), "kill": (False, "nobody was killed")})
    assert result.verdict.valid is True
    assert result.unopened() == ["kill"] and result.status == "INCONCLUSIVE"


# -- INV-3 jail hygiene, REF-11 --------------------------------------------------------------------

def test_a_start_that_wrote_outside_the_jail_breaks_inv3():
    """INV-3, REF-11 (mutant ignore-impl-outside): the jail is clean and outside_changes is empty, but
    A's node saw its start create a file outside the jail (its copy-on-write view of the host,
    `impl.outside`): a violation naming the worker, the start and the path."""
    h = good_run()
    outside = h.add(0.039, "A", "impl.outside", changes=[{"path": "/etc/ld.so.conf.d/gpu.conf", "change": "created"}])
    verdict = check(h.events, good_final())
    r = verdict.results["INV-3"]
    assert r.valid is False and verdict.first_violation is outside, verdict.summary()
    assert r.violations[0].explanation == (
        "jail hygiene (REF-11): worker A's start `python3 -m gpujail.reference_impl reference` created "
        "/etc/ld.so.conf.d/gpu.conf outside the jail, at t=0.039s")


# -- the probe (gpujail/backends/node.py op_probe), in this process --------------------------------

def test_the_probe_answers_every_file_and_compares_it_with_the_hosts(tmp_path):
    """SPEC 6 "a probe round covers every file", INV-5, REF-7 (mutants probe-drops-a-file and
    probe-skips-byte-compare; test_evidence's probe test needs gcc): one result per file asked, in
    order; the host's bytes are `same_bytes`, a marker in their place is not (and is bad), and a
    file that is not there has no size."""
    from gpujail.backends import node_probes
    host = tmp_path / "host.bin"
    host.write_bytes(bytes(range(256)) * 16)
    (tmp_path / "copy.bin").write_bytes(host.read_bytes())
    (tmp_path / "marker.bin").write_bytes(b"gpujail placeholder marker")
    files = [{"path": str(tmp_path / name), "host": str(host)} for name in ("copy.bin", "marker.bin", "gone.bin")]
    results = node_probes.op_probe({"files": files})["results"]
    assert [r["path"] for r in results] == [f["path"] for f in files]
    copy, marker, gone = results
    mounted = lambda r: {**r, "attached": True}   # plain files, no mount points: judged as if mounted
    assert copy["size"] == 4096 and copy["same_bytes"] is True and not is_bad(mounted(copy))
    assert marker["size"] == 26 and marker["same_bytes"] is False and is_bad(mounted(marker))
    assert gone["size"] is None and is_bad(mounted(gone))


# -- the oracle's own holes (not mutants: the checker as it is) -------------------------------------

def test_a_file_left_out_of_every_round_is_not_clean():
    """SPEC 6, "a probe round covers every file the worker verified": A was asked about CUDA in
    every round (each probe event records what it was `asked`), but no round ever answers for it.
    Nothing cleared it. (A hole of the checker until its rounds recorded what they were asked.)"""
    h = History()
    h.ready_worker(0.0, "A")
    for t in (0.06, 0.3, 0.5):
        probe = h.probe(t, "A")
        probe["asked"] = [r["path"] for r in probe["results"]]
        probe["results"] = [r for r in probe["results"] if not r["path"].endswith(CUDA)]
    h.add(0.6, "host", "chaos.end")
    results = check(h.events, good_final()).results   # short from the first round on: INV-5 (or INV-1)
    assert results["INV-5"].valid is not True or results["INV-1"].valid is not True


def test_a_span_not_probed_at_its_end_is_unknown():
    """SPEC 6, "every ready span is probed ... once at its end": A and B were probed once, right
    after becoming ready; the run went on for five seconds (C started and became ready) and ended
    with no last round for them. What happened to A's and B's files after t=0.16 s is unknown."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.ready_worker(0.1, "B", missing=0)
    h.probe(0.16, "B")
    h.ready_worker(3.9, "C", missing=0)
    h.probe(4.1, "C")
    h.add(5.0, "host", "chaos.end")
    assert check(h.events, good_final()).results["INV-1"].valid == UNKNOWN
