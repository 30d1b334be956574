"""Which cells of the fault table a run exercised: who failed (its role then), at which step, and
who was there to lose something (the neighbours' state). Pure functions of the history.

How this works
--------------
A failure is a failpoint that acted on a GPU worker (`return`, `kill`, `panic`) or the harness
killing its node (`chaos.kill`, not the retired prewarm node). For each one, `exercised(run)` gives
the cell (role, step, neighbours):

* role: `restarting` if the failing start is a restart; else `creator` if that start made
  placeholders under the lock (`impl.marker` events, or, for an implementation that records none,
  it arrived at the harness's `creator` barrier, which the fault table's cases place after the
  placeholders); `waiter` if it took the lock after waiting for it without creating anything;
  otherwise `warm`. (A ready worker that dies is covered by the kill-while-ready scenarios.)
* step: the failpoint's name, or `kill`;
* neighbours: how many of the other GPU workers were in a ready span at that moment: `none`,
  `some` or `all`.

The window `cell` (registered in WINDOWS) opens when a run exercised the cell its scenario was
generated for (chaos/fault_table.py names the scenario `cell:ROLE/STEP/NEIGHBOURS`): the fault
table's cases are INCONCLUSIVE, never PASS, when the harness did not manage to force their cell.
"""
from __future__ import annotations

from .content import ready_spans
from .queries import Run, node_of
from .windows import WINDOWS

ROLES = ("creator", "waiter", "warm", "restarting")
NEIGHBOURS = ("none", "some", "all")
FAILING = ("return", "kill", "panic")
PREFIX = "cell:"


def cell_id(role: str, step: str, neighbours: str) -> str:
    return f"{role}/{step}/{neighbours}"


def _start_of(run: Run, node: str, t: float) -> dict | None:
    """The worker.start event of `node`'s start that was running at `t`."""
    starts = [e for e in run.node_events(node) if e.get("kind") == "worker.start" and e["t"] <= t]
    return starts[-1] if starts else None


def _role(run: Run, node: str, t: float) -> str:
    start = _start_of(run, node, t)
    if start is not None and start.get("attempt", 0):
        return "restarting"
    since = start["t"] if start else float("-inf")
    mine = [e for e in run.node_events(node) if since <= e["t"] <= t]
    if any(e.get("kind") == "impl.marker" for e in mine):
        return "creator"
    if any(e.get("kind") == "failpoint" and e.get("action") in ("pause", "wait") and e.get("arg") == "creator"
           for e in mine):
        return "creator"   # an implementation that records nothing: the harness held it after its placeholders
    if any(e.get("kind") == "impl.lock.acquired" and e.get("waited") for e in mine):
        return "waiter"
    return "warm"


def _neighbours(run: Run, node: str, t: float) -> str:
    begin = run.of("chaos.begin")
    gpu = [w for w in (begin[0].get("versions") or {}) if w not in (node, "prewarm")] if begin else []
    ready = {n for n, r, end in ready_spans(run) if r["t"] <= t < end and n != node}
    count = len([w for w in gpu if w in ready])
    return "none" if count == 0 else "all" if count >= len(gpu) else "some"


def failures(run: Run) -> list[tuple[dict, str, str]]:
    """(event, failing worker, step) for every failure of a GPU worker in the run."""
    versions = (run.of("chaos.begin") or [{}])[0].get("versions") or {}
    out = []
    for e in run.of("failpoint", "chaos.kill"):
        if e["kind"] == "failpoint" and e.get("action") in FAILING:
            out.append((e, node_of(e), e.get("name", "?")))
        elif e["kind"] == "chaos.kill" and e.get("barrier"):   # no barrier: the prewarm node retired
            out.append((e, e.get("worker", "?"), "kill"))
    return [(e, w, step) for e, w, step in out if w in versions]


def exercised(run: Run) -> list[str]:
    """The cells this run exercised, each once, in the order they happened."""
    return run.memo("cells", lambda: list(dict.fromkeys(
        cell_id(_role(run, w, e["t"]), step, _neighbours(run, w, e["t"])) for e, w, step in failures(run))))


def cell_window(run: Run) -> tuple[bool, str]:
    begin = run.of("chaos.begin")
    name = begin[0].get("scenario", "") if begin else ""
    if not name.startswith(PREFIX):
        return False, f"scenario {name!r} is not a cell of the fault table"
    wanted, got = name[len(PREFIX):], exercised(run)
    if wanted in got:
        return True, f"exercised {wanted}"
    return False, f"wanted {wanted}, exercised {', '.join(got) or 'no failure at all'}"


WINDOWS["cell"] = ("the run exercised the fault-table cell it was generated for", cell_window)
