"""The CI jobs shipped for the CI-gate reader (docs/ci/github-actions.yml, docs/ci/gitlab-ci.yml).

Each is parsed as the CI service would read it (YAML) and checked for the three things a vendor
copies it for: it installs the suite (pip, from the source named in one variable), it runs
`gpujail run` against the vendor's script with their expectations file, and it keeps `reports/`
as artefacts whatever the outcome. The command line is then read by the real `gpujail run` parser
(gpujail/cli.py), so a renamed or removed option breaks this test rather than the vendor's CI.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from gpujail import cli
from gpujail.contract import command_for

yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extras (pip install -e '.[dev]')")

REPO = Path(__file__).resolve().parents[1]
CI = REPO / "docs" / "ci"
# What the CI service puts in these variables, for reading the command line here.
WORKSPACE = "/builds/vendor/runtime"
VARIABLES = {"$GITHUB_WORKSPACE": WORKSPACE, "$CI_PROJECT_DIR": WORKSPACE, "$RUNNER_TEMP": "/tmp/runner"}


def github() -> tuple[dict, list[str], list[dict]]:
    """The GitHub workflow's one job: its environment, its shell lines, its steps."""
    workflow = yaml.safe_load((CI / "github-actions.yml").read_text())
    assert workflow.get("on", workflow.get(True)), "no trigger"   # YAML 1.1 reads a bare `on` as true
    (job,) = workflow["jobs"].values()
    assert job["runs-on"].startswith("ubuntu")
    steps = job["steps"]
    assert all(("run" in s) != ("uses" in s) for s in steps), "each step runs a command or uses an action"
    lines = [ln for s in steps if "run" in s for ln in s["run"].splitlines() if ln.strip()]
    return {**workflow.get("env", {}), **job.get("env", {})}, lines, steps


def gitlab() -> tuple[dict, list[str], dict]:
    """The GitLab job: its variables, its script lines, the job."""
    (job,) = [j for name, j in yaml.safe_load((CI / "gitlab-ci.yml").read_text()).items() if not name.startswith(".")]
    return job.get("variables", {}), [*job.get("before_script", []), *job["script"]], job


def is_pip_install(words: list[str]) -> bool:
    pip = words[:3] == ["python", "-m", "pip"] or bool(words) and Path(words[0]).name in ("pip", "pip3")
    return pip and "install" in words


def run_line(lines: list[str]) -> str:
    (line,) = [ln for ln in lines if " run " in ln and "gpujail" in ln.split(" run ")[0]]
    return line


def gpujail_argv(line: str) -> list[str]:
    """The arguments after `gpujail` in a shell line, its variables expanded as the CI would."""
    for var, value in VARIABLES.items():
        line = line.replace(var, value)
    words = shlex.split(line)
    at = next(i for i, w in enumerate(words) if Path(w).name == "gpujail")
    return words[at + 1:]


@pytest.mark.parametrize("service", [github, gitlab])
def test_installs_the_suite_from_one_named_source(service):
    variables, lines, _ = service()
    assert variables.get("GPUJAIL_SOURCE"), "the source to install from is one variable to change"
    install = [ln for ln in lines if is_pip_install(shlex.split(ln))]
    assert len(install) == 1 and shlex.split(install[0])[-1] == "$GPUJAIL_SOURCE"
    assert lines.index(install[0]) < lines.index(run_line(lines))


@pytest.mark.parametrize("service", [github, gitlab])
def test_runs_the_vendor_script_with_its_expectations(service):
    """The command line is accepted by `gpujail run`'s own parser, names the vendor's script by an
    absolute path (it runs with the jail as its working directory) and their expectations file."""
    _, lines, _ = service()
    argv = gpujail_argv(run_line(lines))
    args = cli.parser().parse_args(argv)   # a Stop (bad input) fails the test with gpujail's own message
    assert args.command == "run" and argv.count("--impl") == 1 and argv.count("--expectations") == 1
    assert args.expectations == "vendor.toml"
    assert command_for(args.impl, "/jail", "w0", "gpu-worker") == ["bash", f"{WORKSPACE}/vendor.sh", "-j", "/jail"]


def test_github_keeps_reports_always():
    _, lines, steps = github()
    run_step = next(i for i, s in enumerate(steps) if "run" in s and run_line(lines) in s["run"])
    (upload,) = [(i, s) for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/upload-artifact@")]
    at, step = upload
    assert at > run_step and ("always()" in step.get("if", "") or "failure()" in step.get("if", ""))
    assert "reports/" in step["with"]["path"].split()


def test_gitlab_keeps_reports_always():
    _, _, job = gitlab()
    artifacts = job["artifacts"]
    assert artifacts["when"] in ("always", "on_failure") and "reports/" in artifacts["paths"]
    assert artifacts["reports"]["junit"] == "reports/junit.xml"


def test_readme_points_the_ci_gate_reader_at_both():
    readme = (REPO / "README.md").read_text()
    assert "docs/ci/github-actions.yml" in readme and "docs/ci/gitlab-ci.yml" in readme
