"""The model's scheduler: simulated processes, who takes the next step, descriptors and flocks.

How this works
--------------
Each worker runs in its own thread, but only the thread holding the *baton* runs. Every `ModelSys`
call (sys.py) first calls `Simulation.step`, a scheduling point where the `Scheduler` picks who
takes the next step, so a schedule is exactly one interleaving and replays identically. The
`Scheduler` is driven by a plan's runs of `(worker, steps)` (chaos/explore.py draws them with
Hypothesis); when they are used up the current worker goes on, then the others in order. `Bounded`
is driven instead by the choice taken at each pick that has one, for a search that enumerates every
schedule with at most c preemptions.

A worker waiting for a flock is *blocked* (not runnable) until the lock is released; when nobody is
runnable the longest waiter times out (virtual time: a slow step is just a later step). A flock
belongs to a descriptor, a descriptor to a `Proc`, and a dead process's descriptors close, and its
flocks with them (SPEC K-4). A process dies by raising `Killed` in its own thread.

`Simulation` is the part of a run that is about time and processes; world.py's `ModelWorld` adds the
file system, the history and the workers' lives.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpujail.world import failpoints

from .fs import Inode, Namespace


class Killed(BaseException):
    """Raised in a simulated process that died (SIGKILL, abort) or in every process when the
    simulation stops. BaseException: an implementation's `except Exception` must not survive it."""


class Proc(failpoints.Process):
    """A simulated process: its pid, its failpoints, its parent, whether it is alive."""

    def __init__(self, worker: Worker, spec: str, parent: Proc | None = None):
        super().__init__()
        self.worker, self.parent, self.alive = worker, parent, True
        self.spec = spec
        self._armed = failpoints.parse(spec) if spec else {}
        worker.world.next_pid += 1
        self.pid = worker.world.next_pid

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
    world: Simulation
    index: int
    name: str
    spec: str = ""                       # failpoints of its first attempt (transient faults)
    crash_at: int | None = None          # its first attempt is SIGKILLed before this step
    steps: int = 0
    attempt: int = 0
    state: str = "new"                   # new, runnable, blocked, ready (finished ready), done
    ns: Namespace | None = None
    proc: Proc | None = None
    waiting_since: int = 0
    timed_out: bool = False
    granted: bool = False                # the scheduler's last pick was this worker
    exits: list[int] = field(default_factory=list)
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


class Bounded(Scheduler):
    """One schedule of a bounded-preemption search (CHESS: Musuvathi and Qadeer, PLDI 2007), named by
    its `deviations`: {n: worker} takes that worker at the n-th pick that has a choice; every other
    pick never preempts (the current worker goes on while it can, else the lowest-numbered runnable
    one). `log` keeps every pick that had a choice: (the runnable workers, the one taken, the current
    worker if it could have gone on, else None), from which chaos/explore.py `bounded` derives the
    schedules that branch off this one."""

    def __init__(self, deviations=()):
        super().__init__()
        self.deviations = dict(deviations)
        self.log: list[tuple[tuple[int, ...], int, int | None]] = []

    def pick(self, runnable: list[Worker], current: Worker | None) -> Worker:
        if len(runnable) == 1:
            return runnable[0]
        n, choices = len(self.log), tuple(w.index for w in runnable)
        chosen = current if current in runnable else runnable[0]
        if n in self.deviations:
            if self.deviations[n] not in choices:
                raise ValueError(f"choice {n} is worker {self.deviations[n]}, but only {choices} can run there")
            chosen = runnable[choices.index(self.deviations[n])]
        self.log.append((choices, chosen.index, current.index if current in runnable else None))
        return chosen


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


class Simulation:
    """Time and processes of one run: the baton, the trace, descriptors and flocks."""

    def __init__(self, schedule=(), max_steps: int = 20000, free: bool = False):
        self.scheduler = schedule if isinstance(schedule, Scheduler) else Scheduler(schedule)
        self.max_steps = max_steps
        self.workers: list[Worker] = []
        self.trace: list[Step] = []
        self.tick = 0                          # virtual time: one tick per step or event
        self.order: list[int] = []             # who took each step: the interleaving, for counting
        self.free = free                       # a sandbox: calls run directly, no scheduling
        self.stopping = False
        self.stuck = False                     # stopped after max_steps
        self.dirty = False                     # the last step removed something
        self.fds: dict[int, tuple[Inode, Proc]] = {}
        self.locks: dict[int, int] = {}          # inode number -> fd holding its flock
        self.next_fd = 3
        self.next_pid = 1
        self.done = threading.Semaphore(0)

    def settle(self) -> None:
        """Called before the step after a removal (see `step`); world.py probes ready workers."""
        self.dirty = False

    # -- the baton ---------------------------------------------------------------------------------
    def step(self, proc: Proc, op: str, args: tuple, effect: str) -> Step:
        w = proc.worker
        if self.free:
            return Step(0, w.name, op, args)
        if self.dirty:
            self.settle()
        if self.stopping or not proc.living():
            raise Killed("stopped")
        w.steps += 1
        if w.crash_at is not None and w.attempt == 0 and w.steps >= w.crash_at and w.proc.alive:
            w.crash_at = None
            w.proc.die("crash")
        if len(self.order) >= self.max_steps:
            self.stuck = self.stopping = True
            raise Killed("stopped")
        if w.granted:   # the pick that handed us the baton chose us for this very step
            w.granted = False
        else:
            self._switch(w, self.scheduler.pick(self.runnable(), w))
        if self.stopping or not proc.living():
            raise Killed("stopped")
        self.tick += 1
        entry = Step(self.tick, w.name, op, args, effect=effect)
        self.trace.append(entry)
        self.order.append(w.index)
        # Only a removal can take a file from a ready worker: its own mounts are done (it has
        # finished), and new entries or mounts elsewhere never change what its paths resolve to.
        self.dirty = effect == "remove"
        return entry

    def trace_event(self, w: Worker, kind: str, detail: str) -> int:
        self.tick += 1
        self.trace.append(Step(self.tick, w.name, kind, (detail,)))
        return self.tick

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
        """Wait (not runnable) until `unblock_all`, or until nobody else can run (then: timed out)."""
        w.state, w.waiting_since, w.timed_out = "blocked", self.tick, False
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

    def pass_baton(self, me: Worker) -> None:
        """`me` has ended: the next worker runs, or the run is over."""
        if self.stopping:
            for w in self.workers:   # wake everyone: each unwinds with Killed at its next step
                if w.state in ("blocked", "runnable") and w is not me:
                    w.state = "runnable"
        if self.runnable() or any(w.state == "blocked" for w in self.workers):
            self._switch(None, self._next_after(me))
        else:
            self.done.release()

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

    def release(self, proc: Proc) -> None:
        """A dead process's descriptors close, and its flocks with them."""
        for fd, (_, owner) in list(self.fds.items()):
            if owner is proc or (owner.parent is proc):
                self.close_fd(fd)
