"""Tests for chaos/timeline.py: the run drawn as one self-contained HTML page with an inline SVG.

Pure tests: the histories are the synthetic ones of tests/test_checker.py; the page is written to
tmp_path and its SVG is parsed on its own with xml.etree, as any SVG viewer would.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gpujail.chaos import timeline
from gpujail.chaos.checker import check
from test_checker import NVML, History, detached, good_final, good_run

NS = {"svg": "http://www.w3.org/2000/svg"}
SVG = "{http://www.w3.org/2000/svg}"


def seed_bug() -> History:
    """A ready; B's CLI fails and its cleanup unlinks A's NVML placeholder; A loses the file."""
    h = History()
    h.ready_worker(0.0, "A")
    h.probe(0.06, "A")
    h.add(0.25, "host", "chaos.fault", worker="B", failpoint="cli.before_mount", term="4*off->return(EIO)")
    h.add(0.26, "B", "worker.start", pid=9000, impl="legacy", attempt=0)
    h.failing_cli(0.3, "B", [NVML])
    h.probe(0.412, "A", **{NVML: detached()})
    h.add(0.5, "host", "chaos.end")
    return h


def render(tmp_path, history, verdict, **kw) -> tuple[str, ET.Element]:
    page = timeline.render(history, verdict, tmp_path / "timeline.html", **kw).read_text()
    found = re.findall(r"<svg\b.*?</svg>", page, re.DOTALL)
    assert len(found) == 1
    return page, ET.fromstring(found[0])


def lanes(root: ET.Element) -> dict[str, ET.Element]:
    return {g.get("data-node"): g for g in root.iter(f"{SVG}g") if g.get("class") == "lane"}


def markers(lane: ET.Element) -> list[ET.Element]:
    return [g for g in lane.iter(f"{SVG}g") if (g.get("class") or "").startswith("m ")]


def test_seed_bug_timeline(tmp_path):
    """Each node has its lane, the violating probe its red ring labelled INV-1, and the chain
    (chaos.fault -> failpoint -> cli.fail -> unlink -> probe) is joined by arrows."""
    h = seed_bug()
    verdict = check(h.events, good_final(transient_only=False))
    page, root = render(tmp_path, h.events, verdict)
    assert page.startswith("<!DOCTYPE html>") and "INVALID (INV-1)" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")   # no external asset
    assert "<script" not in page

    by_node = lanes(root)
    assert list(by_node) == ["host", "A", "B"]
    assert root.find(".//svg:g[@data-node='B']/svg:g[@data-kind='chaos.fault']", NS) is not None   # on B's lane

    ring = root.find(".//svg:g[@id='violation']", NS)
    assert ring is not None and ring.get("data-invariant") == "INV-1"
    assert ring.find("svg:title", NS).text == verdict.explanation
    assert [t.text for t in ring.iter(f"{SVG}text")] == ["INV-1"]
    bad = [m for m in markers(by_node["A"]) if "probe-bad" in m.get("class")]
    assert len(bad) == 1
    ring_x = float(ring.find("svg:circle", NS).get("cx"))
    assert abs(float(bad[0].find("svg:circle", NS).get("cx")) - ring_x) < 0.1

    assert [g.get("data-kind") for g in root.iter(f"{SVG}g") if g.get("class") == "chain-event"] == [
        "chaos.fault", "failpoint", "cli.fail", "cli.cleanup.unlink"]
    arrows = [ln for ln in root.iter(f"{SVG}line") if ln.get("class") == "chain"]
    assert len(arrows) == 4 and abs(float(arrows[-1].get("x2")) - ring_x) < 0.1


def test_every_marker_has_a_tooltip(tmp_path):
    h = seed_bug()
    _, root = render(tmp_path, h.events, check(h.events, good_final(transient_only=False)))
    all_markers = [m for lane in lanes(root).values() for m in markers(lane)]
    assert all_markers
    for m in all_markers:
        assert m.find("svg:title", NS).text.startswith(("t=", f"{m.get('data-count')} x "))
    unlink = root.find(".//svg:g[@data-kind='cli.cleanup.unlink']/svg:title", NS).text
    assert unlink == f"t=0.306s B: cli.cleanup.unlink {NVML} (0 bytes)"


def test_valid_run_and_unjudged_run_have_no_violation_marker(tmp_path):
    h = good_run()
    page, root = render(tmp_path, h.events, check(h.events, good_final()))
    assert "VALID" in page and root.find(".//svg:g[@id='violation']", NS) is None
    _, root = render(tmp_path, h.events, None)
    assert set(lanes(root)) == {"host", "A", "B"}


def test_text_is_escaped(tmp_path):
    h = good_run()
    h.add(0.3, "B", "impl.exit", code=4, stderr="<b>&'\"\x01</b> \udcff")
    h.add(0.31, "w<1>&", "node.up")
    _, root = render(tmp_path, h.events, check(h.events, good_final()))
    assert "w<1>&" in lanes(root)
    tips = [t.text for t in root.iter(f"{SVG}title") if t.text and "impl.exit code=4" in t.text]
    assert tips and "<b>&'\"?</b>" in tips[0]


def test_128_workers_stay_small(tmp_path):
    """Routine markers merge so no lane exceeds the cap; the page stays small."""
    h = History()
    for w in range(128):
        node = f"w{w}"
        h.ready_worker(w * 0.001, node)
        for i in range(300):
            h.probe(0.2 + i * 0.01, node)
    h.failing_cli(1.0, "w5", [NVML])
    h.probe(3.5, "w7", **{NVML: detached()})
    verdict = check(h.events, good_final(transient_only=False))
    page, root = render(tmp_path, h.events, verdict)
    by_node = lanes(root)
    assert list(by_node)[:3] == ["w0", "w1", "w2"] and len(by_node) == 128
    for lane in by_node.values():
        assert len(markers(lane)) <= timeline.TOTAL_MARKERS // 128
    merged = [m for m in markers(by_node["w3"]) if int(m.get("data-count")) > 1]
    assert merged and merged[0].find("svg:title", NS).text.split("\n")[0].startswith(
        f"{merged[0].get('data-count')} x ")
    assert sum(int(m.get("data-count")) for m in markers(by_node["w3"])) == len(
        [e for e in h.events if e["node"] == "w3"])
    assert root.find(".//svg:g[@id='violation']", NS) is not None
    assert len(page) < 1_000_000


def test_family_classes():
    assert timeline.family({"kind": "probe", "results": [{"path": "x", "attached": True, "size": 5}]}) == "probe-ok"
    assert timeline.family({"kind": "probe", "results": [{"path": "x", "attached": False, "size": 5}]}) == "probe-bad"
    assert timeline.family({"kind": "failpoint", "action": "off"}) == "fp-off"
    assert timeline.family({"kind": "failpoint", "action": "return"}) == "fp"
    assert timeline.family({"kind": "cli.exit", "code": 1}) == "cli-bad"
    assert timeline.family({"kind": "cli.exit", "code": 0}) == "cli"
    assert timeline.family({"kind": "impl.fatal"}) == "impl-bad"
    assert timeline.family({"kind": "worker.ready"}) == "ready"
    assert timeline.family({"kind": "chaos.kill", "worker": "w1"}) == "chaos"


def test_empty_and_tiny_histories_render(tmp_path):
    for history in ([], [{"t": 5.0, "node": "A", "pid": 1, "kind": "node.up"}]):
        _, root = render(tmp_path, history, check(history, {}))
        assert set(lanes(root)) == {e["node"] for e in history}
