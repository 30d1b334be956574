"""The package as a vendor gets it: `pip install` (not editable) into a fresh venv outside the clone.

Two things must hold there (issue 14): the installed pytest plugin changes nothing in a project that
does not ask for it, and `gpujail run --impl legacy`, from an empty directory, finds its suites,
their fixtures (the suites' own conftests: there is no repository conftest.py), the fake CLI and
legacy's packaged expectations, and passes.

Cost: the venv is made without pip (the running pip installs into it with `--python`), the package
is built from a copy of the working tree (so it never races another test building in the clone's
`build/`), and pip's cache serves the build backend and the dependencies; the suite run is a
handful of tests, one of each kind, among them expected failures of legacy's.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpujail.backends import kernel

REPO = Path(__file__).resolve().parents[1]


def pypi_unreachable() -> str | None:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return None
    except OSError as e:
        return f"no network to PyPI (pypi.org:443: {e}): pip cannot fetch the build backend and the dependencies"


pytestmark = [pytest.mark.install, pytest.mark.kernel,
              pytest.mark.skipif(bool(reason := pypi_unreachable()), reason=str(reason))]

# One self-check, a passing and an expected-failing conformance test, an expected-failing chaos run.
SOME = ("test_bad_command_lines_exit_1_and_touch_nothing or test_jail_path_with_spaces or "
        "test_no_empty_placeholder_after_cold_start or (test_scenario and failing-neighbour and not random)")

UNRELATED_CONFTEST = """
import pytest

@pytest.fixture
def jail():
    return "their own jail"
"""
UNRELATED_TEST = """
import pytest

@pytest.mark.req("their own marker, not a SPEC id")
def test_uses_their_jail(jail):
    assert jail == "their own jail"

@pytest.mark.model
@pytest.mark.scale
def test_marked_like_ours():
    pass

def test_our_fixtures_are_not_there(request):
    with pytest.raises(pytest.FixtureLookupError):
        request.getfixturevalue("world")
"""


def sh(argv, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return r


def test_pip_install_outside_the_clone(tmp_path):
    # -- install: a fresh venv, the package from a copy of the working tree, not editable
    source = tmp_path / "gpujail-src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "reports", "__pycache__", ".hypothesis", ".tox"))
    # every package of the working tree must be installed (pyproject lists them; the top-level folders
    # are mapped under gpujail/)
    packages = sorted(str(p.parent.relative_to(source)) for p in source.glob("**/__init__.py") if "tests" not in p.parts)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUJAIL_", "PYTEST_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    env["GPUJAIL_CACHE"] = str(tmp_path / "cache")   # the self-checks run here, whatever this host cached
    pip = sh([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(source)], tmp_path, env)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    where = sh([str(python), "-c", "import gpujail; print(gpujail.__file__)"], tmp_path, env)
    assert str(venv) in where.stdout, where.stdout + where.stderr   # the installed copy, not the clone
    installed = Path(where.stdout.strip()).parent
    missing = [p for p in packages if not (installed / p.removeprefix("gpujail").lstrip("/") / "__init__.py").exists()]
    assert missing == [], f"packages of the clone not installed (pyproject's [tool.setuptools] packages): {missing}"

    # -- an unrelated project: with the plugin installed, its run is the one it has without it
    project = tmp_path / "their-project"
    project.mkdir()
    (project / "conftest.py").write_text(UNRELATED_CONFTEST)
    (project / "test_theirs.py").write_text(UNRELATED_TEST)

    def their_run(*args):
        r = sh([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args], project, env)
        return r.returncode, sorted(ln for ln in r.stdout.splitlines() if ln.startswith(("PASSED", "FAILED", "ERROR")))

    helped = sh([str(python), "-m", "pytest", "--help"], project, env).stdout
    assert "--impl" in helped and "GPUJAIL_IMPL" in helped   # installed: its options are there ...
    assert their_run() == their_run("-p", "no:gpujail.plugin") == (0, [   # ... and nothing else
        "PASSED test_theirs.py::test_marked_like_ours", "PASSED test_theirs.py::test_our_fixtures_are_not_there",
        "PASSED test_theirs.py::test_uses_their_jail"])
    assert not (project / "reports").exists()

    # -- `gpujail run --impl legacy` from an empty directory, with legacy's packaged expectations
    if kernel.precondition():
        pytest.skip(f"the suites need the kernel backend: {kernel.precondition()}")
    empty = tmp_path / "empty"
    empty.mkdir()
    run = sh([str(venv / "bin" / "gpujail"), "run", "--impl", "legacy", "-n", "2", "-k", SOME], empty, env)
    assert run.returncode == 0, run.stdout + run.stderr + (empty / "reports" / "pytest.log").read_text()
    expectations = str(venv / "lib")
    assert f"expectations {expectations}" in run.stdout and "legacy.toml" in run.stdout, run.stdout
    summary = json.loads((empty / "reports" / "summary.json").read_text())
    statuses = {t["test"].split("/")[-1]: t["status"] for entry in summary["requirements"].values() for t in entry["tests"]}
    assert statuses == {
        "test_worker_start.py::test_jail_path_with_spaces": "passed",
        "test_worker_start.py::test_no_empty_placeholder_after_cold_start[as-printed]": "expected-fail",
        "test_worker_start.py::test_no_empty_placeholder_after_cold_start[blank-lines]": "expected-fail",
        "test_scenarios.py::test_scenario[failing-neighbour]": "expected-fail"}, statuses
    assert summary["self_checks"]["status"] == "passed", summary["self_checks"]
    assert "harness self-checks" in run.stdout and "PASSED (exit 0)" in run.stdout
    assert sorted(p.name for p in empty.iterdir()) == ["reports"]
