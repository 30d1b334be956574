"""Property-based tests (Hypothesis) of the suite's pure logic: REF-1 list parsing, REF-2 target
mapping and in-root resolution, REF-9 placeholder predicate and populate-jail cleanup, CLI-6 failure
cleanup of the fake CLI, and the mountinfo parser REF-7 relies on.

How this works
--------------
No root, no kernel backend, no namespaces. Jail trees are either pyfakefs trees (the `fs` fixture)
or small real trees in temporary directories (where the code under test needs the kernel's
`openat2`, which pyfakefs cannot fake). Each property builds a random tree, runs the function under
test and compares the result with an oracle written independently from the SPEC text (a regex for
`lib*.so.*`, a model walk for `file_remove`, the kernel's own `RESOLVE_IN_ROOT` for
`resolve_in_root`, ...), and compares a full listing of the tree before and after.

Bugs found are kept as `xfail(strict=True)` properties with an explicit `@example` (so the failure is
deterministic and fast); each reason starts with "BUG:".
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import stat
import tempfile

import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from gpujail.fixtures import drivers, nvc_info
from gpujail.fixtures.cli_args import CONFIGURE_OPTIONS, GLOBAL_OPTIONS, LIST_OPTIONS, CliError, argp_parse
from gpujail.fixtures.cli_mount import Configure
from gpujail.reference_impl import core
from gpujail.spec import IMPL_EXIT
from gpujail.world.sysops import RealSys, parse_mountinfo, resolve_in_root

# Function-scoped fixtures (`fs`, the autouse environment fixture) are set up once per test, not per
# example: each example below rebuilds its own tree, so sharing them across examples is intended.
FAST = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
FEW = settings(FAST, max_examples=30)

LIB_GLOB = re.compile(r"lib.*\.so\..*", re.DOTALL)   # REF-9's `lib*.so.*`, written independently of fnmatch


@pytest.fixture(autouse=True)
def _no_harness_env(monkeypatch):
    """Outside the harness: no history file, no failpoints armed (core and the fake CLI read both)."""
    for name in ("GPUJAIL_HISTORY", "GPUJAIL_FAILPOINTS", "GPUJAIL_BARRIERS"):
        monkeypatch.delenv(name, raising=False)


def _under(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def snapshot(*tops: str, fs=None) -> dict[str, tuple]:
    """Everything under `tops`, by lstat, never following a symlink: type, permission bits, size,
    content (regular files) or link target. Two equal snapshots mean byte-identical trees. With a
    pyfakefs `fs`, contents are read past permission checks (trees hold mode-000 files, unreadable
    to a non-root user)."""
    out: dict[str, tuple] = {}
    read = (lambda p: fs.get_object(p).byte_contents) if fs else _read

    def walk(path: str) -> None:
        try:
            s = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(s.st_mode):
            out[path] = ("link", os.readlink(path))
        elif stat.S_ISDIR(s.st_mode):
            out[path] = ("dir", stat.S_IMODE(s.st_mode))
            for name in sorted(os.listdir(path)):
                walk(os.path.join(path, name))
        elif stat.S_ISREG(s.st_mode):
            out[path] = ("file", stat.S_IMODE(s.st_mode), s.st_size, read(path))
        else:
            out[path] = ("other", s.st_mode)

    for top in tops:
        walk(top)
    return out


# ================================================================================================
# REF-9: the placeholder predicate, `placeholders`, `populate_cleanup` (pyfakefs trees)
# ================================================================================================

class FakefsSys(RealSys):
    """RealSys for pyfakefs trees. pyfakefs patches the `os` module, so lstat/listdir/stat/unlink go
    to the fake file system, but `stat_beneath`/`unlink_beneath` call openat2 through ctypes, a raw
    syscall pyfakefs cannot intercept (it would hit the real disk, where /jail does not exist). Here
    they are plain joins. That is faithful for what these tests exercise: `placeholders()` only
    returns paths it has lstat-ed component by component and found free of symlinks, so
    RESOLVE_IN_ROOT and a plain join name the same file."""

    def stat_beneath(self, root: str, rel: str) -> os.stat_result:
        return os.stat(os.path.join(root, rel))

    def unlink_beneath(self, root: str, rel: str) -> None:
        os.unlink(os.path.join(root, rel))


IDENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-+", max_size=8)
VERSION = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,2}", fullmatch=True)
NAME_CHARS = st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",))
LIB_NAMES = st.one_of(
    st.builds("lib{}.so.{}".format, IDENT, VERSION),              # libcuda.so.550.54.15, libfoo.so.1
    st.builds("lib{}.so.{}".format, IDENT, VERSION),              # (twice: the interesting shape)
    st.builds("lib{}.so".format, IDENT),                          # libncurses.so (a linker script)
    st.builds("lib{}.a".format, IDENT),                           # libpthread.a (an `!<arch>` stub)
    st.sampled_from(["libncurses.so", "libpthread.a", "libc.so", "lib.so.", "libfoo.so.1.bak", "LIBfoo.so.1",
                     "xlibfoo.so.1", "libfoo.so1", "libfoo.So.1", "ld-linux-x86-64.so.2", "libfoo.so.1 ",
                     " libfoo.so.1", "lib\nx.so.1", "libfoo.so.\n"]),
    st.text(NAME_CHARS, min_size=1, max_size=12).filter(lambda n: n not in (".", "..")),
)
ENTRY_NAMES = LIB_NAMES.filter(lambda n: n not in ("x86_64-linux-gnu", "i386-linux-gnu"))   # placed separately
SIZES = st.one_of(st.sampled_from([0, 0, 1, 8, 26, 31, 63, 63, 64, 64, 65]), st.integers(0, 200))
MODES = st.sampled_from([0o644, 0o755, 0o600, 0o444, 0o000, 0o4755])
# Where a symlink in a library directory points (outside targets exist in every tree, see below).
LINK_TARGETS = st.sampled_from(["/outside/empty.so.1", "/outside/marker", "/outside/big", "/outside/libdir",
                                "/nonexistent", "libsibling.so.1", ".", "..", "/jail/usr/lib"])


@st.composite
def dir_entries(draw, max_entries=8):
    """{name: node} for one directory: ("file", size, mode), ("link", target), ("dir", {name: node})."""
    entries = {}
    for name in draw(st.lists(ENTRY_NAMES, max_size=max_entries, unique=True)):
        kind = draw(st.sampled_from(["file", "file", "file", "link", "dir"]))
        if kind == "file":
            entries[name] = ("file", draw(SIZES), draw(MODES))
        elif kind == "link":
            entries[name] = ("link", draw(LINK_TARGETS))
        else:   # a subdirectory: its placeholders are not in a library directory, so never touched
            entries[name] = ("dir", {"libnested.so.1": ("file", 0, 0o644), "libmarker.so.1": ("file", 26, 0o644)})
    return entries


@st.composite
def jails(draw):
    """A jail: each library directory absent, a real directory, or a symlink (to another library
    directory, or out of the jail to a directory full of placeholder-shaped files)."""
    tree: dict[str, tuple] = {}   # jail-relative path -> node, parents before children

    def place(rel: str) -> None:
        how = draw(st.sampled_from(["dir", "dir", "dir", "absent", "link-out", "link-in"]))
        if how == "dir":
            tree[rel] = ("dir", draw(dir_entries()))
        elif how == "link-out":
            tree[rel] = ("link", "/outside/libdir")
        elif how == "link-in":
            tree[rel] = ("link", draw(st.sampled_from(["x86_64-linux-gnu", "../lib", "/usr/lib/x86_64-linux-gnu"])))

    usr = draw(st.sampled_from(["dir"] * 6 + ["link-out"]))
    if usr == "link-out":
        tree["usr"] = ("link", "/outside")
    else:
        tree["usr"] = ("dir", {})
        place("usr/lib")
        if tree.get("usr/lib", ("",))[0] == "dir":
            for sub in ("usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu"):
                place(sub)
        place("usr/lib64")
        # A non-library directory with placeholder-shaped files: never scanned.
        tree["usr/share"] = ("dir", {"libfoo.so.1": ("file", 0, 0o644), "libbar.so.2": ("file", 26, 0o644)})
    tree["etc"] = ("dir", {"debian_version": ("file", 5, 0o644)})
    flag = draw(st.sampled_from(["absent", "file", "link"]))
    if flag == "file":
        tree["etc"][1][os.path.basename(core.FLAG)] = ("file", 0, 0o644)
    elif flag == "link":
        tree["etc"][1][os.path.basename(core.FLAG)] = ("link", "/outside/big")
    return tree


# Every edge at once, so each run checks them whatever Hypothesis draws: sizes 63/64, an empty
# linker script, a symlink to an empty file, a marker, a 0-byte archive, an empty dir named like a lib.
BOUNDARY_TREE = {
    "usr": ("dir", {}),
    "usr/lib": ("dir", {"libncurses.so": ("file", 31, 0o644), "libpthread.a": ("file", 8, 0o644),
                        "libempty.so": ("file", 0, 0o644), "libc.so.6": ("file", 64, 0o755)}),
    "usr/lib/x86_64-linux-gnu": ("dir", {"libcuda.so.550.54.15": ("file", 26, 0o755),
                                         "libnvidia-ml.so.550.54.15": ("file", 0, 0o644),
                                         "libnvidia-cfg.so.1": ("file", 63, 0o644),
                                         "libnvidia-ptxjitcompiler.so.1": ("file", 64, 0o644),
                                         "libnvidia-tls.so.1": ("link", "/outside/empty.so.1"),
                                         "libdir.so.1": ("dir", {})}),
    "usr/lib64": ("link", "/outside/libdir"),
    "etc": ("dir", {"debian_version": ("file", 5, 0o644), "gpu_libs_installed.flag": ("file", 0, 0o644)}),
}


def build_fake_jail(fs, tree: dict[str, tuple]) -> None:
    fs.reset()
    # Outside the jail: targets of the jail's symlinks, including placeholder-shaped files that
    # must never be removed (nothing outside the jail is touched, REF-11).
    fs.create_file("/outside/empty.so.1", contents=b"")
    fs.create_file("/outside/marker", contents=core.MARKER)
    fs.create_file("/outside/big", contents=b"\x7fELF" + b"x" * 2000)
    for name in ("libcuda.so.1", "libnvidia-ml.so.550", "x86_64-linux-gnu/libz.so.1", "lib/x86_64-linux-gnu/libq.so.1"):
        fs.create_file(f"/outside/libdir/{name}", contents=b"")
    fs.create_file("/outside/lib/x86_64-linux-gnu/libw.so.3", contents=b"tiny")

    def make(path: str, node: tuple) -> None:
        if node[0] == "file":
            fs.create_file(path, st_mode=stat.S_IFREG | node[2], contents=b"m" * node[1])
        elif node[0] == "link":
            os.symlink(node[1], path)
        else:
            os.makedirs(path, exist_ok=True)
            for name, child in node[1].items():
                make(os.path.join(path, name), child)

    os.makedirs("/jail")
    for rel, node in tree.items():
        make(os.path.join("/jail", rel), node)


def expected_placeholders(tree: dict[str, tuple]) -> list[str]:
    """The oracle: direct children of library directories reached without any symlink, that are
    regular files named lib*.so.* below 64 bytes; in LIBRARY_DIRS order, names sorted."""
    found = []
    for d in core.LIBRARY_DIRS:
        parts = d.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if not all(tree.get(p, ("",))[0] == "dir" for p in prefixes):
            continue
        for name, node in sorted(tree[d][1].items()):
            if node[0] == "file" and LIB_GLOB.fullmatch(name) and node[1] < 64:
                found.append(f"{d}/{name}")
    return found


@FEW
@given(tree=jails())
@example(tree=BOUNDARY_TREE)
def test_ref9_placeholders_and_populate_cleanup(fs, tree):
    """REF-9: `placeholders` returns exactly the regular (not symlink) lib*.so.* files below 64 bytes
    directly in the jail's library directories (never through a symlinked directory), and
    `populate_cleanup` removes exactly those plus the installed flag, leaving every other byte of
    the jail and of the host (the symlinks' targets) identical."""
    build_fake_jail(fs, tree)
    ctx = core.Ctx(sys=FakefsSys(), jail="/jail")
    want = expected_placeholders(tree)

    got = core.placeholders(ctx)
    event(f"placeholders: {min(len(want), 3)}{'+' if len(want) >= 3 else ''}")
    assert got == want
    for rel in got:
        s = os.lstat(os.path.join("/jail", rel))
        assert stat.S_ISREG(s.st_mode) and not stat.S_ISLNK(s.st_mode)
        assert s.st_size < core.PLACEHOLDER_MAX and LIB_GLOB.fullmatch(os.path.basename(rel))

    before = snapshot("/jail", "/outside", fs=fs)
    removed = core.populate_cleanup(ctx)
    after = snapshot("/jail", "/outside", fs=fs)
    assert removed == want
    gone = {os.path.join("/jail", rel) for rel in want} | {os.path.join("/jail", core.FLAG)}
    assert after == {p: v for p, v in before.items() if p not in gone}


@FEW
@given(tree=jails())
@example(tree=BOUNDARY_TREE)
def test_ref9_predicate_on_every_entry(fs, tree):
    """REF-9: on every entry of a random jail (files of every size and mode, symlinks to files, to
    nothing, to directories), `is_placeholder` holds exactly for regular files named lib*.so.* with
    size < 64; the legacy `is_empty_file` differs from it exactly on markers (non-empty lib*.so.*
    below 64 bytes) and on empty files with any other name (linker scripts, archives, ...)."""
    build_fake_jail(fs, tree)
    for path in snapshot("/jail", "/outside", fs=fs):
        name, s = os.path.basename(path), os.lstat(path)
        regular, named = stat.S_ISREG(s.st_mode), bool(LIB_GLOB.fullmatch(name))
        assert core.is_placeholder(name, s) == (regular and named and s.st_size < 64), path
        marker = regular and named and 0 < s.st_size < 64
        empty_other = regular and not named and s.st_size == 0
        differs = core.is_placeholder(name, s) != core.is_empty_file(name, s)
        assert differs == (marker or empty_other), path


# ================================================================================================
# REF-2: target mapping against the fake CLI's destinations (real temporary jails)
# ================================================================================================

ALL_LIBS = sorted({n for names in nvc_info.LIBRARIES.values() for n in names})
ALL_BINS = sorted({n for names in nvc_info.BINARIES.values() for n in names})
# where `list` can find a binary: the CLI looks it up along the search path (libnvidia-container's
# default PATH), e.g. /usr/sbin on a host that installs nvidia-persistenced there
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
DRIVER_VERSION = st.one_of(st.sampled_from(["550.54.15", "570.86.15", "535.183.01"]), VERSION)
LIB_BASE = st.one_of(st.sampled_from(ALL_LIBS), st.builds("lib{}".format, IDENT))


def _entry(section: str):
    if section in ("libraries", "libraries32"):   # in any distribution's directory (fixtures/drivers.py LAYOUTS)
        dirs = [layout[section == "libraries32"] for layout in drivers.LAYOUTS.values()]
        return st.builds(lambda d, n, v: f"{d}/{n}.so.{v}", st.sampled_from(dirs), LIB_BASE, DRIVER_VERSION)
    if section == "binaries":   # from any directory of the CLI's search path: all mounted at usr/bin
        return st.builds("{}/{}".format, st.sampled_from(BIN_DIRS),
                         st.one_of(st.sampled_from(ALL_BINS), st.from_regex(r"nvidia-[a-z0-9-]{1,12}", fullmatch=True)))
    if section == "firmwares":
        return st.builds(lambda v, n: f"/lib/firmware/nvidia/{v}/gsp_{n}.bin", DRIVER_VERSION, IDENT)
    if section == "devices":
        return st.one_of(st.sampled_from(nvc_info.CONTROL_DEVICES), st.builds("/dev/nvidia{}".format, st.integers(0, 63)))
    return st.sampled_from([p for p, _ in nvc_info.IPCS])


SECTIONS = ("libraries", "libraries32", "binaries", "firmwares", "devices", "ipcs")
LIST_ENTRIES = st.sampled_from(SECTIONS).flatmap(lambda s: st.tuples(st.just(s), _entry(s)))


@pytest.fixture(scope="module")
def plain_jails(tmp_path_factory):
    """Two symlink-free jails: Debian-style (etc/debian_version) and not."""
    debian, other = tmp_path_factory.mktemp("debian"), tmp_path_factory.mktemp("other")
    for root in (debian, other):
        (root / "etc").mkdir()
    (debian / "etc" / "debian_version").write_text("12.5\n")
    return {True: str(debian), False: str(other)}


@FAST
@given(entry=LIST_ENTRIES, debian=st.booleans())
def test_ref2_target_matches_cli_destination(plain_jails, entry, debian):
    """REF-2 / CLI-3: for every `list`-shaped host path, `core.target` is jail-relative (no leading
    /, no `..`, no empty component) and is exactly where the fake CLI mounts it: libraries flattened
    into usr/lib/x86_64-linux-gnu or usr/lib/i386-linux-gnu (usr/lib64, usr/lib without
    etc/debian_version) by their section, i.e. ELF class, whatever the host directory (`/usr/lib` is
    64-bit on Arch, 32-bit on RHEL), binaries into usr/bin, firmware, devices and IPC sockets at their
    own path."""
    section, host_path = entry
    rel = core.target(host_path, debian, elf32=section == "libraries32")
    assert not rel.startswith("/") and all(part not in ("", ".", "..") for part in rel.split("/"))
    rootfs = plain_jails[debian]
    dest = Configure(RealSys(), rootfs).destination(section, host_path, "/")
    assert dest == os.path.join(rootfs, rel)


# -- resolve_in_root on random symlink trees ------------------------------------------------------

COMPONENTS = st.sampled_from(["a", "b", "c", "f", "..", ".", "missing"])
REL_PATHS = st.lists(COMPONENTS, min_size=0, max_size=5).map("/".join)
PATHS = st.tuples(st.sampled_from(["", "/", "//"]), REL_PATHS).map("".join)
# Symlink targets: relative, chroot-absolute, `..` above the root, the host path of the jail
# itself (@ROOT), a host directory outside it (@OUT), loops (a -> a, b -> a ...).
LINK_TEXT = st.one_of(st.tuples(st.sampled_from(["", "/"]), st.lists(COMPONENTS, min_size=1, max_size=5).map("/".join))
                      .map("".join), st.sampled_from(["@OUT", "@OUT/d", "@ROOT/a", "@ROOT", "../../..", "/../../etc"]))
NODES = st.lists(st.tuples(st.lists(st.sampled_from(["a", "b", "c", "f"]), min_size=1, max_size=3).map("/".join),
                           st.sampled_from(["dir", "dir", "file", "link", "link"]), LINK_TEXT), max_size=10)


SCRATCH: list[str] = []   # a per-session directory under pytest's basetemp (see the fixture below)


@pytest.fixture(scope="module", autouse=True)
def _scratch(tmp_path_factory):
    SCRATCH[:] = [str(tmp_path_factory.mktemp("trees"))]
    yield
    SCRATCH.clear()


class TempTree:
    """base/jail (the root) and base/outside (with a directory and a file), on the real disk, under
    pytest's temporary directory; removed by close() (and by pytest's retention if a test dies)."""

    def __init__(self, nodes):
        self.base = os.path.realpath(tempfile.mkdtemp(prefix="tree-", dir=SCRATCH[0] if SCRATCH else None))
        try:
            self._build(nodes)
        except BaseException:
            self.close()
            raise

    def _build(self, nodes):
        self.root, self.out = os.path.join(self.base, "jail"), os.path.join(self.base, "outside")
        os.makedirs(os.path.join(self.out, "d"))
        open(os.path.join(self.out, "f"), "w").close()
        os.makedirs(self.root)
        for rel, kind, text in nodes:
            path = os.path.join(self.root, rel)
            if not self._parents_are_dirs(rel):
                continue   # never create through a symlink (that could write outside the jail)
            try:
                if kind == "dir":
                    os.mkdir(path)
                elif kind == "file":
                    open(path, "x").close()
                else:
                    os.symlink(text.replace("@OUT", self.out).replace("@ROOT", self.root), path)
            except FileExistsError:
                pass

    def _parents_are_dirs(self, rel: str) -> bool:
        path = self.root
        for part in rel.split("/")[:-1]:
            path = os.path.join(path, part)
            try:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    return False
            except FileNotFoundError:
                os.mkdir(path)
        return True

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)   # rmtree never follows symlinks


@FAST
@given(nodes=NODES, path=PATHS)
def test_resolve_in_root_stays_under_root_and_agrees_with_kernel(nodes, path):
    """REF-2 / REF-11: `resolve_in_root` returns a normalised absolute path lexically under the root
    for any path (with `..`, `.`, empty components) over any symlink tree (absolute targets, `..`
    above the root, loops). The only errors: ELOOP (a loop) and EXDEV (a `..` above the root, which
    the CLI refuses as "resolves outside of"). Where both it and the kernel's own
    openat2(RESOLVE_IN_ROOT) resolve the path, they name the same inode."""
    t = TempTree(nodes)
    try:
        try:
            got = resolve_in_root(RealSys(), t.root, path)
        except OSError as e:
            assert e.errno in (errno.ELOOP, errno.EXDEV)
            got = None
        if got is not None:
            assert os.path.isabs(got) and os.path.normpath(got) == got and _under(t.root, got)
        try:
            kernel = RealSys().stat_beneath(t.root, path or ".")
        except OSError:
            kernel = None
        event(f"kernel resolves: {kernel is not None}; refused: {got is None}")
        if kernel is not None and got is not None:
            mine = os.stat(got)
            assert (mine.st_dev, mine.st_ino) == (kernel.st_dev, kernel.st_ino)
    finally:
        t.close()


@FEW
@given(nodes=NODES, path=PATHS)
@example(nodes=[("l", "link", "@OUT")], path="missing/../l/x")
@example(nodes=[("usr/lib/x86_64-linux-gnu", "link", "nothere/../../../evil"), ("evil", "link", "@OUT")],
         path="/usr/lib/x86_64-linux-gnu")
def test_resolve_in_root_result_followed_on_the_host_stays_inside(nodes, path):
    """REF-11 / CLI-3: the path `resolve_in_root` returns names where a file would be created *as the
    host sees it* (the fake CLI passes it to plain stat/mkdir/open/mount): following it on the host
    must not leave the root."""
    t = TempTree(nodes)
    try:
        try:
            got = resolve_in_root(RealSys(), t.root, path)
        except OSError as e:
            assert e.errno in (errno.ELOOP, errno.EXDEV)   # a loop, or `..` above the root (refused)
            return
        assert _under(t.root, os.path.realpath(got)), f"{path!r} -> {got} -> {os.path.realpath(got)}"
    finally:
        t.close()


@FEW
@given(ups=st.integers(1, 4), link=st.sampled_from(["usr/lib/x86_64-linux-gnu", "usr/bin", "lib"]))
@example(ups=1, link="usr/lib/x86_64-linux-gnu")
def test_resolve_in_root_refuses_dotdot_above_root_like_the_cli(ups, link):
    """CLI-3 (fidelity): a jail symlink whose `..`s climb above ROOTFS is a path error for the real
    CLI's path_resolve_full, so the fake's resolution must raise too, not clamp."""
    depth = link.count("/")
    t = TempTree([(link, "link", "/".join([".."] * (depth + ups) + ["x"]))])
    try:
        try:
            got = resolve_in_root(RealSys(), t.root, "/" + link)
        except OSError:
            return
        raise AssertionError(f"/{link} -> {os.readlink(os.path.join(t.root, link))} resolved to {got}, not an error")
    finally:
        t.close()


# -- REF-2 end to end: where core puts its markers is where the CLI looks -----------------------

# Places a jail image may hold a symlink, and what it may point at.
LINK_SPOTS = ["lib", "lib64", "bin", "usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu", "usr/bin",
              "lib/firmware", "usr/lib/firmware", "usr/lib/firmware/nvidia", "etc"]
JAIL_LINKS = st.sampled_from(["usr/lib", "../usr/lib", "x86_64-linux-gnu", "../lib", "..", ".", "missing",
                              "missing/../usr/lib", "../../..", "../jail/usr/lib", "/usr/lib", "/lib",
                              "/usr/lib/x86_64-linux-gnu", "/usr/bin", "usr/bin", "@ROOT/usr/lib", "@OUT/usr/lib",
                              "@OUT", "../etc/debian_version", "usr/lib/firmware"])
HOST_MODES = st.sampled_from([0o100644, 0o100755, 0o100600, 0o100444])


class HostFilesSys(RealSys):
    """RealSys (real openat2 on the temporary jail), except that the listed host files, which do not
    exist on this machine, `stat` as regular files with the given modes (create_markers copies them)
    and read as ELF files of the class of their section (REF-2 places libraries by it)."""

    def __init__(self, modes: dict[str, int], elf32: set[str] = frozenset()):
        self.modes, self.elf32 = modes, elf32

    def read_image(self, path: str):
        if path in self.modes:
            return b"\x7fELF" + (b"\x01" if path in self.elf32 else b"\x02")
        return super().read_image(path)

    def stat(self, path: str) -> os.stat_result:
        if path in self.modes:
            return os.stat_result((self.modes[path], 0, 0, 1, 0, 0, 4096, 0, 0, 0))
        return super().stat(path)


@FEW
@given(links=st.dictionaries(st.sampled_from(LINK_SPOTS), JAIL_LINKS, max_size=4), debian=st.booleans(),
       entries=st.lists(st.tuples(st.sampled_from(SECTIONS[:4]).flatmap(lambda s: st.tuples(st.just(s), _entry(s))),
                                  HOST_MODES), min_size=1, max_size=6))
def test_ref2_markers_land_where_the_cli_looks(links, debian, entries):
    """REF-2 / REF-5 / REF-11 end to end, on real jails with random symlinks (merged /usr, relative,
    absolute, `..` above the root, the jail's own host path, out of the jail): either the reference
    refuses the jail (unsafe-jail, jail-write-failed), or after `plan` + `ensure_placeholders` the fake
    CLI's destination for every listed file (as CLI-4's `stat` sees it on the host) is our marker,
    with the host file's exact st_mode, inside the jail: the CLI will create nothing. Either way,
    nothing outside the jail changed."""
    sections, names = {}, {}
    for (section, path), _ in entries:
        assume(sections.setdefault(path, section) == section)   # one file has one ELF class
        # and one name once per section, as `list` prints it: the CLI takes the first library of a
        # name (and class) from the linker cache, the first binary from its search path; two would
        # share one target, whose marker can have only one of their modes
        assume(names.setdefault((section, os.path.basename(path)), path) == path)
    t = TempTree([])
    try:
        for d in ("etc", "usr/lib", "usr/bin"):
            os.makedirs(os.path.join(t.root, d), exist_ok=True)
        if debian:
            open(os.path.join(t.root, "etc/debian_version"), "w").close()
        os.makedirs(os.path.join(t.out, "usr/lib"))
        for spot in sorted(links, key=lambda s: s.count("/")):
            path = os.path.join(t.root, spot)
            if not t._parents_are_dirs(spot):
                continue   # under an earlier symlink: never create through it
            if os.path.isdir(path) and not os.path.islink(path):
                if os.listdir(path):
                    continue
                os.rmdir(path)   # an empty skeleton directory becomes the symlink
            os.symlink(links[spot].replace("@OUT", t.out).replace("@ROOT", t.root), path)
        modes = {p: m for (_, p), m in entries}
        outside_before = snapshot(t.out)
        base_before = sorted(os.listdir(t.base))

        ctx = core.Ctx(sys=HostFilesSys(modes, {p for (s, p), _ in entries if s == "libraries32"}), jail=t.root,
                       lock_timeout=1)
        try:
            core.ensure_placeholders(ctx, core.plan(ctx, list(modes)))
            refused = None
        except core.Fatal as e:
            assert e.kind in ("unsafe-jail", "jail-write-failed"), str(e)
            refused = e

        event(f"refused: {refused.kind}" if refused else "accepted")
        assert snapshot(t.out) == outside_before and sorted(os.listdir(t.base)) == base_before
        if refused:
            return
        cli = Configure(RealSys(), t.root)
        for (section, host_path), _ in entries:
            try:
                dest = cli.destination(section, host_path, "/")
            except CliError as e:   # the CLI itself refuses the jail ("path error: ... resolves outside of")
                assert "path error:" in str(e) and "resolves outside of" in str(e), str(e)
                event("the CLI refuses the jail")
                return
            assert _under(t.root, os.path.realpath(dest)), (host_path, dest, os.path.realpath(dest))
            s = os.stat(dest)
            assert s.st_mode == modes[host_path] and s.st_size == len(core.MARKER), (host_path, dest)
    finally:
        t.close()


# ================================================================================================
# REF-1: the file set from `nvidia-container-cli list`
# ================================================================================================

class ListSys:
    """A Sys whose only program prints `out`/`err` and exits with `code`."""

    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err, self.argv = code, out, err, None

    def run(self, argv, timeout=None):
        self.argv = argv
        return self.code, self.out, self.err


PATH_CHARS = st.characters(whitelist_categories=("L", "N"), whitelist_characters=" \t._-+~@:,=%", max_codepoint=0x2FF)
ABS_PATHS = st.lists(st.text(PATH_CHARS, min_size=1, max_size=10), min_size=1, max_size=4).map(lambda p: "/" + "/".join(p))
RELATIVE = st.one_of(st.sampled_from(["usr/lib/libcuda.so.1", "./nvidia-smi", "~/x", " /leading-space", "\t/tab",
                                      "nvidia-container-cli: initialization error"]),
                     st.text(PATH_CHARS, min_size=1, max_size=10).filter(lambda s: s.strip() and s[0] != "/"))
BLANK = st.sampled_from(["", " ", "\t", "  \t "])


@st.composite
def list_outputs(draw):
    pool = draw(st.lists(ABS_PATHS, min_size=1, max_size=5, unique=True))
    line = st.one_of(st.sampled_from(pool), BLANK, RELATIVE) if draw(st.booleans()) else \
        st.one_of(st.sampled_from(pool), BLANK)
    lines = draw(st.lists(line, max_size=12))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


@FAST
@given(out=list_outputs())
def test_ref1_file_set_parses_list_output(out):
    """REF-1: `file_set` runs `<cli> list` and returns its absolute paths (spaces and tabs kept) in
    first-seen order without duplicates, skipping blank lines; a relative line is bad input naming
    its line number and text; no path at all is bad input."""
    sysops = ListSys(0, out, "")
    ctx = core.Ctx(sys=sysops, jail="/jail")
    want, bad = [], None
    for n, line in enumerate(out.split("\n"), 1):   # the CLI prints one path a line, '\n'-terminated
        if not line.strip():
            continue
        if not line.startswith("/"):
            bad = (n, line)
            break
        if line not in want:
            want.append(line)
    if bad is None and want:
        assert core.file_set(ctx) == want
    else:
        with pytest.raises(core.Fatal) as e:
            core.file_set(ctx)
        assert e.value.kind == "bad-input" and e.value.code == IMPL_EXIT["bad-input"]
        if bad:
            assert f"line {bad[0]}:" in str(e.value) and repr(bad[1]) in str(e.value)
        else:
            assert "printed no files" in str(e.value)
    assert sysops.argv == [ctx.cli, "list"]


STDERR = st.lists(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30), max_size=4).map("\n".join)


@FAST
@given(code=st.integers(-64, 255).filter(bool), out=list_outputs(), err=STDERR)
def test_ref1_failing_list_is_fatal(code, out, err):
    """REF-1: a failing `list` (any non-zero exit, signals included) is fatal bad input whatever it
    printed on stdout, with the exit code and the last stderr line (or the exit code alone)."""
    with pytest.raises(core.Fatal) as e:
        core.file_set(core.Ctx(sys=ListSys(code, out, err), jail="/jail"))
    assert e.value.kind == "bad-input"
    msg = str(e.value)
    assert f"(exit {code})" in msg
    stripped = err.strip()
    assert msg.endswith(stripped.split("\n")[-1] if stripped else f"exit code {code}")


@FEW
@given(head=ABS_PATHS, sep=st.sampled_from(["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]),
       tail=st.text(PATH_CHARS, min_size=1, max_size=8))
@example(head="/usr/lib/x86_64-linux-gnu/libfoo", sep="\x85", tail="bar.so.1")
def test_ref1_file_set_splits_on_newline_only(head, sep, tail):
    """REF-1 / CLI-2: one path a line means '\\n'-separated: a path with any other character that
    Python considers a line boundary is still one path."""
    path = head + sep + tail
    try:
        got = core.file_set(core.Ctx(sys=ListSys(0, f"/dev/nvidiactl\n{path}\n", ""), jail="/jail"))
    except core.Fatal as e:
        raise AssertionError(f"{path!r} refused: {e}") from None
    assert got == ["/dev/nvidiactl", path]


# ================================================================================================
# CLI-6: the fake CLI's failure cleanup (`file_remove`) on pyfakefs trees
# ================================================================================================

# Symlink targets, all outside the removed tree (so the oracle is static): what `stat` sees there.
RM_TARGETS = {
    "/outside/empty": "empty",          # a 0-byte file: the symlink goes
    "/outside/full": "full",            # a non-empty file: the symlink stays
    "/outside/zerodir": "dir",          # a directory holding only 0-byte files (st_size 0 on pyfakefs)
    "/outside/fulldir": "dir",          # a directory holding a non-empty file
    "/outside/to-empty": "empty",       # a symlink chain ending at a 0-byte file
    "/nonexistent/x": "dangling",
    "/outside/full/x": "error",         # ENOTDIR: the real nftw callback returns -1, the walk stops
    "@self": "error",                   # a loop: ELOOP, same
}


@st.composite
def rm_nodes(draw, depth=0):
    kind = draw(st.sampled_from(["file", "file", "link", "dir"] if depth < 3 else ["file", "link"]))
    if kind == "file":
        return ("file", draw(st.sampled_from([0, 0, 0, 1, 26, 100])))
    if kind == "link":
        return ("link", draw(st.sampled_from(sorted(RM_TARGETS))))
    names = draw(st.lists(st.sampled_from(["libcuda.so.1", "a", "b", "dev", "nvidia0", "x y"]), max_size=4, unique=True))
    return ("dir", {n: draw(rm_nodes(depth + 1)) for n in names})


def _rm_build(fs, path: str, node: tuple) -> None:
    if node[0] == "file":
        fs.create_file(path, contents=b"x" * node[1])
    elif node[0] == "link":
        os.symlink(path if node[1] == "@self" else node[1], path)
    else:
        os.makedirs(path)
        for name, child in node[1].items():
            _rm_build(fs, os.path.join(path, name), child)


def _rm_oracle(path: str, node: tuple, gone: set, keep: set) -> tuple[bool, bool]:
    """(removed, error) per CLI-6 as libnvidia-container's do_file_remove does it."""
    if node[0] == "file":
        (gone if node[1] == 0 else keep).add(path)
        return node[1] == 0, False
    if node[0] == "link":
        what = RM_TARGETS[node[1]]
        if what == "error":
            return False, True
        size0 = what in ("empty", "dangling") or (what == "dir" and os.stat(node[1]).st_size == 0)
        (gone if size0 else keep).add(path)
        return size0, False
    results = [_rm_oracle(os.path.join(path, n), c, gone, keep) for n, c in node[1].items()]
    if any(err for _, err in results):
        return False, True
    if all(removed for removed, _ in results):
        gone.add(path)
        return True, False
    keep.add(path)
    return False, False


@FAST
@given(top=rm_nodes())
def test_cli6_file_remove(fs, top):
    """CLI-6: `file_remove` walks depth-first without following symlinks: a regular file goes only
    if it is empty, a symlink only if it dangles or its target has size 0, a directory only once it
    is empty; everything else stays byte-identical, including whatever the symlinks point at (a
    symlink to a directory full of 0-byte files never empties that directory). A symlink `stat`
    cannot follow (loop, ENOTDIR) stops the walk with an error, as nftw does when the callback
    returns -1; even then nothing non-empty and nothing outside the tree is removed."""
    fs.reset()
    fs.create_file("/outside/empty")
    fs.create_file("/outside/full", contents=b"real library")
    fs.create_file("/outside/zerodir/libcuda.so.1")
    fs.create_file("/outside/zerodir/sub/libnvidia-ml.so.1")
    fs.create_file("/outside/fulldir/libcuda.so.1", contents=b"\x7fELF")
    os.symlink("/outside/empty", "/outside/to-empty")
    os.makedirs("/jail/dev")
    _rm_build(fs, "/jail/dev/top", top)
    gone, keep = set(), set()
    _, error = _rm_oracle("/jail/dev/top", top, gone, keep)
    outside, before = snapshot("/outside", fs=fs), snapshot("/jail", fs=fs)

    try:
        Configure(RealSys(), "/jail").file_remove("/jail/dev/top")
        raised = None
    except OSError as e:
        raised = e
    after = snapshot("/jail", fs=fs)

    event("walk error" if error else f"removed {'all' if '/jail/dev/top' in gone else 'some' if gone else 'none'}")
    assert snapshot("/outside", fs=fs) == outside
    assert "/jail/dev" in after
    for path in keep:
        assert after.get(path) == before[path], path
    if error:
        assert raised is not None and raised.errno in (errno.ELOOP, errno.ENOTDIR)
        assert set(before) - set(after) <= gone
    else:
        assert raised is None
        assert set(before) - set(after) == gone


@FEW
@given(kind=st.sampled_from(["fifo", "socket"]))
@example(kind="fifo")
def test_cli6_file_remove_unlinks_empty_special_files_like_the_cli(tmp_path_factory, kind):
    """CLI-6 (fidelity with utils.c do_file_remove): nftw reports FIFOs, sockets and device nodes as
    FTW_F, and the callback unlinks any FTW_F entry of size 0, not only regular files."""
    d = tmp_path_factory.mktemp("special")
    path = str(d / "nvidia-persistenced.socket")
    if kind == "fifo":
        os.mkfifo(path)
    else:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)
    Configure(RealSys(), str(d)).file_remove(path)
    assert not os.path.lexists(path)


# ================================================================================================
# REF-7's mount table: parse_mountinfo
# ================================================================================================

KERNEL_ESCAPES = {" ": "\\040", "\t": "\\011", "\n": "\\012", "\\": "\\134"}


def mangle(s: str) -> str:
    """fs/proc_namespace.c: mountinfo octal-escapes space, tab, newline and backslash, nothing else."""
    return "".join(KERNEL_ESCAPES.get(c, c) for c in s)


SAFE_CHARS = st.one_of(st.characters(min_codepoint=0x21, max_codepoint=0x7E), st.sampled_from(" \t\n\\éü日ß"))
MOUNTPOINTS = st.lists(st.text(SAFE_CHARS, min_size=1, max_size=12), max_size=4).map(lambda p: "/" + "/".join(p))
OPTIONAL = st.lists(st.sampled_from(["shared:1", "master:7", "propagate_from:3", "unbindable"]), max_size=3, unique=True)
FSTYPES = st.sampled_from(["ext4", "tmpfs", "overlay", "fuse.sshfs", "nfs4", "proc"])


@st.composite
def mount_rows(draw, mountpoints=MOUNTPOINTS):
    return (draw(st.integers(1, 10**6)), draw(mountpoints), draw(MOUNTPOINTS), draw(FSTYPES),
            draw(st.one_of(MOUNTPOINTS, st.sampled_from(["none", "tmpfs", "server:/export dir"]))),
            draw(st.sampled_from(["rw", "ro,nosuid,nodev", "rw,relatime"])), draw(OPTIONAL))


def mountinfo_text(rows) -> str:
    return "".join(f"{mid} 1 0:{i} {mangle(root)} {mangle(mp)} {opts}{''.join(' ' + o for o in optional)} - "
                   f"{fstype} {mangle(source)} rw,seclabel\n"
                   for i, (mid, mp, root, fstype, source, opts, optional) in enumerate(rows))


@FAST
@given(rows=st.lists(mount_rows(), min_size=1, max_size=5))
def test_parse_mountinfo_round_trips_kernel_escapes(rows):
    """REF-7's mount table: `parse_mountinfo` recovers mount id, mount point, root, fstype, source
    and per-mount options from kernel-formatted lines whose paths hold spaces, tabs, newlines and
    backslashes (octal \\040 \\011 \\012 \\134), with any number of optional fields."""
    got = parse_mountinfo(mountinfo_text(rows))
    assert [(m.mount_id, m.mountpoint, m.root, m.fstype, m.source, m.options) for m in got] == \
        [(mid, mp, root, fstype, source, opts) for mid, mp, root, fstype, source, opts, _ in rows]


RAW_CHARS = st.sampled_from(["\x0b", "\x0c", "\r", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
                             "\u2028", "\u2029", "\u202f", "\u3000"])


@FEW
@given(rows=st.lists(mount_rows(st.builds(lambda a, c, b: f"/mnt/{a}{c}{b}", IDENT, RAW_CHARS, IDENT)),
                     min_size=1, max_size=3))
@example(rows=[(36, "/media/u/NO\xa0NAME", "/", "vfat", "/dev/sdb1", "rw", [])])
def test_parse_mountinfo_keeps_characters_the_kernel_does_not_escape(rows):
    """REF-7's mount table: the kernel escapes only space, tab, newline and backslash; every other
    character (other Unicode whitespace and line separators included) reaches the parser raw and
    must come back unchanged in its field."""
    got = parse_mountinfo(mountinfo_text(rows))
    assert [(m.mount_id, m.mountpoint, m.source) for m in got] == [(r[0], r[1], r[4]) for r in rows]


# ================================================================================================
# CLI-1 grammar and the capability selection `direct` owns (bonus properties)
# ================================================================================================

TABLES = {"global": GLOBAL_OPTIONS, "configure": CONFIGURE_OPTIONS, "list": LIST_OPTIONS}


@FAST
@given(table=st.sampled_from(sorted(TABLES)), data=st.data())
def test_cli1_long_option_unique_prefixes(table, data):
    """CLI-1 (getopt_long): every prefix of a long option that no other option shares, and the full
    name itself, parse as that option; flags take no `=value`, required arguments take the next word."""
    options = TABLES[table]
    short, long, arg = data.draw(st.sampled_from([o for o in options if o[1]]))
    prefixes = [long[:n] for n in range(1, len(long) + 1)
                if long[:n] == long or [o[1] for o in options if o[1] and o[1].startswith(long[:n])] == [long]]
    prefix = data.draw(st.sampled_from(prefixes))
    value = data.draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8))
    args = [f"--{prefix}", value] if arg == "required" else [f"--{prefix}"]
    opts, rest = argp_parse(args + ["ROOTFS"], options, "prog", stop_at_command=False)
    assert opts == {long: [value if arg == "required" else None]} and rest == ["ROOTFS"]


CAP_SETS = st.sets(st.sampled_from(nvc_info.CAPABILITIES + ("all",)), max_size=4)


@FAST
@given(caps=CAP_SETS, entry=LIST_ENTRIES)
def test_nvc_info_selected_matches_the_cli_lists(caps, entry):
    """REF-6 / seed 003 (`direct` mounts what configure would): `selected` agrees with the CLI's own
    lists: a library iff its name is in LIBRARIES of an (expanded) capability and, for 32-bit ones,
    compat32 is asked; a binary or IPC socket iff its capability is; firmware, nvidiactl and GPU
    nodes always; nvidia-uvm* with compute; nvidia-modeset with display."""
    section, host_path = entry
    expanded = nvc_info.capabilities(",".join(caps))
    assert nvc_info.capabilities(expanded) == expanded   # expansion is idempotent
    base = os.path.basename(host_path)
    if section in ("libraries", "libraries32"):
        want = any(base.split(".so")[0] in nvc_info.LIBRARIES.get(c, []) for c in expanded) \
            and (section == "libraries" or "compat32" in expanded)
    elif section == "binaries":
        want = any(base in nvc_info.BINARIES.get(c, []) for c in expanded)
    elif section == "ipcs":
        want = dict(nvc_info.IPCS)[host_path] in expanded
    elif section == "firmwares" or base == "nvidiactl" or re.fullmatch(r"nvidia\d+", base):
        want = True
    else:
        want = ("compute" if "uvm" in base else "display") in expanded
    assert nvc_info.selected(host_path, expanded, section == "libraries32") == want
