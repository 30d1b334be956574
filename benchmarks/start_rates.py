"""Figures of worker starts: starts per second, and a start's time from request to ready.

How this works
--------------
Each figure starts real workers (gpujail.contract.start_worker) on fleets of the kernel backend,
or of the backend or launcher it compares, and measures with benchmarks/measure.py:

  starts     worker starts/s, reference, direct, example-shell, warm and cold jail, 1/16/128 workers
  paths      reference's warm path in-process vs as a process; direct vs reference start to ready;
             the cold path with 16 contending workers (last lock wait, markers created once)
  docker     container worker starts against process workers (when an engine runs)
  launchers  node agents (gpujail/launchers/): starts/s through the local launcher and srun, time
             from `gpujail run --launcher X` to cold-race's verdict, clock uncertainty at rendezvous
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gpujail.backends import kernel
from gpujail.benchmarks.measure import Row, machine_cpu, median, ms, quiet, ratio, start_many, start_steadily
from gpujail.contract import start_worker
from gpujail.fixtures.jail import make_jail
from gpujail.spec import EXIT, LOCK
from gpujail.world import history

# -- starts per second ---------------------------------------------------------------------------------

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
        process, cpu = {}, {}
        for impl in ("reference", "direct", "example-shell"):
            times = []
            c0 = machine_cpu()   # the whole machine's: node, implementation, CLI server and harness
            for i in range(n):
                w = start_worker(fleet, f"{impl}-{i}", impl)
                assert w.ready, w.attempts[-1].stderr
                times.append(w.attempts[-1].duration)
                w.node.kill()
            cpu[impl] = (machine_cpu() - c0) / n
            process[impl] = median(times)
    warm_in = median(inproc["times"])
    rows = [Row(f"reference warm path in-process ({inproc['files']} files, no lock)", ms(warm_in),
                f"as a process {ms(process['reference'])}", ratio(warm_in, process["reference"])),
            Row("direct, start to ready, warm jail", ms(process["direct"]), f"reference {ms(process['reference'])}",
                ratio(process["direct"], process["reference"])),
            Row("example-shell, start to ready, warm jail", ms(process["example-shell"]),
                f"reference {ms(process['reference'])}", ratio(process["example-shell"], process["reference"])),
            *[Row(f"machine CPU per warm start, {impl} (node up to ready, one at a time)", ms(cpu[impl]),
                  f"reference {ms(cpu['reference'])}", ratio(cpu[impl], cpu["reference"]))
              for impl in ("direct", "example-shell")]]
    cold, raw_cold = cold_contention(tmp / "cold")
    return rows + cold, {"warm_inprocess_s": warm_in, "start_to_ready_s": process, "cpu_per_start_s": cpu,
                         "cold_16": raw_cold}


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


# -- docker ------------------------------------------------------------------------------------------

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
