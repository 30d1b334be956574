"""The plugin at collection: which tests run, in which order, citing what, expected to fail how.

How this works
--------------
`Collection` is the collection half of the plugin's `Suite` (gpujail/plugin/__init__.py: a mixin,
whose `self.value`, `self.expectations` are Suite's). `pytest_collection_modifyitems`:

* deselects (and counts as deselected, never skipped) the big runs unless `-m scale`, and the
  tests of the other backend kind (marker `model` runs only with `--backend model`);
* files each test under the SPEC requirements its `req(...)` marker cites (`requirement_ids`; an
  unknown ID is a usage error) with its one-line `purpose`, as user properties the outcomes read;
* marks the harness self-checks (marker `self_check`) with their cache key, and skips those
  already checked on this host with this code (`SelfCheckCache`, `--self-checks once`); the
  implementation's expectations never apply to them;
* skips, as not applicable, a test that fails or stubs an `nvidia-container-cli` command (marker
  `needs_cli("list")`, `needs_cli("configure")`) for an implementation that never runs it
  (gpujail/contract.py `cli_commands`: direct runs no configure, the CDI ones neither; a vendor's
  expectations file may say `cli = [...]`);
* turns the expectations file into strict xfails (`_expect`: [tests], then [intermittent], then
  [requirements]; [inconclusive] is a strict xfail on `Inconclusive` only, [intermittent-inconclusive]
  a non-strict one: a pass or INCONCLUSIVE, never a violation), matching node ids by suffix or
  shell wildcard (`_match`);
* sorts the self-checks first: they are the run's precondition (xdist hands out tests in order).
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
from pathlib import Path

import pytest

from gpujail.spec import REQUIREMENTS

SELF_CHECK = "self_check"
NEEDS_CLI = "needs_cli"   # needs_cli("configure"): a test that fails or stubs that CLI command (contract.cli_commands)
CACHED = "already checked on this host"   # a self-check's skip reason when it passed here before
EXPECTED_INCONCLUSIVE = "expected inconclusive"   # starts the xfail reason of a test listed under [inconclusive]
#                                                   or [intermittent-inconclusive], then ": why"
EXPECTED_TO_FAIL = "expected to fail: "   # the xfail reason of a test listed under [tests] or by requirement
INTERMITTENT = "known intermittent: "     # ... under [intermittent]


class Collection:
    """The collection hooks of `Suite`."""

    def pytest_collection_modifyitems(self, config, items):
        # Big runs (128 workers) are opt-in: deselected (and counted as such) unless `-m scale` asks.
        if "scale" not in (config.getoption("markexpr", "") or ""):
            self._deselect(config, items, [i for i in items if i.get_closest_marker("scale")])
        # `--backend model` runs the tests written for the simulation (marker `model`), every other
        # backend runs the rest: each collects its own, and the deselected are counted, never skipped.
        on_model = self.value("backend") == "model"
        self._deselect(config, items, [i for i in items if bool(i.get_closest_marker("model")) != on_model])
        checked = SelfCheckCache(self, items) if any(i.get_closest_marker(SELF_CHECK) for i in items) else None
        from gpujail.contract import cli_commands
        runs = cli_commands(self.value("impl"), self.expectations["cli"])
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
            unused = sorted({c for m in item.iter_markers(NEEDS_CLI) for c in m.args} - runs)
            if unused:
                item.add_marker(pytest.mark.skip(reason=f"not applicable: {self.value('impl')} runs no "
                                                        f"`nvidia-container-cli {unused[0]}`, which this test fails or stubs"))
                continue
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
        # [intermittent-inconclusive] expects it to prove nothing or to pass, by timing (a fault placed
        # at a time, not at a step): a violation still fails, which a plain [intermittent] would
        # accept as an expected failure.
        from gpujail.chaos.checkers.results import Inconclusive
        for section, strict, either in (("inconclusive", True, ""),
                                        ("intermittent-inconclusive", False, " or a pass, by timing")):
            why = _match(item.nodeid, exp[section])
            if why:
                item.add_marker(pytest.mark.xfail(reason=f"{EXPECTED_INCONCLUSIVE}{either}: {why}", strict=strict,
                                                  raises=Inconclusive))
                return
        reason = _match(item.nodeid, exp["tests"])
        flaky = None if reason else _match(item.nodeid, exp["intermittent"])
        if flaky:
            item.add_marker(pytest.mark.xfail(reason=f"{INTERMITTENT}{flaky}", strict=False))
            return
        reason = reason or next((f"{i}: {exp['requirements'][i]}" for i in ids if i in exp["requirements"]), None)
        if reason:
            item.add_marker(pytest.mark.xfail(reason=f"{EXPECTED_TO_FAIL}{reason}", strict=True))


def listed(xfail_reason: str) -> dict:
    """Where the expectations file listed a test, read back from its xfail reason (`_expect`): the
    section and why, which `gpujail expectations` keeps for the non-strict ones."""
    section = ("intermittent" if xfail_reason.startswith(INTERMITTENT) else
               "inconclusive" if xfail_reason.startswith(EXPECTED_INCONCLUSIVE + ":") else
               "intermittent-inconclusive" if xfail_reason.startswith(EXPECTED_INCONCLUSIVE) else "tests or requirements")
    return {"section": section, "why": xfail_reason.split(": ", 1)[-1]}


def purpose(item) -> str:
    """A test's one-line purpose: the first sentence of its docstring (what a person reads first)."""
    doc = " ".join((getattr(item, "function", None) and item.function.__doc__ or "").split())
    return doc.split(". ")[0].rstrip(".")[:200]


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


class SelfCheckCache:
    """Which self-checks passed on this host with this code: one JSON file per (host, code) key
    under the fixtures' cache directory, {node id: when}. The host is its name, kernel, machine,
    user, Python and the backend; the code is every file the self-checks run (the fake CLI, the
    world, the backends, the vocabulary, and the self-check modules themselves)."""

    def __init__(self, suite: Collection, items):
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
