"""The benchmark runner's own parts (the figures themselves are measured, never asserted)."""
from __future__ import annotations

import os
import subprocess
import sys

from gpujail.benchmarks.measure import Row, host_costs, host_costs_line
from gpujail.benchmarks.run import table
from gpujail.benchmarks.suite_runs import CHECKOUT, SUITES_HOME, tree_pss


def test_table_lines_up_and_shows_ratios():
    text = table([Row("starts/s, direct", "15.0/s", "reference 12.3/s", 1.22), Row("model steps/s", "60,000/s")])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1          # every line as wide as the header
    assert "1.22x" in lines[2] and "60,000/s" in lines[3] and lines[1].startswith("|---")


def test_memory_of_a_process_tree_counts_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); print(flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE)
    try:
        child.stdout.readline()   # its 64 MiB are there (not a sleep: a Python start takes seconds on a loaded machine)
        alone = tree_pss(child.pid)[0]
        both, count = tree_pss(os.getpid())
        assert alone > 60 << 20 and both > alone and count >= 2
    finally:
        child.kill()
        child.wait()


def test_unknown_figure_is_a_usage_error():
    """`python -m gpujail.benchmarks.run` is the alias of `gpujail bench` (tests/test_cli.py runs that)."""
    p = subprocess.run([sys.executable, "-m", "gpujail.benchmarks.run", "--only", "nosuch"], capture_output=True, text=True)
    assert p.returncode == 2 and "invalid choice: 'nosuch'" in p.stderr and "Traceback" not in p.stderr


def test_self_tests_figure_only_from_a_checkout():
    """The suites run from wherever gpujail is; the self-tests (tests/) exist only in a checkout."""
    assert (SUITES_HOME / "chaos" / "test_scenarios.py").is_file()
    assert CHECKOUT is None or (CHECKOUT / "tests" / "test_benchmarks.py").is_file()


def test_a_failing_figure_costs_only_itself(tmp_path, monkeypatch):
    """A figure that raises (a stale reference an hour into a full run) is a FAILED row and exit 5;
    the figures after it are still measured and written."""
    import argparse
    import json

    from gpujail.benchmarks import run

    def broken(d, quick):
        raise AttributeError("module 'jailfs' has no attribute 'fleet_class'")

    fine = lambda d, quick: ([Row("fine", "1/1")], {"n": 1})   # noqa: E731
    monkeypatch.setattr(run, "FIGURES", {"broken": broken, "fine": fine})
    out = tmp_path / "bench.json"
    code = run.run(argparse.Namespace(only=None, quick=True, json=str(out)))
    figures = json.loads(out.read_text())["figures"]
    assert code == 5
    assert figures["fine"]["rows"][0]["value"] == "1/1"
    assert figures["broken"]["rows"][0]["value"] == "FAILED" and "fleet_class" in figures["broken"]["raw"]["error"]


def test_host_costs_price_each_kind_of_work():
    """run-tests' first and last lines and the benchmarks' machine: four prices, each measured (a
    CPU clock too coarse for them would give 0, and a comparison of two hosts by them would mean
    nothing)."""
    costs = host_costs(rounds=2)
    assert list(costs) == ["page fault (us)", "fork and exit (ms)", "exec (ms)", "million Python additions (ms)"]
    assert all(0 < v < 1e4 for v in costs.values()), costs
    assert host_costs_line(costs).count(",") == 3
