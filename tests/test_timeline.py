"""Tests for chaos/timeline.py: the run drawn as one self-contained HTML page with an inline SVG.

Pure tests: the histories are the synthetic ones of tests/test_checker.py (one recorded as a
scheduled run records it, for the racing pair); the page is written to tmp_path and its SVG is
parsed on its own with xml.etree, as any SVG viewer would.
"""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from test_checker import JAIL, NVML, History, detached, good_final, good_run

from gpujail.chaos import timeline
from gpujail.chaos.checker import check

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


# -- the racing pair (issue 29, item 4): in words and in the picture, from one finder --------------

def scheduled_seed_bug() -> History:
    """seed_bug() as `--schedule random-walk` records it (the shape of `gpujail reproduce
    cold-race-random --impl legacy --workers 2 --seed 2 --schedule random-walk`): the harness's
    `sched.step` releases each CLI step on NVML; A creates the placeholder and mounts over it
    (steps 7, 8); B's CLI creates it too, fails, and its cleanup unlinks it (step 128)."""
    h = History()

    def step(t: float, n: int, worker: str, failpoint: str) -> None:
        h.add(t, "host", "sched.step", pid=50, step=n, worker=worker, failpoint=failpoint, hit=1, path=NVML,
              waiting=["A", "B"], blocked=[])

    h.add(0.0, "host", "sched.begin", pid=50, strategy="random-walk", seed=2, workers=["A", "B"])
    h.add(0.0005, "host", "chaos.fault", worker="B", failpoint="cli.before_mount", term="1*off->return(EIO)")
    step(0.015, 7, "A", "cli.before_create")
    h.add(0.016, "A", "cli.create", pid=4, path=f"{JAIL}/{NVML}", mode="0o100644")
    step(0.0205, 8, "A", "cli.before_mount")
    h.ready_worker(0.0, "A")   # its CLI mounts NVML at t=0.021
    h.probe(0.06, "A")
    h.add(0.26, "B", "worker.start", pid=9000, impl="legacy", attempt=0)
    step(0.2995, 12, "B", "cli.before_create")
    h.add(0.2998, "B", "cli.create", pid=4, path=f"{JAIL}/{NVML}", mode="0o100644")
    step(0.3045, 128, "B", "cli.before_remove")
    h.failing_cli(0.3, "B", [NVML])   # its cleanup unlinks NVML at t=0.306
    h.probe(0.412, "A", **{NVML: detached()})
    h.add(0.5, "host", "chaos.end")
    return h


def centre(marker: ET.Element) -> tuple[float, float]:
    """A marker's centre: a circle's, or a path's x and its lane's y (paths start at the top point)."""
    c = marker.find("svg:circle", NS)
    if c is not None:
        return float(c.get("cx")), float(c.get("cy"))
    x, top = map(float, re.match(r"M([-\d.]+),([-\d.]+)", marker.find("svg:path", NS).get("d")).groups())
    return x, top + 5   # a triangle's half height (timeline._shape)


def one_marker(lane: ET.Element, kind: str) -> ET.Element:
    found = [m for m in markers(lane) if m.get("data-kind") == kind and m.get("data-count") == "1"
             and NVML in m.find("svg:title", NS).text]
    assert len(found) == 1, [m.find("svg:title", NS).text for m in found]
    return found[0]


def test_the_racing_pair_is_marked_and_said_in_the_same_words(tmp_path):
    """The pair `reproduce --shrink` prints (A's mount, then B's cleanup unlink of the same
    placeholder, with their scheduler steps) is on the picture: a blue ring on each event on its
    own lane, an arrow from the mount to the unlink, a short label, and the printed words as its title."""
    from types import SimpleNamespace

    from gpujail.commands.scenarios import racing_pair
    h = scheduled_seed_bug()
    verdict = check(h.events, good_final(transient_only=False))
    assert verdict.valid is False and verdict.chain[-1]["kind"] == "cli.cleanup.unlink"
    _, root = render(tmp_path, h.events, verdict)

    pair = root.find(".//svg:g[@id='racing-pair']", NS)
    assert pair is not None and (pair.get("data-victim"), pair.get("data-remover")) == ("A", "B")
    words = (f"B's unlink({NVML}) (CLI cleanup (step 128, cli.before_remove), t=0.306s) ran after A's "
             f"mount({NVML}) (step 8, cli.before_mount) at t=0.021s over, the placeholder A created (step 7, "
             "cli.before_create) at t=0.016s, and before A's probe at t=0.412s")
    assert pair.find("svg:title", NS).text == f"racing pair: {words}"
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in h.events))
    printed = racing_pair(SimpleNamespace(run_dir=tmp_path, history_path=tmp_path / "history.jsonl",
                                          verdict=verdict))
    assert printed == words   # the words `--shrink` prints are the picture's

    by_node = lanes(root)
    mount, unlink = one_marker(by_node["A"], "cli.mount"), one_marker(by_node["B"], "cli.cleanup.unlink")
    rings = [(float(c.get("cx")), float(c.get("cy"))) for c in pair.iter(f"{SVG}circle") if c.get("class") == "pring"]
    assert len(rings) == 2
    for (rx, ry), (mx, my) in zip(rings, (centre(mount), centre(unlink)), strict=True):
        assert abs(rx - mx) < 0.1 and abs(ry - my) < 0.1   # each on its event, on its worker's lane
    (mx, my), (ux, uy) = rings
    assert my < uy and mx < ux   # A's lane above B's, the mount before the unlink
    arrow = pair.find("svg:line", NS)
    assert arrow.get("class") == "pair" and arrow.get("marker-end") == "url(#pair-arrow)"
    x1, y1, x2, y2 = (float(arrow.get(a)) for a in ("x1", "y1", "x2", "y2"))
    assert mx <= x1 < x2 <= ux and my <= y1 < y2 <= uy   # from the mount towards the unlink
    assert root.find(".//svg:marker[@id='pair-arrow']", NS) is not None
    label = pair.find("svg:text", NS)
    assert label.text == "racing pair: B unlink (step 128) after A mount (step 8) of libnvidia-ml.so.550.54.15"


def test_an_unscheduled_racing_pair_has_no_steps(tmp_path):
    h = seed_bug()
    _, root = render(tmp_path, h.events, check(h.events, good_final(transient_only=False)))
    pair = root.find(".//svg:g[@id='racing-pair']", NS)
    assert pair.find("svg:text", NS).text == "racing pair: B unlink after A mount of libnvidia-ml.so.550.54.15"
    assert "step" not in pair.find("svg:title", NS).text


def test_no_racing_pair_mark_without_a_racing_pair(tmp_path):
    """A valid run, and a violation whose victim never mounted the removed file (not the seed bug's
    shape), draw no pair: no blue ring, arrow or label."""
    h = good_run()
    broken = seed_bug()
    broken.events = [e for e in broken.events if not (e["kind"] == "cli.mount" and e["node"] == "A")]
    for history, valid in ((h.events, True), (broken.events, False)):
        verdict = check(history, good_final(transient_only=valid))
        assert verdict.valid is valid
        page, root = render(tmp_path, history, verdict)
        assert root.find(".//svg:g[@id='racing-pair']", NS) is None
        assert not [e for e in root.iter() if e.get("class") in ("pring", "pair", "pair-label")]
        assert "racing pair:" not in page   # nor its words
