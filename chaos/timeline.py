"""The run as a picture: `render(history, verdict, path)` writes `timeline.html` for people.

How this works
--------------
One self-contained HTML file (no script, no external asset) holding the verdict's summary and one
inline SVG. The SVG has a lane per worker (harness events without a worker go to a `host` lane on
top) and time on the x axis, in seconds since the first event, like the checker's messages. Each
event is a marker whose colour and shape say its family: worker lifecycle (circles: start blue,
ready green, exit orange), implementation steps (squares, purple; fatal red), CLI steps (triangles,
teal; failure and cleanup unlinks red), failpoints that fired (orange diamonds; `off` hits grey),
probes (small green dots when intact, red when a file is bad) and the harness's faults (black
diamonds). Hovering a marker shows its `<title>`: the event in the checker's one-line form.
Behind the markers, a lane is tinted blue while its worker is starting and green while it is ready.

The verdict is drawn on top: the first violating event gets a red ring and the invariant's name,
the causal chain's events get numbered dark rings joined by red arrows ending at the violation,
and every other violating event gets a thin red ring. When the violation has the seed bug's shape,
its racing pair (chaos/checkers/queries.py `racing_pair`, the pair `gpujail reproduce --shrink`
prints) gets blue rings: the victim's mount and, joined to it by a blue arrow, the other worker's
cleanup unlink that ran after it, labelled in a few words; hovering them shows the pair in words.

A 128-worker run must stay small, so each lane is capped (`MAX_MARKERS`, fewer when there are
many lanes: `TOTAL_MARKERS` for the whole picture): routine events (intact probes, CLI
mkdir/create/mount, markers, `off` failpoints...) of one kind falling in the same few pixels become
one marker whose tooltip counts them, and the bucket widens until the lane fits; only then are
other events merged the same way. Chain and violation events are never merged.
"""
from __future__ import annotations

import html
import itertools
import math
import re
from pathlib import Path

from gpujail.chaos.checker import UNKNOWN, Verdict, describe, is_bad, node_of
from gpujail.chaos.checkers.queries import RacingPair, racing_pair

LEFT, RIGHT, TOP, BOTTOM = 130, 60, 50, 24     # margins around the plot (px)
PLOT_W, LANE_H = 1100, 20
MAX_MARKERS = 60                               # per lane, after merging routine events...
TOTAL_MARKERS = 4000                           # ...and fewer per lane when there are many lanes
MIN_MARKERS = 16
THIN_PX = 6                                    # first merging bucket width (px)
PROBE_PX = 20                                  # intact probes are the bulk of a run: wider buckets
TOOLTIP_EVENTS = 4                             # events listed in a merged marker's tooltip

# Family -> (CSS fill, shape). Classes keep the file small: one style rule, many markers.
STYLE = {
    "start": ("#1565c0", "circle"), "ready": ("#2e7d32", "circle"), "exit": ("#ef6c00", "circle"),
    "node": ("#9e9e9e", "circle"),
    "impl": ("#7b1fa2", "square"), "impl-bad": ("#c62828", "square"),
    "cli": ("#00838f", "triangle"), "cli-bad": ("#c62828", "triangle"),
    "fp": ("#f9a825", "diamond"), "fp-off": ("#bdbdbd", "diamond"),
    "probe-ok": ("#66bb6a", "dot"), "probe-bad": ("#d50000", "circle"),
    "chaos": ("#212121", "diamond"), "other": ("#757575", "dot"),
}
LEGEND = [("start", "worker start"), ("ready", "worker ready"), ("exit", "worker exit/restart"),
          ("impl", "implementation step"), ("impl-bad", "implementation fatal"), ("cli", "CLI step"),
          ("cli-bad", "CLI failure / cleanup unlink"), ("fp", "failpoint fired"), ("fp-off", "failpoint off"),
          ("probe-ok", "probe intact"), ("probe-bad", "probe: file bad"), ("chaos", "harness fault")]
SVG_CSS = (" .m:hover {stroke:#000;stroke-width:1.5} .grid {stroke:#eee} .lane-line {stroke:#ddd}"
           " .band-start {fill:#e3f2fd} .band-ready {fill:#e8f5e9}"
           " .chain {stroke:#d50000;stroke-width:1.6;stroke-dasharray:4 3;fill:none}"
           " .vring {fill:none;stroke:#d50000;stroke-width:2.5} .oring {fill:none;stroke:#d50000;stroke-width:1}"
           " .cring {fill:none;stroke:#000;stroke-width:1.2} .bad-lane {fill:#c62828;font-weight:bold}"
           " text.num {font-size:9px}"
           " .pring {fill:none;stroke:#2962ff;stroke-width:2.2} .pair {stroke:#2962ff;stroke-width:1.8}"
           " .pair-label {fill:#2962ff;font-weight:bold;stroke:#fff;stroke-width:3;paint-order:stroke}")
ARROW = ('<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
         'orient="auto-start-reverse"><path d="M0,0L10,5L0,10Z" fill="#d50000"/></marker>'
         '<marker id="pair-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
         'orient="auto"><path d="M0,0L10,5L0,10Z" fill="#2962ff"/></marker></defs>')
PAIR_R = 10                                    # the racing pair's rings (px)
CHAR_PX = 6.2                                  # rough width of a character at the SVG's 11px font
ROUTINE = {"probe-ok", "fp-off", "cli", "impl", "node", "other"}
KEPT_IMPL = ("impl.begin", "impl.ready", "impl.placeholders", "impl.lock.wait")   # evidence for INV-4


def family(event: dict) -> str:
    kind = event.get("kind", "")
    if kind == "probe":
        return "probe-bad" if any(is_bad(r) for r in event.get("results") or []) else "probe-ok"
    if kind == "failpoint":
        return "fp-off" if event.get("action") in (None, "off") else "fp"
    if kind.startswith("chaos."):
        return "chaos"
    if kind == "worker.ready":
        return "ready"
    if kind == "worker.start":
        return "start"
    if kind in ("worker.exit", "worker.restart"):
        return "exit"
    if kind == "node.up":
        return "node"
    if kind.startswith("cli."):
        bad = kind in ("cli.fail", "cli.cleanup.unlink") or (kind == "cli.exit" and event.get("code") not in (0, None))
        return "cli-bad" if bad else "cli"
    if kind.startswith("impl."):
        bad = kind in ("impl.fatal", "impl.lock.timeout") or (kind == "impl.exit" and event.get("code") not in (0, None))
        return "impl-bad" if bad else "impl"
    return "other"


def _routine(event: dict) -> bool:
    return family(event) in ROUTINE and event.get("kind") not in KEPT_IMPL


def _key(event: dict) -> tuple:
    return event.get("t"), event.get("node"), event.get("pid"), event.get("kind")


_XML_BAD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def esc(text) -> str:
    """Text safe inside XML (the SVG must parse on its own) and HTML."""
    return html.escape(_XML_BAD.sub("?", str(text)), quote=True)


def natural(name: str) -> list:
    """w2 before w10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _ticks(span: float) -> list[float]:
    raw = span / 10
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(span / step) + 1)]


def _group(events: list[dict], xs: dict, px: float) -> list[list[dict]]:
    """Events of one family within the same `px`-wide bucket become one group (px 0: no merging)."""
    if px <= 0:
        return [[e] for e in events]
    groups: dict[tuple, list[dict]] = {}
    for e in events:
        cls = family(e)
        width = max(px, PROBE_PX) if cls == "probe-ok" else px
        groups.setdefault((cls, int(xs[_key(e)] // width)), []).append(e)
    return list(groups.values())


def lane_markers(events: list[dict], xs: dict, pinned: set, cap: int = MAX_MARKERS) -> list[list[dict]]:
    """A lane's markers (each a group of events), at most `cap` unless pinned events alone exceed it."""
    pin = [[e] for e in events if _key(e) in pinned]
    routine = [e for e in events if _key(e) not in pinned and _routine(e)]
    kept = [e for e in events if _key(e) not in pinned and not _routine(e)]
    px_routine, px_kept = THIN_PX, 0.0
    while True:
        groups = pin + _group(routine, xs, px_routine) + _group(kept, xs, px_kept)
        if len(groups) <= cap or (px_routine > PLOT_W and px_kept > PLOT_W):
            return groups
        if px_routine <= PLOT_W:
            px_routine *= 2
        else:
            px_kept = max(px_kept * 2, THIN_PX)


def _shape(cls: str, x: float, y: float, big: bool) -> str:
    shape = STYLE[cls][1]
    s = 1.4 if big else 1.0
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{5 * s:.1f}"/>'
    if shape == "dot":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{3 * s:.1f}"/>'
    if shape == "square":
        h = 3.5 * s
        return f'<rect x="{x - h:.1f}" y="{y - h:.1f}" width="{2 * h:.1f}" height="{2 * h:.1f}"/>'
    if shape == "triangle":
        h = 5 * s
        return f'<path d="M{x:.1f},{y - h:.1f}L{x + h:.1f},{y + h * .8:.1f}L{x - h:.1f},{y + h * .8:.1f}Z"/>'
    h = 5.5 * s   # diamond
    return f'<path d="M{x:.1f},{y - h:.1f}L{x + h:.1f},{y:.1f}L{x:.1f},{y + h:.1f}L{x - h:.1f},{y:.1f}Z"/>'


def _tooltip(group: list[dict], t0: float, jails: tuple) -> str:
    if len(group) == 1:
        return describe(group[0], t0, jails)
    a, b = group[0]["t"] - t0, group[-1]["t"] - t0
    lines = [f"{len(group)} x {family(group[0])} events, t={a:.3f}s..{b:.3f}s"]
    if family(group[0]) == "probe-ok":
        return lines[0] + ": every file intact"
    lines += [describe(e, t0, jails) for e in group[:TOOLTIP_EVENTS]]
    if len(group) > TOOLTIP_EVENTS:
        lines.append(f"... {len(group) - TOOLTIP_EVENTS} more")
    return "\n".join(lines)


def _bands(events: list[dict], t_end: float) -> list[tuple[str, float, float, str]]:
    """(class, t_from, t_to, title): starting and ready spans of the worker on this lane."""
    names = {"band-start": "starting", "band-ready": "ready"}
    out, state, since = [], None, None
    for e in events:
        kind = e.get("kind")
        if kind in ("worker.start", "worker.restart", "worker.ready", "worker.exit", "chaos.kill"):
            if state:
                out.append((state, since, e["t"], names[state]))
            state, since = {"worker.start": "band-start", "worker.restart": "band-start",
                            "worker.ready": "band-ready"}.get(kind), e["t"]
    if state:
        out.append((state, since, t_end, names[state]))
    return out


def svg(history: list[dict], verdict: Verdict | None = None, max_markers: int | None = None) -> str:
    """The timeline as one SVG element (text)."""
    events = sorted(history, key=lambda e: e.get("t", 0.0))
    t0 = events[0].get("t", 0.0) if events else 0.0
    t_end = events[-1].get("t", 0.0) if events else 0.0
    span = max(t_end - t0, 1e-3)
    jails = verdict.jails if verdict else ()

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * PLOT_W

    lanes: dict[str, list[dict]] = {}
    for e in events:
        lanes.setdefault(node_of(e), []).append(e)
    names = sorted(lanes, key=lambda n: (n != "host", natural(n)))
    if max_markers is None:
        max_markers = min(MAX_MARKERS, max(MIN_MARKERS, TOTAL_MARKERS // max(len(names), 1)))
    y_of = {n: TOP + i * LANE_H + LANE_H / 2 for i, n in enumerate(names)}
    width, height = LEFT + PLOT_W + RIGHT, TOP + len(names) * LANE_H + BOTTOM
    xs = {_key(e): x(e["t"]) for e in events}

    violation = verdict.first_violation if verdict else None
    chain = list(verdict.chain) if verdict else []
    others = [v.event for v in verdict.violations() if v.event] if verdict else []
    pair = racing_pair(events, verdict) if violation else None
    pinned = {_key(e) for e in chain + others + ([violation] if violation else [])
              + ([pair.mount, pair.unlink] if pair else [])}   # their own markers, under their rings
    bad_nodes = {node_of(e) for e in others}

    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'),
           "<style>" + " ".join(f".{c} {{fill:{f}}}" for c, (f, _) in STYLE.items()) + SVG_CSS + "</style>",
           ARROW]

    # axis and grid
    out.append('<g class="axis">')
    for t in _ticks(span):
        tx = LEFT + t / span * PLOT_W
        out.append(f'<line class="grid" x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" y2="{height - BOTTOM}"/>'
                   f'<text x="{tx:.1f}" y="{TOP - 10}" text-anchor="middle">{t:g}s</text>')
    out.append(f'<text x="{LEFT}" y="14" font-weight="bold">time since the first event (s)</text></g>')

    # lanes: background bands, label, markers
    for name in names:
        y, lane = y_of[name], lanes[name]
        out.append(f'<g class="lane" data-node="{esc(name)}">')
        for cls, a, b, what in _bands(lane, t_end):
            out.append(f'<rect class="{cls}" x="{x(a):.1f}" y="{y - LANE_H / 2 + 1:.1f}" width="{max(x(b) - x(a), 1):.1f}" '
                       f'height="{LANE_H - 2}"><title>{esc(name)} {what} t={a - t0:.3f}s..{b - t0:.3f}s</title></rect>')
        out.append(f'<line class="lane-line" x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + PLOT_W}" y2="{y:.1f}"/>')
        groups = lane_markers(lane, xs, pinned, max_markers)
        label_cls = ' class="bad-lane"' if name in bad_nodes else ""
        out.append(f'<text{label_cls} x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{esc(name[:18])}'
                   f'<title>{esc(name)}: {len(lane)} events, {len(groups)} markers</title></text>')
        for g in sorted(groups, key=lambda g: g[0]["t"]):
            cls = family(g[0])
            gx = xs[_key(g[0])] if len(g) == 1 else sum(xs[_key(e)] for e in g) / len(g)
            kind = esc(g[0].get("kind", "?"))
            out.append(f'<g class="m {cls}" data-kind="{kind}" data-count="{len(g)}">'
                       f'<title>{esc(_tooltip(g, t0, jails))}</title>{_shape(cls, gx, y, len(g) > 1)}</g>')
        out.append("</g>")

    # the verdict on top: other violations, the chain, the first violation
    def pos(e: dict) -> tuple[float, float]:
        return xs[_key(e)], y_of[node_of(e)]

    first_key = _key(violation) if violation else None
    seen = set()
    for e in others:
        if _key(e) == first_key or _key(e) in seen:
            continue
        seen.add(_key(e))
        ex, ey = pos(e)
        out.append(f'<circle class="oring" cx="{ex:.1f}" cy="{ey:.1f}" r="7"/>')
    if violation:
        points = [pos(e) for e in chain] + [pos(violation)]
        for (ax, ay), (bx, by) in itertools.pairwise(points):
            out.append(f'<line class="chain" x1="{ax:.1f}" y1="{ay:.1f}" x2="{bx:.1f}" y2="{by:.1f}" '
                       'marker-end="url(#arrow)"/>')
        for i, e in enumerate(chain, 1):
            ex, ey = pos(e)
            out.append(f'<g class="chain-event" data-kind="{esc(e.get("kind"))}"><title>{i}. '
                       f'{esc(describe(e, t0, jails))}</title><circle class="cring" cx="{ex:.1f}" cy="{ey:.1f}" r="8"/>'
                       f'<text class="num" x="{ex + 6 - 12 * (i % 2):.1f}" y="{ey - 8:.1f}" '
                       f'text-anchor="middle">{i}</text></g>')   # alternate sides: chains bunch up
        if pair:
            out.append(_pair_marks(pair, pos(pair.mount), pos(pair.unlink), width))
        vx, vy = pos(violation)
        out.append(f'<g id="violation" data-invariant="{esc(verdict.invariant)}"><title>{esc(verdict.explanation)}'
                   f'</title><circle class="vring" cx="{vx:.1f}" cy="{vy:.1f}" r="10"/>'
                   f'<text x="{vx + 13:.1f}" y="{vy + 4:.1f}" fill="#d50000" font-weight="bold">'
                   f'{esc(verdict.invariant)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def _pair_marks(pair: RacingPair, mount: tuple[float, float], unlink: tuple[float, float], width: int) -> str:
    """The racing pair: a ring on each event, an arrow from the mount to the unlink that ran after it
    (ring edge to ring edge, when the rings are apart), and a short label above the upper of the two
    (after the later event, or before the earlier one when it would run off the picture)."""
    (ax, ay), (bx, by) = mount, unlink
    parts = [f'<circle class="pring" cx="{ax:.1f}" cy="{ay:.1f}" r="{PAIR_R}"/>',
             f'<circle class="pring" cx="{bx:.1f}" cy="{by:.1f}" r="{PAIR_R}"/>']
    d = math.hypot(bx - ax, by - ay)
    if d > 2 * PAIR_R + 4:
        ux, uy = (bx - ax) / d * PAIR_R, (by - ay) / d * PAIR_R
        parts.append(f'<line class="pair" x1="{ax + ux:.1f}" y1="{ay + uy:.1f}" x2="{bx - ux:.1f}" y2="{by - uy:.1f}" '
                     'marker-end="url(#pair-arrow)"/>')
    label = pair.label()
    ly = min(ay, by) - PAIR_R - 2
    lx, anchor = max(ax, bx) + PAIR_R + 4, "start"
    if lx + len(label) * CHAR_PX > width:
        lx, anchor = min(ax, bx) - PAIR_R - 4, "end"
    parts.append(f'<text class="pair-label" x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}">{esc(label)}</text>')
    return (f'<g id="racing-pair" data-victim="{esc(pair.victim)}" data-remover="{esc(pair.remover)}">'
            f'<title>racing pair: {esc(pair.words())}</title>{"".join(parts)}</g>')


LEGEND_CSS = (".key {margin-right: 1.2em; font-size: 12px; white-space: nowrap}\n"
              ".sw {display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px}")


def legend() -> str:
    """The key to the picture, as HTML (its classes styled by LEGEND_CSS)."""
    keys = " ".join(f'<span class="key"><span class="sw" style="background:{STYLE[c][0]}"></span>{esc(text)}</span>'
                    for c, text in LEGEND)
    return (f'<div class="legend">{keys} <span class="key">red ring: violation; numbered rings and red arrows: its '
            'causal chain; hover a marker for the event</span> <span class="key">blue rings and arrow: the racing '
            "pair, another worker's cleanup unlink after the victim's mount</span></div>")


def render(history: list[dict], verdict: Verdict | None, path, max_markers: int | None = None) -> Path:
    """Write the timeline page for `history` (and `verdict`, if judged) to `path`; returns the path."""
    path = Path(path)
    if verdict is None:
        head, summary = "not judged", ""
    else:
        head = {True: "VALID", False: f"INVALID ({verdict.invariant})", UNKNOWN: "UNKNOWN"}[verdict.valid]
        summary = verdict.summary()
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpujail chaos run: {esc(head)}</title>
<style>
body {{font-family: sans-serif; margin: 1em 2em; color: #212121}}
h1 {{font-size: 1.3em}} h1 .bad {{color: #c62828}}
pre {{background: #fafafa; border: 1px solid #eee; padding: .6em; overflow-x: auto; font-size: 12px}}
{LEGEND_CSS}
.plot {{overflow-x: auto; margin-top: .8em}}
</style></head>
<body>
<h1>gpujail chaos run: <span class="{'bad' if verdict is not None and verdict.valid is False else ''}">{esc(head)}</span></h1>
<pre>{esc(summary)}</pre>
{legend()}
<div class="plot">
{svg(history, verdict, max_markers)}
</div>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path
