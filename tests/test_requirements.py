"""The requirement vocabulary and the conformance plugin's bookkeeping.

gpujail/spec.py must name exactly the IDs SPEC.md defines; every REF-* and CLI-*
requirement must be cited by at least one conformance test; citing an unknown ID is an error; and
the expectations machinery (strict xfails from a TOML file, the JSON summary per requirement) does
what vendors and CI gates rely on; the plugin stays quiet in a project that does not ask for it;
the harness self-checks are reported apart from the implementation's score. The plugin's own
behaviour is checked in nested pytest sessions (`pytester`, on throwaway test files), whose
configuration stays out of this session's.
"""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpujail import spec
from gpujail.conformance import expectations
from gpujail.options import OPTIONS
from gpujail.plugin.collection import purpose
from gpujail.plugin.outcomes import failure_reason
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


def collect_citations(*suites: str) -> _Citations:
    """Which tests of `suites` cite which IDs, from an in-process collection (both backends' tests)."""
    citations = _Citations()
    for backend in ("kernel", "model"):
        with nested_session():
            code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark", "--backend",
                                backend, "--rootdir", str(REPO), *(str(REPO / s) for s in suites)], plugins=[citations])
        assert code == pytest.ExitCode.OK, f"collecting {', '.join(suites)} failed ({code!r})"
    return citations


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

@pytest.fixture(autouse=True)
def no_suite_options(monkeypatch, tmp_path):
    """None of the suite's options inherited from the environment; a self-check cache of the test's own."""
    for o in OPTIONS:
        monkeypatch.delenv(o.env, raising=False)
    monkeypatch.setenv("GPUJAIL_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def run(pytester, monkeypatch):
    """`pytest -p gpujail.plugin ARGS` in pytester's directory (in this process), a directory whose
    conftest asks for the plugin as the suites' own do."""
    monkeypatch.syspath_prepend(str(REPO))
    pytester.makeconftest("GPUJAIL_SUITE = True\n")

    def run(*args: str) -> pytest.RunResult:
        with nested_session():
            return pytester.runpytest("-p", "gpujail.plugin", "-p", "no:cacheprovider", "-p", "no:benchmark", *args)
    return run


def output(result) -> str:
    return result.stdout.str() + "\n" + result.stderr.str()


def test_a_sessions_settings_reach_its_nodes_not_the_environment(pytester, run, tmp_path):
    """--start-timeout, --cli and --cdi-spec become the session's settings (gpujail.spec.Settings),
    which the nodes' environment is built from; nothing is written to os.environ, and a nested
    session gives the outer one's settings back when it ends."""
    def environ():   # pytest's own PYTEST_CURRENT_TEST left out: the nested session drops it
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    outer, before = spec.settings(), environ()
    pytester.makepyfile(test_seen="""
        import os
        from pathlib import Path
        from gpujail import spec
        from gpujail.backends import kernel

        def test_seen():
            run = spec.settings()
            assert (run.start_timeout, run.cli_variant, run.cdi_spec) == (7.5, "own-cleanup", "")
            env = kernel.Node("w0", Path("/jail"), "gpu-worker", None, {}).contract_env()
            assert env["GPUJAIL_CLI_VARIANT"] == "own-cleanup"
            assert not any(k in os.environ for k in ("GPUJAIL_START_TIMEOUT", "GPUJAIL_CLI_VARIANT", "GPUJAIL_CLI_TARGET"))
    """)
    result = run("--start-timeout", "7.5", "--cli", "fake-own-cleanup")
    assert result.ret == 0, output(result)
    assert spec.settings() == outer and environ() == before


def test_each_plain_session_keeps_its_chaos_runs_apart(pytester, run):
    """Without --gpujail-report, a chaos run's files go under what the session ran against: run-tests
    runs the same tests against each implementation and jail file system in turn, and a later
    session must not overwrite an earlier one's failing history (it did, in CI 34)."""
    pytester.makepyfile(test_where="""
        def test_where(artefacts_dir, record_property):
            record_property("where", str(artefacts_dir))
    """)
    seen = []
    for args in (["--impl", "legacy"], ["--impl", "legacy", "--jail-fs", "gluster"], ["--impl", "sh /bin/true"]):
        result = run(*args, "-o", "junit_family=xunit1", f"--junitxml={pytester.path}/j.xml")
        assert result.ret == 0, output(result)
        seen.append(re.search(r'name="where" value="([^"]+)"', (pytester.path / "j.xml").read_text())[1])
    root = pytester.path / "reports" / "chaos"
    assert seen == [str(root / "legacy" / "test_where"), str(root / "legacy_jail-fs_gluster" / "test_where"),
                    str(root / "sh_bin_true" / "test_where")]


@pytest.mark.parametrize("impl,cli,outcome", [
    ("reference", None, {"failed": 2}),   # it runs both: the tests apply, and here they fail
    ("direct", None, {"failed": 1, "skipped": 1}),   # no configure: that one does not apply
    ("cdi", None, {"skipped": 2}),   # neither list nor configure
    ("sh /bin/true", "[]", {"skipped": 2}),   # a vendor's command declares it in its expectations file
    ("direct", '["list", "configure"]', {"failed": 2})])   # ... which wins over the bundled table
def test_a_test_of_a_cli_command_applies_only_where_it_runs(pytester, run, impl, cli, outcome):
    """A test that fails or stubs `nvidia-container-cli list` or `configure` (marker `needs_cli`) is
    skipped as not applicable, with the reason, for an implementation that never runs that command,
    and runs (and can fail) for any other: no expectations file needed to say what cannot happen."""
    pytester.makepyfile(test_cli_steps="""
        import pytest

        @pytest.mark.needs_cli("list")
        def test_list():
            assert False

        @pytest.mark.needs_cli("configure")
        def test_configure():
            assert False
    """)
    args = ["--impl", impl, "-rs"]
    if cli is not None:
        (pytester.path / "exp.toml").write_text(f"cli = {cli}\n")
        args += ["--expectations", str(pytester.path / "exp.toml")]
    result = run(*args)
    result.assert_outcomes(**outcome)
    if "skipped" in outcome:
        assert "not applicable:" in result.stdout.str() and "runs no `nvidia-container-cli" in result.stdout.str()


def test_an_expectations_files_cli_list_is_checked(pytester, run):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    (pytester.path / "exp.toml").write_text('cli = ["lsit"]\n')
    result = run("--impl", "reference", "--expectations", str(pytester.path / "exp.toml"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "cli = ['lsit']: expected a list" in result.stderr.str()


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


def test_an_expected_failure_that_proves_nothing_is_inconclusive(run, pytester):
    """A chaos run expected to fail that proved nothing (it raised `Inconclusive`: a fault window
    never opened) did not fail as expected: it is inconclusive and the run is red. [inconclusive]
    accepts such a run, and [intermittent], which promises no outcome (legacy takes no lock, so a
    stopped lock holder's window stays shut unless the cold race hurts someone first)."""
    pytester.makepyfile(test_unproven="""
        import pytest
        from gpujail.chaos.checkers.results import Inconclusive

        @pytest.mark.req("INV-1")
        def test_expected(request):
            request.node.user_properties.append(("inconclusive", "INCONCLUSIVE: window never opened"))
            raise Inconclusive("INCONCLUSIVE: window never opened")

        @pytest.mark.req("INV-2")
        def test_flaky(request):
            request.node.user_properties.append(("inconclusive", "INCONCLUSIVE: window never opened"))
            raise Inconclusive("INCONCLUSIVE: window never opened")
    """)
    exp = pytester.makefile(".toml", unproven='[tests]\n"test_unproven.py::test_expected" = "loses content"\n'
                                              '[intermittent]\n"test_unproven.py::test_flaky" = "timing"\n')
    report = pytester.path / "reports" / "summary.json"
    result = run(f"--expectations={exp}", f"--gpujail-report={report}")
    result.assert_outcomes(failed=1, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output(result)
    assert "loses content; but INCONCLUSIVE: window never opened" in result.stdout.str()
    statuses = {t["test"].split("::")[1]: t["status"] for r in ("INV-1", "INV-2")
                for t in json.loads(report.read_text())["requirements"][r]["tests"]}
    assert statuses == {"test_expected": "inconclusive", "test_flaky": "expected-fail"}


def test_intermittently_inconclusive_accepts_a_pass_or_no_proof_never_a_violation(run, pytester):
    """[intermittent-inconclusive] (a fault placed at a time, whose window opens by timing) accepts
    a run that passed or proved nothing, and fails one that broke an invariant, which [intermittent]
    (wpt's [PASS, FAIL]: a known race) accepts as an expected failure."""
    pytester.makepyfile(test_timed="""
        import pytest
        from gpujail.chaos.checkers.results import Inconclusive

        @pytest.mark.req("INV-1")
        def test_proved_nothing(request):
            request.node.user_properties.append(("inconclusive", "INCONCLUSIVE: window never opened"))
            raise Inconclusive("INCONCLUSIVE: window never opened")

        @pytest.mark.req("INV-1")
        def test_passed():
            pass

        @pytest.mark.req("INV-1")
        def test_lost_content():
            assert 0, "INV-1 FAIL: w1 lost usr/lib/libcuda.so.1"
    """)
    both = '"test_timed.py::test_*" = "the brick is killed 0.3 s in"\n'
    report = pytester.path / "reports" / "summary.json"
    statuses, rewritten = {}, {}
    for section in ("intermittent-inconclusive", "intermittent"):
        exp = pytester.makefile(".toml", **{section.replace("-", "_"): f"[{section}]\n{both}"})
        result = run(f"--expectations={exp}", f"--gpujail-report={report}")
        statuses[section] = {t["test"].split("::")[1]: t["status"]
                             for t in json.loads(report.read_text())["requirements"]["INV-1"]["tests"]}
        statuses[section]["(run)"] = result.ret
        rewritten[section] = expectations.render(json.loads(report.read_text()))
    assert statuses["intermittent-inconclusive"] == {
        "test_proved_nothing": "expected-inconclusive", "test_passed": "passed-intermittent",
        "test_lost_content": "failed", "(run)": pytest.ExitCode.TESTS_FAILED}
    assert statuses["intermittent"] == {
        "test_proved_nothing": "expected-fail", "test_passed": "passed-intermittent",
        "test_lost_content": "expected-fail", "(run)": pytest.ExitCode.OK}
    # `gpujail expectations` keeps what a non-strict section listed, whatever one run did; a
    # violation the section did not accept becomes an expected failure to review
    assert rewritten["intermittent-inconclusive"].split("\n[")[1:] == [
        'tests]\n"test_timed.py::test_lost_content" = "INV-1: INV-1 FAIL: w1 lost usr/lib/libcuda.so.1"\n',
        'intermittent-inconclusive]\n"test_timed.py::test_passed" = "the brick is killed 0.3 s in"\n'
        '"test_timed.py::test_proved_nothing" = "the brick is killed 0.3 s in"\n']
    assert rewritten["intermittent"].split("\n[")[1:] == ["tests]\n", 'intermittent]\n' + "".join(
        f'"test_timed.py::test_{t}" = "the brick is killed 0.3 s in"\n' for t in ("lost_content", "passed", "proved_nothing"))]


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


@pytest.mark.parametrize("impl, complaint", [
    ("no-such-runtime {jail}", "no-such-runtime is neither a bundled implementation"),
    ("sh /no/such.sh -j {jail}", "script /no/such.sh: no such file"),
    ("bash vendor.sh {jail}", "script vendor.sh: a relative path"),
    ("{here}/runtime.sh {jail}", "runtime.sh: not executable"),
    ("mutant:no-such", "unknown mutant"),
], ids=["not-on-path", "no-script", "relative-script", "not-executable", "unknown-mutant"])
def test_unknown_implementation_is_one_usage_error(pytester, impl, complaint):
    """An --impl that is neither bundled nor a runnable command is refused up front with one line
    naming it, not as a failure in every test."""
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    (pytester.path / "runtime.sh").write_text("#!/bin/sh\n")   # mode 0644
    impl = impl.replace("{here}", str(pytester.path))
    result = pytester.runpytest("-p", "gpujail.plugin", "--impl", impl)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    [line] = [line for line in result.errlines if line.strip()]
    assert line.startswith(f"ERROR: --impl {impl!r}: ") and complaint in line, line


@pytest.mark.parametrize("where", ["option", "env", "ini"])
def test_bad_value_names_where_it_came_from(pytester, monkeypatch, where):
    """A bad value is named the way it was given: the option, the environment variable, or the ini
    key and its file."""
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    args = ["--impl", "reference"]
    if where == "option":
        args += ["--workers", "many"]
        said = "--workers 'many': expected a non-negative integer"
    elif where == "env":
        monkeypatch.setenv("GPUJAIL_WORKERS", "many")
        said = "GPUJAIL_WORKERS='many' (environment): expected a non-negative integer"
    else:
        ini = pytester.makeini("[pytest]\nworkers = many\n")
        said = f"workers = 'many' (ini file {ini}): expected a non-negative integer"
    result = pytester.runpytest("-p", "gpujail.plugin", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert said in result.stderr.str()


# -- quiet until asked ------------------------------------------------------------------------------

UNRELATED = """
    import pytest

    @pytest.mark.req("not a SPEC id")
    def test_own_jail(jail):
        assert jail == "their own jail"

    @pytest.mark.model
    def test_marked_model():
        pass

    @pytest.mark.scale
    @pytest.mark.self_check
    def test_marked_scale():
        pass

    def test_no_world(request):
        with pytest.raises(pytest.FixtureLookupError):
            request.getfixturevalue("world")
"""


def test_installed_plugin_is_quiet_until_asked(pytester):
    """In a project that does not ask for it (no --impl, no GPUJAIL_IMPL, no ini key, no suite
    conftest), the installed plugin changes nothing: the project's own `jail` fixture, its `req`
    marker with any arguments, tests marked `model` or `scale` all behave exactly as without the
    plugin (`-p no:gpujail.plugin`); no fixture of ours is visible; no report is written."""
    pytester.makeconftest('import pytest\n\n@pytest.fixture\ndef jail():\n    return "their own jail"\n')
    pytester.makepyfile(test_theirs=UNRELATED)

    def outcome(*args):
        result = pytester.runpytest("-p", "no:cacheprovider", "-rA", *args)
        lines = [ln for ln in result.outlines if ln.startswith(("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"))]
        return result.ret, result.parseoutcomes(), sorted(lines)

    with_plugin, without = outcome(), outcome("-p", "no:gpujail.plugin")
    assert with_plugin == without
    assert with_plugin[1]["passed"] == 4
    fixtures = pytester.runpytest("--fixtures", "-p", "no:cacheprovider").stdout.str()
    assert "their own jail" not in fixtures and "open_world" not in fixtures and "artefacts_dir" not in fixtures
    assert not (pytester.path / "reports").exists()


@pytest.mark.parametrize("how", ["option", "env", "ini", "conftest"])
def test_plugin_acts_when_asked(pytester, monkeypatch, how):
    """--impl, GPUJAIL_IMPL, the ini key `impl` or a conftest setting `GPUJAIL_SUITE = True` each
    make it act: here, an unknown requirement ID becomes a usage error."""
    pytester.makepyfile(test_x='import pytest\n\n@pytest.mark.req("REF-99")\ndef test_x():\n    pass\n')
    args = []
    if how == "option":
        args = ["--impl", "reference"]
    elif how == "env":
        monkeypatch.setenv("GPUJAIL_IMPL", "reference")
    elif how == "ini":
        pytester.makeini("[pytest]\nimpl = reference\n")
    else:
        pytester.makeconftest("GPUJAIL_SUITE = True\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output(result)
    assert "REF-99" in result.stderr.str()


# -- the harness self-checks ------------------------------------------------------------------------

SELF_CHECKS = """
    import os
    import pytest

    @pytest.mark.self_check
    @pytest.mark.req("CLI-1")
    def test_fake_cli():
        assert not os.environ.get("BREAK_THE_HARNESS"), "the fake CLI is broken"

    @pytest.mark.req("REF-1")
    def test_vendor():
        pass
"""


def test_self_checks_run_first_and_once_per_host(run, pytester):
    """The self-checks run before the implementation's tests; once they passed on this host with
    this code, they are skipped with that reason; `--self-checks always` runs them again."""
    pytester.makepyfile(test_cases=SELF_CHECKS)
    report = pytester.path / "reports" / "summary.json"
    first = run("-v", f"--gpujail-report={report}")
    assert first.ret == pytest.ExitCode.OK, output(first)
    order = [ln.split("::")[1].split()[0] for ln in first.outlines if "::test_" in ln and "PASSED" in ln]
    assert order == ["test_fake_cli", "test_vendor"]
    assert json.loads(report.read_text())["self_checks"]["status"] == "passed"
    second = run("-rs", f"--gpujail-report={report}")
    assert second.ret == pytest.ExitCode.OK, output(second)
    assert "already checked on this host at" in second.stdout.str()
    checks = json.loads(report.read_text())["self_checks"]
    assert checks["status"] == "cached" and checks["reason"].startswith("already checked on this host at")
    again = run("--self-checks", "always")
    again.assert_outcomes(passed=2)


def test_self_checks_count_apart_from_the_implementation(run, pytester, monkeypatch):
    """A failing self-check is not the implementation's failure: its requirement is absent from the
    implementation's table (and from its uncited list), it is reported in the self-checks' own
    table, and the run is an error (pytest's exit 3, `gpujail run`'s 5), not a failed run."""
    pytester.makepyfile(test_cases=SELF_CHECKS)
    monkeypatch.setenv("BREAK_THE_HARNESS", "1")
    report = pytester.path / "reports" / "summary.json"
    result = run(f"--gpujail-report={report}")
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR, output(result)
    assert "gpujail harness self-checks: failed" in result.stdout.str()
    summary = json.loads(report.read_text())
    assert list(summary["requirements"]) == ["REF-1"]
    assert not any(r.startswith(("CLI-", "K-")) for r in summary["uncited"])
    checks = summary["self_checks"]
    assert checks["status"] == "failed" and "the fake CLI is broken" in checks["reason"]
    assert checks["requirements"]["CLI-1"]["counts"] == {"failed": 1} and "CLI-2" in checks["uncited"]
    from gpujail import report as reporting
    from gpujail.commands.run import pytest_outcome
    assert pytest_outcome(int(result.ret), False, summary) == "error"
    text = reporting.text(summary)
    assert text.startswith("HARNESS SELF-CHECKS FAILED") and "harness self-checks" in text
    assert "Harness self-checks failed" in report.with_name("report.html").read_text()


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


def test_failure_reasons_are_the_checks_own_words():
    """A failing check's reason is its own message without pytest's `assert ...` explanation, the
    whole of a chaos verdict and chain (up to a bound), and a test's purpose is its docstring's first
    sentence."""
    assert failure_reason("AssertionError: worker w lost libcuda.so.1\nassert [] == ['x']") == \
        "worker w lost libcuda.so.1"
    assert failure_reason("assert 0 > 0") == "assert 0 > 0"
    chain = "AssertionError: scenario cold-race: INVALID\n  INV-1 FAIL ...\n  causal chain:\n    t=0.1 cli.fail"
    assert failure_reason(chain).splitlines() == chain[len("AssertionError: "):].splitlines()
    assert failure_reason("\n".join(f"line {i}" for i in range(40)), lines=5).endswith("... (35 more lines)")

    class Item:
        def function():
            """Workers start at once. Then more happens."""
    assert purpose(Item) == "Workers start at once"


def test_a_vendor_failure_is_filed_under_what_it_checks_of_the_implementation(run, pytester):
    """A test of the implementation that also names the CLI and kernel facts it leans on (REF-5,
    CLI-6, K-1) is filed under REF-5 only: a vendor's failure never shows up as a CLI-* or K-*
    failure (those headings are the harness self-checks')."""
    pytester.makepyfile(test_vendor="""
        import pytest

        @pytest.mark.req("REF-5", "CLI-6", "K-1")
        def test_neighbour():
            assert 0, "worker w lost its mounts"

        @pytest.mark.req("CLI-5")
        def test_only_a_cli_id():
            pass
    """)
    report = pytester.path / "summary.json"
    result = run(f"--gpujail-report={report}", "--impl", "true {jail}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output(result)
    reqs = json.loads(report.read_text())["requirements"]
    assert reqs["REF-5"]["counts"] == {"failed": 1} and reqs["REF-5"]["tests"][0]["reason"] == "worker w lost its mounts"
    assert "CLI-6" not in reqs and "K-1" not in reqs
    assert reqs["CLI-5"]["counts"] == {"passed": 1}   # nothing else to file it under


SPEC_DOC = REPO / "gpujail" / "spec.md"


def with_citations(text: str, cited: dict[str, list[str]]) -> str:
    """gpujail/spec.md with each requirement's section ending in its `Cited by:` line."""
    out, current = [], None

    def close():
        if current:
            while out and not out[-1].strip():
                out.pop()
            tests = sorted({nodeid.split("[")[0] for nodeid in cited.get(current, [])})
            out.extend(["", "Cited by: " + (", ".join(f"`{n}`" for n in tests) if tests else
                                            "no test yet" + (f" ({PENDING[current]})" if current in PENDING else "")) + ".", ""])
    for line in text.splitlines():
        if line.startswith("Cited by: "):
            continue
        if line.startswith(("## ", "### ")):
            close()
            m = re.match(r"### ([A-Z]+-\d+)\b", line)
            current = m[1] if m else None
        out.append(line)
    close()
    return "\n".join(out).rstrip("\n") + "\n"


def test_the_shipped_specification_names_every_requirement_and_its_tests():
    """gpujail/spec.md (installed with the package; README, CONTRACT.md and the report link to it)
    has a section per requirement ID, in gpujail/spec.py's order, each ending with the tests that
    really cite it. `GPUJAIL_UPDATE_SPEC=1` rewrites the `Cited by:` lines."""
    text = SPEC_DOC.read_text()
    assert re.findall(r"^### ([A-Z]+-\d+)\b", text, re.M) == list(REQUIREMENTS)
    cited = collect_citations("conformance", "chaos").cited
    expected = with_citations(text, cited)
    if os.environ.get("GPUJAIL_UPDATE_SPEC"):
        SPEC_DOC.write_text(expected)
        text = expected
    assert text == expected, "the Cited by: lines are stale: GPUJAIL_UPDATE_SPEC=1 pytest tests/test_requirements.py"
