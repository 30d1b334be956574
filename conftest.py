"""The self-tests (tests/) ask for the gpujail plugin's fixtures: a fresh jail per test (`jail`), a
fleet of kernel-backend nodes on it (`fleet`), the run's history and barriers (`run_dir`), the
implementation under test (`impl`).

Each test gets its own jail, history file and barrier directory under its own tmp_path, so tests
run in parallel under `pytest -n auto` without sharing a jail, a lock or a temp directory.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

from gpujail import spec

# The plugin is installed (entry point `pytest11`) but quiet until asked; this asks (see
# gpujail/plugin/__init__.py). `pytest_plugins` loads it even where entry points are not autoloaded.
pytest_plugins = ["gpujail.plugin"]
GPUJAIL_SUITE = True


def pytest_configure(config):
    # CI explores the same Hypothesis examples every run (a red CI is then reproducible); a
    # developer's run keeps exploring new ones.
    from hypothesis import settings
    settings.register_profile("ci", derandomize=True, print_blob=True)
    if os.environ.get("CI"):
        settings.load_profile("ci")


@pytest.fixture
def use_settings():
    """`use_settings(cli_target=..., ...)`: the run's settings (gpujail.spec.Settings: what --cli,
    --cdi-spec and --start-timeout set) with these changes, for this test only."""
    outer = spec.settings()
    yield lambda **changes: spec.use(dataclasses.replace(outer, **changes))
    spec.use(outer)
