"""A controlled scheduler over real worker processes: every failpoint is a scheduling point.

How this works
--------------
`--schedule free` (the default) changes nothing: workers run as the kernel schedules them. With
`--schedule random-walk` or `--schedule pct[:d=D,k=K]`, the chaos runner starts a `Scheduler` in the
harness process, listening on a unix socket in the run directory (`sched.sock`, which every node
sees: the run directory is bound into each node for real). Its path is given to every worker start
in `GPUJAIL_SCHEDULER`. Then each failpoint hit (gpujail/world/failpoints.py `hit`, so the bundled
implementations, the fake CLI, the CDI fakes, and a shell script's `gpujail-failpoint`) first
calls `arrive()`: it connects, sends one JSON line (node, failpoint, the process's own hit count of
that failpoint, path) and blocks until the scheduler writes one byte back. The failpoint's action,
if it is armed, runs after that. A client that cannot connect (no scheduler any more: the run
ended) or whose connection is closed goes on: a scheduler never holds a process past its run.
With `syscalls` in the plan (`pct:syscalls`, `random-walk:syscalls`) each worker start runs under
fixtures/bin/gpujail-syscall-points (the runner asks `contract.start_worker(syscall_points=True)`):
a seccomp user-notification supervisor that arrives the same way, as `syscall.mkdir`,
`syscall.openat`, `syscall.mount`, ... with the path, for each of those calls on the jail, before
letting the kernel run it. For the scheduler they are points like any other.

The scheduler releases one waiting worker at a time, so between two decisions only the released
worker runs. A decision is taken once every other live worker is *settled*: waiting at a point, or
blocked in the kernel (a `flock` wait behind a worker held at a point, a failpoint `sleep` or
`pause`, a barrier). A process held at a system call sleeps in the kernel (state S) while its
supervisor waits for our byte: its worker is waiting, and only workers that are not waiting have
their processes looked at, so being held never reads as blocked. Blocked is read from the kernel,
not guessed from time: the processes of a worker's node (its PID namespace, from the node's PID 1
the runner names) are all sleeping (no process in state R or D) for `settle` seconds, watched at
least every settle/3 with no process started or ended meanwhile (a wake-up between two looks far
apart is not taken for quiet). A node with no process but its agent is being (re)started by the
harness, and counts as running. So the waiting set at each decision, and so the decisions, do not
depend on the machine's load; a worker that stays running for `patience` seconds without reaching a
point (a busy loop) does not stall the run: the decision is taken anyway and counted in `forced`
(such a run may not replay exactly). A process killed at a point closes its connection and leaves
the schedule; a worker whose thread ended (ready, or out of restarts) is no longer live. Hits from
nodes that are not the scenario's workers (nemeses, the populate job) are released at once.

Strategies, seeded from the run's seed (`make_strategy`):

- `random-walk`: at each decision a uniformly random waiting worker;
- `mixed`: `pct` on even seeds, `random-walk` on odd ones (`make_strategy` says why);
- `pct` (probabilistic concurrency testing, Burckhardt, Kothari, Musuvathi, Nagarakatte, ASPLOS
  2010): each worker gets a distinct random priority (d .. d+n-1); d-1 priority change points are
  drawn uniformly among the first k steps; each decision releases the waiting worker of highest
  priority, and when the step is a change point that worker's priority drops below every other's.
  A bug of depth d among n workers and k steps is found with probability >= 1/(n*k^(d-1)) per run.
  Each armed fault adds a change point of its own where it acts (the runner tells the scheduler
  at which hit of which failpoint each worker's fault fails: `faults`): the failing worker drops
  below everyone there, so its recovery, a failing CLI's cleanup above all, comes after the others'
  next steps. That is the ordering a fault hurts in (the seed bug's second half: a neighbour mounts
  over the failing CLI's 0-byte placeholders, then the cleanup unlinks them), and a uniformly drawn
  change point rarely lands in the few steps between a fault and its cleanup.
  `d` defaults to 3; `k` to the runner's estimate from the scenario (failpoints per start times
  workers; twice that with `syscalls`). `changes=A+B` fixes the change points (a shrunk schedule).

Each release is one `sched.step` event in the history (written by the harness, so the history's
order of them is the order of the decisions) and one entry of `steps`; `Scheduler.record()` is
what the runner writes to `schedule.json` in the run directory.
"""
from __future__ import annotations

import json
import os
import random
import selectors
import socket
import struct
import threading
import time

ENV = "GPUJAIL_SCHEDULER"
NAMES = ("free", "random-walk", "pct", "mixed")
DEFAULT_DEPTH = 3
SYSCALL_STEPS = 2   # steps with `syscalls` per step without (measured: 2.3 legacy, 1.7 reference; docs/scheduler.md)
SOCKET = "sched.sock"


class ScheduleError(ValueError):
    """A --schedule value that does not parse: one line saying what is wrong."""


class Plan:
    """A parsed --schedule: `free`, `random-walk[:syscalls]`, `mixed[:syscalls]`, or
    `pct[:d=D][,k=K][,changes=A+B...][,syscalls]`. `syscalls`: each worker start also runs under
    fixtures/bin/gpujail-syscall-points, so its system calls on the jail are scheduling points too."""
    __slots__ = ("name", "depth", "k", "changes", "syscalls")

    def __init__(self, name: str, depth: int = DEFAULT_DEPTH, k: int | None = None, changes: list[int] | None = None,
                 syscalls: bool = False):
        self.name, self.depth, self.k, self.changes, self.syscalls = name, depth, k, changes, syscalls

    @property
    def free(self) -> bool:
        return self.name == "free"

    def __str__(self) -> str:
        params = [] if self.name != "pct" else [f"d={self.depth}"] + ([f"k={self.k}"] if self.k else []) + (
            [f"changes={'+'.join(map(str, self.changes))}"] if self.changes is not None else [])
        params += ["syscalls"] if self.syscalls else []
        return self.name + (":" + ",".join(params) if params else "")


def parse(text: str) -> Plan:
    name, colon, rest = text.strip().partition(":")
    if name not in NAMES:
        raise ScheduleError(f"expected one of {', '.join(NAMES)} (pct takes :d=D,k=K), got {text!r}")
    plan = Plan(name)
    items = [item for item in rest.split(",") if item.strip()]
    if any(item.strip() == "syscalls" for item in items):
        if name == "free":
            raise ScheduleError(f"syscalls (system calls as scheduling points) needs random-walk, pct or mixed, "
                                f"got {text!r}")
        plan.syscalls = True
        items = [item for item in items if item.strip() != "syscalls"]
    if name != "pct":
        if items or (colon and not plan.syscalls):
            raise ScheduleError(f"{name} takes no parameters but syscalls, got {text!r}")
        return plan
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in ("d", "k", "changes"):
            raise ScheduleError(f"pct parameter {item!r}: expected d=DEPTH, k=STEPS, changes=A+B or syscalls")
        try:
            numbers = [int(v) for v in value.split("+")] if key == "changes" and value else []
            number = int(value) if key != "changes" else 0
        except ValueError:
            raise ScheduleError(f"pct parameter {item!r}: expected a whole number") from None
        if key == "d":
            if number < 1:
                raise ScheduleError(f"pct parameter {item!r}: the depth is at least 1")
            plan.depth = number
        elif key == "k":
            if number < 1:
                raise ScheduleError(f"pct parameter {item!r}: k (steps) is at least 1")
            plan.k = number
        else:
            if any(n < 1 for n in numbers):
                raise ScheduleError(f"pct parameter {item!r}: change points are steps, counted from 1")
            plan.changes = sorted(set(numbers))
    if plan.changes is not None:
        plan.depth = len(plan.changes) + 1
    return plan


class RandomWalk:
    def __init__(self, plan: Plan, seed: int, workers: list[str], k: int):
        self.rng = random.Random(f"random-walk:{seed}")

    def choose(self, waiting: list[str], step: int) -> str:
        return self.rng.choice(sorted(waiting))

    def failed(self, worker: str, step: int) -> None:
        """`worker`'s armed fault acted at `step`: nothing to change for a random walk."""

    def describe(self) -> dict:
        return {"as": "random-walk"}   # (for `mixed`: which strategy this seed ran)


class PCT:
    def __init__(self, plan: Plan, seed: int, workers: list[str], k: int):
        rng = random.Random(f"pct:{seed}")
        # k counts steps: with syscalls, each start's system calls on the jail about double them
        self.depth, self.k = plan.depth, plan.k or max(k * (SYSCALL_STEPS if plan.syscalls else 1), 1)
        order = sorted(workers)
        rng.shuffle(order)
        self.priority = {w: self.depth + i for i, w in enumerate(order)}   # higher runs first
        self.initial = dict(self.priority)
        self.fault_changes: list[int] = []   # steps at which an armed fault acted (`failed`)
        if plan.changes is not None:
            self.changes = list(plan.changes)
        else:
            n = min(self.depth - 1, self.k)
            self.changes = sorted(rng.sample(range(1, self.k + 1), n))

    def choose(self, waiting: list[str], step: int) -> str:
        w = max(waiting, key=lambda w: (self.priority.get(w, 0), w))
        if step in self.changes:   # the current worker runs this step, then drops below everyone
            self.priority[w] = min(self.priority.values()) - 1
        return w

    def failed(self, worker: str, step: int) -> None:
        """A fault-directed change point: `worker`'s armed fault acted at `step`, so it drops below
        everyone and its recovery (a failing CLI's cleanup) runs after what the others do next."""
        self.priority[worker] = min(self.priority.values()) - 1
        self.fault_changes.append(step)

    def describe(self) -> dict:
        return {"as": "pct", "depth": self.depth, "k": self.k, "changes": self.changes, "priorities": self.initial}


def make_strategy(plan: Plan, seed: int, workers: list[str], k: int):
    """`mixed` is pct on even seeds and random-walk on odd ones (each with seed // 2): the two find
    different orders. pct lets the others finish before a failing worker's recovery, which a random
    walk, moving everyone in step, rarely does; a random walk meets two workers between the same
    check and create (the CLIs' creation race) at once, which pct, running one worker at a time
    between change points, almost never does (docs/benchmarks.md, the unscripted figure)."""
    if plan.name == "mixed":
        return (PCT if seed % 2 == 0 else RandomWalk)(plan, seed // 2, workers, k)
    return {"random-walk": RandomWalk, "pct": PCT}[plan.name](plan, seed, workers, k)


# -- the client side: a worker process at a scheduling point -----------------------------------

def arrive(address: str, name: str, hit: int, path: str = "") -> None:
    """Tell the scheduler at `address` that this process is at failpoint `name` (its `hit`-th hit)
    and wait until it lets us go. Any failure to reach it means: go on (the run is over)."""
    s = announce(address, name, hit, path)
    if s is None:
        return
    try:
        s.recv(1)   # a byte: go; EOF: the scheduler went away, go too
    except OSError:
        return
    finally:
        s.close()


def at_path(call, address: str) -> None:
    """`call(address)` for a unix socket's bind or connect, through the address's directory when the
    path is longer than a socket address may be (a deep run directory or tmp_path)."""
    if len(address.encode()) <= 100:
        call(address)
        return
    fd = os.open(os.path.dirname(address), os.O_PATH)
    try:
        call(f"/proc/self/fd/{fd}/{os.path.basename(address)}")
    finally:
        os.close(fd)


def announce(address: str, name: str, hit: int, path: str = "") -> socket.socket | None:
    """The first half of `arrive`: connect and say where we are. Returns the connection to wait on
    (one byte or EOF means go; closing it leaves the schedule), or None when there is no scheduler.
    fixtures/bin/gpujail-syscall-points waits on it itself, watching its held system call meanwhile."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        at_path(s.connect, address)
        s.sendall(json.dumps({"node": os.environ.get("GPUJAIL_NODE", ""), "name": name, "hit": hit,
                              "path": path}).encode() + b"\n")
        return s
    except OSError:
        s.close()
        return None


# -- the harness side ---------------------------------------------------------------------------

class _Request:
    __slots__ = ("conn", "buf", "node", "name", "hit", "path", "pid")

    def __init__(self, conn: socket.socket):
        self.conn, self.buf = conn, b""
        self.node = self.name = self.path = ""
        self.hit = self.pid = 0


def _peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


class Scheduler:
    """The harness's scheduler over the workers of one run (see the module's doc).

    `workers`: the scenario's worker ids; `node_of(worker)` -> None (not live: finished, or not
    started yet by design), 0 (live, but its node is being made or has no start running), or the
    host pid of its node's PID 1; `log(kind, **fields)` writes the history."""

    def __init__(self, directory, plan: Plan, seed: int, workers: list[str], k: int, node_of, log=None,
                 relative_to: str = "", settle: float = 0.05, patience: float = 5.0,
                 faults: dict[str, dict[str, int]] | None = None):
        self.plan, self.seed, self.workers = plan, seed, list(workers)
        # worker -> {failpoint: the hit at which its armed fault acts} (failpoints.failing_hits), each
        # taken once: the first start's, which is the one armed
        self.faults = {w: dict(f) for w, f in (faults or {}).items()}
        self.strategy = make_strategy(plan, seed, self.workers, k)
        self.node_of, self.log, self.relative_to = node_of, log, relative_to.rstrip("/")
        self.settle, self.patience = settle, patience
        self.address = os.path.join(str(directory), SOCKET)
        self.steps: list[list] = []
        self.forced = 0          # decisions taken while a worker was still running (patience ran out)
        self.left = 0            # requests whose process died at the point
        self.arrivals = 0        # requests of workers read (a worker is at its point from then on)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._bind()
        self._sock.listen(512)
        self._sock.setblocking(False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._ns: dict[int, str | None] = {}           # pid -> its PID namespace (cached: never changes)
        self._quiet: dict[str, float] = {}             # worker -> since when all its processes sleep
        self._seen: dict[str, tuple] = {}              # worker -> (when last looked at, its processes then)
        self._error: BaseException | None = None
        self._blocked: set[str] = set()                # at the last decision: the live workers not waiting

    def _bind(self) -> None:
        if os.path.lexists(self.address):
            os.unlink(self.address)
        at_path(self._sock.bind, self.address)

    def start(self) -> Scheduler:
        if self.log:
            self.log("sched.begin", strategy=str(self.plan), seed=self.seed, workers=self.workers,
                     **self.strategy.describe())
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop deciding; whoever still waits is let go (its connection closed)."""
        self._stop.set()
        self._thread.join()
        self._sock.close()
        if os.path.lexists(self.address):
            os.unlink(self.address)
        if self._error is not None:
            raise RuntimeError(f"the scheduler failed: {self._error!r}") from self._error

    def record(self) -> dict:
        return {"strategy": str(self.plan), "seed": self.seed, "workers": self.workers, **self.strategy.describe(),
                **({"fault_changes": self.strategy.fault_changes} if isinstance(self.strategy, PCT) else {}),
                "forced": self.forced, "left": self.left, "steps": self.steps}

    # -- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._sock, selectors.EVENT_READ, None)
        waiting: dict[str, list[_Request]] = {}
        self._progress = time.monotonic()
        try:
            while not self._stop.is_set():
                for key, _ in sel.select(timeout=0.002):
                    if key.data is None:
                        self._accept(sel)
                    else:
                        self._read(sel, key.data, waiting)
                ready = sorted(w for w, q in waiting.items() if q)
                if ready and self._settled(ready):
                    self._release(sel, waiting, ready)
        except BaseException as e:   # raised again by stop(), in the runner's thread
            self._error = e
        finally:
            for key in list(sel.get_map().values()):
                if key.data is not None:
                    key.data.conn.close()
            sel.close()

    def _accept(self, sel) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ, _Request(conn))

    def _read(self, sel, req: _Request, waiting: dict) -> None:
        try:
            data = req.conn.recv(4096)
        except OSError:
            data = b""
        if not data:   # its process died at the point (or before saying where): it leaves the schedule
            sel.unregister(req.conn)
            req.conn.close()
            if req.node and req in waiting.get(req.node, []):
                waiting[req.node].remove(req)
                self.left += 1
            return
        req.buf += data
        if b"\n" not in req.buf or req.node:
            return
        msg = json.loads(req.buf.split(b"\n", 1)[0])
        req.node, req.name, req.hit, req.path = msg["node"] or "?", msg["name"], int(msg["hit"]), msg.get("path", "")
        try:
            req.pid = _peer_pid(req.conn)
        except OSError:
            req.pid = 0
        if req.node not in self.workers:   # not a worker of the scenario: not scheduled
            self._go(sel, req)
            return
        waiting.setdefault(req.node, []).append(req)
        self.arrivals += 1
        self._quiet.pop(req.node, None)
        self._progress = time.monotonic()

    def _go(self, sel, req: _Request) -> None:
        try:
            req.conn.send(b"g")
        except OSError:
            pass
        sel.unregister(req.conn)
        req.conn.close()

    def _release(self, sel, waiting: dict, ready: list[str]) -> None:
        step = len(self.steps) + 1
        w = self.strategy.choose(ready, step)
        req = waiting[w].pop(0)
        path = req.path
        if self.relative_to and path.startswith(self.relative_to + "/"):
            path = path[len(self.relative_to) + 1:]
        self.steps.append([w, req.name, req.hit])
        if self.faults.get(w, {}).get(req.name) == req.hit:   # released into its armed fault
            del self.faults[w][req.name]
            self.strategy.failed(w, step)
        if self.log:
            self.log("sched.step", step=step, worker=w, failpoint=req.name, hit=req.hit, path=path, waiting=ready,
                     blocked=sorted(self._blocked))
        self._go(sel, req)
        self._quiet.pop(w, None)
        self._progress = time.monotonic()

    def _settled(self, ready: list[str]) -> bool:
        """Every live worker not waiting at a point is blocked in the kernel (see the module's doc);
        or patience ran out."""
        others = {}
        for w in self.workers:
            if w in ready:
                continue
            node = self.node_of(w)
            if node is not None:
                others[w] = node
        self._blocked = set()
        if not others:
            return True
        now = time.monotonic()
        if now - self._progress < self.settle / 10 and not all(w in self._quiet for w in others):
            return False   # the worker just released is on its way to its next point: no need to look yet
        states = self._states({pid1 for pid1 in others.values() if pid1})
        for w, pid1 in others.items():
            st = states.get(pid1) if pid1 else None
            seen, self._seen[w] = self._seen.get(w), (now, frozenset(st or ()))
            if not st or any(s in "RD" for s in st.values()) or len(st) < 2:   # running, or being (re)started
                self._quiet.pop(w, None)
            elif w not in self._quiet or seen is None or now - seen[0] > self.settle / 3 or seen[1] != self._seen[w][1]:
                # quiet now; but a quiet spell counts only while it is watched closely and nobody came
                # or went: a wake-up between two looks far apart, or a process started or ended, is progress
                self._quiet[w] = now
        if all(w in self._quiet and now - self._quiet[w] >= self.settle for w in others):
            self._blocked = set(others)
            return True
        if now - self._progress >= self.patience:
            self.forced += 1
            self._blocked = set(others)
            return True
        return False

    def _states(self, roots: set[int]) -> dict[int, dict[int, str]]:
        """For each node PID 1 in `roots`: {pid: state} of every process in its PID namespace
        (PID 1 included, the node's agent)."""
        if not roots:
            return {}
        spaces = {}
        for pid1 in roots:
            ns = self._ns_of(pid1)
            if ns:
                spaces[ns] = pid1
        out: dict[int, dict[int, str]] = {pid1: {} for pid1 in roots}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            ns = self._ns_of(pid)
            if ns not in spaces:
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            state = stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3].decode()
            if state not in "ZX":
                out[spaces[ns]][pid] = state
        return out

    def _ns_of(self, pid: int) -> str | None:
        if pid not in self._ns:
            try:
                self._ns[pid] = os.readlink(f"/proc/{pid}/ns/pid")
            except OSError:
                return None   # gone (or not yet readable): asked again next time
        return self._ns[pid]
