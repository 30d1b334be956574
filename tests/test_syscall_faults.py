"""Syscall faults through strace --inject (fixtures/syscall_faults.py): the term translation, the
wrapper on real processes under the real strace, the worker's PATH, `--cli real`, and the seed bug
reproduced through strace alone with the fake CLI's own failpoints off.

Choreography of the wrapper tests: the target is a small Python program making real `mkdir` calls
in the test's tmp_path (shared slot: that directory, written by the target only); for `pause`, the
test thread plays the harness's barrier keeper on `tmp_path/barriers` (the wrapper arrives, the
test releases).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpujail import options
from gpujail.backends import kernel
from gpujail.chaos import runner, scenario
from gpujail.fixtures import BIN, syscall_faults
from gpujail.fixtures.syscall_faults import SyscallFaultError, parse, to_strace
from gpujail.world import history
from gpujail.world.failpoints import Barrier

WRAPPER = Path(syscall_faults.WRAP) / "nvidia-container-cli"
needs_strace = pytest.mark.skipif(syscall_faults.unavailable() is not None,
                                  reason=f"{syscall_faults.unavailable()} (./run-tests installs it as root)")


def inject(spec: str) -> list[str]:
    """The --inject rules of `spec` (to_strace's trace filter left out)."""
    return [o for o in to_strace(parse(spec)) if o.startswith("--inject=")]


# -- the term translation -------------------------------------------------------------------------

@pytest.mark.parametrize("spec,rules", [
    # the three: the Nth mount fails with EIO, the Nth mkdir with EEXIST, a kill at the Nth umount2
    ("mount=20*off->1*return(EIO)", ["--inject=mount:error=EIO:when=21"]),
    ("mkdir=2*off->1*return(EEXIST)", ["--inject=mkdir:error=EEXIST:when=3"]),
    ("umount2=3*off->1*kill", ["--inject=umount2:signal=KILL:when=4"]),
    # gofail's counts: no M* is every later call, M* a window of M calls
    ("mount=20*off->return(EIO)", ["--inject=mount:error=EIO:when=21+"]),
    ("mount=return(EIO)", ["--inject=mount:error=EIO:when=1+"]),
    ("mount=5*off->3*return(EIO)", ["--inject=mount:error=EIO:when=6..8"]),
    ("mount=1*return(ENOSPC)", ["--inject=mount:error=ENOSPC:when=1"]),
    # combined actions in one rule: fail and hold at a barrier; a delay in microseconds
    ("mount=20*off->1*return(EIO)+pause(late)", ["--inject=mount:error=EIO:signal=STOP:when=21"]),
    ("mkdir=1*pause(race)", ["--inject=mkdir:signal=STOP:when=1"]),
    ("openat=sleep(5)", ["--inject=openat:delay_enter=5000:when=1+"]),
    # several calls: one rule each, all traced
    ("mkdir=1*return(EEXIST); umount2=kill", ["--inject=mkdir:error=EEXIST:when=1", "--inject=umount2:signal=KILL:when=1+"]),
])
def test_terms_translate_to_one_inject_rule_per_call(spec, rules):
    assert inject(spec) == rules
    assert to_strace(parse(spec))[:2] == ["-e", "trace=" + ",".join(parse(spec))]


@pytest.mark.parametrize("spec,words", [
    ("mount", "expected SYSCALL=TERM"),
    ("chmod=return(EIO)", "unknown system call 'chmod'"),
    ("mount=50%return(EIO)", "not by chance"),
    ("mount=2*off->1*return(EIO)->kill", "got 3 terms"),
    ("mount=2*sleep(1)->return(EIO)", "expected N*off before '->'"),
    ("mount=return(EWHAT)", "errno name"),
    ("mount=return(EIO)+kill", "kill cannot be combined"),
    ("mount=pause", "pause needs a barrier name"),
    ("mount=sleep(fast)", "sleep takes milliseconds"),
    ("mount=panic", "unknown action 'panic'"),
    ("mount=return(EIO);mount=kill", "has a fault already"),
    ("mount=70000*off->kill", "from 1 to 65535"),
])
def test_bad_terms_say_which_entry_and_what_was_expected(spec, words):
    with pytest.raises(SyscallFaultError) as e:
        parse(spec)
    assert words in str(e.value) and syscall_faults.ENV in str(e.value)


# -- the wrapper, on a real process under the real strace --------------------------------------------

def target(tmp_path: Path) -> Path:
    """A CLI stand-in making four real mkdir calls, reporting each failure, exiting 3."""
    prog = tmp_path / "stand-in"
    prog.write_text(f"#!{sys.executable} -S\nimport os, sys\n"
                    "for i in range(4):\n"
                    "    try:\n        os.mkdir(f'd{i}')\n"
                    "    except OSError as e:\n        print(f'mkdir {i}: {e.strerror}', file=sys.stderr)\n"
                    "print('done')\nsys.exit(3)\n")
    prog.chmod(0o755)
    return prog


def wrap(tmp_path: Path, spec: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    hist = tmp_path / "history.jsonl"
    env = {**os.environ, syscall_faults.TARGET_ENV: str(target(tmp_path)), syscall_faults.ENV: spec,
           history.ENV: str(hist), "GPUJAIL_BARRIERS": str(tmp_path / "barriers")}
    r = subprocess.run([str(WRAPPER), "configure"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    return r, [e for e in history.load(str(hist)) if e["kind"] == "cli.syscall_fault"]


@needs_strace
def test_wrapper_injects_the_error_and_passes_status_and_output_through(tmp_path):
    r, events = wrap(tmp_path, "mkdir=1*off->1*return(EEXIST)")
    assert (r.returncode, r.stdout, r.stderr) == (3, "done\n", "mkdir 1: File exists\n")
    assert [(e["syscall"], e["hit"], e["action"], e["arg"]) for e in events] == [("mkdir", 2, "return", "EEXIST")]
    assert not (tmp_path / "d1").exists() and (tmp_path / "d2").exists()   # the call itself never ran


@needs_strace
def test_wrapper_killed_at_the_nth_call_dies_of_sigkill_like_the_cli(tmp_path):
    r, events = wrap(tmp_path, "mkdir=2*off->1*kill")
    assert r.returncode == -signal.SIGKILL and r.stdout == ""
    assert [(e["hit"], e["action"]) for e in events] == [(3, "kill")]
    assert (tmp_path / "d1").exists() and not (tmp_path / "d3").exists()


@needs_strace
def test_wrapper_holds_a_paused_cli_until_its_barrier_opens(tmp_path):
    (tmp_path / "barriers").mkdir()
    barrier = Barrier("late", str(tmp_path / "barriers"))
    seen_before_release = []

    def keeper():
        barrier.wait_arrivals(1)
        seen_before_release.append(sorted(p.name for p in tmp_path.glob("d*")))
        barrier.release()

    t = threading.Thread(target=keeper)
    t.start()
    r, events = wrap(tmp_path, "mkdir=1*off->1*return(EIO)+pause(late)")
    t.join()
    # stopped after its 2nd mkdir failed, before it could make the 3rd
    assert seen_before_release == [["d0"]]
    assert r.returncode == 3 and r.stderr == "mkdir 1: Input/output error\n"
    assert [(e["hit"], e["action"], e["arg"]) for e in events] == [(2, "return", "EIO"), (2, "pause", "late")]


def test_wrapper_without_faults_just_runs_the_target(tmp_path):
    r, events = wrap(tmp_path, "")
    assert (r.returncode, r.stdout, events) == (3, "done\n", [])


def test_wrapper_refuses_a_bad_spec_in_one_line(tmp_path):
    r, _ = wrap(tmp_path, "mount=often")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "unknown action 'often'" in r.stderr
    assert not list(tmp_path.glob("d*"))   # the CLI never ran


# -- the worker's PATH and --cli real ------------------------------------------------------------------

def test_the_wrapper_is_first_on_path_only_when_asked(use_settings):
    use_settings(cli_target="")
    node = kernel.Node("w0", Path("/jail"), "gpu-worker", None, {})
    assert node.contract_env()["PATH"].split(os.pathsep)[0] == str(BIN)
    armed = node.contract_env(extra={syscall_faults.ENV: "mount=kill"})["PATH"].split(os.pathsep)
    assert armed[:2] == [syscall_faults.WRAP, str(BIN)]
    use_settings(cli_target="/usr/bin/nvidia-container-cli")   # --cli real
    env = node.contract_env()
    assert env["PATH"].startswith(syscall_faults.WRAP) and env[syscall_faults.TARGET_ENV] == "/usr/bin/nvidia-container-cli"


def test_cli_real_is_the_hosts_own_or_unavailable(tmp_path, monkeypatch):
    real = options.Value("cli", "real", "command line")
    monkeypatch.setenv("PATH", os.pathsep.join([str(BIN), syscall_faults.WRAP, "/nonexistent"]))
    with pytest.raises(options.CliUnavailable, match="--cli 'real': no nvidia-container-cli on this host's PATH"):
        options.real_cli(real)   # the suite's own fake and wrapper do not count
    host = tmp_path / "host-bin"
    host.mkdir()
    (host / "nvidia-container-cli").symlink_to(BIN / "nvidia-container-cli")   # the fake stands in for it
    monkeypatch.setenv("PATH", os.pathsep.join([str(BIN), str(host)]))
    assert options.real_cli(real) == str(host / "nvidia-container-cli")
    assert options.real_cli(options.Value("cli", "fake", "default")) == ""


@pytest.mark.kernel
def test_a_worker_with_cli_real_runs_the_hosts_cli(tmp_path, use_settings):
    """The implementation finds the chosen CLI first on PATH: here a stand-in "host CLI" that says
    who it is, then hands over to the fake (no NVIDIA software on this machine)."""
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    stand_in = tmp_path / "nvidia-container-cli"
    stand_in.write_text(f'#!/bin/sh\necho "host CLI at $0" >&2\nexec "{BIN / "nvidia-container-cli"}" "$@"\n')
    stand_in.chmod(0o755)
    use_settings(cli_target=str(stand_in))   # --cli real, this CLI found on the host's PATH
    from gpujail.fixtures.jail import make_jail
    with kernel.Fleet.recording(make_jail(tmp_path / "jail"), tmp_path / "run") as fleet:
        r = fleet.start("w0").run(["nvidia-container-cli", "--version"])
    assert r.code == 0 and "cli-version:" in r.stdout and f"host CLI at {stand_in}" in r.stderr


# -- scenarios: the syscall fault kind, and the seed bug through strace alone ---------------------------

def test_syscall_faults_in_a_scenario_are_not_failpoints():
    sc = scenario.load("strace-mount-eio")
    assert sc.syscall_schedule() == {"w5": "mount=20*off->1*return(EIO)+pause(late)"}
    assert sc.schedule(0) == {}   # the fake CLI's own failpoints stay off


def test_a_bad_syscall_term_in_a_scenario_names_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\ngpu_workers = 1\nfaults = [{ worker = "w0", failpoint = "syscall.mount", term = "9%kill" }]\n')
    with pytest.raises(scenario.ScenarioError, match=f"{bad}: worker w0: .*not by chance"):
        scenario.load(bad)


@needs_strace
@pytest.mark.kernel
@pytest.mark.parametrize("impl", ["legacy", "mutant:zero-byte-placeholders"])
def test_seed_bug_through_strace_alone(impl, tmp_path):
    """SPEC INV-1 broken by a neighbour whose CLI's mount strace fails, the fake's failpoints off:
    its cleanup unlinks the 0-byte placeholders the ready workers' mounts sit on."""
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    result = runner.run(scenario.load("strace-mount-eio"), impl, tmp_path / "run")
    events = history.load(str(result.history_path))
    assert not [e for e in events if e["kind"] == "failpoint"], "a fake CLI failpoint fired"
    injected = [(e["node"], e["syscall"], e["hit"], e["action"]) for e in events if e["kind"] == "cli.syscall_fault"]
    assert injected == [("w5", "mount", 21, "return"), ("w5", "mount", 21, "pause")]
    assert result.unfired() == []   # the armed syscall.mount counts as fired
    assert result.verdict.valid is False and result.verdict.invariant == "INV-1", result.report()
    assert "w5's CLI cleanup unlinked" in result.report()
    assert result.windows["failure-while-ready"][0], result.report()


@needs_strace
@pytest.mark.kernel
@pytest.mark.parametrize("spec,error,injected", [
    # a cold jail: the first missing parent's mkdir fails with EEXIST, as when another CLI won the race
    ("mkdir=1*return(EEXIST)", "mount error: file creation failed: ", [("mkdir", 1, "return", "EEXIST")]),
    # the 3rd mount (the 2nd file's bind) fails with EIO: the batch's cleanup runs
    ("mount=2*off->1*return(EIO)", "mount error: mount operation failed: ", [("mount", 3, "return", "EIO")]),
    # ... and the CLI is killed at the 1st umount2 of that cleanup: nothing more is undone
    ("mount=2*off->1*return(EIO);umount2=1*kill", None, [("mount", 3, "return", "EIO"), ("umount2", 1, "kill", None)]),
])
def test_the_fake_cli_in_a_node_fails_where_strace_says(spec, error, injected, tmp_path):
    """The issue's three faults on the fake CLI in a worker's namespace, its failpoints off: the CLI's
    own error line (CLI-4, CLI-5), or its death, and the events strace confirmed."""
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    from gpujail.fixtures.jail import make_jail
    jail = make_jail(tmp_path / "jail")
    with kernel.Fleet.recording(jail, tmp_path / "run") as fleet:
        node = fleet.start("w0")
        argv = ["nvidia-container-cli", "configure", "--compute", "--utility", "--device=all",
                "--ldconfig=/usr/bin/true", str(jail)]
        r = node.run(argv, env=node.contract_env(extra={syscall_faults.ENV: spec}))
        events = fleet.history()
    if error:
        assert r.code == 1 and r.error_line.startswith(f"nvidia-container-cli: {error}"), r.stderr
    else:
        assert r.code == -signal.SIGKILL, r   # the wrapper dies as the CLI did: no error line, no exit 1
        assert not [e for e in events if e["kind"] == "cli.exit"]
    assert not [e for e in events if e["kind"] == "failpoint"]
    assert [(e["syscall"], e["hit"], e["action"], e["arg"]) for e in events if e["kind"] == "cli.syscall_fault"] == injected
