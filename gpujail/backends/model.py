"""The model backend: a deterministic simulation of the shared jail, mount namespaces and locks.

How this works
--------------
`ModelFS` is one file tree in memory that every simulated worker shares: the host's driver files
outside, the jail image under `/jail`. Each worker has a `Namespace`: its own mount table, where a
bind mount sits on a *dentry* (parent directory inode + name), and the node-local `/dev` and `/run`
(a private directory each) are bound over `/dev`, `/run`, `/jail/dev` and `/jail/run`. `ModelSys`
implements gpujail/sysops.py's interface on that state, so `reference`, `legacy`, `direct`, the
mutants and the fake CLI run unchanged; `run(argv)` runs the fake CLI in-process as a simulated
child process and models `ldconfig -r`.

The kernel rules the bug depends on (SPEC K-1): unlinking (or rmdir-ing) a name that is a mount point
in the caller's own namespace fails with EBUSY; from any other namespace it succeeds and detaches
every mount on that dentry. A loader reading through a path sees the inode the worker's mount table
resolves it to: after a detach, the placeholder or nothing; a 0-byte or marker-sized file is `file
too short` (K-3). flock locks die with their holder (K-4).

Scheduling: each worker runs in its own thread, but only the thread holding the baton runs. Every
`ModelSys` call is a scheduling point where the `Scheduler` (driven by Hypothesis, see
gpujail/explore.py) picks who takes the next step, so a schedule is exactly one interleaving and
replays identically. A worker waiting for a lock is not runnable until it is released; when nobody is
runnable the longest waiter times out (virtual time). After every step that changed the tree or a
mount table, INV-1 (ready workers keep their content) and the outside-the-jail half of INV-3 are
checked; INV-5 when a worker reports ready; the rest of INV-3 at the end, by the chaos checker's
own rules (chaos/checker.py `check_hygiene`).
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import stat as st
import sys
import threading
from dataclasses import dataclass, field

from gpujail.fixtures import drivers, elf, nvc_info
from gpujail.reference_impl import core, direct, legacy, mutants, reference
from gpujail.reference_impl.__main__ import execute
from gpujail.world import failpoints, history
from gpujail.world.sysops import MS_RDONLY, LockTimeout, Mount

JAIL = "/jail"
UMASK = 0o022
S_IFDIR, S_IFREG, S_IFLNK = st.S_IFDIR, st.S_IFREG, st.S_IFLNK
LOADER_MIN = 64          # glibc rejects anything shorter than an ELF header: "file too short" (K-3)
# The smallest driver that shows the bug: two libraries (one with a soname to repair) and a device.
SMALL_DRIVER = ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}", "/usr/lib/x86_64-linux-gnu/libcuda.so.{v}",
                "/dev/nvidiactl")


def precondition() -> str | None:
    """The model needs nothing from the host: always available (gpujail/backends.py asks)."""
    return None


def _err(code: int, path: str):
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
    """One worker's mount table. Mounts stack per dentry; the top one is what lookups see."""

    def __init__(self, name: str):
        self.name = name
        self.mounts: dict[tuple[int, str], list[ModelMount]] = {}

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

    def __init__(self):
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

    # -- lookups -----------------------------------------------------------------------------------
    def walk(self, ns: Namespace, path: str, follow: bool = True, root: str = "/") -> Walk:
        """Resolve `path` in `ns`, crossing its mounts. With root != "/", resolution is confined to
        root as openat2(RESOLVE_IN_ROOT) does: absolute links and `..` stay inside it."""
        if root == "/" and not path.startswith("/"):
            raise _err(errno.EINVAL, path)   # the model takes absolute paths only
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
                raise _err(errno.ENOTDIR, path)
            child = self._lookup(ns, parent[0], name)
            if child is None:
                if parts:
                    raise _err(errno.ENOENT, path)
                return Walk(parent[0], name, None, self._path(frames, name), parent[2], parent[2])
            if child[0].target is not None and (parts or follow):
                hops += 1
                if hops > 40:
                    raise _err(errno.ELOOP, path)
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
            raise _err(errno.ENOENT, path)
        return child[0], name, child[1] or frame[2]

    @staticmethod
    def _lookup(ns: Namespace, parent: Inode, name: str) -> tuple[Inode, bool] | None:
        mount = ns.top((parent.ino, name))
        if mount is not None:
            return mount.source, mount.readonly
        child = parent.children.get(name)
        return None if child is None else (child, False)

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
            raise _err(errno.EROFS, path)
        if node.ino in self.host:
            self.outside_changes.append(path)

    def remove(self, ns: Namespace, w: Walk, directory: bool) -> None:
        """unlink/rmdir of the entry `w` names, errors in the kernel's order (do_unlinkat, vfs_rmdir):
        EROFS, ENOENT, EISDIR/ENOTDIR, EBUSY (K-1: a mount point in this namespace), ENOTEMPTY."""
        if w.parent_ro:
            raise _err(errno.EROFS, w.path)
        if w.node is None:
            raise _err(errno.ENOENT, w.path)
        if w.parent is None:
            raise _err(errno.EBUSY, w.path)
        if directory != (w.node.children is not None):
            raise _err(errno.ENOTDIR if directory else errno.EISDIR, w.path)
        key = (w.parent.ino, w.name)
        if ns.mounts.get(key):
            raise _err(errno.EBUSY, w.path)
        if directory and w.node.children:
            raise _err(errno.ENOTEMPTY, w.path)
        self.changing(w.parent, w.path, False)
        del w.parent.children[w.name]
        for other in self.namespaces:
            if other is not ns and other.mounts.pop(key, None):
                self.detached.append((other.name, w.path, ns.name))


# -- processes and the scheduler ----------------------------------------------------------------

class Killed(BaseException):
    """Raised in a simulated process that died (SIGKILL, abort) or in every process when the
    simulation stops. BaseException: an implementation's `except Exception` must not survive it."""


class Proc(failpoints.Process):
    """A simulated process: its failpoints, its open lock files, whether it is alive."""

    def __init__(self, worker: Worker, spec: str, parent: Proc | None = None):
        super().__init__()
        self.worker, self.parent, self.alive = worker, parent, True
        self._armed = failpoints.parse(spec) if spec else {}
        self._spec = spec

    def armed(self):
        return self._armed

    def sleep(self, seconds: float) -> None:
        pass   # virtual time: a slow step is just a later step, and the scheduler decides when

    def die(self, action: str) -> None:
        self.alive = False
        self.worker.world.trace_event(self.worker, "died", action)
        raise Killed(action)

    def living(self) -> bool:
        p = self
        while p is not None:
            if not p.alive:
                return False
            p = p.parent
        return True


@dataclass
class Worker:
    world: World
    index: int
    name: str
    spec: str = ""                       # failpoints of its first attempt (transient faults)
    crash_at: int | None = None          # its implementation is SIGKILLed before this step
    steps: int = 0
    state: str = "new"                   # new, runnable, blocked, ready (finished ready), done
    ns: Namespace | None = None
    proc: Proc | None = None
    waiting_since: int = 0
    timed_out: bool = False
    granted: bool = False                # the scheduler's last pick was this worker
    exits: list[int] = field(default_factory=list)
    expected: list[tuple[str, Inode]] = field(default_factory=list)
    sem: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))


class Scheduler:
    """Who takes the next step: `runs` is a list of (worker index, steps); each run lets that worker
    take up to that many steps (fewer if it blocks or ends). When the runs are used up the current
    worker goes on, then the others in order: the empty schedule is "one worker after the other",
    which is what Hypothesis shrinks towards."""

    def __init__(self, runs=()):
        self.runs = [list(r) for r in runs]

    def pick(self, runnable: list[Worker], current: Worker | None) -> Worker:
        while self.runs:
            index, left = self.runs[0]
            chosen = next((w for w in runnable if w.index == index), None)
            if chosen is not None and left > 0:
                self.runs[0][1] -= 1
                return chosen
            self.runs.pop(0)
        return current if current in runnable else runnable[0]


@dataclass
class Step:
    seq: int
    worker: str
    op: str
    args: tuple              # formatted only when someone reads the trace: steps are the hot path
    error: str = ""
    effect: str = ""         # "" (looks), "write" or "remove"

    @property
    def detail(self) -> str:
        return " ".join(oct(a) if isinstance(a, int) else str(a) for a in self.args if not isinstance(a, bytes))


@dataclass
class Violation:
    invariant: str
    message: str
    seq: int


class _Routed(io.TextIOBase):
    """sys.stdout/stderr while a simulation runs: each simulated process prints to its own buffer."""

    def __init__(self, name: str, fallback):
        self.name, self.fallback = name, fallback

    def write(self, s):
        target = getattr(World.local, self.name, None) or self.fallback
        return target.write(s)

    def flush(self):
        pass


class World:
    """One simulation: the tree, the workers, the schedule, the trace and the verdict."""
    local = threading.local()

    def __init__(self, impl: str = "reference", workers: int = 2, driver: tuple[str, ...] | None = SMALL_DRIVER,
                 version: str = drivers.DEFAULT_VERSION, capabilities: str = "compute,utility",
                 faults: dict[int, str] | None = None, crashes: dict[int, int] | None = None,
                 schedule=(), restarts: int = 1, max_steps: int = 20000):
        self.fs = build(version, driver)
        self.impl, self.capabilities, self.restarts, self.max_steps = impl, capabilities, restarts, max_steps
        self.jail_before = snapshot(self.fs)
        self.scheduler = Scheduler(schedule)
        self.workers = [Worker(self, i, f"w{i + 1}", (faults or {}).get(i, ""), (crashes or {}).get(i))
                        for i in range(workers)]
        self.trace: list[Step] = []
        self.order: list[int] = []             # who took each step: the interleaving, for counting
        self.free = False                      # sandbox(): no scheduling, no invariants
        self.violations: list[Violation] = []
        self.stopping = False
        self.dirty = False
        self.error: BaseException | None = None
        self.done = threading.Semaphore(0)
        self.fds: dict[int, tuple[Inode, Proc]] = {}
        self.locks: dict[int, int] = {}          # inode number -> fd holding its flock
        self.next_fd = 3
        caps = nvc_info.capabilities(capabilities)
        self.selected = [p for p in self.fs.driver if nvc_info.selected(p, caps)]

    # -- running -----------------------------------------------------------------------------------
    def run(self) -> World:
        patched = (core, direct, legacy, reference)   # what a mutant may replace; restored after
        saved = [dict(m.__dict__) for m in patched]
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Routed("stdout", streams[0]), _Routed("stderr", streams[1])
        try:
            if self.impl.startswith("mutant:"):
                mutants.apply(self.impl.split(":", 1)[1])
            threads = [threading.Thread(target=self._worker_main, args=(w,), daemon=True) for w in self.workers]
            for t in threads:
                t.start()
            for w in self.workers:
                w.state = "runnable"
            self._switch(None, self.scheduler.pick(self.workers, None))
            self.done.acquire()
            for t in threads:
                t.join()
        finally:
            sys.stdout, sys.stderr = streams
            for module, namespace in zip(patched, saved):
                module.__dict__.clear()
                module.__dict__.update(namespace)
        if self.error is not None:
            raise self.error
        if not self.violations:
            self._check_hygiene()
        return self

    @classmethod
    def sandbox(cls, fs: ModelFS, namespaces: int = 2) -> list[ModelSys]:
        """One ModelSys per fresh namespace on `fs`, called directly (no threads, no schedule): what
        the fidelity tests compare with the kernel, op by op."""
        world = cls.__new__(cls)
        world.fs, world.free, world.fds, world.locks, world.next_fd = fs, True, {}, {}, 3
        out = []
        for i in range(namespaces):
            w = Worker(world, i, f"ns{i + 1}", state="runnable")
            w.ns = Namespace(w.name)
            fs.namespaces.append(w.ns)
            out.append(ModelSys(world, Proc(w, "")))
        return out

    def _worker_main(self, w: Worker) -> None:
        w.sem.acquire()
        World.local.stdout, World.local.stderr = io.StringIO(), io.StringIO()
        history.set_sink(lambda kind, fields: self._event(w, kind, fields))
        try:
            for attempt in range(self.restarts + 1):
                code = self._attempt(w, attempt)
                w.exits.append(code)
                self.trace_event(w, "exit", str(code))
                if code == 0:
                    self._ready(w)
                    break
                self.fs.namespaces.remove(w.ns)   # the container is gone, and its mounts with it
        except Killed:
            pass
        except BaseException as e:   # a bug in the model or the code under test: stop, report
            self.error = self.error or e
            self.stopping = True
        finally:
            history.set_sink(None)
            failpoints.set_process(None)
            if w.state != "ready":
                w.state = "done"
            self._pass_baton(w)

    def _attempt(self, w: Worker, attempt: int) -> int:
        w.ns = node_namespace(self.fs, w.name if attempt == 0 else f"{w.name}.{attempt}")
        w.proc = Proc(w, w.spec if attempt == 0 else "")
        failpoints.set_process(w.proc)
        ctx = core.Ctx(ModelSys(self, w.proc), JAIL, w.name, capabilities=self.capabilities,
                       name=self.impl, lock_timeout=120.0)
        try:
            return execute("reference" if self.impl.startswith("mutant:") else self.impl, "start", ctx)
        except Killed:
            if self.stopping:
                raise
            self._release(w.proc)
            return -9
        finally:
            failpoints.set_process(None)

    def _ready(self, w: Worker) -> None:
        """INV-5: a worker reporting ready must see every one of its files, attached, real."""
        w.state = "ready"
        w.expected = [(core.target(p), self.fs.lookup(w.ns, p)) for p in self.selected]   # the node's own files
        lost = self.first_lost(w)
        if lost:
            self.violate("INV-5", f"{w.name} reported ready but {lost[0]} {loader_view(lost[1])}")

    def first_lost(self, w: Worker) -> tuple[str, Inode | None] | None:
        """The first of a ready worker's files its jail path no longer resolves to: (path, what it
        resolves to instead)."""
        for rel, host in w.expected:
            seen = self.fs.lookup(w.ns, f"{JAIL}/{rel}")
            if seen is not host:
                return rel, seen
        return None

    # -- the baton ---------------------------------------------------------------------------------
    def step(self, proc: Proc, op: str, args: tuple, effect: str) -> Step:
        w = proc.worker
        if self.free:
            return Step(0, w.name, op, args)
        if self.dirty:
            self.check()
        if self.fs.outside_changes:
            self.violate("INV-3", f"changed outside the jail: {self.fs.outside_changes[0]}")
        if self.stopping or not proc.living():
            raise Killed("stopped")
        w.steps += 1
        if w.crash_at is not None and w.steps >= w.crash_at and w.proc.alive:
            w.crash_at = None
            w.proc.die("crash")
        if len(self.trace) >= self.max_steps:
            self.violate("stuck", f"no end after {self.max_steps} steps")
            raise Killed("stopped")
        if w.granted:   # the pick that handed us the baton chose us for this very step
            w.granted = False
        else:
            self._switch(w, self.scheduler.pick(self.runnable(), w))
        if self.stopping or not proc.living():
            raise Killed("stopped")
        entry = Step(len(self.trace) + 1, w.name, op, args, effect=effect)
        self.trace.append(entry)
        self.order.append(w.index)
        # Only a removal can take a file from a ready worker: its own mounts are done (it has
        # finished), and new entries or mounts elsewhere never change what its paths resolve to.
        self.dirty = effect == "remove"
        return entry

    def runnable(self) -> list[Worker]:
        return [w for w in self.workers if w.state == "runnable"]

    def _switch(self, me: Worker | None, to: Worker) -> None:
        if to is me:
            return
        to.granted = True
        to.sem.release()
        if me is not None:
            me.sem.acquire()
            me.granted = False

    def block(self, w: Worker) -> None:
        """Wait (not runnable) until `unblock`, or until nobody else can run (then: timed out)."""
        w.state, w.waiting_since, w.timed_out = "blocked", len(self.trace), False
        self._switch(w, self._next_after(w))
        if self.stopping or not w.proc.living():
            raise Killed("stopped")

    def unblock_all(self) -> None:
        for w in self.workers:
            if w.state == "blocked":
                w.state = "runnable"

    def _next_after(self, me: Worker) -> Worker:
        runnable = self.runnable()
        if runnable:
            return self.scheduler.pick(runnable, me)
        waiting = sorted((w for w in self.workers if w.state == "blocked"), key=lambda w: w.waiting_since)
        waiting[0].state, waiting[0].timed_out = "runnable", True
        return waiting[0]

    def _pass_baton(self, me: Worker) -> None:
        if self.stopping:
            for w in self.workers:   # wake everyone: each unwinds with Killed at its next step
                if w.state in ("blocked", "runnable") and w is not me:
                    w.state = "runnable"
        if self.runnable() or any(w.state == "blocked" for w in self.workers):
            self._switch(None, self._next_after(me))
        else:
            self.done.release()

    def _event(self, w: Worker, kind: str, fields: dict) -> None:
        if kind != "failpoint" or fields.get("action") != "off":   # armed but passed: noise
            self.trace_event(w, kind, " ".join(f"{k}={v}" for k, v in fields.items() if k != "argv"))

    def trace_event(self, w: Worker, kind: str, detail: str) -> None:
        self.trace.append(Step(len(self.trace) + 1, w.name, kind, (detail,)))

    # -- invariants --------------------------------------------------------------------------------
    def check(self) -> None:
        """INV-1 after every step that removed something (see `step`)."""
        self.dirty = False
        for w in self.workers:
            lost = self.first_lost(w) if w.state == "ready" else None
            if lost:
                rel, seen = lost
                why = next((f" (detached by {by}'s unlink)" for ns, path, by in self.fs.detached
                            if ns == w.ns.name and path == f"{JAIL}/{rel}"), "")
                self.violate("INV-1", f"{w.name} is ready but lost {rel}: {loader_view(seen)}{why}")

    def violate(self, invariant: str, message: str) -> None:
        self.violations.append(Violation(invariant, message, len(self.trace)))
        self.stopping = True
        raise Killed("violation")

    def _check_hygiene(self) -> None:
        from gpujail.chaos import checker
        result = checker.check_hygiene(checker.Run([], {"jail_before": self.jail_before, "jail_after": snapshot(self.fs),
                                                        "outside_changes": self.fs.outside_changes}))
        for v in result.violations:
            self.violations.append(Violation("INV-3", v.explanation, len(self.trace)))

    # -- locks and descriptors (K-4) ---------------------------------------------------------------
    def open_fd(self, node: Inode, proc: Proc) -> int:
        self.next_fd += 1
        self.fds[self.next_fd] = (node, proc)
        return self.next_fd

    def close_fd(self, fd: int) -> None:
        node, _ = self.fds.pop(fd)
        if self.locks.get(node.ino) == fd:
            del self.locks[node.ino]
            self.unblock_all()

    def _release(self, proc: Proc) -> None:
        """A dead process's descriptors close, and its flocks with them."""
        for fd, (_, owner) in list(self.fds.items()):
            if owner is proc or (owner.parent is proc):
                self.close_fd(fd)

    # -- reporting ---------------------------------------------------------------------------------
    def report(self, full: bool = False) -> str:
        """The trace a person reads: every step that changed something, every fault, exit and
        violation (or, with full, every step)."""
        lines = []
        for s in self.trace:
            if full or s.effect or s.op in INTERESTING:
                lines.append(f"{s.seq:5}  {s.worker:<4} {s.op:<18} {s.detail}{'  -> ' + s.error if s.error else ''}")
        for v in self.violations:
            lines.append(f"{v.seq:5}  VIOLATION {v.invariant}: {v.message}")
        return "\n".join(lines)


INTERESTING = {"exit", "died", "failpoint", "cli.fail", "impl.fatal", "cli.cleanup.unlink", "impl.lock.acquired",
               "impl.lock.timeout", "impl.marker", "impl.mutant.unlink"}


def loader_view(node: Inode | None) -> str:
    """What glibc's loader says about a path resolving to `node` (SPEC K-3)."""
    if node is None:
        return "No such file or directory"
    if node.children is not None:
        return "is a directory"
    if st.S_ISREG(node.mode) and len(node.data) < LOADER_MIN:
        return f"file too short ({len(node.data)}-byte placeholder)"
    return "another file's content"


# -- the world's contents -------------------------------------------------------------------------

_CONTENT: dict[tuple[str, str], bytes] = {}


def build(version: str, driver: tuple[str, ...] | None) -> ModelFS:
    """The host (driver files of `version`, with fixtures/drivers.py's bytes; all of them, or only
    the paths in `driver`) and the jail image of fixtures/jail.py, read from a real one made once."""
    fs = ModelFS()
    wanted = None if driver is None else {p.format(v=version) for p in driver}
    for f in drivers.catalogue(version):
        if wanted is not None and f.path not in wanted:
            continue
        fs.driver.append(f.path)
        if not f.on_disk:
            fs.devices.append((f.path, f.mode))
            continue
        if (f.path, version) not in _CONTENT:
            _CONTENT[f.path, version] = drivers.content(f, version)
        fs.add(f.path, f.mode, _CONTENT[f.path, version])
    for d in ("/dev", "/run", "/usr/bin", "/usr/lib/x86_64-linux-gnu", "/lib/firmware/nvidia"):
        fs.add(d, S_IFDIR | 0o755)
    for rel, (mode, data, target) in _jail_image().items():
        fs.add(f"{JAIL}/{rel}", mode, data, target)
    fs.seal_host()
    return fs


_IMAGE: dict | None = None


def _jail_image() -> dict[str, tuple[int, bytes, str | None]]:
    global _IMAGE
    if _IMAGE is None:
        import tempfile

        from gpujail.fixtures.jail import make_jail
        with tempfile.TemporaryDirectory(prefix="gpujail-model-") as tmp:
            root = make_jail(os.path.join(tmp, "jail"))
            image = {}
            for dirpath, dirnames, filenames in os.walk(root):
                for name in sorted(dirnames) + sorted(filenames):
                    p = os.path.join(dirpath, name)
                    s = os.lstat(p)
                    rel = os.path.relpath(p, root)
                    if st.S_ISLNK(s.st_mode):
                        image[rel] = (s.st_mode, b"", os.readlink(p))
                    elif st.S_ISDIR(s.st_mode):
                        image[rel] = (s.st_mode, b"", None)
                    else:
                        with open(p, "rb") as f:
                            image[rel] = (s.st_mode, f.read(), None)
            _IMAGE = dict(sorted(image.items()))
    return _IMAGE


def node_namespace(fs: ModelFS, name: str) -> Namespace:
    """A worker's namespace: node-local /dev (its device nodes) and /run, bound over the host's and
    the jail's, as gpujail/node.py does with tmpfs."""
    ns = Namespace(name)
    fs.namespaces.append(ns)
    local = {d: Inode(S_IFDIR | 0o755) for d in ("dev", "run")}
    for path, mode in fs.devices:
        top, rest = path.strip("/").split("/", 1)
        parent = local[top]
        for part in rest.split("/")[:-1]:
            parent = parent.children.setdefault(part, Inode(S_IFDIR | 0o755))
        parent.children[os.path.basename(path)] = Inode(mode)
    for where in ("/", JAIL):
        parent = fs.at(where)
        for d, node in local.items():
            fs.next_mount_id += 1
            ns.mounts[(parent.ino, d)] = [ModelMount(fs.next_mount_id, (parent.ino, d), node,
                                                     os.path.join(where, d))]
    return ns


def snapshot(fs: ModelFS) -> dict[str, tuple]:
    """The jail as fixtures/jail.py `snapshot` gives it (no mounts: what every node shares)."""
    out = {}

    def walk(node: Inode, rel: str):
        for name, child in node.children.items():
            r = f"{rel}/{name}" if rel else name
            out[r] = (child.mode, 0 if child.children is not None else child.stat().st_size, child.target)
            if child.children is not None:
                walk(child, r)
    walk(fs.at(JAIL), "")
    return out


# -- the interface -----------------------------------------------------------------------------

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

    def __init__(self, world: World, proc: Proc):
        self.world, self.proc, self.fs = world, proc, world.fs

    @property
    def ns(self) -> Namespace:
        return self.proc.worker.ns

    def _existing(self, path: str, follow: bool = True, root: str = "/") -> Walk:
        w = self.fs.walk(self.ns, path, follow, root)
        if w.node is None:
            raise _err(errno.ENOENT, path)
        return w

    # -- plain paths -------------------------------------------------------------------------------
    @_op()
    def stat(self, path):
        return self._existing(path).node.stat()

    @_op()
    def lstat(self, path):
        return self._existing(path, follow=False).node.stat()

    @_op()
    def readlink(self, path):
        node = self._existing(path, follow=False).node
        if node.target is None:
            raise _err(errno.EINVAL, path)
        return node.target

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
            raise _err(errno.ENOTDIR, path)
        return list(node.children)

    def _new_entry(self, path: str, root: str = "/") -> Walk:
        w = self.fs.walk(self.ns, path, follow=False, root=root)
        if w.node is not None or w.parent is None:
            raise _err(errno.EEXIST, path)
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
            raise _err(errno.ENOTDIR, w.path)
        if w.parent is None:
            raise _err(errno.EINVAL, w.path)
        key = (w.parent.ino, w.name)
        self.fs.next_mount_id += 1
        self.ns.mounts.setdefault(key, []).append(ModelMount(self.fs.next_mount_id, key, source, w.path))

    @_op("write")
    def remount(self, target, flags=MS_RDONLY):
        self._mount_at(self._existing(target)).readonly = bool(flags & MS_RDONLY)

    def _mount_at(self, w: Walk) -> ModelMount:
        mount = self.ns.top((w.parent.ino, w.name)) if w.parent is not None else None
        if mount is None:
            raise _err(errno.EINVAL, w.path)
        return mount

    @_op("write")
    def umount(self, target, flags=0):
        w = self._existing(target)
        mount = self._mount_at(w)
        self.ns.mounts[mount.key].pop()

    @_op()
    def mounts(self):
        return [Mount(m.mount_id, m.path, "/", "model", "model", "ro" if m.readonly else "rw") for m in self.ns.table()]

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
    def open_lock_beneath(self, root, rel):
        return self.world.open_fd(self._open_for_write(self.fs.walk(self.ns, rel, follow=False, root=root), 0o644),
                                  self.proc)

    def _open_for_write(self, w: Walk, mode: int) -> Inode:
        """open(O_WRONLY|O_CREAT|O_NOFOLLOW), no O_EXCL: create it, or reuse what is there."""
        if w.node is None:
            return self._add(w, Inode(S_IFREG | (mode & 0o7777 & ~UMASK)))
        if w.node.target is not None:
            raise _err(errno.ELOOP, w.path)
        if w.node.children is not None:
            raise _err(errno.EISDIR, w.path)
        if w.node_ro:
            raise _err(errno.EROFS, w.path)
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
        if prog == "chroot":
            return 0, "", ""          # --ldconfig=/usr/bin/true and the like: nothing to model
        if prog != "nvidia-container-cli":
            return 127, "", f"{argv[0]}: command not found\n"
        from gpujail.fixtures import fake_cli
        child = Proc(self.proc.worker, self.proc._spec, parent=self.proc)
        out, err = io.StringIO(), io.StringIO()
        saved = World.local.stdout, World.local.stderr
        World.local.stdout, World.local.stderr = out, err
        failpoints.set_process(child)
        try:
            code = fake_cli.main(list(argv[1:]), sysops=ModelSys(self.world, child))
        except Killed:
            if self.world.stopping or not self.proc.living():
                raise
            code = -9
            self.world._release(child)
        finally:
            failpoints.set_process(self.proc)
            World.local.stdout, World.local.stderr = saved
        return code, out.getvalue(), err.getvalue()

    def _ldconfig(self, root: str) -> tuple[int, str, str]:
        """ldconfig -r ROOT: in each library directory, a soname link for every ELF file that names
        one (read through this namespace: the mounted driver, not the placeholder under it)."""
        for d in core.LIBRARY_DIRS:
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
