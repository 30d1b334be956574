"""Failpoints in the style of etcd's gofail: named places where a test injects a fault.

How this works
--------------
`GPUJAIL_FAILPOINTS='cli.before_mkdir=1*pause(race);cli.after_mount=2*off->return(EIO)'` arms
failpoints for every process that inherits the environment. Grammar (gofail's, unchanged, plus
`pause(barrier)` from pingcap, `wait(barrier)` and `kill`):

    spec   := entry (';' entry)*
    entry  := NAME '=' term ('->' term)*
    term   := [N '*' | P '%'] action ['(' arg ')']
            | N '*' P '%' action ['(' arg ')']
    action := off | return | sleep | panic | print | pause | wait | stop | kill

Each hit walks the chain from the start and fires the first term that *allows* it, as gofail's
runtime/terms.go (`terms.eval`, `modCount`, `modProb`, `modList`): `N*term` allows its next N hits
(so `2*off->return(EIO)` fails the 3rd hit); `P%term` allows a hit with probability P (seeded by
GPUJAIL_SEED and the node id) and on a miss the hit *falls through* to the next term
(`50%return(EIO)->return(ENOSPC)`); `N*P%term` needs both, the count being spent first (modList
asks its mods in order and stops at the first refusal). A term with neither allows every hit; a hit
no term allows does nothing. Hits are counted per process.

Actions: `return(ERRNO|"message")` makes the step fail as the syscall would (OSError), `sleep(ms)`,
`panic` aborts (SIGABRT, no cleanup), `kill` SIGKILLs the process (no cleanup), `print` writes the
name to stderr, `pause(barrier)` blocks until the harness releases the barrier (see `Barrier`).
`wait(barrier)` pauses too, then lets the same hit go on down the chain (the terms after it): a
step that is hit once can wait for its moment and then fail (`1*wait(late)->return(EIO)`), which the
chaos fault table needs for steps such as `cli.before_exit`.

Two actions model what real clusters do to a process without killing it at the failpoint:
`stop(barrier)` is SIGSTOP (a hung NFS client, a debugger, a cgroup freezer): the process is
really stopped (state T, its locks and descriptors held) by a watcher child it forks, which arrives
at the barrier for it and, once the harness releases the barrier, sends SIGCONT; the process then
goes on where it stopped. `kill(write)` is a kill *inside the process's next write to a file*, not
at the failpoint: RLIMIT_FSIZE 0 with SIGXFSZ's default action, so the kernel kills it in write(2)
(no core file). Armed at `ref.before_marker` this is a start killed between a marker's exclusive
create and its write, leaving a 0-byte marker (REF-3/REF-5). A process these cannot act on (a
simulated one of the model backend; a shell script's `gpujail-failpoint`, another process than the
shell) gets the nearest thing: `stop` pauses (to the other nodes the same: it holds what it holds),
`kill(write)` kills at the failpoint (recorded as a plain `kill`, so nobody counts it as a torn write).

Under `--schedule` (gpujail/world/schedule.py) every failpoint, armed or not, is also a scheduling
point: a hit first waits until the harness's scheduler lets this process go (`scheduling_point`,
counting each failpoint's hits per process), then acts as above. With `--schedule pct:syscalls`
the system calls of a start on the jail are scheduling points too, named `syscall.NAME`
(fixtures/bin/gpujail-syscall-points); they are not failpoints: nothing arms them here (strace's
faults on system calls are fixtures/syscall_faults.py).

Every hit of an armed failpoint is recorded in the history (`failpoint` event, with the action), so
a test can check that what it armed actually fired; a shell script stops calling once its helper
says the failpoint is spent (`replay_hit`), so its later hits, which could only be `off`, are not.
A malformed spec or an unknown name raises `FailpointSpecError` saying where parsing stopped;
callers turn that into one line and exit 1.

The model backend (gpujail/backends/model/) runs many simulated processes as threads of one OS process:
it installs a `Process` per thread (`set_process`), which holds that process's armed failpoints and
says what `sleep`, `kill` and `panic` mean there (virtual time; the simulated process dies).
"""
from __future__ import annotations

import _thread
import errno
import os
import random
import re
import signal
import sys
import time

from gpujail.world import history

ENV, BARRIERS_ENV = "GPUJAIL_FAILPOINTS", "GPUJAIL_BARRIERS"
SCHEDULER_ENV = "GPUJAIL_SCHEDULER"   # gpujail/world/schedule.py ENV: set only in a run under --schedule

# The registry: every failpoint name, where it sits. One line each; unknown names are an error.
REGISTRY = {
    "cli.before_list": "fake CLI: before driver discovery (list and configure)",
    "cli.after_list": "fake CLI: after discovery, before anything is created or mounted",
    "cli.before_mkdir": "fake CLI: before each mkdir of a missing parent (make_ancestors)",
    "cli.before_create": "fake CLI: before each placeholder open(O_CREAT)",
    "cli.before_symlink": "fake CLI: before each symlink it makes next to the libraries (libcuda.so ...)",
    "cli.before_mount": "fake CLI: before each bind mount",
    "cli.after_mount": "fake CLI: after each bind mount, before its read-only remount",
    "cli.after_remount": "fake CLI: after each read-only remount (the target counts as mounted)",
    "cli.before_ldconfig": "fake CLI: before running --ldconfig",
    "cli.before_cleanup": "fake CLI: on failure, before unmounting and removing targets",
    "cli.before_remove": "fake CLI: in cleanup, before each unmount+remove of one target",
    "cli.before_exit": "fake CLI: after a successful configure, before exit 0",
    "cdi.before_generate": "fake nvidia-ctk: before `cdi generate` discovers the driver",
    "cdi.before_symlink": "fake nvidia-cdi-hook create-symlinks: before each link's temporary symlink",
    "cdi.before_rename": "fake nvidia-cdi-hook create-symlinks: before renaming the temporary link over LINK",
    "cdi.before_conf": "fake nvidia-cdi-hook update-ldcache: in the root, before the nvcr-*.conf drop-ins",
    "cdi.before_ldconfig": "fake nvidia-cdi-hook update-ldcache: drop-ins written, before exec'ing ldconfig",
    "cdi.before_target": "cdi-naive: before creating each missing mount target (0-byte file, MkdirAll)",
    "cdi.before_hook": "cdi-naive: before running each createContainer hook of the spec",
    "ref.before_list": "implementation: before running `nvidia-container-cli list`",
    "ref.after_lock": "implementation: the placeholder lock was just acquired",
    "ref.before_marker": "implementation: before creating each marker placeholder",
    "ref.before_unlock": "implementation: markers written, before releasing the lock",
    "ref.before_configure": "implementation: before running `nvidia-container-cli configure`",
    "ref.before_mount": "direct: before each bind mount it makes itself",
    "ref.before_verify": "implementation: after configure, before verification",
    "ref.before_soname": "implementation: mounts verified (REF-12's included), before the NVML soname check (REF-8)",
    "ref.before_ready": "implementation: verified, before the done flag and exit 0",
    "ref.before_dummy_mount": "CPU worker / login node: before each dummy library mount over a placeholder (REF-9)",
}
ACTIONS = ("off", "return", "sleep", "panic", "print", "pause", "wait", "stop", "kill")


class FailpointSpecError(ValueError):
    pass


class Term:
    """One `[N*|P%]action[(arg)]` of a chain. (Plain classes, not dataclasses: the fake CLI starts
    once per worker start, and every import counts.)"""
    __slots__ = ("action", "arg", "count", "percent")

    def __init__(self, action: str, arg: str | None = None, count: int | None = None, percent: float | None = None):
        self.action, self.arg = action, arg
        self.count = count        # N*: remaining hits this term applies to
        self.percent = percent    # P%


class Failpoint:
    __slots__ = ("name", "terms", "hits", "rng")

    def __init__(self, name: str, terms: list[Term], rng: random.Random):
        self.name, self.terms, self.hits, self.rng = name, terms, 0, rng

    def spent(self) -> bool:
        """No later hit can act: every term but `off` has used up its N, so the chain allows no action."""
        return all(t.action == "off" or (t.count is not None and t.count <= 0) for t in self.terms)


_TERM = re.compile(r"\s*(?:(?P<count>\d+)\*)?(?:(?P<pct>\d+(?:\.\d+)?)%)?(?P<action>[a-z]+)(?:\((?P<arg>[^()]*)\))?\s*$")


def parse(spec: str) -> dict[str, Failpoint]:
    points: dict[str, Failpoint] = {}
    offset = 0
    for entry in spec.split(";"):
        where = f"{ENV}: cannot parse {entry.strip()!r} at offset {offset}"
        offset += len(entry) + 1
        if not entry.strip():
            continue
        name, eq, chain = entry.partition("=")
        name = name.strip()
        if not eq:
            raise FailpointSpecError(f"{where}: expected NAME=TERM")
        if name not in REGISTRY:
            raise FailpointSpecError(f"{where}: unknown failpoint {name!r} (see `gpujail failpoints`)")
        terms = []
        for text in chain.split("->"):
            m = _TERM.match(text)
            if not m:
                raise FailpointSpecError(f"{where}: bad term {text.strip()!r}, expected [N*|P%]action[(arg)]")
            action, arg = m["action"], m["arg"]
            if action not in ACTIONS:
                raise FailpointSpecError(f"{where}: unknown action {action!r}, expected one of {', '.join(ACTIONS)}")
            if action in ("return", "sleep", "pause", "wait", "stop") and not arg:
                raise FailpointSpecError(f"{where}: {action} needs an argument")
            if action == "kill" and arg not in (None, "write"):
                raise FailpointSpecError(f"{where}: kill takes no argument or `write` (at the next write), got {arg!r}")
            if action == "sleep" and not arg.isdigit():
                raise FailpointSpecError(f"{where}: sleep takes milliseconds, got {arg!r}")
            if action in ("pause", "wait", "stop") and not os.environ.get(BARRIERS_ENV):
                raise FailpointSpecError(f"{where}: {action} needs {BARRIERS_ENV} to name a barrier directory")
            if action == "return" and not (arg.startswith('"') or isinstance(getattr(errno, arg, None), int)):
                raise FailpointSpecError(f"{where}: return takes an errno name or a quoted message, got {arg!r}")
            terms.append(Term(action, arg, int(m["count"]) if m["count"] else None,
                              float(m["pct"]) if m["pct"] else None))
        seed = f"{os.environ.get('GPUJAIL_SEED', '0')}:{os.environ.get('GPUJAIL_NODE', '')}:{name}"
        points[name] = Failpoint(name, terms, rng=random.Random(seed))
    return points


FAILING = ("return", "kill", "panic")   # the actions that end a step in failure


def failing_hits(spec: str) -> dict[str, int]:
    """{failpoint: the hit at which its chain first fails} for the chains of `spec` whose failure the
    counts alone decide (`23*off->return(EIO)`: hit 24): what the controlled scheduler knows of a
    start's faults before they act (gpujail/world/schedule.py). A chain with a P% term before its
    failure, or none, is left out. `spec` is one the runner built, already valid."""
    out = {}
    for entry in filter(str.strip, spec.split(";")):
        name, _, chain = entry.partition("=")
        hit = 0
        for text in chain.split("->"):
            m = _TERM.match(text)
            if m is None or m["pct"]:
                break
            if m["action"] in FAILING:
                out[name.strip()] = hit + 1
                break
            if not m["count"]:
                break   # this term takes every hit from here on, and it is no failure
            hit += int(m["count"])
    return out


class Process:
    """What a failpoint acts on: by default this OS process, armed from its environment."""

    def __init__(self):
        self._armed: dict[str, Failpoint] | None = None
        self._spec: str | None = None

    def armed(self) -> dict[str, Failpoint]:
        spec = os.environ.get(ENV, "")
        if self._armed is None or spec != self._spec:
            self._armed, self._spec = parse(spec), spec
        return self._armed

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def die(self, action: str) -> None:
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os.abort()

    # What `stop` and `kill(write)` can do to this process (see the module's doc): the base class
    # cannot act on a real process it may not be (the model's simulated ones, a shell's helper).
    kills_at_write = False

    def stop(self, barrier: str) -> None:
        """`stop(barrier)` where no signal can stop the process: it pauses (to the others the same)."""
        Barrier(barrier).arrive_and_wait()

    def die_at_write(self) -> None:
        """`kill(write)` where the kill cannot be put inside the next write: killed here."""
        self.die("kill")


class OSProcess(Process):
    """This OS process: `stop` is a real SIGSTOP, `kill(write)` a kill inside the next write(2)."""
    kills_at_write = True

    def stop(self, barrier: str) -> None:
        """Stopped by a watcher child, which arrives at the barrier once the stop is sent, waits
        for its release and sends SIGCONT. This process meanwhile blocks reading a pipe the watcher
        writes only after the SIGCONT, so it cannot run on between the fork and the stop, and a
        release that comes early is never lost."""
        b = Barrier(barrier)
        me = os.getpid()
        r, w = os.pipe()
        child = os.fork()
        if child == 0:   # the watcher: no history, no atexit, no cleanup of the parent's
            code = 1
            try:
                os.close(r)
                os.kill(me, signal.SIGSTOP)
                b.arrive_and_wait(pid=me)
                code = 0
            finally:
                try:
                    os.kill(me, signal.SIGCONT)
                    os.write(w, b"c")
                finally:
                    os._exit(code)
        os.close(w)
        try:
            os.read(r, 1)   # the watcher's byte after the SIGCONT (or EOF: it died; go on)
        finally:
            os.close(r)
            os.waitpid(child, 0)

    def die_at_write(self) -> None:
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)   # Python starts with it ignored (EFBIG instead)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # no core file (in the jail, the cwd)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


_os_process = OSProcess()
_local = _thread._local()


def set_process(process: Process | None) -> None:
    """Make `process` the one this thread's failpoints act on (None: back to this OS process)."""
    _local.process = process


def current() -> Process:
    return getattr(_local, "process", None) or _os_process


def armed() -> dict[str, Failpoint]:
    """The failpoints armed for the current process (parsed once per process and spec)."""
    return current().armed()


_scheduled_hits: dict[str, int] = {}   # every failpoint's hits in this process, armed or not (the scheduler's)


def scheduling_point(name: str, nth: int | None = None, path: str = "") -> None:
    """With GPUJAIL_SCHEDULER set (a run under `--schedule`, gpujail/world/schedule.py), failpoint
    `name` is a scheduling point: wait here until the harness's scheduler lets this process go.
    `nth`: the hit count when the caller keeps it (a shell script); else this process counts."""
    address = os.environ.get(SCHEDULER_ENV)
    if not address or not (current() is _os_process or getattr(current(), "os_process", False)):
        return   # no scheduler, or a simulated process (the model backend schedules its own)
    if nth is None:
        nth = _scheduled_hits[name] = _scheduled_hits.get(name, 0) + 1
    from gpujail.world import schedule
    schedule.arrive(address, name, nth, str(path or ""))


def hit(name: str, **context) -> None:
    """Evaluate failpoint `name`. Raises OSError for `return`; may sleep, pause, abort or die.
    Under a scheduler, first a scheduling point (`scheduling_point`)."""
    scheduling_point(name, path=context.get("path", ""))
    _evaluate(name, **context)


def _evaluate(name: str, **context) -> None:
    assert name in REGISTRY, name
    process = current()
    fp = process.armed().get(name)
    if fp is None:
        return
    fp.hits += 1
    term = _current_term(fp)
    while term is not None and term.action == "wait":   # wait for the moment, then the rest of the chain
        history.record("failpoint", name=name, hit=fp.hits, action="wait", arg=term.arg, **context)
        Barrier(term.arg).arrive_and_wait()
        term = _current_term(fp, fp.terms.index(term) + 1)
    action = term.action if term else "off"
    arg = term.arg if term else None
    if action == "kill" and arg == "write" and not process.kills_at_write:
        arg = None   # killed at the failpoint instead (Process.die_at_write): no torn write to count
    history.record("failpoint", name=name, hit=fp.hits, action=action, arg=arg, **context)
    if action == "off":
        return
    if action == "print":
        print(f"failpoint {name} hit {fp.hits}", file=sys.stderr)
    elif action == "sleep":
        process.sleep(int(term.arg) / 1000)
    elif action == "pause":
        Barrier(term.arg).arrive_and_wait()
    elif action == "stop":
        process.stop(term.arg)
    elif action == "kill" and term.arg == "write":
        process.die_at_write()
    elif action in ("kill", "panic"):
        process.die(action)
    elif action == "return":
        if term.arg.startswith('"'):
            raise OSError(errno.EIO, term.arg.strip('"'), context.get("path"))
        code = getattr(errno, term.arg)
        raise OSError(code, os.strerror(code), context.get("path"))


def replay_hit(name: str, nth: int, **context) -> bool:
    """Hit `name` as the `nth` hit of a process that cannot keep the counts itself (a shell script,
    through fixtures/bin/gpujail-failpoint): the earlier hits are evaluated silently first, so N*
    counts and P% draws come out as they would in one long-lived process. True when the script need
    not call again: no later hit can act and no scheduler counts hits (the helper is a Python start,
    about 0.1 s of CPU: a shell lock holder's ~90 markers spent seconds in it after the fault fired)."""
    scheduling_point(name, nth, context.get("path", ""))
    fp = current().armed().get(name)
    for _ in range(nth - 1 if fp else 0):
        fp.hits += 1
        _current_term(fp)
    _evaluate(name, **context)
    return not os.environ.get(SCHEDULER_ENV) and (fp is None or fp.spent())


def _current_term(fp: Failpoint, start: int = 0) -> Term | None:
    """gofail's terms.eval: the first term of the chain (from `start`) whose mods allow this hit."""
    for term in fp.terms[start:]:
        if term.count is not None:       # modCount.allow: spend one of the N
            if term.count <= 0:
                continue
            term.count -= 1
        if term.percent is not None and fp.rng.uniform(0, 100) >= term.percent:
            continue                     # modProb.allow missed: fall through to the next term
        return term
    return None


class Barrier:
    """A named rendezvous between paused processes and the harness, as files in a shared directory.

    A process that hits `pause(name)` creates `name.arrived.<node>.<pid>` and waits until
    `name.release` exists. The harness counts arrivals and releases everyone at once, which is how
    a chaos test forces 8 CLIs into the same `mkdir` window every time.
    """

    def __init__(self, name: str, directory: str | None = None):
        self.name = name
        self.dir = directory or os.environ.get(BARRIERS_ENV) or ""
        if not self.dir:
            raise FailpointSpecError(f"pause({name}) needs {BARRIERS_ENV} to name a barrier directory")

    def arrivals(self) -> int:
        prefix = f"{self.name}.arrived."
        return sum(1 for f in os.listdir(self.dir) if f.startswith(prefix))

    def arrived(self) -> set[str]:
        """The nodes that have arrived (`name.arrived.<node>.<pid>`): the harness's view of who is held here."""
        prefix = f"{self.name}.arrived."
        return {f[len(prefix):].split(".")[0] for f in os.listdir(self.dir) if f.startswith(prefix)}

    def arrive_and_wait(self, timeout: float = 300.0, pid: int | None = None) -> None:
        """Arrive (as process `pid`, default this one: a stop's watcher arrives for the stopped
        process) and wait for the release."""
        me = os.path.join(self.dir, f"{self.name}.arrived.{os.environ.get('GPUJAIL_NODE', 'x')}.{pid or os.getpid()}")
        open(me, "w").close()
        deadline = time.monotonic() + timeout
        release = os.path.join(self.dir, f"{self.name}.release")
        while not os.path.exists(release):
            if time.monotonic() > deadline:
                raise OSError(errno.ETIMEDOUT, f"barrier {self.name} never released")
            time.sleep(0.001)

    def wait_released(self, timeout: float = 300.0) -> None:
        """Block until the harness releases this barrier (a worker it starts only then)."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(os.path.join(self.dir, f"{self.name}.release")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"barrier {self.name} never released within {timeout:g}s")
            time.sleep(0.002)

    def wait_arrivals(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.arrivals() < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"barrier {self.name}: {self.arrivals()} of {n} arrived within {timeout:g}s")
            time.sleep(0.002)

    def release(self) -> None:
        open(os.path.join(self.dir, f"{self.name}.release"), "w").close()
