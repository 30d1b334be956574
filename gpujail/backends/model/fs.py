"""The model's file system: one shared tree in memory, a mount table per namespace, the kernel's rules.

How this works
--------------
`ModelFS` is one file tree that every simulated worker shares: the host's driver files outside, the
jail image under `/jail`. Each worker has a `Namespace`: its own mount table, where a bind mount
sits on a *dentry* (parent directory inode + name) and mounts stack, the top one being what lookups
see. `walk` resolves a path through a namespace's mounts, following symlinks; with `root`, confined
to it as openat2(RESOLVE_IN_ROOT) is (absolute links and `..` stay inside).

The kernel rule the seed bug rests on (SPEC K-1) is `remove`: unlinking (or rmdir-ing) a name that
is a mount point in the caller's own namespace fails with EBUSY; from any other namespace it
succeeds and detaches every mount on that dentry. That is a local directory, where every node
shares the same dentries. On a network filesystem each node has its own client cache (SPEC K-2):
`ModelFS(detach="lookup")` leaves another node's mounts on the removed dentry in place, marked
*stale* in that node's namespace, and that node's next lookup through the dentry detaches them (and
any mount beneath it, as d_invalidate does) before resolving the name afresh: ENOENT, or the file
created there since. The mount table shows a stale mount until then. What a loader says about the inode a path
resolves to is `loader_view` (K-3: a 0-byte or marker-sized file is `file too short`).

Nothing here schedules or records: sched.py decides who runs, sys.py turns calls into these
operations, world.py builds the tree and drives a run.
"""
from __future__ import annotations

import errno
import os
import stat as st
from dataclasses import dataclass

JAIL = "/jail"
UMASK = 0o022
S_IFDIR, S_IFREG, S_IFLNK = st.S_IFDIR, st.S_IFREG, st.S_IFLNK
LOADER_MIN = 64          # glibc rejects anything shorter than an ELF header: "file too short" (K-3)


def err(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


class Inode:
    __slots__ = ("ino", "mode", "data", "children", "target")
    count = 0

    def __init__(self, mode: int, data: bytes = b"", target: str | None = None):
        Inode.count += 1
        self.ino, self.mode, self.data, self.target = Inode.count, mode, data, target
        self.children: dict[str, Inode] | None = {} if st.S_ISDIR(mode) else None

    def stat(self) -> os.stat_result:
        size = len(self.target) if self.target is not None else (4096 if self.children is not None else len(self.data))
        return os.stat_result((self.mode, self.ino, 1, 1, 0, 0, size, 0, 0, 0))


@dataclass
class ModelMount:
    mount_id: int
    key: tuple[int, str]       # the dentry it sits on: (parent directory inode number, name)
    source: Inode
    path: str                  # where it was mounted, as the mount table shows it
    readonly: bool = False


class Namespace:
    """One worker's mount table. Mounts stack per dentry; the top one is what lookups see. With
    detachment at lookup (K-2), `stale` holds the dentries another node removed under its mounts:
    dentry -> (the removed inode, its path, who removed it)."""

    def __init__(self, name: str):
        self.name = name
        self.mounts: dict[tuple[int, str], list[ModelMount]] = {}
        self.stale: dict[tuple[int, str], tuple[Inode, str, str]] = {}

    def top(self, key) -> ModelMount | None:
        stack = self.mounts.get(key)
        return stack[-1] if stack else None

    def table(self) -> list[ModelMount]:
        return sorted((m for s in self.mounts.values() for m in s), key=lambda m: m.mount_id)


@dataclass
class Walk:
    """The result of resolving a path: the entry (parent, name), what it resolves to (None: missing),
    its path as the mount table would show it, and whether parent / node sit on read-only mounts."""
    parent: Inode | None
    name: str | None
    node: Inode | None
    path: str
    parent_ro: bool
    node_ro: bool


class ModelFS:
    """The shared tree and the kernel rules on it (lookups through a namespace, K-1 detaches)."""

    DETACH = ("unlink", "lookup")   # K-1: one local directory; K-2: a client cache per node

    def __init__(self, detach: str = "unlink"):
        if detach not in self.DETACH:
            raise ValueError(f"ModelFS(detach={detach!r}): expected one of {', '.join(self.DETACH)}")
        self.detach = detach
        self.root = Inode(S_IFDIR | 0o755)
        self.namespaces: list[Namespace] = []
        self.next_mount_id = 100
        self.host: set[int] = set()          # inode numbers outside the jail: never to be changed
        self.outside_changes: list[str] = []
        self.detached: list[tuple[str, str, str]] = []   # (namespace, path, by namespace)
        self.driver: list[str] = []                      # the host's driver files, in catalogue order
        self.devices: list[tuple[str, int]] = []         # node-local: (path, mode), made per namespace

    # -- building ----------------------------------------------------------------------------------
    def add(self, path: str, mode: int, data: bytes = b"", target: str | None = None) -> Inode:
        """Set up one entry (and its missing parents, 0755) outside any namespace: the world as built."""
        parent = self.root
        for name in path.strip("/").split("/")[:-1]:
            parent = parent.children.setdefault(name, Inode(S_IFDIR | 0o755))
        node = parent.children.get(os.path.basename(path))
        if node is None or not st.S_ISDIR(mode):
            node = parent.children[os.path.basename(path)] = Inode(mode, data, target)
        node.mode = mode
        return node

    def at(self, path: str) -> Inode:
        node = self.root
        for name in filter(None, path.split("/")):
            node = node.children[name]
        return node

    def seal_host(self) -> None:
        """Everything that exists now outside the jail is the host's: INV-3 forbids changing it."""
        def walk(node, path):
            if path != JAIL:
                self.host.add(node.ino)
                for name, child in (node.children or {}).items():
                    walk(child, f"{path.rstrip('/')}/{name}")
        walk(self.root, "/")

    def namespace(self, name: str) -> Namespace:
        """A worker's namespace: node-local /dev (its device nodes) and /run, bound over the host's
        and the jail's, as gpujail/backends/node_view.py does with tmpfs."""
        ns = Namespace(name)
        self.namespaces.append(ns)
        local = {d: Inode(S_IFDIR | 0o755) for d in ("dev", "run")}
        for path, mode in self.devices:
            top, rest = path.strip("/").split("/", 1)
            parent = local[top]
            for part in rest.split("/")[:-1]:
                parent = parent.children.setdefault(part, Inode(S_IFDIR | 0o755))
            parent.children[os.path.basename(path)] = Inode(mode)
        for where in ("/", JAIL):
            parent = self.at(where)
            for d, node in local.items():
                self.next_mount_id += 1
                ns.mounts[(parent.ino, d)] = [ModelMount(self.next_mount_id, (parent.ino, d), node,
                                                         os.path.join(where, d))]
        return ns

    def snapshot(self) -> dict[str, tuple]:
        """The jail as fixtures/jail.py `snapshot` gives it (no mounts: what every node shares)."""
        out = {}

        def walk(node: Inode, rel: str):
            for name, child in node.children.items():
                r = f"{rel}/{name}" if rel else name
                out[r] = (child.mode, 0 if child.children is not None else child.stat().st_size, child.target)
                if child.children is not None:
                    walk(child, r)
        walk(self.at(JAIL), "")
        return out

    # -- lookups -----------------------------------------------------------------------------------
    def walk(self, ns: Namespace, path: str, follow: bool = True, root: str = "/") -> Walk:
        """Resolve `path` in `ns`, crossing its mounts. With root != "/", resolution is confined to
        root as openat2(RESOLVE_IN_ROOT) does: absolute links and `..` stay inside it."""
        if root == "/" and not path.startswith("/"):
            raise err(errno.EINVAL, path)   # the model takes absolute paths only
        frames: list[tuple[Inode, str, bool]] = [(self.root, "", False)]
        if root != "/":
            for name in root.strip("/").split("/"):
                frames.append(self._step_into(ns, frames[-1], name, root))
        base = len(frames)
        parts = [p for p in path.split("/") if p not in ("", ".")]
        hops = 0
        while parts:
            name = parts.pop(0)
            if name == "..":
                if len(frames) > base:
                    frames.pop()
                continue
            parent = frames[-1]
            if parent[0].children is None:
                raise err(errno.ENOTDIR, path)
            child = self._lookup(ns, parent[0], name)
            if child is None:
                if parts:
                    raise err(errno.ENOENT, path)
                return Walk(parent[0], name, None, self._path(frames, name), parent[2], parent[2])
            if child[0].target is not None and (parts or follow):
                hops += 1
                if hops > 40:
                    raise err(errno.ELOOP, path)
                if child[0].target.startswith("/"):
                    del frames[base:]
                parts = [p for p in child[0].target.split("/") if p not in ("", ".")] + parts
                continue
            frames.append((child[0], name, child[1] or parent[2]))
        if len(frames) == 1 or len(frames) == base:
            node = frames[-1]
            return Walk(None, None, node[0], self._path(frames, None), node[2], node[2])
        node, parent = frames[-1], frames[-2]
        return Walk(parent[0], node[1], node[0], self._path(frames[:-1], node[1]), parent[2], node[2])

    def _step_into(self, ns, frame, name, path):
        child = self._lookup(ns, frame[0], name)
        if child is None or child[0].children is None:
            raise err(errno.ENOENT, path)
        return child[0], name, child[1] or frame[2]

    def _lookup(self, ns: Namespace, parent: Inode, name: str) -> tuple[Inode, bool] | None:
        if ns.stale:
            self._revalidate(ns, (parent.ino, name))
        mount = ns.top((parent.ino, name))
        if mount is not None:
            return mount.source, mount.readonly
        child = parent.children.get(name)
        return None if child is None else (child, False)

    def _revalidate(self, ns: Namespace, key: tuple[int, str]) -> None:
        """K-2: this node's lookup meets a dentry another node removed. Its mounts, and every mount
        beneath it in this namespace, are detached (d_invalidate); the lookup then goes on afresh."""
        gone = ns.stale.pop(key, None)
        if gone is None:
            return
        node, path, by = gone
        below = [node] + [m.source for m in ns.mounts.pop(key, [])]
        if len(below) > 1:
            self.detached.append((ns.name, path, by))
        seen = set()
        while below:   # the dentries beneath, and what is mounted on them, with their own mounts
            inode = below.pop()
            if inode.ino in seen:
                continue
            seen.add(inode.ino)
            below += (inode.children or {}).values()
            for k in [k for k in ns.mounts if k[0] == inode.ino]:
                ns.stale.pop(k, None)
                below += [m.source for m in ns.mounts.pop(k)]
                self.detached.append((ns.name, f"{path}/.../{k[1]}", by))

    @staticmethod
    def _path(frames, last: str | None) -> str:
        names = [f[1] for f in frames[1:]] + ([last] if last is not None else [])
        return "/" + "/".join(names)

    def lookup(self, ns: Namespace, path: str) -> Inode | None:
        try:
            return self.walk(ns, path).node
        except OSError:
            return None

    # -- changes -----------------------------------------------------------------------------------
    def changing(self, node: Inode, path: str, readonly: bool) -> None:
        if readonly:
            raise err(errno.EROFS, path)
        if node.ino in self.host:
            self.outside_changes.append(path)

    def remove(self, ns: Namespace, w: Walk, directory: bool) -> None:
        """unlink/rmdir of the entry `w` names, errors in the kernel's order (do_unlinkat, vfs_rmdir):
        EROFS, ENOENT, EISDIR/ENOTDIR, EBUSY (K-1: a mount point in this namespace), ENOTEMPTY."""
        if w.parent_ro:
            raise err(errno.EROFS, w.path)
        if w.node is None:
            raise err(errno.ENOENT, w.path)
        if w.parent is None:
            raise err(errno.EBUSY, w.path)
        if directory != (w.node.children is not None):
            raise err(errno.ENOTDIR if directory else errno.EISDIR, w.path)
        key = (w.parent.ino, w.name)
        if ns.mounts.get(key):
            raise err(errno.EBUSY, w.path)
        if directory and w.node.children:
            raise err(errno.ENOTEMPTY, w.path)
        self.changing(w.parent, w.path, False)
        del w.parent.children[w.name]
        for other in self.namespaces:
            if other is ns or not other.mounts.get(key):
                continue
            if self.detach == "lookup":   # K-2: at that node's next lookup of the path
                other.stale[key] = (w.node, w.path, ns.name)
            else:                         # K-1: the same dentries everywhere, detached now
                del other.mounts[key]
                self.detached.append((other.name, w.path, ns.name))


def loader_view(node: Inode | None) -> str:
    """What glibc's loader says about a path resolving to `node` (SPEC K-3)."""
    if node is None:
        return "No such file or directory"
    if node.children is not None:
        return "is a directory"
    if st.S_ISREG(node.mode) and len(node.data) < LOADER_MIN:
        return f"file too short ({len(node.data)}-byte placeholder)"
    return "another file's content"
