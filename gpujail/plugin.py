"""The pytest plugin: options, the `req` marker, expectations as strict xfails, the JSON summary.

How this works
--------------
Installed with the package (entry point `pytest11`), so a vendor runs
`pytest --pyargs conformance --impl 'bash mine.sh -j {jail}'` without cloning. Options live in one
group; each is also an ini key and an environment variable (command line > environment > ini).

* `req("REF-5", ...)` names the SPEC requirements a test checks; an unknown ID is a collection error.
* `--expectations FILE` (TOML, in the manner of web-platform-tests metadata) lists, per
  implementation, the requirement IDs and tests expected to fail, each with the reason. They become
  strict xfails: the run is green exactly when the implementation fails what it should, and an
  unexpected pass is reported as a failure.
* `--gpujail-report FILE` writes a JSON summary per requirement (passed, failed, expected-fail,
  skipped with reasons), with the run info (implementation, backend, contract version), and
  `report.html` beside it for people (conformance/report.py); pytest's own `--junitxml` gives the
  per-test report.
* The `world` fixture gives a test a fresh jail and a fleet of worker nodes on the chosen backend,
  and starts the implementation under test as a worker through the contract.
"""
from __future__ import annotations

import fnmatch
import json
import os
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

from gpujail.spec import PENDING, REQUIREMENTS

OPTIONS = [  # (name, env, default, help)
    ("impl", "GPUJAIL_IMPL", "reference",
     "implementation under test: reference, legacy, direct, example-shell, or a command string "
     "with {jail} {node} {role}"),
    ("backend", "GPUJAIL_BACKEND", "kernel", "kernel | model | docker"),
    ("workers", "GPUJAIL_WORKERS", "8", "parallel workers for multi-worker tests"),
    ("seed", "GPUJAIL_TEST_SEED", "0", "seed for randomised schedules"),
    ("expectations", "GPUJAIL_EXPECTATIONS", "", "TOML file of expected failures (strict xfail)"),
    ("gpujail-report", "GPUJAIL_REPORT", "", "write a JSON summary per requirement to this file"),
]


def pytest_addoption(parser):
    group = parser.getgroup("gpujail", "GPU driver mounts on a shared jail (conformance and chaos)")
    for name, env, default, help_ in OPTIONS:
        group.addoption(f"--{name}", dest=name.replace("-", "_"), default=None,
                        help=f"{help_} (env {env}, ini {name.replace('-', '_')}; default {default!r})")
        parser.addini(name.replace("-", "_"), help_, default=default)


def option(config, name: str) -> str:
    """Command line, then environment, then ini."""
    key = name.replace("-", "_")
    env = next(e for n, e, _, _ in OPTIONS if n == name)
    value = config.getoption(key)
    if value is None:
        value = os.environ.get(env)
    if value is None:
        value = config.getini(key)
    return str(value)


def pytest_configure(config):
    config.addinivalue_line("markers", "req(*ids): the SPEC requirement IDs this test checks")
    config.addinivalue_line("markers", "kernel: needs the kernel backend")
    config.addinivalue_line("markers", "scale: a big run (128 workers); deselected unless `-m scale`")
    config.addinivalue_line("markers", "model: runs in the model backend's simulation; collected with --backend model")
    backend = option(config, "backend")
    from gpujail.backends import NAMES
    if backend not in NAMES:
        raise pytest.UsageError(f"--backend {backend!r}: expected one of {', '.join(NAMES)}")
    for name in ("workers", "seed"):
        value = option(config, name)
        if not value.isdigit():
            raise pytest.UsageError(f"--{name} {value!r}: expected a non-negative integer")
    check_impl(option(config, "impl"))
    config._gpujail_expectations = load_expectations(option(config, "expectations"))
    config._gpujail_results = Results()
    config.pluginmanager.register(config._gpujail_results)


def check_impl(impl: str) -> None:
    """An unknown implementation is one usage error up front, not a failure in every test."""
    import shlex
    import shutil

    from gpujail.contract import BUNDLED, UnknownImplementation, command_for
    try:
        argv = command_for(impl, "/jail", "node", "gpu-worker")
    except UnknownImplementation as e:
        raise pytest.UsageError(f"--impl {impl!r}: {e}") from None
    if impl not in BUNDLED and not impl.startswith("mutant:") and "/" not in argv[0] and not shutil.which(argv[0]):
        raise pytest.UsageError(f"--impl {impl!r}: {shlex.quote(argv[0])} is neither a bundled implementation "
                                f"({', '.join(BUNDLED)}, mutant:NAME) nor a command on PATH")


def load_expectations(path: str) -> dict:
    if not path:
        return {"requirements": {}, "tests": {}, "intermittent": {}}
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise pytest.UsageError(f"--expectations {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise pytest.UsageError(f"--expectations {path}: {e}") from None
    unknown = sorted(set(data) - {"implementation", "requirements", "tests", "intermittent"})
    if unknown:
        raise pytest.UsageError(f"--expectations {path}: unknown section(s) {', '.join(unknown)}")
    bad = sorted(set(data.get("requirements", {})) - set(REQUIREMENTS))
    if bad:
        raise pytest.UsageError(f"--expectations {path}: unknown requirement ID(s) {', '.join(bad)}")
    return {"requirements": data.get("requirements", {}), "tests": data.get("tests", {}),
            "intermittent": data.get("intermittent", {})}


def requirement_ids(item) -> list[str]:
    return [i for m in item.iter_markers("req") for i in m.args]


def pytest_collection_modifyitems(config, items):
    # Big runs (128 workers) are opt-in: deselected (and counted as such) unless `-m scale` asks.
    if "scale" not in (config.getoption("markexpr", "") or ""):
        big = [i for i in items if i.get_closest_marker("scale")]
        if big:
            config.hook.pytest_deselected(items=big)
            items[:] = [i for i in items if not i.get_closest_marker("scale")]
    # `--backend model` runs the tests written for the simulation (marker `model`), every other
    # backend runs the rest: each collects its own, and the deselected are counted, never skipped.
    on_model = option(config, "backend") == "model"
    other = [i for i in items if bool(i.get_closest_marker("model")) != on_model]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [i for i in items if i not in other]
    exp = config._gpujail_expectations
    for item in items:
        ids = requirement_ids(item)
        unknown = [i for i in ids if i not in REQUIREMENTS]
        if unknown:
            raise pytest.UsageError(f"{item.nodeid}: unknown requirement ID(s) {', '.join(unknown)} "
                                    "(see gpujail/spec.py)")
        item.user_properties.append(("requirements", ",".join(ids)))
        # A test named under [tests] is a strict expected failure, even where a wider [intermittent]
        # pattern also matches it; then [intermittent] (wpt's [PASS, FAIL]); then [requirements].
        reason = _match(item.nodeid, exp["tests"])
        flaky = None if reason else _match(item.nodeid, exp["intermittent"])
        if flaky:
            item.add_marker(pytest.mark.xfail(reason=f"known intermittent: {flaky}", strict=False))
            continue
        reason = reason or next((f"{i}: {exp['requirements'][i]}" for i in ids if i in exp["requirements"]), None)
        if reason:
            item.add_marker(pytest.mark.xfail(reason=f"expected to fail: {reason}", strict=True))


def _match(nodeid: str, table: dict) -> str | None:
    """An expectations key names tests by node id suffix, with or without their parameters, and
    may use shell wildcards (`test_scenario[cold-race-random-*]`)."""
    for key, reason in table.items():
        pattern = "*" + key.replace("[", "[[]")   # `[` opens a character class in fnmatch
        if nodeid.endswith(key) or nodeid.split("[")[0].endswith(key) or fnmatch.fnmatchcase(nodeid, pattern):
            return reason
    return None


class Results:
    """Outcomes per requirement for one session (registered per config, so a nested session, e.g.
    pytester's, keeps its own). One outcome per test: the worst of its phases."""

    def __init__(self):
        self.by_requirement = defaultdict(list)

    def pytest_runtest_logreport(self, report):
        ids = dict(report.user_properties).get("requirements", "")
        if report.when != "call" and report.outcome == "passed":
            return
        if hasattr(report, "wasxfail"):   # skipped: failed as expected; passed: an intermittent passed
            status = "expected-fail" if report.skipped else "passed-intermittent"
        elif report.failed and "XPASS(strict)" in report.longreprtext:
            status = "unexpected-pass"
        else:
            status = report.outcome
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2]
        elif report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            reason = (crash.message if crash else report.longreprtext.strip()[-300:]).splitlines()[0][:300]
        entry = {"test": report.nodeid, "status": status, "reason": reason, "duration": round(report.duration, 3)}
        if "invariants" in dict(report.user_properties):   # a chaos run: each invariant's status
            entry["invariants"] = dict(report.user_properties)["invariants"]
        for rid in ids.split(",") if ids else ["(none)"]:
            self.by_requirement[rid].append(entry)


def pytest_sessionfinish(session):
    config = session.config
    path = option(config, "gpujail-report")
    if not path or hasattr(config, "workerinput"):   # xdist workers: the controller writes it
        return
    from gpujail.spec import CONTRACT_VERSION
    summary = {}
    results = config._gpujail_results.by_requirement
    for rid in sorted(results, key=_req_order):
        tests = results[rid]
        counts = defaultdict(int)
        for t in tests:
            counts[t["status"]] += 1
        summary[rid] = {"counts": dict(counts), "tests": tests}
    report = {"run_info": {"implementation": option(config, "impl"), "backend": option(config, "backend"),
                           "contract_version": CONTRACT_VERSION, "seed": option(config, "seed")},
              "requirements": summary,
              "uncited": [r for r in REQUIREMENTS if r not in summary and r not in PENDING],
              "pending": {r: why for r, why in PENDING.items()}}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))
    # for people: report.html beside the summary
    from gpujail.report import write_html
    write_html(report, Path(path).with_name("report.html"))


def _req_order(rid: str):
    family, _, n = rid.partition("-")
    return (family, int(n) if n.isdigit() else 0)


# -- fixtures ---------------------------------------------------------------------------------

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


@pytest.fixture
def impl(request) -> str:
    return option(request.config, "impl")


def fleet_class(backend: str):
    """The `Fleet` of `backend`; skips the test with the reason when this build or this host cannot
    run that backend (gpujail/backends.py asks the backend's own module)."""
    import importlib

    from gpujail import backends
    reason = backends.unavailable(backend)
    if reason:
        pytest.skip(reason)
    module = importlib.import_module(backends.MODULES[backend])
    if not hasattr(module, "Fleet"):
        pytest.skip(f"backend {backend!r} has no worker fleet: it runs its own tests (conformance/test_model_backend.py)")
    return module.Fleet


def open_fleet(jail: Path, run_dir: Path, seed: str = "0", backend: str = "kernel"):
    """A fleet of `backend` on `jail` that records into `run_dir` (history, barriers); skips the
    test with the reason when this host cannot run that backend."""
    return fleet_class(backend).recording(jail, run_dir, seed)


@pytest.fixture
def world(request, tmp_path, impl):
    from gpujail.fixtures.jail import make_jail
    backend_fleet = fleet_class(option(request.config, "backend"))   # skips before building a jail
    jail = make_jail(tmp_path / "jail")
    with backend_fleet.recording(jail, tmp_path / "run", option(request.config, "seed")) as fleet:
        yield World(fleet, jail, impl, tmp_path / "run")
