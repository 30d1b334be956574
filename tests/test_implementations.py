"""The bundled implementations under the contract, on the kernel backend (issue 3).

Every test brings workers up through `gpujail.contract.start_worker` (a fresh node per start, the
contract environment, cwd = the jail) and judges them from outside: exit codes, the one-line error,
the jail's files, and what a GPU job in each worker sees through the jail (`Node.probe`).
"""
from __future__ import annotations

import fcntl
import os
import stat
import threading

import pytest

from fixtures import jail as jail_image
from gpujail.contract import RestartPolicy, UnknownImplementation, command_for, start_worker
from gpujail.failpoints import Barrier
from gpujail.probes import gpu_files, problems
from reference_impl import core

FIXED = ["reference", "direct", "example-shell"]
ALL = FIXED + ["legacy"]
pytestmark = [pytest.mark.kernel, pytest.mark.unprivileged]


def start_all(fleet, impl, n, prefix="w", **kw):
    """Start n workers at once (threads: the nodes are separate processes) and return them."""
    workers = {}

    def go(i):
        workers[i] = start_worker(fleet, f"{prefix}{i}", impl, **kw)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [workers[i] for i in range(n)]


def lost(worker, jail):
    return problems(worker.node.probe(gpu_files(jail)))


def events(fleet, kind, **match):
    return [e for e in fleet.history() if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


@pytest.mark.parametrize("impl", FIXED)
@pytest.mark.parametrize("n", [1, 4, 16])
def test_bring_up_cold_then_warm(fleet, jail, impl, n):
    """REF-1..REF-10: n workers start at once on a cold jail, all become ready, and a GPU job in each
    sees every driver file through the jail (same bytes as the host, loads with the real loader).
    A later worker on the now warm jail is ready too and takes no lock (REF-4)."""
    workers = start_all(fleet, impl, n)
    for w in workers:
        assert w.ready, f"{w.node_id}: {w.attempts[-1].error_line}"
        assert lost(w, jail) == []
    locks_before = len(events(fleet, "impl.lock.wait"))
    warm = start_worker(fleet, "warm", impl)
    assert warm.ready, warm.attempts[-1].error_line
    assert lost(warm, jail) == []
    assert len(events(fleet, "impl.lock.wait")) == locks_before or impl == "example-shell"
    assert (jail / core.FLAG).exists()


def test_legacy_solo_bring_up_works(fleet, jail):
    """`legacy` alone on a cold jail works (its CLI creates 0-byte placeholders): the bug needs a
    neighbour, which is what the next test adds."""
    w = start_worker(fleet, "solo", "legacy")
    assert w.ready, w.attempts[-1].error_line
    assert lost(w, jail) == []
    assert os.path.getsize(jail / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15") == 0


FAILURE = {  # a failure late in worker B's mount phase, after it mounted 10 files
    "reference": "cli.before_mount=10*off->return(EIO)",
    "legacy": "cli.before_mount=10*off->return(EIO)",
    "example-shell": "cli.before_mount=10*off->return(EIO)",
    "direct": "ref.before_mount=10*off->return(EIO)",
}


@pytest.mark.parametrize("impl", ALL)
def test_failing_neighbour(fleet, jail, impl):
    """Seed 000, second half (SPEC CLI-6, K-1): worker A is ready; worker B's start fails after
    mounting 10 files. With `legacy`, B's CLI cleanup unlinks the 0-byte placeholders under A's
    mounts and A loses them; with the fixed implementations A keeps every file."""
    a = start_worker(fleet, "A", impl)
    assert a.ready and lost(a, jail) == []
    b = start_worker(fleet, "B", impl, env={"GPUJAIL_FAILPOINTS": FAILURE[impl]})
    assert not b.ready
    assert b.attempts[-1].code == core.EXIT["cli-failed"], b.attempts[-1].stderr
    assert events(fleet, "failpoint", action="return"), "the injected failure never fired"
    damage = lost(a, jail)
    if impl == "legacy":
        assert damage, "legacy's failing CLI should have cost A its mounts"
        assert any("cannot open shared object file" in d for d in damage), damage
        assert events(fleet, "cli.cleanup.unlink")
    else:
        assert damage == []
        assert not events(fleet, "cli.cleanup.unlink")


# -- bad input: one line, a distinct exit code, the jail unchanged but for whole placeholders ----

def stub_cli(tmp_path, list_output: str) -> dict:
    """An environment whose `nvidia-container-cli list` prints `list_output` (configure is real)."""
    d = tmp_path / "stub"
    d.mkdir(exist_ok=True)
    real = os.path.abspath("fixtures/bin/nvidia-container-cli")
    (d / "list.txt").write_text(list_output)
    script = d / "nvidia-container-cli"
    script.write_text(f'#!/bin/sh\nfor a; do [ "$a" = list ] && exec cat "{d}/list.txt"; done\nexec "{real}" "$@"\n')
    script.chmod(0o755)
    return {"PATH": f"{d}:{os.environ['PATH']}"}


def assert_one_line_failure(worker, code, *fragments):
    r = worker.attempts[-1]
    assert r.code == code, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    for f in fragments:
        assert f in lines[0]


def assert_only_whole_placeholders(before, jail):
    """Compared with `before`, the jail gained only complete markers (and lock files)."""
    after = jail_image.snapshot(jail)
    for rel, (mode, size, link) in after.items():
        if rel in before:
            assert before[rel] == after[rel], rel
        elif stat.S_ISREG(mode):
            assert size in (len(core.MARKER), 0) and (size or rel.endswith(".lock")), (rel, size)
    assert set(before) <= set(after)


@pytest.mark.parametrize("impl", FIXED)
def test_failing_list(fleet, jail, impl):
    """REF-1: a failing `list` is fatal, with its error line, before anything is written."""
    before = jail_image.snapshot(jail)
    w = start_worker(fleet, "w", impl, env={"GPUJAIL_FAILPOINTS": "cli.before_list=return(EIO)"})
    assert_one_line_failure(w, core.EXIT["bad-input"], "list")
    assert jail_image.snapshot(jail) == before


@pytest.mark.parametrize("impl", FIXED)
@pytest.mark.parametrize("listing,fragment", [
    ("", "no files"),
    ("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n", "not an absolute path"),
    ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.999.1.1\n", "libnvidia-ml.so.999.1.1"),
])
def test_bad_list_output(fleet, jail, tmp_path, impl, listing, fragment):
    """REF-1: an empty list, a relative path, a listed host file that does not exist: one line,
    exit 2, nothing but whole markers in the jail."""
    before = jail_image.snapshot(jail)
    w = start_worker(fleet, "w", impl, env=stub_cli(tmp_path, listing))
    assert_one_line_failure(w, core.EXIT["bad-input"])
    assert fragment in w.attempts[-1].stderr
    assert_only_whole_placeholders(before, jail)


@pytest.mark.parametrize("impl", FIXED)
def test_duplicate_list_entries(fleet, jail, tmp_path, impl):
    """REF-1: duplicates in `list` are harmless: one marker each, worker ready."""
    from fixtures.drivers import catalogue
    paths = [f.path for f in catalogue() if f.kind in ("library", "firmware")]
    w = start_worker(fleet, "w", impl, env=stub_cli(tmp_path, "\n".join(paths + paths) + "\n"))
    assert w.ready, w.attempts[-1].stderr
    assert len([e for e in fleet.history() if e["kind"] == "impl.marker"]) in (0, len(paths))


@pytest.mark.parametrize("impl", FIXED)
def test_jail_path_with_spaces(tmp_path, impl, run_dir):
    """Contract: the jail path may contain spaces; every word stays one argument."""
    from gpujail import history, kernel
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    jail = jail_image.make_jail(tmp_path / "my jail")
    env = {"GPUJAIL_HISTORY": str(run_dir / "h.jsonl"), "GPUJAIL_BARRIERS": str(run_dir / "barriers")}
    with kernel.Fleet(jail, env) as fleet:
        fleet.history = lambda: history.load(env["GPUJAIL_HISTORY"])
        w = start_worker(fleet, "w", impl)
        assert w.ready, w.attempts[-1].stderr
        assert lost(w, jail) == []


@pytest.mark.parametrize("impl", FIXED)
def test_read_only_jail(fleet, jail, impl):
    """A read-only jail: a cold start fails with one line naming the path (no retry inside); a warm
    start (everything present) works, since nothing needs writing."""
    w = start_worker(fleet, "ro", impl, node_options={"jail_readonly": True})
    assert w.attempts[-1].code in (core.EXIT["jail-write-failed"], core.EXIT["unsafe-jail"]), w.attempts[-1].stderr
    assert len([ln for ln in w.attempts[-1].stderr.splitlines() if ln.strip()]) == 1
    assert start_worker(fleet, "rw", impl).ready
    warm = start_worker(fleet, "ro-warm", impl, node_options={"jail_readonly": True})
    assert warm.ready, warm.attempts[-1].stderr


@pytest.mark.parametrize("impl", FIXED)
def test_full_jail(fleet, jail, impl):
    """ENOSPC (a small tmpfs jail, this node only): one line, a distinct exit code, and no
    truncated placeholder left (an empty one is what a failing CLI deletes from under mounts)."""
    node = fleet.start("full", jail_tmpfs="80k")
    r = node.run(command_for(impl, str(jail), "full", "gpu-worker"))
    assert r.code == core.EXIT["jail-write-failed"], r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr
    sizes = node.run(["find", str(jail / "usr"), "-type", "f", "-name", "lib*.so.*", "-printf", "%s %p\\n"]).stdout
    partial = [ln for ln in sizes.splitlines() if int(ln.split()[0]) < len(core.MARKER)]
    assert partial == []


@pytest.mark.parametrize("impl", FIXED)
def test_lock_never_frees(fleet, jail, impl):
    """REF-5: the lock wait is bounded; a lock that never frees is fatal (exit 3), with one line
    naming the lock, and nothing written."""
    before = jail_image.snapshot(jail)
    lock = jail / core.LOCK
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        w = start_worker(fleet, "w", impl, env={"GPUJAIL_LOCK_TIMEOUT": "0.3"})
    assert_one_line_failure(w, core.EXIT["lock-timeout"], core.LOCK)
    after = jail_image.snapshot(jail)
    assert {k: v for k, v in after.items() if k != core.LOCK} == {k: v for k, v in before.items() if k != core.LOCK}


# -- REF-11: hostile jails --------------------------------------------------------------------

@pytest.mark.parametrize("impl", FIXED)
@pytest.mark.parametrize("link", ["absolute-outside", "dotdot", "etc"])
def test_hostile_symlink_parent(fleet, jail, tmp_path, impl, link):
    """REF-11: the jail's firmware directory is a symlink pointing out of the jail (absolute, via
    `..`, or at /etc). Nothing may be written outside the jail: either the implementation resolves
    the link inside the jail (as a chroot would) or it refuses with one line."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = {"absolute-outside": str(outside), "dotdot": "../../../../outside", "etc": "/etc"}[link]
    (jail / "usr/lib/firmware").mkdir(parents=True)
    os.symlink(target, jail / "usr/lib/firmware/nvidia")
    host_etc = sorted(os.listdir("/etc"))
    w = start_worker(fleet, "w", impl)
    assert os.listdir(outside) == []
    assert sorted(os.listdir("/etc")) == host_etc
    if not w.ready:
        assert w.attempts[-1].code in (core.EXIT["unsafe-jail"], core.EXIT["cli-failed"]), w.attempts[-1].stderr


@pytest.mark.parametrize("impl", ["reference", "direct"])
def test_symlink_swapped_in_during_run(fleet, jail, tmp_path, impl):
    """REF-11: while the lock holder creates markers, the directory it is about to write into is
    replaced by a symlink out of the jail. The next marker still lands inside the jail."""
    outside = tmp_path / "outside"
    outside.mkdir()
    env = {"GPUJAIL_FAILPOINTS": "ref.before_marker=5*off->1*pause(swap)"}
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("w", start_worker(fleet, "w", impl, env=env)))
    t.start()
    barrier = Barrier("swap", fleet.env["GPUJAIL_BARRIERS"])
    barrier.wait_arrivals(1)
    libdir = jail / "usr/lib/x86_64-linux-gnu"
    os.rename(libdir, jail / "usr/lib/moved-away")
    os.symlink(str(outside), libdir)
    barrier.release()
    t.join()
    assert os.listdir(outside) == []


# -- REF-9: populate-jail cleanup and CPU/login dummy mounts ----------------------------------

def reused_jail(jail):
    """A jail left by an earlier cluster: markers, old 0-byte placeholders, the flag, and the
    image's own small files."""
    lib = jail / "usr/lib/x86_64-linux-gnu"
    (lib / "libcuda.so.550.54.15").write_bytes(core.MARKER)
    (lib / "libnvidia-ml.so.550.54.15").write_bytes(b"")
    (lib / "libempty-but-not-ours.a").write_bytes(b"")
    (jail / core.FLAG).touch()


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


@pytest.mark.parametrize("role", ["cpu-worker", "login"])
def test_dummy_mounts(fleet, jail, role):
    """REF-9: once the GPU flag exists, CPU workers and login nodes bind a loadable dummy library
    over each placeholder (in their own namespace only); before it, they mount nothing."""
    early = start_worker(fleet, "early", "reference", role=role)
    assert early.ready and early.node.mounts(str(jail / "usr")) == []
    gpu = start_worker(fleet, "gpu", "reference")
    assert gpu.ready
    cpu = start_worker(fleet, "cpu", "reference", role=role)
    assert cpu.ready, cpu.attempts[-1].stderr
    lib = jail / "usr/lib/x86_64-linux-gnu"
    results = cpu.node.probe([{"path": str(lib / "libnvidia-ml.so.550.54.15"), "load": True},
                              {"path": str(lib / "libncurses.so"), "load": False}])
    assert results[0]["attached"] and results[0]["loader"] == "ok"
    assert not results[1]["attached"], "the ncurses linker script is not a placeholder"
    assert lost(gpu, jail) == [], "the CPU worker's mounts must not touch the GPU worker"


# -- the contract runner ----------------------------------------------------------------------

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
    counter = tmp_path / "attempts"
    cmd = f"sh -c 'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; [ $n -ge 2 ]'"
    w = start_worker(fleet, "flaky", cmd, policy=RestartPolicy(max_restarts=3, backoff=0.01))
    assert w.ready and [a.code for a in w.attempts] == [1, 1, 0]
    assert len(events(fleet, "worker.restart")) == 2
    assert len(events(fleet, "node.up")) == 3
