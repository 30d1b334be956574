"""The pieces of the fixed procedure (SPEC section 4), shared by `reference`, `legacy` and `direct`.

How this works
--------------
A worker start is: take the file set from `nvidia-container-cli list` (REF-1), map each host path to
the jail-relative path where the CLI will mount it (REF-2), find which targets are missing (REF-3),
and if any are, create non-empty *markers* for them under a cross-node flock on the shared jail
(REF-5: re-check under the lock, 0755 parents, the host file's exact mode). The CLI then finds every
target present with the right st_mode, creates nothing, and its failure cleanup, which deletes only
0-byte files, can no longer unlink what other workers have mounted. After `configure` we verify
instead of trusting (REF-7: each new mount attached and > 1 KiB by path), check the NVML soname
(REF-8) and touch the done flag (REF-10).

Every path under the jail is touched through `Sys.*_beneath`, i.e. `openat2(RESOLVE_IN_ROOT)`: the
jail's own symlinks (`lib -> usr/lib`, even `/etc` or `..`) resolve inside the jail, so nothing is
ever created, chmod-ed, written or deleted outside it (REF-11), however the jail changes meanwhile.

Each fatal path raises `Fatal(kind, message)`; `python -m gpujail.reference_impl` (__main__.py)
prints it as one line on stderr and exits with that kind's code, so an orchestrator restarts the
container and a person sees what and where. What the procedure stands on outside the jail's files
(the start's context, the host's files, the lock, the namespace, the CLI) is in host.py, imported
here by name.
"""
from __future__ import annotations

import errno
import fnmatch
import os
import stat
import time

from gpujail.reference_impl.host import (  # noqa: F401 (isolate, run_configure: the steps call them as core.*)
    LIB32,
    LIB64,
    Ctx,
    Fatal,
    JailLock,
    elf32,
    for_capabilities,
    is_library,
    isolate,
    jail_mounts,
    run_configure,
    soname_pairs,
    target,
)
from gpujail.spec import (
    DIR_MARKER,
    FLAG,
    LDCONFIG_LOCK,
    PLACEHOLDER_MAX,
    PLACEHOLDER_NAME,
    REAL_CONTENT_MIN,
    last_error,
)
from gpujail.world import failpoints, history
from gpujail.world.sysops import MS_NODEV, MS_NOSUID, MS_RDONLY

MARKER = b"nvidia-placeholder-marker\n"   # 26 bytes: non-empty, far below any real library (REF-5)
LIBRARY_DIRS = (LIB64, LIB32, "usr/lib64", "usr/lib")
NVML = "libnvidia-ml.so"

assert len(MARKER) < PLACEHOLDER_MAX


def prepare(ctx: Ctx) -> Ctx:
    """The context a start runs with. The identity here; where a mutant (reference_impl/mutants.py,
    in its private copy of this module) changes the context, e.g. its Sys or its lock timeout."""
    return ctx


# -- REF-1: the file set ----------------------------------------------------------------------

def file_set(ctx: Ctx) -> list[str]:
    """Host paths from `nvidia-container-cli list`, deduplicated, in list order."""
    failpoints.hit("ref.before_list")
    code, out, err = ctx.sys.run([ctx.cli, "list"])
    if code != 0:
        raise Fatal("bad-input", f"`{ctx.cli} list` failed (exit {code}): {last_error(err, code)}")
    paths: list[str] = []
    for n, line in enumerate(out.split("\n"), 1):   # not splitlines(): \x85 or \u2028 may be in a name
        if not line.strip():
            continue
        if not line.startswith("/"):
            raise Fatal("bad-input", f"`{ctx.cli} list` line {n}: not an absolute path: {line!r}")
        if line not in paths:
            paths.append(line)
    if not paths:
        raise Fatal("bad-input", f"`{ctx.cli} list` printed no files: is the driver installed?")
    return paths


# -- REF-2: where the CLI will mount each file -------------------------------------------------





def is_debian(ctx: Ctx) -> bool:
    return _stat_beneath(ctx, "etc/debian_version") is not None


def _stat_beneath(ctx: Ctx, rel: str):
    """stat through the jail (REF-11), None if missing; anything odd on the way is fatal."""
    try:
        return ctx.sys.stat_beneath(ctx.jail, rel)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise Fatal("unsafe-jail", f"cannot resolve {rel} inside the jail {ctx.jail}: {e.strerror}") from None




def plan(ctx: Ctx, host_paths: list[str]) -> list[tuple[str, str]]:
    """(host path, jail-relative target) pairs, each checked to stay inside the jail."""
    debian = is_debian(ctx)
    ctx.elf32 = {p for p in host_paths if is_library(p) and elf32(ctx, p)}
    pairs = [(p, target(p, debian, p in ctx.elf32)) for p in host_paths]
    all_inside(ctx, pairs)
    return pairs


def all_inside(ctx: Ctx, pairs: list[tuple[str, str]]) -> None:
    """`stays_inside` for every target of `pairs`."""
    root = ctx.sys.realpath(ctx.jail)
    real_dirs: dict[str, str] = {}   # a start's sixty targets lie in five directories: each resolved once
    for _, rel in pairs:
        stays_inside(ctx, root, rel, real_dirs)


def stays_inside(ctx: Ctx, root: str, rel: str, real_dirs: dict[str, str]) -> None:
    """REF-11 where the CLI is involved: our own writes resolve beneath the jail (openat2), but the
    CLI resolves its targets on the host (firmware by a plain join, `stat` and `mkdir` following
    symlinks), so a jail symlink that leads out (absolute, or `..`) would make *the CLI* write
    outside. Refuse such a jail before anything runs."""
    real = _resolved(ctx, os.path.join(ctx.jail, rel), real_dirs)
    if real != root and not real.startswith(root + "/"):
        raise Fatal("unsafe-jail", f"{ctx.jail}/{rel} resolves to {real}, outside the jail: "
                                   "refusing (nvidia-container-cli would follow it)")


def _resolved(ctx: Ctx, path: str, real_dirs: dict[str, str]) -> str:
    """realpath(path), the directory's part remembered in `real_dirs`: a name that is no symlink
    (or does not exist) adds itself to its directory's real path, as realpath would add it."""
    d, name = os.path.split(path)
    if name in ("", ".", ".."):
        return ctx.sys.realpath(path)
    if d not in real_dirs:
        real_dirs[d] = ctx.sys.realpath(d)
    try:
        if stat.S_ISLNK(ctx.sys.lstat(os.path.join(real_dirs[d], name)).st_mode):
            return ctx.sys.realpath(path)
    except OSError:
        pass
    return os.path.join(real_dirs[d], name)


# -- REF-3..5: markers under the lock ----------------------------------------------------------

def is_old_placeholder(st) -> bool:
    """REF-3: a 0-byte regular file is a placeholder from before the fix (or from another tool):
    the CLI's cleanup would unlink it from under the mounts other nodes have on it."""
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def needs_marker(ctx: Ctx, rel: str) -> bool:
    """REF-3: the target is missing, or is an old 0-byte placeholder (a node-local /dev or /run
    entry exists and is not a regular file); REF-12: a soname target that is still ldconfig's
    symlink."""
    st = _stat_beneath(ctx, rel)
    return st is None or is_old_placeholder(st) or stale_soname_link(ctx, rel)


def _is_link(ctx: Ctx, rel: str) -> bool:
    st = _lstat_in_jail(ctx, rel)
    return st is not None and stat.S_ISLNK(st.st_mode)


def stale_soname_link(ctx: Ctx, rel: str) -> bool:
    """REF-12: `rel` is a soname target that is a symlink leading somewhere other than this node's
    own library (another driver version's, a placeholder of another name). A link to our own
    library is left alone: once configure mounts that library it resolves to our content, and in a
    fleet on one driver version the workers that still run an older procedure keep their links."""
    if rel not in ctx.sonames or not _is_link(ctx, rel):
        return False
    try:
        link = ctx.sys.readlink(os.path.join(ctx.jail, rel))
    except OSError:
        return True
    return os.path.normpath(os.path.join(os.path.dirname(rel), link)) != ctx.sonames[rel]


def kept_soname_link(ctx: Ctx, rel: str) -> bool:
    """REF-12: a soname target that is a link to our own library, left alone (nothing to mount)."""
    return rel in ctx.sonames and _is_link(ctx, rel) and not stale_soname_link(ctx, rel)


def missing(ctx: Ctx, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """REF-3: the pairs whose target needs a marker."""
    return [(h, t) for h, t in pairs if needs_marker(ctx, t)]




def make_parents(ctx: Ctx, rel: str) -> None:
    """Create the missing parents of `rel` beneath the jail, mode 0755 (REF-5)."""
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        st = _stat_beneath(ctx, d)
        if st is None:
            try:
                ctx.sys.mkdir_beneath(ctx.jail, d, 0o755)
            except FileExistsError:
                # Another worker made it between our stat and mkdir (fine), or the name is a
                # symlink that leads nowhere inside the jail (hostile: refuse).
                if _stat_beneath(ctx, d) is None:
                    raise Fatal("unsafe-jail", f"{ctx.jail}/{d} is a symlink that does not resolve "
                                               "inside the jail") from None
            except OSError as e:
                raise Fatal("jail-write-failed", f"cannot create directory {ctx.jail}/{d}: {e.strerror}") from None
        elif not stat.S_ISDIR(st.st_mode):
            raise Fatal("unsafe-jail", f"{ctx.jail}/{d} is not a directory (mode {st.st_mode:o})")


def create_markers(ctx: Ctx, todo: list[tuple[str, str]]) -> None:
    """REF-5 under the lock: re-check, then a non-empty marker with the host file's exact mode."""
    for host_path, rel in todo:
        if not needs_marker(ctx, rel):
            continue   # an earlier lock holder created or filled it
        try:
            st = ctx.sys.stat(host_path)
        except OSError as e:
            raise Fatal("bad-input", f"listed host file {host_path}: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):   # REF-3: the MPS pipe directory gets a directory, never a marker
            make_parents(ctx, rel + "/")
            # ... holding a marker: a failing CLI's cleanup removes an *empty* directory it mounted
            # over (CLI-6), and with it every other node's mount on it (K-1); rmdir meets ENOTEMPTY.
            keep = f"{rel}/{DIR_MARKER}"
            if needs_marker(ctx, keep):
                place_marker(ctx, keep, 0o644)
        else:
            place_marker(ctx, rel, stat.S_IMODE(st.st_mode))


def place_marker(ctx: Ctx, rel: str, mode: int, attempts: int = 3) -> None:
    """One target of REF-5: a marker created exclusively, or written into an old 0-byte placeholder.

    The lock serialises only the nodes it reaches: with node-local locks, or a lease lost on a
    network filesystem, another node can create the target between our re-check and our exclusive
    create. EEXIST is then no error (REF-5): the target is re-checked as REF-3 does, so a non-empty
    placeholder is accepted and a 0-byte one (that node's create, not yet written) is filled in place.
    Both nodes write the same marker at offset 0 with the same mode, so the race is harmless."""
    for _ in range(attempts):
        if kept_soname_link(ctx, rel):
            return
        if stale_soname_link(ctx, rel):
            # REF-12: a soname link to another driver's library becomes a marker. A symlink carries
            # no mount (every implementation of REF-12 replaces it under this lock before mounting),
            # so removing it detaches nothing.
            try:
                ctx.sys.unlink_beneath(ctx.jail, rel)
            except FileNotFoundError:
                pass
        elif _stat_beneath(ctx, rel) is not None:
            if needs_marker(ctx, rel):
                fill_in_place(ctx, rel, mode)
            return
        make_parents(ctx, rel)
        failpoints.hit("ref.before_marker", path=rel)
        try:
            ctx.sys.write_new_beneath(ctx.jail, rel, MARKER, mode)
        except FileExistsError:
            history.record("impl.marker.exists", path=rel)   # another node's, meanwhile: re-check
            continue
        except OSError as e:
            raise Fatal("jail-write-failed", f"cannot create marker {ctx.jail}/{rel}: {e.strerror}") from None
        history.record("impl.marker", path=rel, mode=oct(mode))
        return
    raise Fatal("jail-write-failed", f"cannot create marker {ctx.jail}/{rel}: it appeared and went {attempts} "
                                     "times under the lock (do other nodes' locks serialise with ours?)")


def fill_in_place(ctx: Ctx, rel: str, mode: int) -> None:
    """REF-3 under the lock: the marker written into an old 0-byte placeholder *in place* (no
    O_CREAT, no O_TRUNC, same inode). Never unlinked or renamed over: other nodes may have live
    mounts on that inode, and removing it would detach them (K-1, K-2)."""
    failpoints.hit("ref.before_marker", path=rel)
    try:
        filled = ctx.sys.fill_empty_beneath(ctx.jail, rel, MARKER, mode)
    except OSError as e:
        raise Fatal("jail-write-failed", f"cannot write the marker into the 0-byte placeholder "
                                         f"{ctx.jail}/{rel}: {e.strerror}") from None
    if filled:
        history.record("impl.marker", path=rel, mode=oct(mode), in_place=True)


def ensure_placeholders(ctx: Ctx, pairs: list[tuple[str, str]]) -> None:
    """REF-3..5: warm path (nothing missing) takes no lock; cold path creates markers under it."""
    todo = missing(ctx, pairs)
    history.record("impl.placeholders", total=len(pairs), missing=len(todo))
    if not todo:
        return   # REF-4
    with JailLock(ctx):
        failpoints.hit("ref.after_lock")
        create_markers(ctx, todo)
        failpoints.hit("ref.before_unlock")


# -- REF-12: per-node sonames ------------------------------------------------------------------



def with_sonames(ctx: Ctx, pairs: list[tuple[str, str]]) -> tuple[Ctx, list[tuple[str, str]]]:
    """The context knowing its soname targets, and those targets' pairs (REF-12)."""
    sonames = soname_pairs(ctx, pairs)
    ctx.sonames = {rel: f"{os.path.dirname(rel)}/{os.path.basename(host)}" for host, rel in sonames}
    return ctx, sonames


# -- REF-7: verify, do not trust -------------------------------------------------------------





def verify(ctx: Ctx, before: dict, expected: list[tuple[str, str]] = (), min_size: int = REAL_CONTENT_MIN) -> list[str]:
    """Every file `expected` (host path, target) must be attached in this namespace, and every new
    mount must show real content by path (> 1 KiB: a marker passes an existence check, not this
    one). Checked against what should be there, not only against the mount table: a mount that was
    detached between configure and now (another node's CLI cleanup unlinked its placeholder, K-1)
    is simply gone from the table. Returns the jail-relative mount targets."""
    failpoints.hit("ref.before_verify")
    after = jail_mounts(ctx)
    new = list(dict.fromkeys(m.mountpoint for i, m in after.items() if i not in before))
    if not new:
        raise Fatal("verify-failed", "the CLI reported success but created no mounts under the jail")
    real_dirs, attached = {}, set(new)
    gone = [rel for _, rel in expected if _resolved(ctx, os.path.join(ctx.jail, rel), real_dirs) not in attached]
    if gone:
        more = f" (and {len(gone) - 1} more)" if len(gone) > 1 else ""
        raise Fatal("verify-failed", f"{ctx.jail}/{gone[0]}: not mounted after configure{more}: detached "
                                     "meanwhile, or never mounted")
    for mountpoint in new:
        rel = os.path.relpath(mountpoint, ctx.jail)
        st = _stat_beneath(ctx, rel)
        if st is None:
            raise Fatal("verify-failed", f"{mountpoint}: mount detached right after configure")
        if stat.S_ISREG(st.st_mode) and st.st_size <= min_size:
            raise Fatal("verify-failed", f"{mountpoint}: {st.st_size} bytes through the jail, expected the "
                                         f"driver file (> {min_size} bytes): a placeholder, not a mount")
    history.record("impl.verified", mounts=len(new))
    return [os.path.relpath(p, ctx.jail) for p in new]


# -- REF-8: the NVML soname -------------------------------------------------------------------

def soname_ok(ctx: Ctx, libdir: str) -> bool:
    st = _stat_beneath(ctx, f"{libdir}/{NVML}.1")
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_size > REAL_CONTENT_MIN


def ensure_soname(ctx: Ctx, mounted: list[str]) -> None:
    """When NVML was mounted, libnvidia-ml.so.1 must resolve to real content; repair with the
    jail's ldconfig under its own lock (re-checked under it, so only when stale)."""
    failpoints.hit("ref.before_soname")
    nvml = [p for p in mounted if os.path.basename(p).startswith(NVML + ".") and not p.endswith(".so.1")]
    if not nvml:
        return
    libdir = os.path.dirname(nvml[0])
    if soname_ok(ctx, libdir):
        return
    with JailLock(ctx, LDCONFIG_LOCK):
        if not soname_ok(ctx, libdir):
            code, _, err = ctx.sys.run(["ldconfig", "-r", ctx.jail])
            history.record("impl.ldconfig", code=code)
            if code != 0:
                raise Fatal("soname-failed", f"ldconfig -r {ctx.jail} failed (exit {code}): {last_error(err, code)}")
    if not soname_ok(ctx, libdir):
        raise Fatal("soname-failed", f"{ctx.jail}/{libdir}/{NVML}.1 does not resolve to the mounted "
                                     f"{os.path.basename(nvml[0])} even after ldconfig")


# -- REF-10 -----------------------------------------------------------------------------------

def mark_done(ctx: Ctx) -> None:
    failpoints.hit("ref.before_ready")
    if _stat_beneath(ctx, FLAG) is not None:
        return   # warm start: nothing to write (and a read-only jail stays fine)
    try:
        ctx.sys.touch_beneath(ctx.jail, FLAG)
    except OSError as e:
        raise Fatal("jail-write-failed", f"cannot touch {ctx.jail}/{FLAG}: {e.strerror}") from None


# -- REF-9: placeholders, populate-jail cleanup, CPU/login dummy mounts -----------------------

def is_placeholder(name: str, st: os.stat_result) -> bool:
    """REF-9: a regular file (not a symlink) named lib*.so.* smaller than 64 bytes."""
    return stat.S_ISREG(st.st_mode) and fnmatch.fnmatchcase(name, PLACEHOLDER_NAME) and st.st_size < PLACEHOLDER_MAX


def is_empty_file(name: str, st: os.stat_result) -> bool:
    """The legacy predicate: any empty regular file."""
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def placeholders(ctx: Ctx, predicate=is_placeholder) -> list[str]:
    """Jail-relative paths matching `predicate` in the jail's library directories (lstat: never
    following a symlink; a directory reached through a symlink is skipped)."""
    found = []
    for d in LIBRARY_DIRS:
        st = _lstat_in_jail(ctx, d)
        if st is None or not stat.S_ISDIR(st.st_mode):
            continue
        for name in sorted(ctx.sys.listdir(os.path.join(ctx.jail, d))):
            rel = f"{d}/{name}"
            st = _lstat_in_jail(ctx, rel)
            if st is not None and predicate(name, st):
                found.append(rel)
    return found


def _lstat_in_jail(ctx: Ctx, rel: str):
    """lstat of jail/rel, but only if no component on the way is a symlink (else None)."""
    path = ctx.jail
    st = None
    for part in rel.split("/"):
        path = os.path.join(path, part)
        try:
            st = ctx.sys.lstat(path)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode) and path != os.path.join(ctx.jail, rel):
            return None
    return st


def populate_cleanup(ctx: Ctx, predicate=is_placeholder) -> list[str]:
    """On a reused jail: remove every placeholder and the installed flag (REF-9)."""
    removed, began = [], time.monotonic()
    for rel in placeholders(ctx, predicate):
        try:
            ctx.sys.unlink_beneath(ctx.jail, rel)
            removed.append(rel)
        except FileNotFoundError:
            pass
    try:
        ctx.sys.unlink_beneath(ctx.jail, FLAG)
    except FileNotFoundError:
        pass
    history.record("impl.populate_cleanup", removed=removed, began=began)
    return removed


def dummy_library(directory: str = "/run/gpujail") -> str:
    """A loadable stand-in library on node-local storage (/run is per-node: tmpfs in a container)."""
    from gpujail.fixtures.elf import shared_object  # the one ELF writer of the project
    path = os.path.join(directory, "libdummy.so")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(shared_object("libdummy.so", size=2048, tag=b"gpujail dummy library"))
        os.rename(path + ".tmp", path)
    return path


def dummy_mounts(ctx: Ctx, dummy: str, predicate=is_placeholder) -> list[str]:
    """CPU workers and login nodes: once the GPU flag exists, bind a dummy library over each
    placeholder in this namespace, so programs linked against NVIDIA libraries start (REF-9)."""
    if _stat_beneath(ctx, FLAG) is None:
        history.record("impl.dummy_mounts", mounted=[], reason="no flag")
        return []
    mounted = []
    for rel in placeholders(ctx, predicate):
        try:
            failpoints.hit("ref.before_dummy_mount", path=rel)
            ctx.sys.bind_mount_beneath(dummy, ctx.jail, rel, MS_RDONLY | MS_NODEV | MS_NOSUID)
            mounted.append(rel)
        except OSError as e:
            if e.errno != errno.ENOENT:  # a placeholder removed meanwhile is fine
                raise Fatal("jail-write-failed", f"cannot mount dummy over {ctx.jail}/{rel}: {e.strerror}") from None
    history.record("impl.dummy_mounts", mounted=mounted)
    return mounted
