"""Benchmarks: every performance figure side by side, as one table (and JSON), with the machine and the
date. Benchmarks measure and print; they never assert a time.

    gpujail bench [--quick] [--only NAME ...] [--json reports/benchmarks.json]

(`python -m gpujail.benchmarks.run` is the same command.) The latest figures, and how to read
them, are in docs/benchmarks.md.

How this works
--------------
Each figure is one function below, listed in `FIGURES`. It returns table rows: what was measured
(median of repeated runs), and the comparison measured *in the same run* with the ratio, since
absolute times drift on shared machines. `--quick` repeats less (a smoke run, also in the self-tests).

  seed-bug     legacy reproducing the seed bug, deterministic and randomised, 2 and 8 workers;
               reference on the same seeds
  real-reports each scenario from real reports (upgraded-jail, mixed-drivers, cuda-image,
               ldcache-rewrite, ldconfig-blind-winner), deterministic, against legacy and its
               matching mutant: caught n/20, median time to the first violation
  cdi          the CDI scenarios against cdi-naive (caught n/20, median time to the first violation)
               and cdi on the same seeds
  windows      per scenario, the fraction of seeded-random runs that open its fault windows (the
               128-worker scale scenario twice, skipped with --quick)
  starts       worker starts/s, reference, direct, example-shell, warm and cold jail, 1/16/128 workers
  paths        reference's warm path in-process vs as a process; direct vs reference start to ready;
               the cold path with 16 contending workers (last lock wait, markers created once)
  docker       container worker starts/s against process workers (when an engine runs)
  model        model backend: steps/s, time to find and shrink the legacy bug, interleavings explored
  suites       the default self-test run (from a checkout only: tests/ is not installed) and the
               default chaos set under pytest -n auto
  memory       peak memory of a 128-worker run (harness and every node process)
  qualify      `gpujail qualify` wall time (two processes, start to both exits) per jail filesystem:
               local, gluster, nodelocal-locks (one client per side), against local
  launchers    node agents (gpujail/launchers/): starts/s through the local launcher and srun, time
               from `gpujail run --launcher X` to cold-race's verdict, clock uncertainty at rendezvous
  jail-fs      legacy on cold-race with the jail on GlusterFS against local: caught n/20, median time
               to the first violation; reference starts/s, 16 workers, GlusterFS against local
  cli-startup  one fake CLI start in a node, forked by a bundled implementation, served and standalone,
               against `true`, `python3 -c pass`,
               `python3 -S -c pass` (wall, machine CPU)
  start-parts  where one warm reference start's time goes (node up, implementation start-up, each
               CLI run, the node's own work); 16 workers with the warm paths against without,
               starts/s and machine CPU
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import gpujail.chaos
from gpujail.chaos import runner, scenario
from gpujail.fixtures.jail import make_jail
from gpujail.reference_impl.core import LOCK

import gpujail
from gpujail.backends import kernel
from gpujail.contract import start_worker
from gpujail.spec import EXIT
from gpujail.world import history

# The suites' folder (holding chaos/: a checkout's root or site-packages/gpujail), and the checkout
# when this gpujail runs from one (the self-tests are not installed).
SUITES_HOME = Path(gpujail.chaos.__file__).resolve().parent.parent
CHECKOUT = gpujail.ROOT if (gpujail.ROOT / "pyproject.toml").is_file() and (gpujail.ROOT / "tests").is_dir() else None


@dataclasses.dataclass
class Row:
    figure: str
    value: str
    comparison: str = ""
    ratio: float | None = None


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


# -- seed bug ---------------------------------------------------------------------------------------

def seed_bug(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    runs = 3 if quick else 20
    rows, raw = [], {}
    for name in ("cold-race", "cold-race-random"):
        for workers in (2, 8):
            sc = dataclasses.replace(scenario.load(name), gpu_workers=workers)
            result = {}
            for impl in ("legacy", "reference"):
                times, broken = [], 0
                for seed in range(runs):
                    t = _first_violation_s(runner.run(sc, impl, tmp / f"{name}-{workers}-{impl}-{seed}", seed=seed))
                    if t is not None:
                        broken += 1
                        times.append(t)
                result[impl] = {"runs": runs, "violations": broken, "median_s_to_violation": median(times)}
            raw[f"{name}/{workers}"] = result
            lg = result["legacy"]
            when = f", median {lg['median_s_to_violation']:.2f} s to the first lost file" if lg["violations"] else ""
            rows.append(Row(f"seed bug, legacy, {name}, {workers} workers", f"{lg['violations']}/{runs}{when}",
                            f"reference {result['reference']['violations']}/{runs}"))
    return rows, raw


# -- real-report scenarios (issue 17) ------------------------------------------------------------

# Each new scenario, and the implementations that lack what it checks: legacy and the matching mutant.
REAL_REPORTS = {"upgraded-jail": "mutant:zero-byte-counts-present", "mixed-drivers": "mutant:soname-links",
                "cuda-image": "mutant:compat-mount", "ldcache-rewrite": "mutant:soname-links",
                "ldconfig-blind-winner": "mutant:ldconfig-winner-only"}


def _first_violation_s(r) -> float | None:
    """Seconds from the run's start to its first violation, None when the run found none. A violation
    of the final state (INV-3's jail hygiene, INV-6's residue) has no event: it counts at the run's end."""
    if r.verdict.valid is not False:
        return None
    events = history.load(str(r.history_path))
    begin = next(e["t"] for e in events if e["kind"] == "chaos.begin")
    event = r.verdict.first_violation or next((e for e in reversed(events) if e["kind"] == "chaos.end"), events[-1])
    return event["t"] - begin


def _caught(tmp: Path, name: str, impl: str, runs: int) -> tuple[list[float], int]:
    """Scenario `name`, deterministic form, against `impl` on seeds 0..runs-1: the times from each
    run's start to its first violation (one per run that caught it), and the runs that could not start."""
    sc = scenario.load(name)
    times, errors = [], 0
    for seed in range(runs):
        try:   # a node that cannot be set up (the host changed under it) is counted, not fatal
            t = _first_violation_s(runner.run(sc, impl, tmp / f"{name}-{impl}-{seed}".replace(":", "_"), seed=seed))
        except RuntimeError:
            errors += 1
            continue
        if t is not None:
            times.append(t)
    return times, errors


def _caught_row(raw: dict, name: str, impl: str, runs: int, times: list[float], errors: int, comparison: str = "") -> Row:
    raw[f"{name}/{impl}"] = {"runs": runs, "caught": len(times), "errors": errors, "median_s_to_violation": median(times)}
    when = f", median {median(times):.2f} s to the first violation" if times else ""
    return Row(f"{name}, deterministic, {impl}", f"caught {len(times)}/{runs - errors}{when}",
               "; ".join(filter(None, [comparison, f"{errors} runs could not start" if errors else ""])))


def real_reports(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Each real-report scenario, deterministic form, against legacy and its matching mutant: how
    many runs catch it (a violation) and the median time from the run's start to the first one."""
    runs = 3 if quick else 20
    rows, raw = [], {}
    for name, mutant in REAL_REPORTS.items():
        for impl in ("legacy", mutant):
            rows.append(_caught_row(raw, name, impl, runs, *_caught(tmp, name, impl, runs)))
    return rows, raw


# The CDI path's scenarios (issue 27, SPEC section 9): a runtime applying the spec (cdi-naive) against the
# fixed procedure on the CDI file set (cdi).
CDI_SCENARIOS = ("cdi-half-migrated", "cdi-two-drivers", "cdi-first-starts", "cdi-ref12-fleet")


def cdi(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Each CDI scenario, deterministic form, against cdi-naive: caught n/20 and the median time from
    the run's start to the first violation; cdi on the same seeds."""
    runs = 3 if quick else 20
    rows, raw = [], {}
    for name in CDI_SCENARIOS:
        fixed, fixed_errors = _caught(tmp, name, "cdi", runs)
        raw[f"{name}/cdi"] = {"runs": runs, "caught": len(fixed), "errors": fixed_errors}
        rows.append(_caught_row(raw, name, "cdi-naive", runs, *_caught(tmp, name, "cdi-naive", runs),
                                comparison=f"cdi {len(fixed)}/{runs - fixed_errors}"))
    return rows, raw


def windows(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Per scenario, the fraction of seeded-random runs against reference that open every fault
    window the scenario declares: a random run that opens none proves nothing (it is
    INCONCLUSIVE), so this is what a random run is worth (aim: above one half). The opt-in scale
    scenario (128 workers) runs twice, and not at all with --quick."""
    rows, raw = [], {}
    for name in scenario.names():
        sc = scenario.load(name)
        if not sc.windows or (sc.scale and quick):
            continue
        runs = 2 if quick or sc.scale else 10
        sc = sc.randomised()
        opened = {w: 0 for w in sc.windows}
        done = every = 0
        for seed in range(runs):
            try:
                r = runner.run(sc, "reference", tmp / f"{name}-{seed}", seed=1000 + seed)
            except RuntimeError:
                continue
            done += 1
            every += not r.unopened()
            for w, (ok, _) in r.windows.items():
                opened[w] += ok
        raw[name] = {"runs": done, "opened": opened, "every_window": every}
        rows.append(Row(f"windows opened, {name} (random, reference)", f"{every}/{done} runs opened every window",
                        ", ".join(f"{w} {n}/{done}" for w, n in opened.items()) if len(opened) > 1 else ""))
    return rows, raw


# -- starts per second ---------------------------------------------------------------------------------

def start_many(fleet, impl: str, workers: int, prefix: str) -> tuple[int, float]:
    """Start `workers` workers at once; (how many became ready, wall seconds)."""
    results = {}
    t0 = time.monotonic()
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, start_worker(fleet, f"{prefix}{i}", impl)))
               for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(w.ready for w in results.values()), time.monotonic() - t0


def start_steadily(fleet, impl: str, workers: int, seconds: float) -> tuple[int, float]:
    """`workers` workers each started again as soon as the last start ended (its node killed, as a
    restarted container's old one goes), for `seconds`: (how many starts became ready, wall seconds).
    The steady rate, without the ramp of a batch started at once."""
    ready = [0] * workers
    t0 = time.monotonic()

    def worker(i: int) -> None:
        k = 0
        while time.monotonic() - t0 < seconds:
            w = start_worker(fleet, f"s{i}-{k}", impl)
            ready[i] += w.ready
            if w.node is not None:
                w.node.kill()
            k += 1
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(ready), time.monotonic() - t0


def starts(tmp: Path, quick: bool, fleet_class=kernel.Fleet, impls=("reference", "direct", "example-shell"),
           sizes=(1, 16, 128)) -> tuple[list[Row], dict]:
    """Starts per second: `n` workers started at once, each on its own node, median over repeats
    (a fresh jail each time, prewarmed by one worker for the warm figures)."""
    rows, raw = [], {}
    sizes = sizes[:2] if quick else sizes
    for warm in (True, False):
        for n in sizes:
            rate = {}
            for impl in impls:
                rates = []
                for rep in range(1 if quick else {1: 7, 16: 3}.get(n, 1)):
                    jail = make_jail(tmp / f"jail-{impl}-{warm}-{n}-{rep}")
                    with fleet_class(jail, {}) as fleet:
                        if warm:
                            assert start_worker(fleet, "prewarm", impl).ready
                        ready, wall = start_many(fleet, impl, n, "w")
                    rates.append(ready / wall)
                rate[impl] = median(rates)
                raw[f"{impl}/{'warm' if warm else 'cold'}/{n}"] = {"workers": n, "starts_per_s": [round(r, 2) for r in rates]}
            for impl in impls:
                rows.append(Row(f"starts/s, {impl}, {'warm' if warm else 'cold'}, {n} worker{'s' * (n > 1)}",
                                f"{rate[impl]:.1f}/s", "" if impl == "reference" else f"reference {rate['reference']:.1f}/s",
                                None if impl == "reference" else ratio(rate[impl], rate["reference"])))
    return rows, raw


# -- the paths: warm, direct vs reference, cold with contention -----------------------------------------

def paths(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    n = 5 if quick else 30
    jail = make_jail(tmp / "jail")
    with kernel.Fleet.recording(jail, tmp / "run") as fleet:
        first = start_worker(fleet, "prewarm", "reference")
        assert first.ready, first.attempts[-1].stderr
        listing = tmp / "list.txt"
        listing.write_text(first.node.cli("list").stdout)
        r = first.node.run([sys.executable, "-m", "gpujail.benchmarks.warm_path", str(listing), str(n * 10)],
                           env=first.node.contract_env())
        inproc = json.loads(r.stdout)
        process = {}
        for impl in ("reference", "direct", "example-shell"):
            times = []
            for i in range(n):
                w = start_worker(fleet, f"{impl}-{i}", impl)
                assert w.ready, w.attempts[-1].stderr
                times.append(w.attempts[-1].duration)
                w.node.kill()
            process[impl] = median(times)
    warm_in = median(inproc["times"])
    rows = [Row(f"reference warm path in-process ({inproc['files']} files, no lock)", ms(warm_in),
                f"as a process {ms(process['reference'])}", ratio(warm_in, process["reference"])),
            Row("direct, start to ready, warm jail", ms(process["direct"]), f"reference {ms(process['reference'])}",
                ratio(process["direct"], process["reference"])),
            Row("example-shell, start to ready, warm jail", ms(process["example-shell"]),
                f"reference {ms(process['reference'])}", ratio(process["example-shell"], process["reference"]))]
    cold, raw_cold = cold_contention(tmp / "cold")
    return rows + cold, {"warm_inprocess_s": warm_in, "start_to_ready_s": process, "cold_16": raw_cold}


def cold_contention(tmp: Path, workers: int = 16) -> tuple[list[Row], dict]:
    """16 reference workers on a cold jail: the last one's wait for the placeholder lock, against
    the median wait, and the markers created (each file once: equal to the missing count)."""
    jail = make_jail(tmp / "jail")
    with kernel.Fleet.recording(jail, tmp / "run") as fleet:
        ready, wall = start_many(fleet, "reference", workers, "c")
        events = fleet.history()
    waits = [e["waited"] for e in history.select(events, "impl.lock.acquired", lock=LOCK)]
    markers = history.select(events, "impl.marker")
    missing = max((e["missing"] for e in history.select(events, "impl.placeholders")), default=0)
    raw = {"ready": ready, "wall_s": round(wall, 2), "lock_waits_s": sorted(waits), "markers": len(markers),
           "distinct_markers": len({e["path"] for e in markers}), "missing_at_start": missing}
    return [Row(f"cold path, {workers} workers: last lock wait", ms(max(waits, default=0.0)),
                f"median wait {ms(median(waits))}", ratio(max(waits, default=0.0), median(waits))),
            Row(f"cold path, {workers} workers: markers created", f"{len(markers)} ({raw['distinct_markers']} distinct)",
                f"files missing at start {missing}", ratio(len(markers), missing))], raw


# -- docker, model, suites, memory --------------------------------------------------------------------

def docker(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Containers (docker backend) against processes (kernel backend), same jail recipe, same
    implementation, one run: one warm start at a time (node included), and 16 started at once."""
    from gpujail.backends import docker_backend
    reason = docker_backend.precondition()
    if reason:
        return [Row("container worker starts", f"not measured: {reason}")], {}
    single, parallel = {}, {}
    for name, fleet_class in (("process", kernel.Fleet), ("container", docker_backend.Fleet)):
        with fleet_class(make_jail(tmp / f"jail-{name}"), {}) as fleet:
            assert start_worker(fleet, "prewarm", "reference").ready
            times = []
            for i in range(3 if quick else 10):
                t = time.monotonic()
                w = start_worker(fleet, f"s{i}", "reference")
                times.append(time.monotonic() - t)
                assert w.ready, w.attempts[-1].stderr
                w.node.kill()
            single[name] = median(times)
            ready, wall = start_many(fleet, "reference", 16, "p")
            parallel[name] = ready / wall
    return [Row("one warm worker start, container (node included)", ms(single["container"]),
                f"process {ms(single['process'])}", ratio(single["container"], single["process"])),
            Row("starts/s, 16 containers at once, warm", f"{parallel['container']:.1f}/s",
                f"processes {parallel['process']:.1f}/s", ratio(parallel["container"], parallel["process"]))], \
        {"single_start_s": single, "starts_per_s_16": parallel}


def model(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    from gpujail.benchmarks import model as m
    raw = m.bench(quick)
    s, f, i = raw["steps"], raw["legacy_find_shrink"], raw["interleavings_2x3"]
    return [Row("model steps/s, 8 workers, full driver, one after the other", f"{s['sequential']['median_steps_per_s']:,}/s",
                f"switching every 3 steps {s['switch-every-3']['median_steps_per_s']:,}/s", s["switching_cost_ratio"]),
            Row(f"model: find and shrink the legacy bug ({f['seeds']} seeds)", f"median {f['median_s']} s, max {f['max_s']} s",
                f"plan size <= {f['plan_size_max']}, trace {f['trace_lines_median']} lines"),
            Row(f"model: distinct interleavings, 2 workers, 3 files, {i['examples']} examples", f"{i['distinct']}",
                f"of {i['total']}")], raw


def suites(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    raw, rows = {}, []
    for name, figure, home in (("self-tests", "self-tests", CHECKOUT), ("chaos", "default chaos set", SUITES_HOME)):
        if home is None:
            rows.append(Row(f"{figure}, pytest -n auto", "not measured: the self-tests run from a checkout only"))
            continue
        t = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider",
                            "tests" if name == "self-tests" else "chaos"], cwd=home, capture_output=True, text=True)
        raw[name] = {"wall_s": round(time.monotonic() - t, 1), "result": (p.stdout.strip().splitlines() or [""])[-1]}
        rows.append(Row(f"{figure}, pytest -n auto", f"{raw[name]['wall_s']} s", raw[name]["result"]))
    return rows, raw


def memory(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Peak memory (PSS) of a 128-worker chaos run: the harness and every process below it (nodes,
    implementations, CLIs), sampled every 100 ms."""
    sc = scenario.load("scale-128")
    if quick:
        sc = dataclasses.replace(sc, gpu_workers=16, faults=type(sc.faults)())
    peak, stop = [0, 0], threading.Event()

    def sample():
        while not stop.wait(0.1):
            rss, procs = tree_pss(os.getpid())
            if rss > peak[0]:
                peak[:] = [rss, procs]
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = runner.run(sc, "reference", tmp / "run", seed=0, timeout=600)
    finally:
        stop.set()
        sampler.join()
    workers = sc.gpu_workers
    raw = {"workers": workers, "peak_pss_mib": round(peak[0] / 2**20, 1), "processes_at_peak": peak[1],
           "valid": r.verdict.valid}
    return [Row(f"peak memory (PSS), {workers}-worker chaos run", f"{raw['peak_pss_mib']} MiB ({peak[1]} processes)",
                f"per worker {raw['peak_pss_mib'] / workers:.1f} MiB")], raw


def tree_pss(root: int) -> tuple[int, int]:
    """Proportional set size (shared pages split between their users, so the sum is real memory)
    of `root` and all its descendants, from /proc; and how many processes."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except OSError:
                continue
    total, count, todo = 0, 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
            count += 1
        except (OSError, StopIteration):
            continue
    return total, count


def qualify(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """`gpujail qualify` run by two processes, each through its own client of the jail filesystem
    (gpujail/backends/jailfs.py): wall time from both starting to both exiting, and the exit code."""
    from gpujail.backends import jailfs
    walls: dict[str, list[float]] = {}
    codes: dict[str, set[int]] = {}
    rows = []
    for kind in jailfs.KINDS:
        reason = jailfs.unavailable(kind)
        if reason:
            rows.append(Row(f"qualify wall time, {kind}", f"not measured: {reason}"))
            continue
        with jailfs.provide(kind, tmp / kind, nodes=["n1", "n2"]) as fs:
            for _ in range(1 if quick else 3):
                t = time.monotonic()
                procs = [subprocess.Popen(([] if kind == "local" else ["nsenter", f"--mount={fs.node_options(n)['mount_ns']}"])
                                          + [sys.executable, "-m", "gpujail", "qualify", str(fs.jail), "--timeout", "60"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in ("n1", "n2")]
                codes.setdefault(kind, set()).update(p.wait(timeout=300) for p in procs)
                walls.setdefault(kind, []).append(time.monotonic() - t)
        base = median(walls.get("local", []))
        rows.append(Row(f"qualify wall time, {kind} (exit {'/'.join(map(str, sorted(codes[kind])))})",
                        ms(median(walls[kind])), "" if kind == "local" else f"local {ms(base)}",
                        None if kind == "local" else ratio(median(walls[kind]), base)))
    return rows, {"wall_s": walls, "exit_codes": {k: sorted(v) for k, v in codes.items()}}


# -- launchers: node agents started locally and through srun (issue 19) ----------------------------------

def launchers(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """The same work through node agents (gpujail/launchers/): worker starts/s with 16 workers on a
    warm jail, the kernel backend's own nodes against agents of the local launcher against agents
    of one srun step (when a Slurm cluster answers: scripts/slurm-cluster.sh); the time from
    `gpujail run --launcher X` to the verdict of cold-race; the clock-offset uncertainty measured at
    the agents' rendezvous."""
    from gpujail import launchers as launching
    names = ["local"] + (["slurm"] if not launching.unavailable("slurm") else [])
    classes = {"none": kernel.Fleet, **{n: launching.fleet_class(n, agents=16, nodes="1") for n in names}}
    rows, raw = [], {}
    rates, ups, clocks, cpus, steadies = ({name: [] for name in classes} for _ in range(5))
    for rep in range(1 if quick else 5):
        for name, cls in classes.items():   # in turns: a machine whose speed drifts slows all alike
            jail = make_jail(tmp / f"jail-{name}-{rep}")
            t0 = time.monotonic()
            with cls.recording(jail, tmp / f"run-{name}-{rep}") as fleet:
                ups[name].append(time.monotonic() - t0)
                assert start_worker(fleet, "prewarm", "reference").ready
                quiet()
                c0 = machine_cpu()
                ready, wall = start_many(fleet, "reference", 16, "w")
                cpus[name].append((machine_cpu() - c0) / 16)
                rates[name].append(ready / wall)
                clocks[name] += [a.clock["uncertainty"] for a in getattr(fleet, "agents", [])]
                done, took = start_steadily(fleet, "reference", 16, 1.0 if quick else 5.0)
                steadies[name].append(done / took)
    rate, up, cpu, steady = ({k: median(v) for k, v in d.items()} for d in (rates, ups, cpus, steadies))
    for name in classes:
        raw[f"starts/{name}"] = {"starts_per_s": [round(r, 2) for r in rates[name]],
                                 "steady_starts_per_s": [round(r, 2) for r in steadies[name]],
                                 "cpu_per_start_s": [round(c, 4) for c in cpus[name]],
                                 "fleet_up_s": [round(u, 3) for u in ups[name]], "clock_uncertainty_s": clocks[name]}
    for name in names:
        base = "none" if name == "local" else "local"
        rows.append(Row(f"starts/s, reference, warm, 16 workers, {name} launcher",
                        f"{rate[name]:.1f}/s ({min(rates[name]):.1f}-{max(rates[name]):.1f})",
                        f"{'kernel backend (no agents)' if base == 'none' else 'local launcher'} {rate[base]:.1f}/s",
                        ratio(rate[name], rate[base])))
        rows.append(Row(f"starts/s, reference, warm, 16 workers each restarted at once for 5 s, {name} launcher",
                        f"{steady[name]:.1f}/s", f"{'kernel backend' if base == 'none' else 'local launcher'} "
                        f"{steady[base]:.1f}/s", ratio(steady[name], steady[base])))
        rows.append(Row(f"machine CPU per start, 16 workers, {name} launcher", ms(cpu[name]),
                        f"{'kernel backend' if base == 'none' else 'local launcher'} {ms(cpu[base])}",
                        ratio(cpu[name], cpu[base])))
        rows.append(Row(f"16 agents up and met (rendezvous), {name} launcher", ms(up[name])))
        rows.append(Row(f"clock-offset uncertainty at rendezvous, {name} launcher, 16 agents",
                        f"max {ms(max(clocks[name]))}", f"median {ms(median(clocks[name]))}"))
    if "slurm" not in names:
        rows.append(Row("slurm launcher", f"not measured: {launching.unavailable('slurm')}"))
    verdict = {}
    command = [sys.executable, "-m", "gpujail", "run", "--impl", "reference", "-n", "1", "--reports", str(tmp / "reports"),
               "chaos", "-k", "test_scenario and cold-race and not random"]
    subprocess.run(command, capture_output=True, timeout=900)   # untimed: the once-per-host self-checks
    for name in ["none", *names]:
        times = []
        for _ in range(1 if quick else 3):
            t0 = time.monotonic()
            r = subprocess.run(command + ([] if name == "none" else ["--launcher", name, "--nodes", "1"]),
                               capture_output=True, text=True, timeout=900)
            times.append(time.monotonic() - t0)
            if r.returncode != EXIT["passed"]:
                raise RuntimeError(f"gpujail run --launcher {name}: exit {r.returncode}: {r.stdout[-1500:]} {r.stderr[-1500:]}")
        verdict[name] = median(times)
        raw[f"verdict/{name}"] = {"seconds": [round(x, 2) for x in times]}
    for name in names:
        base = "none" if name == "local" else "local"
        rows.append(Row(f"gpujail run --launcher {name} to the verdict of cold-race (8 workers, reference)",
                        f"{verdict[name]:.1f} s", f"{'no launcher' if base == 'none' else 'local'} {verdict[base]:.1f} s",
                        ratio(verdict[name], verdict[base])))
    return rows, raw




# -- the jail on GlusterFS (issue 18) ---------------------------------------------------------------

def jail_fs(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """`legacy` on cold-race (deterministic) with the jail on GlusterFS, one FUSE client per node
    (gpujail/backends/jailfs.py), against a local directory: caught n/20 and the median time from
    the run's start to the first violation; then worker starts/s, reference, 16 workers at once on
    a warm jail, GlusterFS against local (median of 3)."""
    from gpujail.backends import jailfs
    reason = jailfs.unavailable("gluster")
    if reason:
        return [Row("jail on GlusterFS", f"not measured: {reason}")], {"unavailable": reason}
    runs, reps = (3, 1) if quick else (20, 3)
    rows, raw = [], {}
    sc = scenario.load("cold-race")
    caught = {}
    for kind in ("gluster", "local"):
        fleet_class = jailfs.fleet_class(kernel.Fleet, kind)
        times = []
        for seed in range(runs):
            t = _first_violation_s(runner.run(sc, "legacy", tmp / f"cold-race-{kind}-{seed}", seed=seed,
                                              fleet_class=fleet_class))
            if t is not None:
                times.append(t)
        caught[kind] = times
        raw[f"cold-race/legacy/{kind}"] = {"runs": runs, "caught": len(times), "median_s_to_violation": median(times)}
    g, loc = caught["gluster"], caught["local"]
    rows.append(Row("cold-race, deterministic, legacy, jail on GlusterFS",
                    f"caught {len(g)}/{runs}" + (f", median {median(g):.2f} s to the first violation" if g else ""),
                    f"local: caught {len(loc)}/{runs}" + (f", median {median(loc):.2f} s" if loc else ""),
                    ratio(median(g), median(loc)) if g and loc else None))
    rate = {}
    for kind in ("gluster", "local"):
        rates = []
        for rep in range(reps):
            run_dir = tmp / f"starts-{kind}-{rep}"
            jail = make_jail(run_dir / "jail")
            with jailfs.fleet_class(kernel.Fleet, kind).recording(jail, run_dir) as fleet:
                assert start_worker(fleet, "prewarm", "reference").ready
                ready, wall = start_many(fleet, "reference", 16, "w")
            rates.append(ready / wall)
        rate[kind] = median(rates)
        raw[f"starts/reference/warm/16/{kind}"] = {"starts_per_s": [round(r, 2) for r in rates]}
    rows.append(Row("starts/s, reference, warm, 16 workers, jail on GlusterFS", f"{rate['gluster']:.1f}/s",
                    f"local {rate['local']:.1f}/s", ratio(rate["gluster"], rate["local"])))
    return rows, raw




# -- where one start's time goes, and the fake CLI's own start-up (issue 19) -----------------------------

def quiet(limit: float = 5.0) -> None:
    """Wait (up to `limit` seconds) until the machine is idle: what the last fleet left to end (its
    nodes' namespaces torn down, its agents exiting) must not fall into the next measurement."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        c0 = machine_cpu()
        time.sleep(0.1)
        if machine_cpu() - c0 < 0.01:   # under 5% of 2 cores
            return


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy (/proc/stat: every process, the kernel's work
    included). A warm node is forked by a long-lived factory and the fake CLI by the node's PID 1,
    so no one parent's children's times hold a start's CPU; on an otherwise idle machine this does."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")   # all but idle and iowait


FORKED_LOOP = """
import sys
from gpujail.backends import warm
from gpujail.world import sysops
sysops.run_without_exec = warm.run_cli_forked
for _ in range(int(sys.argv[1])):
    assert sysops.RealSys().run(["nvidia-container-cli", "--version"])[0] == 0
"""


def cli_startup(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """One fake CLI start (`nvidia-container-cli --version`: start-up and exit, no driver needed) as
    a worker makes it in a kernel-backend node: forked (by a bundled implementation forked warm:
    its `sysops.run` forks the fake from itself, no client), served (a script's bash client, the
    fake forked for it by the node's CLI server) and standalone (the client runs the fake in an
    interpreter of its own, as it does outside a node and under strace), against `true`, `python3
    -c pass` and `python3 -S -c pass`. Each command runs `runs` times in one start of the node, in
    turns, so that the load of a shared machine falls on all alike: wall time per run, and the
    machine's CPU time per run."""
    from gpujail.backends import warm
    runs = 10 if quick else 60
    commands = {"served": "nvidia-container-cli --version", "standalone": f"(unset {warm.CLI_SERVER_ENV}; "
                "exec nvidia-container-cli --version)", "true": "true", "python3 -c pass": "python3 -c pass",
                "python3 -S -c pass": "python3 -S -c pass"}
    walls: dict[str, list[float]] = {k: [] for k in [*commands, "forked"]}
    cpus: dict[str, list[float]] = {k: [] for k in [*commands, "forked"]}
    with kernel.Fleet(make_jail(tmp / "jail"), {}) as fleet:
        node = fleet.start("cli")
        for _ in range(1 if quick else 3):
            for name, command in commands.items():
                c0 = machine_cpu()
                r = node.run(["bash", "-c", f"for i in $(seq {runs}); do {command} >/dev/null || exit 1; done"],
                             env=node.contract_env())
                if r.code != 0:
                    raise RuntimeError(f"{name}: exit {r.code}: {r.stderr[-300:]}")
                walls[name].append(r.duration / runs)
                cpus[name].append((machine_cpu() - c0) / runs)
            # forked: a bundled implementation's own run of the CLI (warm.run_cli_forked), from a
            # Python loop in the node, less the same loop making no run (its interpreter's start-up)
            took = {}
            for n in (0, runs):
                c0 = machine_cpu()
                r = node.run([sys.executable, "-c", FORKED_LOOP, str(n)], env=node.contract_env())
                if r.code != 0:
                    raise RuntimeError(f"forked: exit {r.code}: {r.stderr[-300:]}")
                took[n] = (r.duration, machine_cpu() - c0)
            walls["forked"].append((took[runs][0] - took[0][0]) / runs)
            cpus["forked"].append((took[runs][1] - took[0][1]) / runs)
    wall, cpu = {k: median(v) for k, v in walls.items()}, {k: median(v) for k, v in cpus.items()}
    rows = []
    for way in ("forked", "served", "standalone"):
        for label, got in (("wall", wall), ("machine CPU", cpu)):
            rows.append(Row(f"one fake CLI start (--version) in a node, {way}, {label}", ms(got[way]),
                            ", ".join(f"{k} {ms(got[k])}" for k in commands if k not in ("served", "standalone", "forked")),
                            ratio(got[way], got["python3 -c pass"])))
    return rows, {"wall_s": wall, "cpu_s": cpu, "runs": runs, "load": os.getloadavg()}


# Consecutive events of one start (gpujail/world/events.py) and what happens between them.
START_PARTS = [("impl.start", "impl.begin", "implementation start-up and imports (fork or exec)"),
               ("impl.begin", "impl.placeholders", "`nvidia-container-cli list` run and the placeholder check"),
               ("impl.placeholders", "cli.start", "`configure` CLI start-up and imports"),
               ("cli.start", "cli.exit", "`configure`'s work (setns, mounts, --ldconfig)"),
               ("cli.exit", "impl.ready", "CLI exit and the implementation's verification"),
               ("impl.ready", "impl.exit", "implementation exit, the node's outside-write check")]


def start_parts(tmp: Path, quick: bool) -> tuple[list[Row], dict]:
    """Where one warm-jail reference start's time goes, from its own history (one worker at a time,
    a fresh node each, median of each part), and the warm paths (gpujail/backends/warm.py: nodes from
    the factory, the implementation forked, the CLI served) against none of them: 16 reference
    workers at once on a warm jail, both ways in turns, starts/s and the machine's CPU per start."""
    from gpujail.backends import warm
    n = 5 if quick else 20
    jail = make_jail(tmp / "jail")
    parts: dict[str, list[float]] = {label: [] for *_, label in START_PARTS}
    up, run, handoff = [], [], []
    with kernel.Fleet.recording(jail, tmp / "run") as fleet:
        assert start_worker(fleet, "prewarm", "reference").ready
        from gpujail.contract import command_for
        for i in range(n):
            t0 = time.monotonic()
            node = fleet.start(f"p{i}")
            t1 = time.monotonic()
            r = node.run(command_for("reference", str(jail), f"p{i}", "gpu-worker"), env=node.contract_env())
            t2 = time.monotonic()
            assert r.code == 0, r.stderr
            node.kill()
            at = {e["kind"]: e["t"] for e in fleet.history() if e.get("node") == f"p{i}"}
            for first, then, label in START_PARTS:
                parts[label].append(at[then] - at[first])
            up.append(t1 - t0)
            run.append(t2 - t1)
            handoff.append((t2 - t1) - (at["impl.exit"] - at["impl.start"]))
    whole = median(up) + median(run)
    rows = [Row("one warm reference start: node up (interpreter, imports, namespaces, view)", ms(median(up)),
                f"whole start {ms(whole)}", ratio(median(up), whole))]
    rows += [Row(f"one warm reference start: {label}", ms(median(xs)), f"whole start {ms(whole)}", ratio(median(xs), whole))
             for label, xs in parts.items()]
    rows.append(Row("one warm reference start: request to the node and its reply", ms(median(handoff)),
                    f"whole start {ms(whole)}", ratio(median(handoff), whole)))
    rates: dict[str, list[float]] = {"warm": [], "exec": []}
    cpu: dict[str, list[float]] = {"warm": [], "exec": []}
    for rep in range(1 if quick else 3):
        for way in ("exec", "warm"):
            os.environ[warm.WARM_ENV] = "1" if way == "warm" else "0"   # read by the harness and each node
            try:
                with kernel.Fleet(make_jail(tmp / f"jail-{way}-{rep}"), {}) as fleet:
                    assert start_worker(fleet, "prewarm", "reference").ready
                    c0 = machine_cpu()
                    ready, wall = start_many(fleet, "reference", 16, "w")
                cpu[way].append((machine_cpu() - c0) / 16)   # the nodes' ends included
                rates[way].append(ready / wall)
            finally:
                os.environ.pop(warm.WARM_ENV)
    rows.append(Row("starts/s, reference, warm jail, 16 workers, kernel backend, warm paths", f"{median(rates['warm']):.1f}/s",
                    f"without (GPUJAIL_WARM_STARTS=0) {median(rates['exec']):.1f}/s",
                    ratio(median(rates["warm"]), median(rates["exec"]))))
    rows.append(Row("machine CPU per start, 16 workers, warm paths", ms(median(cpu["warm"])),
                    f"without {ms(median(cpu['exec']))}", ratio(median(cpu["warm"]), median(cpu["exec"]))))
    return rows, {"parts_s": {k: median(v) for k, v in parts.items()}, "node_up_s": median(up), "run_s": median(run),
                  "starts_per_s": rates, "cpu_per_start_s": cpu, "load": os.getloadavg()}


FIGURES = {"seed-bug": seed_bug, "real-reports": real_reports, "cdi": cdi, "windows": windows, "starts": starts, "paths": paths,
           "docker": docker, "model": model, "suites": suites, "memory": memory, "qualify": qualify,
           "launchers": launchers, "jail-fs": jail_fs, "cli-startup": cli_startup, "start-parts": start_parts}


def table(rows: list[Row]) -> str:
    head = ("figure", "median", "comparison (same run)", "ratio")
    cells = [head] + [(r.figure, r.value, r.comparison, "" if r.ratio is None else f"{r.ratio:g}x") for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    line = lambda c: "| " + " | ".join(x.ljust(w) for x, w in zip(c, widths)) + " |"
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells[1:])])


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and sizes (a smoke run)")
    ap.add_argument("--only", nargs="+", choices=sorted(FIGURES), default=None, metavar="FIGURE",
                    help=f"only these figures ({', '.join(FIGURES)}; default: all)")
    ap.add_argument("--json", default="reports/benchmarks.json", help="where to write the figures as JSON")


def run(args) -> int:
    """Measure, print the table, write the JSON; an EXIT code. Needs the kernel backend."""
    memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, {memory_gib:.0f} GiB, Linux {platform.release()}, "
               f"Python {platform.python_version()}")
    out = {"machine": machine, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick,
           "figures": {}}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpujail-bench-") as d:
        for name in args.only or FIGURES:
            t = time.monotonic()
            print(f"... {name}", file=sys.stderr, flush=True)
            new, raw = FIGURES[name](Path(d) / name, args.quick)
            rows += new
            out["figures"][name] = {"rows": [dataclasses.asdict(r) for r in new], "raw": raw,
                                    "seconds": round(time.monotonic() - t, 1)}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    print(f"{out['date']} on {machine}{' (--quick)' if args.quick else ''}\n\n{table(rows)}\n\nJSON: {args.json}")
    return EXIT["passed"]


def main(argv=None) -> int:
    """`python -m gpujail.benchmarks.run`, the alias of `gpujail bench`."""
    ap = argparse.ArgumentParser(prog="python -m gpujail.benchmarks.run", description=__doc__.split("\n\n")[0])
    arguments(ap)
    args = ap.parse_args(argv)
    reason = kernel.precondition()
    if reason:
        print(f"benchmarks: {reason}", file=sys.stderr)
        return EXIT["backend"]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
