"""Bounded time whatever the script does (issue 15): every start has a deadline, nothing a start
runs outlives it, and its output is kept only up to a cap.

Each test runs a small hostile script of the kind vendors really write as the implementation, in a
real kernel-backend node, and checks the harness ends it, says why in one line, and leaves no
process behind.
"""
from __future__ import annotations

import os
import time

import pytest

from gpujail.backends.node_starts import OUTPUT_CAP
from gpujail.contract import RestartPolicy, start_worker

pytestmark = [pytest.mark.kernel, pytest.mark.unprivileged]


def processes_with(word: str) -> list[int]:
    """Host pids whose command line holds `word` (a unique sleep length marks a test's daemon)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if word.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_daemon_holding_stdout_does_not_hang_the_start(fleet, jail):
    """A script that leaves a `setsid` daemon holding its stdout, then exits 0: the start ends when
    the script does (not at the deadline, not never), and the daemon is killed with it."""
    node = fleet.start("w")
    t0 = time.monotonic()
    r = node.run(["sh", "-c", "setsid sleep 997.25 & echo started; exit 0"], timeout=60)
    took = time.monotonic() - t0
    assert (r.code, r.stdout) == (0, "started\n"), f"the script's own exit and output, got {r}"
    assert took < 30, f"the start waited {took:.1f} s for a daemon holding its stdout (deadline 60 s)"
    assert processes_with("997.25") == [], "the daemon the start left outlived it"


def test_hanging_start_is_killed_at_its_deadline_and_not_restarted(fleet, jail):
    """A script that never ends: killed at the deadline with everything it started, the reason says
    where in one line, and the worker is not restarted (a restart would only wait again)."""
    t0 = time.monotonic()
    w = start_worker(fleet, "w1", "sh -c 'setsid sleep 996.5 & sleep 995.5'", timeout=1,
                     policy=RestartPolicy(max_restarts=3, backoff=0.01))
    took = time.monotonic() - t0
    assert not w.ready and [a.code for a in w.attempts] == ["timeout"], [a.code for a in w.attempts]
    assert w.attempts[0].error_line == "gpujail: timeout after 1 s in start 1 of worker w1"
    assert took < 20, f"one deadline of 1 s took {took:.1f} s"
    assert processes_with("996.5") == processes_with("995.5") == [], "a process of the start outlived it"


def test_output_is_kept_up_to_a_cap(fleet, jail):
    """A script printing 20 MB: the harness keeps the tail (OUTPUT_CAP bytes) and says how much it
    dropped, instead of holding it all in memory."""
    node = fleet.start("w")
    r = node.run(["sh", "-c", "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo last line"], timeout=60)
    assert r.code == 0
    dropped = 20_000_000 + len("\nlast line\n") - OUTPUT_CAP
    assert r.stdout.startswith(f"[gpujail: {dropped} earlier bytes of this output dropped]\n")
    assert r.stdout.endswith("x\nlast line\n") and len(r.stdout) < OUTPUT_CAP + 100
