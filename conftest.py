"""Shared fixtures: a fresh jail per test, a fleet of kernel-backend nodes on it, the run's history.

Each test gets its own jail, history file and barrier directory under its own tmp_path, so tests
run in parallel under `pytest -n auto` without sharing a jail, a lock or a temp directory.
"""
from __future__ import annotations

import os

import pytest
from gpujail.fixtures.jail import make_jail

from gpujail.plugin import open_fleet

# The suite's plugin (also an installed `pytest11` entry point under the same name, so pytest
# registers it once either way).
pytest_plugins = ["gpujail.plugin"]


@pytest.fixture
def jail(tmp_path):
    return make_jail(tmp_path / "jail")


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    (d / "barriers").mkdir(parents=True)
    return d


@pytest.fixture
def fleet(jail, run_dir):
    """Kernel-backend nodes on `jail`; all killed (namespaces, mounts, processes) at teardown."""
    with open_fleet(jail, run_dir) as f:
        yield f


def pytest_configure(config):
    # CI explores the same Hypothesis examples every run (a red CI is then reproducible); a
    # developer's run keeps exploring new ones.
    from hypothesis import settings
    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")
