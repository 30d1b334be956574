"""scripts/process-census: where CI's CPU goes, counted by the kernel's process accounting."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CENSUS = Path(__file__).resolve().parents[1] / "scripts" / "process-census"


def test_a_census_counts_a_shells_subshells_and_execs_and_keeps_the_exit_code():
    if os.getuid() != 0:
        pytest.skip("process accounting (acct(2)) needs root")
    r = subprocess.run([sys.executable, str(CENSUS), "--", "sh", "-c", "( : ); ( : ); ( : ); /bin/true; exit 3"],
                       capture_output=True, text=True)
    if "keeps its own process accounting" in r.stderr:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 3, r.stdout + r.stderr
    rows = {line.split()[-1]: [int(n) for n in line.split()[:2]] for line in r.stdout.splitlines()[2:]}
    assert rows["sh"][0] >= 4 and rows["sh"][1] >= 3, r.stdout   # the shell and its 3 subshells (no exec)
    assert rows["true"][0] >= 1 and rows["true"][1] == 0, r.stdout


def test_no_command_is_a_usage_error():
    r = subprocess.run([sys.executable, str(CENSUS)], capture_output=True, text=True)
    assert r.returncode == 2 and "no command" in r.stderr
