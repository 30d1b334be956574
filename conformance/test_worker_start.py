"""A GPU worker start, black-box through the contract: SPEC REF-1..REF-8 and REF-10.

Each test prepares a jail and nodes, starts the implementation under test (--impl) as workers, and
judges from outside: exit codes, the one-line error, the jail's files as the host sees them (the
shared layer under everyone's mounts), and what a GPU job in each worker sees through the jail.
"""
from __future__ import annotations

import collections
import fcntl
import os
import stat
import threading
import time

import pytest

from gpujail.conformance.helpers import (
    MARKER_MAX,
    became_ready,
    changes,
    host_layout,
    lost,
    lost_files,
    mps_hosts,
    new_entries,
    not_ready,
    one_line_error,
    only_whole_markers,
    paused_at,
    soname_broken,
    start_all,
    stub_cli,
)
from gpujail.fixtures import BIN, drivers
from gpujail.fixtures import jail as jail_image

pytestmark = pytest.mark.kernel
LOCK = "etc/complement_jail_gpu_placeholders.lock"
FLAG = "etc/gpu_libs_installed.flag"
CUDA = "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"


@pytest.mark.req("REF-10")
@pytest.mark.parametrize("n", [1, 4, "--workers"])
def test_cold_bring_up(world, n, workers):
    """n workers (1, 4, and --workers) start at once on a cold jail: every one becomes ready, and a
    GPU job in each sees every driver file through the jail (host bytes, loads with the real loader);
    the flag is set."""
    for w in start_all(world, workers if n == "--workers" else n):
        assert w.ready, not_ready("REF-10", w)
        assert (gone := lost(w, world.jail)) == [], lost_files("REF-10", w, gone, world.jail)
    assert (world.jail / FLAG).exists(), f"REF-10: every worker is ready, but the done flag {FLAG} was not created"


@pytest.mark.req("REF-6", "CLI-3")
def test_cuda_image_compat_libraries_get_no_empty_placeholder(world):
    """A CUDA image in the jail: `usr/local/cuda/compat/` holds forward-compatibility libraries.
    With `--compute` and the CLI's default `--cuda-compat-mode=mount`, configure also mounts those
    into the library directory, creating 0-byte placeholders that `list` never printed, so no
    marker covers them and any failing CLI's cleanup unlinks them from under the ready workers.
    After a start the jail may have gained only complete markers, never a 0-byte file (REF-6:
    `--cuda-compat-mode=disabled`, or markers that cover the compat libraries)."""
    jail_image.plant_cuda_image(world.jail)
    before = jail_image.snapshot(world.jail)
    w = world.start("w", capabilities="compute,utility")
    assert w.ready, not_ready("REF-6/CLI-3", w)
    empty = [rel for rel, (mode, size, _) in new_entries(before, world.jail, "REF-6/CLI-3").items()
             if stat.S_ISREG(mode) and size == 0 and rel.startswith("usr/")]
    assert empty == [], (f"REF-6/CLI-3: worker {w.node_id} left 0-byte placeholders no marker covers "
                         f"(a failing CLI's cleanup unlinks them): {empty}")


@pytest.mark.req("REF-5", "REF-1")
@pytest.mark.parametrize("listing", ["as-printed", "blank-lines"])
def test_no_empty_placeholder_after_cold_start(world, tmp_path, listing):
    """The fix itself: after a cold start the jail holds no 0-byte placeholder for any driver file,
    only complete non-empty markers below 64 bytes, with the host file's exact mode, under 0755
    parents. `blank-lines`: `list`'s output with a blank line between its sections (as a wrapper
    that joins `list --binaries`, `list --libraries`, ... prints it). A blank line names no file;
    the file set is still every path printed (REF-1). Taking it for the end of the output leaves the
    files after it, the libraries, without markers, and the CLI creates 0-byte placeholders for
    them. (Refusing such output, one line and nothing but whole markers written, is safe too.)"""
    env = None
    if listing == "blank-lines":
        env = stub_cli(tmp_path, list_output=with_blank_lines(world.node("probe").cli("list").stdout))
    before = jail_image.snapshot(world.jail)
    w = world.start("w", env=env)
    if listing == "blank-lines" and not w.ready:
        one_line_error(w, "REF-1")
        only_whole_markers(before, world.jail, "REF-1")
        return
    assert w.ready, not_ready("REF-5" + (" (`list` printed blank lines between its sections)" if env else ""), w)
    modes = {drivers.tree_path(f).replace("usr/lib/x86_64-linux-gnu/", "").split("/")[-1]: f.mode
             for f in drivers.catalogue() if f.on_disk}
    markers = 0
    for rel, (mode, size, link) in new_entries(before, world.jail, "REF-5").items():
        if stat.S_ISDIR(mode):
            assert stat.S_IMODE(mode) == 0o755, \
                f"REF-5: worker {w.node_id} created directory {rel} with mode {stat.S_IMODE(mode):04o}, expected 0755"
        elif stat.S_ISREG(mode) and os.path.basename(rel) in modes:
            assert 0 < size < MARKER_MAX, (f"REF-5: worker {w.node_id} left {rel} at {size} bytes, expected a complete "
                                           f"marker of 1 to {MARKER_MAX - 1} bytes (0 bytes: the CLI's own placeholder)")
            host = modes[os.path.basename(rel)]
            assert mode == host, f"REF-5: worker {w.node_id} made marker {rel} with mode {mode:o}, the host file's is {host:o}"
            markers += 1
    assert markers >= 10, (f"REF-5: worker {w.node_id} created {markers} marker(s) for driver files, expected at least 10 "
                           f"(one per file configure mounts)")


def with_blank_lines(listing: str) -> str:
    """`list`'s output with a blank line before each run of paths of another kind (device nodes,
    binaries, libraries, IPC, firmware: told by top directory and `.so`), and one at the end."""
    out, last = [], None
    for line in listing.splitlines():
        kind = (line.split("/")[1] if line.count("/") > 1 else "", ".so" in os.path.basename(line))
        if last is not None and kind != last:
            out.append("")
        out.append(line)
        last = kind
    return "\n".join(out) + "\n\n"


@pytest.mark.req("REF-2", "REF-5")
@pytest.mark.parametrize("layout", ["rhel", "arch"])
def test_other_distributions_libraries_get_markers_where_the_cli_mounts(world, impl, layout):
    """REF-2: on a RHEL host (64-bit libraries in /usr/lib64, 32-bit ones in /usr/lib) and an Arch
    host (64-bit in /usr/lib, 32-bit in /usr/lib32), asked for compat32 too, a cold start leaves no
    0-byte placeholder: every library's marker is where the CLI mounts it, which its ELF class (the
    section of `list`) decides, never its host directory's name. A CDI-mode implementation (SPEC
    section 9) mounts what the spec names where it names it: the 64-bit libraries only (the toolkit
    looks for no others: pkg/lookup/library.go; on Arch through the ld cache), no capabilities (no
    compat32), each at its `containerPath`, the host path (CDI-1, not flattened as CLI-3): each of
    those must be there."""
    options = host_layout(world, layout)
    before = jail_image.snapshot(world.jail)
    w = world.start("w", capabilities="compute,utility,compat32", **options)
    assert w.ready, not_ready(f"REF-2 (a {layout} host)", w)
    empty = sorted(rel for rel, (mode, size, _) in new_entries(before, world.jail, "REF-2").items()
                   if stat.S_ISREG(mode) and size == 0 and ".so" in os.path.basename(rel))
    assert not empty, (f"REF-2: on a {layout} host worker {w.node_id} left {len(empty)} 0-byte placeholder(s) the CLI "
                       f"created where no marker was, e.g. {empty[0]}: its markers went to the other library directory")
    from gpujail.conformance.helpers import is_cdi_mode  # local: this test's CDI-mode case
    if is_cdi_mode(impl):
        import json

        from gpujail.backends.probes import problems
        r = w.node.run([str(BIN / "nvidia-ctk"), "cdi", "generate", "--format=json"])
        libs = [m for m in json.loads(r.stdout)["containerEdits"]["mounts"] if ".so." in m["containerPath"]]
        assert libs, f"the fake `nvidia-ctk cdi generate` named no library on the {layout} host: {r.stderr}"
        got = w.node.probe([{"path": f"{world.jail}{m['containerPath']}", "host": m["hostPath"], "load": True} for m in libs])
        assert (gone := problems(got)) == [], lost_files(f"CDI-1 (a {layout} host)", w, gone, world.jail)
        return
    mounted = {os.path.relpath(e["dst"], world.jail) if e["dst"].startswith("/") else e["dst"] for e in world.history()
               if e.get("node") == "w" and e["kind"] in ("cli.mount", "impl.mount")}   # the CLI's absolute, direct's relative
    assert any(d.startswith("usr/lib/i386-linux-gnu/") for d in mounted), \
        f"REF-2: no 32-bit library was mounted on the {layout} host with compat32 asked (mounted: {sorted(mounted)[:5]} ...)"


@pytest.mark.req("REF-7", "REF-11")
def test_jail_named_through_a_symlink(world, tmp_path):
    """Clusters name shared filesystems through symlinks (`/scratch -> /lustre/scratch`), and the
    contract's GPUJAIL_JAIL may be one. mountinfo lists mount points by their resolved paths, so a
    start that compares them with the unresolved name finds none of the CLI's mounts."""
    alias = tmp_path / "scratch"
    alias.symlink_to(world.jail, target_is_directory=True)
    w = world.start("w", env={"GPUJAIL_JAIL": str(alias)})
    assert w.ready, not_ready(f"REF-7 (GPUJAIL_JAIL={alias}, a symlink to the jail)", w)
    assert (gone := lost(w, world.jail)) == [], lost_files("REF-7", w, gone, world.jail)


@pytest.mark.req("REF-3", "REF-5")
def test_mps_host_gets_a_directory_at_the_pipe_directory(world):
    """On a host running MPS, `list` prints the pipe directory /tmp/nvidia-mps among the IPC entries
    and configure bind-mounts that directory. Its target gets a directory, never a file marker (the
    CLI then fails "not a directory" and no worker ever becomes ready); a second worker finds it
    present."""
    mps = mps_hosts(world)
    first = world.start("first", **mps)
    assert first.ready, not_ready("REF-3 (a host running MPS: /tmp/nvidia-mps is a directory)", first)
    st = os.lstat(world.jail / "tmp/nvidia-mps")
    assert stat.S_ISDIR(st.st_mode), \
        f"REF-3: worker first made tmp/nvidia-mps a {stat.filemode(st.st_mode)} in the jail, expected a directory"
    # what the worker keeps in it (a marker, so that no cleanup's rmdir can take it away) is in the
    # jail every job shares: writable by its owner only, and no program (the pipe directory's
    # files are sockets and logs): mode 0644 at most
    loose = [f"{e.name} {stat.filemode(e.stat(follow_symlinks=False).st_mode)}"
             for e in os.scandir(world.jail / "tmp/nvidia-mps") if e.stat(follow_symlinks=False).st_mode & 0o7133]
    assert loose == [], f"REF-5: worker first left files in tmp/nvidia-mps with more than mode 0644: {loose}"
    second = world.start("second", **mps)
    assert second.ready, not_ready("REF-3 (a second worker on a host running MPS)", second)
    assert (gone := lost(first, world.jail)) == [], lost_files("REF-3", first, gone, world.jail)


@pytest.mark.req("REF-4")
def test_warm_start_takes_no_lock_and_creates_nothing(world):
    """On a fully populated jail a start creates nothing and does not wait for the placeholder
    lock: with the lock held by someone else for the whole start, it still becomes ready."""
    assert (first := world.start("first")).ready, not_ready("REF-4", first)
    before = jail_image.snapshot(world.jail)
    with open(world.jail / LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        warm = world.start("warm", env={"GPUJAIL_LOCK_TIMEOUT": "0.5"})
    assert warm.ready, not_ready("REF-4 (on a populated jail, with the placeholder lock held by someone else)", warm)
    assert (gone := lost(warm, world.jail)) == [], lost_files("REF-4", warm, gone, world.jail)
    ours = ("etc/ld.so.cache", LOCK)   # the test's own lock file; the cache ldconfig may refresh
    after = jail_image.snapshot(world.jail)
    assert {k: v for k, v in after.items() if k not in ours} == {k: v for k, v in before.items() if k not in ours}, \
        f"REF-4: warm start of worker {warm.node_id} on a populated jail changed it: {changes(before, after, ours)}"


def _lock_waiters(path) -> int:
    """How many processes are blocked on an flock of `path` (/proc/locks `->` lines)."""
    ino = os.stat(path).st_ino
    with open("/proc/locks") as f:
        return sum(1 for ln in f if "->" in ln and ln.split()[-3].endswith(f":{ino}"))


@pytest.mark.req("REF-5")
def test_later_lock_holder_rechecks(world):
    """REF-5 re-check: a worker that queued on the lock while an earlier holder created every
    marker must find them present under the lock and create nothing (the seed's third e2e path)."""
    # learn the markers an earlier holder would create
    before = jail_image.snapshot(world.jail)
    assert (probe := world.start("probe-driver")).ready, not_ready("REF-5", probe)
    jail2 = world.jail
    # Remove the markers, hold the lock, let a worker queue on it, then put them back ourselves.
    saved = _remove_markers(jail2, before)
    seen = {}

    def put_back():
        _put_back(jail2, saved)
        seen["inodes"] = {rel: os.stat(jail2 / rel).st_ino for rel in saved}
        seen["mtimes"] = {rel: os.stat(jail2 / rel).st_mtime_ns for rel in saved}
    w = _queued_on_the_lock(world, "queued", meanwhile=put_back)
    inodes, mtimes = seen["inodes"], seen["mtimes"]
    assert w.ready, not_ready("REF-5", w)
    now = {rel: os.stat(jail2 / rel).st_ino for rel in saved}
    assert now == inodes, (f"REF-5: worker queued on the lock replaced markers an earlier holder had created, instead of "
                           f"re-checking under the lock: {sorted(rel for rel in saved if now[rel] != inodes[rel])}")
    now = {rel: os.stat(jail2 / rel).st_mtime_ns for rel in saved}
    assert now == mtimes, (f"REF-5: worker queued on the lock rewrote markers an earlier holder had created, instead of "
                           f"re-checking under the lock: {sorted(rel for rel in saved if now[rel] != mtimes[rel])}")


@pytest.mark.req("REF-5", "REF-3")
@pytest.mark.parametrize("theirs", ["whole", "0-byte"])
def test_marker_created_meanwhile_by_a_node_the_lock_did_not_stop(world, impl, theirs):
    """REF-5 amended: a lock that did not serialise this node with another (node-local locks, a
    lease lost on a network filesystem) lets the other node create a target between this node's
    re-check and its exclusive create. The create's EEXIST is no error: the target is re-checked as
    REF-3 does, a whole marker accepted as it is, a 0-byte one (the other node's create, not yet
    written) filled in place. Timed with the `ref.before_marker` failpoint: the worker pauses before
    its first create, and the other node's markers appear at every target, its own included."""
    before = jail_image.snapshot(world.jail)
    assert (probe := world.start("probe-driver")).ready, not_ready("REF-5", probe)
    saved = _remove_markers(world.jail, before)
    barrier, t, result = paused_at(world, impl, "ref.before_marker", "REF-5", "before its first marker create")
    for rel, (data, mode) in saved.items():   # the other node's markers, written through the shared jail
        (world.jail / rel).write_bytes(data if theirs == "whole" else b"")
        os.chmod(world.jail / rel, stat.S_IMODE(mode))
    inodes = {rel: os.stat(world.jail / rel).st_ino for rel in saved}
    barrier.release()
    t.join()
    w = result["w"]
    assert w.ready, not_ready(f"REF-5: its exclusive create met the other node's {theirs} marker", w)
    now = {rel: os.stat(world.jail / rel).st_ino for rel in saved}
    assert now == inodes, (f"REF-5: worker w replaced the other node's {theirs} markers instead of re-checking them: "
                           f"{sorted(rel for rel in saved if now[rel] != inodes[rel])}")
    empty = sorted(rel for rel in saved if os.stat(world.jail / rel).st_size == 0)
    assert not empty, f"REF-3: worker w left the other node's 0-byte placeholders unfilled: {empty}"
    assert (gone := lost(w, world.jail)) == [], lost_files("REF-5", w, gone, world.jail)


@pytest.mark.req("REF-7", "K-1")
def test_mount_detached_before_verification_is_a_failure(world, impl):
    """REF-7, verify against what should be there: while the worker is paused after `configure`
    (failpoint `ref.before_verify`), another node's CLI cleanup unlinks the placeholder under one
    of its mounts (K-1: the mount detaches, and is simply gone from its mount table, as with a
    jail upgraded from before the fix). A start that checks only the mounts still listed reports
    ready without libcuda; it must exit non-zero instead."""
    barrier, t, result = paused_at(world, impl, "ref.before_verify", "REF-7", "after configure")
    os.unlink(world.jail / CUDA)   # the other node's cleanup
    barrier.release()
    t.join()
    w = result["w"]
    assert not w.ready, became_ready("REF-7", w, f"its mount on {CUDA} was detached before it verified (the "
                                     "placeholder under it unlinked by another node)")
    assert CUDA in one_line_error(w, "REF-7"), f"REF-7: worker w's error line does not name {CUDA}"


@pytest.mark.req("REF-5")
def test_later_lock_holder_creates_the_markers_still_missing(world):
    """REF-5 re-check, per target: a worker queued on the lock while an earlier holder created only
    some of the markers it needs (an earlier worker asking for fewer files, or stopped half way)
    must skip those and still create every other one, so that the CLI creates no 0-byte
    placeholder (the seed bug) for the rest."""
    before = jail_image.snapshot(world.jail)
    assert (probe := world.start("probe-driver")).ready, not_ready("REF-5", probe)
    saved = _remove_markers(world.jail, before)
    missing = sorted(saved)[1::3]   # put back two of three; spread, whatever order a start goes in
    w = _queued_on_the_lock(world, "queued", meanwhile=lambda: _put_back(
        world.jail, {rel: v for rel, v in saved.items() if rel not in missing}))
    assert w.ready, not_ready("REF-5", w)
    empty = [rel for rel in missing if os.stat(world.jail / rel).st_size == 0]
    assert empty == [], (f"REF-5: worker queued on the lock found {len(saved) - len(missing)} of its markers made "
                         f"meanwhile and created none of the other {len(missing)}: the CLI made 0-byte placeholders "
                         f"for {len(empty)} of them, e.g. {empty[:3]}")


def _queued_on_the_lock(world, name: str, meanwhile):
    """Worker `name` started while the test holds the placeholder lock; once it waits on the lock,
    `meanwhile()` runs (still under the lock), then the lock is let go. The worker, once its start ended."""
    result = {}
    with open(world.jail / LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        t = threading.Thread(target=lambda: result.setdefault("w", world.start(name)))
        t.start()
        deadline = time.monotonic() + 30
        while _lock_waiters(world.jail / LOCK) == 0 and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.005)
        assert _lock_waiters(world.jail / LOCK) == 1, "the worker never queued on the placeholder lock"
        meanwhile()
    t.join()
    return result["w"]


def _put_back(jail, saved: dict[str, tuple[bytes, int]]) -> None:
    """The markers `_remove_markers` saved, written again with their modes."""
    for rel, (data, mode) in saved.items():
        (jail / rel).write_bytes(data)
        os.chmod(jail / rel, stat.S_IMODE(mode))


def _remove_markers(jail, before: dict) -> dict[str, tuple[bytes, int]]:
    """The markers a worker created in `jail` since the snapshot `before` (not etc/), removed; their
    content and modes returned."""
    markers = [rel for rel, (mode, size, _) in jail_image.snapshot(jail).items() if rel not in before
               and stat.S_ISREG(mode) and 0 < size < MARKER_MAX and not rel.startswith("etc/")]
    saved = {rel: ((jail / rel).read_bytes(), os.stat(jail / rel).st_mode) for rel in markers}
    for rel in markers:
        (jail / rel).unlink()
    return saved


@pytest.mark.req("REF-5")
def test_lock_wait_is_bounded(world):
    """A lock that never frees is fatal after a bounded wait: one line naming the lock, and the jail
    unchanged (nothing created without the lock)."""
    before = jail_image.snapshot(world.jail)
    with open(world.jail / LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        w = world.start("w", env={"GPUJAIL_LOCK_TIMEOUT": "0.3"}, timeout=60)
    assert not w.ready and w.attempts[-1].code not in (0, "timeout"), \
        (f"REF-5: worker {w.node_id} must give up waiting for the held lock {LOCK} with a non-zero exit, got exit "
         f"{w.attempts[-1].code}" + (" (the lock wait is not bounded)" if w.attempts[-1].code == "timeout" else
                                      " (it did not wait for the lock)" if w.ready else ""))
    assert "lock" in (line := one_line_error(w, "REF-5")), \
        f"REF-5: worker {w.node_id}'s error line does not name the lock ({LOCK}) it gave up on: {line!r}"
    after = jail_image.snapshot(world.jail)
    assert {k: v for k, v in after.items() if k != LOCK} == {k: v for k, v in before.items() if k != LOCK}, \
        f"REF-5: worker {w.node_id} wrote to the jail without holding the lock: {changes(before, after, (LOCK,))}"


@pytest.mark.req("REF-3")
def test_node_local_entries_are_skipped(world):
    """/dev and /run entries resolve to node-local objects, so the shared jail's own dev/ and run/
    stay empty: no marker is created for a device node or a socket."""
    assert (w := world.start("w")).ready, not_ready("REF-3", w)
    assert os.listdir(world.jail / "dev") == [] and os.listdir(world.jail / "run") == [], \
        (f"REF-3: worker {w.node_id} created entries for node-local objects in the shared jail: "
         f"dev/ {sorted(os.listdir(world.jail / 'dev'))}, run/ {sorted(os.listdir(world.jail / 'run'))}")


@pytest.mark.req("REF-1")
@pytest.mark.needs_cli("list")
def test_failing_list_is_fatal(world):
    """A failing `list` is fatal, with its error line, before anything is written."""
    before = jail_image.snapshot(world.jail)
    w = world.start("w", env={"GPUJAIL_FAILPOINTS": "cli.before_list=return(EIO)"})
    assert not w.ready, became_ready("REF-1", w, "`nvidia-container-cli list` failed (EIO)")
    assert "list" in (line := one_line_error(w, "REF-1")), \
        f"REF-1: worker {w.node_id}'s error line does not name the failing `list`: {line!r}"
    after = jail_image.snapshot(world.jail)
    assert after == before, f"REF-1: worker {w.node_id} wrote to the jail although `list` failed: {changes(before, after)}"


@pytest.mark.req("REF-1")
@pytest.mark.needs_cli("list")
def test_list_failing_after_its_output_is_fatal(world, tmp_path):
    """A `list` that printed its files and then failed (exit 1, as a CLI that dies in its last
    section) is fatal too, whatever it printed: the file set may be incomplete. Nothing is written."""
    listing = world.node("probe").cli("list").stdout
    before = jail_image.snapshot(world.jail)
    w = world.start("w", env=stub_cli(tmp_path, list_output=listing, list_exit=1))
    assert not w.ready, became_ready("REF-1", w, "`nvidia-container-cli list` printed its files, then exited 1")
    assert "list" in (line := one_line_error(w, "REF-1")), \
        f"REF-1: worker {w.node_id}'s error line does not name the failing `list`: {line!r}"
    after = jail_image.snapshot(world.jail)
    assert after == before, \
        f"REF-1: worker {w.node_id} wrote to the jail although `list` exited 1: {changes(before, after)}"


@pytest.mark.req("REF-1")
@pytest.mark.needs_cli("list")
@pytest.mark.parametrize("listing", ["", "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n",
                                     "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.999.1.1\n"],
                         ids=["empty", "relative", "missing-host-file"])
def test_bad_list_output(world, tmp_path, listing):
    """An empty list, a relative path, a listed host file that does not exist: one line, non-zero,
    and nothing but whole markers in the jail."""
    before = jail_image.snapshot(world.jail)
    w = world.start("w", env=stub_cli(tmp_path, list_output=listing))
    assert not w.ready, became_ready("REF-1", w, f"`nvidia-container-cli list` printed an unusable file set: {listing!r}")
    one_line_error(w, "REF-1")
    only_whole_markers(before, world.jail, "REF-1")


@pytest.mark.req("REF-1")
def test_driver_upgrade_picks_up_new_files(world):
    """The file set is taken at run time: a node on the newer driver, on a jail populated by the old
    one, gets markers and mounts for its own files (libnvidia-gpucomp only exists in 570)."""
    assert (old := world.start("old")).ready, not_ready("REF-1", old)
    new = world.start("new", version="570.86.15")
    assert new.ready, not_ready("REF-1 (driver 570 on a jail populated by 550)", new)
    from gpujail.backends.probes import gpu_files, problems
    assert (gone := problems(new.node.probe(gpu_files(world.jail, "570.86.15")))) == [], \
        lost_files("REF-1 (driver 570 on a jail populated by 550)", new, gone, world.jail)
    gpucomp = "usr/lib/x86_64-linux-gnu/libnvidia-gpucomp.so.570.86.15"
    assert (size := (world.jail / gpucomp).stat().st_size) > 0, \
        f"REF-1/REF-5: {gpucomp}, a file only driver 570 has, is {size} bytes on the host: no marker for worker {new.node_id}"


@pytest.mark.req("REF-2")
def test_non_debian_jail(world):
    """REF-2 follows the CLI's destinations: without etc/debian_version the CLI mounts libraries in
    usr/lib64, so that is where the markers must be (else the CLI creates 0-byte files there)."""
    (world.jail / "etc/debian_version").unlink()
    (world.jail / "etc/ld.so.conf.d/lib64.conf").write_text("/usr/lib64\n")   # as on RHEL-like images
    w = world.start("w")
    assert w.ready, not_ready("REF-2 (jail without etc/debian_version)", w)
    lib = world.jail / "usr/lib64/libnvidia-ml.so.550.54.15"
    assert 0 < (size := lib.stat().st_size) < MARKER_MAX, \
        (f"REF-2: without etc/debian_version the CLI mounts libraries in usr/lib64, so worker {w.node_id} must put a "
         f"complete marker (1 to {MARKER_MAX - 1} bytes) at usr/lib64/libnvidia-ml.so.550.54.15; it is {size} bytes")


@pytest.mark.req("REF-2")
def test_jail_path_with_spaces(tmp_path, open_world):
    """The jail path may contain spaces; every word stays one argument, and the mount table's
    escaped form (\\040) is understood."""
    jail = jail_image.make_jail(tmp_path / "my jail")
    with open_world(jail) as world:
        w = world.start("w")
        assert w.ready, not_ready(f"REF-2 (jail path {str(jail)!r})", w)
        assert (gone := lost(w, jail)) == [], lost_files(f"REF-2 (jail path {str(jail)!r})", w, gone, jail)


@pytest.mark.req("REF-6")
def test_capabilities_are_passed(world):
    """The CLI runs with the caller's capabilities: with `utility` only, NVML is mounted and
    libcuda is not."""
    w = world.start("w", capabilities="utility")
    assert w.ready, not_ready("REF-6 (capabilities=utility)", w)
    mounts = {os.path.basename(m["mountpoint"]) for m in w.node.mounts()}
    assert "libnvidia-ml.so.550.54.15" in mounts and "libcuda.so.550.54.15" not in mounts, \
        (f"REF-6: with capabilities=utility worker {w.node_id} must mount libnvidia-ml.so.550.54.15 and not "
         f"libcuda.so.550.54.15; NVML mounted: {'libnvidia-ml.so.550.54.15' in mounts}, "
         f"libcuda mounted: {'libcuda.so.550.54.15' in mounts}")


@pytest.mark.req("CLI-5")
def test_driver_mounts_are_read_only(world):
    """Whoever makes them (the CLI, or an implementation that mounts directly), the mounts a ready
    worker has under the jail carry configure's remount flags: driver files read-only, nodev and
    nosuid, device nodes read-only, nosuid and noexec (nodev would make them unusable), IPC sockets
    nodev, nosuid and noexec (a socket must stay writable to connect).
    A job cannot write the host's driver files or device nodes through the jail."""
    # The node's own mounts (dev/, run/, and in a user namespace a /dev/null stand-in bound over
    # each device node) come first in its table; what the start added is stacked on top of them.
    node_own = collections.Counter(m["mountpoint"] for m in world.node("bare").mounts())
    w = world.start("w")
    assert w.ready, not_ready("CLI-5", w)
    new = {}
    for m in w.node.mounts():
        if node_own[m["mountpoint"]] > 0:
            node_own[m["mountpoint"]] -= 1
        else:
            new[os.path.relpath(m["mountpoint"], world.jail)] = set(m["options"].split(","))
    assert "dev/nvidia0" in new and "run/nvidia-persistenced/socket" in new and CUDA in new, \
        (f"CLI-5: worker {w.node_id} is ready but has no mount of "
         f"{[p for p in ('dev/nvidia0', 'run/nvidia-persistenced/socket', CUDA) if p not in new]} under the jail")
    wanted = {"run": {"nodev", "nosuid", "noexec"}, "dev": {"ro", "nosuid", "noexec"}}
    weak = {rel: sorted(o) for rel, o in new.items() if not wanted.get(rel.split("/")[0], {"ro", "nodev", "nosuid"}) <= o}
    assert weak == {}, \
        (f"CLI-5: worker {w.node_id}'s mounts lack configure's remount flags (driver files: ro,nodev,nosuid; devices: "
         f"ro,nosuid,noexec; sockets: nodev,nosuid,noexec): " + "; ".join(f"{rel}: {','.join(o)}" for rel, o in weak.items()))


@pytest.mark.req("REF-6")
@pytest.mark.needs_cli("configure")
def test_failing_cli_is_fatal_without_retry(world):
    """A failing `configure` is fatal (non-zero so the orchestrator restarts the container), with
    its error in one line, and is not retried in-process."""
    w = world.start("w", env={"GPUJAIL_FAILPOINTS": "cli.before_mount=return(EIO)"})
    assert not w.ready, became_ready("REF-6", w, "`nvidia-container-cli configure` failed (EIO)")
    assert "input/output error" in (line := one_line_error(w, "REF-6")).lower(), \
        f"REF-6: worker {w.node_id}'s error line does not carry the CLI's error (input/output error): {line!r}"
    assert (runs := len(world.events("cli.start"))) == 1, \
        f"REF-6: worker {w.node_id} ran the CLI {runs} times; a failing configure must not be retried in-process"


@pytest.mark.req("REF-7")
@pytest.mark.needs_cli("configure")
def test_no_mounts_is_an_anomaly(world, tmp_path):
    """A `configure` that exits 0 having mounted nothing must not be trusted, even though every
    target exists (markers left by an earlier run pass an existence check)."""
    assert (earlier := world.start("earlier")).ready, not_ready("REF-7", earlier)
    w = world.start("w", env=stub_cli(tmp_path, configure="exit 0"))
    assert not w.ready, became_ready("REF-7", w, "`configure` exited 0 having mounted nothing")
    one_line_error(w, "REF-7")
    assert not world.events("impl.ready", node="w"), \
        f"REF-7: worker {w.node_id} reported ready (impl.ready) although `configure` mounted nothing"


@pytest.mark.req("REF-7")
@pytest.mark.needs_cli("configure")
def test_placeholder_sized_mount_is_rejected(world, tmp_path):
    """A mount that shows placeholder-sized content by path (here: a 26-byte file bound over libcuda
    after a successful configure) fails verification. (Not NVML: the soname check, REF-8, would
    catch that one too and hide an implementation that verifies by existence only.)"""
    snippet = (f'"{BIN / "nvidia-container-cli"}" "$@" || exit $?; '
               'printf "nvidia-placeholder-marker\\n" > /run/small; '
               f'mount --bind /run/small "$GPUJAIL_JAIL/{CUDA}"; exit 0')
    w = world.start("w", env=stub_cli(tmp_path, configure=snippet))
    assert not w.ready, became_ready("REF-7", w, f"{CUDA} shows a 26-byte placeholder through its mount")
    assert "libcuda" in (line := one_line_error(w, "REF-7")), \
        f"REF-7: worker {w.node_id}'s error line does not name the placeholder-sized mount {CUDA}: {line!r}"


@pytest.mark.req("REF-8")
def test_soname_is_repaired(world):
    """libnvidia-ml.so.1 must resolve to real content: a worker repairs a missing soname link
    (ldconfig on the jail) and a GPU job then loads NVML by its soname."""
    assert (first := world.start("first")).ready, not_ready("REF-8", first)
    link = world.jail / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    if os.path.lexists(link):
        link.unlink()
    w = world.start("w")
    assert w.ready, not_ready("REF-8 (soname link libnvidia-ml.so.1 removed)", w)
    [r] = w.node.probe([{"path": str(link), "load": True}])
    assert r["loader"] == "ok" and r["size"] > 1024, soname_broken("REF-8", w, r)


@pytest.mark.req("REF-8", "K-1")
def test_nvml_soname_lost_after_the_mounts_is_repaired(world, impl):
    """REF-8 where REF-12 leaves it nothing to do, until the soname is lost: the worker pauses after
    its mounts, its own NVML over the soname placeholder `libnvidia-ml.so.1` among them (failpoint
    `ref.before_soname`), and another node unlinks that placeholder (a populate-jail cleanup run on a
    jail in use): the mount on it detaches (K-1). The soname check must find it broken and repair
    it (the jail's ldconfig under its lock, which works here, or the implementation's own way): the
    worker becomes ready and a GPU job loads this node's NVML by its soname."""
    if impl in ("legacy", "example-shell"):
        pytest.skip(f"{impl!r} has no ref.before_soname failpoint to time this with (legacy: no soname check at all)")
    barrier, t, result = paused_at(world, impl, "ref.before_soname", "REF-8", "before its soname check")
    soname = world.jail / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    if os.path.lexists(soname):
        os.unlink(soname)   # the other node's cleanup
    barrier.release()
    t.join()
    w = result["w"]
    assert w.ready, not_ready("REF-8 (libnvidia-ml.so.1 unlinked from under its mount before the soname check)", w)
    [r] = w.node.probe([{"path": str(soname), "load": True}])
    assert r["loader"] == "ok" and r["size"] > 1024 and r.get("driver") == drivers.DEFAULT_VERSION, \
        soname_broken("REF-8 (libnvidia-ml.so.1 unlinked from under its mount before the soname check)", w, r)


@pytest.mark.req("REF-8")
def test_soname_unrepairable_is_fatal(world, tmp_path):
    """With an ldconfig that does nothing, a worker never reports ready with a broken
    libnvidia-ml.so.1: either it makes the soname another way (REF-12: its own library mounted over
    a soname placeholder) and a GPU job loads NVML by it, or the start fails with one line naming
    the soname."""
    d = tmp_path / "noop-ldconfig"
    d.mkdir()
    (d / "ldconfig").write_text("#!/bin/sh\nexit 0\n")
    (d / "ldconfig").chmod(0o755)
    env = stub_cli(tmp_path)
    env["PATH"] = f"{d}:{env['PATH']}"
    w = world.start("w", env=env)
    if w.ready:
        [r] = w.node.probe([{"path": str(world.jail / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"), "load": True}])
        assert r["loader"] == "ok" and r["size"] > 1024, soname_broken("REF-8/REF-12", w, r)
    else:
        assert "libnvidia-ml.so.1" in (line := one_line_error(w, "REF-8")), \
            f"REF-8: worker {w.node_id} failed, but its error line does not name the broken soname libnvidia-ml.so.1: {line!r}"


@pytest.mark.req("REF-10")
@pytest.mark.needs_cli("list")
def test_no_flag_on_failure(world):
    """The done flag is touched only by a worker that passed verification."""
    w = world.start("w", env={"GPUJAIL_FAILPOINTS": "cli.before_list=return(EIO)"})
    assert not w.ready, became_ready("REF-10", w, "`nvidia-container-cli list` failed (EIO)")
    assert not (world.jail / FLAG).exists(), f"REF-10: worker {w.node_id} failed but created the done flag {FLAG}"


@pytest.mark.req("REF-5")
def test_read_only_jail(world):
    """A read-only jail: a cold start fails with one line naming the path (it cannot create its
    markers); a warm start (everything present, flag set) works, since nothing needs writing."""
    cold = world.start("ro-cold", node_options={"jail_readonly": True})
    assert not cold.ready, became_ready("REF-5", cold, "the jail is read-only and cold (no markers can be created)")
    one_line_error(cold, "REF-5")
    assert (rw := world.start("rw")).ready, not_ready("REF-5", rw)
    warm = world.start("ro-warm", node_options={"jail_readonly": True})
    assert warm.ready, not_ready("REF-5 (read-only jail, already populated: nothing needs writing)", warm)
    assert (gone := lost(warm, world.jail)) == [], lost_files("REF-5", warm, gone, world.jail)


@pytest.mark.req("REF-5")
def test_full_jail_leaves_no_truncated_placeholder(world):
    """ENOSPC (a small tmpfs under this node's jail): one line, non-zero, and no truncated
    placeholder left behind (an empty one is what a failing CLI deletes from under mounts)."""
    from gpujail.contract import command_for
    node = world.node("full", jail_tmpfs="80k")
    r = node.run(command_for(world.impl, str(world.jail), "full", "gpu-worker"))
    assert r.code != 0, "REF-5: worker full exited 0 on a full jail (ENOSPC: its markers cannot all be written)"
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, \
        f"REF-5: worker full (exit {r.code}, ENOSPC) must explain its failure in exactly one stderr line, wrote:\n{r.stderr}"
    listing = node.run(["find", str(world.jail / "usr"), "-type", "f", "-printf", "%s %p\\n"]).stdout
    assert (empty := [ln for ln in listing.splitlines() if int(ln.split()[0]) == 0]) == [], \
        (f"REF-5: worker full left 0-byte placeholders on the full jail (a failing CLI deletes them from under mounts): "
         f"{[ln.split(' ', 1)[1].removeprefix(str(world.jail) + '/') for ln in empty]}")
