"""The requirement vocabulary and the conformance plugin's bookkeeping.

gpujail/spec.py must name exactly the IDs SPEC.md defines; every REF-* and CLI-*
requirement must be cited by at least one conformance test; citing an unknown ID is an error; and
the expectations machinery (strict xfails from a TOML file, the JSON summary per requirement) does
what vendors and CI gates rely on. The plugin's own behaviour is checked in nested pytest sessions
(`pytester`, on throwaway test files), whose configuration stays out of this session's.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpujail import plugin
from gpujail.spec import PENDING, REQUIREMENTS

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO.parent / "shared" / "SPEC.md"
# `- **REF-1 file set.** ...`, `**CLI-1 grammar.**`, `- **K-1** Unlinking ...`
SPEC_ID = re.compile(r"^\s*(?:[-*]\s+)?\*\*([A-Z]+-\d+)\b", re.M)


def spec_ids(text: str) -> list[str]:
    return SPEC_ID.findall(text)


def test_spec_id_pattern():
    """The parser finds bullet and bold-paragraph IDs and nothing in running text."""
    text = ("- **CLI-1 grammar.** GNU argp\n  - **K-1** Unlinking\n**INV-2 convergence.** With\n"
            "see `REF-5` and **not-an-id** or REF-7 in prose\n")
    assert spec_ids(text) == ["CLI-1", "K-1", "INV-2"]


def test_requirements_match_spec():
    """gpujail/spec.py names exactly the IDs SPEC.md defines, each once."""
    if not SPEC.is_file():
        pytest.skip(f"SPEC.md not found at {SPEC} (the shared product documents sit next to the repository)")
    ids = spec_ids(SPEC.read_text())
    assert ids, f"no requirement IDs found in {SPEC}"
    assert len(ids) == len(set(ids)), f"IDs defined twice in SPEC.md: {sorted({i for i in ids if ids.count(i) > 1})}"
    assert sorted(set(ids) - set(REQUIREMENTS)) == [], "in SPEC.md but not in gpujail/spec.py"
    assert sorted(set(REQUIREMENTS) - set(ids)) == [], "in gpujail/spec.py but not in SPEC.md"


@contextmanager
def nested_session():
    """Room for a nested pytest session in this process (the plugin keeps its state per config,
    so there is nothing to save; kept as the one place to add it if that changes)."""
    yield


class _Citations:
    """A plugin for an in-process collection: which tests cite which requirement IDs."""

    def __init__(self):
        self.cited: dict[str, list[str]] = defaultdict(list)

    def pytest_collection_finish(self, session):
        for item in session.items:
            for rid in {i for m in item.iter_markers("req") for i in m.args}:
                self.cited[rid].append(item.nodeid)


def test_every_ref_and_cli_requirement_is_cited():
    """Every REF-* and CLI-* requirement is checked by at least one conformance test."""
    citations = _Citations()
    with nested_session():
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark",
                            "--rootdir", str(REPO), str(REPO / "conformance")], plugins=[citations])
    assert code == pytest.ExitCode.OK, f"collecting conformance/ failed ({code!r})"
    assert citations.cited, "no conformance test cites any requirement"
    uncited = [r for r in REQUIREMENTS if r.startswith(("REF-", "CLI-")) and r not in citations.cited and r not in PENDING]
    assert uncited == [], f"requirements no conformance test cites: {', '.join(uncited)}"
    built = sorted(set(PENDING) & set(citations.cited))
    assert built == [], f"cited by a test but still listed as pending in gpujail/spec.py PENDING: {', '.join(built)}"


# -- the plugin, in nested pytest sessions --------------------------------------------------------

@pytest.fixture
def run(pytester, monkeypatch):
    """`pytest -p gpujail.plugin ARGS` in pytester's directory (in this process, with the
    plugin's module state restored afterwards), with none of the suite's options inherited from the
    environment."""
    monkeypatch.syspath_prepend(str(REPO))
    for _name, env, _default, _help in plugin.OPTIONS:
        monkeypatch.delenv(env, raising=False)

    def run(*args: str) -> pytest.RunResult:
        with nested_session():
            return pytester.runpytest("-p", "gpujail.plugin", "-p", "no:cacheprovider", "-p", "no:benchmark", *args)
    return run


def output(result) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


def test_unknown_requirement_id_is_an_error(pytester, run):
    """A test citing an ID the vocabulary does not know stops the run before any test runs, naming
    the ID and the test."""
    pytester.makepyfile(test_typo="""
        import pytest

        @pytest.mark.req("REF-1")
        def test_fine():
            pass

        @pytest.mark.req("REF-99")
        def test_typo():
            pass
    """)
    result = run()
    assert result.ret not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), output(result)
    assert "REF-99" in output(result) and "test_typo" in output(result)
    assert "passed" not in result.stdout.str()


CASES = """
    import pytest

    @pytest.mark.req("REF-1")
    def test_passes():
        pass

    @pytest.mark.req("REF-2")
    def test_fails():
        assert 0, "broken on purpose"

    @pytest.mark.req("REF-3")
    def test_known_bug():
        assert 0, "the known bug"

    @pytest.mark.req("REF-4")
    def test_skipped():
        pytest.skip("no GPU on this runner")

    @pytest.mark.req("REF-5")
    def test_flaky_passes():
        pass

    @pytest.mark.req("REF-5")
    def test_flaky_fails():
        assert 0, "lost the race this time"

    @pytest.mark.req("REF-6")
    def test_fixed_meanwhile():
        pass
"""
EXPECTATIONS = """
    implementation = "mine"

    [requirements]
    "REF-3" = "known bug in the lock handling"

    [tests]
    "test_cases.py::test_fixed_meanwhile" = "was broken"

    [intermittent]
    "test_cases.py::test_flaky_passes" = "timing"
    "test_cases.py::test_flaky_fails" = "timing"
"""


@pytest.fixture
def cases(pytester):
    pytester.makepyfile(test_cases=CASES)
    return pytester.makefile(".toml", expectations=EXPECTATIONS)


def test_expected_failures_are_green(run, cases):
    """A test expected to fail (by requirement) that fails is an expected failure, and the run is
    green; an intermittent entry is accepted either way."""
    result = run(f"--expectations={cases}", "-k", "not test_fails and not test_fixed_meanwhile", "-rxXs")
    result.assert_outcomes(passed=1, skipped=1, xfailed=2, xpassed=1)
    assert result.ret == pytest.ExitCode.OK, output(result)
    assert "known bug in the lock handling" in result.stdout.str()


def test_unexpected_pass_is_red(run, cases):
    """A test listed as expected to fail that passes is a strict XPASS: reported, and the run fails."""
    result = run(f"--expectations={cases}", "-k", "test_fixed_meanwhile")
    result.assert_outcomes(failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "XPASS(strict)" in result.stdout.str() and "was broken" in result.stdout.str()


def test_json_summary_groups_outcomes_by_requirement(run, cases, pytester):
    """--gpujail-report writes the run info and, per requirement, each test's status (passed,
    failed, expected-fail, unexpected-pass, skipped) with the reason, and lists the requirements no
    test cited."""
    report = pytester.path / "reports" / "summary.json"
    result = run(f"--expectations={cases}", f"--gpujail-report={report}", "--impl", "true {jail}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output(result)
    summary = json.loads(report.read_text())
    from gpujail.spec import CONTRACT_VERSION
    assert summary["run_info"]["implementation"] == "true {jail}"
    assert summary["run_info"]["contract_version"] == CONTRACT_VERSION
    reqs = summary["requirements"]

    def only(rid: str) -> dict:
        [test] = reqs[rid]["tests"]
        return test

    assert only("REF-1")["status"] == "passed" and only("REF-1")["test"].endswith("test_cases.py::test_passes")
    assert only("REF-2")["status"] == "failed" and "broken on purpose" in only("REF-2")["reason"]
    assert only("REF-3")["status"] == "expected-fail"
    assert only("REF-4")["status"] == "skipped" and "no GPU on this runner" in only("REF-4")["reason"]
    assert only("REF-6")["status"] == "unexpected-pass" and "XPASS(strict)" in only("REF-6")["reason"]
    flaky = {t["test"].split("::")[-1]: t["status"] for t in reqs["REF-5"]["tests"]}
    assert flaky["test_flaky_fails"] == "expected-fail" and flaky["test_flaky_passes"] != "failed"
    assert reqs["REF-2"]["counts"] == {"failed": 1} and reqs["REF-5"]["counts"].get("failed", 0) == 0
    assert "REF-7" in summary["uncited"] and "REF-1" not in summary["uncited"]


def test_unknown_implementation_is_one_usage_error(pytester):
    """An --impl that is neither bundled nor a command is refused up front with one line, not as a
    failure in every test."""
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "gpujail.plugin", "--impl", "no-such-runtime {jail}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no-such-runtime" in "\n".join(result.errlines)


@pytest.mark.parametrize("content, complaint", [
    ('[requirements]\n"REF-99" = "no such requirement"\n', "REF-99"),
    ('[tets]\n"test_cases.py::test_fails" = "a typo in the section name"\n', "tets"),
], ids=["unknown-requirement", "unknown-section"])
def test_bad_expectations_file_is_a_usage_error(run, pytester, content, complaint):
    """An expectations file naming an unknown requirement ID or section is a usage error naming the
    file and what is wrong with it; no test runs."""
    pytester.makepyfile(test_cases=CASES)
    path = pytester.makefile(".toml", bad_expectations=content)
    result = run(f"--expectations={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output(result)
    assert str(path) in result.stderr.str() and complaint in result.stderr.str()
    assert "passed" not in result.stdout.str()
