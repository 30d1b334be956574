"""The contract runner and the reference implementation's own pieces (issue 3).

The black-box checks of every implementation live in conformance/ and run once per bundled
implementation (./run-tests); these are the parts that are not black-box: the command-string
contract, the restart policy, and the populate-jail cleanup of a reused jail (REF-9), which is not
part of the worker contract.
"""
from __future__ import annotations

import os

import pytest

from gpujail.chaos.nemesis import dress_as_reused
from gpujail.contract import RestartPolicy, UnknownImplementation, command_for, start_worker
from gpujail.reference_impl import core
from gpujail.spec import LOCK
from gpujail.world import history

pytestmark = [pytest.mark.kernel, pytest.mark.unprivileged]


def events(fleet, kind, **match):
    return history.select(fleet.history(), kind, **match)


def reused_jail(jail):
    """A jail left by an earlier cluster (markers, old 0-byte placeholders, the flag), plus an
    empty file of the image's own that no placeholder predicate should take."""
    dress_as_reused(jail)
    (jail / "usr/lib/x86_64-linux-gnu/libempty-but-not-ours.a").write_bytes(b"")


@pytest.mark.parametrize("impl,removed,kept", [
    ("reference", ["libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"],
     ["libncurses.so", "libpthread.a", "libgpujail-example.so.1.2.3", "libgpujail-example.so.1", "libempty-but-not-ours.a"]),
    ("legacy", ["libnvidia-ml.so.550.54.15", "libempty-but-not-ours.a"], ["libcuda.so.550.54.15", "libncurses.so"]),
])
def test_populate_cleanup(fleet, jail, impl, removed, kept):
    """REF-9: the populate-jail cleanup removes placeholders (lib*.so.* < 64 bytes: old 0-byte and
    new markers) and the flag, and leaves the ncurses linker script, stub archives and real
    libraries alone. `legacy`'s "empty file" predicate misses markers and eats other empty files."""
    reused_jail(jail)
    node = fleet.start("populate", role="cpu-worker", version=None)
    r = node.run(command_for(impl, str(jail), "populate", "cpu-worker") + ["populate-cleanup"])
    assert r.code == 0, r.stderr
    lib = jail / "usr/lib/x86_64-linux-gnu"
    for name in removed:
        assert not os.path.lexists(lib / name), name
    for name in kept:
        assert os.path.lexists(lib / name), name
    assert not (jail / core.FLAG).exists() or impl == "legacy"


def test_command_strings_and_placeholders(jail):
    """SPEC 5: {jail} {node} {role} are substituted per word; bundled names resolve; a missing
    command is refused with its path."""
    argv = command_for("bash vendor.sh -j {jail} --node={node} {role}", "/my jail", "n1", "login")
    assert argv == ["bash", "vendor.sh", "-j", "/my jail", "--node=n1", "login"]
    assert command_for("reference", "/j", "n", "r")[-1] == "reference"
    with pytest.raises(UnknownImplementation, match="/no/such/script"):
        command_for("/no/such/script {jail}", "/j", "n", "r")


def test_restart_policy(fleet, jail, tmp_path):
    """An implementation that fails twice then succeeds is restarted in a fresh node each time
    (new mount namespace), with backoff, and reported ready on the third attempt."""
    counter = jail / "tmp/attempts"   # in the jail: a write outside it is never done (cow.py)
    cmd = f"sh -c 'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; [ $n -ge 2 ]'"
    w = start_worker(fleet, "flaky", cmd, policy=RestartPolicy(max_restarts=3, backoff=0.01))
    assert w.ready and [a.code for a in w.attempts] == [1, 1, 0]
    assert len(events(fleet, "worker.restart")) == 2
    assert len(events(fleet, "node.up")) == 3


@pytest.mark.parametrize("impl", ["reference", "direct", "example-shell"])
@pytest.mark.parametrize("timeout", ["inf", "nan", "-1", "soon"])
def test_lock_timeout_that_is_no_bound_is_bad_input(fleet, jail, impl, timeout):
    """GPUJAIL_LOCK_TIMEOUT bounds the bundled implementations' lock waits: a value that bounds
    nothing (inf, nan, negative, not a number) is bad input, one line naming the variable and exit 2,
    before anything is written; also with the lock held by someone else (no traceback, no hang)."""
    import fcntl
    (jail / LOCK).touch()
    with open(jail / LOCK) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        node = fleet.start("w")
        r = node.run(command_for(impl, str(jail), "w", "gpu-worker"),
                     env=node.contract_env(extra={"GPUJAIL_LOCK_TIMEOUT": timeout}), timeout=30)
    lines = r.stderr.strip().splitlines()
    assert (r.code, len(lines)) == (2, 1) and "GPUJAIL_LOCK_TIMEOUT" in lines[0], (r.code, r.stderr)


@pytest.mark.parametrize("impl", ["reference", "example-shell"])
def test_each_failpoint_counts_its_own_hits(fleet, jail, impl):
    """A chain counts the hits of its own failpoint only (CONTRACT.md: gpujail-failpoint's HIT), in
    the shell template as in the reference: with ref.before_configure armed too, `1*print` on
    ref.before_verify fires on verify's first hit, not on a hit numbered after configure's."""
    node = fleet.start("w")
    armed = "ref.before_configure=1*off;ref.before_verify=1*print"
    r = node.run(command_for(impl, str(jail), "w", "gpu-worker"),
                 env=node.contract_env(extra={"GPUJAIL_FAILPOINTS": armed}), timeout=60)
    assert r.code == 0, r.stderr
    hits = [(e["name"], e["hit"], e["action"]) for e in events(fleet, "failpoint")]
    assert hits == [("ref.before_configure", 1, "off"), ("ref.before_verify", 1, "print")], hits
