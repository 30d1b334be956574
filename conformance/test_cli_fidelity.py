"""The fake `nvidia-container-cli` and the kernel facts the suite stands on: SPEC CLI-1..CLI-8 and
K-1, K-3, K-4, K-5 (K-2 needs a network file system and is not checked here).

Vendors' implementations call the fake exactly as they would call the real CLI, so its fidelity is
a precondition of conformance: these are the harness's self-checks (marker `self_check`), reported
in their own table and never counted for or against an implementation. They run the fake directly
in kernel-backend nodes (they do not depend on --impl) and judge from outside: exit codes and
stderr, the jail as the host sees it, the node's mount table, the recorded history, and what a job
in a node sees through the jail.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpujail.backends.probes import gpu_files
from gpujail.fixtures import drivers
from gpujail.fixtures import jail as jail_image
from gpujail.fixtures.nvc_info import gpu_uuid
from gpujail.world.failpoints import REGISTRY, Barrier

# Harness self-checks: run first, once per host and code version, and never counted for or against
# an implementation (gpujail/plugin/collection.py).
pytestmark = [pytest.mark.kernel, pytest.mark.self_check]
VERSION = drivers.DEFAULT_VERSION
LIB, LIB32 = "usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu"
CONFIGURE = ("configure", "--compute", "--utility", "--device=all", "--ldconfig=/usr/bin/true")
MARKER = b"gpujail marker, see REF-5\n"      # a non-empty placeholder, as the fix writes (REF-5)
FILE_MODE = stat.S_IFREG | 0o644             # the host mode of every driver library
CONTROL_DEVICES = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
FIRST_FIRMWARE = min(os.path.basename(f.path) for f in drivers.catalogue(VERSION) if f.kind == "firmware")
assert len(MARKER) == 26


def configure(node, jail, *extra: str, failpoints: str | None = None):
    """`configure --compute --utility --device=all --ldconfig=/usr/bin/true [extra] JAIL` in `node`."""
    env = node.contract_env(extra={"GPUJAIL_FAILPOINTS": failpoints} if failpoints else None)
    return node.cli(*CONFIGURE, *extra, str(jail), env=env)


def lib(jail, name: str) -> str:
    return f"{jail}/{LIB}/{name}.so.{VERSION}"


def put(path: str, data: bytes, mode: int = FILE_MODE) -> None:
    """A placeholder written from the host (the shared layer), with `mode`."""
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, stat.S_IMODE(mode))


def mount_options(node) -> dict[str, set[str]]:
    """Mount point -> options as the node sees them (the top mount wins)."""
    return {m["mountpoint"]: set(m["options"].split(",")) for m in node.mounts()}


def file_events(world) -> list[dict]:
    return [e for e in world.history() if e["kind"] in ("cli.mkdir", "cli.create", "cli.mount")]


def stderr_lines(r) -> list[str]:
    return [ln for ln in r.stderr.splitlines() if ln.strip()]


# -- CLI-1 grammar ------------------------------------------------------------------------------

def _try(prog: str) -> str:
    return f"Try `{prog} --help' or `{prog} --usage' for more information."


MAIN, CONF, LIST = "nvidia-container-cli", "nvidia-container-cli configure", "nvidia-container-cli list"
BAD_COMMAND_LINES = [   # (argv after the program name, the exact stderr lines); {jail} is substituted
    ([], [f"Usage: {MAIN} [OPTION...] COMMAND [ARG...]", _try(MAIN)]),
    (["frobnicate"], [f"Usage: {MAIN} [OPTION...] COMMAND [ARG...]", _try(MAIN)]),
    (["--frobnicate", "list"], [f"{MAIN}: unrecognized option '--frobnicate'", _try(MAIN)]),
    (["--user", "1000", "list"], [f"Usage: {MAIN} [OPTION...] COMMAND [ARG...]", _try(MAIN)]),  # optional arg: attached only
    (["list", "extra"], [f"{LIST}: Too many arguments", _try(LIST)]),
    (["configure", "--frobnicate", "--compute", "{jail}"], [f"{CONF}: unrecognized option '--frobnicate'", _try(CONF)]),
    (["configure", "--comp", "{jail}"],
     [f"{CONF}: option '--comp' is ambiguous; possibilities: '--compute' '--compat32'", _try(CONF)]),
    (["configure", "--compute=yes", "{jail}"], [f"{CONF}: option '--compute' doesn't allow an argument", _try(CONF)]),
    (["configure", "--compute", "--ldconfig"], [f"{CONF}: option '--ldconfig' requires an argument", _try(CONF)]),
    (["configure", "--compute"], [f"Usage: {CONF} [OPTION...] ROOTFS", _try(CONF)]),
    (["configure", "--compute", "--utility", "jail"], [f"{MAIN}: input error: invalid rootfs directory"]),
    (["configure", "--compute", "--utility", "/"], [f"{MAIN}: input error: invalid rootfs directory"]),
]


@pytest.mark.req("CLI-1")
def test_bad_command_lines_exit_1_and_touch_nothing(world):
    """Usage errors print argp's message and the `Try ...` line and exit 1 (not argp's 64); a rootfs
    that is relative or `/` is refused in one line. Nothing is touched: the jail, the node's mounts
    and the history's file events stay as they were. (Called by name through PATH, as runtimes do:
    glibc's getopt prefixes its own messages with argv[0] as given.)"""
    node = world.node("a")
    before, mounts = jail_image.snapshot(world.jail), sorted(m["mountpoint"] for m in node.mounts())
    for argv, want in BAD_COMMAND_LINES:
        argv = [a.format(jail=world.jail) for a in argv]
        r = node.run(["nvidia-container-cli", *argv])
        assert (r.code, r.stdout, r.stderr.splitlines()) == (1, "", want), argv
        assert jail_image.snapshot(world.jail) == before, argv
    assert sorted(m["mountpoint"] for m in node.mounts()) == mounts
    assert file_events(world) == []


@pytest.mark.req("CLI-1")
def test_grammar_callers_rely_on_is_accepted(world):
    """`--version` prints `cli-version:`/`lib-version:` and exits 0; global options before the
    command (an optional argument attached: `-u1000`, `--user=0:0`); long options by unique prefix;
    configure's options permuted around ROOTFS."""
    node = world.node("a")
    r = node.cli("--version")
    assert r.code == 0 and r.stdout.splitlines()[:2] == ["cli-version: 1.18.0", "lib-version: 1.18.0"], r
    libraries = node.cli("list", "--libraries").stdout
    assert libraries and all(node.cli(*argv).stdout == libraries for argv in
                             (["-u1000", "-k", "list", "--lib"], ["--user=0:0", "list", "-l"]))
    r = node.cli("configure", str(world.jail), "--compu", "--util", "--device=all", "--ldconfig=/usr/bin/true")
    assert (r.code, r.stderr) == (0, "")
    assert os.path.realpath(lib(world.jail, "libcuda")) in mount_options(node)


# -- CLI-2 list ---------------------------------------------------------------------------------

SECTIONS = ["devices", "binaries", "libraries", "libraries32", "ipcs", "firmwares"]


def section(path: str) -> str:
    for prefix, name in (("/dev/", "devices"), ("/usr/bin/", "binaries"), (f"/{LIB}/", "libraries"),
                         (f"/{LIB32}/", "libraries32"), ("/run/", "ipcs"), ("/lib/firmware/", "firmwares")):
        if path.startswith(prefix):
            return name
    raise AssertionError(f"`list` printed {path!r}, which belongs to no section")


@pytest.mark.req("CLI-2")
def test_list_sections_order_and_options(world):
    """`list` prints absolute host paths in the CLI's section order (devices, binaries, libraries,
    32-bit libraries, IPC sockets, firmware printed unresolved as /lib/firmware/...), control devices
    first and utility libraries before compute ones, only files of this driver version. Options
    select sections, and any option turns the defaults off (`--compat32` alone prints nothing)."""
    node = world.node("a")
    r = node.cli("list")
    assert (r.code, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    order = [SECTIONS.index(section(p)) for p in lines]
    assert order == sorted(order) and set(order) == set(range(len(SECTIONS))), lines
    by = {s: [p for p in lines if section(p) == s] for s in SECTIONS}
    assert by["devices"] == CONTROL_DEVICES + ["/dev/nvidia0", "/dev/nvidia1"]
    assert all(p.endswith(f".so.{VERSION}") for p in by["libraries"] + by["libraries32"])
    names = [os.path.basename(p).split(".so.")[0] for p in by["libraries"]]
    utility = [names.index(n) for n in ("libnvidia-ml", "libnvidia-cfg")]
    compute = [names.index(n) for n in ("libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-ptxjitcompiler",
                                        "libnvidia-nvvm")]
    assert utility == [0, 1] and max(utility) < min(compute) and compute == sorted(compute), names
    assert by["ipcs"] == ["/run/nvidia-persistenced/socket"]
    assert by["firmwares"] == sorted(by["firmwares"]) and by["firmwares"][0] == f"/lib/firmware/nvidia/{VERSION}/{FIRST_FIRMWARE}"

    def listed(*options: str) -> list[str]:
        r = node.cli("list", *options)
        assert (r.code, r.stderr) == (0, ""), options
        return r.stdout.splitlines()

    assert listed("--libraries") == by["libraries"]
    assert listed("--libraries", "--compat32") == by["libraries"] + by["libraries32"]
    assert listed("--compat32") == []
    assert listed("-bif") == by["binaries"] + by["ipcs"] + by["firmwares"]
    assert listed("--device=1") == CONTROL_DEVICES + ["/dev/nvidia1"]


# -- CLI-3 destinations -------------------------------------------------------------------------

def destination(jail, src: str, debian: bool = True) -> str:
    """SPEC CLI-3, as the CLI names the target: resolved inside the jail, so firmware's /lib/...
    goes through the jail's own `lib -> usr/lib`."""
    base = os.path.basename(src)
    if src.startswith(f"/{LIB}/"):
        return f"{jail}/{LIB if debian else 'usr/lib64'}/{base}"
    if src.startswith(f"/{LIB32}/"):
        return f"{jail}/{LIB32 if debian else 'usr/lib'}/{base}"
    if src.startswith("/usr/bin/"):
        return f"{jail}/usr/bin/{base}"
    if src.startswith("/lib/"):
        return f"{jail}/usr{src}"
    return f"{jail}{src}"


@pytest.mark.req("CLI-3")
def test_destinations_in_a_debian_rootfs(world):
    """Libraries are flattened into usr/lib/x86_64-linux-gnu (32-bit ones into
    usr/lib/i386-linux-gnu), binaries land in usr/bin, firmware, the IPC socket and device nodes at
    ROOTFS + host path, every one resolved inside the jail (mount_in_root): the firmware target is
    JAIL/usr/lib/firmware/..., through the jail's own `lib -> usr/lib` (1.15 named it by a plain
    join, JAIL/lib/firmware/...); the mount table shows it there, and the host sees the placeholder there."""
    node = world.node("a")
    r = configure(node, world.jail, "--compat32")
    assert (r.code, r.stderr) == (0, "")
    mounted = {e["src"]: e["dst"] for e in world.events("cli.mount", node="a")}
    assert {section(src) for src in mounted} == set(SECTIONS)
    assert {src: destination(world.jail, src) for src in mounted} == mounted
    options = mount_options(node)
    assert all(os.path.realpath(dst) in options for dst in mounted.values())
    fw = f"/lib/firmware/nvidia/{VERSION}/{FIRST_FIRMWARE}"
    assert mounted[fw] == f"{world.jail}/usr{fw}"
    assert f"{world.jail}/usr{fw}" in options
    assert (world.jail / f"usr{fw}").stat().st_size == 0
    assert not [e for e in world.events("cli.mkdir") if e["path"].startswith(f"{world.jail}/{LIB}/")]


@pytest.mark.req("CLI-3")
def test_destinations_without_debian_version(world):
    """Without ROOTFS/etc/debian_version the libraries go to usr/lib64 instead; binaries still go
    to usr/bin."""
    (world.jail / "etc/debian_version").unlink()
    node = world.node("a")
    assert configure(node, world.jail).code == 0
    mounted = {e["src"]: e["dst"] for e in world.events("cli.mount", node="a")}
    assert {src: destination(world.jail, src, debian=False) for src in mounted} == mounted
    assert os.path.basename(mounted[f"/{LIB}/libnvidia-ml.so.{VERSION}"]) == f"libnvidia-ml.so.{VERSION}"
    assert (world.jail / f"usr/lib64/libnvidia-ml.so.{VERSION}").exists()


# -- CLI-4 file creation ------------------------------------------------------------------------

@pytest.mark.req("CLI-4")
def test_create_is_skipped_only_on_the_exact_mode(world):
    """An existing target with exactly the host file's st_mode is left alone (no create); one with
    another mode is opened again with O_CREAT, but never truncated (its bytes and mode survive: no
    O_TRUNC, no chmod). Either way the mount goes over it."""
    ml, cfg = lib(world.jail, "libnvidia-ml"), lib(world.jail, "libnvidia-cfg")
    put(ml, MARKER, FILE_MODE)
    put(cfg, MARKER, stat.S_IFREG | 0o600)
    node = world.node("a")
    assert configure(node, world.jail).code == 0
    created = {e["path"] for e in world.events("cli.create", node="a")}
    assert ml not in created and cfg in created
    for path, mode in ((ml, FILE_MODE), (cfg, stat.S_IFREG | 0o600)):
        assert open(path, "rb").read() == MARKER and os.stat(path).st_mode == mode, path
    options = mount_options(node)
    assert ml in options and cfg in options


@pytest.mark.req("CLI-4")
def test_mode_comparison_includes_the_file_type(world):
    """A directory with the library's permission bits (0644) at a library target is not "the
    wanted mode" (type bits differ): the CLI tries to create the file there and fails on it."""
    ml = lib(world.jail, "libnvidia-ml")
    os.mkdir(ml)
    os.chmod(ml, 0o644)
    r = configure(world.node("a"), world.jail)
    assert (r.code, stderr_lines(r)) == (1, [f"nvidia-container-cli: mount error: file creation failed: {ml}: is a directory"])


@pytest.mark.req("CLI-3")
def test_jail_symlinks_resolve_inside_the_jail_and_never_out(world, tmp_path):
    """Issue 16 point 1 (mount_in_root): a target whose last component is an absolute link to a
    host directory lands at that path *inside* the jail, nothing is created on the host; a target
    whose `..` would climb out of the jail is the CLI's `path error`, and nothing is created."""
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(f"{outside}/nvidia-smi", world.jail / "usr/bin/nvidia-smi")
    os.symlink(str(outside), world.jail / "usr/lib/firmware")     # lib/firmware -> a host directory
    node = world.node("a")
    r = configure(node, world.jail)
    assert (r.code, r.stderr) == (0, ""), r
    mounted = {e["src"]: e["dst"] for e in world.events("cli.mount", node="a")}
    assert mounted["/usr/bin/nvidia-smi"] == f"{world.jail}{outside}/nvidia-smi"
    fw = f"/lib/firmware/nvidia/{VERSION}/{FIRST_FIRMWARE}"
    assert mounted[fw] == f"{world.jail}{outside}/nvidia/{VERSION}/{FIRST_FIRMWARE}"
    assert os.listdir(outside) == []
    os.unlink(world.jail / "usr/bin/nvidia-smi")
    os.symlink("../../../../nvidia-smi", world.jail / "usr/bin/nvidia-smi")
    r = configure(world.node("b"), world.jail)
    assert r.code == 1 and stderr_lines(r) == [
        f"nvidia-container-cli: mount error: path error: /usr/bin/nvidia-smi resolves outside of {world.jail}"], r
    assert not os.path.lexists(world.jail.parent / "nvidia-smi") and os.listdir(outside) == []


@pytest.mark.req("CLI-4", "CLI-8")
def test_existence_check_does_not_follow_a_final_symlink(world):
    """Issue 16 point 1 (file_mode_nofollow): a target swapped for a symlink after the CLI resolved
    it is not "existing with the wanted mode" even when the link points at a file of exactly that
    mode: open(O_NOFOLLOW|O_CREAT) meets the link, ELOOP is reported as `file exists`, and nothing is
    mounted through the link. (1.15's stat followed it, skipped the create and mounted over the decoy.)"""
    decoy = world.jail / "usr/bin/decoy"
    put(str(decoy), MARKER, stat.S_IFREG | 0o755)
    node = world.node("a")
    barrier = Barrier("swap", directory=world.barriers)
    with ThreadPoolExecutor(1) as pool:
        try:
            run = pool.submit(configure, node, world.jail, failpoints="cli.before_mount=1*pause(swap)")
            barrier.wait_arrivals(1)
            second = world.jail / "usr/bin/nvidia-debugdump"       # the second binary's target
            os.symlink("decoy", second)
        finally:
            barrier.release()
        r = run.result()
    assert (r.code, stderr_lines(r)) == (1, [f"nvidia-container-cli: mount error: file creation failed: "
                                             f"{second}: file exists"]), r
    assert str(decoy) not in mount_options(node) and open(decoy, "rb").read() == MARKER


@pytest.mark.req("CLI-4")
def test_existing_directories_of_another_mode_are_tolerated(world):
    """Issue 16 point 2: the per-batch directories (bins, libs, libs32) go through file_create as
    directories, EEXIST tolerated: an existing usr/bin of mode 0700 is kept as it is and the run goes
    on; a missing usr/lib/i386-linux-gnu is created as a target of its own, mode 0755."""
    os.chmod(world.jail / "usr/bin", 0o700)
    node = world.node("a")
    r = configure(node, world.jail, "--compat32")
    assert (r.code, r.stderr) == (0, ""), r
    assert stat.S_IMODE(os.stat(world.jail / "usr/bin").st_mode) == 0o700
    created = [(e["path"], e["mode"]) for e in world.events("cli.create", node="a")]
    assert f"{world.jail}/usr/bin" not in [path for path, _ in created]
    assert (f"{world.jail}/{LIB32}", oct(stat.S_IFDIR | 0o755)) in created
    assert stat.S_IMODE(os.stat(world.jail / LIB32).st_mode) == 0o755


@pytest.mark.req("CLI-4", "CLI-8")
def test_mkdir_race_fails_the_losers_with_file_exists(world):
    """Four CLIs paused at their first mkdir (the missing JAIL/usr/lib/firmware) and released together:
    one mkdir wins, the three others fail with EEXIST, reported against the *leaf* target."""
    nodes = [world.node(f"w{i}") for i in range(4)]
    barrier = Barrier("race", directory=world.barriers)
    with ThreadPoolExecutor(len(nodes)) as pool:
        try:
            runs = [pool.submit(configure, n, world.jail, failpoints="cli.before_mkdir=1*pause(race)") for n in nodes]
            barrier.wait_arrivals(len(nodes))
        finally:
            barrier.release()    # never leave CLIs paused
        results = [run.result() for run in runs]
    assert {e["path"] for e in world.events("failpoint", action="pause")} == {f"{world.jail}/usr/lib/firmware"}
    leaf = f"{world.jail}/usr/lib/firmware/nvidia/{VERSION}/{FIRST_FIRMWARE}"
    assert sorted(r.code for r in results) == [0, 1, 1, 1]
    for r in (r for r in results if r.code):
        assert stderr_lines(r) == [f"nvidia-container-cli: mount error: file creation failed: {leaf}: file exists"]


# -- CLI-5 mounting -----------------------------------------------------------------------------

@pytest.mark.req("CLI-5")
def test_mounts_are_read_only_and_in_the_callers_namespace_only(world):
    """Every file target is bind-mounted read-only (nosuid, nodev), device nodes are bind-mounted
    too; a job on the node reads the host's bytes and cannot write them. Another node, and the host,
    see none of it: only the 0-byte placeholders."""
    a, b = world.node("a"), world.node("b")
    assert configure(a, world.jail).code == 0
    files = gpu_files(world.jail)
    options = mount_options(a)
    for f in files:
        assert {"ro", "nosuid", "nodev"} <= options[os.path.realpath(f["path"])], f["path"]
    assert "ro" in options[f"{world.jail}/dev/nvidia0"] and "ro" in options[f"{world.jail}/dev/nvidiactl"]
    assert all(r["attached"] and r["same_bytes"] for r in a.probe(files))
    cuda = lib(world.jail, "libcuda")
    w = a.run(["sh", "-c", f"echo x >> '{cuda}'"])
    assert w.code != 0 and "Read-only file system" in w.stderr

    theirs = {m["mountpoint"] for m in b.mounts()}
    assert not theirs & {os.path.realpath(f["path"]) for f in files}
    assert all(not r["attached"] and r["size"] == 0 for r in b.probe(files))
    assert str(world.jail) + "/" not in open("/proc/self/mountinfo").read()
    assert all(os.path.getsize(f["path"]) == 0 for f in files)


@pytest.mark.req("CLI-5")
def test_standalone_mounts_land_in_the_parents_namespace(world):
    """Without `--pid` the CLI mounts in its *parent's* mount namespace, which it finds at
    ROOTFS/proc/<ppid> (nvc_container.c `find_namespace_path`; each node has its own proc on
    JAIL/proc), not in the one it was started in. Exec'd under `unshare -m` by the node, its mounts
    are the node's. Exec'd back into the node (`nsenter`) by a parent in a private namespace, they
    land in the parent's namespace and die with it: the node has none, only the placeholders."""
    a, b = world.node("a"), world.node("b")
    files = gpu_files(world.jail)
    mine = a.run(["unshare", "--mount", "nvidia-container-cli", *CONFIGURE, str(world.jail)])
    assert mine.code == 0, mine
    assert all(r["attached"] and r["same_bytes"] for r in a.probe(files)), \
        "CLI-5: a CLI exec'd in a private mount namespace by the node did not mount in the node's (its parent's)"

    helper = ["unshare", "--mount", "--fork", "nsenter", f"--mount={world.jail}/proc/1/ns/mnt", "--"]
    theirs = b.run([*helper, "nvidia-container-cli", *CONFIGURE, str(world.jail)])
    assert theirs.code == 0, theirs
    assert not any(r["attached"] for r in b.probe(files)), \
        "CLI-5: a CLI whose parent lives in another mount namespace mounted in its own (the node's)"
    assert all(os.path.getsize(f["path"]) == 0 for f in files)
    entered = [e["path"] for e in world.history() if e["kind"] == "cli.setns"]
    assert len(entered) == 2 and entered[1] != f"{world.jail}/proc/1/ns/mnt", entered   # unshare's, not the node's


@pytest.mark.req("CLI-5", "CLI-1")
def test_container_process_out_of_view_is_an_error(world, tmp_path):
    """A parent outside the CLI's PID namespace is ppid 0 (getppid(2)): `nvc_container_new` refuses
    pid 0 (`validate_args`). A rootfs without a proc of its own, or a `--pid` of no process, fails
    `lookup_owner`'s stat. Each before touching anything: nothing created or mounted."""
    a = world.node("a")
    bare = tmp_path / "no-proc-rootfs"
    (bare / "proc").mkdir(parents=True)
    before, mounts = jail_image.snapshot(world.jail), sorted(m["mountpoint"] for m in a.mounts())
    for prefix, extra, rootfs, error in (
            (["unshare", "--pid", "--fork"], [], world.jail, "container error: invalid argument"),
            ([], [], bare, f"container error: stat failed: {bare}/proc/1: no such file or directory"),
            ([], ["--pid=2147483647"], world.jail,
             "container error: stat failed: /proc/2147483647: no such file or directory")):
        r = a.run([*prefix, "nvidia-container-cli", *CONFIGURE, *extra, str(rootfs)])
        assert (r.code, stderr_lines(r)) == (1, [f"nvidia-container-cli: {error}"]), (prefix, extra, r)
    assert jail_image.snapshot(world.jail) == before
    assert sorted(m["mountpoint"] for m in a.mounts()) == mounts
    assert file_events(world) == []


# -- CLI-6 failure cleanup ----------------------------------------------------------------------

@pytest.mark.req("CLI-6")
def test_cleanup_unmounts_and_unlinks_only_empty_files(world):
    """A configure that fails after mounting the binaries and libraries (its first mkdir, for the
    firmware, fails) unmounts each of this run's targets in order, then unlinks a target only if it
    is a 0-byte file: a 0-byte placeholder is gone, a 26-byte marker is kept."""
    ml, cfg = lib(world.jail, "libnvidia-ml"), lib(world.jail, "libnvidia-cfg")
    put(ml, MARKER)
    put(cfg, b"")
    node = world.node("a")
    r = configure(node, world.jail, failpoints="cli.before_mkdir=return(EIO)")
    leaf = f"{world.jail}/usr/lib/firmware/nvidia/{VERSION}/{FIRST_FIRMWARE}"
    assert (r.code, stderr_lines(r)) == (
        1, [f"nvidia-container-cli: mount error: file creation failed: {leaf}: input/output error"])

    mounted = [e["dst"] for e in world.events("cli.mount", node="a")]
    assert ml in mounted and cfg in mounted
    assert [e["path"] for e in world.events("cli.cleanup.umount", node="a")] == mounted
    assert not set(mounted) & set(mount_options(node))
    assert not os.path.lexists(cfg)
    assert open(ml, "rb").read() == MARKER
    assert cfg in {e["path"] for e in world.events("cli.cleanup.unlink", node="a")}
    assert {e["path"]: e["size"] for e in world.events("cli.cleanup.keep", node="a")} == {ml: len(MARKER)}


# -- CLI-7 ldconfig -----------------------------------------------------------------------------

@pytest.mark.req("CLI-7", "K-3")
def test_ldconfig_at_host_path_makes_soname_links(world):
    """`--ldconfig=/usr/bin/true` (ldconfig deferred) leaves the jail's linker state alone: no soname
    link, no cache. `--ldconfig=@<host ldconfig>` runs it on the rootfs after mounting: the soname
    links appear in the jail, and a job loads NVML by its soname."""
    node = world.node("a")
    soname = f"{world.jail}/{LIB}/libnvidia-ml.so.1"
    assert configure(node, world.jail).code == 0
    assert not os.path.lexists(soname) and not (world.jail / "etc/ld.so.cache").exists()
    r = configure(node, world.jail, f"--ldconfig=@{jail_image.find_ldconfig()}")
    assert (r.code, r.stderr) == (0, "")
    assert os.readlink(soname) == f"libnvidia-ml.so.{VERSION}"
    assert os.readlink(f"{world.jail}/{LIB}/libcuda.so.1") == f"libcuda.so.{VERSION}"
    assert (world.jail / "etc/ld.so.cache").exists()
    [res] = node.probe([{"path": soname, "load": True}])
    assert res["loader"] == "ok" and res["size"] > 1024, res


@pytest.mark.req("CLI-7")
def test_missing_host_ldconfig_fails_after_mounting(world):
    """`--ldconfig=@/missing` fails with the CLI's `ldcache error` line; as in nvc_ldcache.c the
    mounts made before it stay in place (docs/cli-fidelity.md, sections 8 and 9)."""
    node = world.node("a")
    r = configure(node, world.jail, "--ldconfig=@/nonexistent/ldconfig")
    assert (r.code, stderr_lines(r)) == (
        1, ["nvidia-container-cli: ldcache error: open failed: /nonexistent/ldconfig: no such file or directory"])
    assert world.events("cli.cleanup.umount") == []
    assert all(r["attached"] for r in node.probe(gpu_files(world.jail)))


@pytest.mark.req("CLI-7")
def test_ldconfig_runs_without_the_option_from_the_rootfs(world):
    """Issue 16 point 3: without `--ldconfig` the CLI still runs an ldconfig, the rootfs's own
    /sbin/ldconfig (here the jail's `sbin -> usr/sbin`), chrooted in the jail: the jail's shared
    etc/ld.so.cache and soname links appear. Without one in the rootfs nothing runs (exit 0)."""
    node = world.node("a")
    r = node.cli("configure", "--compute", "--utility", "--device=all", str(world.jail))
    assert (r.code, r.stderr) == (0, "") and not (world.jail / "etc/ld.so.cache").exists()
    shutil.copy2(jail_image.find_ldconfig(), world.jail / "usr/sbin/ldconfig")
    r = node.cli("configure", "--compute", "--utility", "--device=all", str(world.jail))
    assert (r.code, r.stderr) == (0, "")
    assert [e["argv"][:3] for e in world.events("cli.ldconfig", node="a")] == [["chroot", str(world.jail), "/sbin/ldconfig"]]
    assert (world.jail / "etc/ld.so.cache").exists()
    assert os.readlink(f"{world.jail}/{LIB}/libnvidia-ml.so.1") == f"libnvidia-ml.so.{VERSION}"


# -- issue 16: compat libraries, the CLI's symlinks, cleanup per batch, devices, requirements ----

def compat_lib(jail, name: str = "libcuda.so.999.01") -> str:
    """A CUDA forward-compatibility library shipped in the rootfs (usr/local/cuda/compat)."""
    d = jail / "usr/local/cuda/compat"
    d.mkdir(parents=True, exist_ok=True)
    put(str(d / name), b"compat library " * 200)
    return name


@pytest.mark.req("CLI-3", "CLI-1")
def test_cuda_compat_libraries_are_mounted_by_default(world):
    """Issue 16 point 4: with `--compute` and the default `--cuda-compat-mode=mount`, the rootfs's
    usr/local/cuda/compat/lib*.so.* are mounted into the library directory over 0-byte placeholders;
    `list` never prints them; `disabled` and `hook` (the toolkit's hook does it) mount none; a mode the
    option table lacks is the CLI's own container error, before anything."""
    name = compat_lib(world.jail)
    node = world.node("a")
    r = node.cli("configure", "--compute", "--device=all", "--ldconfig=/usr/bin/true",
                 "--cuda-compat-mode=bogus", str(world.jail))
    assert (r.code, stderr_lines(r)) == (1, ["nvidia-container-cli: container error: invalid option: "
                                             "cuda-compat-mode=bogus"])
    assert not file_events(world)
    for mode in ("disabled", "hook"):
        assert configure(node, world.jail, f"--cuda-compat-mode={mode}").code == 0
        assert not os.path.lexists(f"{world.jail}/{LIB}/{name}"), mode
    b = world.node("b")
    assert configure(b, world.jail).code == 0
    dst = f"{world.jail}/{LIB}/{name}"
    assert [e["src"] for e in world.events("cli.mount", node="b", dst=dst)] == [f"{world.jail}/usr/local/cuda/compat/{name}"]
    assert os.path.getsize(dst) == 0 and dst in mount_options(b)
    assert name not in b.cli("list").stdout


@pytest.mark.req("CLI-3", "CLI-6")
def test_cli_symlinks_are_made_and_never_cleaned_up(world):
    """Issue 16 point 5: `--compute` makes libcuda.so -> libcuda.so.1 next to the libraries; a later
    failure of the driver batch (the firmware's mkdir) cleans up the mounts but not that link. A
    failure to make the link fails the driver batch: every mount of it is undone."""
    node = world.node("a")
    link = f"{world.jail}/{LIB}/libcuda.so"
    r = configure(node, world.jail, failpoints="cli.before_symlink=return(EIO)")
    assert (r.code, stderr_lines(r)) == (1, [f"nvidia-container-cli: mount error: file creation failed: {link}: "
                                             "input/output error"])
    mounted = [e["dst"] for e in world.events("cli.mount", node="a")]
    assert mounted and [e["path"] for e in world.events("cli.cleanup.umount", node="a")] == mounted
    r = configure(node, world.jail, failpoints="cli.before_mkdir=return(EIO)")
    assert r.code == 1 and os.readlink(link) == "libcuda.so.1"
    assert link not in {e.get("path") for e in world.history() if e["kind"].startswith("cli.cleanup")}


@pytest.mark.req("CLI-6")
def test_cleanup_counts_a_file_as_mounted_only_after_its_remount(world):
    """Issue 16 point 6: a file whose read-only remount fails was never recorded (mount_files
    records a target after both mounts): cleanup undoes the two binaries before it, in order, and
    leaves the third's bind mount and placeholder where they are."""
    node = world.node("a")
    r = configure(node, world.jail, failpoints="cli.after_mount=2*off->return(EIO)")
    assert r.code == 1
    mounted = [e["dst"] for e in world.events("cli.mount", node="a")]
    assert len(mounted) == 3
    assert [e["path"] for e in world.events("cli.cleanup.umount", node="a")] == mounted[:2]
    assert mounted[2] in mount_options(node) and os.path.exists(mounted[2])


@pytest.mark.req("CLI-6")
def test_cleanup_undoes_a_device_whose_own_bind_failed(world):
    """Issue 16 point 6: mount_device undoes its own target even when its bind failed (`fail:
    unmount(dst)`): the node's /dev/nvidiactl in the jail, a 0-byte device node, is unlinked by the
    cleanup (FTW_F covers device nodes)."""
    node = world.node("a")
    assert configure(world.node("b"), world.jail, failpoints="cli.before_mount=off").code == 0
    hits = [e["path"] for e in world.events("failpoint", node="b", name="cli.before_mount")]
    ctl = f"{world.jail}/dev/nvidiactl"
    n = hits.index(ctl)
    assert node.run(["test", "-e", ctl]).code == 0
    r = configure(node, world.jail, failpoints=f"cli.before_mount={n}*off->return(EIO)")
    assert r.code == 1 and "mount operation failed: /dev/nvidiactl" in r.stderr, r
    removed = [e["path"] for e in world.events("cli.cleanup.unlink", node="a")]
    if os.getuid() != 0:
        # In a user namespace the node's device is a bind mount of /dev/null (no mknod there): another
        # file system, which file_remove's FTW_MOUNT walk leaves alone, as the real CLI's would.
        assert ctl not in removed and node.run(["test", "-e", ctl]).code == 0
        return
    assert ctl in removed
    assert node.run(["test", "-e", ctl]).code == 1


@pytest.mark.req("CLI-1")
def test_devices_by_uuid_and_bus_id_and_unknown_ones(world):
    """Issue 16 point 8 (common.c select_devices): `--device` takes GPU UUIDs and PCI bus ids as
    well as indexes; `none` and an unknown device are the CLI's `device error`, before any mount."""
    node = world.node("a")
    for device in (gpu_uuid(1), gpu_uuid(1).lower(), "0:2:0.0", "1"):
        r = node.cli("list", f"--device={device}")
        assert (r.code, r.stdout.splitlines()) == (0, CONTROL_DEVICES + ["/dev/nvidia1"]), device
    for device in ("none", "7", "MIG-0", "GPU-nope"):
        r = node.cli("configure", "--utility", f"--device={device}", "--ldconfig=/usr/bin/true", str(world.jail))
        assert (r.code, stderr_lines(r)) == (1, [f"nvidia-container-cli: device error: {device}: unknown device"])
    assert not file_events(world)


@pytest.mark.req("CLI-1")
def test_require_is_checked_before_any_mount(world):
    """Issue 16 point 8: `--require` is evaluated before anything is mounted: an unsatisfied
    condition is `requirement error`, exit 1, no file event; a satisfied one lets the run go on."""
    node = world.node("a")
    r = configure(node, world.jail, "--require=cuda>=99.0")
    assert (r.code, stderr_lines(r)) == (1, ["nvidia-container-cli: requirement error: unsatisfied condition: cuda>=99.0"])
    assert not file_events(world)
    assert configure(node, world.jail, "--require=cuda>=12.0 driver>=500").code == 0


@pytest.mark.req("CLI-1")
def test_video_brings_compute_libraries_not_compute_binaries(world):
    """Issue 16 point 8 (options.h: video = VIDEO_LIBS|COMPUTE_LIBS): `--video` mounts libcuda but
    not the MPS binaries (COMPUTE_BINS); and `--no-fabric`, in no option table, is argp's error."""
    node = world.node("a")
    r = node.cli("configure", "--video", "--device=all", "--ldconfig=/usr/bin/true", str(world.jail))
    assert (r.code, r.stderr) == (0, "")
    mounted = {os.path.basename(e["dst"]) for e in world.events("cli.mount", node="a")}
    assert f"libcuda.so.{VERSION}" in mounted
    assert not {"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"} & mounted
    r = node.cli("configure", "--no-fabric", "--compute", str(world.jail))
    assert (r.code, stderr_lines(r)) == (1, [f"{CONF}: unrecognized option '--no-fabric'", _try(CONF)])


# -- CLI-8 failpoints ---------------------------------------------------------------------------

MALFORMED_SPECS = ["cli.before_mkdir=1*frob", "cli.no_such_step=return(EIO)", "cli.before_mount",
                   "cli.before_mount=return(ENOTANERRNO)", "cli.before_mount=sleep(soon)"]


@pytest.mark.req("CLI-8")
def test_malformed_failpoint_spec_is_one_line_and_touches_nothing(world):
    """A malformed GPUJAIL_FAILPOINTS (unknown action, unknown name, no term, bad argument) is bad
    input: one line naming the spec, exit 1, before anything is created or mounted."""
    node = world.node("a")
    before = jail_image.snapshot(world.jail)
    for spec in MALFORMED_SPECS:
        r = configure(node, world.jail, failpoints=spec)
        assert r.code == 1 and r.stdout == "", spec
        [line] = stderr_lines(r)
        assert line.startswith("nvidia-container-cli: failpoint error: ") and repr(spec) in line, line
    assert jail_image.snapshot(world.jail) == before
    assert not [e for e in world.history() if e["kind"].startswith("cli.")]


@pytest.mark.req("CLI-8")
def test_armed_failpoint_fires_on_its_hit_and_is_recorded(world):
    """`cli.before_mount=2*off->return(EIO)` lets two mounts through and fails the third with EIO;
    every hit is in the history under the failpoint's name, with its action."""
    node = world.node("a")
    r = configure(node, world.jail, failpoints="cli.before_mount=2*off->return(EIO)")
    hits = [(e["name"], e["hit"], e["action"]) for e in world.events("failpoint", node="a")]
    assert hits == [("cli.before_mount", 1, "off"), ("cli.before_mount", 2, "off"), ("cli.before_mount", 3, "return")]
    third = world.events("failpoint", hit=3)[0]["path"]          # the third binary's target
    assert os.path.dirname(third) == f"{world.jail}/usr/bin"
    assert (r.code, stderr_lines(r)) == (1, [f"nvidia-container-cli: mount error: mount operation failed: "
                                             f"/usr/bin/{os.path.basename(third)}: input/output error"])
    assert len(world.events("cli.mount", node="a")) == 2


@pytest.mark.req("CLI-8")
def test_kill_failpoint_dies_without_cleanup(world):
    """`kill` SIGKILLs the CLI: no cleanup runs, so its mounts stay in the node and its 0-byte
    placeholders stay in the jail."""
    node = world.node("a")
    r = configure(node, world.jail, failpoints="cli.after_remount=2*off->kill")
    assert r.code == -signal.SIGKILL
    assert [e["action"] for e in world.events("failpoint", node="a")] == ["off", "off", "kill"]
    mounted = [e["dst"] for e in world.events("cli.mount", node="a")]
    assert len(mounted) == 3
    assert not [e for e in world.history() if e["kind"].startswith("cli.cleanup") or e["kind"] == "cli.exit"]
    options = mount_options(node)
    assert all(dst in options and os.path.getsize(dst) == 0 for dst in mounted)


@pytest.mark.req("CLI-8")
def test_every_step_has_a_named_failpoint(world):
    """Every `cli.*` failpoint of the registry sits on a step the CLI really takes: armed as `off`,
    a cold successful configure and a failing one together hit each of them, by name."""
    names = sorted(n for n in REGISTRY if n.startswith("cli."))
    everything = ";".join(f"{n}=off" for n in names)
    node = world.node("a")
    assert configure(node, world.jail, failpoints=everything).code == 0
    failing = ";".join(f"{n}=off" for n in names if n != "cli.before_mount") + ";cli.before_mount=1*off->return(EIO)"
    assert configure(node, world.jail, failpoints=failing).code == 1
    assert sorted({e["name"] for e in world.events("failpoint")}) == names


# -- kernel facts -------------------------------------------------------------------------------

@pytest.mark.req("K-1")
def test_unlinking_a_mount_point_elsewhere_detaches_it(world):
    """Node A's CLI mounted NVML over a 0-byte placeholder. In A's own namespace the placeholder
    cannot be unlinked (EBUSY); from node B's namespace it can, and A's mount is detached with it."""
    a, b = world.node("a"), world.node("b")
    assert configure(a, world.jail).code == 0
    ml = lib(world.jail, "libnvidia-ml")
    r = a.run(["rm", ml])
    assert r.code != 0 and "Device or resource busy" in r.stderr
    [res] = a.probe([{"path": ml, "load": True}])
    assert res["attached"] and res["loader"] == "ok", res
    assert b.run(["rm", ml]).code == 0
    [res] = a.probe([{"path": ml, "load": True}])
    assert not res["attached"] and res["size"] is None, res
    assert "cannot open shared object file" in res["loader"]


@pytest.mark.req("K-3")
def test_loader_rejects_placeholders_and_loads_the_real_library(world):
    """At the same library paths, node A (configured) loads the real libraries while node B, which
    sees the shared layer, gets `file too short` for a 26-byte marker and for a 0-byte placeholder."""
    ml, cfg = lib(world.jail, "libnvidia-ml"), lib(world.jail, "libnvidia-cfg")
    put(ml, MARKER)
    put(cfg, b"")
    a, b = world.node("a"), world.node("b")
    assert configure(a, world.jail).code == 0
    requests = [{"path": ml, "load": True}, {"path": cfg, "load": True}]
    assert [r["loader"] for r in a.probe(requests)] == ["ok", "ok"]
    seen = b.probe(requests)
    assert [r["size"] for r in seen] == [len(MARKER), 0]
    for r in seen:
        assert "file too short" in r["loader"], r


HOLDER = """
import fcntl, os, signal, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.005)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.req("K-4")
def test_flock_on_the_jail_serialises_nodes_and_dies_with_its_holder(world):
    """A process in node A holds an flock on a jail lock file: node B's `flock -n` on the same file
    fails. Killed, the holder takes its lock with it, and B gets the lock."""
    a, b = world.node("a"), world.node("b")
    lock = f"{world.jail}/etc/complement_jail_gpu_placeholders.lock"
    held, stop = f"{world.jail}/tmp/k4-held", f"{world.jail}/tmp/k4-stop"
    with ThreadPoolExecutor(1) as pool:   # A's start holds the lock while B tries it
        holding = pool.submit(a.run, [sys.executable, "-c", HOLDER, lock, held, stop])
        deadline = time.monotonic() + 30
        while not os.path.exists(held) and time.monotonic() < deadline and not holding.done():
            time.sleep(0.005)
        assert os.path.exists(held), f"the holder never took the lock: {holding.result() if holding.done() else ''}"
        r = b.run(["flock", "-n", lock, "true"])
        assert r.code == 1, (r.code, r.stderr)
        open(stop, "w").close()
        assert holding.result().code == -signal.SIGKILL, holding.result()
    r = b.run(["flock", "-w", "60", lock, "true"])   # waits for the kernel to release the dead holder's lock
    assert r.code == 0, (r.code, r.stderr)


@pytest.mark.req("K-5")
def test_a_node_bind_mounts_files_in_its_own_namespace(world):
    """A node has a mount namespace of its own in which it can bind-mount a file (as root here; the
    unprivileged path, through a user namespace, is run by ./run-tests): its view changes, the host's
    and another node's do not."""
    a, b = world.node("a"), world.node("b")
    namespaces = {n.node_id: n.run(["readlink", "/proc/self/ns/mnt"]).stdout.strip() for n in (a, b)}
    assert len({os.readlink("/proc/self/ns/mnt"), *namespaces.values()}) == 3, namespaces
    target = world.jail / "usr/bin/nvidia-smi"
    target.touch()
    r = a.run(["mount", "--bind", "/usr/bin/nvidia-smi", str(target)])
    assert (r.code, r.stderr) == (0, "")
    request = [{"path": str(target), "host": "/usr/bin/nvidia-smi"}]
    [res] = a.probe(request)
    assert res["attached"] and res["same_bytes"] and res["size"] > 1024, res
    [res] = b.probe(request)
    assert not res["attached"] and res["size"] == 0, res
    assert target.stat().st_size == 0
