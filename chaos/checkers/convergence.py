"""INV-2 convergence: with transient faults only, every worker ends ready (SPEC section 6).

How this works
--------------
With `final_state["transient_only"]`, every worker that started ends ready (its last
`worker.start`/`worker.exit`/`worker.ready` is a `worker.ready`), within
`final_state["max_restarts"]` restarts when given. With permanent faults the invariant does not
apply (PASS, saying so); without `transient_only` it is UNKNOWN.
"""
from __future__ import annotations

from .queries import Run, node_of
from .results import MAX_LISTED, UNKNOWN, InvariantResult, Violation, plural


def check_convergence(run: Run) -> InvariantResult:
    if "transient_only" not in run.final:
        return InvariantResult("INV-2", UNKNOWN, "final_state has no transient_only")
    if not run.final["transient_only"]:
        return InvariantResult("INV-2", True, "not applicable: the run injected permanent faults")
    workers = list(dict.fromkeys(node_of(e) for e in run.of("worker.start")))
    if not workers:
        return InvariantResult("INV-2", UNKNOWN, "no worker.start in the history")
    limit = run.final.get("max_restarts")
    out = []
    for w in workers:
        life = [e for e in run.node_events(w) if e.get("kind") in ("worker.start", "worker.ready", "worker.exit")]
        last = life[-1]
        starts = sum(1 for e in life if e.get("kind") == "worker.start")
        exits = [e for e in life if e.get("kind") == "worker.exit"]
        if last.get("kind") == "worker.ready":
            attempt = last.get("attempt", starts - 1)
            if limit is not None and attempt > limit:
                out.append(Violation("INV-2", f"worker {w} became ready only after {attempt} restarts at "
                                              f"{run.at(last)} (bound: {limit})", last, exits[-MAX_LISTED:]))
            continue
        if last.get("kind") == "worker.exit":
            text = (f"worker {w} never became ready: {plural(starts, 'start')}, the last exited at {run.at(last)} with "
                    f"code {last.get('code')}: {last.get('error') or '(no error line)'}")
            chain = exits[:-1][-MAX_LISTED:]
        else:
            text = f"worker {w} never became ready: its start at {run.at(last)} never finished"
            chain = exits[-MAX_LISTED:]
        out.append(Violation("INV-2", text, last, chain))
    if out:
        return InvariantResult("INV-2", False, f"{len(out)} of {len(workers)} workers not ready at the end", out)
    return InvariantResult("INV-2", True, f"{len(workers)} workers ready")

