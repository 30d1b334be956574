"""The jail's file systems (gpujail/backends/jailfs.py, SPEC section 8, K-1/K-2/K-4), on real parts:
a real glusterd, volume and FUSE clients, real bindfs views, nodes in their own mount namespaces.

Choreography of the two-node tests: node `a` and node `b` are kernel-backend nodes, each seeing the
jail through its own client (`gluster`, `nodelocal-locks`) or the same directory (`local`). Shared
slots: the jail (both nodes and the harness, which writes and unlinks through its own client), and
for the lock test `jail/lock` (flocked by `a`, tried by `b`) and `jail/a.holds` (made by `a` once it
holds the lock, waited for by `b`).

Every test checks at the end that nothing of the file system outlived it (no host mount under the
run, no GlusterFS or bindfs process). Without root, FUSE or the
packages, the tests skip with the reason `jailfs.unavailable` gives.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpujail.backends import gluster, jailfs, kernel
from gpujail.backends.fs_processes import CLIENT_GONE
from gpujail.spec import EXIT

KINDS = jailfs.KINDS


def needs(kind: str):
    reason = jailfs.unavailable(kind, install=False)
    return pytest.mark.skipif(reason is not None, reason=str(reason))


def marks(kind: str) -> list:
    """A `kind` parameter's marks: `needs`, and `gluster` for GlusterFS (`pytest -m gluster tests`
    selects every self-test that starts a glusterd)."""
    return [needs(kind), *([pytest.mark.gluster] if kind == "gluster" else [])]


PARAMS = [pytest.param(k, marks=marks(k)) for k in KINDS]


def jail_dir(tmp_path: Path) -> Path:
    jail = tmp_path / "jail"
    for d in ("dev", "run", "usr/lib"):
        (jail / d).mkdir(parents=True)
    (jail / "usr/lib/hello").write_text("seeded before the file system came up\n")
    return jail


def host_mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [ln.split()[4] for ln in f if ln.split()[4].startswith(str(path))]


def two_nodes(fs, tmp_path):
    fleet = kernel.Fleet.recording(fs.jail, tmp_path / "run")
    fleet.jailfs = fs
    return fleet


def attached(node, path: Path) -> bool:
    return any(m["mountpoint"] == str(path) for m in node.mounts())


@pytest.mark.parametrize("kind", PARAMS)
def test_every_node_sees_the_image_and_nothing_is_left(kind, tmp_path):
    """The image in the jail before the file system came up is what every node sees, through its own
    client; a write by one node is read by the other; after the context nothing is left."""
    jail = jail_dir(tmp_path)
    with jailfs.provide(kind, tmp_path, jail) as fs, two_nodes(fs, tmp_path) as fleet:
        a = fleet.start("a", role="cpu-worker", version=None)
        b = fleet.start("b", role="cpu-worker", version=None)
        assert a.run(["cat", "usr/lib/hello"]).stdout == "seeded before the file system came up\n"
        assert a.run(["sh", "-c", "echo from-a > usr/lib/note"]).code == 0
        assert b.run(["cat", "usr/lib/note"]).stdout == "from-a\n"
        assert (fs.jail / "usr/lib/note").read_text() == "from-a\n"   # the harness's view
        on_top = [m["fstype"] for m in a.mounts(str(fs.jail)) if m["mountpoint"] == str(fs.jail)][-1]
        assert on_top == {"local": on_top if "fuse" not in on_top else "not FUSE", "gluster": "fuse.glusterfs",
                          "nodelocal-locks": "fuse"}[kind]
    assert fs.leftovers() == []
    assert host_mounts_under(tmp_path) == []


@pytest.mark.parametrize("kind", PARAMS)
def test_remote_unlink_detaches_at_once_or_at_the_next_lookup(kind, tmp_path):
    """K-1 and K-2: a file bind-mounted in node a's namespace is unlinked by the harness (another
    client). On `local` a's mount is gone at once; through a client of its own it stays in a's mount
    table until a's next lookup of the path (after the client's 1 s cache), which finds the file gone
    and detaches the mount."""
    jail = jail_dir(tmp_path)
    (jail / "usr/lib/libgpu.so").write_bytes(b"")
    with jailfs.provide(kind, tmp_path, jail) as fs, two_nodes(fs, tmp_path) as fleet:
        a = fleet.start("a", role="cpu-worker", version=None)
        target = fs.jail / "usr/lib/libgpu.so"
        assert a.run(["mount", "--bind", "/etc/hostname", str(target)]).code == 0
        assert attached(a, target)
        target.unlink()
        if kind == "local":
            assert not attached(a, target), "K-1: a remote unlink detaches at once on one directory"
            return
        assert attached(a, target), "K-2: the mount outlives the remote unlink until a's next lookup"
        time.sleep(1.5)   # past the client's dentry cache (GlusterFS and bindfs: 1 s)
        r = a.run(["stat", str(target)])
        assert r.code != 0 and "No such file" in r.stderr
        assert not attached(a, target), "K-2: the lookup that found the file gone detached the mount"
    assert fs.leftovers() == []


@pytest.mark.parametrize("kind,serialises", [pytest.param("local", True, marks=marks("local")),
                                             pytest.param("gluster", True, marks=marks("gluster")),
                                             pytest.param("nodelocal-locks", False, marks=marks("nodelocal-locks"))])
def test_flock_across_nodes(kind, serialises, tmp_path):
    """K-4 and section 8: node a holds `flock jail/lock` while b tries it without waiting. Through
    one directory or two GlusterFS clients b is refused; through two bindfs views it gets it too."""
    jail = jail_dir(tmp_path)
    with jailfs.provide(kind, tmp_path, jail) as fs, two_nodes(fs, tmp_path) as fleet:
        a = fleet.start("a", role="cpu-worker", version=None)
        b = fleet.start("b", role="cpu-worker", version=None)
        holder = threading.Thread(target=a.run, args=(["flock", "lock", "sh", "-c",
                                                       "touch a.holds; sleep 3; rm a.holds"],))
        holder.start()
        try:
            seen = b.run(["sh", "-c", "for i in $(seq 200); do [ -e a.holds ] && exit 0; sleep 0.05; done; exit 1"])
            assert seen.code == 0, "a never took the lock"
            tried = b.run(["flock", "-n", "lock", "true"])
        finally:
            holder.join()
        assert (tried.code != 0) == serialises, f"flock -n through b: exit {tried.code}"
    assert fs.leftovers() == []


@pytest.mark.gluster
@needs("gluster")
def test_brick_outage_and_restart(tmp_path):
    """Section 7, a brick killed mid-run: every lookup through a node's client fails (ENOTCONN)
    while a mount made before stays in its table; once the brick is restarted the node's client
    reconnects and the jail reads again, the mount still attached."""
    jail = jail_dir(tmp_path)
    with jailfs.provide("gluster", tmp_path, jail) as fs, two_nodes(fs, tmp_path) as fleet:
        a = fleet.start("a", role="cpu-worker", version=None)
        target = fs.jail / "usr/lib/hello"
        assert a.run(["mount", "--bind", "/etc/hostname", str(target)]).code == 0
        assert fs.kill_brick()
        time.sleep(1.5)   # past the client's cache: the next lookup asks the brick
        r = a.run(["cat", str(target)])
        assert r.code != 0 and "Transport endpoint is not connected" in r.stderr
        fs.restart_brick()
        for _ in range(150):   # the client reconnects on its own (GlusterFS: within a few seconds)
            if a.run(["ls", "usr/lib"]).code == 0:
                break
            time.sleep(0.2)
        assert a.run(["ls", "usr/lib"]).code == 0, "the client never reconnected after the brick restarted"
        assert attached(a, target)
    assert fs.leftovers() == []


@pytest.mark.gluster
@needs("gluster")
def test_a_new_client_cannot_mount_while_the_brick_is_down(tmp_path):
    """What jailfs_fleet's start retries once an outage is over (CI 88): a node set up while the
    brick is down gets no client, with MOUNT_FAILED in the error (mount.glusterfs stats the new
    mount point), and one set up after the restart does."""
    jail = jail_dir(tmp_path)
    with jailfs.provide("gluster", tmp_path, jail) as fs:
        assert fs.kill_brick()
        with pytest.raises(RuntimeError, match=jailfs.MOUNT_FAILED):
            fs.node_options("c")
        fs.restart_brick()
        for _ in range(150):
            try:
                assert fs.node_options("c")["mount_ns"]
                break
            except RuntimeError:
                time.sleep(0.2)
        else:
            pytest.fail("no client could mount the jail after the brick restarted")
    assert fs.leftovers() == []


@pytest.mark.gluster
@needs("gluster")
def test_lost_client_fails_its_node_only_and_a_replacement_gets_a_new_one(tmp_path):
    """Section 7, a client unmounted under a live worker: node a's client daemon dies; a's jail
    answers ENOTCONN (or ECONNABORTED, for a request in flight as the connection went), b's is
    unaffected, and a node started again as `a` gets a fresh client."""
    jail = jail_dir(tmp_path)
    with jailfs.provide("gluster", tmp_path, jail) as fs, two_nodes(fs, tmp_path) as fleet:
        a = fleet.start("a", role="cpu-worker", version=None)
        b = fleet.start("b", role="cpu-worker", version=None)
        assert fs.lose_client("a")
        err = a.run(["ls", str(fs.jail)]).stderr
        assert any(o in err for o in CLIENT_GONE), err
        assert b.run(["cat", "usr/lib/hello"]).code == 0
        a.kill()
        again = fleet.start("a", role="cpu-worker", version=None)
        assert again.run(["cat", "usr/lib/hello"]).code == 0
    assert fs.leftovers() == []


@pytest.mark.gluster
@needs("gluster")
def test_nothing_left_after_an_exception(tmp_path):
    """An exception inside the context (a test failing mid-run) still unmounts every client, stops
    and deletes the volume and stops glusterd."""
    jail = jail_dir(tmp_path)
    with pytest.raises(RuntimeError, match="mid-run"):
        with jailfs.provide("gluster", tmp_path, jail, nodes=["a", "b"]) as fs:
            assert len(fs.clients) == 2 and all(c.daemons() for c in fs.clients.values())
            raise RuntimeError("mid-run")
    assert fs.leftovers() == []
    assert host_mounts_under(tmp_path) == []


@pytest.mark.gluster
@needs("gluster")
def test_two_volumes_at_once_each_in_its_own_network_namespace(tmp_path):
    """Two runs' glusterds at once on one machine (each in its own network namespace: port 24007
    and the bricks' ports are each run's own): each node reads its own run's volume, and neither
    writes into the host's /run/gluster. (With one glusterd per machine, the second run waited for
    the first, and the barrier broke after 120 s.)"""
    def host_run_gluster() -> set[str]:
        return set(os.listdir("/run/gluster")) if os.path.isdir("/run/gluster") else set()
    before, seen, up, errors = host_run_gluster(), {}, threading.Barrier(2, timeout=120), []

    def one_run(name: str) -> None:
        try:
            jail = jail_dir(tmp_path / name)
            (jail / "usr/lib/hello").write_text(f"volume of {name}\n")
            with jailfs.provide("gluster", tmp_path / name, jail, nodes=["a"]) as fs, two_nodes(fs, tmp_path / name) as fleet:
                up.wait()   # both volumes are up now
                seen[name] = fleet.start("a", role="cpu-worker", version=None).run(["cat", "usr/lib/hello"]).stdout
                seen[name + " /run/gluster"] = host_run_gluster() - before
                up.wait()
            assert fs.leftovers() == []
        except BaseException as e:   # noqa: BLE001 (re-raised in the test's thread)
            errors.append(e)
            up.abort()

    threads = [threading.Thread(target=one_run, args=(n,)) for n in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen == {"one": "volume of one\n", "two": "volume of two\n",
                    "one /run/gluster": set(), "two /run/gluster": set()}
    assert host_run_gluster() == before and host_mounts_under(tmp_path) == []


@pytest.mark.skipif(os.getuid() != 0, reason="a mount namespace of the harness's own needs root")
def test_the_harness_keeps_its_working_directory_after_its_own_mount_namespace(tmp_path, monkeypatch):
    """setns(2) back from the private mount namespace the harness's gluster client lives in moves
    the thread to the root directory: the working directory it had comes back (a relative path
    given later, `chaos` or `reports`, names what it named before; `gpujail bench` found it)."""
    monkeypatch.chdir(tmp_path)
    with gluster.own_mount_ns():
        pass
    assert os.getcwd() == str(tmp_path)


def test_bad_jail_fs_is_exit_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpujail", "run", "--jail-fs", "nfs"], capture_output=True, text=True)
    assert r.returncode == EXIT["bad-input"]
    assert r.stderr.strip().splitlines() == ["gpujail: --jail-fs 'nfs': expected one of local, gluster, nodelocal-locks"]
    assert jailfs.unavailable("nfs") == "unknown jail filesystem 'nfs' (expected one of local, gluster, nodelocal-locks)"


@pytest.mark.unprivileged
def test_unavailable_says_why_when_not_root(monkeypatch):
    """Not root: no FUSE mounts in nodes' namespaces; `gpujail run` turns this into exit 3. Run-tests
    runs it as uid 65534 too (step 3); as root the uid is what the check is told."""
    if os.getuid() == 0:
        monkeypatch.setattr(jailfs.os, "getuid", lambda: 65534)
    assert jailfs.unavailable("gluster") == "jail filesystem 'gluster' needs root (FUSE mounts in each node's namespace)"


def test_k2_chain_names_the_remote_unlink_and_the_lookup_that_detached():
    """chaos/checkers/network.py on a history as a GlusterFS run records it (K-2): w2's CLI cleanup
    unlinks a file at t=1.0; w1's probe at t=1.4 still sees it (its client's cached dentry); w1's
    probe at t=2.1 finds it gone. The INV-1 violation's K-2 reading names all three."""
    from gpujail.chaos import checker
    from gpujail.chaos.checkers import network
    jail = "/run/j/jail"
    lib = f"{jail}/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    ok = {"path": lib, "attached": True, "size": 4096, "same_bytes": True}
    gone = {"path": lib, "attached": False, "size": None, "error": "No such file or directory"}
    events = [{"t": 0.0, "node": "host", "kind": "chaos.begin", "scenario": "k2", "impl": "x", "seed": 0,
               "schedule": {}, "versions": {}, "windows": []},
              {"t": 0.1, "node": "w1", "kind": "worker.start", "attempt": 0},
              {"t": 0.5, "node": "w1", "kind": "worker.ready", "attempt": 0},
              {"t": 0.6, "node": "w1", "kind": "probe", "results": [ok]},
              {"t": 1.0, "node": "w2", "kind": "cli.cleanup.unlink", "path": lib, "size": 0, "pid": 7},
              {"t": 1.4, "node": "w1", "kind": "probe", "results": [ok]},
              {"t": 2.1, "node": "w1", "kind": "probe", "results": [gone]},
              {"t": 2.2, "node": "host", "kind": "chaos.end"}]
    run = checker.Run(events, {"jail": jail})
    violation = checker.check(events, {"jail": jail}).results["INV-1"].violations[0]
    assert network.late_detachment(run, events[4], events[6]) is events[5]
    assert network.explain(run, violation) == [
        "w2 unlinked usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15 at t=1.000s through its own client",
        "w1 still saw it attached at t=1.400s (its client's cached dentry, K-2)",
        "w1's lookup at t=2.100s found it gone and detached its mount"]
