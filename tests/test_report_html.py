"""Tests for report.html as people see it (gpujail/report_page.py), in a real headless browser.

A small real report is built as `gpujail run` builds one: the plugin's per-requirement aggregation
(gpujail/plugin/outcomes.py `by_requirement`) over a few tests' entries, chaos runs whose files are
kept under chaos/<test>/ (synthetic histories of tests/test_checker.py, judged for real), and
`write_html`. Chromium (`chromium --headless --dump-dom`) loads the page and the assertions read the
DOM it produced: the test list, a link from every chaos run to a history file that exists, the
grid picture, and (from a copy of the page with a measuring script added) that no table makes the
page wider than the window. Without chromium the browser tests fail, saying how to install it.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_checker import good_final, good_run
from test_timeline import seed_bug

from gpujail import report, report_page
from gpujail.chaos import checker, timeline
from gpujail.plugin.outcomes import by_requirement

INVS = [f"INV-{i}" for i in range(1, 7)]
COLD_RACE = "chaos/test_scenarios.py::test_scenario[cold-race]"
ENOSPC = "chaos/test_scenarios.py::test_scenario[enospc]"
CLOSED = "chaos/test_scenarios.py::test_scenario[failing-neighbour-random-seed+0]"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def chromium() -> str:
    """The browser, or a failure saying how to get it (a skip would hide that the page went unchecked)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is not installed: the report's browser test needs it. As root: "
                    "`apt-get update && apt-get install -y chromium` (./run-tests does this when run as root)")
    return path


def dom(page: Path, profile: Path, width: int = 1024) -> str:
    """The DOM chromium built from `page`, serialised."""
    r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                        f"--window-size={width},800", "--dump-dom", page.as_uri()],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "<body" in r.stdout, r.stderr[-2000:]
    return r.stdout


class Elements(HTMLParser):
    """Every element of a document: (tag, attributes, the ids of the elements around it), and text."""

    def __init__(self, text: str):
        super().__init__()
        self.found: list[tuple[str, dict, list[str]]] = []
        self.stack: list[tuple[str, str]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.found.append((tag, a, [i for _, i in self.stack if i]))
        if tag not in VOID:
            self.stack.append((tag, a.get("id") or ""))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag: str, **attrs) -> list[dict]:
        return [a for t, a, _ in self.found if t == tag and all(a.get(k) == v for k, v in attrs.items())]

    def within(self, tag: str, outer_id: str) -> list[dict]:
        return [a for t, a, around in self.found if t == tag and outer_id in around]


def keep_run(root: Path, test: str, history, final: dict) -> None:
    """A chaos run's files as ChaosRun.keep leaves them: history, final state, timeline."""
    d = root / report.CHAOS_DIR / report.artefact_name(test)
    d.mkdir(parents=True)
    (d / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in history.events))
    (d / "final_state.json").write_text(json.dumps(final))
    timeline.render(history.events, checker.check(history.events, final), d / "timeline.html")


def small_report(root: Path) -> dict:
    """Three chaos runs (a violation, a pass, a run whose fault window never opened), a passing, a
    failing (with a long reason on one line) and a skipped conformance test: the summary and its page."""
    bug = seed_bug()
    bug.add(0.0, "host", "chaos.begin", scenario="cold-race", impl="legacy", seed=4, schedule={})
    keep_run(root, COLD_RACE, bug, good_final(transient_only=False))
    keep_run(root, ENOSPC, good_run(), good_final())
    keep_run(root, CLOSED, good_run(), good_final())
    passed = " ".join(f"{i}=PASS" for i in INVS)
    chaos = [{"test": COLD_RACE, "status": "failed", "duration": 4.2, "reason": "scenario cold-race\nverdict: INVALID",
              "invariants": passed.replace("INV-1=PASS", "INV-1=FAIL")},
             {"test": ENOSPC, "status": "passed", "duration": 2.5, "reason": "", "invariants": passed},
             {"test": CLOSED, "status": "inconclusive", "duration": 1.0, "reason": "INCONCLUSIVE: window never opened",
              "invariants": passed, "windows": "failure-while-ready=closed",
              "window_notes": {"failure-while-ready": "no start failed while a neighbour was ready (recorded)"}}]
    results: dict[str, list] = {i: list(chaos) for i in INVS}
    long_reason = "files lost: " + "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15/" * 40
    results["REF-1"] = [{"test": "conformance/test_worker_start.py::test_cold_bring_up[1]", "status": "passed",
                         "duration": 0.8, "reason": ""}]
    results["REF-7"] = [{"test": "conformance/test_neighbours.py::test_" + "long_name_" * 12, "status": "failed",
                         "duration": 1.5, "reason": long_reason}]
    results["REF-4"] = [{"test": "conformance/test_gpu.py::test_needs_a_gpu", "status": "skipped", "duration": 0.0,
                         "reason": "Skipped: no GPU on this runner"}]
    summary = {"run_info": {"implementation": "legacy", "backend": "kernel", "contract_version": "1.0", "seed": "4"},
               "requirements": by_requirement(results), "uncited": [], "pending": {}}
    report_page.write_html(summary, root / "report.html")
    return summary


def test_a_violation_blames_only_the_invariants_its_verdict_failed():
    """Issue 28: a failing chaos run cites INV-1..6; it counts as failed under the invariant its
    verdict failed only, as passed under those it held, and under one it left UNKNOWN as neither."""
    run = {"test": COLD_RACE, "status": "failed", "reason": "",
           "invariants": "INV-1=FAIL INV-2=PASS INV-3=PASS INV-4=UNKNOWN INV-5=FAIL INV-6=PASS"}
    xfail = {**run, "test": ENOSPC, "status": "expected-fail"}
    other = {"test": "conformance/x.py::test_a", "status": "failed", "reason": ""}
    counts = {rid: e["counts"] for rid, e in by_requirement({i: [run, xfail] for i in INVS} | {"REF-1": [other]}).items()}
    assert counts["INV-1"] == counts["INV-5"] == {"failed": 1, "expected-fail": 1}
    assert counts["INV-2"] == counts["INV-3"] == counts["INV-6"] == {"passed": 2}
    assert counts["INV-4"] == {"skipped": 2}
    assert counts["REF-1"] == {"failed": 1}
    inconclusive = {**run, "status": "inconclusive", "invariants": "INV-1=PASS INV-4=UNKNOWN"}
    assert report.status_under("INV-1", inconclusive) == "inconclusive"   # proved nothing: not a pass anywhere
    text = report.text({"run_info": {"implementation": "legacy", "backend": "kernel", "contract_version": "1.0",
                                     "seed": "0"}, "requirements": by_requirement({i: [run] for i in INVS})})
    assert " !INV-1" in text and "  INV-2 " in text and " !INV-2" not in text


def test_report_in_a_browser(tmp_path):
    """Chromium's DOM of the page: the test list (every test, failures first, durations, the skip
    reason), a row per chaos run with links to files that exist (history, final state, timeline),
    the run that never opened its window saying so, the failing run's chain reachable from the
    verdict, and the grid: a cell per run and invariant, coloured."""
    summary = small_report(tmp_path)
    page = Elements(dom(tmp_path / "report.html", tmp_path / "profile"))
    text = " ".join(page.text)

    rows = page.all("tr", **{"class": "gj-test"})
    tests = report.tests_of(summary)
    assert len(rows) == len(tests) == 6
    statuses = [r["data-status"] for r in rows]
    assert statuses[:3] == ["failed", "failed", "inconclusive"] and statuses[-1] == "passed"
    assert "no GPU on this runner" in text and "4.2 s" in text
    assert "files lost: usr/lib" in text and "(+" not in text.split("files lost")[1][:20]

    runs = [t for t in tests.values() if t.get("invariants")]
    for t in runs:
        rid = "run-" + report.artefact_name(t["test"])
        assert page.all("tr", id=rid), f"no row for {t['test']}"
        links = {Path(a["href"]).name: tmp_path / a["href"] for a in page.within("a", rid)
                 if not a.get("href", "#").startswith("#")}
        assert {"history.jsonl", "final_state.json", "timeline.html"} <= set(links), (t["test"], links)
        assert all(p.is_file() for p in links.values()), links
        assert page.all("a", href="#" + rid), f"nothing links to the run of {t['test']}"
    assert "never opened" in text and "failure-while-ready" in text
    assert "no start failed while a neighbour was ready (recorded)" in text   # the test's own record, not re-judged
    chain = report.artefact_name(COLD_RACE)
    assert page.all("a", href="#" + chain) and page.all("h3", id=chain) and "causal chain:" in text
    nav = [a["href"] for t, a, around in page.found if t == "a" and not around and "href" in a]
    assert "#run-" + chain in nav and "#tests" in nav and "#chaos-runs" in nav   # from the verdict, one click

    [grid] = page.all("svg", id="gj-grid")
    cells = page.within("rect", "gj-grid")
    assert len(cells) == len(runs) * 7, len(cells)
    by_status = {c["data-status"] for c in cells}
    assert {"PASS", "FAIL", "INCONCLUSIVE", "NONE"} <= by_status, by_status
    assert len(page.within("a", "gj-grid")) == len(runs)


def test_wide_tables_stay_in_the_page(tmp_path):
    """A long test id and a long unbroken reason: the tables scroll in their own box or wrap, and
    the page is no wider than a 1024 px window (measured by chromium, in a copy of the page with a
    script that writes the widths into the DOM)."""
    small_report(tmp_path)
    page = (tmp_path / "report.html").read_text()
    probe = ("<script>document.body.setAttribute('data-widths', document.documentElement.scrollWidth + ' ' + "
             "document.documentElement.clientWidth)</script></body>")
    (tmp_path / "measured.html").write_text(page.replace("</body>", probe))
    [body] = Elements(dom(tmp_path / "measured.html", tmp_path / "profile")).all("body")
    scroll, client = map(int, body["data-widths"].split())
    assert scroll <= client, f"the page is {scroll} px wide in a {client} px window"
