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


def impl_runs(run: Run) -> list[list[dict]]:
    """Each node's events cut into implementation runs at impl.start, impl.exit and restarts."""
    cuts = ("impl.start", "impl.exit", "node.up", "worker.start", "worker.restart")
    runs: dict[str, list[list[dict]]] = {}
    for e in run.events:
        node = node_of(e)
        parts = runs.setdefault(node, [[]])
        if e.get("kind") in cuts:
            parts.append([])
        parts[-1].append(e)
    return [part for parts in runs.values() for part in parts if part]


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

