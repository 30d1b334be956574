"""Run one chaos scenario against one implementation on a backend (kernel or docker), then judge it.

How this works
--------------
The run only records; the checker judges (chaos/checker.py). Choreography:

1. a fresh jail (optionally warmed by one worker, or dressed as a reused jail, or cleaned by the
   implementation's populate-jail cleanup), snapshotted as `jail_before`;
2. every worker starts at once, each in its own thread (the thread only waits on a node process),
   through the contract runner with the scenario's restart policy; the first start of each worker
   carries its faults (GPUJAIL_FAILPOINTS) from `Scenario.schedule(seed)`. An ldconfig nemesis, if
   the scenario has one, starts first; one that holds the jail's ldconfig lock has it before any
   worker starts;
3. a barrier keeper releases each named barrier once every GPU worker has either arrived at it or
   finished (or, where the scenario says so, had a start fail), kills the nodes the scenario says to
   kill when they arrive (SIGKILL: no cleanup), takes a jail lock file from under whoever arrives
   at a barrier with a lock fault (removed or replaced: the holder keeps running) and swaps the
   scenario's symlinks into the jail there; a populate-jail job may run on the live jail once its
   barrier opens (`populate_at`);
4. a prober keeps asking every ready GPU worker what a GPU job sees through the jail (real loader,
   bytes compared with the host file; if the scenario says so, its sonames looked up through the
   jail's linker cache too), so a detachment is recorded when it happens;
5. after everyone finished: a last probe round, `jail_after`, the fleet torn down, and a look for
   residue on the host (mounts, processes).

`run()` returns a `ChaosRun` with the verdict; on a violation it writes `timeline.html` beside the
history (`ChaosRun.keep` draws a valid run's when it keeps its files). Shared slots: the jail
(everyone), `<run>/barriers/` (CLIs and the keeper), the history file (everyone, append-only).
"""
from __future__ import annotations

import functools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpujail.backends import interface, kernel, shared_host
from gpujail.backends.probes import cdi_mode, compat_files, gpu_files, lookup_files, soname_files, unanswered
from gpujail.chaos import checker, nemesis, timeline
from gpujail.chaos.checkers import cells as fault_cells
from gpujail.chaos.checkers import windows as fault_windows
from gpujail.chaos.checkers.content import NOBODY_READY
from gpujail.chaos.scenario import SYSCALL, Scenario
from gpujail.contract import RestartPolicy, Worker, start_worker
from gpujail.fixtures import jail as jail_image
from gpujail.fixtures import syscall_faults
from gpujail.fixtures.drivers import DEFAULT_VERSION
from gpujail.reference_impl import core
from gpujail.world import history
from gpujail.world import schedule as schedule_plan
from gpujail.world.failpoints import Barrier, failing_hits


@dataclass
class ChaosRun:
    scenario: Scenario
    impl: str
    seed: int
    run_dir: Path
    verdict: checker.Verdict
    workers: dict[str, Worker] = field(default_factory=dict)
    timeline: Path | None = None
    kept: Path | None = None   # where keep() copied the run's files
    cells: list[str] = field(default_factory=list)   # the fault-table cells it exercised (checkers/cells.py)
    windows: dict[str, tuple[bool, str]] = field(default_factory=dict)   # declared window -> (opened, where/why not)

    def unopened(self) -> list[str]:
        """The scenario's declared fault windows this run never opened (chaos/checkers/windows.py)."""
        return [w for w, (ok, _) in self.windows.items() if not ok]

    @property
    def status(self) -> str:
        """PASS, FAIL, UNKNOWN (an invariant undecided) or INCONCLUSIVE (every invariant held, but a
        declared fault window never opened: the run proved nothing about its fault)."""
        failed, undecided = self.judge()
        return "FAIL" if failed else "UNKNOWN" if undecided else "INCONCLUSIVE" if self.unopened() else "PASS"

    @property
    def history_path(self) -> Path:
        return self.run_dir / "history.jsonl"

    def unfired(self) -> list[str]:
        """Armed faults that never acted (an implementation that never reaches that step, e.g.
        `direct` and the CLI's steps, or a marker jail and the CLI's mkdir): worth knowing when a
        run passes."""
        events = history.load(str(self.history_path))
        armed = {(e["worker"], e["failpoint"]) for e in events if e["kind"] == "chaos.fault"}
        fired = {(e["node"], e["name"]) for e in events if e["kind"] == "failpoint" and e.get("action") != "off"}
        fired |= {(e["node"], SYSCALL + e["syscall"]) for e in events if e["kind"] == "cli.syscall_fault"}
        return sorted(f"{w} {fp}" for w, fp in armed - fired)

    def judge(self) -> tuple[list[str], list[str]]:
        """The invariants that failed, and those left UNKNOWN that may not be. INV-4 needs the
        implementation to record its lock activity (the bundled ones do); for an uninstrumented one
        it stays UNKNOWN here and is checked black-box by the conformance test
        test_warm_start_takes_no_lock_and_creates_nothing. Where faults are not transient (a hostile
        jail) nobody has to become ready, so INV-1 and INV-5 may be UNKNOWN for that reason only (a
        ready worker the probes did not reach is never excused)."""
        def excused(inv: str, r: checker.InvariantResult) -> bool:
            return inv == "INV-4" or (inv in ("INV-1", "INV-5") and not self.scenario.transient_only
                                      and r.note == NOBODY_READY)
        results = self.verdict.results.items()
        return ([i for i, r in results if r.valid is False],
                [i for i, r in results if r.valid == checker.UNKNOWN and not excused(i, r)])

    def keep(self, dest: Path) -> None:
        """Copy the run's history, final state and timeline to `dest`, where they outlive the run
        directory (reports/chaos/<test>/, or a reproducer's directory). `run()` draws the timeline
        of an invalid run only; a kept valid one is drawn here (some 20 ms and 100-170 KB for 16
        workers), so that report.html links every kept run to its picture."""
        import shutil
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("history.jsonl", "final_state.json", "timeline.html", "schedule.json"):
            if (self.run_dir / name).exists():
                shutil.copy(self.run_dir / name, dest / name)
        if self.timeline is None and (dest / "history.jsonl").exists():
            self.timeline = timeline.render(history.load(str(dest / "history.jsonl")), self.verdict, dest / "timeline.html")
        self.timeline = dest / "timeline.html" if self.timeline else None
        self.kept = dest   # the report names the copies that outlive the run

    def report(self) -> str:
        where = (f"\nhistory: {(self.kept or self.run_dir) / 'history.jsonl'}"
                 + (f"\ntimeline: {self.timeline}" if self.timeline else ""))
        plan = (self.kept or self.run_dir) / "schedule.json"
        if plan.exists():   # a scheduled run (--schedule): its decisions, for replay
            sched = json.loads(plan.read_text())
            where += (f"\nschedule: {sched['strategy']}, seed {sched['seed']}, {len(sched['steps'])} steps"
                      + (f", {sched['forced']} forced (may not replay exactly)" if sched["forced"] else "")
                      + f": {plan}")
        unfired = self.unfired()
        note = f"\narmed but never acted: {', '.join(unfired)}" if unfired else ""
        opened = "".join(f"\n  window {w}: {'opened' if ok else 'NEVER OPENED'}: {why}"
                         for w, (ok, why) in self.windows.items())
        return (f"scenario {self.scenario.name} against {self.impl} (seed {self.seed}):\n"
                f"{self.verdict.summary()}{note}" + (f"\nfault windows:{opened}" if opened else "") + where)


def host_residue(*needles: str) -> tuple[list[str], list[str]]:
    """Mounts in the host's namespace, and live processes that still mention the run's paths in
    their command line or hold mounts of them in their mount namespace (a node forked by the node
    factory carries the factory's command line: its namespace gives it away)."""
    with open("/proc/self/mountinfo") as f:
        mounts = [ln.split()[4] for ln in f if any(n in ln for n in needles)]
    procs = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if int(pid) == os.getpid():
                continue
            if any(n in cmd for n in needles):
                procs.append(f"{pid}: {cmd[:120]}")
            elif os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
                with open(f"/proc/{pid}/mountinfo") as f:
                    if any(n + "/" in ln for ln in f for n in needles):
                        procs.append(f"{pid}: {cmd[:120]} (mounts of the run's paths in its namespace)")
        except OSError:
            continue
    return mounts, procs


def run(scenario: Scenario, impl: str, run_dir: Path, seed: int = 0, timeout: float | None = None,
        fleet_class: type[interface.Fleet] = kernel.Fleet, scheduled: str | None = None) -> ChaosRun:
    """`scheduled`: the --schedule (gpujail/world/schedule.py; default: the fleet class's
    `schedule` attribute, which the plugin sets from --schedule, else `free`)."""
    plan = schedule_plan.parse(scheduled or getattr(fleet_class, "schedule", "free"))
    run_dir.mkdir(parents=True, exist_ok=True)
    jail = jail_image.make_jail(run_dir / "jail")
    hist = str(run_dir / "history.jsonl")
    log = lambda kind, node="host", **f: history.append(hist, kind, node=node, **f)  # noqa: E731

    def probe(name: str, worker: Worker, files: list[dict]) -> None:
        """One probe round of a ready worker. A node that is gone or does not answer clears none of
        its files: recorded as such on its behalf, never skipped (SPEC section 6)."""
        began = time.monotonic()
        try:
            if not worker.node.alive:
                raise RuntimeError(f"node {name} is gone")
            worker.node.probe(files)
        except RuntimeError as e:
            log("probe", node=name, results=unanswered(files, f"the probe failed: {e}"), began=began)

    def cdi(w: str) -> bool:   # the probes ask a CDI-mode worker for its spec's files (SPEC section 9)
        return cdi_mode(scenario.impls.get(w, impl), impl)

    policy = RestartPolicy(max_restarts=scenario.max_restarts, backoff=0.02)
    if scenario.start_timeout is not None:   # the scenario's own deadline, never longer than the run's
        timeout = min(timeout, scenario.start_timeout) if timeout else scenario.start_timeout
    workers: dict[str, Worker] = {}
    nodes: dict[str, interface.Node] = {}
    if scenario.shared_propagation:   # every node a peer of the host's shared mount (shared_host.py)
        why = shared_host.unavailable(fleet_class)
        if why:
            raise RuntimeError(f"scenario {scenario.name} needs a shared host mount, but {why}")
        fleet_class = shared_host.on_shared_host(fleet_class)
    with fleet_class.recording(jail, run_dir, seed) as fleet:
        old = _bring_up(scenario, fleet, jail, impl, log, probe, cdi("prewarm"))
        outside = run_dir / "outside"   # a directory outside the jail that hostile links point at
        outside.mkdir(exist_ok=True)
        for link, target in scenario.hostile_links.items():
            (jail / link).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target.replace("@OUTSIDE", str(outside)), jail / link)
        before = jail_image.snapshot(jail)
        schedule = scenario.schedule(seed)
        nemesis_names = [f"ldconfig-node{i or ''}" for i in range(int(scenario.ldconfig.get("nodes", 1)))] \
            if scenario.ldconfig else []
        # every GPU node's driver version: the nodes whose ready spans the checker wants probed
        versions = {w: v for w, _, v in scenario.workers if v}
        versions.update({"prewarm": DEFAULT_VERSION} if scenario.warm else {})
        versions.update({"old": DEFAULT_VERSION} if old is not None else {})
        if scenario.ldconfig.get("view") == "gpu":
            versions.update({n: scenario.ldconfig.get("version", DEFAULT_VERSION) for n in nemesis_names})
        log("chaos.begin", scenario=scenario.name, impl=impl, impls=scenario.impls, seed=seed, schedule=schedule,
            versions=versions, windows=list(scenario.windows))
        restarts, first_env = _arm(scenario, schedule, log)
        errors: dict[str, Exception] = {}
        contract = {"GPUJAIL_LOCK_TIMEOUT": str(scenario.lock_timeout)}
        if scenario.jail_symlink:   # the jail by another name: a link beside it (the run directory is in every node)
            os.symlink(jail, run_dir / "jail-link")
            contract["GPUJAIL_JAIL"] = str(run_dir / "jail-link")

        host_versions: dict[str, str] = {}   # the workers whose host the harness upgraded: its driver now
        hosts = nemesis.UpgradedHosts(fleet, host_versions) if scenario.host_upgrades else fleet

        def go(wid: str, role: str, version: str | None) -> None:
            try:
                if wid in scenario.start_after:   # started by the harness once that barrier is released
                    Barrier(scenario.start_after[wid], str(run_dir / "barriers")).wait_released()
                workers[wid] = start_worker(
                    hosts, wid, scenario.impls.get(wid, impl), role=role, version=version, policy=policy,
                    capabilities=scenario.capabilities_of(wid),
                    env=contract,
                    first_attempt_env=first_env.get(wid),
                    attempt_env={a: {"GPUJAIL_FAILPOINTS": spec} for a, spec in restarts.get(wid, {}).items()},
                    on_node=lambda n: nodes.__setitem__(wid, n), timeout=timeout, syscall_points=plan.syscalls,
                    node_options={**({"jail_readonly": True} if scenario.read_only else {}),
                                  **({"mps": True} if scenario.mps else {}),
                                  **({"jail_mount_point": False} if not scenario.jail_mount_point else {}),
                                  "layout": scenario.layout})
            except Exception as e:   # raised once below, in the caller's thread (on an interrupt: never)
                errors[wid] = e

        done = threading.Event()   # every worker finished: the ldconfig nemesis runs once more and stops
        # The harness's own actors beside the workers (interface.Nemesis): each one thread, its
        # exception kept and raised below, once every thread is joined.
        nemeses: list[interface.ThreadNemesis] = []
        nemesis_ready: dict[str, Worker] = {}   # GPU nemeses, probed in the last round (busy before)
        if scenario.ldconfig:
            ldconfig = [interface.ThreadNemesis(n, functools.partial(
                nemesis.ldconfig_node, scenario, fleet, jail, impl, done, log, n, nemesis_ready)) for n in nemesis_names]
            nemeses += ldconfig
            for n in ldconfig:
                n.start()
            if scenario.ldconfig.get("hold_lock") and not nemesis.wait_until_held(jail / core.LDCONFIG_LOCK, ldconfig):
                done.set()
                for n in ldconfig:
                    n.stop()
                raise RuntimeError("the ldconfig nemesis never took the jail's ldconfig lock: "
                                   f"{sorted((n.name, n.error) for n in ldconfig if n.error)}")
        threads = {w: threading.Thread(target=go, args=(w, role, v), name=w) for w, role, v in scenario.workers}
        scheduler = None if plan.free else _scheduler(plan, scenario, run_dir, seed, jail, threads, nodes, log,
                                                      {w: failing_hits(spec) for w, spec in schedule.items()})
        if scheduler is not None:
            contract[schedule_plan.ENV] = scheduler.address
        for t in threads.values():
            t.start()
        jobs: list[interface.ThreadNemesis] = []   # harness jobs during the run: the probes go on while they run
        if scenario.populate_at:
            def live_populate() -> None:   # the populate-jail job re-run on a jail in use, once the barrier opens
                Barrier(scenario.populate_at, str(run_dir / "barriers")).wait_released()
                nemesis.populate_job(fleet, jail, impl, "populate-live")

            jobs.append(interface.ThreadNemesis("populate-live", live_populate))
            jobs[-1].start()
        def files_for(version: str, w: str) -> list[dict]:
            args = (jail, version, scenario.capabilities_of(w), scenario.layout, cdi(w))
            return (gpu_files(*args) + (soname_files(*args) if scenario.probe_sonames else [])
                    + (lookup_files(*args) if scenario.probe_lookups else []))

        probes = {w: files_for(v, w) for w, _, v in scenario.workers if v}
        if old is not None:
            workers["old"] = old
            probes["old"] = gpu_files(jail, DEFAULT_VERSION, scenario.capabilities)

        def upgrade(w: str, up) -> None:
            """The host of `w` upgraded under its start (nemesis.upgrade_host): from now on the
            probes expect its new driver, and its restarts get it (host_versions, read by go's fleet)."""
            try:
                nemesis.upgrade_host(nodes[w], w, up, host_versions.get(w, versions[w]), scenario.layout, log)
            except Exception as e:   # raised below, in the caller's thread; the run goes on without it
                errors[f"{w} (host upgrade)"] = e
                return
            host_versions[w] = up.version
            probes[w] = files_for(up.version, w)

        planted: list[str] = []   # jail paths the harness swapped in during the run (not the workers' doing)
        keeper = interface.ThreadNemesis("the barrier keeper", functools.partial(
            nemesis.keep_barriers, scenario, run_dir, threads, nodes, log, jail, planted, upgrade,
            getattr(fleet, "net_faults", ())))
        keeper.start()

        with_compat: set[str] = set()

        def probe_ready() -> None:
            for w, worker in list(workers.items()):
                if worker.ready and w in probes:
                    if scenario.cuda_image and w not in with_compat:   # what its CLI mounted from the image
                        with_compat.add(w)
                        probes[w] = probes[w] + compat_files(jail, w, history.load(hist))
                    probe(w, worker, probes[w])

        try:
            while any(t.is_alive() for t in [*threads.values(), *jobs]):
                probe_ready()
                time.sleep(scenario.probe_interval)
        finally:
            done.set()
            if scheduler is not None:
                try:
                    scheduler.stop()
                except RuntimeError as e:   # raised below with the workers' errors, once every thread is joined
                    errors["scheduler"] = e
                (run_dir / "schedule.json").write_text(json.dumps(scheduler.record()))
        for n in [keeper, *jobs, *nemeses]:
            n.stop()
            if n.error is not None:
                errors[n.name] = n.error
        if errors:
            wid, e = sorted(errors.items())[0]
            what = f"worker {wid} could not be started" if wid in threads or wid in nemesis_names else f"{wid} failed"
            raise RuntimeError(f"{what}: {e}") from e
        probe_ready()
        for name, worker in nemesis_ready.items():   # idle now: their ready spans get their evidence
            probe(name, worker, files_for(versions[name], name))
        log("chaos.end")
        after = jail_image.snapshot(jail)
    final_state = {"jail": str(jail), "transient_only": scenario.transient_only, "max_restarts": scenario.max_restarts,
                   "jail_before": before, "jail_after": after, "planted": planted, "temp_dirs": [],
                   "outside_changes": sorted(str(p) for p in outside.rglob("*"))}
    return _judge(ChaosRun(scenario, impl, seed, run_dir, None, workers), fleet, final_state)


def _judge(result: ChaosRun, fleet, final_state: dict) -> ChaosRun:
    """After the fleet is gone (step 5): what it left on the host (mounts, processes, containers),
    the final state written beside the history, and the checker's verdict, its fault windows and
    the cells of the fault table it exercised; a violation's timeline drawn."""
    mounts, procs = host_residue(final_state["jail"], str(result.run_dir / "barriers"))
    mounts += [f"{p} (through the shared mount)" for p in getattr(fleet, "host_mounts", [])]
    procs += [f"container {name}" for name in fleet.leftovers()]
    final_state.update(host_mounts=mounts, processes=procs)
    (result.run_dir / "final_state.json").write_text(json.dumps(final_state, default=list))
    events = history.load(str(result.history_path))
    result.verdict = checker.check(events, final_state)
    run_view = checker.Run(events, final_state)
    result.windows = {w: fault_windows.opened(w, run_view) for w in result.scenario.windows}
    result.cells = fault_cells.exercised(run_view)
    if result.verdict.valid is not True:
        result.timeline = timeline.render(events, result.verdict, result.run_dir / "timeline.html")
    return result


def _bring_up(scenario: Scenario, fleet, jail: Path, impl: str, log, probe, prewarm_cdi: bool) -> Worker | None:
    """The jail as the scenario has it before its workers start (step 1): dressed as a reused jail,
    warmed by one worker (then killed, which ends its ready span), cleaned by the populate-jail job,
    brought up before the fix by a legacy worker (returned: its 0-byte placeholders and its live
    mounts on them stay for the whole run, REF-3), a CUDA image planted."""
    if scenario.reused_jail:
        nemesis.dress_as_reused(jail)
    if scenario.warm:
        warm = start_worker(fleet, "prewarm", impl, capabilities=scenario.capabilities,
                            node_options={"layout": scenario.layout})
        if not warm.ready:
            raise RuntimeError(f"warming the jail failed: {warm.attempts[-1].error_line}")
        files = gpu_files(jail, DEFAULT_VERSION, scenario.capabilities, scenario.layout, prewarm_cdi)
        probe("prewarm", warm, files)   # its ready span is judged like any other: it needs evidence
        log("chaos.kill", worker="prewarm", barrier="")   # ends its ready span; no barrier: no fault
        warm.node.kill()
    if scenario.populate_cleanup:
        nemesis.populate_job(fleet, jail, impl)
    old = None
    if scenario.upgraded_jail:
        old = start_worker(fleet, "old", "legacy", capabilities=scenario.capabilities)
        if not old.ready:
            raise RuntimeError(f"bringing the jail up with legacy failed: {old.attempts[-1].error_line}")
    if scenario.cuda_image:
        jail_image.plant_cuda_image(jail)
    return old


def _arm(scenario: Scenario, schedule: dict[str, str], log) -> tuple[dict, dict]:
    """The faults each worker's own starts carry (step 2), each `NAME=TERM` recorded as one
    chaos.fault event: its first start's failpoint terms (`schedule`) and syscall faults (its CLI
    under strace --inject, fixtures/syscall_faults.py), and its restarts' failpoint terms. Returns
    the restarts' terms by worker and attempt, and each worker's first-start environment."""
    def armed(w: str, spec: str, prefix: str = "", **fields) -> None:
        for entry in spec.split(";"):
            failpoint, _, term = entry.partition("=")
            log("chaos.fault", worker=w, failpoint=prefix + failpoint, term=term, **fields)

    for w, spec in schedule.items():
        armed(w, spec)
    restarts = scenario.restart_schedule()
    for w, by_attempt in restarts.items():
        for attempt, spec in by_attempt.items():
            armed(w, spec, start=attempt + 1)
    syscalls = scenario.syscall_schedule()
    if syscalls and syscall_faults.unavailable():
        raise RuntimeError(f"scenario {scenario.name} injects syscall faults, but {syscall_faults.unavailable()}")
    for w, spec in syscalls.items():
        armed(w, spec, SYSCALL)
    first_env = {w: {"GPUJAIL_FAILPOINTS": spec} for w, spec in schedule.items()}
    for w, spec in syscalls.items():
        first_env.setdefault(w, {})[syscall_faults.ENV] = spec
    return restarts, first_env


def steps_estimate(scenario: Scenario) -> int:
    """PCT's k: the scheduling points a run of `scenario` reaches, about: each GPU worker's start
    passes some 4 failpoints per file it mounts (the fake CLI's create, mount, remount; the
    markers), about half the driver's files for the usual capabilities, plus a dozen once-per-start
    ones; a CPU worker or login node a dozen (measured: 265 to 268 steps for legacy's cold start of
    2 workers, 268 estimated). Deterministic, so a seed replays the same change points."""
    from gpujail.fixtures import drivers
    per_gpu = {v: 2 * len(drivers.catalogue(v, scenario.layout)) + 12 for _, _, v in scenario.workers if v}
    return sum(per_gpu[v] if v else 12 for _, _, v in scenario.workers)


def _scheduler(plan, scenario: Scenario, run_dir: Path, seed: int, jail: Path, threads: dict, nodes: dict, log,
               faults: dict[str, dict[str, int]]):
    """The run's scheduler (gpujail/world/schedule.py) over the scenario's workers, started; `faults`:
    where each worker's armed faults act (failpoints.failing_hits of its first start's spec)."""
    def node_of(w: str) -> int | None:
        """None: not live (finished, or waiting to be started at a barrier); 0: being (re)started;
        else its node's PID 1."""
        if threads[w].ident is None:   # its thread starts right after the scheduler
            return 0
        if not threads[w].is_alive():
            return None
        node = nodes.get(w)
        if node is None:
            after = scenario.start_after.get(w)
            if after and not os.path.exists(run_dir / "barriers" / f"{after}.release"):
                return None
            return 0
        return node.pid1 if node.alive and node.pid1 else 0

    return schedule_plan.Scheduler(run_dir, plan, seed, [w for w, _, _ in scenario.workers], steps_estimate(scenario),
                                   node_of, log=log, relative_to=str(jail), faults=faults).start()
