"""The kill matrix command (conformance/killmatrix.py) in reduced form: two mutants against one
test, one of which kills the first and not the second. The full matrix (every mutant, the
conformance and chaos suites) runs on demand: `python -m gpujail.conformance.killmatrix` (tox env
`killmatrix`)."""
from __future__ import annotations

import json

import pytest
from gpujail.conformance import killmatrix

from gpujail.backends import kernel

pytestmark = pytest.mark.kernel
REF7 = "conformance/test_worker_start.py::test_placeholder_sized_mount_is_rejected"


def test_reduced_matrix_names_killers_and_survivors(tmp_path):
    """verify-existence is killed by the REF-7 placeholder test; no-soname-check survives it, so
    the command exits 1 and both reports name the survivor."""
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    code = killmatrix.main(["--mutants", "verify-existence,no-soname-check", "--tests", REF7,
                            "--workers", "0", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "kill-matrix.json").read_text())
    assert data["mutants"]["verify-existence"]["killed_by"] == [REF7]
    assert data["mutants"]["no-soname-check"]["killed_by"] == [] and data["mutants"]["no-soname-check"]["survived"]
    assert data["tests"] == {REF7: ["verify-existence"]}
    assert code == 1
    assert "Survivors (holes in the suite): no-soname-check" in (tmp_path / "kill-matrix.md").read_text()


def test_unknown_mutant_is_a_usage_error(tmp_path, capsys):
    assert killmatrix.main(["--mutants", "no-such-mutant", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no-such-mutant" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "kill-matrix.json").exists()
