"""System calls as scheduling points (issue 29; fixtures/bin/gpujail-syscall-points, docs/scheduler.md).

How this works
--------------
The wrapper runs a command under a real seccomp user-notification filter and, for each watched call
on the jail, arrives at the scheduler named by GPUJAIL_SCHEDULER. Here that scheduler is a small
one in the test (`Recorder`): it records each arrival (one JSON line, schedule.arrive's protocol)
and lets it go, or holds the ones a test names. Checked:

* the arrivals of `mkdir; : >; mv; rm` come in order, with their names and absolute paths, and
  only for paths under GPUJAIL_JAIL;
* a process killed while held leaves the schedule (its connection closes) and the wrapper does
  not hang; the exit status (code or signal) is the command's;
* no scheduler variable: no filter at all; a scheduler that is not there: every call goes at once;
* `--schedule random-walk:syscalls` end to end: a legacy cold race records `syscall.*` steps.
"""
from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpujail.backends import kernel
from gpujail.world import history, schedule
from gpujail.world.schedule import ScheduleError, parse

REPO = Path(__file__).resolve().parents[1]
WRAPPER = REPO / "fixtures" / "bin" / "gpujail-syscall-points"

pytestmark = [pytest.mark.skipif(sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"),
                                 reason="seccomp user notification: Linux on x86_64 or aarch64"),
              pytest.mark.unprivileged]   # seccomp notification needs no privilege: ./run-tests runs these as uid 65534 too


class Recorder:
    """A scheduler that lets every arrival go at once, except those whose path ends in `hold`:
    it keeps their connection open and notes whether it then closes (EOF) or gets data."""

    def __init__(self, directory: Path, hold: str = "\0"):
        self.address, self.hold = str(directory / "sched.sock"), hold
        self.arrivals: list[dict] = []
        self.held: list[socket.socket] = []
        self.closed = threading.Event()   # a held connection reached EOF: its process left
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        schedule.at_path(self.sock.bind, self.address)   # a deep tmp_path (run-tests' unprivileged scratch) included
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            msg = json.loads(conn.makefile().readline())
            self.arrivals.append(msg)
            if msg["path"].endswith(self.hold):
                self.held.append(conn)
                threading.Thread(target=self._watch, args=(conn,), daemon=True).start()
            else:
                conn.send(b"g")
                conn.close()

    def _watch(self, conn: socket.socket) -> None:
        try:
            if conn.recv(1) == b"":
                self.closed.set()
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def recorder(tmp_path):
    r = Recorder(tmp_path)
    yield r
    r.close()


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (schedule.ENV, "GPUJAIL_JAIL", "GPUJAIL_NODE")}
    return {**env, "GPUJAIL_NODE": "w0", **extra}


def _run(argv, cwd, env, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-S", str(WRAPPER), *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_arrivals_in_order_with_names_and_paths(tmp_path, recorder):
    jail, outside = tmp_path / "jail", tmp_path / "outside"
    jail.mkdir()
    outside.mkdir()
    r = _run(["sh", "-c", f"mkdir d; : > d/f; mv d/f d/g; rm d/g; : > {outside}/x; mkdir {outside}/y"], jail,
             _env(**{schedule.ENV: recorder.address, "GPUJAIL_JAIL": str(jail)}))
    assert r.returncode == 0, r.stderr
    got = [(a["name"], a["path"], a["hit"], a["node"]) for a in recorder.arrivals]
    names = [g[0] for g in got]
    assert len(got) == 4, got   # the two calls outside the jail are not points
    assert names[0] in ("syscall.mkdir", "syscall.mkdirat"), got
    assert names[1] in ("syscall.open", "syscall.openat", "syscall.creat", "syscall.openat2"), got
    assert names[2] in ("syscall.rename", "syscall.renameat", "syscall.renameat2"), got
    assert names[3] in ("syscall.unlink", "syscall.unlinkat"), got
    assert [g[1] for g in got] == [f"{jail}/d", f"{jail}/d/f", f"{jail}/d/g", f"{jail}/d/g"], got
    assert {g[2] for g in got} == {1} and {g[3] for g in got} == {"w0"}   # each its process's first; the node
    assert not (jail / "d" / "g").exists() and (outside / "y").is_dir()   # the calls really ran, once


def test_a_process_killed_while_held_leaves_and_the_wrapper_ends(tmp_path):
    """The held mkdir's process is SIGKILLed: the wrapper closes its connection (the scheduler counts
    it as left) and exits as its command did, at once, without an answer from the scheduler."""
    recorder = Recorder(tmp_path, hold="held")
    try:
        env = _env(**{schedule.ENV: recorder.address})
        p = subprocess.Popen([sys.executable, "-S", str(WRAPPER), "sh", "-c", "echo $$ > pid; exec mkdir held"],
                             cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not recorder.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recorder.held, (recorder.arrivals, p.poll())
        time.sleep(0.2)
        assert p.poll() is None and not (tmp_path / "held").exists()   # held: the mkdir has not run
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        started = time.monotonic()
        assert p.wait(timeout=10) == -signal.SIGKILL, p.stderr.read()
        assert time.monotonic() - started < 5
        assert recorder.closed.wait(5)
        assert not (tmp_path / "held").exists()
    finally:
        recorder.close()


def test_sigterm_to_the_wrapper_lets_the_held_call_go(tmp_path):
    """A signal to the wrapper is passed on, and nothing is held from then on: the start ends."""
    recorder = Recorder(tmp_path, hold="held")
    try:
        p = subprocess.Popen([sys.executable, "-S", str(WRAPPER), "sh", "-c", "trap 'exit 9' TERM; mkdir held; wait"],
                             cwd=tmp_path, env=_env(**{schedule.ENV: recorder.address}))
        deadline = time.monotonic() + 20
        while not recorder.held and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recorder.held
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) in (9, -signal.SIGTERM)
        assert (tmp_path / "held").is_dir()   # let go, then really run
    finally:
        recorder.close()


@pytest.mark.parametrize("script,code", [("exit 7", 7), ("kill -TERM $$", -signal.SIGTERM), ("exit 0", 0)])
def test_the_exit_status_is_the_commands(tmp_path, recorder, script, code):
    assert _run(["sh", "-c", script], tmp_path, _env(**{schedule.ENV: recorder.address})).returncode == code


def test_not_found_is_127(tmp_path, recorder):
    r = _run(["no-such-command-here"], tmp_path, _env(**{schedule.ENV: recorder.address}))
    assert r.returncode == 127 and "no-such-command-here" in r.stderr


def test_without_a_scheduler_it_just_runs_the_command(tmp_path, recorder):
    status = "grep Seccomp: /proc/self/status; mkdir d"
    bare = _run(["sh", "-c", status], tmp_path, _env())
    assert bare.returncode == 0 and bare.stdout.split() == ["Seccomp:", "0"], bare   # no filter at all
    assert (tmp_path / "d").is_dir()
    (tmp_path / "d").rmdir()
    filtered = _run(["sh", "-c", status], tmp_path, _env(**{schedule.ENV: recorder.address}))
    assert filtered.stdout.split() == ["Seccomp:", "2"], filtered
    # a scheduler that is not there (the run ended): every call goes at once
    gone = _run(["sh", "-c", "mkdir a; : > a/b; rm a/b; rmdir a; mkdir e"], tmp_path,
                _env(**{schedule.ENV: str(tmp_path / "gone.sock")}), timeout=20)
    assert gone.returncode == 0 and (tmp_path / "e").is_dir(), gone.stderr


def test_the_syscalls_option():
    assert str(parse("pct:syscalls")) == "pct:d=3,syscalls"
    assert str(parse("pct:d=2,syscalls,k=9")) == "pct:d=2,k=9,syscalls"
    assert str(parse("random-walk:syscalls")) == "random-walk:syscalls"
    assert not parse("pct").syscalls and not parse("random-walk").syscalls
    with pytest.raises(ScheduleError, match="needs random-walk, pct or mixed"):
        parse("free:syscalls")
    with pytest.raises(ScheduleError, match="takes no parameters but syscalls"):
        parse("random-walk:d=2,syscalls")


@pytest.mark.kernel
def test_a_scheduled_cold_race_with_syscall_points(tmp_path):
    """End to end: `reproduce ... --schedule random-walk:syscalls` wraps each start; the steps of the
    history include the legacy CLI's system calls on the jail, with jail-relative paths."""
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJAIL_")} | {"TMPDIR": str(tmp_path)}
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "gpujail", "reproduce", "cold-race-random", "--impl", "legacy",
                        "--workers", "2", "--seed", "2", "--schedule", "random-walk:syscalls", "--out", str(out)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stdout + r.stderr   # a verdict either way
    steps = [e for e in history.load(str(out / "history.jsonl")) if e["kind"] == "sched.step"]
    names = {e["failpoint"] for e in steps}
    assert {"syscall.mount", "syscall.umount2", "syscall.execve"} <= names, names
    assert names & {"syscall.openat", "syscall.open", "syscall.creat"}, names
    assert names & {"cli.before_mount"}, names   # the failpoints are points still
    mounts = [e for e in steps if e["failpoint"] == "syscall.mount"]
    assert mounts and all(not e["path"].startswith("/") for e in mounts), mounts[:3]   # relative to the jail
    assert {e["worker"] for e in steps} == {"w0", "w1"}
    recorded = json.loads((out / "schedule.json").read_text())
    assert recorded["strategy"] == "random-walk:syscalls" and recorded["forced"] == 0
