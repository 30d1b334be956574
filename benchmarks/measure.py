"""What every figure measures with: a table row, the median, and the ways of starting workers and timing them.

How this works
--------------
A figure (benchmarks/run.py lists them) returns `Row`s: what was measured, the comparison measured
in the same run, and their ratio, since absolute times drift on shared machines; times are
medians of repeated runs (`median`, `ms`, `ratio`). Worker starts are measured two ways:
`start_many` starts a batch at once (how many became ready, wall time), `start_steadily` restarts
each worker as soon as its last start ended (the steady rate, without a batch's ramp). CPU is the
whole machine's (`machine_cpu`): a warm node is forked by a long-lived factory and the fake CLI by
the node's PID 1, so no one parent's children's times hold a start's CPU; `quiet` waits for the
machine to settle between measurements. `host_costs` prices what the suites do most on this host
(a page fault, a fork, an exec, Python), so that runs on two hosts can be compared.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import resource
import statistics
import subprocess
import threading
import time

from gpujail.contract import start_worker


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


def _cpu() -> float:
    """CPU seconds of this process and its reaped children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def host_costs(rounds: int = 5) -> dict[str, float]:
    """What this host charges, in CPU time (the least of `rounds`: the least disturbed), for what
    the suites' CPU goes to most: a page fault (the first write to an anonymous page), a fork and
    exit of this process, an exec of /bin/true, and a million Python additions. The suites are
    process churn: a probe round is a fork, a shell start a hundred processes, and page faults,
    forks, exits and execs took 29% of the busy CPU of example-shell's suite, and one commit's CI
    cost half as much again on a host whose page faults cost several times more (docs/benchmarks.md,
    sixth session): two runs compare by these, not by wall time alone."""
    def fault() -> None:
        pages = 4096
        with mmap.mmap(-1, pages * mmap.PAGESIZE) as m:
            for i in range(0, pages * mmap.PAGESIZE, mmap.PAGESIZE):
                m[i] = 1

    def fork() -> None:
        for _ in range(50):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)

    def python() -> None:
        x = 0
        for i in range(1_000_000):
            x += i

    work = {"page fault": (fault, 4096, 1e6, "us"), "fork and exit": (fork, 50, 1e3, "ms"),
            "exec": (lambda: [subprocess.run(["/bin/true"]) for _ in range(20)], 20, 1e3, "ms"),
            "million Python additions": (python, 1, 1e3, "ms")}
    costs = {}
    for name, (fn, n, scale, unit) in work.items():
        samples = []
        for _ in range(rounds):
            c0 = _cpu()
            fn()
            samples.append((_cpu() - c0) / n * scale)
        costs[f"{name} ({unit})"] = round(min(samples), 2)
    return costs


def host_costs_line(costs: dict[str, float] | None = None) -> str:
    """`costs` (measured now if not given: `host_costs`) as one line, for a run's summary
    (run-tests) and the benchmarks' machine."""
    return ", ".join(f"{k} {v:g}" for k, v in (costs or host_costs()).items())
