"""Figures of what one start costs: where its time goes, and the fake CLI's own start-up (issue 19).

How this works
--------------
  cli-startup  one fake CLI start in a kernel-backend node, forked by a bundled implementation,
               served by the node's CLI server and standalone, against `true`, `python3 -c pass`,
               `python3 -S -c pass` (wall, machine CPU per run), the commands in turns in one start
               of the node so that a shared machine's load falls on all alike
  start-parts  where one warm reference start's time goes, from its own history (node up,
               implementation start-up, each CLI run, the node's own work); 16 workers with the
               warm paths (gpujail/backends/warm.py) against without, starts/s and machine CPU
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gpujail.backends import kernel
from gpujail.benchmarks.measure import Row, machine_cpu, median, ms, ratio, start_many
from gpujail.contract import start_worker
from gpujail.fixtures.jail import make_jail

FORKED_LOOP = """
import sys
from gpujail.backends import cli_server
from gpujail.world import sysops
sysops.run_without_exec = cli_server.run_cli_forked
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
    from gpujail.backends import cli_server
    runs = 10 if quick else 60
    commands = {"served": "nvidia-container-cli --version", "standalone": f"(unset {cli_server.CLI_SERVER_ENV}; "
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
            # forked: a bundled implementation's own run of the CLI (cli_server.run_cli_forked), from a
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
