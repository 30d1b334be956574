"""The plugin's fixtures: the implementation, a jail, a fleet on the chosen backend, and the world.

How this works
--------------
`Fixtures` is the fixtures half of the plugin's `Suite` (gpujail/plugin/__init__.py: a mixin, whose
`self.value`, `self.values` are Suite's). `impl` and `workers` are the options; `jail` a fresh jail
image under the test's tmp_path; `fleet` kernel nodes on it; `fleet_class` the chosen backend's
Fleet (`backend_fleet`), on the chosen jail file system (`on_jail_fs`) or made by a launcher's node
agents (`launcher_fleet`), each skipping the test with the reason when this host cannot run it (a
precondition, never a pass); `open_world` and `world` a `World`: a jail, its fleet and the
implementation under test; `artefacts_dir` where a failing chaos run keeps its files.

A test that used the `world` and passed its own checks still fails, filed under REF-11, when a
start changed anything outside the jail (`pytest_runtest_call`, `outside_the_jail`: what each
node's copy-on-write view of the host saw).
"""
from __future__ import annotations

import importlib
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpujail import options
from gpujail.report import CHAOS_DIR, artefact_name


class Fixtures:
    """The fixtures of `Suite`, and its check that a start changed nothing outside the jail."""

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
        """Where this test keeps a chaos run's files: `<reports>/chaos/<test>/` beside the JSON summary
        (a `gpujail run`'s own directory), where report.html links them. A plain pytest session has
        no summary: `<rootdir>/reports/chaos/<what it ran against>/<test>/`, so that the next session
        (run-tests runs the same tests against each implementation, jail file system and launcher in
        turn) does not overwrite a failing run's history."""
        summary = self.value("gpujail-report")
        if summary:
            return Path(summary).parent / CHAOS_DIR / artefact_name(request.node.nodeid)
        ran_against = [self.value("impl")] + [f"{name}={self.value(name)}" for name in ("backend", "jail-fs", "launcher")
                                              if self.value(name) != options.BY_NAME[name].default]
        return (Path(request.config.rootpath) / "reports" / CHAOS_DIR / artefact_name(",".join(ran_against))
                / artefact_name(request.node.nodeid))


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
    from gpujail.backends import jailfs, jailfs_fleet
    reason = jailfs.unavailable(kind)
    if reason:
        pytest.skip(reason)
    return jailfs_fleet.fleet_class(fleet_class, kind)


def launcher_fleet(name: str, launcher_options: dict):
    """The coordinator's `Fleet` for launcher `name` (gpujail/launchers/); skips the test with the
    reason when the launcher cannot start agents from here (no Slurm controller answers)."""
    from gpujail import launchers
    reason = launchers.unavailable(name)
    if reason:
        pytest.skip(f"launcher {name!r}: {reason}")
    return launchers.fleet_class(name, **launcher_options)
