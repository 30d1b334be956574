"""The pytest plugin: quiet until asked; then fixtures, the `req` marker, expectations, self-checks, reports.

How this works
--------------
Installed with the package (entry point `pytest11`), this module only adds its options, in one
group, each also an ini key and an environment variable (gpujail/options.py). Like pytest-xdist
and pytest-timeout it does nothing else until asked: in a project that does not use it, tests,
fixtures and markers behave as if gpujail were absent. It acts (registers `Suite`, the real
plugin, for this session) when

* `--impl` is given (or its ini key `impl`, or `GPUJAIL_IMPL`), or
* a conftest that sets `GPUJAIL_SUITE = True` is loaded: the suites' own (conformance/, chaos/,
  which is how `gpujail run` and `pytest --pyargs gpujail.conformance` work from an installed
  package) and the repository's root conftest, for the self-tests that use the fixtures.

Then every option is checked first (one line per mistake, naming what was given and where: the
validator `gpujail run` uses too), and:

* `req("REF-5", ...)` names the SPEC requirements a test checks; an unknown ID is a usage error.
* `--expectations FILE` (TOML, like web-platform-tests metadata) lists the requirement IDs and
  tests an implementation is expected to fail, with the reason; they become strict xfails, so the
  run is green exactly when the implementation fails what it should. A chaos test that proves
  nothing (an invariant left UNKNOWN, a fault window never opened: it raises `Inconclusive`) is
  `inconclusive` and fails the run, unless the file lists it under [inconclusive] with the reason:
  then it is a strict xfail on `Inconclusive` only (`expected-inconclusive`; a pass or a violation
  of a test so listed fails the run). Both are reported apart from passes.
* Tests marked `self_check` (the fake CLI's fidelity and the kernel facts, CLI-* and K-*) do not
  depend on the implementation: they run first, and once per host and code version (`--self-checks
  once`; a cached pass is a skip saying when it was checked). They are reported apart and never
  count for or against the implementation; one failing makes the run an error (exit 3 from pytest,
  5 from `gpujail run`): the harness itself is wrong here, so the vendor's results say nothing.
* `--gpujail-report FILE` writes the JSON summary (gpujail/report.py) and `report.html` beside it.
* Fixtures: `impl`, `jail`, `run_dir`, `fleet` (kernel nodes), `fleet_class` (the chosen backend's),
  `world` (a jail, a fleet and the implementation under test), `open_world` (the same on a jail of
  the test's own), `artefacts_dir` (where a failing chaos run keeps its files).
"""
from __future__ import annotations

import datetime
import fnmatch
import hashlib
import importlib
import json
import os
import sys
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpujail import options
from gpujail.options import OPTIONS, BadInput  # noqa: F401 (OPTIONS: the table, as before)
from gpujail.report import CHAOS_DIR, HARNESS_FAMILIES, artefact_name, write_html
from gpujail.spec import CONTRACT_VERSION, PENDING, REQUIREMENTS

ASK = "GPUJAIL_SUITE"   # a conftest setting this to True asks the plugin to act
SELF_CHECK = "self_check"
CACHED = "already checked on this host"   # a self-check's skip reason when it passed here before
UNAVAILABLE = "the launcher's cluster cannot run the agents: "   # a test's skip reason when so (then exit 3)
EXPECTED_INCONCLUSIVE = "expected inconclusive: "   # the xfail reason of a test listed under [inconclusive]

option = options.option


def pytest_addoption(parser):
    group = parser.getgroup("gpujail", "GPU driver mounts on a shared jail (conformance and chaos)")
    for o in OPTIONS:
        group.addoption(f"--{o.name}", dest=o.key, default=None,
                        help=f"{o.help} (env {o.env}, ini {o.key}; default {o.default!r})")
        parser.addini(o.key, o.help, default="")


def pytest_configure(config):
    if options.value(config, "impl").given:
        activate(config)
    else:   # a suite's conftest may still ask, now (initial conftests) or during collection
        config.pluginmanager.register(Listener(config), "gpujail.listener")


class Listener:
    """Waits for a conftest that asks for the plugin (`GPUJAIL_SUITE = True`)."""

    def __init__(self, config):
        self.config = config

    def pytest_plugin_registered(self, plugin):
        if getattr(plugin, ASK, False) is True:
            activate(self.config)


def activate(config) -> None:
    if config.pluginmanager.get_plugin("gpujail.suite") is None:
        config.pluginmanager.register(Suite(config), "gpujail.suite")


# -- the plugin at work -------------------------------------------------------------------------

class Suite:
    """The plugin for one session (per config, so a nested session, e.g. pytester's, keeps its own)."""

    def __init__(self, config):
        try:
            self.values, self.expectations = options.check_all(lambda name: options.value(config, name))
        except BadInput as e:
            raise pytest.UsageError(str(e)) from None
        # Every start's deadline (gpujail.spec.start_timeout), for this process and the nodes it starts.
        os.environ[options.BY_NAME["start-timeout"].env] = self.value("start-timeout")
        # The fake CLI's variant, for every worker this process starts (kernel.Node.contract_env).
        os.environ["GPUJAIL_CLI_VARIANT"] = options.check_cli(self.values["cli"])
        # --cli real: the host's CLI, which workers get through the syscall-fault wrapper (contract_env).
        os.environ["GPUJAIL_CLI_TARGET"] = options.real_cli(self.values["cli"])
        # --cdi-spec: the vendor's spec, for this process and every node it starts (fixtures/cdi_spec.py).
        from gpujail.fixtures import cdi_spec
        cdi_spec.activate(self.value("cdi-spec"))
        self.config = config
        self.by_requirement: dict[str, list] = defaultdict(list)
        self.self_checks: dict[str, list] = defaultdict(list)
        for line in ("req(*ids): the SPEC requirement IDs this test checks",
                     "kernel: needs the kernel backend",
                     "scale: a big run (128 workers); deselected unless `-m scale`",
                     "model: runs in the model backend's simulation; collected with --backend model",
                     f"{SELF_CHECK}: a harness self-check (the fake CLI, kernel facts): run first, once per host "
                     "and code version, reported apart, never counted for or against an implementation"):
            config.addinivalue_line("markers", line)

    def value(self, name: str) -> str:
        return self.values[name].text

    # -- collection ---------------------------------------------------------------------------

    def pytest_collection_modifyitems(self, config, items):
        # Big runs (128 workers) are opt-in: deselected (and counted as such) unless `-m scale` asks.
        if "scale" not in (config.getoption("markexpr", "") or ""):
            self._deselect(config, items, [i for i in items if i.get_closest_marker("scale")])
        # `--backend model` runs the tests written for the simulation (marker `model`), every other
        # backend runs the rest: each collects its own, and the deselected are counted, never skipped.
        on_model = self.value("backend") == "model"
        self._deselect(config, items, [i for i in items if bool(i.get_closest_marker("model")) != on_model])
        checked = SelfCheckCache(self, items) if any(i.get_closest_marker(SELF_CHECK) for i in items) else None
        for item in items:
            ids = requirement_ids(item)
            unknown = [i for i in ids if i not in REQUIREMENTS]
            if unknown:
                raise pytest.UsageError(f"{item.nodeid}: unknown requirement ID(s) {', '.join(unknown)} "
                                        "(see gpujail/spec.py)")
            item.user_properties.append(("requirements", ",".join(ids)))
            item.user_properties.append(("purpose", purpose(item)))
            if item.get_closest_marker(SELF_CHECK):
                item.user_properties.append((SELF_CHECK, checked.key))
                when = checked.passed.get(item.nodeid)
                if when and self.value("self-checks") == "once":
                    item.add_marker(pytest.mark.skip(reason=f"{CACHED} at {when}"))
                continue   # an implementation's expectations never apply to the harness
            self._expect(item, ids)
        # The self-checks first: the run's precondition (xdist hands out tests in this order).
        items.sort(key=lambda i: not i.get_closest_marker(SELF_CHECK))

    @staticmethod
    def _deselect(config, items, which) -> None:
        if which:
            config.hook.pytest_deselected(items=which)
            items[:] = [i for i in items if i not in which]

    def _expect(self, item, ids) -> None:
        exp = self.expectations
        # A test named under [tests] is a strict expected failure, even where a wider [intermittent]
        # pattern also matches it; then [intermittent] (wpt's [PASS, FAIL]); then [requirements].
        # [inconclusive] expects the run to prove nothing, and nothing else: a violation still fails.
        inconclusive = _match(item.nodeid, exp["inconclusive"])
        if inconclusive:
            from gpujail.chaos.checkers.results import Inconclusive
            item.add_marker(pytest.mark.xfail(reason=f"{EXPECTED_INCONCLUSIVE}{inconclusive}", strict=True,
                                              raises=Inconclusive))
            return
        reason = _match(item.nodeid, exp["tests"])
        flaky = None if reason else _match(item.nodeid, exp["intermittent"])
        if flaky:
            item.add_marker(pytest.mark.xfail(reason=f"known intermittent: {flaky}", strict=False))
            return
        reason = reason or next((f"{i}: {exp['requirements'][i]}" for i in ids if i in exp["requirements"]), None)
        if reason:
            item.add_marker(pytest.mark.xfail(reason=f"expected to fail: {reason}", strict=True))

    # -- outcomes -----------------------------------------------------------------------------

    def pytest_runtest_logreport(self, report):
        """One outcome per test (the worst of its phases), per requirement it cites; the
        self-checks' in their own table."""
        props = dict(report.user_properties)
        if report.when != "call" and report.outcome == "passed":
            return
        if hasattr(report, "wasxfail"):   # skipped: failed as expected; passed: an intermittent passed
            status = ("expected-inconclusive" if report.wasxfail.startswith(EXPECTED_INCONCLUSIVE) else
                      "expected-fail") if report.skipped else "passed-intermittent"
        elif report.failed and "XPASS(strict)" in report.longreprtext:
            status = "unexpected-pass"
        elif report.failed and "inconclusive" in props:   # proved nothing: not a pass, not a violation
            status = "inconclusive"
        else:
            status = report.outcome
        reason = ""
        if status in ("inconclusive", "expected-inconclusive"):
            reason = props.get("inconclusive", "") + (f" (listed: {report.wasxfail[len(EXPECTED_INCONCLUSIVE):]})"
                                                       if status == "expected-inconclusive" else "")
        elif report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2]
            if reason.startswith(UNAVAILABLE):
                self.unavailable = reason[len(UNAVAILABLE):]
        elif report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            reason = failure_reason(crash.message if crash else report.longreprtext.strip()[-2000:])
        entry = {"test": report.nodeid, "status": status, "reason": reason, "duration": round(report.duration, 3),
                 "purpose": props.get("purpose", "")}
        if "invariants" in props:   # a chaos run: each invariant's status, and why where not PASS
            entry["invariants"] = props["invariants"]
            entry["invariant_reasons"] = props.get("invariant_reasons", {})
        if "windows" in props:      # and each fault window its scenario declares: opened or closed
            entry["windows"] = props["windows"]
        if "cells" in props:        # the fault-table cells it exercised (chaos/checkers/cells.py)
            entry["cells"] = props["cells"]
        if "unreachable" in props:  # a fault-table case the implementation never reached
            entry["unreachable"] = props["unreachable"]
        table = self.self_checks if SELF_CHECK in props else self.by_requirement
        ids = [i for i in props.get("requirements", "").split(",") if i] or ["(none)"]
        if table is self.by_requirement:
            # An implementation's test is filed under what it checks of the implementation: the
            # fake CLI's and the kernel's facts it leans on are the self-checks' headings.
            ids = [i for i in ids if not i.startswith(HARNESS_FAMILIES)] or ids
        for rid in ids:
            table[rid].append(entry)
        if SELF_CHECK in props:
            entry["key"] = props[SELF_CHECK]

    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workerinput"):   # xdist workers: the controller reports
            return
        checks = self_check_summary(self.self_checks)
        if checks["status"] != "failed":
            SelfCheckCache.remember(self.self_checks)
        elif session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR   # inconclusive, not the vendor's failure
        self.checks = checks
        path = self.value("gpujail-report")
        if not path:
            return
        report = {"run_info": {"implementation": self.value("impl"), "backend": self.value("backend"),
                               "contract_version": CONTRACT_VERSION, "seed": self.value("seed"),
                               **({"launcher": self.value("launcher")} if self.value("launcher") else {})},
                  "requirements": by_requirement(self.by_requirement),
                  "uncited": [r for r in REQUIREMENTS if r not in self.by_requirement and r not in PENDING
                              and not r.startswith(HARNESS_FAMILIES)],
                  "pending": {r: why for r, why in PENDING.items()},
                  "self_checks": checks,
                  **({"unavailable": f"--launcher {self.unavailable}"} if getattr(self, "unavailable", None) else {})}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1))
        write_html(report, Path(path).with_name("report.html"))   # for people, beside the summary

    def pytest_terminal_summary(self, terminalreporter):
        checks = getattr(self, "checks", None)
        if checks and checks["status"] != "not run":
            terminalreporter.write_sep("-", f"gpujail harness self-checks: {checks['status']}"
                                       + (f": {checks['reason']}" if checks["reason"] else ""))

    # -- fixtures -----------------------------------------------------------------------------

    @pytest.fixture
    def impl(self) -> str:
        """The implementation under test (--impl)."""
        return self.value("impl")

    @pytest.fixture
    def workers(self) -> int:
        """GPU workers for a multi-worker test or scenario that does not pin its count (--workers)."""
        return int(self.value("workers"))

    @pytest.fixture
    def jail(self, tmp_path) -> Path:
        """A fresh jail image under the test's own tmp_path."""
        from gpujail.fixtures.jail import make_jail
        return make_jail(tmp_path / "jail")

    @pytest.fixture
    def run_dir(self, tmp_path) -> Path:
        d = tmp_path / "run"
        (d / "barriers").mkdir(parents=True, exist_ok=True)
        return d

    @pytest.fixture
    def fleet(self, jail, run_dir):
        """Kernel-backend nodes on `jail`; all killed (namespaces, mounts, processes) at teardown."""
        with on_jail_fs(backend_fleet("kernel"), self.value("jail-fs")).recording(jail, run_dir, "0") as f:
            yield f

    @pytest.fixture
    def fleet_class(self):
        """The chosen backend's `Fleet` (--backend); skips the test with the reason when this build
        or this host cannot run it. With --launcher, the nodes are made by node agents that launcher
        started (gpujail/launchers/), on the kernel backend's terms; else --jail-fs says what the
        jail is on."""
        if self.value("launcher"):
            return launcher_fleet(self.value("launcher"), options.launcher_options(self.values))
        fleet = on_jail_fs(backend_fleet(self.value("backend")), self.value("jail-fs"))
        if self.value("schedule") != "free":   # --schedule: what the chaos runner reads (chaos/runner.py run)
            fleet = type(fleet.__name__, (fleet,), {"schedule": self.value("schedule")})
        return fleet

    @pytest.fixture
    def open_world(self, tmp_path, impl, fleet_class):
        """`with open_world(jail) as world:` the implementation under test on a jail of the test's own."""
        @contextmanager
        def open_(jail: Path):
            with fleet_class.recording(jail, tmp_path / "run", self.value("seed")) as fleet:
                yield World(fleet, jail, impl, tmp_path / "run")
        return open_

    @pytest.fixture
    def world(self, open_world, jail):
        """A fresh jail and a fleet of worker nodes on the chosen backend, with the implementation under
        test. Whatever the test checks, a start that changed anything outside the jail (seen through
        its node's copy-on-write host, gpujail/backends/cow.py) fails it, filed under REF-11 too."""
        with open_world(jail) as w:
            yield w

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        """A test that failed because the launcher's cluster cannot run the agents (a pod it cannot
        schedule, an image it cannot pull) did not test the implementation: it is skipped with the
        launcher's line, filed as the run's `unavailable` (exit 3, as a backend that is not there),
        and the session stops, since every other test would meet the same cluster."""
        report = yield
        verdict = dict(item.user_properties).get("verdict")
        if verdict and report.failed and "XPASS(strict)" in report.longreprtext:   # why it passed, in the log
            report.longrepr = f"{report.longreprtext}\nthe run's verdict:\n{verdict}"
        if report.failed and call.excinfo is not None and self.value("launcher"):
            from gpujail.launchers.coordinator import launch_failure
            failure = launch_failure(call.excinfo.value)
            if failure is not None and failure.outcome == "backend":
                reason = f"{UNAVAILABLE}{self.value('launcher')}: {str(failure).splitlines()[0]}"
                report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0, reason)
                item.session.shouldstop = reason
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        """After a test that used the `world` and passed its own checks: any change a start made
        outside the jail fails it, in the call phase (so expectations apply), filed under REF-11."""
        result = yield
        world = item.funcargs.get("world")
        findings = outside_the_jail(world.history()) if world is not None else []
        if findings:
            ids = [i for i in dict(item.user_properties).get("requirements", "").split(",") if i]
            item.user_properties[:] = [p for p in item.user_properties if p[0] != "requirements"]
            item.user_properties.append(("requirements", ",".join(dict.fromkeys([*ids, "REF-11"]))))
            more = f" (and {len(findings) - 5} more)" if len(findings) > 5 else ""
            pytest.fail("REF-11: " + "; ".join(findings[:5]) + more, pytrace=False)
        return result

    @pytest.fixture
    def artefacts_dir(self, request) -> Path:
        """Where this test keeps a failing chaos run's files: `<reports>/chaos/<test>/`, beside the
        JSON summary (else `<rootdir>/reports`), where CI keeps them and report.html links them."""
        summary = self.value("gpujail-report")
        reports = Path(summary).parent if summary else Path(request.config.rootpath) / "reports"
        return reports / CHAOS_DIR / artefact_name(request.node.nodeid)


def purpose(item) -> str:
    """A test's one-line purpose: the first sentence of its docstring (what a person reads first)."""
    doc = " ".join((getattr(item, "function", None) and item.function.__doc__ or "").split())
    return doc.split(". ")[0].rstrip(".")[:200]


def failure_reason(message: str, lines: int = 25) -> str:
    """What a failing check said, in words: its own message (without the `AssertionError: ` prefix
    and pytest's rewritten `assert ...` explanation that follows it), all of it for a chaos run's
    verdict and chain, up to `lines` lines; a bare `assert` keeps pytest's explanation."""
    text = message.strip()
    if text.startswith("AssertionError: "):
        text = text[len("AssertionError: "):]
    kept = []
    for line in text.splitlines():
        if kept and line.startswith("assert "):
            break
        kept.append(line)
    more = len(kept) - lines
    return "\n".join(kept[:lines] + ([f"... ({more} more lines)"] if more > 0 else []))[:4000]


def requirement_ids(item) -> list[str]:
    return [i for m in item.iter_markers("req") for i in m.args]


def _match(nodeid: str, table: dict) -> str | None:
    """An expectations key names tests by node id suffix, with or without their parameters, and
    may use shell wildcards (`test_scenario[cold-race-random-*]`)."""
    for key, reason in table.items():
        pattern = "*" + key.replace("[", "[[]")   # `[` opens a character class in fnmatch
        if nodeid.endswith(key) or nodeid.split("[")[0].endswith(key) or fnmatch.fnmatchcase(nodeid, pattern):
            return reason
    return None


def _req_order(rid: str):
    family, _, n = rid.partition("-")
    return (family, int(n) if n.isdigit() else 0)


def by_requirement(results: dict[str, list]) -> dict:
    """Per requirement, in SPEC order: the counts per status and each test's entry."""
    out = {}
    for rid in sorted(results, key=_req_order):
        counts: dict[str, int] = defaultdict(int)
        for t in results[rid]:
            counts[t["status"]] += 1
        out[rid] = {"counts": dict(counts), "tests": results[rid]}
    return out


def self_check_summary(results: dict[str, list]) -> dict:
    """The harness self-checks' table and verdict: failed (the run is inconclusive), passed,
    cached (every one skipped as already checked on this host), or not run."""
    tests = {t["test"]: t for entries in results.values() for t in entries}
    failed = [t for t in tests.values() if t["status"] in ("failed", "error")]
    cached = [t for t in tests.values() if t["status"] == "skipped" and CACHED in t["reason"]]
    if failed:
        status = "failed"
        reason = (f"{len(failed)} of {len(tests)} failed, first {failed[0]['test']}: {failed[0]['reason']}; "
                  "the harness is wrong on this host, so the run says nothing about the implementation")
    elif not tests:
        status, reason = "not run", ""
    elif len(cached) == len(tests):
        status, reason = "cached", cached[0]["reason"].removeprefix("Skipped: ")
    else:
        status = "passed"
        reason = f"{len(cached)} already checked on this host" if cached else ""
    return {"status": status, "reason": reason, "requirements": by_requirement(results),
            "uncited": [r for r in REQUIREMENTS if r.startswith(HARNESS_FAMILIES) and r not in results]}


class SelfCheckCache:
    """Which self-checks passed on this host with this code: one JSON file per (host, code) key
    under the fixtures' cache directory, {node id: when}. The host is its name, kernel, machine,
    user, Python and the backend; the code is every file the self-checks run (the fake CLI, the
    world, the backends, the vocabulary, and the self-check modules themselves)."""

    def __init__(self, suite: Suite, items):
        import gpujail
        root = Path(gpujail.__file__).parent
        code = hashlib.sha256()
        files = [root / "spec.py"] + sorted({Path(i.path) for i in items if i.get_closest_marker(SELF_CHECK)})
        for sub in ("fixtures", "world", "backends"):
            base = Path(importlib.import_module(f"gpujail.{sub}").__file__).parent
            files += sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for p in files:
            code.update(str(p.relative_to(p.parents[1])).encode() + b"\0" + p.read_bytes())
        u = os.uname()
        host = f"{u.nodename} {u.release} {u.version} {u.machine} uid={os.getuid()} {sys.version.split()[0]} " \
               f"{suite.value('backend')}"
        self.key = hashlib.sha256(host.encode() + code.digest()).hexdigest()[:16]
        self.passed = self.load(self.key)

    @staticmethod
    def path(key: str) -> Path:
        from gpujail.fixtures.drivers import cache_dir
        return cache_dir() / "self-checks" / f"{key}.json"

    @classmethod
    def load(cls, key: str) -> dict[str, str]:
        try:
            return json.loads(cls.path(key).read_text())
        except (OSError, ValueError):
            return {}

    @classmethod
    def remember(cls, results: dict[str, list]) -> None:
        """Add the self-checks that passed in this run to their key's file."""
        now = datetime.datetime.now().isoformat(timespec="seconds")
        by_key: dict[str, dict] = defaultdict(dict)
        for entries in results.values():
            for t in entries:
                if t["status"] == "passed":
                    by_key[t["key"]][t["test"]] = now
        for key, passed in by_key.items():
            path = cls.path(key)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({**cls.load(key), **passed}, indent=1))
                os.replace(tmp, path)
            except OSError:   # a read-only cache: the checks run again next time
                pass


# -- the world a conformance test gets -------------------------------------------------------------

class World:
    """A fresh jail and its worker nodes, with the implementation under test."""

    def __init__(self, fleet, jail: Path, impl: str, run_dir: Path):
        self.fleet, self.jail, self.impl, self.run_dir = fleet, jail, impl, run_dir

    def start(self, node_id: str, role: str = "gpu-worker", **kw):
        from gpujail.contract import start_worker
        return start_worker(self.fleet, node_id, kw.pop("impl", self.impl), role=role, **kw)

    def node(self, node_id: str, role: str = "gpu-worker", **kw):
        from gpujail.fixtures.drivers import DEFAULT_VERSION
        return self.fleet.start(node_id, role=role, version=DEFAULT_VERSION if role == "gpu-worker" else None, **kw)

    def history(self) -> list[dict]:
        return self.fleet.history()

    def events(self, kind: str, **match) -> list[dict]:
        from gpujail.world import history
        return history.select(self.history(), kind, **match)

    @property
    def barriers(self) -> str:
        return str(self.run_dir / "barriers")


def outside_the_jail(events: list[dict]) -> list[str]:
    """Each change a start made outside the jail, in words: `worker w's start created /tmp/x`."""
    return [f"worker {e['node']}'s start {c['change']} {c['path']} outside the jail"
            for e in events if e["kind"] == "impl.outside" for c in e["changes"]]


def backend_fleet(backend: str):
    """The `Fleet` of `backend`; skips the test with the reason when this build or this host cannot
    run that backend (gpujail/backends asks the backend's own module)."""
    from gpujail import backends
    reason = backends.unavailable(backend)
    if reason:
        pytest.skip(reason)
    module = importlib.import_module(backends.MODULES[backend])
    if not hasattr(module, "Fleet"):
        pytest.skip(f"backend {backend!r} has no worker fleet: it runs its own tests (marker `model`)")
    return module.Fleet


def on_jail_fs(fleet_class, kind: str):
    """`fleet_class` on the jail file system `kind` (--jail-fs, gpujail/backends/jailfs.py); skips the
    test with the reason when this host cannot provide it (a precondition, never a pass)."""
    if kind == "local":
        return fleet_class
    from gpujail.backends import jailfs
    reason = jailfs.unavailable(kind)
    if reason:
        pytest.skip(reason)
    return jailfs.fleet_class(fleet_class, kind)
def launcher_fleet(name: str, launcher_options: dict):
    """The coordinator's `Fleet` for launcher `name` (gpujail/launchers/); skips the test with the
    reason when the launcher cannot start agents from here (no Slurm controller answers)."""
    from gpujail import launchers
    reason = launchers.unavailable(name)
    if reason:
        pytest.skip(f"launcher {name!r}: {reason}")
    return launchers.fleet_class(name, **launcher_options)
