"""Reports for people: one self-contained HTML page per run, and the same tables as text.

How this works
--------------
The pytest plugin writes the JSON summary (`--gpujail-report reports/summary.json`: run info, per
requirement the outcome of each test citing it, and for chaos tests the status of each invariant;
apart, under `self_checks`, the harness self-checks' verdict and their own table per requirement)
and then calls gpujail/report_page.py's `write_html`, which writes `report.html` beside it (the test
list, every chaos run linked to its files, the scenario-by-invariant grid). Every chaos run has
already left its history, final state and timeline in `<reports>/chaos/<test>/` (the plugin's
`artefacts_dir` fixture, chaos/test_scenarios.py `verdict`).

`requirement_rows`, `invariant_rows` and `failures` are the one aggregation of a summary: the HTML
page and `gpujail run`'s printed summary (`text`) both use them. A chaos test cites every invariant;
`status_under` says what its outcome counts as under each (the plugin's per-requirement counts): a
violation blames only the invariants its verdict failed.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from gpujail.spec import REQUIREMENTS

STATUSES = ("passed", "failed", "expected-fail", "unexpected-pass", "passed-intermittent", "inconclusive",
            "expected-inconclusive", "skipped")
BAD = ("failed", "unexpected-pass", "inconclusive")   # what makes a run red
# A chaos test that proved nothing (an invariant UNKNOWN, a fault window never opened): never a pass,
# listed apart from passes and failures; red unless the expectations file lists it (expected-).
INCONCLUSIVE = ("inconclusive", "expected-inconclusive")
CHAOS_DIR = "chaos"                          # under the reports directory
# The requirements on the harness itself (SPEC: the fake CLI's fidelity, the kernel facts): checked
# by the self-checks, reported in their own table, never counted for or against an implementation.
HARNESS_FAMILIES = ("CLI-", "K-")


# -- where things are --------------------------------------------------------------------------

def artefact_name(test: str) -> str:
    """A test's directory name under reports/chaos/: its name (without the file part), made safe."""
    return re.sub(r"[^\w.+-]+", "_", test.split("::")[-1])


# -- the one aggregation of a summary ------------------------------------------------------------

def tests_of(report: dict) -> dict[str, dict]:
    """Each test once (a test citing several requirements is listed under each of them)."""
    out: dict[str, dict] = {}
    for entry in report["requirements"].values():
        for t in entry["tests"]:
            out.setdefault(t["test"], t)
    return out


def totals(report: dict) -> dict[str, int]:
    """Tests per status."""
    out: dict[str, int] = {}
    for t in tests_of(report).values():
        out[t["status"]] = out.get(t["status"], 0) + 1
    return out


def requirement_rows(report: dict) -> list[tuple[str, str, dict]]:
    """(ID, what it requires, counts per status) in the summary's order."""
    return [(rid, REQUIREMENTS.get(rid, ""), entry["counts"]) for rid, entry in report["requirements"].items()]


def invariants_of(test: dict) -> dict[str, str]:
    """A chaos test's `INV-1=PASS INV-2=FAIL ...` as a dict."""
    return dict(p.split("=", 1) for p in (test.get("invariants") or "").split())


def invariant_rows(report: dict) -> list[tuple[str, str, dict, list[dict]]]:
    """Per invariant over the chaos runs: (ID, name, counts of PASS/FAIL/UNKNOWN, the failing
    runs' test entries: their status says whether the failure was expected)."""
    from gpujail.spec import INVARIANTS
    runs = [t for t in tests_of(report).values() if t.get("invariants")]
    rows = []
    for inv, name in INVARIANTS.items():
        counts: dict[str, int] = {}
        failing = []
        for t in runs:
            status = invariants_of(t).get(inv, "UNKNOWN")
            counts[status] = counts.get(status, 0) + 1
            if status == "FAIL":
                failing.append(t)
        rows.append((inv, name, counts, failing))
    return rows


def status_under(rid: str, test: dict) -> str:
    """What a test's outcome counts as under one requirement it cites. A chaos run that failed (or
    failed as expected) on some invariants counts so only under those: under an invariant it
    checked and found held, passed; under one it could not decide (UNKNOWN), skipped (neither: the
    invariants table says UNKNOWN and why). Any other test, or a requirement that is not one of its
    invariants: its own status."""
    invs = invariants_of(test)
    if test["status"] not in ("failed", "expected-fail") or rid not in invs or "FAIL" not in invs.values():
        return test["status"]
    return {"FAIL": test["status"], "PASS": "passed"}.get(invs[rid], "skipped")


def scenario_of(test: str) -> str:
    """The scenario (or case) a chaos test ran: its parameter without the random-seed suffix."""
    m = re.search(r"\[([^\]]+?)(?:-random)?(?:-seed\+\d+)?\]$", test)
    return m.group(1) if m else test


def unknowns(report: dict) -> list[tuple[str, str, str]]:
    """(invariant, test, reason) for every chaos run that could not decide an invariant."""
    return [(inv, t["test"], (t.get("invariant_reasons") or {}).get(inv) or "no reason recorded")
            for t in tests_of(report).values() for inv, status in invariants_of(t).items() if status == "UNKNOWN"]


def window_rows(report: dict) -> list[tuple[str, str, int, int]]:
    """Per scenario and fault window (chaos/checkers/windows.py): (scenario, window, runs that opened
    it, runs). A run whose window never opened is INCONCLUSIVE, never a pass (issue 17)."""
    counts: dict[tuple[str, str], list[int]] = {}
    for t in tests_of(report).values():
        if not t.get("windows"):
            continue
        name = scenario_of(t["test"])
        for part in t["windows"].split():
            window, _, state = part.partition("=")
            c = counts.setdefault((name, window), [0, 0])
            c[0] += state == "opened"
            c[1] += 1
    return [(sc, w, opened, runs) for (sc, w), (opened, runs) in sorted(counts.items())]


def cell_table(report: dict) -> dict[str, dict]:
    """The fault table (chaos/fault_table.py) as this run covered it: cell -> {"by": tests whose run
    exercised it, "unreachable": whether its own case found the implementation never reaches it}.
    Cells that runs met outside the generated ones (e.g. `waiter`) are included."""
    from gpujail.chaos import fault_table
    from gpujail.chaos.checkers.cells import cell_id
    table = {cell_id(*c): {"by": [], "unreachable": False} for c in fault_table.cells()}
    for t in tests_of(report).values():
        for c in t.get("cells") or []:
            table.setdefault(c, {"by": [], "unreachable": False})["by"].append(t["test"])
        if t.get("unreachable"):
            table[t["unreachable"]]["unreachable"] = True
    return table


def cell_counts(table: dict[str, dict]) -> tuple[int, int, list[str]]:
    """(exercised, unreachable and not exercised, cells neither exercised nor known unreachable)."""
    exercised = [c for c, v in table.items() if v["by"]]
    unreachable = [c for c, v in table.items() if not v["by"] and v["unreachable"]]
    return len(exercised), len(unreachable), [c for c in table if c not in exercised and c not in unreachable]


def unexpected(tests: list[dict]) -> list[dict]:
    return [t for t in tests if t["status"] != "expected-fail"]


def failures(report: dict, statuses=BAD) -> list[dict]:
    return [t for t in tests_of(report).values() if t["status"] in statuses]


def counts_text(counts: dict) -> str:
    order = [s for s in STATUSES if s in counts] + sorted(set(counts) - set(STATUSES))
    return ", ".join(f"{counts[s]} {s}" for s in order)


SPEC_DOC = Path(__file__).resolve().parent / "spec.md"   # the requirements in words (package data)


def text(report: dict) -> str:
    """The run in a screenful: requirements, invariants, what failed."""
    info = report["run_info"]
    lines = [f"{info['implementation']} on the {info['backend']} backend (contract {info['contract_version']}, "
             f"seed {info['seed']}): {len(tests_of(report))} tests, {counts_text(totals(report))}", "", "requirements:"]
    checks = self_checks(report)
    if checks["status"] == "failed":
        lines[:0] = [f"HARNESS SELF-CHECKS FAILED: {checks['reason']}", ""]
    lines += requirement_lines(report)
    for rid, why in report.get("pending", {}).items():
        lines.append(f"  {rid} pending: {why}")
    inv = invariant_rows(report)
    runs = sum(inv[0][2].values()) if inv else 0
    if runs:
        lines += ["", f"invariants over {runs} chaos runs:"]
        for rid, name, counts, failing in inv:
            mark = "!" if unexpected(failing) else " "
            expected = len(failing) - len(unexpected(failing))
            lines.append(f" {mark}{rid:<7} {name:<24} " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                         + (f" ({expected} expected)" if expected else ""))
        for rid, test, why in unknowns(report):
            lines.append(f"  {rid} UNKNOWN in {test}: {why}")
    windows = [row for row in window_rows(report) if row[1] != "cell"]   # the fault table's: summed up below
    if windows:
        lines += ["", "fault windows (runs that opened each; a run that opened none of its scenario's is INCONCLUSIVE):"]
        lines += [f"  {sc:<24} {w:<24} {opened}/{runs}" for sc, w, opened, runs in windows]
    if any(t.get("cells") is not None for t in tests_of(report).values()):
        exercised, unreachable, missed = cell_counts(cell_table(report))
        lines += ["", f"fault table (chaos/fault_table.py): {exercised} cells exercised, {unreachable} unreachable "
                      f"for this implementation, {len(missed)} not exercised"
                  + (": " + ", ".join(missed[:8]) + (f" and {len(missed) - 8} more" if len(missed) > 8 else "")
                     if missed else "")]
    if checks["status"] != "not run":
        lines += ["", f"harness self-checks (the fake CLI, kernel facts; not counted for the implementation): "
                      f"{checks['status']}" + (f", {checks['reason']}" if checks["reason"] else "")]
        lines += requirement_lines(checks)
    unproven = failures(report, INCONCLUSIVE)
    if unproven:
        lines += ["", "inconclusive (proved nothing; not a pass):"]
        lines += [f"  {t['test']} ({t['status']}): " + "\n      ".join(short(t["reason"] or "")) for t in unproven]
    bad = [t for t in failures(report) + failures(checks) if t["status"] not in INCONCLUSIVE]
    if bad:
        lines += ["", "failed:"]
        for t in bad:
            lines.append(f"  {t['test']} ({t['status']})" + (f": {t['purpose']}" if t.get("purpose") else ""))
            lines += ["      " + ln for ln in short(t["reason"] or "")]
    return "\n".join(lines)


def short(reason: str, items: int = 6, width: int = 240) -> list[str]:
    """A reason's lines as the screenful shows them: a line over `width` characters that is a
    comma-separated list (the files a worker lost, ...) keeps its first `items` entries and says how
    many more. The reports (summary.json, report.html) keep it whole."""
    out = []
    for line in reason.splitlines():
        parts = line.split(", ")
        out.append(", ".join(parts[:items]) + f" and {len(parts) - items} more (all of them: summary.json)"
                   if len(line) > width and len(parts) > items else line)
    return out


def requirement_lines(section: dict) -> list[str]:
    rows = requirement_rows(section)
    width = max((len(counts_text(counts)) for _, _, counts in rows), default=0)
    lines = []
    for rid, what, counts in rows:
        mark = "!" if any(counts.get(s) for s in BAD) else " "
        lines.append(f" {mark}{rid:<7} {counts_text(counts):<{width}}  {what}")
    if section.get("uncited"):
        lines.append(f"  not checked by any test that ran: {', '.join(section['uncited'])}")
    return lines


def self_checks(report: dict) -> dict:
    """The harness self-checks' part of a summary (an empty one for a summary written without them)."""
    return report.get("self_checks") or {"status": "not run", "reason": "", "requirements": {}, "uncited": []}


# -- the HTML page (gpujail/report_page.py) ----------------------------------------------------

def reproduce_command(test: str, events: list[dict], run_info: dict) -> str:
    """The command that replays a chaos test's run: `gpujail reproduce` for a scenario file, the
    pytest node id otherwise (scenarios built in code, e.g. the CLI error at each failpoint, and any
    run on another backend than the kernel's: `reproduce` runs only there); where the run was (its
    summary's `run_info`): on its jail file system (a run of --jail-fs gluster replayed on a local
    directory shows nothing) and through its launcher (a race between cluster nodes is not one
    between this host's namespaces)."""
    begin = next((e for e in events if e.get("kind") == "chaos.begin"), {})
    impl, backend = run_info["implementation"], run_info.get("backend", "kernel")
    on = f" --jail-fs {run_info['jail_fs']}" if run_info.get("jail_fs", "local") != "local" else ""
    if run_info.get("launcher"):
        on += f" --launcher {run_info['launcher']}" + (f" --nodes {run_info['nodes']}" if run_info.get("nodes") else "")
    from gpujail.chaos.scenario import JAILFS_DIR, names
    if backend == "kernel" and ("::test_scenario[" in test and begin.get("scenario") in names()
                                or "::test_network_fault[" in test and begin.get("scenario") in names(JAILFS_DIR)):
        flag = " --random" if "-random-seed+" in test else ""
        sched = next((e for e in events if e.get("kind") == "sched.begin"), None)   # a run under --schedule
        flag += f" --schedule {shlex.quote(sched['strategy'])}" if sched else ""
        return (f"gpujail reproduce {begin['scenario']} --impl {shlex.quote(impl)} --seed {begin.get('seed', 0)}"
                f"{flag}{on}")
    on = f" --backend {backend}{on}" if backend != "kernel" else on
    return f"gpujail run --impl {shlex.quote(impl)}{on} -- {shlex.quote(test)}"
