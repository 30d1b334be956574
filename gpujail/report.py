"""Reports for people: one self-contained HTML page per run, and the same tables as text.

How this works
--------------
The pytest plugin writes the JSON summary (`--gpujail-report reports/summary.json`: run info, per
requirement the outcome of each test citing it, and for chaos tests the status of each invariant;
apart, under `self_checks`, the harness self-checks' verdict and their own table per requirement)
and then calls `write_html`, which writes `report.html` beside it. Failing chaos runs have already
left their history, final state and timeline in `<reports>/chaos/<test>/` (the plugin's
`artefacts_dir` fixture); the
page judges each history again with the checker (pure, so the verdict is the one the test saw) and
puts its timeline SVG inline with the causal chain in words, so the page needs no other file.

`requirement_rows`, `invariant_rows` and `failures` are the one aggregation of a summary: the HTML
page and `gpujail run`'s printed summary (`text`) both use them.
"""
from __future__ import annotations

import html
import json
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
        m = re.search(r"\[([^\]]+?)(?:-random)?(?:-seed\+\d+)?\]$", t["test"])
        name = m.group(1) if m else t["test"]
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


# -- the HTML page -----------------------------------------------------------------------------

def esc(value) -> str:
    return html.escape(str(value), quote=True)


def chaos_runs(report: dict, root: Path) -> list[dict]:
    """The chaos runs of this report that left artefacts (the failing ones), judged again."""
    from gpujail.chaos import checker, timeline
    from gpujail.world import history
    out = []
    for t in tests_of(report).values():
        d = root / CHAOS_DIR / artefact_name(t["test"])
        if not t.get("invariants") or t["status"] not in ("failed", "expected-fail") or not (d / "history.jsonl").exists():
            continue
        events = history.load(str(d / "history.jsonl"))
        final = json.loads((d / "final_state.json").read_text()) if (d / "final_state.json").exists() else None
        verdict = checker.check(events, final)
        out.append({"test": t, "dir": d, "verdict": verdict, "svg": timeline.svg(events, verdict),
                    "reproduce": reproduce_command(t["test"], events, report["run_info"]["implementation"])})
    return out


def reproduce_command(test: str, events: list[dict], impl: str) -> str:
    """The command that replays a chaos test's run: `gpujail reproduce` for a scenario file, the
    pytest node id otherwise (scenarios built in code, e.g. the CLI error at each failpoint)."""
    begin = next((e for e in events if e.get("kind") == "chaos.begin"), {})
    from gpujail.chaos.scenario import names
    if "::test_scenario[" in test and begin.get("scenario") in names():
        flag = " --random" if "-random-seed+" in test else ""
        sched = next((e for e in events if e.get("kind") == "sched.begin"), None)   # a run under --schedule
        flag += f" --schedule {shlex.quote(sched['strategy'])}" if sched else ""
        return f"gpujail reproduce {begin['scenario']} --impl {shlex.quote(impl)} --seed {begin.get('seed', 0)}{flag}"
    return f"gpujail run --impl {shlex.quote(impl)} -- {shlex.quote(test)}"


def requirement_table(section: dict) -> list[str]:
    """A summary's (or its self-checks') requirements as HTML table rows, then the uncited ones."""
    cols = STATUSES
    req = ["<table class='gj-t'><tr><th>requirement</th><th>what</th>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for rid, what, counts in requirement_rows(section):
        cls = "gj-bad" if any(counts.get(s) for s in BAD) else "gj-xf" if counts.get("expected-fail") else ""
        req.append(f"<tr class='{cls}'><td>{esc(rid)}</td><td>{esc(what)}</td>"
                   + "".join(f"<td class='gj-n'>{counts.get(c, '') or ''}</td>" for c in cols) + "</tr>")
    req.append("</table>")
    if section.get("uncited"):
        req.append(f"<p>Not checked by any test that ran: {esc(', '.join(section['uncited']))}</p>")
    return req


CSS = """
body {font-family: sans-serif; margin: 1em 2em; color: #212121}
h1 {font-size: 1.4em} h2 {font-size: 1.15em; margin-top: 1.6em} h3 {font-size: 1em}
table.gj-t {border-collapse: collapse; font-size: 13px}
table.gj-t td, table.gj-t th {border: 1px solid #ddd; padding: 2px 8px; text-align: left}
table.gj-t td.gj-n {text-align: right}
tr.gj-bad td {background: #ffebee} tr.gj-xf td {background: #fff8e1}
.gj-pass {color: #2e7d32; font-weight: bold} .gj-fail {color: #c62828; font-weight: bold}
pre {background: #fafafa; border: 1px solid #eee; padding: .6em; overflow-x: auto; font-size: 12px}
.gj-plot {overflow-x: auto}
code {background: #f5f5f5; padding: 0 3px}
"""


def cell_html(report: dict) -> str:
    """The fault table as exercised: one row per role and step, one column per neighbours' state;
    each cell says how many runs exercised it, or that it is unreachable here, or red: not exercised."""
    from gpujail.chaos.checkers.cells import NEIGHBOURS
    table = cell_table(report)
    exercised, unreachable, missed = cell_counts(table)
    rows = sorted({c.rsplit("/", 1)[0] for c in table})
    out = [f"<h2>Fault table</h2><p>Who fails (role), where (step), with the neighbours in which state "
           f"(chaos/fault_table.py): {exercised} cells exercised, {unreachable} unreachable for this "
           f"implementation, {len(missed)} not exercised.</p>",
           "<table class='gj-t'><tr><th>role / step</th>" + "".join(f"<th>{n} ready</th>" for n in NEIGHBOURS) + "</tr>"]
    for row in rows:
        out.append(f"<tr><td>{esc(row)}</td>")
        for n in NEIGHBOURS:
            v = table.get(f"{row}/{n}")
            if v is None:   # a role and step only other runs met, not with these neighbours
                out.append("<td></td>")
            elif v["by"]:
                out.append(f"<td class='gj-n' title='{esc(', '.join(v['by'][:20]))}'>{len(v['by'])} runs</td>")
            elif v["unreachable"]:
                out.append("<td class='gj-xf'>unreachable</td>")
            else:
                out.append("<td class='gj-bad'>not exercised</td>")
        out.append("</tr>")
    return "".join(out) + "</table>"


def write_html(report: dict, path, root: Path | None = None) -> Path:
    """Write the run's page to `path`; chaos artefacts are looked up under `root` (default: the
    page's directory)."""
    from gpujail.chaos import timeline
    path = Path(path)
    root = path.parent if root is None else root
    info = report["run_info"]
    bad = failures(report)
    head = "FAIL" if bad else "PASS"
    judged = chaos_runs(report, root)
    shown = {r["test"]["test"] for r in judged}

    def link(test: str) -> str:
        return f"<a href='#{esc(artefact_name(test))}'>{esc(test)}</a>" if test in shown else esc(test)

    req = requirement_table(report)
    for rid, why in report.get("pending", {}).items():
        req.append(f"<p>{esc(rid)} pending: {esc(why)}</p>")
    checks = self_checks(report)
    if checks["status"] == "failed":
        head = "ERROR"
    inv = ["<table class='gj-t'><tr><th>invariant</th><th></th><th>PASS</th><th>FAIL</th><th>UNKNOWN</th>"
           "<th>failing runs</th></tr>"]
    for rid, name, counts, failing in invariant_rows(report):
        cls = "gj-bad" if unexpected(failing) else "gj-xf" if failing else ""
        inv.append(f"<tr class='{cls}'><td>{esc(rid)}</td><td>{esc(name)}</td>"
                   + "".join(f"<td class='gj-n'>{counts.get(s, '') or ''}</td>" for s in ("PASS", "FAIL", "UNKNOWN"))
                   + "<td>" + "<br>".join(f"{link(t['test'])} ({esc(t['status'])})" for t in failing) + "</td></tr>")
    inv.append("</table>")
    inv += [f"<p>{esc(rid)} UNKNOWN in {link(test)}: {esc(why)}</p>" for rid, test, why in unknowns(report)]
    fails = [f"<tr class='{'gj-bad' if t['status'] in BAD else 'gj-xf'}'><td>{link(t['test'])}"
             + (f"<br><small>{esc(t['purpose'])}</small>" if t.get("purpose") else "")
             + f"</td><td>{esc(t['status'])}</td><td><pre>{esc(t['reason'])}</pre></td></tr>"
             for t in failures(report, ("failed", "unexpected-pass", "expected-fail")) + failures(checks)]
    unproven = [f"<tr class='{'gj-bad' if t['status'] in BAD else 'gj-xf'}'><td>{link(t['test'])}</td>"
                f"<td>{esc(t['status'])}</td><td><pre>{esc(t['reason'])}</pre></td></tr>"
                for t in failures(report, INCONCLUSIVE)]
    cells = cell_html(report) if any(t.get("cells") is not None for t in tests_of(report).values()) else ""
    runs = []
    for r in judged:
        t = r["test"]
        runs.append(f"<h3 id='{esc(artefact_name(t['test']))}'>{esc(t['test'])}: {esc(t['status'])}</h3>"
                    f"<p>Replay: <code>{esc(r['reproduce'])}</code>. Files: <code>{esc(r['dir'])}/</code> "
                    f"(history.jsonl, final_state.json, timeline.html)</p>"
                    f"<pre>{esc(r['verdict'].summary())}</pre><div class='gj-plot'>{r['svg']}</div>")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpujail run: {esc(info['implementation'])}: {head}</title>
<style>{CSS}{timeline.LEGEND_CSS}</style></head>
<body>
<h1>gpujail run: <code>{esc(info['implementation'])}</code> on the {esc(info['backend'])} backend:
<span class="{'gj-pass' if head == 'PASS' else 'gj-fail'}">{head}</span></h1>
<p>Contract {esc(info['contract_version'])}, seed {esc(info['seed'])}: {len(tests_of(report))} tests,
{esc(counts_text(totals(report)))}.</p>
{f"<p class='gj-fail'>Harness self-checks failed: {esc(checks['reason'])}</p>" if head == "ERROR" else ""}
<h2>Requirements</h2>
<p>Each requirement in words, with the tests that check it: <a href="{esc(SPEC_DOC.as_uri())}">gpujail/spec.md</a>
(installed with the package: <code>{esc(str(SPEC_DOC))}</code>).</p>
{''.join(req)}
<h2>Invariants over the chaos runs</h2>
{''.join(inv)}
{cells}
<h2>Harness self-checks</h2>
<p>The fake CLI's fidelity and the kernel facts the suite stands on: a precondition of the run, not counted
for or against the implementation. {esc(checks['status'])}{(": " + esc(checks['reason'])) if checks['reason'] else "."}</p>
{''.join(requirement_table(checks)) if checks['requirements'] else ''}
<h2>Failures</h2>
{('<table class="gj-t"><tr><th>test</th><th>status</th><th>reason</th></tr>' + ''.join(fails) + '</table>')
 if fails else '<p>None.</p>'}
<h2>Inconclusive</h2>
<p>Chaos runs that proved nothing (an invariant left UNKNOWN, a fault window never opened): never a pass; red
unless the implementation's expectations file lists them under [inconclusive].</p>
{('<table class="gj-t"><tr><th>test</th><th>status</th><th>why</th></tr>' + ''.join(unproven) + '</table>')
 if unproven else '<p>No run was inconclusive.</p>'}
<h2>Chaos runs that violated an invariant</h2>
{(f"<p>Each: the checker's verdict and causal chain, and the timeline: one lane per worker, time since the "
  f"run's first event.</p>{timeline.legend()}" + ''.join(runs)) if runs else '<p>None.</p>'}
</body></html>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
