"""The kill matrix command (conformance/killmatrix.py) in reduced form: two mutants against one
test, one of which kills the first and not the second, run as a user runs it (`gpujail
killmatrix`). The full matrix (every mutant, the conformance and chaos suites) runs on demand:
`gpujail killmatrix` (tox env `killmatrix`); `python -m gpujail.conformance.killmatrix` is its alias."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import gpujail.conformance
import pytest
from gpujail.conformance import killmatrix

from gpujail.backends import kernel
from gpujail.spec import EXIT

REF7 = "conformance/test_worker_start.py::test_placeholder_sized_mount_is_rejected"


@pytest.mark.kernel
def test_reduced_matrix_names_killers_and_survivors(tmp_path):
    """verify-existence is killed by the REF-7 placeholder test; no-soname-check survives it, so
    the command exits 1 and both reports name the survivor. Run from another directory: the test
    path is the suites' own, wherever the command runs."""
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    r = subprocess.run([sys.executable, "-m", "gpujail", "killmatrix", "--mutants", "verify-existence,no-soname-check",
                        "--tests", REF7, "--workers", "0", "--out", str(tmp_path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=900)
    data = json.loads((tmp_path / "kill-matrix.json").read_text())
    assert data["mutants"]["verify-existence"]["killed_by"] == [REF7]
    assert data["mutants"]["no-soname-check"]["killed_by"] == [] and data["mutants"]["no-soname-check"]["survived"]
    assert data["tests"] == {REF7: ["verify-existence"]}
    assert r.returncode == EXIT["failed"], r.stdout + r.stderr
    assert data["command"].startswith("gpujail killmatrix --mutants verify-existence,no-soname-check")
    assert "Survivors (holes in the suite): no-soname-check" in (tmp_path / "kill-matrix.md").read_text()


def test_unknown_mutant_is_a_usage_error(tmp_path, capsys):
    assert killmatrix.main(["--mutants", "no-such-mutant", "--out", str(tmp_path)]) == EXIT["bad-input"]
    err = capsys.readouterr().err
    assert "no-such-mutant" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "kill-matrix.json").exists()


def test_test_paths_are_the_suites_own_else_yours(tmp_path, monkeypatch):
    """`conformance` names the suite where gpujail is (a checkout, or site-packages/gpujail) from any
    directory; a path only found from the current directory is yours, taken absolute."""
    assert killmatrix.SUITES_HOME == Path(gpujail.conformance.__file__).resolve().parent.parent
    mine = tmp_path / "test_mine.py"
    mine.write_text("def test_x():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(mutants="no-lock", tests=f"{REF7} chaos test_mine.py::test_x", workers=2, timeout=60)
    assert killmatrix.check(args) == (["no-lock"], [REF7, "chaos", f"{mine}::test_x"])
