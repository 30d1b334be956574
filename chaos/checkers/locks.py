"""INV-4 no lock on warm starts: a start against a populated jail takes no lock (SPEC section 6).

How this works
--------------
In one implementation run of a node (the events between its `impl.start`/`impl.exit` boundaries,
also cut at `node.up`, `worker.start` and `worker.restart`), an `impl.placeholders` with
`missing == 0` forbids any `impl.lock.wait` on the placeholder lock. Without any
`impl.placeholders` event the run cannot tell warm from cold: UNKNOWN, unless the implementation
is instrumented (`impl.begin`) and never waited for that lock at all.
"""
from __future__ import annotations

from gpujail.spec import LOCK as PLACEHOLDER_LOCK

from .queries import Run, node_of
from .results import UNKNOWN, InvariantResult, Violation

CUTS = ("impl.start", "impl.exit", "node.up", "worker.start", "worker.restart")   # where an implementation run ends


def impl_runs(run: Run, events: list[dict] | None = None) -> list[list[dict]]:
    """Each node's events (`events`, default the whole run's) cut into implementation runs at
    impl.start, impl.exit and restarts."""
    runs: dict[str, list[list[dict]]] = {}
    for e in run.events if events is None else events:
        node = node_of(e)
        parts = runs.setdefault(node, [[]])
        if e.get("kind") in CUTS:
            parts.append([])
        parts[-1].append(e)
    return [part for parts in runs.values() for part in parts if part]


def holds_lock(run: Run, node: str, t: float, lock: str = PLACEHOLDER_LOCK) -> bool:
    """`node` held `lock` at time `t` by its own record (acquired and not released in its current
    implementation run); an uninstrumented implementation (no impl.begin: a vendor's script) is
    taken at its failpoint's word: the scenario arms the fault where it holds the lock."""
    events = [e for e in run.node_events(node) if e["t"] <= t]
    if not any(e.get("kind") == "impl.begin" for e in events):
        return True
    current = (impl_runs(run, events) or [[]])[-1]
    held = False
    for e in current:
        if e.get("kind") in ("impl.lock.acquired", "impl.lock.released") and e.get("lock", lock) == lock:
            held = e["kind"] == "impl.lock.acquired"
    return held


def check_warm_locks(run: Run) -> InvariantResult:
    if not run.of("impl.placeholders"):
        # Without impl.placeholders we cannot tell warm starts from cold ones. An instrumented
        # implementation (impl.begin) that never waited for the placeholder lock still passes.
        waits = [e for e in run.of("impl.lock.wait") if e.get("lock", PLACEHOLDER_LOCK) == PLACEHOLDER_LOCK]
        if run.of("impl.begin") and not waits:
            return InvariantResult("INV-4", True, "no start took the placeholder lock")
        return InvariantResult("INV-4", UNKNOWN, "no impl.placeholders event: cannot tell warm starts from cold")
    warm, out = 0, []
    for part in impl_runs(run):
        found = [e for e in part if e.get("kind") == "impl.placeholders"]
        if not found or found[0].get("missing") != 0:
            continue
        warm += 1
        waits = [e for e in part if e.get("kind") == "impl.lock.wait" and e.get("lock", PLACEHOLDER_LOCK) == PLACEHOLDER_LOCK]
        if waits:
            w, p = waits[0], found[0]
            begin = [e for e in part if e.get("kind") == "impl.begin"][:1]
            out.append(Violation("INV-4", f"worker {node_of(w)} took the placeholder lock on a warm start: at "
                                          f"{run.at(p)} it found 0 of {p.get('total')} files missing, yet waited for "
                                          f"{w.get('lock', PLACEHOLDER_LOCK)} at {run.at(w)}", w, begin + [p]))
    if out:
        return InvariantResult("INV-4", False, f"{len(out)} of {warm} warm starts took the lock", out)
    return InvariantResult("INV-4", True, f"{warm} warm starts, none took the lock" if warm else "no warm start in this run")

