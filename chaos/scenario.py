"""Chaos scenarios as data: who runs, on which driver, which faults hit whom, and the seed.

How this works
--------------
A scenario is a TOML file in chaos/scenarios/ (or any file passed to the runner):

    name = "cold-race"
    description = "8 GPU workers start at once on a cold jail; every CLI pauses at its first mkdir"
    gpu_workers = 8            # also cpu_workers, login_nodes
    versions = ["550.54.15"]   # cycled over the GPU workers (a driver upgrade mixes two)
    warm = false               # true: one worker populates the jail before the run
    reused_jail = false        # true: the jail holds markers, 0-byte placeholders and the flag of an earlier cluster
    read_only = false          # true: every worker sees the (warmed) jail read-only
    mps = false                # true: every GPU worker's host runs MPS (its pipe directory /tmp/nvidia-mps)
    layout = "debian"          # the GPU hosts' distribution: where their libraries are (fixtures/drivers.py LAYOUTS)
    jail_symlink = false       # true: every worker is given the jail through a symlink (GPUJAIL_JAIL=/scratch -> /lustre/...)
    hostile_links = { "usr/lib/firmware/nvidia" = "@OUTSIDE" }   # symlinks out of the jail, planted first
    swapped_links = [{ barrier = "swap", path = "usr/lib/firmware/nvidia", target = "@OUTSIDE" }]   # ... or
                               # swapped in during the run, when someone arrives at the barrier (what was
                               # there moved aside, out of the jail)
    windows = ["overlap"]      # the fault windows a run must open, else it is INCONCLUSIVE (chaos/checkers/windows.py)
    probe_sonames = false      # true: probes also check each ready worker's sonames load its own driver (REF-12)
    probe_lookups = false      # true: ... and look them up through the jail's linker cache (ldconfig -p, chrooted dlopen)
    upgraded_jail = false      # true: a `legacy` worker brings the jail up first and stays ready (REF-3)
    cuda_image = false         # true: the jail holds usr/local/cuda/compat libraries (REF-6)
    ldconfig = { view = "blind", every = 0.05, hold_lock = true, nodes = 1 }   # an ldconfig nemesis during the run
    jail_fs = "gluster"        # pins the jail's file system (gpujail/backends/jailfs.py); "" = --jail-fs
    net_faults = [{ fault = "kill-brick", after_ready = 0, delay = 0.3, hold = 2.0 }]   # network faults (jailfs.NetFault);
                               # with barrier = "B": once a worker is paused at B, which opens then (at a step)
    populate_cleanup = false   # true: run the implementation's populate-jail cleanup first
    populate_at = "fleet-up"   # ... or again during the run, once that barrier opens (a jail in use)
    max_restarts = 3
    transient_only = true      # INV-2 applies: every worker must end ready
    [[barriers]]               # released when every worker has arrived or finished
    name = "race"
    open = "others-failed"     # (optional) ... or, for those that did not arrive, failed a start once: a
                               # stopped lock holder resumed once every waiter has given up at least once
    [[faults]]                 # GPUJAIL_FAILPOINTS terms for one worker's first start (or "*": all)
    worker = "*"
    failpoint = "cli.before_mkdir"
    term = "1*pause(race)"
    start = 1                  # 2: the fault hits the worker's first restart instead
    [[faults]]                 # a syscall fault: the CLI runs under strace --inject (fixtures/syscall_faults.py)
    worker = "w5"              # `syscall.NAME`: the system call; the term in that module's grammar
    failpoint = "syscall.mount"
    term = "20*off->1*return(EIO)+pause(late)"
    [[kills]]                  # kill a worker's node (SIGKILL: no cleanup) once it reaches a barrier
    worker = "w1"              # or "*": whoever reaches it first
    when = "release"           # or "arrival" (default): kill at once, e.g. the lock holder others queue behind
    barrier = "hold"
    start_after = { w1 = "creator" }   # the harness starts w1 only once barrier "creator" is released
    impls = { w1 = "legacy" }  # a worker running another implementation than the run's (a fleet half migrated)
    capabilities = "compute,utility"   # NVIDIA_DRIVER_CAPABILITIES of every start ...
    worker_capabilities = { w1 = "graphics,display,utility" }   # ... or of this worker's (jobs asking for others)
    lock_faults = [{ barrier = "resume", fault = "remove" }]   # the placeholder lock file removed ("replace":
                               # a new file renamed over it) when someone arrives at the barrier: a lock lost
                               # while its holder lives (a lost NFS lease, a cleanup job, an image sync)
    start_timeout = 10.0       # each start's deadline in this scenario (at most the run's --start-timeout)
    host_upgrades = [{ worker = "w1", barrier = "upgrade", version = "570.86.15" }]   # w1's host driver
                               # upgraded (old files removed, new ones installed) when w1 arrives at the
                               # barrier, e.g. paused between `list` and `configure`; its restarts run on it
    shared_propagation = false # true: the jail's usr is a shared mount of the host's (systemd's `/`, a
                               # Kubernetes Bidirectional volume): every node's copy of it a peer
                               # (gpujail/backends/shared_host.py; root, kernel backend, local jail)
    jail_mount_point = true    # false: in every node the jail is a plain directory of the run directory's mount,
                               # not a mount point of its own (a jail below a shared file system's mount point)

`mode = "random"` replaces the fixed schedule by seeded random faults: each GPU worker's first
start gets `P%sleep(ms)` terms on the CLI's steps and, with probability `fail_rate`, a
`return(EIO)` after a random number of mounts (drawn from `fail_after`; `fail_count = N` instead
makes exactly N workers, picked by the seed, fail: "one random CLI fault"); the same seed always gives the same schedule
(`Scenario.schedule(seed)`), so a failing run is replayed exactly from its seed.
"""
from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from gpujail.fixtures import syscall_faults
from gpujail.spec import DEFAULT_WORKERS
from gpujail.world.failpoints import REGISTRY

SYSCALL = "syscall."   # a fault on `syscall.NAME` is injected by strace at that system call, not by a failpoint

DIR = Path(__file__).resolve().parent / "scenarios"
JAILFS_DIR = DIR / "jailfs"   # the scenarios of a network jail's own faults (chaos/test_jailfs_scenarios.py)
KEYS = {"name", "description", "gpu_workers", "cpu_workers", "login_nodes", "versions", "warm", "reused_jail",
        "populate_cleanup", "max_restarts", "transient_only", "barriers", "faults", "kills", "mode", "fail_rate",
        "fail_count", "fail_after",
        "capabilities", "probe_interval", "legacy_breaks", "lock_timeout", "scale", "read_only", "mps", "layout", "jail_symlink",
        "hostile_links",
        "windows", "probe_sonames", "probe_lookups", "upgraded_jail", "cuda_image", "ldconfig", "jail_fs", "net_faults",
        "start_after", "impls", "worker_capabilities", "lock_faults", "start_timeout", "populate_at", "swapped_links",
        "host_upgrades", "shared_propagation", "jail_mount_point"}


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    worker: str        # worker id or "*"
    failpoint: str
    term: str
    start: int = 1     # which start of the worker it hits (1: the first; 2: its first restart)


@dataclass(frozen=True)
class LockFault:
    barrier: str
    fault: str = "remove"   # "remove": the lock file unlinked; "replace": a new file renamed over it
    lock: str = ""          # jail-relative lock path ("": the placeholder lock, SPEC REF-5)


LOCK_FAULTS = ("remove", "replace")


@dataclass(frozen=True)
class SwappedLink:
    barrier: str
    path: str      # jail-relative
    target: str    # the link's target ("@OUTSIDE": a directory outside the jail)


@dataclass(frozen=True)
class HostUpgrade:
    worker: str    # whose host
    barrier: str   # upgraded when the worker arrives there (e.g. paused between `list` and `configure`)
    version: str   # the driver it gets; its restarts run on it too


BARRIER_OPENS = ("others-failed",)


@dataclass(frozen=True)
class Kill:
    worker: str
    barrier: str
    when: str = "arrival"   # "arrival": as soon as it reaches the barrier; "release": once everyone else is ready


@dataclass
class Scenario:
    name: str
    description: str = ""
    gpu_workers: int | None = None   # None: the run's --workers (a scenario that names its workers pins it)
    cpu_workers: int = 0
    login_nodes: int = 0
    versions: list[str] = field(default_factory=lambda: ["550.54.15"])
    warm: bool = False
    reused_jail: bool = False
    populate_cleanup: bool = False
    max_restarts: int = 3
    transient_only: bool = True
    barriers: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    mode: str = "deterministic"
    fail_rate: float = 0.3
    fail_count: int | None = None   # random mode: exactly this many GPU workers' CLIs fail (instead of fail_rate)
    fail_after: tuple[int, int] = (3, 40)   # random mode: a failing CLI fails at a mount drawn from this range
    capabilities: str = "compute,utility"
    probe_interval: float = 0.02
    lock_timeout: float = 30.0   # GPUJAIL_LOCK_TIMEOUT for every start
    scale: bool = False          # a big run: opt-in with `-m scale`
    read_only: bool = False      # every worker sees the jail read-only (after warming it)
    mps: bool = False            # every GPU worker's host runs MPS: `list` prints its pipe directory
    layout: str = "debian"       # the GPU hosts' distribution: debian, rhel (lib64 + 32-bit lib), arch (lib + lib32)
    jail_symlink: bool = False   # the workers name the jail through a symlink to it (as clusters name /scratch)
    hostile_links: dict[str, str] = field(default_factory=dict)   # jail path -> link target ("@OUTSIDE": a dir outside)
    legacy_breaks: bool = True   # documentation: whether `legacy` is expected to violate an invariant
    windows: list[str] = field(default_factory=list)   # fault windows the run must open (chaos/checkers/windows.py)
    probe_sonames: bool = False  # also probe each ready worker's sonames against its own driver (REF-12)
    probe_lookups: bool = False  # also look each soname up through the jail's linker cache (issue 17, PR #2621/#2682)
    upgraded_jail: bool = False  # a `legacy` worker brings the jail up first and stays ready (0-byte placeholders, REF-3)
    cuda_image: bool = False     # the jail holds a CUDA image's usr/local/cuda/compat libraries (REF-6, CLI-3)
    # the ldconfig nemesis: {view = "blind" | "gpu", every = seconds, version = "..." (gpu view),
    # hold_lock = true: it runs ldconfig holding etc/complement_jail_ldconfig.lock, like the lock winner,
    # nodes = 2: two such nodes, handing the lock to each other with no gap}
    ldconfig: dict = field(default_factory=dict)
    jail_fs: str = ""            # the jail's file system this scenario needs ("": the run's --jail-fs)
    net_faults: list = field(default_factory=list)   # faults only a network jail has (jailfs.NetFault)
    start_after: dict[str, str] = field(default_factory=dict)   # worker -> the barrier whose release starts it
    impls: dict[str, str] = field(default_factory=dict)   # worker -> its implementation, if not the run's
    worker_capabilities: dict[str, str] = field(default_factory=dict)   # worker -> its capabilities, if not `capabilities`
    lock_faults: list[LockFault] = field(default_factory=list)   # the lock lost under its holder, at a barrier
    start_timeout: float | None = None   # each start's deadline here (None: the run's)
    populate_at: str = ""        # the populate-jail cleanup run on the live jail when this barrier opens
    swapped_links: list[SwappedLink] = field(default_factory=list)   # symlinks swapped in at a barrier
    host_upgrades: list[HostUpgrade] = field(default_factory=list)   # a host's driver upgraded under its start
    shared_propagation: bool = False   # the nodes' JAIL/usr mounts are peers of a shared host mount
    jail_mount_point: bool = True      # False: the jail is no mount point in the nodes, a directory of one
    barrier_opens: dict[str, str] = field(default_factory=dict)   # barrier -> when it opens besides arrivals

    @property
    def workers(self) -> list[tuple[str, str, str | None]]:
        """(worker id, role, driver version) for everyone, GPU workers first."""
        gpu = DEFAULT_WORKERS if self.gpu_workers is None else self.gpu_workers
        out = [(f"w{i}", "gpu-worker", self.versions[i % len(self.versions)]) for i in range(gpu)]
        out += [(f"cpu{i}", "cpu-worker", None) for i in range(self.cpu_workers)]
        out += [(f"login{i}", "login", None) for i in range(self.login_nodes)]
        return out

    def capabilities_of(self, worker: str) -> str:
        """NVIDIA_DRIVER_CAPABILITIES of this worker's starts (a fleet whose jobs ask for different ones)."""
        return self.worker_capabilities.get(worker, self.capabilities)

    def with_workers(self, n: int) -> "Scenario":
        """This scenario with `n` GPU workers (--workers), unless it pins its own count."""
        import dataclasses
        return self if self.gpu_workers is not None else dataclasses.replace(self, gpu_workers=n)

    def randomised(self) -> "Scenario":
        """The same scenario in random mode: its fixed faults plus seeded random timing (and, if
        the scenario says so, random late CLI failures)."""
        import dataclasses
        return dataclasses.replace(self, mode="random", fail_rate=self.fail_rate if self.mode == "random" else 0.0)

    def timing_barriers(self) -> list[str]:
        """The barriers that only time the run: workers `pause` there and nothing else is tied to
        them (no kill, lock fault, swapped link, host upgrade, populate job, delayed start, opening
        rule, `wait` or `stop`, no system-call fault's pause, which strace's syntax joins to the fault).
        The others carry a fault themselves."""
        tied = ({k.barrier for k in self.kills} | {f.barrier for f in self.lock_faults}
                | {s.barrier for s in self.swapped_links} | {u.barrier for u in self.host_upgrades}
                | {self.populate_at} | set(self.start_after.values()) | set(self.barrier_opens)
                | {getattr(f, "barrier", "") for f in self.net_faults})
        tied |= {b for f in self.faults for b in self.barriers
                 if f"wait({b})" in f.term or f"stop({b})" in f.term or f.failpoint.startswith(SYSCALL)}
        paused = {b for f in self.faults for b in self.barriers if f"pause({b})" in f.term}
        return [b for b in self.barriers if b in paused and b not in tied]

    def unscripted(self) -> Scenario:
        """This scenario without its timing script: each timing barrier dropped and its `pause(B)`
        terms made `off` (the same hit counts, so a fault still fires at the same hit), so that a
        scheduler (`--schedule pct`) has to find the order the barrier forced. The world and the
        faults stay as they are."""
        import dataclasses
        drop = self.timing_barriers()
        faults = self.faults
        for b in drop:
            faults = [dataclasses.replace(f, term=f.term.replace(f"pause({b})", "off")) for f in faults]
        return dataclasses.replace(self, barriers=[b for b in self.barriers if b not in drop], faults=faults)

    def schedule(self, seed: int) -> dict[str, str]:
        """GPUJAIL_FAILPOINTS per worker for its first start: the fixed faults, plus a seeded
        random schedule in random mode."""
        specs: dict[str, list[str]] = {w: [] for w, _, _ in self.workers}
        for f in self.faults:
            if f.failpoint.startswith(SYSCALL) or f.start != 1:   # syscall_schedule's, restart_schedule's
                continue
            for w in specs if f.worker == "*" else [f.worker]:
                specs[w].append(f"{f.failpoint}={f.term}")
        if self.mode == "random":
            rng = random.Random(seed)
            gpu = [w for w, role, _ in self.workers if role == "gpu-worker"]
            # fail_count picks its failing workers with its own generator: fail_rate's draws stay as they were
            failing = set(random.Random(f"fail:{seed}").sample(gpu, min(self.fail_count, len(gpu)))
                          ) if self.fail_count is not None else set()
            for w in gpu:
                taken = {spec.split("=")[0] for spec in specs[w]}   # fixed faults keep their failpoint
                jitter = {"cli.before_mkdir": f"{rng.randint(10, 60)}%sleep({rng.randint(1, 5)})",
                          "cli.before_mount": f"{rng.randint(5, 30)}%sleep({rng.randint(1, 3)})",
                          "ref.before_configure": f"{rng.randint(10, 50)}%sleep({rng.randint(1, 20)})"}
                fails = rng.random() < self.fail_rate   # drawn either way: the later draws stay as they were
                if (w in failing) if self.fail_count is not None else fails:
                    jitter["cli.before_mount"] = f"{rng.randint(*self.fail_after)}*off->return(EIO)"
                specs[w] += [f"{fp}={term}" for fp, term in jitter.items() if fp not in taken]
        return {w: ";".join(s) for w, s in specs.items() if s}

    def restart_schedule(self) -> dict[str, dict[int, str]]:
        """GPUJAIL_FAILPOINTS per worker and attempt (1: its first restart) for the faults that hit
        a later start than the first."""
        specs: dict[str, dict[int, list[str]]] = {}
        for f in self.faults:
            if f.start != 1:
                for w in [w for w, _, _ in self.workers] if f.worker == "*" else [f.worker]:
                    specs.setdefault(w, {}).setdefault(f.start - 1, []).append(f"{f.failpoint}={f.term}")
        return {w: {a: ";".join(s) for a, s in by.items()} for w, by in specs.items()}

    def syscall_schedule(self) -> dict[str, str]:
        """GPUJAIL_SYSCALL_FAULTS per worker for its first start: its `syscall.NAME` faults, which
        the wrapper turns into strace --inject rules (fixtures/syscall_faults.py)."""
        specs: dict[str, list[str]] = {}
        for f in self.faults:
            if f.failpoint.startswith(SYSCALL):
                for w in [w for w, _, _ in self.workers] if f.worker == "*" else [f.worker]:
                    specs.setdefault(w, []).append(f"{f.failpoint[len(SYSCALL):]}={f.term}")
        return {w: ";".join(s) for w, s in specs.items()}


def load(source: str | Path) -> Scenario:
    """A scenario by name (chaos/scenarios/NAME.toml, else chaos/scenarios/jailfs/NAME.toml) or path;
    errors name the file and the key."""
    path = Path(source)
    if not path.suffix:
        path = DIR / f"{source}.toml"
        if not path.exists() and (JAILFS_DIR / path.name).exists():
            path = JAILFS_DIR / path.name
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario (see `ls {DIR}`)") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{path}: {e}") from None
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise ScenarioError(f"{path}: unknown key(s) {', '.join(unknown)}")
    try:
        faults = [Fault(**f) for f in data.pop("faults", [])]
        kills = [Kill(**k) for k in data.pop("kills", [])]
        raw_barriers = data.pop("barriers", [])
        barriers = [b["name"] for b in raw_barriers]
        opens = {b["name"]: b["open"] for b in raw_barriers if "open" in b}
        unknown_barrier_keys = sorted({k for b in raw_barriers for k in b} - {"name", "open"})
        if unknown_barrier_keys:
            raise ScenarioError(f"{path}: barriers: unknown key(s) {', '.join(unknown_barrier_keys)}")
        lock_faults = [LockFault(**f) for f in data.pop("lock_faults", [])]
        swapped = [SwappedLink(**f) for f in data.pop("swapped_links", [])]
        upgrades = [HostUpgrade(**f) for f in data.pop("host_upgrades", [])]
        scenario = Scenario(faults=faults, kills=kills, barriers=barriers, lock_faults=lock_faults,
                            barrier_opens=opens, swapped_links=swapped, host_upgrades=upgrades, **data)
    except (TypeError, KeyError) as e:
        raise ScenarioError(f"{path}: {e}") from None
    for w, spec in scenario.syscall_schedule().items():
        try:
            syscall_faults.parse(spec)
        except syscall_faults.SyscallFaultError as e:
            raise ScenarioError(f"{path}: worker {w}: {e}") from None
    for f in faults:
        if f.failpoint.startswith(SYSCALL):
            continue
        if f.failpoint not in REGISTRY:
            raise ScenarioError(f"{path}: fault on unknown failpoint {f.failpoint!r}")
    from gpujail.chaos.checkers import network  # noqa: F401 (registers the network faults' windows)
    from gpujail.chaos.checkers.windows import WINDOWS
    if scenario.jail_fs or scenario.net_faults:
        from gpujail.backends.jailfs import KINDS, NET_FAULTS, NetFault
        if scenario.jail_fs and scenario.jail_fs not in KINDS:
            raise ScenarioError(f"{path}: jail_fs {scenario.jail_fs!r}, expected one of {', '.join(KINDS)}")
        try:
            scenario.net_faults = [NetFault(**f) for f in scenario.net_faults]
        except TypeError as e:
            raise ScenarioError(f"{path}: net_faults: {e}") from None
        bad = [f.fault for f in scenario.net_faults if f.fault not in NET_FAULTS]
        if bad:
            raise ScenarioError(f"{path}: net_faults: unknown fault(s) {', '.join(bad)} (known: {', '.join(NET_FAULTS)})")
        if scenario.net_faults and scenario.jail_fs != "gluster":   # else the injector fails mid-run
            raise ScenarioError(f"{path}: net_faults need jail_fs = \"gluster\" (they act on its brick, its "
                                f"clients and its delay-gen translator), given {scenario.jail_fs or 'none'}")
    from gpujail.fixtures.drivers import LAYOUTS
    if scenario.layout not in LAYOUTS:
        raise ScenarioError(f"{path}: layout {scenario.layout!r}, expected one of {', '.join(LAYOUTS)}")
    unknown_windows = [w for w in scenario.windows if w not in WINDOWS]
    if unknown_windows:
        raise ScenarioError(f"{path}: unknown window(s) {', '.join(unknown_windows)} (known: {', '.join(WINDOWS)})")
    if scenario.ldconfig and scenario.ldconfig.get("view") not in ("blind", "gpu"):
        raise ScenarioError(f"{path}: ldconfig.view must be \"blind\" or \"gpu\"")
    if scenario.mode not in ("deterministic", "random"):
        raise ScenarioError(f"{path}: mode {scenario.mode!r}, expected deterministic or random")
    after = list(scenario.fail_after)
    if len(after) != 2 or not all(isinstance(n, int) for n in after) or not 1 <= after[0] <= after[1]:
        raise ScenarioError(f"{path}: fail_after must be [FIRST, LAST] mounts, 1 <= FIRST <= LAST, got {after}")
    if scenario.fail_count is not None and (not isinstance(scenario.fail_count, int) or scenario.fail_count < 0
                                            or scenario.mode != "random"):
        raise ScenarioError(f"{path}: fail_count must be a whole number of workers >= 0, in mode = \"random\"")
    bad_opens = [f"{b} = {o!r}" for b, o in scenario.barrier_opens.items() if o not in BARRIER_OPENS]
    if bad_opens:
        raise ScenarioError(f"{path}: barriers: open {', '.join(bad_opens)}, expected one of {', '.join(BARRIER_OPENS)}")
    for key, barrier in ([("lock_faults", lf.barrier) for lf in scenario.lock_faults]
                         + [("swapped_links", sl.barrier) for sl in scenario.swapped_links]
                         + [("host_upgrades", up.barrier) for up in scenario.host_upgrades]
                         + [("net_faults", f.barrier) for f in scenario.net_faults if f.barrier]
                         + [("populate_at", scenario.populate_at)] * bool(scenario.populate_at)):
        if barrier not in scenario.barriers:
            raise ScenarioError(f"{path}: {key}: no barrier {barrier!r} (barriers are {', '.join(scenario.barriers)})")
    for lf in scenario.lock_faults:
        if lf.fault not in LOCK_FAULTS:
            raise ScenarioError(f"{path}: lock_faults: fault {lf.fault!r}, expected one of {', '.join(LOCK_FAULTS)}")
    for sl in scenario.swapped_links:
        if sl.path.startswith("/") or ".." in sl.path.split("/"):
            raise ScenarioError(f"{path}: swapped_links: path {sl.path!r} must be jail-relative")
    from gpujail.fixtures.drivers import VERSIONS
    versions = {w: v for w, _, v in scenario.workers}
    for up in scenario.host_upgrades:
        if not versions.get(up.worker):
            raise ScenarioError(f"{path}: host_upgrades: no GPU worker {up.worker!r}")
        if up.version not in VERSIONS or up.version == versions[up.worker]:
            raise ScenarioError(f"{path}: host_upgrades: {up.worker} runs {versions[up.worker]}; version "
                                f"{up.version!r} must be another of {', '.join(VERSIONS)}")
    if scenario.start_timeout is not None and not 0 < scenario.start_timeout < float("inf"):
        raise ScenarioError(f"{path}: start_timeout must be a positive number of seconds")
    from gpujail.fixtures.nvc_info import CAPABILITIES
    for who, caps in [("", scenario.capabilities), *scenario.worker_capabilities.items()]:
        bad = [c for c in caps.split(",") if c.strip() not in (*CAPABILITIES, "all")]
        if bad:
            raise ScenarioError(f"{path}: {'worker_capabilities.' + who if who else 'capabilities'}: unknown "
                                f"capability {bad[0]!r} (known: {', '.join(CAPABILITIES)}, all)")
    ids = {w for w, _, _ in scenario.workers}
    for who in ([f.worker for f in faults if f.worker != "*"] + [k.worker for k in kills if k.worker != "*"]
                + list(scenario.worker_capabilities)):
        if who not in ids:
            raise ScenarioError(f"{path}: no worker {who!r} (workers are {', '.join(sorted(ids))})")
    return scenario


def names(where: Path = DIR) -> list[str]:
    return sorted(p.stem for p in where.glob("*.toml"))


# The scenarios `legacy` cannot show failing (a killed CLI does no cleanup, legacy takes no lock, ...) or
# that guard against a later mistake too, and the mutant (reference_impl/mutants.py) with the bug each
# guards against: tests/test_chaos_kills.py shows each failing against it, the benchmarks count how
# often and how fast (benchmarks/bug_finding.py).
GUARDS = {
    "cli-killed": "mutant:cleanup-on-failure",           # its failure path removes placeholders
    "worker-killed": "mutant:recreate-markers",          # a restart re-creates placeholders
    "lock-holder-killed": "mutant:mkdir-lock",           # a lock that outlives its holder
    "failing-neighbour": "mutant:zero-byte-placeholders",
    "read-only-jail": "mutant:recreate-markers",         # writes on every start
    "marker-torn": "mutant:zero-byte-counts-present",    # the torn marker left 0 bytes, then unlinked
    "lock-lost": "mutant:atomic-rename-markers",         # the resumed holder renames over a live marker
    "lock-holder-stopped": "mutant:unbounded-lock-wait",   # waiters hang behind the stopped holder
    "links-swapped": "mutant:jail-checked-once",         # checked at the start, followed after the swap
    "mixed-capabilities": "mutant:markers-for-default-capabilities",   # graphics libraries left to the CLI
    "host-upgraded-mid-start": "mutant:exit-code-only",  # ready on the CLI's word, over 0-byte files
    "shared-propagation": "mutant:propagation-kept",     # w1's mounts reach w0 through the shared host mount
    "shared-propagation-jail-dir": "mutant:propagation-kept",
    "upgraded-jail": "mutant:zero-byte-counts-present",
    "mixed-drivers": "mutant:soname-links",
    "cuda-image": "mutant:compat-mount",
    "ldcache-rewrite": "mutant:soname-links",
    "ldconfig-blind-winner": "mutant:ldconfig-winner-only",
}
