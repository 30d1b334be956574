"""The model's `Sys`: gpujail/world/sysops.py's interface on the model, one simulated process each.

How this works
--------------
Every method is a scheduling point (`_op`: the baton is taken in sched.py's `Simulation.step`,
then the call acts on fs.py's tree through the process's namespace, and the step is traced with its
outcome). So an implementation, the fake CLI and the mutants run unchanged on the model: they only
ever see this interface. Two calls are more than one system call:

* `run(argv)` runs the fake CLI in-process as a simulated child process (same namespace, its own
  failpoints and stdout; a `kill` failpoint kills only that child, whose mounts stay), and models
  `ldconfig -r ROOT` (soname links for every ELF file, read through the caller's mounts);
* `lock(fd)` blocks the worker (not runnable) until the flock is free, or times out in virtual
  time when nobody who could release it can run (REF-5's bounded wait).

Each worker's jail has its own procfs on JAIL/proc, as a kernel node's has (gpujail/backends/node_view.py):
`stat` shows `JAIL/proc/<pid>` for the calling process and its ancestors in the worker (`/proc/<pid>`
too: the host's), `getppid` names the parent, and `setns(".../<pid>/ns/mnt")` moves the calling
process into that process's namespace. So a standalone CLI finds its parent and mounts where its
parent lives (SPEC CLI-5), as on the kernel backend.
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import stat as st
import threading

from gpujail.fixtures import elf
from gpujail.world import failpoints
from gpujail.world.sysops import MS_RDONLY, LockTimeout, Mount

from .fs import JAIL, S_IFDIR, S_IFLNK, S_IFREG, UMASK, Inode, ModelMount, Namespace, Walk, err
from .sched import Killed, Proc

# The directories `ldconfig -r` scans in a Debian jail (its built-in list plus the multiarch ones).
LDCONFIG_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu", "usr/lib64", "usr/lib")

local = threading.local()   # this thread's simulated process's stdout and stderr


class Routed(io.TextIOBase):
    """sys.stdout/stderr while a simulation runs: each simulated process prints to its own buffer."""

    def __init__(self, name: str, fallback):
        self.name, self.fallback = name, fallback

    def write(self, s):
        target = getattr(local, self.name, None) or self.fallback
        return target.write(s)

    def flush(self):
        pass


def _op(effect: str = ""):
    """Make a ModelSys method a scheduling point, traced with its outcome. `effect`: "" for a look,
    "write" for anything that changes the tree or a mount table, "remove" for unlink and rmdir."""
    def wrap(fn):
        name = fn.__name__

        def op(self, *args, **kw):
            entry = self.world.step(self.proc, name, args, effect)
            try:
                return fn(self, *args, **kw)
            except OSError as e:
                entry.error = errno.errorcode.get(e.errno, str(e.errno))
                raise
        op.__name__ = name
        return op
    return wrap


class ModelSys:
    """gpujail/sysops.py's interface, on the model, for one simulated process in one namespace."""

    def __init__(self, world, proc: Proc):   # world: a world.ModelWorld
        self.world, self.proc, self.fs = world, proc, world.fs
        self.entered: Namespace | None = None   # set by setns: another process's namespace

    @property
    def ns(self) -> Namespace:
        return self.entered or self.proc.worker.ns

    def _proc_entry(self, path: str) -> Proc | None:
        """The living process a procfs directory names: `/proc/<pid>` (the host's proc) or
        `JAIL/proc/<pid>` (the worker's own). A model process knows its ancestors only, which is
        all a CLI looks up (its parent, or the `--pid` its caller passes)."""
        m = re.fullmatch(r"(.*)/proc/(\d+)", os.path.normpath(path))
        if m is None or m.group(1) not in ("", JAIL):
            return None
        p = self.proc
        while p is not None and not (p.pid == int(m.group(2)) and p.alive):
            p = p.parent
        return p

    def getppid(self) -> int:
        """Every process of a model worker is in the worker's PID namespace: the parent's pid, or 0
        for a process without one (the worker's first). A parent in another worker (only a test
        builds one) stands for a helper in another mount namespace of the same PID namespace."""
        return self.proc.parent.pid if self.proc.parent is not None else 0

    @_op()
    def setns(self, path):
        """setns(CLONE_NEWNS) through `<proc>/ns/mnt` (utils.c ns_enter)."""
        proc = self._proc_entry(path.removesuffix("/ns/mnt")) if path.endswith("/ns/mnt") else None
        if proc is None:
            raise err(errno.ENOENT, path)
        self.entered = proc.worker.ns

    def _existing(self, path: str, follow: bool = True, root: str = "/") -> Walk:
        w = self.fs.walk(self.ns, path, follow, root)
        if w.node is None:
            raise err(errno.ENOENT, path)
        return w

    # -- plain paths -------------------------------------------------------------------------------
    @_op()
    def stat(self, path):
        if self._proc_entry(path) is not None:   # the worker's procfs (see the module's docstring)
            return os.stat_result((S_IFDIR | 0o555, 0, 0, 9, 0, 0, 0, 0, 0, 0))
        return self._existing(path).node.stat()

    @_op()
    def lstat(self, path):
        return self._existing(path, follow=False).node.stat()

    @_op()
    def readlink(self, path):
        node = self._existing(path, follow=False).node
        if node.target is None:
            raise err(errno.EINVAL, path)
        return node.target

    @_op()
    def read_image(self, path):
        return self._existing(path).node.data

    @_op()
    def realpath(self, path):
        """Host semantics, like os.path.realpath: links followed, missing components kept."""
        parts = [p for p in path.split("/") if p]
        for i in range(len(parts), 0, -1):
            try:
                w = self.fs.walk(self.ns, "/" + "/".join(parts[:i]))
            except OSError:
                continue   # a missing directory on the way: keep that part as it is
            return os.path.normpath("/".join([w.path, *parts[i:]]))
        return os.path.normpath(path)

    @_op("write")
    def symlink(self, target, path):
        self._add(self._new_entry(path), Inode(S_IFLNK | 0o777, target=target))

    @_op("write")
    def mkdir(self, path, mode):
        self._add(self._new_entry(path), Inode(S_IFDIR | (mode & 0o7777 & ~UMASK)))

    @_op("write")
    def create(self, path, mode):
        """open(O_NOFOLLOW|O_CREAT), no O_EXCL, no O_TRUNC: an existing file is reused as it is."""
        self._open_for_write(self.fs.walk(self.ns, path, follow=False), mode)

    @_op("write")
    def chmod(self, path, mode):
        w = self._existing(path)
        self.fs.changing(w.node, path, w.node_ro)
        w.node.mode = st.S_IFMT(w.node.mode) | (mode & 0o7777)

    @_op("remove")
    def unlink(self, path):
        self.fs.remove(self.ns, self.fs.walk(self.ns, path, follow=False), directory=False)

    @_op("remove")
    def rmdir(self, path):
        self.fs.remove(self.ns, self.fs.walk(self.ns, path, follow=False), directory=True)

    @_op()
    def listdir(self, path):
        node = self._existing(path).node
        if node.children is None:
            raise err(errno.ENOTDIR, path)
        return list(node.children)

    def _new_entry(self, path: str, root: str = "/") -> Walk:
        w = self.fs.walk(self.ns, path, follow=False, root=root)
        if w.node is not None or w.parent is None:
            raise err(errno.EEXIST, path)
        return w

    def _add(self, w: Walk, node: Inode) -> Inode:
        self.fs.changing(w.parent, w.path, w.parent_ro)
        w.parent.children[w.name] = node
        return node

    # -- mounts ------------------------------------------------------------------------------------
    @_op("write")
    def bind_mount(self, source, target):
        self._bind(self._existing(source).node, self._existing(target))

    def _bind(self, source: Inode, w: Walk) -> None:
        if (source.children is None) != (w.node.children is None):
            raise err(errno.ENOTDIR, w.path)
        if w.parent is None:
            raise err(errno.EINVAL, w.path)
        key = (w.parent.ino, w.name)
        self.fs.next_mount_id += 1
        self.ns.mounts.setdefault(key, []).append(ModelMount(self.fs.next_mount_id, key, source, w.path))

    @_op("write")
    def remount(self, target, flags=MS_RDONLY):
        self._mount_at(self._existing(target)).readonly = bool(flags & MS_RDONLY)

    def _mount_at(self, w: Walk) -> ModelMount:
        mount = self.ns.top((w.parent.ino, w.name)) if w.parent is not None else None
        if mount is None:
            raise err(errno.EINVAL, w.path)
        return mount

    @_op("write")
    def umount(self, target, flags=0):
        w = self._existing(target)
        mount = self._mount_at(w)
        self.ns.mounts[mount.key].pop()

    @_op()
    def mounts(self):
        return [Mount(m.mount_id, m.path, "/", "model", "model", "ro" if m.readonly else "rw") for m in self.ns.table()]

    def make_private(self, path, below=True):
        """Nothing to do, and no scheduling point: the model's mount namespaces share no mount
        (no propagation is modelled), as every one made private is."""

    # -- locks (K-4) -------------------------------------------------------------------------------
    @_op()
    def lock(self, fd, timeout):
        node, _ = self.world.fds[fd]
        w = self.proc.worker
        while self.world.locks.get(node.ino, fd) != fd:
            self.world.block(w)
            if w.timed_out:
                raise LockTimeout(f"lock not acquired within {timeout:g}s")
        self.world.locks[node.ino] = fd
        return 0.0

    @_op()
    def unlock(self, fd):
        self.world.close_fd(fd)

    @_op()
    def close(self, fd):
        self.world.close_fd(fd)

    # -- confined to a root (REF-11) ---------------------------------------------------------------
    @_op()
    def stat_beneath(self, root, rel):
        return self._existing(rel, root=root).node.stat()

    @_op("write")
    def mkdir_beneath(self, root, rel, mode):
        self._add(self._new_entry(rel, root), Inode(S_IFDIR | (mode & 0o7777)))

    @_op("write")
    def write_new_beneath(self, root, rel, data, mode):
        self._add(self._new_entry(rel, root), Inode(S_IFREG | (mode & 0o7777), bytes(data)))

    @_op("write")
    def fill_empty_beneath(self, root, rel, data, mode):
        """REF-3: write into an existing 0-byte regular file in place (same inode, no create)."""
        w = self._existing(rel, follow=False, root=root)
        if w.node.target is not None:
            raise err(errno.ELOOP, w.path)
        if w.node.children is not None or w.node.data:
            return False
        if w.node_ro:
            raise err(errno.EROFS, w.path)
        w.node.data, w.node.mode = bytes(data), S_IFREG | (mode & 0o7777)
        return True

    @_op("write")
    def open_lock_beneath(self, root, rel):
        return self.world.open_fd(self._open_for_write(self.fs.walk(self.ns, rel, follow=False, root=root), 0o644),
                                  self.proc)

    def _open_for_write(self, w: Walk, mode: int) -> Inode:
        """open(O_WRONLY|O_CREAT|O_NOFOLLOW), no O_EXCL: create it, or reuse what is there."""
        if w.node is None:
            return self._add(w, Inode(S_IFREG | (mode & 0o7777 & ~UMASK)))
        if w.node.target is not None:
            raise err(errno.ELOOP, w.path)
        if w.node.children is not None:
            raise err(errno.EISDIR, w.path)
        if w.node_ro:
            raise err(errno.EROFS, w.path)
        return w.node

    @_op("remove")
    def unlink_beneath(self, root, rel):
        self.fs.remove(self.ns, self.fs.walk(self.ns, rel, follow=False, root=root), directory=False)

    @_op("write")
    def touch_beneath(self, root, rel, mode=0o644):
        self._open_for_write(self.fs.walk(self.ns, rel, follow=False, root=root), mode)

    @_op("write")
    def bind_mount_beneath(self, source, root, rel, flags):
        w = self._existing(rel, follow=False, root=root)
        self._bind(self._existing(source).node, w)
        self._mount_at(w).readonly = bool(flags & MS_RDONLY)

    # -- sub-steps ---------------------------------------------------------------------------------
    @_op()
    def run(self, argv, timeout=None):
        """The fake CLI as a child process of this one (same namespace), or the model ldconfig."""
        prog = os.path.basename(argv[0])
        if prog == "ldconfig":
            return self._ldconfig(argv[argv.index("-r") + 1] if "-r" in argv else "/")
        if prog == "chroot":          # the CLI's ldconfig inside the rootfs (SPEC CLI-7)
            root, inner = argv[1], argv[2]
            if os.path.basename(inner).startswith("ldconfig") and \
                    self.fs.lookup(self.ns, f"{root.rstrip('/')}/{inner.lstrip('/')}") is not None:
                return self._ldconfig(root)
            return 0, "", ""          # --ldconfig=/usr/bin/true and the like: nothing to model
        if prog != "nvidia-container-cli":
            return 127, "", f"{argv[0]}: command not found\n"
        from gpujail.fixtures import fake_cli
        child = Proc(self.proc.worker, self.proc.spec, parent=self.proc)
        out, errout = io.StringIO(), io.StringIO()
        saved = getattr(local, "stdout", None), getattr(local, "stderr", None)   # none in a sandbox
        local.stdout, local.stderr = out, errout
        failpoints.set_process(child)
        try:
            code = fake_cli.main(list(argv[1:]), sysops=ModelSys(self.world, child))
        except Killed:
            if self.world.stopping or not self.proc.living():
                raise
            code = -9
            self.world.release(child)
        finally:
            failpoints.set_process(self.proc)
            local.stdout, local.stderr = saved
        return code, out.getvalue(), errout.getvalue()

    def _ldconfig(self, root: str) -> tuple[int, str, str]:
        """ldconfig -r ROOT: in each library directory, a soname link for every ELF file that names
        one (read through this namespace: the mounted driver, not the placeholder under it)."""
        for d in LDCONFIG_DIRS:
            libdir = f"{root.rstrip('/')}/{d}"
            try:
                names = self.listdir(libdir)
            except OSError:
                continue
            for name in sorted(names):
                node = self.fs.lookup(self.ns, f"{libdir}/{name}")
                soname = elf.read_soname(node.data) if node is not None and node.children is None else None
                if soname is None or soname == name:
                    continue
                link = f"{libdir}/{soname}"
                try:
                    if self.readlink(link) == name:
                        continue
                    self.unlink(link)
                except OSError:
                    pass   # missing (made below), or a real file: ldconfig leaves those alone
                with contextlib.suppress(FileExistsError):
                    self.symlink(name, link)
        return 0, "", ""
