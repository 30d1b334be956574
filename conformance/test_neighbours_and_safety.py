"""Workers side by side, hostile jails, and what CPU workers and login nodes do: SPEC REF-5 (as
seen by a neighbour), REF-9 and REF-11, black-box through the contract.
"""
from __future__ import annotations

import fnmatch
import os
import stat
import threading
import time

import pytest

from gpujail.backends.probes import soname_files
from gpujail.conformance.helpers import (
    MARKER_MAX,
    became_ready,
    changes,
    lost,
    lost_files,
    mps_hosts,
    not_ready,
    one_line_error,
    paused_at,
    soname_broken,
)
from gpujail.contract import BUNDLED, command_for
from gpujail.fixtures import drivers
from gpujail.fixtures import jail as jail_image
from gpujail.world.failpoints import Barrier

pytestmark = pytest.mark.kernel
LIB = "usr/lib/x86_64-linux-gnu"


@pytest.mark.req("REF-5", "CLI-6", "K-1")
def test_failing_neighbour_costs_nothing(world):
    """Seed 000, second half: worker A is ready; worker B's start fails after B mounted 10 files
    (its CLI's cleanup, or its own mount step, fails). A must keep every driver file: markers are
    not empty, so the CLI cleanup leaves them and A's mounts stay attached."""
    a = world.start("A")
    assert a.ready and (gone := lost(a, world.jail)) == [], \
        not_ready("REF-5", a) if not a.ready else lost_files("REF-5 (before any neighbour started)", a, gone, world.jail)
    failing = "cli.before_mount=10*off->return(EIO);ref.before_mount=10*off->return(EIO)"
    b = world.start("B", env={"GPUJAIL_FAILPOINTS": failing})
    assert not b.ready, became_ready("REF-5", b, "its start was made to fail (EIO) after 10 mounts")
    assert world.events("failpoint", action="return"), "the injected failure never fired"
    assert (gone := lost(a, world.jail)) == [], \
        lost_files(f"REF-5/CLI-6: after worker {b.node_id}'s start failed after 10 mounts,", a, gone, world.jail)


@pytest.mark.req("REF-3", "CLI-6", "K-1")
def test_failing_neighbour_keeps_the_mps_pipe_directory(world):
    """Hosts running MPS: worker A is ready with the pipe directory /tmp/nvidia-mps mounted; worker
    B's start fails on the mount right after its MPS directory's. A CLI's cleanup undoes the whole
    batch: it unmounts each target in its own namespace, then removes it (an empty directory
    included, K-1: A's mount on it detaches, and A's MPS clients lose their daemon). A's mount on
    the pipe directory must stay."""
    mps = mps_hosts(world)
    a = world.start("A", **mps)
    assert a.ready, not_ready("REF-3 (a host running MPS)", a)
    mounted = [e["dst"] for e in world.history() if e.get("node") == "A" and e["kind"] in ("cli.mount", "impl.mount")]
    after = 1 + next((i for i, d in enumerate(mounted) if d.rstrip("/").endswith("tmp/nvidia-mps")), -1)
    assert after, f"REF-3: worker A mounted no MPS pipe directory (its mounts: {mounted})"
    failing = f"cli.before_mount={after}*off->return(EIO);ref.before_mount={after}*off->return(EIO)"
    b = world.start("B", env={"GPUJAIL_FAILPOINTS": failing}, **mps)
    assert not b.ready, became_ready("CLI-6", b, "its start was made to fail (EIO) after its MPS directory's mount")
    pipe = str(world.jail / "tmp/nvidia-mps")
    assert [m for m in a.node.mounts(pipe) if m["mountpoint"] == pipe], \
        (f"REF-3/CLI-6: after worker B's start failed right after mounting its MPS pipe directory, worker A's "
         f"mount on tmp/nvidia-mps is gone (the directory {'is gone' if not os.path.isdir(pipe) else 'was replaced'})")


@pytest.mark.req("REF-5", "CLI-6", "K-1")
def test_failing_creator_costs_nothing(world, impl):
    """The other half of the failing neighbour: here the worker that *created* the markers is the
    one that fails, after its neighbour mounted over them. A creates every marker, then pauses
    before its first mount; B starts, finds the markers and becomes ready; then A's start fails
    (EIO). A procedure that undoes what its own start created (upstream #377's idea, done by the
    implementation) deletes the files B has mounted over."""
    barrier, t, result = paused_at(world, impl, "cli.before_mount", "REF-5", "after creating the markers", node="A",
                                   term="1*pause({name})->return(EIO)", also=("ref.before_mount",))
    b = world.start("B")
    assert b.ready, not_ready("REF-5 (beside worker A, which created the markers and is about to fail)", b)
    barrier.release()
    t.join()
    assert not result["A"].ready, became_ready("REF-5", result["A"], "its start was made to fail (EIO) at its first mount")
    assert (gone := lost(b, world.jail)) == [], \
        lost_files("REF-5/CLI-6: after worker A, which created the markers, failed,", b, gone, world.jail)


@pytest.mark.req("REF-3", "CLI-6", "K-1")
def test_upgraded_jail_placeholders_become_markers_in_place(world):
    """An upgraded jail (SPEC REF-3): a worker of the procedure before the fix brought the jail up,
    so it holds the CLI's 0-byte placeholders with that worker's live mounts on them. A worker of
    the implementation under test starts: under the lock it writes the marker into each 0-byte
    placeholder in place (same inode: never unlinked, renamed over or truncated). Then a third
    worker's start fails after 10 mounts: its CLI's cleanup, which unlinks 0-byte files only, must
    cost neither the old worker nor the new one anything."""
    old = world.start("old", impl="legacy")
    assert old.ready, not_ready("REF-3 (test setup: the legacy procedure)", old)
    empty = {}
    for d in (LIB, "usr/bin", "usr/lib/firmware"):
        for path in (world.jail / d).rglob("*") if (world.jail / d).is_dir() else []:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size == 0:
                empty[path] = st.st_ino
    assert len(empty) >= 10, f"the old worker left only {len(empty)} 0-byte placeholders"
    a = world.start("A")
    assert a.ready, not_ready("REF-3 (on an upgraded jail with 0-byte placeholders under live mounts)", a)
    for path, ino in empty.items():
        st = os.lstat(path)
        assert st.st_ino == ino, f"{path}: inode {st.st_ino}, was {ino}: replaced, not written in place"
        assert 0 < st.st_size < MARKER_MAX, f"{path}: {st.st_size} bytes: the old 0-byte placeholder is still there"
    failing = "cli.before_mount=10*off->return(EIO);ref.before_mount=10*off->return(EIO)"
    b = world.start("B", env={"GPUJAIL_FAILPOINTS": failing})
    assert not b.ready, became_ready("REF-3", b, "its start was made to fail (EIO) after 10 mounts")
    assert (gone := lost(a, world.jail)) == [], \
        lost_files(f"REF-3/CLI-6: after worker {b.node_id}'s start failed after 10 mounts,", a, gone, world.jail)
    assert (gone := lost(old, world.jail)) == [], \
        lost_files(f"REF-3/CLI-6: after worker {b.node_id}'s start failed after 10 mounts, the pre-upgrade", old, gone,
                   world.jail)


@pytest.mark.req("REF-12", "REF-8")
def test_each_node_loads_its_own_driver_by_soname(world):
    """A rolling driver upgrade (the operator's #184): node A runs driver 550, node B driver 570,
    on one jail. Then the shared linker state is rewritten the ways real clusters do it: a node
    that sees none of the mounts runs ldconfig on the jail, then B's node does, then A restarts
    (a new start on 550 after B's). In each ready worker's namespace every soname it mounted
    (`libnvidia-ml.so.1`, `libcuda.so.1`, ...) must be its *own* driver's library: the host file's
    bytes, loadable, and exporting its own version."""
    old, new = drivers.VERSIONS
    a = world.start("A", version=old)
    assert a.ready, not_ready(f"REF-12 (driver {old})", a)
    b = world.start("B", version=new)
    assert b.ready, not_ready(f"REF-12 (driver {new}, after a node on {old})", b)
    ldconfig = [jail_image.find_ldconfig(), "-r", str(world.jail)]
    blind = world.node("blind", role="cpu-worker")
    assert (r := blind.run(ldconfig)).code == 0, \
        f"REF-12: `ldconfig -r JAIL` on a node that sees no mounts exited {r.code}: {r.error_line or 'no error output'}"
    assert (r := b.node.run(ldconfig)).code == 0, \
        f"REF-12: `ldconfig -r JAIL` on worker {b.node_id}'s node exited {r.code}: {r.error_line or 'no error output'}"
    a2 = world.start("A2", version=old)
    assert a2.ready, not_ready(f"REF-12 (driver {old}, restarted after {new}'s ldconfig)", a2)
    for w, version in ((a, old), (b, new), (a2, old)):
        results = w.node.probe(soname_files(world.jail, version))
        assert len(results) >= 5, \
            f"REF-12: only {len(results)} soname(s) to check for driver {version} on worker {w.node_id}, expected at least 5"
        wrong = [f"{os.path.basename(r['path'])}: " + (f"driver {r['driver']}" if r.get("driver") else
                                                        (r.get("error") or r.get("loader") or "?").split(": ")[-1])
                 for r in results
                 if r.get("same_bytes") is not True or r.get("driver") != version]
        assert wrong == [], f"worker {w.node_id} (driver {version}) loads another driver by soname: {wrong}"


@pytest.mark.req("REF-12")
def test_rolling_upgrade_of_the_procedure_keeps_the_old_workers_sonames(world):
    """A rolling upgrade of the procedure itself, on one driver version: worker `old` still runs a
    procedure from before REF-12 (sonames are the jail's shared ldconfig links: mutant soname-links)
    and is ready; then the implementation under test starts beside it. A soname link that already
    resolves to this node's own driver library is left alone: replacing it by a marker turns old's
    libnvidia-ml.so.1, and every other soname its jobs load by, into a 26-byte file (file too short)."""
    old = world.start("old", impl="mutant:soname-links")
    assert old.ready, not_ready("REF-12 (the worker on the procedure from before REF-12)", old)
    new = world.start("new")
    assert new.ready, not_ready("REF-12 (beside a worker on the procedure from before REF-12)", new)
    for w in (old, new):
        results = w.node.probe(soname_files(world.jail))
        assert len(results) >= 2, f"REF-12: only {len(results)} soname(s) to check on worker {w.node_id}"
        broken = [soname_broken("REF-12", w, r) for r in results if r.get("same_bytes") is not True]
        assert broken == [], (f"REF-12: after worker new started beside worker old (the procedure before REF-12): "
                              f"{broken[0]} (and {len(broken) - 1} more)")


@pytest.mark.req("REF-11")
@pytest.mark.parametrize("link", ["absolute", "dotdot", "absolute-also-in-jail"])
def test_hostile_symlink_parent(world, tmp_path, link):
    """The jail's firmware directory is a symlink pointing out of the jail: an absolute path, a
    `..` escape, or an absolute path that *also* exists inside the jail (like `/etc`: resolved
    inside the jail it looks harmless, but the CLI resolves it on the host). Nothing may be written
    outside the jail: the implementation refuses with one line, or resolves inside and stays there.
    (The test points the link at a directory of its own, never at the host's /etc: an unsafe
    implementation would write there.)"""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = {"absolute": str(outside), "dotdot": "../../../../outside", "absolute-also-in-jail": str(outside)}[link]
    if link == "absolute-also-in-jail":
        (world.jail / str(outside).lstrip("/")).mkdir(parents=True)
    (world.jail / "usr/lib/firmware").mkdir(parents=True)
    os.symlink(target, world.jail / "usr/lib/firmware/nvidia")
    w = world.start("w")
    # and the world fixture fails the test on any write outside the jail
    assert os.listdir(outside) == [], (f"REF-11: worker {w.node_id} wrote outside the jail through the {link} symlink "
                                       f"usr/lib/firmware/nvidia -> {target}: {sorted(os.listdir(outside))}")
    if not w.ready:
        one_line_error(w, "REF-11")


@pytest.mark.req("REF-11")
def test_symlink_swapped_in_during_run(world, tmp_path, impl):
    """While the lock holder creates markers, the library directory it is writing into is replaced
    by a symlink out of the jail; the remaining markers must still land inside the jail. The swap is
    timed with the `ref.before_marker` failpoint, which only the bundled implementations have."""
    if impl not in BUNDLED or impl in ("legacy", "example-shell"):
        pytest.skip(f"needs the ref.before_marker failpoint, which {impl!r} does not implement")
    outside = tmp_path / "outside"
    outside.mkdir()
    result = {}
    env = {"GPUJAIL_FAILPOINTS": "ref.before_marker=5*off->1*pause(swap)"}
    t = threading.Thread(target=lambda: result.setdefault("w", world.start("w", env=env)))
    t.start()
    barrier = Barrier("swap", world.barriers)
    barrier.wait_arrivals(1)
    os.rename(world.jail / LIB, world.jail / "usr/lib/moved-away")
    os.symlink(str(outside), world.jail / LIB)
    barrier.release()
    t.join()
    assert os.listdir(outside) == [], \
        (f"REF-11: worker w wrote markers outside the jail after {LIB} was swapped for a symlink to "
         f"{outside} mid-run: {sorted(os.listdir(outside))}")


@pytest.mark.req("REF-9")
@pytest.mark.parametrize("role", ["cpu-worker", "login"])
def test_dummy_library_over_placeholders(world, role):
    """CPU workers and login nodes: before the GPU flag exists they mount nothing; after it, a
    loadable dummy library covers each placeholder in their own namespace, while the image's own
    small files (the 31-byte ncurses linker script, 8-byte stub archives) are left alone, and the
    GPU workers are not disturbed."""
    early = world.start("early", role=role)
    assert early.ready, not_ready(f"REF-9 ({role}, before the GPU flag exists)", early)
    assert (m := early.node.mounts(str(world.jail / "usr"))) == [], \
        (f"REF-9: {role} {early.node_id} mounted over the jail before the GPU flag existed: "
         f"{[os.path.relpath(x['mountpoint'], world.jail) for x in m]}")
    gpu = world.start("gpu")
    assert gpu.ready, not_ready("REF-9 (the GPU worker beside the CPU workers)", gpu)
    cpu = world.start("cpu", role=role)
    assert cpu.ready, not_ready(f"REF-9 ({role}, after the GPU flag)", cpu)
    lib = world.jail / LIB
    nvml, ncurses, stub = cpu.node.probe([{"path": str(lib / "libnvidia-ml.so.550.54.15"), "load": True},
                                          {"path": str(lib / "libncurses.so")}, {"path": str(lib / "libpthread.a")}])
    assert nvml["attached"] and nvml["loader"] == "ok", \
        (f"REF-9: {role} {cpu.node_id} must cover the placeholder {LIB}/libnvidia-ml.so.550.54.15 with a loadable dummy: "
         f"mounted over: {bool(nvml['attached'])}, loader says: {nvml['loader']}")
    assert not ncurses["attached"] and ncurses["size"] == 31, \
        (f"REF-9: {role} {cpu.node_id} must leave the image's 31-byte ncurses linker script {LIB}/libncurses.so alone: "
         f"mounted over: {bool(ncurses['attached'])}, {ncurses['size']} bytes")
    assert not stub["attached"] and stub["size"] == 8, \
        (f"REF-9: {role} {cpu.node_id} must leave the image's 8-byte stub archive {LIB}/libpthread.a alone: "
         f"mounted over: {bool(stub['attached'])}, {stub['size']} bytes")
    # Exactly the placeholders, nothing else: not the image's real library, not the soname symlinks
    # that ldconfig pointed at markers.
    mounted = {os.path.relpath(m["mountpoint"], world.jail) for m in cpu.node.mounts(str(world.jail / "usr"))}
    assert mounted == (wanted := placeholders_on_host(world.jail)), \
        (f"REF-9: {role} {cpu.node_id} must mount a dummy over exactly the placeholders; over non-placeholders: "
         f"{sorted(mounted - wanted)}, placeholders left uncovered: {sorted(wanted - mounted)}")
    # As configure mounts the driver files the dummy stands in for (CLI-5): read-only, nodev, nosuid.
    # Writable, a job on this node could rewrite the node's one dummy library under every later job.
    weak = {os.path.relpath(m["mountpoint"], world.jail): m["options"] for m in cpu.node.mounts(str(world.jail / "usr"))
            if not {"ro", "nodev", "nosuid"} <= set(m["options"].split(","))}
    some = "; ".join(f"{r}: {o}" for r, o in list(weak.items())[:2]) + (f" (and {len(weak) - 2} more)" if len(weak) > 2 else "")
    assert not weak, (f"REF-9/CLI-5: {role} {cpu.node_id} must mount the dummy read-only, nodev and nosuid, as configure "
                      f"mounts the driver files it stands in for: {some}")
    assert (gone := lost(gpu, world.jail)) == [], lost_files(f"REF-9: beside {role} {cpu.node_id}, GPU", gpu, gone, world.jail)


def _dummy_mount_failpoint(impl: str) -> None:
    """Skip where the implementation has no `ref.before_dummy_mount` failpoint to time a test with."""
    if (impl not in BUNDLED and not impl.startswith("mutant:")) or impl == "example-shell":
        pytest.skip(f"needs the ref.before_dummy_mount failpoint, which {impl!r} does not implement")


@pytest.mark.req("REF-9", "K-1")
def test_placeholder_removed_while_a_cpu_worker_mounts_is_no_error(world, impl):
    """A placeholder that goes between a CPU worker's look at the jail and its dummy mount over it (a
    populate-jail cleanup of a reused jail running meanwhile) leaves nothing to cover there: no
    error. The worker pauses before its first dummy mount (failpoint `ref.before_dummy_mount`), that
    placeholder is unlinked, and the worker must become ready with a dummy over every one left."""
    _dummy_mount_failpoint(impl)
    assert (gpu := world.start("gpu")).ready, not_ready("REF-9 (the GPU worker beside the CPU worker)", gpu)
    result, barrier = {}, Barrier("dummy", world.barriers)
    env = {"GPUJAIL_FAILPOINTS": "ref.before_dummy_mount=1*pause(dummy)"}
    t = threading.Thread(target=lambda: result.setdefault("cpu", world.start("cpu", role="cpu-worker", env=env)))
    t.start()
    while barrier.arrivals() == 0 and t.is_alive():
        time.sleep(0.002)
    if barrier.arrivals() == 0:
        t.join()
        pytest.fail(f"REF-9: CPU worker cpu never reached the failpoint ref.before_dummy_mount (exit "
                    f"{result['cpu'].attempts[-1].code})")
    [hit] = world.events("failpoint", name="ref.before_dummy_mount", node="cpu")
    os.unlink(world.jail / hit["path"])   # the populate-jail cleanup's
    barrier.release()
    t.join()
    cpu = result["cpu"]
    assert cpu.ready, not_ready(f"REF-9 (the placeholder {hit['path']} was removed just before its dummy mount)", cpu)
    mounted = {os.path.relpath(m["mountpoint"], world.jail) for m in cpu.node.mounts(str(world.jail / "usr"))}
    assert mounted == (wanted := placeholders_on_host(world.jail)), \
        (f"REF-9: after the placeholder {hit['path']} was removed, CPU worker cpu must mount a dummy over exactly the "
         f"placeholders left; over others: {sorted(mounted - wanted)}, left uncovered: {sorted(wanted - mounted)}")


@pytest.mark.req("REF-9")
@pytest.mark.parametrize("error", ["EPERM", "EIO"])
def test_failing_dummy_mount_is_fatal(world, impl, error):
    """A dummy mount that fails (EPERM: the mount refused, as without CAP_SYS_ADMIN or under a
    seccomp profile; EIO) leaves a placeholder uncovered, and a program linked against NVIDIA's
    libraries then fails to load on that node (`file too short`): the CPU worker must not report
    ready, and says why in one line. Injected at its first dummy mount (`ref.before_dummy_mount`)."""
    _dummy_mount_failpoint(impl)
    assert (gpu := world.start("gpu")).ready, not_ready("REF-9 (the GPU worker beside the CPU worker)", gpu)
    cpu = world.start("cpu", role="cpu-worker", env={"GPUJAIL_FAILPOINTS": f"ref.before_dummy_mount=1*return({error})"})
    assert world.events("failpoint", name="ref.before_dummy_mount", action="return"), \
        "the injected failure never fired (no ref.before_dummy_mount hit)"
    assert not cpu.ready, became_ready("REF-9", cpu, f"its first dummy mount failed ({error}): a placeholder is uncovered")
    one_line_error(cpu, "REF-9")


def placeholders_on_host(jail) -> set[str]:
    """REF-9 as the host sees the shared jail: regular files (not symlinks) named lib*.so.* below
    64 bytes in the library directories."""
    found = set()
    for d in (LIB, "usr/lib/i386-linux-gnu", "usr/lib64", "usr/lib"):
        for name in os.listdir(jail / d) if (jail / d).is_dir() else []:
            st = os.lstat(jail / d / name)
            if stat.S_ISREG(st.st_mode) and fnmatch.fnmatchcase(name, "lib*.so.*") and st.st_size < MARKER_MAX:
                found.add(f"{d}/{name}")
    return found


@pytest.mark.req("REF-9")
def test_populate_cleanup_removes_only_placeholders(world, impl):
    """The populate-jail cleanup of a reused jail removes the placeholders (old 0-byte ones and
    markers, in every library directory) and the flag, and nothing else: not the ncurses linker
    script, the stub archives, the image's real library, nor symlinks (ldconfig's soname link to a
    placeholder, the image's own links). The cleanup is a cluster job of the bundled
    implementations, not part of the worker contract."""
    if impl not in ("reference", "legacy", "direct") and not impl.startswith("mutant:"):
        pytest.skip(f"{impl!r}: the populate-jail cleanup is not part of the contract")
    lib = world.jail / LIB
    (lib / "libcuda.so.550.54.15").write_bytes(b"nvidia-placeholder-marker\n")
    (lib / "libnvidia-ml.so.550.54.15").write_bytes(b"")
    os.symlink("libnvidia-ml.so.550.54.15", lib / "libnvidia-ml.so.1")
    (world.jail / "usr/lib64/libnvidia-cfg.so.550.54.15").write_bytes(b"nvidia-placeholder-marker\n")
    (world.jail / "etc/gpu_libs_installed.flag").touch()
    before = jail_image.snapshot(world.jail)
    r = world.node("populate", role="cpu-worker").run(
        command_for(impl, str(world.jail), "populate", "cpu-worker") + ["populate-cleanup"])
    assert r.code == 0, f"REF-9: populate-cleanup (node populate) exited {r.code}: {r.error_line or 'no error output'}"
    gone = {f"{LIB}/libcuda.so.550.54.15", f"{LIB}/libnvidia-ml.so.550.54.15", "usr/lib64/libnvidia-cfg.so.550.54.15",
            "etc/gpu_libs_installed.flag"}
    after = jail_image.snapshot(world.jail)
    assert sorted(set(before) - set(after)) == sorted(gone), \
        (f"REF-9: populate-cleanup must remove exactly the placeholders and the flag; left: "
         f"{sorted(gone - (set(before) - set(after)))}, removed besides: {sorted(set(before) - set(after) - gone)}")
    assert {k: v for k, v in before.items() if k not in gone} == after, \
        f"REF-9: populate-cleanup changed more than the placeholders and the flag: {changes(before, after, gone)}"
