"""The plugin's outcomes and reports: one status per test, per requirement, and the JSON summary.

How this works
--------------
`Outcomes` is the outcomes half of the plugin's `Suite` (gpujail/plugin/__init__.py: a mixin, whose
`self.value`, `self.by_requirement`, `self.self_checks` are Suite's).

* `pytest_runtest_makereport`: a test that failed because the launcher's cluster cannot run the
  agents is a skip with the launcher's line (the run's `unavailable`, exit 3), and the session
  stops; a strict XPASS of a chaos run says the run's verdict in its log; a test expected to fail
  that raised `Inconclusive` is inconclusive, not an expected failure.
* `pytest_runtest_logreport`: one outcome per test, the worst of its phases, in words a report
  reads (expected-fail, expected-inconclusive, passed-intermittent, unexpected-pass, inconclusive,
  and pytest's own), with the reason (`failure_reason`) and a chaos run's invariants, windows and
  fault-table cells, filed under each requirement the test cites (a failed chaos run counted as
  failed only under the invariants its verdict failed); the self-checks in a table of their own.
* `pytest_sessionfinish` (the xdist controller, not its workers): the self-checks' verdict
  (`self_check_summary`: a failing one makes the run an error, since the harness itself is wrong
  here), the passes remembered (collection.py `SelfCheckCache`), and with `--gpujail-report FILE`
  the JSON summary (`by_requirement`, in SPEC order) and report.html beside it (gpujail/report.py).
* `pytest_terminal_summary`: the self-checks' verdict, one line.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from gpujail.plugin.collection import CACHED, EXPECTED_INCONCLUSIVE, EXPECTED_TO_FAIL, SELF_CHECK, SelfCheckCache, listed
from gpujail.report import HARNESS_FAMILIES, status_under
from gpujail.report_page import write_html
from gpujail.spec import CONTRACT_VERSION, PENDING, REQUIREMENTS

UNAVAILABLE = "the launcher's cluster cannot run the agents: "   # a test's skip reason when so (then exit 3)


class Outcomes:
    """The outcome and report hooks of `Suite`."""

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
        if hasattr(report, "wasxfail") and report.wasxfail.startswith(EXPECTED_TO_FAIL) and call.excinfo:
            from gpujail.chaos.checkers.results import Inconclusive
            if call.excinfo.errisinstance(Inconclusive):
                # Expected to fail, but the run proved nothing: that is no failure as expected. Only
                # [inconclusive], [intermittent-inconclusive] (and [intermittent], which promises
                # nothing) accept such a run.
                report.outcome, report.longrepr = "failed", f"{report.wasxfail}; but {call.excinfo.value}"
                del report.wasxfail
        if report.failed and call.excinfo is not None and self.value("launcher"):
            from gpujail.launchers.coordinator import launch_failure
            failure = launch_failure(call.excinfo.value)
            if failure is not None and failure.outcome == "backend":
                reason = f"{UNAVAILABLE}{self.value('launcher')}: {str(failure).splitlines()[0]}"
                report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0, reason)
                item.session.shouldstop = reason
        return report

    def pytest_runtest_logreport(self, report):
        """One outcome per test (the worst of its phases), per requirement it cites; the
        self-checks' in their own table."""
        props = dict(report.user_properties)
        if report.when != "call" and report.outcome == "passed":
            return
        where = listed(report.wasxfail) if hasattr(report, "wasxfail") else None   # its expectations entry
        if where:   # skipped: failed as expected; passed: an intermittent passed
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
            reason = props.get("inconclusive", "") + (f" (listed: {where['why']})"
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
        if where:   # which section of the expectations file listed it, and why
            entry["listed"] = where
        if "invariants" in props:   # a chaos run: each invariant's status, and why where not PASS
            entry["invariants"] = props["invariants"]
            entry["invariant_reasons"] = props.get("invariant_reasons", {})
        if "windows" in props:      # and each fault window its scenario declares: opened or closed,
            entry["windows"] = props["windows"]
            entry["window_notes"] = props.get("window_notes", {})   # where, or why not
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
                               **({"jail_fs": self.value("jail-fs")} if self.value("jail-fs") != "local" else {}),
                               **({"launcher": self.value("launcher")} if self.value("launcher") else {}),
                               **({"nodes": self.value("nodes")} if self.value("launcher") and self.value("nodes") else {})},
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


def _req_order(rid: str):
    family, _, n = rid.partition("-")
    return (family, int(n) if n.isdigit() else 0)


def by_requirement(results: dict[str, list]) -> dict:
    """Per requirement, in SPEC order: the counts per status and each test's entry. A chaos run
    counts as failed only under the invariants its verdict failed (gpujail/report.py `status_under`)."""
    out = {}
    for rid in sorted(results, key=_req_order):
        counts: dict[str, int] = defaultdict(int)
        for t in results[rid]:
            counts[status_under(rid, t)] += 1
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
