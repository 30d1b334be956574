"""The one small interface every file-system and mount step goes through.

How this works
--------------
The fake CLI (`fixtures/fake_cli.py`) and the bundled implementations (`reference_impl/`) never call
`os` or `mount(2)` directly: they call a `Sys` object. `RealSys` below is plain syscalls in the
calling process's mount namespace (kernel and docker backends); a model of the shared file system
(the deterministic backend) implements the same methods, so each procedure is written once.

Two families of path operations:

* plain paths (`stat`, `mkdir`, `create`, `unlink`, ...): what the real `nvidia-container-cli`
  does, races and all (SPEC CLI-4..6);
* `*_beneath(root, rel, ...)`: resolution confined to `root` as if it were `/` (SPEC REF-11). The
  real implementation uses `openat2(RESOLVE_IN_ROOT)`, so a symlink swapped in while we run can
  never take a write outside the jail: absolute links and `..` resolve inside it, as in a chroot.

`resolve_in_root` is the same chroot-like resolution done in Python over `lstat`/`readlink`; the CLI
uses it to compute destinations (its `path_resolve_full`), and `reference` to map targets (REF-2).
"""
from __future__ import annotations

import collections
import ctypes
import errno
import fcntl
import mmap
import os
import signal
import stat as statmod
import threading
import time

_libc = ctypes.CDLL("libc.so.6", use_errno=True)   # not find_library: it runs ldconfig -p
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
O_PATH = getattr(os, "O_PATH", 0o10000000)
_SYS_OPENAT2 = 437  # x86_64 and aarch64 share this number
RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x02, 0x10
_MAX_SYMLINKS = 40


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _check(ret: int, what: str, path: str) -> None:
    if ret < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}", path)


# One line of /proc/self/mountinfo, the fields the suite looks at.
Mount = collections.namedtuple("Mount", "mount_id mountpoint root fstype source options")


def _unescape(field: str) -> str:
    # mountinfo octal-escapes space, tab, newline and backslash (fs/proc_namespace.c mangle()).
    if "\\" not in field:   # the usual field, returned at once: a node's table has hundreds
        return field
    out, i = [], 0
    while i < len(field):
        esc = field[i + 1:i + 4]
        if field[i] == "\\" and len(esc) == 3 and esc.isdigit():
            out.append(chr(int(esc, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    # Split on "\n" and " " only: the kernel escapes just those (and tab, backslash); any other
    # white space (no-break space, \v, \u2028 ...) is part of a mount point.
    for line in filter(None, text.split("\n")):
        left, _, right = line.partition(" - ")
        f, r = left.split(" "), right.split(" ")
        mounts.append(Mount(int(f[0]), _unescape(f[4]), _unescape(f[3]), r[0], _unescape(r[1]), f[5]))
    return mounts


class LockTimeout(Exception):
    pass


# How `run` may start a program without an exec: (argv, timeout) -> (code, stdout, stderr), or None
# for "exec it". Set in a bundled implementation its node forked warm, for the bundled fake CLI
# (gpujail/backends/cli_server.py); None everywhere else.
run_without_exec = None


class RealSys:
    """Plain syscalls in this process's mount namespace."""

    # -- plain paths (what the real CLI does) ---------------------------------------------------
    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def lstat(self, path: str) -> os.stat_result:
        return os.lstat(path)

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def read_image(self, path: str):
        """The whole file as read-only bytes, mapped rather than read: an ELF library's dynamic section
        (REF-12's sonames) lies megabytes in on real drivers (libc.so.6's at 1.8 MiB)."""
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)

    def realpath(self, path: str) -> str:
        """Resolve every symlink the way the host kernel would (not confined to any root)."""
        return os.path.realpath(path)

    def symlink(self, target: str, path: str) -> None:
        os.symlink(target, path)

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(path, mode)

    def create(self, path: str, mode: int) -> None:
        """open(O_NOFOLLOW|O_CREAT) as libnvidia-container's file_create: no O_EXCL, no O_TRUNC."""
        os.close(os.open(path, os.O_NOFOLLOW | os.O_CREAT | os.O_WRONLY, mode & 0o7777))

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode & 0o7777)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    # -- mounts ---------------------------------------------------------------------------------
    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
        enc = lambda s: None if s is None else s.encode()
        _check(_libc.mount(enc(source), target.encode(), enc(fstype), flags, enc(data)), "mount", target)

    def bind_mount(self, source: str, target: str) -> None:
        self.mount(source, target, None, MS_BIND)

    def remount(self, target: str, flags: int = MS_RDONLY | MS_NODEV | MS_NOSUID) -> None:
        """Change a bind mount's per-mount flags (MS_BIND|MS_REMOUNT), e.g. to read-only."""
        self.mount(None, target, None, MS_BIND | MS_REMOUNT | flags)

    def umount(self, target: str, flags: int = MNT_DETACH) -> None:
        _check(_libc.umount2(target.encode(), flags), "umount", target)

    def mounts(self) -> list[Mount]:
        with open("/proc/self/mountinfo") as f:
            return parse_mountinfo(f.read())

    def make_private(self, path: str, below: bool = True) -> None:
        """The mount holding `path` private in this namespace and, with `below`, every mount under
        `path` too: nothing mounted or unmounted there from now on reaches another namespace (a host
        whose `/` is shared, as systemd makes it; a Kubernetes Bidirectional volume), nor arrives
        from one. As runc's rootfsParentMountPrivate finds the holder: MS_PRIVATE on `path`, then on
        each parent, until one is a mount point (EINVAL: "not a mount point"; mountinfo is not
        enough, a mount listed at a path may be hidden under a later mount of a parent). When `path`
        is itself a mount point (the usual jail), one recursive call covers everything under it;
        else the holder alone (the mounts beside `path` keep their propagation), then each topmost
        mount under `path`, recursively."""
        holder = path
        while True:
            try:
                self.mount(None, holder, None, MS_REC | MS_PRIVATE if below and holder == path else MS_PRIVATE)
                break
            except OSError as e:
                if e.errno != errno.EINVAL or holder == "/":
                    raise
                holder = os.path.dirname(holder)
        if holder == path or not below:
            return
        prefix = path.rstrip("/") + "/"
        under = list(dict.fromkeys(m.mountpoint for m in self.mounts() if m.mountpoint.startswith(prefix)))
        for point in under:
            if any(point.startswith(q + "/") for q in under):
                continue   # below another one: its MS_REC covers it
            try:
                self.mount(None, point, None, MS_REC | MS_PRIVATE)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOENT):   # listed, but hidden under a later mount
                    raise

    # -- locks (SPEC K-4) -----------------------------------------------------------------------
    def lock(self, fd: int, timeout: float | None) -> float:
        """flock(LOCK_EX) with a bounded wait, like `flock -w`: a blocking flock interrupted by a
        timer, so the waiter queues in the kernel (visible in /proc/locks) and wakes the moment
        the lock is released. Returns seconds waited; raises LockTimeout."""
        start = time.monotonic()
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return time.monotonic() - start
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return 0.0
        except BlockingIOError:
            pass
        if threading.current_thread() is not threading.main_thread():  # timers signal the main thread
            while time.monotonic() - start < timeout:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return time.monotonic() - start
                except BlockingIOError:
                    time.sleep(0.002)
            raise LockTimeout(f"lock not acquired within {timeout:g}s")

        def expired(signum, frame):
            raise LockTimeout(f"lock not acquired within {timeout:g}s")

        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return time.monotonic() - start

    def unlock(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    # -- confined to a root (SPEC REF-11) -------------------------------------------------------
    _openat2_refused = False   # ENOSYS or EPERM once: this kernel or seccomp profile has no openat2

    def _openat2(self, root: str, rel: str, flags: int, mode: int = 0) -> int:
        rootfd = os.open(root, O_PATH | os.O_DIRECTORY)
        try:
            if not RealSys._openat2_refused:
                how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
                for _ in range(16):   # EAGAIN: a mount or rename anywhere on the host raced a `..`
                    # (openat2(2): "the caller may choose to retry"); a busy host does this often
                    fd = _libc.syscall(_SYS_OPENAT2, rootfd, rel.encode(), ctypes.byref(how), ctypes.sizeof(how))
                    if fd >= 0 or ctypes.get_errno() != errno.EAGAIN:
                        break
                if fd >= 0 or ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM):
                    _check(fd, "openat2", os.path.join(root, rel))
                    return fd
                RealSys._openat2_refused = True
            return open_in_root(rootfd, rel, flags, mode)
        finally:
            os.close(rootfd)

    def _parent_beneath(self, root: str, rel: str) -> tuple[int, str]:
        parent, name = os.path.split(rel.strip("/"))
        if name in ("", ".", ".."):
            raise OSError(errno.EINVAL, "not a file name", os.path.join(root, rel))
        return self._openat2(root, parent or ".", O_PATH | os.O_DIRECTORY), name

    def stat_beneath(self, root: str, rel: str) -> os.stat_result:
        fd = self._openat2(root, rel, O_PATH)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def mkdir_beneath(self, root: str, rel: str, mode: int) -> None:
        pfd, name = self._parent_beneath(root, rel)
        try:
            os.mkdir(name, mode, dir_fd=pfd)
            # mkdir honours the umask; REF-5 wants exactly `mode`. chmod through an O_NOFOLLOW fd.
            fd = os.open(name, O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=pfd)
            try:
                os.chmod(f"/proc/self/fd/{fd}", mode)
            finally:
                os.close(fd)
        finally:
            os.close(pfd)

    def write_new_beneath(self, root: str, rel: str, data: bytes, mode: int) -> None:
        """Create a new file (O_EXCL|O_NOFOLLOW) beneath root, write data, set the exact mode."""
        pfd, name = self._parent_beneath(root, rel)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(root, rel))
                os.fchmod(fd, mode & 0o7777)
            except OSError:
                # Never leave a truncated file behind: an empty one is exactly the placeholder a
                # failing CLI deletes from under other workers' mounts. It is ours, just created.
                os.unlink(name, dir_fd=pfd)
                raise
            finally:
                os.close(fd)
        finally:
            os.close(pfd)

    def fill_empty_beneath(self, root: str, rel: str, data: bytes, mode: int) -> bool:
        """Write `data` into the existing 0-byte regular file root/rel *in place* (SPEC REF-3): no
        O_CREAT, no O_TRUNC, never unlinked or renamed, so the inode others may have live mounts on
        stays the same. Then set the exact mode. False (nothing written) if it is no longer an empty
        regular file (an earlier lock holder filled it)."""
        fd = self._openat2(root, rel, os.O_WRONLY | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not statmod.S_ISREG(st.st_mode) or st.st_size != 0:
                return False
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(root, rel))
            os.fchmod(fd, mode & 0o7777)
            return True
        finally:
            os.close(fd)

    def open_lock_beneath(self, root: str, rel: str) -> int:
        """An fd for flock on a lock file beneath root, created if missing."""
        return self._openat2(root, rel, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)

    def unlink_beneath(self, root: str, rel: str) -> None:
        pfd, name = self._parent_beneath(root, rel)
        try:
            os.unlink(name, dir_fd=pfd)
        finally:
            os.close(pfd)

    def touch_beneath(self, root: str, rel: str, mode: int = 0o644) -> None:
        os.close(self._openat2(root, rel, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, mode))

    def bind_mount_beneath(self, source: str, root: str, rel: str, flags: int) -> None:
        """Bind `source` over root/rel, resolved beneath root (last component not followed), then
        remount it with `flags`. Mounting through the O_PATH fd's magic link pins the exact inode
        we resolved, so a symlink swapped in meanwhile cannot redirect the mount."""
        fd = self._openat2(root, rel, O_PATH | os.O_NOFOLLOW)
        try:
            target = f"/proc/self/fd/{fd}"
            self.bind_mount(source, target)
        finally:
            os.close(fd)
        fd = self._openat2(root, rel, O_PATH | os.O_NOFOLLOW)
        try:
            self.remount(f"/proc/self/fd/{fd}", flags)
        finally:
            os.close(fd)

    # -- sub-steps ------------------------------------------------------------------------------
    def run(self, argv: list[str], timeout: float | None = None) -> tuple[int, str, str]:
        """Run a program (the CLI, ldconfig); returns (exit code, stdout, stderr). `chroot ROOT PROG
        ...` is done with chroot(2) here: a minimal image (the docker backend's worker) has no chroot(8)."""
        import subprocess  # here, not at the top: most callers never run anything
        preexec = None
        if argv[0] == "chroot":
            root, argv = argv[1], argv[2:]

            def preexec():
                os.chroot(root)
                os.chdir("/")
        done = run_without_exec(argv, timeout) if run_without_exec and not preexec else None
        if done is not None:
            return done
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                               preexec_fn=preexec)
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: command not found\n"
        return p.returncode, p.stdout, p.stderr


def open_in_root(rootfd: int, rel: str, flags: int, mode: int = 0) -> int:
    """openat2(RESOLVE_IN_ROOT) done by hand (SPEC REF-11), where the kernel has no openat2 (before
    5.6, e.g. RHEL 8's 4.18) or a seccomp profile refuses it: one component at a time from the
    root's descriptor, and the kernel never follows a symlink (O_NOFOLLOW at every step). Each link
    is read and its target walked again from where it sits, an absolute one from the root, and `..`
    stops at the root, as in a chroot: whatever the jail holds or gains meanwhile, the result lies
    beneath the root. The last component is opened with `flags` (O_CREAT included) and followed
    unless `flags` has O_NOFOLLOW."""
    if not rel:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), rel)   # as openat2: no empty path
    todo = [c for c in reversed(rel.split("/")) if c not in ("", ".")]   # a stack: a link pushes its target
    dirs = [os.dup(rootfd)]   # the directories walked, from the root down: `..` pops one
    links = 0
    try:
        while todo:
            name = todo.pop()
            if name == "..":
                if len(dirs) > 1:
                    os.close(dirs.pop())
                continue
            last = not todo
            try:
                fd = os.open(name, (flags if last else O_PATH) | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirs[-1])
            except OSError as e:   # the last component is a symlink that flags want followed:
                # ELOOP, or ENOTDIR with O_DIRECTORY (O_NOFOLLOW made the link itself the candidate)
                if not (last and e.errno in (errno.ELOOP, errno.ENOTDIR) and not flags & os.O_NOFOLLOW
                        and _is_link(name, dirs[-1])):
                    raise
            else:
                if (last and flags & os.O_NOFOLLOW) or not statmod.S_ISLNK(os.fstat(fd).st_mode):
                    if last:
                        return fd
                    dirs.append(fd)   # a file that is no directory: the next open says ENOTDIR
                    continue
                os.close(fd)          # O_PATH opened the link itself: follow it by hand
            links += 1
            if links > _MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel)
            link = os.readlink(name, dir_fd=dirs[-1])
            if link.startswith("/"):
                while len(dirs) > 1:
                    os.close(dirs.pop())
            todo.extend(c for c in reversed(link.split("/")) if c not in ("", "."))
        return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=dirs[-1])   # the root, or `..` last
    finally:
        for d in dirs:
            os.close(d)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return statmod.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def resolve_in_root(sys, root: str, path: str) -> str:
    """Resolve `path` as if `root` were `/` (absolute links stay inside `root`), like
    libnvidia-container's path_resolve_full: a `..` that would climb above the root is an error
    (EXDEV, "resolves outside of"), and missing components are kept as they are, so the result
    names where a file *would* be created. The last component is resolved too (like stat).
    """
    root = os.path.abspath(root)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    missing_at = None   # index in `done` of the first missing component: nothing below it is a link
    hops = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            if not done:
                raise OSError(errno.EXDEV, f"{path} resolves outside of {root}", path)
            done.pop()
            if missing_at is not None and len(done) <= missing_at:
                missing_at = None   # back in existing territory: links count again
            continue
        candidate = os.path.join(root, *done, name)
        st = None
        if missing_at is None:
            try:
                st = sys.lstat(candidate)
            except (FileNotFoundError, NotADirectoryError):
                missing_at = len(done)
        if st is not None and statmod.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_SYMLINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", candidate)
            target = sys.readlink(candidate)
            if target.startswith("/"):
                done, missing_at = [], None
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        done.append(name)
    return os.path.join(root, *done)
