"""The kernel-backend world: worker nodes in private mount namespaces, the fake CLI doing real syscalls
on one shared jail, and the seed bug (`000_*`) reproduced by the kernel itself, not scripted.

Every test starts its nodes through the `fleet` fixture (which skips, with the reason, on a host that
has neither root nor unprivileged user namespaces) and also runs as uid 65534 through user namespaces
(`unprivileged`). Nodes run `configure --compute --utility --device=all --ldconfig=/usr/bin/true JAIL`,
the command line runtimes use (SPEC section 5).
"""
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpujail.fixtures import drivers
from gpujail.fixtures.drivers import LIB32, LIB64, DriverFile, catalogue
from gpujail.fixtures.jail import make_jail, snapshot
from gpujail.world import history
from gpujail.world.failpoints import Barrier
from gpujail.world.sysops import RealSys

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.kernel, pytest.mark.unprivileged]

VERSION, NEW_VERSION = drivers.VERSIONS
CAPS = {"compute", "utility"}
CONFIGURE = ("configure", "--compute", "--utility", "--device=all", "--ldconfig=/usr/bin/true")
SOCKET = "/run/nvidia-persistenced/socket"
MARKER = b"gpujail marker, see REF-5\n"   # what the fix writes instead of a 0-byte placeholder
assert len(MARKER) == 26

# The real CLI's orders (nvc_info.c), written out here so `list` is checked against the source, not
# against the fake's own tables: lookup_devices, utility_bins + compute_bins, lookup_libraries.
CLI_DEVICE_ORDER = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
CLI_BINARY_ORDER = ["nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager",
                    "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"]
CLI_LIBRARY_ORDER = [
    "libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq",                                         # utility
    "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp", "libnvidia-ptxjitcompiler",
    "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3", "libnvidia-nvvm",                                             # compute
    "libnvidia-ngx",                                                                           # ngx
    "libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid",              # video
    "libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi", "libnvidia-fbc", "libnvidia-ifr",
    "libnvidia-rtcore", "libnvoptix",                                                          # graphics
    "libGLX_nvidia", "libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia", "libnvidia-glvkspirv",
    "libnvidia-cbl",                                                                           # glvnd
]


# -- helpers -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """One regular file `configure` mounts into the jail (SPEC CLI-3)."""
    file: DriverFile
    cli_path: str      # the destination as the CLI names it (history, error messages)
    mountpoint: str    # the same place with the jail's own symlinks resolved (mount table, host view)

    def probe(self) -> dict:
        return {"path": self.mountpoint, "host": self.file.path, "load": self.file.kind == "library"}


def file_targets(jail, version=VERSION) -> list[Target]:
    """Binaries, libraries and firmware of `configure --compute --utility`, in the CLI's plan order.
    Libraries and binaries land in the Debian directories; firmware at its host path resolved inside
    the jail (1.18, mount_in_root): the jail's `lib -> usr/lib` makes it JAIL/usr/lib/firmware/..."""
    out = []
    for kind in ("binary", "library", "firmware"):
        for f in catalogue(version):
            if f.kind != kind or f.capability not in CAPS | {"all"}:
                continue
            name = os.path.basename(f.path)
            cli = {"binary": f"{jail}/usr/bin/{name}", "library": f"{jail}{LIB64}/{name}"}.get(kind, f"{jail}/usr{f.path}")
            out.append(Target(f, cli, os.path.realpath(cli)))
    return out


def configure(node, failpoints: str | None = None):
    env = node.contract_env(extra={"GPUJAIL_FAILPOINTS": failpoints} if failpoints else None)
    return node.cli(*CONFIGURE, str(node.jail), env=env)


def events(fleet, kind: str, node: str | None = None) -> list[dict]:
    return history.select(fleet.history(), kind, **({"node": node} if node else {}))


_STAT = r"""
import hashlib, json, os, sys
out = {}
for p in sys.argv[1:]:
    try:
        st = os.lstat(p)
    except OSError as e:
        out[p] = {"error": e.strerror}
        continue
    out[p] = {"mode": st.st_mode, "size": st.st_size, "rdev": [os.major(st.st_rdev), os.minor(st.st_rdev)]}
    if os.path.isfile(p):
        out[p]["sha256"] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    elif os.path.isdir(p):
        out[p]["entries"] = sorted(os.listdir(p))
print(json.dumps(out))
"""


def node_stat(node, *paths) -> dict:
    """lstat (+ sha256 of files, entries of directories) of each path as the node sees it."""
    r = node.run([sys.executable, "-c", _STAT, *paths])
    assert r.code == 0, r.stderr
    return json.loads(r.stdout)


def host_sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree_file(version, host_path) -> Path:
    f = next(f for f in catalogue(version) if f.path == host_path)
    return drivers.materialise(version) / drivers.tree_path(f)


def host_view() -> dict:
    """What a node must never change on the host: its /usr, /dev, /run and its mount table."""
    view = {}
    for d in ("/usr/bin", LIB64, LIB32, "/usr/lib/firmware", "/dev", "/run"):
        try:
            view[d] = sorted(n for n in os.listdir(d) if not n.startswith(ENGINE_STATE))
        except FileNotFoundError:
            view[d] = None
    view["mounts"] = sorted((m.mountpoint, m.options) for m in RealSys().mounts()
                            if not any(m.mountpoint == d or m.mountpoint.startswith(d + "/") for d in ENGINE_MOUNTS))
    return view


# A Docker Engine on the same host (the docker backend's tests, other jobs) mounts and unmounts
# container file systems and network namespaces at any time, and its own directories themselves
# (dockerd bind-mounts /var/lib/docker onto itself as it starts: CI 38 saw it appear while this test
# ran beside run-tests' daemon lane): not the node's doing.
ENGINE_STATE = ("docker", "containerd")
ENGINE_MOUNTS = ("/var/lib/docker", "/run/docker", "/run/containerd", "/var/lib/containerd")


def precreate_markers(targets: list[Target]) -> None:
    """The fix (REF-5), done from the host: a non-empty marker with the host file's exact mode."""
    for t in targets:
        os.makedirs(os.path.dirname(t.mountpoint), 0o755, exist_ok=True)
        fd = os.open(t.mountpoint, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, MARKER)
            os.fchmod(fd, stat.S_IMODE(t.file.mode))
        finally:
            os.close(fd)


def fail_at_socket(targets) -> str:
    """A failure injected late: every file target is mounted, the IPC socket's mount fails (CLI-8)."""
    return f"cli.before_mount={len(targets)}*off->return(EIO)"


SOCKET_FAILURE = ("nvidia-container-cli: mount error: mount operation failed: /run/nvidia-persistenced/socket: "
                  "input/output error")


# -- 1. what a node sees -------------------------------------------------------------------------

def test_node_sees_the_driver_at_host_paths_and_the_host_does_not(fleet, jail):
    """K-5 and section 5: inside a node the driver files are at their real host paths with the driver
    tree's bytes, /dev has the NVIDIA device nodes, /run the persistenced socket, and JAIL/dev, JAIL/run
    show the node-local ones (REF-3). The host sees none of it: its /usr, /dev, /run and mount table are
    unchanged and the jail's dev/ and run/ stay empty (INV-3, INV-6)."""
    ml = f"{LIB64}/libnvidia-ml.so.{VERSION}"
    fw = f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"
    if os.path.lexists(ml):
        pytest.skip(f"this host has an NVIDIA driver of its own ({ml}): the fixture world assumes a GPU-less host")
    before = host_view()
    node = fleet.start("a")
    seen = node_stat(node, ml, "/usr/bin/nvidia-smi", fw, SOCKET, "/dev/nvidiactl", "/dev/nvidia0", "/dev/null",
                     f"{jail}/dev", f"{jail}/dev/nvidia1", f"{jail}/run/nvidia-persistenced/socket")
    for path in (ml, "/usr/bin/nvidia-smi", fw):
        assert seen[path]["sha256"] == host_sha256(tree_file(VERSION, path)), path
        assert seen[path]["size"] > 1024
    assert stat.S_ISSOCK(seen[SOCKET]["mode"]) and stat.S_ISSOCK(seen[f"{jail}{SOCKET}"]["mode"])
    for dev in ("/dev/nvidiactl", "/dev/nvidia0", f"{jail}/dev/nvidia1", "/dev/null"):
        assert stat.S_ISCHR(seen[dev]["mode"]), dev
    if os.getuid() == 0:   # with mknod: the real numbers; in a user namespace a /dev/null stands in
        assert seen["/dev/nvidiactl"]["rdev"] == [195, 255] and seen["/dev/nvidia0"]["rdev"] == [195, 0]
    assert {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia0", "nvidia1", "null"} <= set(
        seen[f"{jail}/dev"]["entries"])

    assert not os.path.lexists(ml) and not os.path.lexists(fw) and not os.path.lexists(SOCKET)
    assert os.listdir(jail / "dev") == [] and os.listdir(jail / "run") == []
    assert node.cli("list").code == 0
    assert host_view() == before


# -- 2. list -------------------------------------------------------------------------------------

def expected_list(version) -> dict[str, list[str]]:
    have = {f.path for f in catalogue(version)}
    gpus = sorted((f.path for f in catalogue(version) if f.kind == "device" and f.path[len("/dev/nvidia"):].isdigit()),
                  key=lambda p: int(p[len("/dev/nvidia"):]))
    return {
        "devices": [p for p in CLI_DEVICE_ORDER if p in have] + gpus,
        "binaries": [p for b in CLI_BINARY_ORDER if (p := f"/usr/bin/{b}") in have],
        "libraries": [p for n in CLI_LIBRARY_ORDER if (p := f"{LIB64}/{n}.so.{version}") in have],
        "libraries32": [p for n in CLI_LIBRARY_ORDER if (p := f"{LIB32}/{n}.so.{version}") in have],
        "ipcs": [SOCKET],
        "firmwares": sorted(f.path for f in catalogue(version) if f.kind == "firmware"),
    }


def test_list_prints_host_paths_in_the_clis_section_order(fleet):
    """CLI-2: `list` prints devices, binaries, libraries, 32-bit libraries, IPC sockets, firmware (as
    /lib/firmware/..., unresolved), each in the real CLI's own order; any option turns the defaults off
    (`--libraries` alone: no 32-bit libraries; `--compat32` alone: nothing). REF-1: a node on the newer
    driver lists its new library, the old one does not."""
    old, new = fleet.start("old", version=VERSION), fleet.start("new", version=NEW_VERSION)
    for node, version in ((old, VERSION), (new, NEW_VERSION)):
        want = expected_list(version)
        r = node.cli("list")
        assert (r.code, r.stderr) == (0, "")
        assert r.stdout.splitlines() == [p for section in want.values() for p in section]
        assert node.cli("list", "--libraries").stdout.splitlines() == want["libraries"]
        assert node.cli("list", "--libraries", "--compat32").stdout.splitlines() == (
            want["libraries"] + want["libraries32"])
        assert node.cli("list", "--compat32").stdout == ""
        assert node.cli("list", "-bif").stdout.splitlines() == want["binaries"] + want["ipcs"] + want["firmwares"]
        assert node.cli("list", "--device=1").stdout.splitlines() == want["devices"][:4] + ["/dev/nvidia1"]
    gpucomp = f"{LIB64}/libnvidia-gpucomp.so.{NEW_VERSION}"
    assert gpucomp in new.cli("list", "--libraries").stdout.splitlines()
    assert "libnvidia-gpucomp" not in old.cli("list").stdout


# -- 3. configure, cold and warm -----------------------------------------------------------------

def test_configure_cold_creates_empty_placeholders_and_mounts_read_only(fleet, jail):
    """CLI-3/4/5: on a cold jail `configure` creates each missing target as a 0-byte file (the host sees
    only those: mounts live in the node's namespace), bind-mounts the host file over it read-only, and a
    job on that node reads the host's bytes and loads the libraries. The IPC socket stays writable.
    CLI-4: a second worker on the now warm jail finds every target with the right mode and creates
    nothing (no cli.create, no cli.mkdir), and the jail does not change."""
    a = fleet.start("a")
    r = configure(a)
    assert (r.code, r.stdout, r.stderr) == (0, "", "")
    targets = file_targets(jail)
    links = {f"{jail}{LIB64}/libcuda.so"}   # the CLI's own symlink (symlink_libraries), not a target
    assert {e["path"] for e in events(fleet, "cli.create", "a")} == {t.cli_path for t in targets} | links
    assert [e["path"] for e in events(fleet, "cli.mkdir", "a")] == [
        f"{jail}/usr/lib/firmware", f"{jail}/usr/lib/firmware/nvidia", f"{jail}/usr/lib/firmware/nvidia/{VERSION}"]
    for t in targets:
        st = os.lstat(t.mountpoint)
        assert stat.S_ISREG(st.st_mode) and st.st_size == 0, t.mountpoint
        assert st.st_mode == t.file.mode, t.mountpoint   # created with the source's mode (umask 022)

    options = {m["mountpoint"]: m["options"].split(",") for m in a.mounts()}  # the last (top) mount wins
    for t in targets:
        assert "ro" in options[t.mountpoint], (t.mountpoint, options.get(t.mountpoint))
    for dev in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1"):
        assert "ro" in options[f"{jail}/dev/{dev}"], dev
    assert "rw" in options[f"{jail}{SOCKET}"]
    mounted = {e["dst"] for e in events(fleet, "cli.mount", "a")}
    assert f"{jail}/dev/nvidia-modeset" not in mounted       # only with --display

    for res, t in zip(a.probe([t.probe() for t in targets]), targets):
        assert res["attached"] and res["same_bytes"], res
        assert res["size"] == os.path.getsize(tree_file(VERSION, t.file.path)) > 1024
        if t.file.kind == "library":
            assert res["loader"] == "ok", res

    warm = snapshot(jail)
    b = fleet.start("b")
    assert configure(b).code == 0
    assert events(fleet, "cli.create", "b") == [] and events(fleet, "cli.mkdir", "b") == []
    assert len(events(fleet, "cli.mount", "b")) == len(events(fleet, "cli.mount", "a"))
    assert snapshot(jail) == warm
    assert all(res["attached"] and res["same_bytes"] for res in b.probe([t.probe() for t in targets]))


# -- 4. and 5. the cleanup damage and the fix ----------------------------------------------------

def test_failed_cli_unlinks_empty_placeholders_and_detaches_other_nodes(fleet, jail):
    """Seed 000, second half (CLI-6 + K-1): A configures fine over 0-byte placeholders its own CLI made.
    B's CLI then fails late (the socket mount, after all file targets are mounted); its cleanup unmounts
    its own mounts and unlinks every 0-byte target. Unlinking a file that is a mount point in *another*
    namespace succeeds and detaches those mounts: A's libraries are gone (`cannot open shared object
    file`), and once some CLI recreates a 0-byte placeholder A's loader says `file too short`."""
    a, b = fleet.start("a"), fleet.start("b")
    targets = file_targets(jail)
    assert configure(a).code == 0
    links = {f"{jail}{LIB64}/libcuda.so"}   # the CLI's own symlink (symlink_libraries), not a target
    assert {e["path"] for e in events(fleet, "cli.create", "a")} == {t.cli_path for t in targets} | links
    assert all(os.path.getsize(t.mountpoint) == 0 for t in targets)

    r = configure(b, fail_at_socket(targets))
    assert (r.code, r.error_line) == (1, SOCKET_FAILURE)
    [fired] = [e for e in events(fleet, "failpoint", "b") if e["action"] == "return"]
    assert (fired["name"], fired["hit"], fired["path"]) == ("cli.before_mount", len(targets) + 1, f"{jail}{SOCKET}")

    # What A's jobs see now: every file detached, the libraries unloadable.
    for res, t in zip(a.probe([t.probe() for t in targets]), targets):
        assert not res["attached"] and res["size"] is None, res
        if t.file.kind == "library":
            assert "cannot open shared object file" in res["loader"], res
    # Why: B's cleanup unlinked the shared 0-byte placeholders (after unmounting its own mounts).
    assert not any(os.path.lexists(t.mountpoint) for t in targets)
    # (and its own node-local socket: mount_ipc undoes its own target when its bind fails, CLI-6)
    assert {e["path"] for e in events(fleet, "cli.cleanup.unlink", "b")} == {t.cli_path for t in targets} | {
        f"{jail}{SOCKET}"}
    assert not {t.mountpoint for t in targets} & {m["mountpoint"] for m in b.mounts()}

    ml = next(t for t in targets if t.file.path.endswith(f"libnvidia-ml.so.{VERSION}"))
    open(ml.mountpoint, "w").close()        # some CLI recreates a 0-byte placeholder
    [res] = a.probe([ml.probe()])
    assert not res["attached"] and res["size"] == 0
    assert "file too short" in res["loader"], res


def test_non_empty_markers_survive_a_failed_cli_and_other_nodes_keep_their_mounts(fleet, jail):
    """The fix of seed 000 (REF-5) against CLI-4/CLI-6: with every placeholder pre-created as a 26-byte
    marker with the host file's exact mode, A's CLI creates nothing; B's late failure unmounts its own
    mounts but keeps the markers (cleanup only deletes empty files), so A stays intact: attached, the
    host's bytes, loadable."""
    a, b = fleet.start("a"), fleet.start("b")
    targets = file_targets(jail)
    precreate_markers(targets)
    assert configure(a).code == 0
    # Only the CLI's own libcuda.so symlink is created (symlink_libraries), no target.
    assert [e["path"] for e in events(fleet, "cli.create", "a")] == [f"{jail}{LIB64}/libcuda.so"]
    assert events(fleet, "cli.mkdir", "a") == []

    r = configure(b, fail_at_socket(targets))
    assert (r.code, r.error_line) == (1, SOCKET_FAILURE)

    # What A's jobs see: everything still attached, the host's bytes, loadable.
    for res in a.probe([t.probe() for t in targets]):
        assert res["attached"] and res["same_bytes"] and res["size"] > 1024, res
        assert res.get("loader", "ok") == "ok", res
    # Why: B's cleanup unmounted its own mounts and kept every non-empty marker.
    assert all(Path(t.mountpoint).read_bytes() == MARKER for t in targets)
    assert [e["path"] for e in events(fleet, "cli.cleanup.unlink", "b")] == [f"{jail}{SOCKET}"]   # B's own node-local socket
    kept = {e["path"]: e["size"] for e in events(fleet, "cli.cleanup.keep", "b")}
    assert kept == {t.cli_path: len(MARKER) for t in targets}
    assert not {t.mountpoint for t in targets} & {m["mountpoint"] for m in b.mounts()}


# -- 6. the creation race ------------------------------------------------------------------------

def test_cold_start_mkdir_race_fails_the_losers_with_file_exists(fleet, jail, run_dir):
    """Seed 000, first half (CLI-4): 8 workers start at once on a cold jail. Every CLI mounts the
    binaries and libraries (their directories exist), then stops at its first mkdir: JAIL/usr/lib/firmware,
    the first missing ancestor of the firmware target (the image has no usr/lib/firmware). Released
    together, one mkdir wins and the other seven fail with EEXIST, reported against the *leaf* target:
    `mount error: file creation failed: <...>/gsp_ga10x.bin: file exists`, exit 1. Their cleanup then
    unlinks the 0-byte placeholders under the winner, which reported success with its libraries
    detached (the second half, K-1). A loser's solo restart succeeds."""
    nodes = [fleet.start(f"w{i}") for i in range(8)]
    barrier = Barrier("race", directory=str(run_dir / "barriers"))
    with ThreadPoolExecutor(len(nodes)) as pool:
        try:
            runs = [pool.submit(configure, n, "cli.before_mkdir=1*pause(race)") for n in nodes]
            barrier.wait_arrivals(len(nodes))
        finally:
            barrier.release()    # never leave CLIs paused, even when the arrivals did not come
        results = [run.result() for run in runs]
    paused = {e["path"] for e in events(fleet, "failpoint") if e["action"] == "pause"}
    assert paused == {f"{jail}/usr/lib/firmware"}

    leaf = f"{jail}/usr/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin"
    losers = [(n, r) for n, r in zip(nodes, results) if r.code != 0]
    [winner] = [n for n, r in zip(nodes, results) if r.code == 0]
    assert len(losers) == len(nodes) - 1
    lost = f"nvidia-container-cli: mount error: file creation failed: {leaf}: file exists"
    for _, r in losers:
        assert (r.code, r.error_line) == (1, lost)

    ml = next(t for t in file_targets(jail) if t.file.path.endswith(f"libnvidia-ml.so.{VERSION}"))
    [res] = winner.probe([ml.probe()])
    assert not res["attached"] and "cannot open shared object file" in res["loader"], res

    loser = losers[0][0]
    assert configure(loser).code == 0
    assert all(r["attached"] and r["same_bytes"] for r in loser.probe([t.probe() for t in file_targets(jail)]))


# -- 7. bad input --------------------------------------------------------------------------------

def test_bad_input_fails_with_one_message_and_touches_nothing(fleet, jail, tmp_path):
    """CLI-1, CLI-8, INV-3: an unknown option, a rootfs that does not exist or is a file, a node without
    a driver (a CPU worker: NVML cannot be loaded) and a malformed failpoint spec each exit 1 with the
    CLI's message, and leave the jail (snapshot), the node's mounts and the history's file events as
    they were."""
    gpu, cpu = fleet.start("gpu"), fleet.start("cpu", role="cpu-worker")
    missing, a_file = tmp_path / "no-such-jail", jail / "etc/debian_version"
    cases = [
        (gpu, ("configure", "--frobnicate", "--compute", str(jail)), None,
         "nvidia-container-cli configure: unrecognized option '--frobnicate'"),
        (gpu, (*CONFIGURE, str(missing)), None,
         f"nvidia-container-cli: container error: stat failed: {missing}: no such file or directory"),
        (gpu, (*CONFIGURE, str(a_file)), None,
         f"nvidia-container-cli: container error: invalid rootfs directory: {a_file}: not a directory"),
        (cpu, (*CONFIGURE, str(jail)), None,
         ("nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: "
          "cannot open shared object file: no such file or directory")),
        (gpu, (*CONFIGURE, str(jail)), "cli.before_mkdir=1*frob",
         ("nvidia-container-cli: failpoint error: GPUJAIL_FAILPOINTS: cannot parse 'cli.before_mkdir=1*frob' "
          "at offset 0: unknown action 'frob'")),
    ]
    before = snapshot(jail)
    mounts = {n.node_id: sorted(m["mountpoint"] for m in n.mounts()) for n in (gpu, cpu)}
    for node, args, spec, message in cases:
        env = node.contract_env(extra={"GPUJAIL_FAILPOINTS": spec} if spec else None)
        r = node.cli(*args, env=env)
        assert r.code == 1 and r.stdout == "", (args, r)
        assert message in r.stderr.splitlines()[0], (args, r.stderr)
        assert snapshot(jail) == before, args
        assert sorted(m["mountpoint"] for m in node.mounts()) == mounts[node.node_id], args
    assert not missing.exists()
    touched = [e for e in fleet.history() if e["kind"] in ("cli.mkdir", "cli.create", "cli.mount")]
    assert touched == []


# -- 8. no residue -------------------------------------------------------------------------------

def residue(jail) -> list[str]:
    """Processes (other than this one) whose command line names the jail, and processes whose mount
    table holds something under it, this host's own included (INV-6)."""
    needle, me, found = str(jail).encode(), os.getpid(), []
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != me):
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(f"process {pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}")
            if needle + b"/" in Path(f"/proc/{pid}/mountinfo").read_bytes():
                found.append(f"mounts under the jail in process {pid}'s namespace")
        except OSError:     # gone meanwhile, or another user's
            continue
    if str(jail) + "/" in Path("/proc/self/mountinfo").read_text():
        found.append("mounts under the jail in the host's namespace")
    return found


def eventual_residue(jail, patience: float = 10.0) -> list[str]:
    """The residue once the kernel has had a moment to reap what was killed (no duration asserted)."""
    deadline = time.monotonic() + patience
    while (left := residue(jail)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def test_nothing_left_after_the_fleet_exits(fleet, jail):
    """INV-6: leaving the Fleet kills every node; with them go their processes, namespaces and mounts."""
    a = fleet.start("a")
    fleet.start("b")
    assert configure(a).code == 0
    # the nodes' processes, seen by the mounts in their namespaces (forked nodes carry the factory's command line)
    assert len([r for r in residue(jail) if "mounts under the jail in process" in r]) >= 2
    fleet.__exit__(None, None, None)     # what the fixture does at teardown, now
    assert eventual_residue(jail) == []
    assert all(n.proc.poll() is not None for n in fleet.nodes)


_HARNESS = """
import sys, time
sys.path.insert(0, sys.argv[1])
from gpujail.backends import kernel

with kernel.Fleet(sys.argv[2], {"GPUJAIL_NODE": "orphan"}) as fleet:
    node = fleet.start("orphan")
    r = node.cli("configure", "--compute", "--utility", "--device=all", "--ldconfig=/usr/bin/true", sys.argv[2])
    print("configured" if r.code == 0 else r.stderr, flush=True)
    time.sleep(600)
"""


def test_nothing_left_after_the_harness_is_sigkilled(fleet, tmp_path):
    """INV-6: a harness SIGKILLed mid-run gets no chance to clean up; its nodes die with it (parent-death
    signal, PID namespace), and their namespaces and mounts with them."""
    jail = make_jail(tmp_path / "orphaned-jail")
    harness = subprocess.Popen([sys.executable, "-c", _HARNESS, str(REPO), str(jail)], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        assert harness.stdout.readline() == "configured\n"
        assert any("mounts" in r for r in residue(jail))
    finally:
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
        harness.stdout.close()
    assert eventual_residue(jail) == []
