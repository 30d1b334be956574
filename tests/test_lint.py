"""Lint as tests: shellcheck on every shell file (the vendor template above all), ruff on Python."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHELL = ["reference_impl/example.sh", "scripts/lint-imports", "scripts/copy-tree", "scripts/venv.sh", "scripts/steps.sh",
         "scripts/mutation-test", "scripts/with-dockerd.sh", "scripts/slurm-cluster.sh", "run-tests",
         "run-suites", ".ci/run", "scripts/oracle-killmatrix"]
PYTHON = [".", "scripts/process-census"]   # (a script without .py, which `ruff check .` skips)


@pytest.mark.parametrize("tool,args", [("shellcheck", SHELL), ("ruff", ["check", *PYTHON])], ids=["shellcheck", "ruff"])
def test_lint_clean(tool, args):
    exe = shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[dev]' brings it)")
    r = subprocess.run([exe, *args], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
