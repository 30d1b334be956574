"""report.html: one self-contained page per run, from the JSON summary and the chaos runs' files.

How this works
--------------
`write_html(summary, path)` (called by the plugin at the end of a session) writes one HTML page
with no script and no external asset, laid out as Jepsen's and WPT's result pages are: from the
verdict at the top, one click to any test and any chaos run.

* The verdict, and a line of links: each failing test, then each section.
* The test list (`test_list`): every test once, grouped by outcome (failures first) and by suite,
  with its duration and, for a non-pass, its reason's first line (the whole reason stays in
  summary.json and in the failures table); a skipped test with its skip reason.
* The chaos runs (`chaos_runs`, `run_table`): every chaos test of the summary (a test with
  invariants), passing ones too. Each kept its files in `<reports>/chaos/<test>/` (history.jsonl,
  final_state.json, timeline.html: chaos/test_scenarios.py `verdict`, chaos/runner.py
  `ChaosRun.keep`); where each declared fault window opened, or why it did not, comes from the
  summary (the test recorded it); only a failed run's history is judged again with the checker
  (pure, so the verdict is the one the test saw), for its chain and timeline. Files are linked by
  paths relative to the page (the reports directory moves as one).
* The picture (`grid_svg`): one row per chaos run, one cell per invariant and one for its fault
  windows, coloured pass / fail / expected fail / unknown / inconclusive; each row links to its run.
* The tables of gpujail/report.py's aggregation (per requirement, per invariant, the fault table,
  the self-checks), the failures with their whole reasons, and for each run that failed its
  verdict, causal chain in words, replay command and timeline SVG inline.

Wide tables scroll in their own box (`div.gj-scroll`) and long reasons wrap, so the page itself
never scrolls sideways.
"""
from __future__ import annotations

import html
import json
import os
from pathlib import Path

from gpujail.report import (
    BAD,
    CHAOS_DIR,
    INCONCLUSIVE,
    SPEC_DOC,
    STATUSES,
    artefact_name,
    cell_counts,
    cell_table,
    counts_text,
    failures,
    invariant_rows,
    invariants_of,
    reproduce_command,
    requirement_rows,
    scenario_of,
    self_checks,
    tests_of,
    totals,
    unexpected,
    unknowns,
)

FILES = ("history.jsonl", "final_state.json", "timeline.html")   # a kept chaos run's, linked from its row
# The test list's groups, worst first; statuses not listed (pytest's `error`...) come right after failed.
ORDER = ("failed", "error", "unexpected-pass", "inconclusive", "expected-fail", "expected-inconclusive",
         "passed-intermittent", "skipped", "passed")
INVARIANT_IDS = tuple(f"INV-{i}" for i in range(1, 7))
CELL = {"PASS": ("gj-c-pass", "#66bb6a"), "FAIL": ("gj-c-fail", "#e53935"), "XFAIL": ("gj-c-xfail", "#ffb300"),
        "UNKNOWN": ("gj-c-unknown", "#bdbdbd"), "INCONCLUSIVE": ("gj-c-inconclusive", "#8e24aa"),
        "NONE": ("gj-c-none", "#f5f5f5")}


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def run_id(test: str) -> str:
    """A chaos run's row anchor (its verdict and chain, when it failed, are at `artefact_name`)."""
    return "run-" + artefact_name(test)


def first_line(reason: str, width: int = 160) -> str:
    """A reason shortened for the test list: its first line, cut at `width`, and how many more."""
    lines = [ln for ln in (reason or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    line = lines[0] if len(lines[0]) <= width else lines[0][:width] + "..."
    return line + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else "")


def pre(reason: str) -> str:
    """A whole reason, as written (nothing for none)."""
    return f"<pre>{esc(reason)}</pre>" if reason else ""


def suite_of(test: str) -> str:
    """conformance, chaos, ...: the node id's first folder (its file, for a test outside one)."""
    return test.split("::")[0].split("/")[0]


# -- the chaos runs, judged again ----------------------------------------------------------------

def chaos_runs(report: dict, root: Path, page_dir: Path) -> list[dict]:
    """Every chaos run of this report, in test order: its entry, the files it kept (paths relative
    to the page), each declared fault window (opened?, where or why not: the test's record), and
    for a failed run its verdict judged again from the kept history, replay command and timeline SVG."""
    from gpujail.chaos import checker, timeline
    from gpujail.world import history
    out = []
    for t in sorted((t for t in tests_of(report).values() if t.get("invariants")), key=lambda t: t["test"]):
        d = root / CHAOS_DIR / artefact_name(t["test"])
        notes = t.get("window_notes") or {}
        run = {"test": t, "dir": d, "verdict": None, "svg": "", "reproduce": "", "error": "",
               "files": {n: os.path.relpath(d / n, page_dir) for n in FILES if (d / n).exists()},
               "windows": {w.partition("=")[0]: (w.partition("=")[2] == "opened", notes.get(w.partition("=")[0], ""))
                           for w in (t.get("windows") or "").split()}}
        if t["status"] in ("failed", "expected-fail") and (d / "history.jsonl").exists():
            try:
                events = history.load(str(d / "history.jsonl"))
                final = json.loads((d / "final_state.json").read_text()) if (d / "final_state.json").exists() else None
                run["verdict"] = checker.check(events, final)
                run["reproduce"] = reproduce_command(t["test"], events, report["run_info"])
                run["svg"] = timeline.svg(events, run["verdict"])
            except Exception as e:   # a history from another version of the harness: the page still gets written
                run["error"] = f"could not judge its history again: {type(e).__name__}: {e}"
        out.append(run)
    return out


def cell_status(run: dict, inv: str) -> str:
    """An invariant's cell in the grid and the run table: PASS, FAIL, XFAIL (failed as expected),
    UNKNOWN; `windows` is INCONCLUSIVE when one never opened, NONE when the scenario declares none."""
    t = run["test"]
    if inv == "windows":
        if not run["windows"]:
            return "NONE"
        return "PASS" if all(ok for ok, _ in run["windows"].values()) else "INCONCLUSIVE"
    status = invariants_of(t).get(inv, "UNKNOWN")
    return "XFAIL" if status == "FAIL" and t["status"] == "expected-fail" else status


def grid_svg(runs: list[dict]) -> str:
    """The scenario-by-invariant grid: one row per chaos run, a cell per invariant and one for its
    fault windows; each row links to the run's row in the run table, each cell's title says it."""
    cols = [*INVARIANT_IDS, "windows"]
    labels = [scenario_of(r["test"]["test"]) if "::test_scenario[" in r["test"]["test"]
              else r["test"]["test"].split("::")[-1].removeprefix("test_") for r in runs]
    left, cw, rh, top = min(420, 12 + 6.6 * max((len(s) for s in labels), default=10)), 58, 15, 34
    width, height = left + cw * len(cols) + 90, top + rh * len(runs) + 6
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="gj-grid" width="{width:.0f}" height="{height}" '
             f'viewBox="0 0 {width:.0f} {height}" font-family="sans-serif" font-size="11">',
             "<style>" + "".join(f".{c} {{fill:{fill}}}" for c, fill in CELL.values())
             + " a:hover text {text-decoration: underline} rect.gj-cell {stroke:#fff}</style>"]
    parts += [f'<text x="{left + cw * i + cw / 2:.0f}" y="{top - 8}" text-anchor="middle" font-weight="bold">{esc(c)}</text>'
              for i, c in enumerate(cols)]
    parts.append(f'<text x="{left + cw * len(cols) + 8:.0f}" y="{top - 8}" font-weight="bold">outcome</text>')
    for n, (run, label) in enumerate(zip(runs, labels)):
        t, y = run["test"], top + rh * n
        cells = []
        for i, c in enumerate(cols):
            status = cell_status(run, c)
            why = (t.get("invariant_reasons") or {}).get(c) or "; ".join(
                f"{w}: {'opened' if ok else 'never opened'}{': ' + where if where else ''}"
                for w, (ok, where) in run["windows"].items()) if c == "windows" or status != "PASS" else ""
            cells.append(f'<rect class="gj-cell {CELL[status][0]}" data-status="{status}" x="{left + cw * i}" y="{y}" '
                         f'width="{cw}" height="{rh}"><title>{esc(label)}: {esc(c)} {status}'
                         f'{": " + esc(why) if why else ""}</title></rect>')
        parts.append(f'<a href="#{esc(run_id(t["test"]))}" class="gj-row"><text x="{left - 6:.0f}" y="{y + 11}" '
                     f'text-anchor="end">{esc(label)}</text>{"".join(cells)}<text x="{left + cw * len(cols) + 8}" '
                     f'y="{y + 11}">{esc(t["status"])}</text></a>')
    return "".join(parts) + "</svg>"


def grid_legend() -> str:
    words = {"PASS": "held / opened", "FAIL": "violated", "XFAIL": "violated, as expected", "UNKNOWN": "undecided",
             "INCONCLUSIVE": "a fault window never opened", "NONE": "no window declared"}
    return "<div>" + " ".join(f'<span class="key"><span class="sw" style="background:{fill}"></span>{esc(words[s])}'
                              f"</span>" for s, (_, fill) in CELL.items()) + "</div>"


def run_table(runs: list[dict]) -> str:
    """Every chaos run: outcome, each invariant, its fault windows (where each opened, or why not),
    its files, and for a failed run a link to its verdict and chain below."""
    rows = ["<div class='gj-scroll'><table class='gj-t' id='gj-runs'><tr><th>run</th><th>outcome</th>"
            + "".join(f"<th>{i}</th>" for i in INVARIANT_IDS) + "<th>fault windows</th><th>files</th></tr>"]
    for r in runs:
        t = r["test"]
        cls = "gj-bad" if t["status"] in BAD else "gj-xf" if t["status"] != "passed" else ""
        invs = "".join(f"<td class='gj-inv {CELL[cell_status(r, i)][0]}-t'>{esc(invariants_of(t).get(i, ''))}</td>"
                       for i in INVARIANT_IDS)
        windows = "<br>".join(f"{esc(w)}: {'opened' if ok else '<b>never opened</b>'}" + (f": {esc(where)}" if where else "")
                              for w, (ok, where) in r["windows"].items()) or "none declared"
        files = [f"<a href='{esc(rel)}' class='gj-{n.split('.')[0]}'>{esc(n)}</a>" for n, rel in r["files"].items()]
        if r["svg"]:
            files.append(f"<a href='#{esc(artefact_name(t['test']))}'>verdict and chain</a>")
        files_html = "<br>".join(files) or "no files kept"
        if r["error"]:
            files_html += f"<br><small>{esc(r['error'])}</small>"
        rows.append(f"<tr class='{cls}' id='{esc(run_id(t['test']))}'><td>{esc(t['test'])}</td><td>{esc(t['status'])}</td>"
                    f"{invs}<td>{windows}</td><td class='gj-files'>{files_html}</td></tr>")
    return "".join(rows) + "</table></div>"


def test_list(report: dict, runs: list[dict]) -> tuple[str, list[str]]:
    """Every test, grouped by outcome (worst first) then suite: (the HTML, the groups' anchors)."""
    tests = list(tests_of(report).values()) + [t for t in tests_of(self_checks(report)).values()]
    chaos = {r["test"]["test"] for r in runs}
    order = {s: i for i, s in enumerate(ORDER)}
    groups: dict[str, list[dict]] = {}
    for t in sorted(tests, key=lambda t: (order.get(t["status"], 0.5), suite_of(t["test"]), t["test"])):
        groups.setdefault(t["status"], []).append(t)
    out, anchors = [], []
    for status, group in groups.items():
        anchors.append(f"<a href='#tests-{esc(status)}'>{len(group)} {esc(status)}</a>")
        out.append(f"<h3 id='tests-{esc(status)}'>{esc(status)} ({len(group)})</h3><div class='gj-scroll'>"
                   "<table class='gj-t gj-tests'><tr><th>suite</th><th>test</th><th>duration</th><th>reason</th></tr>")
        for t in group:
            name = (f"<a href='#{esc(run_id(t['test']))}'>{esc(t['test'])}</a>" if t["test"] in chaos else esc(t["test"]))
            dur = f"{t['duration']:.1f} s" if isinstance(t.get("duration"), (int, float)) else ""
            reason = "" if status == "passed" else esc(first_line(t.get("reason", "")))
            out.append(f"<tr class='gj-test' data-status='{esc(status)}'><td>{esc(suite_of(t['test']))}</td>"
                       f"<td>{name}</td><td class='gj-n'>{dur}</td><td>{reason}</td></tr>")
        out.append("</table></div>")
    return "".join(out), anchors


def requirement_table(section: dict) -> list[str]:
    """A summary's (or its self-checks') requirements as an HTML table, then the uncited ones."""
    cols = STATUSES
    req = ["<div class='gj-scroll'><table class='gj-t'><tr><th>requirement</th><th>what</th>"
           + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for rid, what, counts in requirement_rows(section):
        cls = "gj-bad" if any(counts.get(s) for s in BAD) else "gj-xf" if counts.get("expected-fail") else ""
        req.append(f"<tr class='{cls}'><td>{esc(rid)}</td><td>{esc(what)}</td>"
                   + "".join(f"<td class='gj-n'>{counts.get(c, '') or ''}</td>" for c in cols) + "</tr>")
    req.append("</table></div>")
    if section.get("uncited"):
        req.append(f"<p>Not checked by any test that ran: {esc(', '.join(section['uncited']))}</p>")
    return req


CSS = """
body {font-family: sans-serif; margin: 1em 2em; color: #212121; max-width: 100%}
h1 {font-size: 1.4em} h2 {font-size: 1.15em; margin-top: 1.6em} h3 {font-size: 1em}
nav p {margin: .3em 0} nav a {margin-right: .8em}
p, h3, a {overflow-wrap: anywhere}
.gj-scroll {overflow-x: auto; max-width: 100%}
table.gj-t {border-collapse: collapse; font-size: 13px}
table.gj-t td, table.gj-t th {border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top}
table.gj-t td {overflow-wrap: anywhere}
table.gj-t td.gj-inv, table.gj-t td.gj-files {white-space: nowrap}
table.gj-t td.gj-n {text-align: right; white-space: nowrap}
table.gj-tests td:nth-child(4) {min-width: 20em}
tr.gj-bad td {background: #ffebee} tr.gj-xf td {background: #fff8e1}
td.gj-c-fail-t {color: #c62828; font-weight: bold} td.gj-c-xfail-t {color: #e65100; font-weight: bold}
td.gj-c-unknown-t {color: #616161; font-style: italic}
.gj-pass {color: #2e7d32; font-weight: bold} .gj-fail {color: #c62828; font-weight: bold}
pre {background: #fafafa; border: 1px solid #eee; padding: .6em; overflow-x: auto; font-size: 12px}
table.gj-t pre {white-space: pre-wrap; overflow-wrap: anywhere; max-width: 110ch}
.gj-plot {overflow: auto; max-width: 100%}
.gj-grid {max-height: 640px}
code {background: #f5f5f5; padding: 0 3px; overflow-wrap: anywhere}
"""


def cell_html(report: dict) -> str:
    """The fault table as exercised: one row per role and step, one column per neighbours' state;
    each cell says how many runs exercised it, or that it is unreachable here, or red: not exercised."""
    from gpujail.chaos.checkers.cells import NEIGHBOURS
    table = cell_table(report)
    exercised, unreachable, missed = cell_counts(table)
    rows = sorted({c.rsplit("/", 1)[0] for c in table})
    out = [f"<h2 id='fault-table'>Fault table</h2><p>Who fails (role), where (step), with the neighbours in which "
           f"state (chaos/fault_table.py): {exercised} cells exercised, {unreachable} unreachable for this "
           f"implementation, {len(missed)} not exercised.</p>",
           "<div class='gj-scroll'><table class='gj-t'><tr><th>role / step</th>"
           + "".join(f"<th>{n} ready</th>" for n in NEIGHBOURS) + "</tr>"]
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
    return "".join(out) + "</table></div>"


def write_html(report: dict, path, root: Path | None = None) -> Path:
    """Write the run's page to `path`; chaos runs' files are looked up under `root` (default: the
    page's directory) and linked relative to the page."""
    from gpujail.chaos import timeline
    path = Path(path)
    root = path.parent if root is None else root
    info = report["run_info"]
    bad = failures(report)
    head = "FAIL" if bad else "PASS"
    runs = chaos_runs(report, root, path.parent)
    chaos = {r["test"]["test"] for r in runs}

    def link(test: str) -> str:
        return f"<a href='#{esc(run_id(test))}'>{esc(test)}</a>" if test in chaos else esc(test)

    req = requirement_table(report)
    for rid, why in report.get("pending", {}).items():
        req.append(f"<p>{esc(rid)} pending: {esc(why)}</p>")
    checks = self_checks(report)
    if checks["status"] == "failed":
        head = "ERROR"
    inv = ["<div class='gj-scroll'><table class='gj-t'><tr><th>invariant</th><th></th><th>PASS</th><th>FAIL</th>"
           "<th>UNKNOWN</th><th>failing runs</th></tr>"]
    for rid, name, counts, failing in invariant_rows(report):
        cls = "gj-bad" if unexpected(failing) else "gj-xf" if failing else ""
        inv.append(f"<tr class='{cls}'><td>{esc(rid)}</td><td>{esc(name)}</td>"
                   + "".join(f"<td class='gj-n'>{counts.get(s, '') or ''}</td>" for s in ("PASS", "FAIL", "UNKNOWN"))
                   + "<td>" + "<br>".join(f"{link(t['test'])} ({esc(t['status'])})" for t in failing) + "</td></tr>")
    inv.append("</table></div>")
    inv += [f"<p>{esc(rid)} UNKNOWN in {link(test)}: {esc(why)}</p>" for rid, test, why in unknowns(report)]
    fails = [f"<tr class='{'gj-bad' if t['status'] in BAD else 'gj-xf'}'><td>{link(t['test'])}"
             + (f"<br><small>{esc(t['purpose'])}</small>" if t.get("purpose") else "")
             + f"</td><td>{esc(t['status'])}</td><td>{pre(t['reason'])}</td></tr>"
             for t in failures(report, ("failed", "unexpected-pass", "expected-fail")) + failures(checks)]
    unproven = [f"<tr class='{'gj-bad' if t['status'] in BAD else 'gj-xf'}'><td>{link(t['test'])}</td>"
                f"<td>{esc(t['status'])}</td><td>{pre(t['reason'])}</td></tr>"
                for t in failures(report, INCONCLUSIVE)]
    cells = cell_html(report) if any(t.get("cells") is not None for t in tests_of(report).values()) else ""
    listing, groups = test_list(report, runs)
    chains = []
    for r in (r for r in runs if r["svg"]):
        t = r["test"]
        files = ", ".join(f"<a href='{esc(rel)}'>{esc(n)}</a>" for n, rel in r["files"].items())
        chains.append(f"<h3 id='{esc(artefact_name(t['test']))}'>{esc(t['test'])}: {esc(t['status'])}</h3>"
                      f"<p>Replay: <code>{esc(r['reproduce'])}</code>. Files: {files}</p>"
                      f"<pre>{esc(r['verdict'].summary())}</pre><div class='gj-plot'>{r['svg']}</div>")
    jump = [f"<a href='#{esc(run_id(t['test']) if t['test'] in chaos else 'tests-' + t['status'])}'>{esc(t['test'])}</a>"
            for t in bad]
    sections = [("tests", "Tests"), ("chaos-runs", f"Chaos runs ({len(runs)})"), ("picture", "Picture"),
                ("requirements", "Requirements"), ("invariants", "Invariants"), ("failures", "Failures"),
                ("inconclusive", "Inconclusive"), ("chains", "Violations: chains and timelines")]
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpujail run: {esc(info['implementation'])}: {head}</title>
<style>{CSS}{timeline.LEGEND_CSS}</style></head>
<body>
<h1>gpujail run: <code>{esc(info['implementation'])}</code> on the {esc(info['backend'])} backend:
<span class="{'gj-pass' if head == 'PASS' else 'gj-fail'}">{head}</span></h1>
<p>Contract {esc(info['contract_version'])}, seed {esc(info['seed'])}: {len(tests_of(report))} tests,
{esc(counts_text(totals(report)))}.</p>
{f"<p class='gj-fail'>Harness self-checks failed: {esc(checks['reason'])}</p>" if head == "ERROR" else ""}
<nav>{f"<p>Failing: {' '.join(jump)}</p>" if jump else ""}
<p>{' '.join(f"<a href='#{a}'>{esc(n)}</a>" for a, n in sections)}</p>
<p>Tests: {' '.join(groups)}</p></nav>
<h2 id="tests">Tests</h2>
<p>Every test, failures first, with its duration; for a test that did not pass, the first line of its reason
(the whole of it: the failures table below, and summary.json).</p>
{listing}
<h2 id="chaos-runs">Chaos runs</h2>
<p>Every chaos run, passing ones too: its outcome, each invariant, each fault window its scenario declares (where
it opened, or why not), and its files: the recorded history (<code>gpujail check HISTORY.jsonl FINAL_STATE.json</code>
judges it again), the final state, and the timeline picture (one lane per worker).</p>
{run_table(runs) if runs else '<p>No chaos run.</p>'}
<h2 id="picture">Picture: scenario by invariant</h2>
{(f"<p>One row per chaos run (click it for its files), one cell per invariant and one for its fault windows; hover "
  f"a cell for why.</p>{grid_legend()}<div class='gj-plot gj-grid'>{grid_svg(runs)}</div>") if runs else '<p>No chaos run.</p>'}
<h2 id="requirements">Requirements</h2>
<p>Each requirement in words, with the tests that check it: <a href="{esc(SPEC_DOC.as_uri())}">gpujail/spec.md</a>
(installed with the package: <code>{esc(str(SPEC_DOC))}</code>). A chaos run that violated an invariant counts as
failed under that invariant only; under the others it held, as passed.</p>
{''.join(req)}
<h2 id="invariants">Invariants over the chaos runs</h2>
{''.join(inv)}
{cells}
<h2 id="self-checks">Harness self-checks</h2>
<p>The fake CLI's fidelity and the kernel facts the suite stands on: a precondition of the run, not counted
for or against the implementation. {esc(checks['status'])}{(": " + esc(checks['reason'])) if checks['reason'] else "."}</p>
{''.join(requirement_table(checks)) if checks['requirements'] else ''}
<h2 id="failures">Failures</h2>
{('<div class="gj-scroll"><table class="gj-t"><tr><th>test</th><th>status</th><th>reason</th></tr>' + ''.join(fails)
  + '</table></div>') if fails else '<p>None.</p>'}
<h2 id="inconclusive">Inconclusive</h2>
<p>Chaos runs that proved nothing (an invariant left UNKNOWN, a fault window never opened): never a pass; red
unless the implementation's expectations file lists them under [inconclusive] or [intermittent-inconclusive].</p>
{('<div class="gj-scroll"><table class="gj-t"><tr><th>test</th><th>status</th><th>why</th></tr>' + ''.join(unproven)
  + '</table></div>') if unproven else '<p>No run was inconclusive.</p>'}
<h2 id="chains">Chaos runs that violated an invariant</h2>
{(f"<p>Each: the checker's verdict and causal chain, and the timeline: one lane per worker, time since the "
  f"run's first event.</p>{timeline.legend()}" + ''.join(chains)) if chains else '<p>None.</p>'}
</body></html>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
