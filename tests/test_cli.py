"""Tests for the `gpujail` command (gpujail/cli.py, gpujail/commands/) and the HTML report (gpujail/report.py).

The command is run as a user runs it, in a child process (`python -m gpujail`, and once as the
installed console script), and read from its exit code, its stdout and its stderr. Bad input must
give one line on stderr, its own exit code and no traceback, and leave nothing behind (each child
gets its own TMPDIR, checked empty afterwards). The `run` and `reproduce` tests run real scenarios on
the kernel backend; the tools behind the same front door (`check`, `expectations`, `explore`,
`bench`) run on saved or simulated runs; the report and progress tests are pure.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_checker import good_final, good_run
from test_timeline import seed_bug

from gpujail import backends, cli, report, report_page
from gpujail.backends import kernel
from gpujail.chaos import scenario
from gpujail.commands import progress, scenarios
from gpujail.commands import run as running
from gpujail.options import OPTIONS
from gpujail.world import failpoints

REPO = Path(__file__).resolve().parents[1]
COLD_RACE = "chaos/test_scenarios.py::test_scenario[cold-race]"
needs_kernel = pytest.mark.skipif(bool(kernel.precondition()), reason=str(kernel.precondition()))


def gpujail(tmp_path, *args, exe=None) -> subprocess.CompletedProcess:
    """Run the command in the repository with its own TMPDIR, which must be empty afterwards."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp)}
    for _, var, _, _ in OPTIONS:   # the plugin's options from the environment would change the defaults
        env.pop(var, None)
    r = subprocess.run(exe or [sys.executable, "-m", "gpujail", *args], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert not list(tmp.iterdir()), f"left behind: {list(tmp.iterdir())}"
    return r


def one_line_error(r: subprocess.CompletedProcess, code: int, *words: str) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpujail"), r.stderr
    for w in words:
        assert w in lines[0]
    return lines[0]


# -- listing commands ------------------------------------------------------------------------

def test_failpoints_lists_the_registry_and_the_grammar(tmp_path):
    r = gpujail(tmp_path, "failpoints")
    assert r.returncode == 0, r.stderr
    listed = [ln.split()[0] for ln in r.stdout.splitlines() if ln and ln.split()[0] in failpoints.REGISTRY]
    assert listed == list(failpoints.REGISTRY)
    assert "term   := [N '*' | P '%'] action ['(' arg ')']" in r.stdout
    assert "GPUJAIL_FAILPOINTS=" in r.stdout and "pause(barrier)" in r.stdout


def test_installed_console_script(tmp_path):
    """`gpujail` is installed with the package ([project.scripts]) beside this Python."""
    exe = Path(sys.executable).parent / "gpujail"
    assert exe.exists(), "pip install -e . installs the gpujail command"
    r = gpujail(tmp_path, exe=[str(exe), "scenarios"])
    assert r.returncode == 0, r.stderr


def test_scenarios_one_line_each(tmp_path):
    r = gpujail(tmp_path, "scenarios")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    names = scenario.names()
    assert [ln.split()[0] for ln in lines[:len(names)]] == names
    assert "opt-in: -m scale" in next(ln for ln in lines if ln.startswith("scale-128"))
    assert "8 GPU" in next(ln for ln in lines if ln.startswith("cold-race "))


def test_scenarios_checks_files(tmp_path):
    good = tmp_path / "mine.toml"
    good.write_text('name = "mine"\ndescription = "two workers. More text."\ngpu_workers = 2\n')
    bad = tmp_path / "broken.toml"
    bad.write_text('name = "broken"\ngpu_wrokers = 2\n')
    r = gpujail(tmp_path, "scenarios", str(good), str(bad))
    one_line_error(r, cli.EXIT["bad-input"], str(bad), "gpu_wrokers")
    assert r.stdout.splitlines() == [scenarios.one_line(scenario.load(good))]
    assert "two workers" in r.stdout and "More text" not in r.stdout


# -- bad input: one line, its own exit code, nothing left --------------------------------------

BROKEN = {"syntax.toml": 'name = "x"\ngpu_workers = \n',
          "failpoint.toml": 'name = "x"\nfaults = [{ worker = "*", failpoint = "cli.before_nothing", term = "off" }]\n',
          "worker.toml": 'name = "x"\ngpu_workers = 2\nkills = [{ worker = "w7", barrier = "b" }]\n'}


@pytest.mark.parametrize("args,code,words", [
    (["run", "--impl", "no-such-impl"], "bad-input", ["--impl 'no-such-impl'", "neither a bundled implementation"]),
    (["run", "--impl", "/no/such/runtime.sh -j {jail}"], "bad-input", ["not found: /no/such/runtime.sh"]),
    (["run", "--impl", "mutant:nonsense"], "bad-input", ["unknown mutant"]),
    (["run", "--impl", "sh 'unclosed"], "bad-input", ["cannot parse"]),
    (["run", "--backend", "vm"], "bad-input", ["--backend 'vm'", "kernel, model, docker"]),
    (["run", "--expectations", "/no/such.toml"], "bad-input", ["/no/such.toml: no such file"]),
    (["run", "--seed", "x"], "bad-input", ["--seed", "invalid int value"]),
    (["reproduce", "no-such-scenario"], "bad-input", ["no-such-scenario.toml: no such scenario"]),
    (["reproduce", "cold-race", "--impl", "nope"], "bad-input", ["--impl 'nope'"]),
    (["reproduce", "cold-race", "--", "-x"], "bad-input", ["no pytest arguments"]),
    (["reproduce", "cold-race", "--start-timeout", "inf"], "bad-input", ["--start-timeout 'inf'", "positive number"]),
    (["reproduce", "cold-race", "--cli", "fak"], "bad-input", ["--cli", "invalid choice: 'fak'"]),
    (["reproduce", "cold-race", "--jail-fs", "nfs"], "bad-input", ["--jail-fs 'nfs'", "local, gluster"]),
    (["reproduce", "gluster-latency", "--launcher", "slurm"], "bad-input", ["a jail on gluster", "--launcher slurm"]),
    (["frobnicate"], "bad-input", ["invalid choice: 'frobnicate'"]),
    ([], "bad-input", ["required: COMMAND"]),
    (["check"], "bad-input", ["gpujail check", "required: history"]),
    (["check", "/no/such.jsonl"], "bad-input", ["gpujail check", "cannot read history /no/such.jsonl"]),
    (["expectations", "/no/such.json"], "bad-input", ["gpujail expectations", "cannot read report /no/such.json"]),
    (["killmatrix", "--mutants", "no-lock,nope"], "bad-input", ["gpujail killmatrix", "unknown mutant(s) nope"]),
    (["killmatrix", "--tests", "conformance/nosuch.py"], "bad-input", ["no such test path 'conformance/nosuch.py'"]),
    (["explore", "find", "nope"], "bad-input", ["gpujail explore find", "'nope'", "reference, legacy, direct"]),
    (["explore", "find", "mutant:nope"], "bad-input", ["unknown mutant"]),
    (["explore", "replay", "legacy", "[1]"], "bad-input", ["gpujail explore replay", "not a JSON plan object"]),
    (["explore", "replay", "legacy", '{"schedule": 5}'], "bad-input", ["gpujail explore replay", "not a JSON plan object"]),
    (["explore", "walk", "legacy"], "bad-input", ["invalid choice: 'walk'"]),
    (["explore", "bounded", "legacy", "--preemptions", "-1"], "bad-input", ["gpujail explore bounded", "0 or more"]),
    (["bench", "--only", "nosuch"], "bad-input", ["gpujail bench", "invalid choice: 'nosuch'"]),
    (["bench", "--", "-x"], "bad-input", ["no pytest arguments"]),
])
def test_bad_input(tmp_path, args, code, words):
    one_line_error(gpujail(tmp_path, *args), cli.EXIT[code], *words)


@pytest.mark.parametrize("name,words", [("syntax.toml", ["line 2"]), ("failpoint.toml", ["cli.before_nothing"]),
                                        ("worker.toml", ["no worker 'w7'"])])
def test_bad_scenario_file(tmp_path, name, words):
    path = tmp_path / name
    path.write_text(BROKEN[name])
    one_line_error(gpujail(tmp_path, "reproduce", str(path)), cli.EXIT["bad-input"], str(path), *words)


def test_bad_expectations_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[requirements]\n"REF-99" = "no such requirement"\n')
    one_line_error(gpujail(tmp_path, "run", "--expectations", str(path)), cli.EXIT["bad-input"], "REF-99")


@pytest.mark.parametrize("command,content,words", [
    ("check", "not json\n", ["not a history", "line 1"]),
    ("check", '{"t": 1}\n', ["line 1 is not an event"]),
    ("expectations", '{"requirements": {}}', ["not a gpujail summary.json", "'run_info'"]),
    ("expectations", "[1, 2]", ["not a gpujail summary.json"]),
])
def test_tools_reject_files_that_are_not_theirs(tmp_path, command, content, words):
    path = tmp_path / "input"
    path.write_text(content)
    one_line_error(gpujail(tmp_path, command, str(path)), cli.EXIT["bad-input"], f"gpujail {command}", str(path), *words)


def test_unavailable_backend_is_exit_3(tmp_path, monkeypatch):
    """No engine answers at DOCKER_HOST: one line naming the backend and why, exit 3."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    one_line_error(gpujail(tmp_path, "run", "--backend", "docker"), cli.EXIT["backend"], "--backend docker", "docker")


def test_backend_availability_asks_the_backend():
    assert backends.unavailable("kernel") == kernel.precondition()
    assert backends.unavailable("model") is None   # a simulation: needs nothing from the host
    assert "unknown backend" in backends.unavailable("vm")


# -- reproduce and run on the kernel backend ---------------------------------------------------

@pytest.mark.kernel
@needs_kernel
def test_reproduce_the_seed_bug(tmp_path):
    """`gpujail reproduce cold-race --impl legacy --seed 3`: INVALID (INV-1), exit 1, the chain in
    words ending at the violation, and the timeline kept where it says."""
    out = tmp_path / "out"
    r = gpujail(tmp_path, "reproduce", "cold-race", "--impl", "legacy", "--seed", "3", "--out", str(out))
    assert r.returncode == cli.EXIT["failed"], r.stdout + r.stderr
    assert "scenario cold-race against legacy (seed 3)" in r.stdout
    assert "verdict: INVALID (INV-1)" in r.stdout
    chain = r.stdout[r.stdout.index("causal chain:"):].splitlines()
    assert "chaos.fault" in chain[1] and "<- violation" in next(ln for ln in chain if "violation" in ln)
    assert re.search(r"done in \d+:\d\d: 8/8 workers ready, [1-9]\d* faults injected", r.stdout)
    assert f"timeline: {out}/timeline.html" in r.stdout
    assert "<svg" in (out / "timeline.html").read_text()
    assert {p.name for p in out.iterdir()} == {"history.jsonl", "final_state.json", "timeline.html"}


@pytest.mark.kernel
@needs_kernel
def test_reproduce_valid_run(tmp_path):
    out = tmp_path / "out"
    r = gpujail(tmp_path, "reproduce", "cold-race", "--impl", "reference", "--out", str(out))
    assert r.returncode == cli.EXIT["passed"], r.stdout + r.stderr
    assert "verdict: VALID" in r.stdout and "causal chain" not in r.stdout
    assert (out / "timeline.html").exists()   # drawn for a valid run too


@pytest.mark.kernel
@pytest.mark.gluster
@needs_kernel
def test_reproduce_a_network_fault_scenario_injects_its_fault(tmp_path):
    """`gpujail reproduce gluster-client-lost`, a scenario of chaos/scenarios/jailfs/, runs as the
    chaos suite runs it: on the jail's file system it pins, its network fault injected (w3's
    GlusterFS client lost while w3 starts), both fault windows open."""
    from gpujail.backends import jailfs
    reason = jailfs.unavailable("gluster", install=False)
    if reason:   # a failure where it must run (run-tests as root sets GPUJAIL_REQUIRE_JAILFS=1)
        (pytest.fail if os.environ.get("GPUJAIL_REQUIRE_JAILFS") else pytest.skip)(reason)
    out = tmp_path / "out"
    r = gpujail(tmp_path, "reproduce", "gluster-client-lost", "--impl", "reference", "--out", str(out))
    assert r.returncode == cli.EXIT["passed"], r.stdout + r.stderr
    assert "window net-fault-while-starting: opened: lose-client of w3" in r.stdout, r.stdout
    assert "window net-fault-cleared: opened" in r.stdout, r.stdout
    assert '"kind":"jailfs.fault"' in (out / "history.jsonl").read_text()
    assert re.search(r"done in \d+:\d\d: 4/4 workers ready", r.stdout), r.stdout   # w3 counted once, no prewarm


@pytest.mark.kernel
@needs_kernel
def test_reproduce_interrupted_leaves_nothing(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) during a run: exit 130, one
    line, no traceback, no temporary directory and no process left."""
    slow = tmp_path / "slow.toml"
    slow.write_text('name = "slow"\ngpu_workers = 3\n'
                    'faults = [{ worker = "*", failpoint = "cli.before_list", term = "sleep(30000)" }]\n')
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "gpujail", "reproduce", str(slow), "--out", str(tmp_path / "out")],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=terminal_sigint)
    try:
        deadline = time.monotonic() + 60
        while not (h := _first(tmp, "*/run/history.jsonl")) or b'"sleep"' not in h.read_bytes():
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not reach the CLI"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == cli.EXIT["interrupted"], out + err
    assert "Traceback" not in out + err and err.strip().splitlines() == ["gpujail: interrupted; the run's nodes were stopped"]
    assert not list(tmp.iterdir())
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(tmp) in _cmdline(p)]


def terminal_sigint() -> None:
    """In the child: SIGINT's default action, as a terminal's foreground job has it. A run started in
    the background of a non-interactive shell (`cmd &`, a CI runner's job) inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt handler: a Ctrl-C test would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _first(top: Path, pattern: str) -> Path | None:
    """The first path under `top` matching `pattern`, or None. A directory removed while the glob walks
    it is no match yet, not an error: pytest removes and remakes a given --basetemp (the run's
    scratch directory) as its session starts, and `**` lists it, then scans it (CI 52)."""
    try:
        return next(top.glob(pattern), None)
    except FileNotFoundError:
        return None


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.kernel
@needs_kernel
def test_run_stopped_by_x_is_a_failure_not_an_interrupt(tmp_path):
    """`gpujail run ... -- -x` (a pytest habit), with xdist: the session stops at the first failure
    by raising xdist's `Interrupted`, a KeyboardInterrupt. That is a failed run with its reports in
    place (exit 1), not Ctrl-C (it used to end "INTERRUPTED (exit 130)", reports under interrupted/)."""
    reports = tmp_path / "reports"
    r = gpujail(tmp_path, "run", "--impl", "legacy", "--expectations", "", "--reports", str(reports), "-n", "2",
                "-k", "test_no_empty_placeholder_after_cold_start or test_cold_bring_up", "--", "-x")
    assert r.returncode == cli.EXIT["failed"] and "FAILED (exit 1)" in r.stdout, r.stdout + r.stderr
    assert (reports / "summary.json").exists() and not (reports / "interrupted").exists()


@pytest.mark.kernel
@needs_kernel
@pytest.mark.parametrize("expectations,code", [(None, "passed"), ("", "failed")], ids=["expected", "unexpected"])
def test_run_gate(tmp_path, expectations, code):
    """`gpujail run` against legacy on the seed bug: green with legacy's expectations (the failure
    is expected), red without; the summary per requirement and per invariant, and the reports."""
    reports = tmp_path / "reports"
    exp = [] if expectations is None else ["--expectations", expectations]
    r = gpujail(tmp_path, "run", "--impl", "legacy", *exp, "--reports", str(reports), "-n", "0", COLD_RACE)
    assert r.returncode == cli.EXIT[code], r.stdout + r.stderr
    assert re.search(r"done in \d+:\d\d: 1/1 tests done( \(1 failed\))?, \d+ workers ready, [1-9]\d* faults", r.stdout)
    assert "invariants over 1 chaos runs:" in r.stdout
    invariants = r.stdout[r.stdout.index("invariants over"):]
    inv1 = next(ln for ln in invariants.splitlines() if ln.lstrip(" !").startswith("INV-1"))
    assert "1 FAIL" in inv1 and (("(1 expected)" in inv1) == (code == "passed")) and inv1.startswith(" !") == (code != "passed")
    assert f"{code.upper()} (exit {cli.EXIT[code]})" in r.stdout
    for name in ("report.html", "summary.json", "junit.xml", "pytest.log"):
        assert str(reports / name) in r.stdout and (reports / name).exists()
    summary = json.loads((reports / "summary.json").read_text())
    assert summary["requirements"]["INV-1"]["tests"][0]["invariants"].startswith("INV-1=FAIL INV-2=PASS")
    assert "INV-1=FAIL" in (reports / "junit.xml").read_text()
    page = (reports / "report.html").read_text()
    assert "gpujail reproduce cold-race --impl legacy --seed 0" in page and "<svg" in page
    assert (reports / "chaos" / "test_scenario_cold-race_" / "history.jsonl").exists()


# -- the tools behind the same door ------------------------------------------------------------

def save(tmp_path, events, final=None) -> list[str]:
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps(e) + "\n" for e in events))
    if final is None:
        return [str(history)]
    (tmp_path / "final_state.json").write_text(json.dumps(final))
    return [str(history), str(tmp_path / "final_state.json")]


@pytest.mark.parametrize("run,final,code,verdict", [
    (seed_bug, good_final(transient_only=False), "failed", "verdict: INVALID (INV-1)"),
    (good_run, good_final(), "passed", "verdict: VALID"),
    (good_run, None, "inconclusive", "verdict: UNKNOWN"),   # no final state: INV-2, 3, 6 undecided
], ids=["invalid", "valid", "unknown"])
def test_check_judges_a_saved_history(tmp_path, run, final, code, verdict):
    """`gpujail check`: the checker's verdict under the command's exit codes (undecided is 4, not
    the 2 of bad input), and the timeline drawn where asked."""
    r = gpujail(tmp_path, "check", *save(tmp_path, run().events, final), "--timeline", str(tmp_path / "t.html"))
    assert r.returncode == cli.EXIT[code], r.stdout + r.stderr
    assert r.stdout.startswith(verdict) and "<svg" in (tmp_path / "t.html").read_text()


def test_expectations_from_a_summary(tmp_path):
    summary = summary_of([{"test": COLD_RACE, "status": "failed", "reason": 'AssertionError: "lost"', "ids": ["INV-1"]},
                          {"test": "conformance/x.py::test_a", "status": "passed", "reason": "", "ids": ["REF-1"]}])
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    r = gpujail(tmp_path, "expectations", str(tmp_path / "summary.json"))
    assert r.returncode == 0, r.stderr
    assert 'implementation = "legacy"' in r.stdout and "test_a" not in r.stdout
    assert f'"{COLD_RACE}" = "INV-1: AssertionError: \'lost\'"' in r.stdout


def test_explore_finds_the_seed_bug_on_the_model(tmp_path):
    r = gpujail(tmp_path, "explore", "find", "legacy", "--seed", "1", "--max-examples", "300")
    assert r.returncode == cli.EXIT["failed"], r.stdout + r.stderr
    assert "VIOLATION INV-1" in r.stdout
    plan = r.stdout.split("plan (size", 1)[1].splitlines()[1].strip()
    again = gpujail(tmp_path, "explore", "replay", "legacy", plan)
    assert again.returncode == cli.EXIT["failed"] and "VIOLATION INV-1" in again.stdout


def test_explore_bounded_proves_a_bound_or_prints_the_failing_plan(tmp_path):
    r = gpujail(tmp_path, "explore", "bounded", "direct", "--preemptions", "0", "--jobs", "1")
    assert r.returncode == cli.EXIT["passed"] and "no violation" in r.stdout, r.stdout + r.stderr
    r = gpujail(tmp_path, "explore", "bounded", "legacy", "--preemptions", "0", "--jobs", "1")
    assert r.returncode == cli.EXIT["failed"] and "VIOLATION INV-1" in r.stdout, r.stdout + r.stderr
    plan = r.stdout.split("plan (size", 1)[1].splitlines()[1].strip()
    assert '"deviations"' in plan
    again = gpujail(tmp_path, "explore", "replay", "legacy", plan)
    assert again.returncode == cli.EXIT["failed"] and "VIOLATION INV-1" in again.stdout


@pytest.mark.kernel
@needs_kernel
def test_bench_one_cheap_figure(tmp_path):
    """`gpujail bench`: the table, and the JSON written as each figure ends (an hour's run stopped
    in its last figure keeps the others), which stderr reports with the figure's time."""
    out = tmp_path / "bench.json"
    r = gpujail(tmp_path, "bench", "--quick", "--only", "model", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    saved = json.loads(out.read_text())
    assert "model steps/s" in r.stdout and saved["quick"] is True
    assert re.search(r"^\.\.\. model: [0-9.]+ s$", r.stderr, re.M) and saved["figures"]["model"]["seconds"] > 0


# -- the pieces: exit codes, progress, the HTML report -----------------------------------------

def summary_of(tests: list[dict]) -> dict:
    reqs: dict = {}
    for t in tests:
        for rid in t.pop("ids"):
            entry = reqs.setdefault(rid, {"counts": {}, "tests": []})
            entry["counts"][t["status"]] = entry["counts"].get(t["status"], 0) + 1
            entry["tests"].append(t)
    return {"run_info": {"implementation": "legacy", "backend": "kernel", "contract_version": "1.0", "seed": "0"},
            "requirements": reqs, "uncited": ["K-2"]}


@pytest.mark.parametrize("code,statuses,outcome", [
    (0, ["passed", "expected-fail"], "passed"), (1, ["failed"], "failed"), (1, ["unexpected-pass"], "failed"),
    (0, ["skipped"], "inconclusive"), (5, [], "inconclusive"), (4, None, "bad-input"), (3, None, "error"),
    (2, None, "error"),
])
def test_pytest_outcome(code, statuses, outcome):
    summary = None if statuses is None else summary_of(
        [{"test": f"t{i}", "status": s, "reason": "", "ids": ["REF-1"]} for i, s in enumerate(statuses)])
    assert running.pytest_outcome(code, False, summary) == outcome
    assert running.pytest_outcome(code, True, summary) == "interrupted"


def test_history_watch_counts_complete_lines(tmp_path):
    h = tmp_path / "history.jsonl"
    watch = progress.HistoryWatch(lambda: [h, tmp_path / "not-yet.jsonl"])
    event = lambda **f: json.dumps({"t": 0, "pid": 1, **f}, separators=(",", ":"))  # noqa: E731
    h.write_text(event(node="w0", kind="worker.ready") + "\n" + event(node="w0", kind="failpoint", action="off") + "\n"
                 + event(node="w1", kind="failpoint", action="return")[:20])
    watch.poll()
    assert (len(watch.ready), watch.faults) == (1, 0)
    with open(h, "a") as f:
        f.write(event(node="w1", kind="failpoint", action="return")[20:] + "\n" + event(node="host", kind="chaos.kill")
                + "\n" + event(node="w0", kind="worker.ready") + "\n")
    watch.poll()
    assert (len(watch.ready), watch.faults) == (1, 2)


def test_html_report(tmp_path):
    """The page holds the test list, every chaos run (the passing one too) with its files, the
    scenario-by-invariant grid, the per-requirement and per-invariant tables, the failures, and for
    the failing chaos run its verdict, causal chain in words, replay command and timeline SVG."""
    h = seed_bug()
    h.add(0.0, "host", "chaos.begin", scenario="cold-race", impl="legacy", seed=4, schedule={})
    run = tmp_path / "chaos" / report.artefact_name(COLD_RACE)
    run.mkdir(parents=True)
    (run / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in h.events))
    (run / "final_state.json").write_text(json.dumps(good_final(transient_only=False)))
    invs = "INV-1=FAIL INV-2=PASS INV-3=PASS INV-4=UNKNOWN INV-5=PASS INV-6=PASS"
    summary = summary_of([
        {"test": COLD_RACE, "status": "failed", "reason": "AssertionError: scenario cold-race", "invariants": invs,
         "ids": [f"INV-{i}" for i in range(1, 7)]},
        {"test": "conformance/test_worker_start.py::test_cold_bring_up[1]", "status": "passed", "reason": "",
         "ids": ["REF-10"]},
        {"test": "chaos/test_scenarios.py::test_scenario[enospc]", "status": "passed", "reason": "",
         "invariants": invs.replace("FAIL", "PASS").replace("UNKNOWN", "PASS"), "ids": [f"INV-{i}" for i in range(1, 7)]},
    ])
    page = report_page.write_html(summary, tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")   # self-contained
    assert "<span class=\"gj-fail\">FAIL</span>" in page
    row = re.search(r"<tr class='gj-bad'><td>INV-1</td>.*?</tr>", page).group(0)
    assert "no lost content while a worker is ready" in row
    assert "<td>REF-10</td><td>a ready GPU worker" in page and "K-2" in page
    tests = page[page.index('<h2 id="tests">'):page.index('<h2 id="chaos-runs">')]
    assert tests.index("tests-failed") < tests.index("tests-passed") and tests.count("class='gj-test'") == 3
    runs = page[page.index('<h2 id="chaos-runs">'):page.index('<h2 id="picture">')]
    assert "id='run-test_scenario_enospc_'" in runs and "id='run-test_scenario_cold-race_'" in runs
    assert "href='chaos/test_scenario_cold-race_/history.jsonl'" in runs   # relative: the reports move as one
    assert "overlap" not in runs and runs.count("none declared") == 2
    invariants = page[page.index('<h2 id="invariants">'):]
    inv1 = re.search(r"<tr class='gj-bad'><td>INV-1</td><td>no lost content</td>.*?</tr>", invariants).group(0)
    assert [c for c in re.findall(r"<td class='gj-n'>(\d*)</td>", inv1)] == ["1", "1", ""]
    inv4 = re.search(r"<td>INV-4</td>.*?</tr>", invariants).group(0)
    assert re.findall(r"<td class='gj-n'>(\d*)</td>", inv4) == ["1", "", "1"]   # 1 PASS, 1 UNKNOWN
    assert "gpujail reproduce cold-race --impl legacy --seed 4" in page
    chain = page[page.index("causal chain:"):page.index("&lt;- violation")]
    assert "chaos.fault" in chain and "cli.cleanup.unlink" in chain
    svgs = re.findall(r"<svg\b.*?</svg>", page, re.DOTALL)
    assert len(svgs) == 2   # the grid, and the failing run's timeline
    grid = ET.fromstring(svgs[0])
    assert grid.get("id") == "gj-grid" and len(grid.findall(".//{http://www.w3.org/2000/svg}rect")) == 2 * 7
    assert ET.fromstring(svgs[1]).find(".//{http://www.w3.org/2000/svg}g[@id='violation']") is not None
    assert ET.fromstring(svgs[1]).find(".//{http://www.w3.org/2000/svg}g[@id='racing-pair']") is not None
    text = report.text(summary)
    assert "3 tests, 2 passed, 1 failed" in text and " !INV-1" in text
    assert f"{COLD_RACE} (failed)\n      AssertionError: scenario cold-race" in text   # the whole reason, indented


def test_html_report_of_a_green_run(tmp_path):
    summary = summary_of([{"test": "conformance/x.py::test_a", "status": "passed", "reason": "", "ids": ["REF-1"]}])
    page = report_page.write_html(summary, tmp_path / "report.html").read_text()
    assert "<span class=\"gj-pass\">PASS</span>" in page and "<svg" not in page
    assert page.count("<p>None.</p>") == 2


# -- hostile and broken vendor scripts (issue 15) --------------------------------------------------

@needs_kernel
def test_a_script_that_writes_outside_the_jail_fails_its_run(tmp_path):
    """The shell template after a write to the host outside the jail: every test it ran fails under
    REF-11 with the path named, and the host is as it was."""
    escaped = tmp_path / "somewhere" / "escaped"
    script = tmp_path / "escaping.sh"
    script.write_text(f"mkdir -p {escaped.parent} && echo x > {escaped}\n"
                      f"exec sh {REPO / 'reference_impl' / 'example.sh'} \"$@\"\n")
    r = gpujail(tmp_path, "run", "--impl", f"sh {script}", "--reports", str(tmp_path / "reports"), "-n", "1",
                "conformance/test_worker_start.py::test_cold_bring_up", "conformance/test_worker_start.py::test_non_debian_jail")
    assert r.returncode == 1, r.stdout + r.stderr
    summary = json.loads((tmp_path / "reports/summary.json").read_text())
    ref11 = summary["requirements"]["REF-11"]
    assert ref11["counts"].get("failed", 0) >= 2, ref11
    assert all(f"created {escaped} outside the jail" in t["reason"] for t in ref11["tests"]), ref11["tests"]
    assert not escaped.parent.exists(), "the host was changed"


@needs_kernel
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_run_stopped_by_a_signal_reports_and_leaves_nothing(tmp_path, sig, code):
    """SIGTERM (CI cancellation, `timeout`) or SIGHUP to `gpujail run` only, mid-run: the summary is
    printed as INTERRUPTED, exit 128 + the signal, the last run's reports stay as they were and this
    run's go to reports/interrupted/, and no temporary directory or process is left."""
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "summary.json").write_text('{"the": "last run"}')
    slow = tmp_path / "slow.sh"   # a start that takes its time, so the signal lands mid-test
    slow.write_text(f"sleep 2\nexec sh {REPO / 'reference_impl' / 'example.sh'} \"$@\"\n")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k not in [var for _, var, _, _ in OPTIONS]}, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "gpujail", "run", "--impl", f"sh {slow}", "--reports", str(reports),
                             "-n", "1", "conformance/test_worker_start.py"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _first(tmp, "gpujail-run-*/**/run/history.jsonl"):
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not start a worker"
            time.sleep(0.1)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, out + err
    assert f"INTERRUPTED (exit {code})" in out and "Traceback" not in out + err, out + err
    assert (reports / "summary.json").read_text() == '{"the": "last run"}'
    assert (reports / "interrupted" / "pytest.log").exists(), sorted(p.name for p in reports.iterdir())
    assert not list(tmp.iterdir()), f"left behind: {list(tmp.iterdir())}"
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(tmp) in _cmdline(p)]


INNER_TEST = """
import os, subprocess, time
from pathlib import Path
import pytest

@pytest.mark.parametrize("n", [0, 1])
def test_starts_a_daemon(n):
    daemon = subprocess.Popen(["sleep", "300"], start_new_session=True)   # out of pytest's group, as glusterd is
    (Path(os.environ["MARKS"]) / f"{daemon.pid}.started").touch()
    try:
        time.sleep(120)
    finally:
        time.sleep(6)   # a teardown that takes its time (glusterd's stop, a fleet's unmounts)
        daemon.kill()
        daemon.wait()
        (Path(os.environ["MARKS"]) / f"{daemon.pid}.stopped").touch()
"""


@pytest.mark.parametrize("to_group", [True, False], ids=["process-group", "pytest-alone"])
def test_a_terminated_pytest_session_tears_its_tests_down(tmp_path, to_group):
    """SIGTERM to a plain `pytest -n 2` session of a suite (a cancelled CI job signals the process
    group, `timeout` only pytest) unwinds its tests as Ctrl-C does: each test's cleanup stops the
    daemon it started (own session, as glusterd and its clients are). Python's default, dying on the
    spot, left both running. The teardown takes 6 s: signalled alone, the controller passes the
    signal on at once; before, a worker heard of it only as execnet's SIGINT 5 s after the controller
    asked it to exit, and was SIGKILLed 5 s later, in the middle of such a teardown (and in CI, once,
    of a quick one)."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["gpujail.plugin"]\nGPUJAIL_SUITE = True\n')
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k not in [var for _, var, _, _ in OPTIONS]}, "MARKS": str(marks)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "test_inner.py"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.glob("*.started"))) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the tests did not start"
            time.sleep(0.1)
        if to_group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = [int(m.name.split(".")[0]) for m in marks.glob("*.started") if not (marks / f"{m.stem}.stopped").exists()]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"daemons left running: {left}\n{out}"
    assert proc.returncode == 2 and "KeyboardInterrupt" in out, out   # pytest's "interrupted"


def test_stale_run_directories_are_swept_only_when_their_owner_is_gone(tmp_path):
    """A run killed outright (SIGKILL) leaves its directory; the next run removes it, but never the
    directory of a run still going."""
    from gpujail.commands import sweep
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = tmp_path / f"gpujail-run-{dead.pid}-abc", tmp_path / f"gpujail-run-{os.getpid()}-def"
    channels = tmp_path / f"gpujail-channels-{dead.pid}-ghi"   # the local launcher's, on /dev/shm
    for d in (stale, live, channels, tmp_path / "gpujail-run-notapid"):
        (d / "jail").mkdir(parents=True)
    assert sorted(sweep(tmp_path)) == sorted([stale, channels])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "gpujail-run-notapid"])


@needs_kernel
def test_workers_sets_the_count_of_scenarios_that_do_not_pin_it(tmp_path):
    """`--workers 4` runs 4 GPU workers in a scenario that does not pin its count (cold-race); a
    scenario that names its workers keeps its own; 0, negatives and more than the host can hold are
    bad input, said before anything runs."""
    from gpujail.chaos import scenario
    r = gpujail(tmp_path, "reproduce", "cold-race", "--impl", "reference", "--workers", "4", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    starts = {e["node"] for e in map(json.loads, (tmp_path / "out/history.jsonl").read_text().splitlines())
              if e["kind"] == "worker.start"}
    assert starts == {"w0", "w1", "w2", "w3"}, starts
    assert len(scenario.load("failing-neighbour").with_workers(4).workers) == 6   # pinned: it names w5
    for bad, words in (("0", "at least 1"), ("-1", "non-negative"), ("10000000", "this host can hold")):
        t0 = time.monotonic()
        one_line_error(gpujail(tmp_path, "run", "--workers", bad), 2, f"--workers '{bad}'", words)
        assert time.monotonic() - t0 < 5


@needs_kernel
def test_a_hanging_script_costs_about_one_deadline_per_test(tmp_path):
    """A script that never ends, with --start-timeout 2: each test ends after about one deadline
    (its starts run at once and are not restarted), and the reason says where, in words."""
    hang = tmp_path / "hang.sh"
    hang.write_text("setsid sleep 993.5 &\nsleep 994.5\n")
    t0 = time.monotonic()
    r = gpujail(tmp_path, "run", "--impl", f"sh {hang}", "--start-timeout", "2", "--reports", str(tmp_path / "reports"),
                "-n", "1", "conformance/test_worker_start.py::test_cold_bring_up")
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    tests = [t for entry in json.loads((tmp_path / "reports/summary.json").read_text())["requirements"].values()
             for t in entry["tests"]]
    assert tests and all("timeout after 2 s in start 1 of worker" in t["reason"] for t in tests), tests
    assert took < 60, f"3 tests with a 2 s deadline took {took:.0f} s"
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and ("993.5" in _cmdline(p) or "994.5" in _cmdline(p))]


def test_a_long_reason_is_shortened_on_screen_and_kept_whole_in_the_reports(tmp_path):
    """Issue 28: a failure's reason listing 90 paths is one unreadable line; the screenful shows the
    first few and how many more, summary.json and report.html keep every one."""
    paths = [f"usr/lib/x86_64-linux-gnu/libnvidia-{i}.so.550.54.15" for i in range(90)]
    reason = "AssertionError: files lost: " + ", ".join(paths) + "\nsecond line"
    summary = summary_of([{"test": "conformance/x.py::test_a", "status": "failed", "reason": reason, "ids": ["REF-7"]}])
    text = report.text(summary)
    assert f"{paths[5]} and 84 more (all of them: summary.json)\n      second line" in text
    assert paths[6] not in text
    assert all(p in report_page.write_html(summary, tmp_path / "report.html").read_text() for p in paths)


def test_the_reproduce_command_of_a_scheduled_run_names_its_schedule():
    """Issue 29: a chaos run under --schedule replays only with the same schedule, so report.html's
    command carries it (the strategy as the scheduler recorded it)."""
    test = "chaos/test_scenarios.py::test_scenario[cold-race]"
    events = [{"kind": "chaos.begin", "scenario": "cold-race", "seed": 2}]
    assert report.reproduce_command(test, events, {"implementation": "legacy"}) == \
        "gpujail reproduce cold-race --impl legacy --seed 2"
    events.append({"kind": "sched.begin", "strategy": "pct:d=3,k=268", "seed": 2, "workers": ["w0", "w1"]})
    assert report.reproduce_command(test, events, {"implementation": "legacy"}) == \
        "gpujail reproduce cold-race --impl legacy --seed 2 --schedule pct:d=3,k=268"


def test_the_reproduce_command_of_a_network_fault_run_is_reproduce_on_its_jail():
    """A network fault's scenario (chaos/scenarios/jailfs/) replays through `gpujail reproduce`,
    which injects its fault on the jail it pins; a run built in code replays as its pytest node."""
    test = "chaos/test_jailfs_scenarios.py::test_network_fault[gluster-client-lost]"
    events = [{"kind": "chaos.begin", "scenario": "gluster-client-lost", "seed": 0}]
    assert report.reproduce_command(test, events, {"implementation": "direct"}) == \
        "gpujail reproduce gluster-client-lost --impl direct --seed 0"
    test = "chaos/test_scenarios.py::test_cli_error_at_every_failpoint[cli.before_mount]"
    events = [{"kind": "chaos.begin", "scenario": "cli-error-cli.before_mount", "seed": 0}]
    assert report.reproduce_command(test, events, {"implementation": "direct"}) == f"gpujail run --impl direct -- '{test}'"
    # a run on another jail file system (--jail-fs, as CI's node-local locks) replays on it
    assert report.reproduce_command(test, events, {"implementation": "direct", "jail_fs": "nodelocal-locks"}) == \
        f"gpujail run --impl direct --jail-fs nodelocal-locks -- '{test}'"
    test, events = "chaos/test_scenarios.py::test_scenario[lock-holder-killed]", [
        {"kind": "chaos.begin", "scenario": "lock-holder-killed", "seed": 1}]
    assert report.reproduce_command(test, events, {"implementation": "legacy", "jail_fs": "nodelocal-locks"}) == \
        "gpujail reproduce lock-holder-killed --impl legacy --seed 1 --jail-fs nodelocal-locks"


def test_the_reproduce_command_runs_where_the_run_ran():
    """A run through a launcher replays through it (a race between cluster nodes is not one between
    this host's namespaces), and a run on the docker backend as its pytest node on that backend
    (`gpujail reproduce` runs only on the kernel backend)."""
    test = "chaos/test_scenarios.py::test_scenario[cold-race]"
    events = [{"kind": "chaos.begin", "scenario": "cold-race", "seed": 3}]
    assert report.reproduce_command(test, events, {"implementation": "legacy", "launcher": "slurm", "nodes": "2"}) == \
        "gpujail reproduce cold-race --impl legacy --seed 3 --launcher slurm --nodes 2"
    assert report.reproduce_command(test, events, {"implementation": "legacy", "backend": "docker"}) == \
        f"gpujail run --impl legacy --backend docker -- '{test}'"
