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

This module is the entry point and stays thin, as pytest-xdist's plugin module does: the options,
the activation, and `Suite`, one object per session holding the checked options and the tables of
outcomes, made of three parts, each a module of this package: collection.py (requirements,
expectations, self-checks first), outcomes.py (one status per test, the JSON summary and
report.html) and fixtures.py (the jail, the fleet, the world).
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import defaultdict

import pytest

from gpujail import options, spec
from gpujail.options import OPTIONS, BadInput  # noqa: F401 (OPTIONS: the table, as before)
from gpujail.plugin.collection import SELF_CHECK, Collection
from gpujail.plugin.fixtures import Fixtures
from gpujail.plugin.outcomes import Outcomes

ASK = "GPUJAIL_SUITE"   # a conftest setting this to True asks the plugin to act

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
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:   # `gpujail run` has set them already
            stop_on_signals(worker=hasattr(config, "workerinput"))
        config.pluginmanager.register(Suite(config), "gpujail.suite")


STOPPED_BY = {"signal": int(signal.SIGINT)}
WORKERS: set[int] = set()   # this process's xdist workers (pids), when it is an xdist controller
REPEAT_IGNORED = 10.0       # s: a second stop signal this soon after the first is ignored


def stop_on_signals(worker: bool = False) -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does; the signal is
    remembered for the exit code. Python's default for SIGTERM is to die on the spot, skipping every
    `finally` and fixture teardown: a cancelled CI job's pytest (or each xdist worker, which gets
    the signal with its process group) would leave glusterd, its clients and the nodes running.
    `gpujail run` sets this before pytest starts; an activated suite in a plain pytest session
    does, in every process (xdist workers included) whose SIGTERM is still the default.

    An xdist controller passes the signal on to its workers at once. A signal to the controller
    alone (`timeout pytest ...`) otherwise reaches a worker as execnet's own SIGINT, 5 s after the
    controller asked it to exit and 5 s before it SIGKILLs it: a teardown longer than that, or a
    worker slow to get there on a loaded machine (seen in CI), left its daemons running. A repeat
    soon after is ignored, so that the copy a worker gets when the whole group was signalled does
    not interrupt the teardown the first one started; in a worker (`worker`) SIGINT is handled so
    too, since execnet sends that SIGINT whatever the worker is doing, its teardown included."""
    first: list[float] = []

    def handler(signum, _frame):
        now = time.monotonic()
        if first and now - first[0] < REPEAT_IGNORED:
            return
        first[:] = [now]
        STOPPED_BY["signal"] = signum
        for pid in WORKERS:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
        raise KeyboardInterrupt
    if threading.current_thread() is threading.main_thread():   # only the main thread may set them
        for s in (signal.SIGTERM, signal.SIGHUP, *([signal.SIGINT] if worker else [])):
            signal.signal(s, handler)


# -- the plugin at work -------------------------------------------------------------------------

class Suite(Collection, Outcomes, Fixtures):
    """The plugin for one session (per config, so a nested session, e.g. pytester's, keeps its own)."""

    def __init__(self, config):
        try:
            self.values, self.expectations = options.check_all(lambda name: options.value(config, name))
        except BadInput as e:
            raise pytest.UsageError(str(e)) from None
        # The start timeout, the CLI and the vendor's CDI spec, for the fleets and nodes of this
        # session (gpujail.spec.Settings); the ones before are given back when it ends.
        self.outer_settings = spec.use(options.settings(self.values))
        self.config = config
        self.by_requirement: dict[str, list] = defaultdict(list)
        self.self_checks: dict[str, list] = defaultdict(list)
        for line in ("req(*ids): the SPEC requirement IDs this test checks",
                     "kernel: needs the kernel backend",
                     "needs_cli(command): fails or stubs that `nvidia-container-cli` command: not applicable "
                     "to an implementation that never runs it (gpujail/contract.py cli_commands)",
                     "scale: a big run (128 workers); deselected unless `-m scale`",
                     "model: runs in the model backend's simulation; collected with --backend model",
                     f"{SELF_CHECK}: a harness self-check (the fake CLI, kernel facts): run first, once per host "
                     "and code version, reported apart, never counted for or against an implementation"):
            config.addinivalue_line("markers", line)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_newgateway(self, gateway):
        """A new xdist worker: its pid, for stop_on_signals to pass a stop on to (xdist asks the
        worker the same `_rinfo`, cached, when it sets the worker up)."""
        WORKERS.add(gateway._rinfo().pid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        WORKERS.discard(node.gateway._rinfo().pid)   # gone: its pid may be another process's soon

    def pytest_unconfigure(self, config):
        spec.use(self.outer_settings)

    def value(self, name: str) -> str:
        return self.values[name].text
