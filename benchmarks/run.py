"""Benchmarks: every performance figure side by side, as one table (and JSON), with the machine and the
date. Benchmarks measure and print; they never assert a time.

    gpujail bench [--quick] [--only NAME ...] [--json reports/benchmarks.json]

(`python -m gpujail.benchmarks.run` is the same command.) The latest figures, and how to read
them, are in docs/benchmarks.md.

How this works
--------------
Each figure is one function, listed in `FIGURES` below, in a module of this package by what it
measures: bug_finding.py (seed-bug, real-reports, cdi, windows), start_rates.py (starts, paths,
docker, launchers), suite_runs.py (suites, model, memory), jail_filesystems.py (qualify, jail-fs)
and start_costs.py (cli-startup, start-parts). It returns table rows (measure.py `Row`): what was
measured (median of repeated runs), and the comparison measured *in the same run* with the ratio,
since absolute times drift on shared machines. `--quick` repeats less (a smoke run, also in the
self-tests). This module is the command: it runs the figures asked for, prints the table and
writes the JSON, again after each figure (a run stopped in its last figure keeps the others). A
figure that raises is a FAILED row (the traceback in the JSON) and exit 5: the other figures of an
hour's run are still written.

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
  bounded      model backend: every schedule of 2 workers with at most 1 preemption, with no fault and
               each single fault, for legacy, reference and direct (schedules, violations, CPU)
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
import sys
import tempfile
import time
import traceback
from pathlib import Path

from gpujail.backends import kernel
from gpujail.benchmarks.bug_finding import (
    cdi,
    cluster_faults,
    real_reports,
    runs_to_detection,
    schedules,
    seed_bug,
    unscripted,
    windows,
)
from gpujail.benchmarks.jail_filesystems import jail_fs, qualify
from gpujail.benchmarks.measure import Row, host_costs_line
from gpujail.benchmarks.start_costs import cli_startup, start_parts
from gpujail.benchmarks.start_rates import docker, launchers, paths, starts
from gpujail.benchmarks.suite_runs import bounded, memory, model, suites
from gpujail.spec import EXIT

FIGURES = {"seed-bug": seed_bug, "real-reports": real_reports, "cluster-faults": cluster_faults, "cdi": cdi,
           "windows": windows, "starts": starts, "paths": paths,
           "docker": docker, "model": model, "suites": suites, "memory": memory, "qualify": qualify,
           "launchers": launchers, "jail-fs": jail_fs, "cli-startup": cli_startup, "start-parts": start_parts,
           "schedules": schedules, "runs-to-detection": runs_to_detection,
           "unscripted": unscripted, "bounded": bounded}


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
               f"Python {platform.python_version()}; {host_costs_line()}")   # (what this host charges)
    out = {"machine": machine, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "quick": args.quick,
           "figures": {}}
    rows: list[Row] = []
    failed: list[str] = []
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpujail-bench-") as d:
        for name in args.only or FIGURES:
            t = time.monotonic()
            print(f"... {name}", file=sys.stderr, flush=True)
            try:
                new, raw = FIGURES[name](Path(d) / name, args.quick)
            except Exception as e:   # noqa: BLE001 (one broken figure costs itself, not the hour of the others)
                failed.append(name)
                new, raw = [Row(name, "FAILED", f"{type(e).__name__}: {e}"[:200])], {"error": traceback.format_exc()}
                print(f"... {name} FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            rows += new
            out["figures"][name] = {"rows": [dataclasses.asdict(r) for r in new], "raw": raw,
                                    "seconds": round(time.monotonic() - t, 1)}
            # after each figure, not only at the end: an hour's run stopped in its last figure
            # keeps the others (the JSON then lacks the figures not reached)
            Path(args.json).write_text(json.dumps(out, indent=1, default=str))
            print(f"... {name}: {out['figures'][name]['seconds']:g} s", file=sys.stderr, flush=True)
    print(f"{out['date']} on {machine}{' (--quick)' if args.quick else ''}\n\n{table(rows)}\n\nJSON: {args.json}")
    if failed:
        print(f"benchmarks: {len(failed)} figure(s) failed: {', '.join(failed)} (the traceback of each is in the JSON)",
              file=sys.stderr)
        return EXIT["error"]
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
