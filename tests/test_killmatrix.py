"""The kill matrix command (conformance/killmatrix.py) in reduced form: two mutants against one
test, one of which kills the first and not the second, run as a user runs it (`gpujail
killmatrix`). The full matrix (every mutant, the conformance and chaos suites) runs on demand:
`gpujail killmatrix` (tox env `killmatrix`); `python -m gpujail.conformance.killmatrix` is its alias.
The shell template's mutants (`--template`, reference_impl/template_mutants.py) are checked here
against the current example.sh: every edit applies exactly once and yields a script `sh` can parse."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpujail.conformance
from gpujail.backends import kernel
from gpujail.conformance import killmatrix
from gpujail.reference_impl import template_mutants
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


SPACES = "conformance/test_worker_start.py::test_jail_path_with_spaces"


@pytest.mark.parametrize("name", list(template_mutants.MUTANTS))
def test_template_mutant_applies_to_the_current_template(name, tmp_path):
    """Each edit's text is in example.sh exactly once, so the mutant is the mistake it says, on the
    template as it is today. Only `sh -n` (syntax) is asked of the result: several mutants are
    mistakes shellcheck exists to flag (an unquoted path), so shellcheck is not run on them."""
    text = template_mutants.TEMPLATE.read_text()
    for old, _ in template_mutants.MUTANTS[name][1]:
        assert text.count(old) == 1, f"template mutant {name}: {old.strip()[:80]!r} found {text.count(old)} times"
    path = template_mutants.write([name], tmp_path)[name]
    assert path.read_text() != text
    r = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, f"template mutant {name} is not valid sh: {r.stderr}"


def test_template_edit_that_no_longer_applies_names_its_mutant():
    """A template that changed under an edit is an error naming the mutant, never an unchanged
    script (which would survive for the wrong reason); so is text that is there twice."""
    old = template_mutants.MUTANTS["no-lock"][1][0][0]
    for template in (template_mutants.TEMPLATE.read_text().replace(old, "flock 9"), old + old):
        with pytest.raises(template_mutants.TemplateEditError, match="template mutant no-lock: edit 1 of 1"):
            template_mutants.script("no-lock", template)


def test_unknown_template_mutant_is_a_usage_error(tmp_path):
    """Through the front door: exit 2, one line naming it, nothing written."""
    r = subprocess.run([sys.executable, "-m", "gpujail", "killmatrix", "--template", "--mutants", "no-lock,no-such",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT["bad-input"], r.stdout + r.stderr
    assert "no-such" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.kernel
def test_template_matrix_kills_a_mutant(tmp_path):
    """One template mutant, one test: unquoted-jail runs from the scratch directory as `sh DIR/NAME.sh`
    and the jail-with-spaces test (which example-shell passes) kills it."""
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    r = subprocess.run([sys.executable, "-m", "gpujail", "killmatrix", "--template", "--mutants", "unquoted-jail",
                        "--tests", SPACES, "--workers", "0", "--out", str(tmp_path)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == EXIT["passed"], r.stdout + r.stderr
    data = json.loads((tmp_path / "kill-matrix-template.json").read_text())
    assert data["baseline"]["implementation"] == "example-shell"
    assert data["mutants"]["unquoted-jail"]["killed_by"] == [SPACES]
    assert "# Kill matrix of the shell template" in (tmp_path / "kill-matrix-template.md").read_text()
