"""INV-1 no lost content and INV-5 honest readiness: what ready workers saw (SPEC section 6).

How this works
--------------
A worker is *ready* from its `worker.ready` until its next `worker.exit`, `worker.start`,
`worker.restart` or `chaos.kill`. Every `probe` its node records in that span must show each file
attached, readable (`size` not None), the host's bytes (`same_bytes` not False) and, where loaded,
`loader == "ok"`. The first bad result of each file is a violation:

* INV-5 when it is the span's first probe: the worker reported ready with the file already bad,
  unless another node's cleanup removed it *after* the worker became ready (then the worker was
  honest and lost the file later, which is INV-1);
* INV-1 otherwise, with the causal chain of the removal (queries.chain_of).

Both invariants judge one pass over the spans (`content`, memoised on the run); `lost_content` and
`honest_readiness` are the two checkers.
"""
from __future__ import annotations

from .queries import (
    OUTAGE_ERRORS,
    Run,
    cause_text,
    chain_of,
    cut_off,
    is_bad,
    late_detachment,
    loader_says,
    node_of,
    normalised,
    removal_before,
    what_went_wrong,
)
from .results import UNKNOWN, InvariantResult, Violation, plural

SPAN_END = ("worker.exit", "worker.start", "worker.restart", "chaos.kill")


def ready_spans(run: Run) -> list[tuple[str, dict, float]]:
    """(worker, its worker.ready event, end time) for every ready span of every worker."""
    spans = []
    for ready in run.of("worker.ready"):
        node, t = node_of(ready), ready["t"]
        ends = [e["t"] for e in run.node_events(node) if e["t"] > t and e.get("kind") in SPAN_END]
        spans.append((node, ready, min(ends, default=float("inf"))))
    return spans


def check_content(run: Run) -> tuple[InvariantResult, InvariantResult]:
    inv1, inv5 = [], []
    spans = ready_spans(run)
    probed = unprobed = probes_seen = 0
    unprobed_names = []
    for node, ready, end in spans:
        probes = [e for e in run.node_events(node) if e.get("kind") == "probe" and ready["t"] <= e["t"] < end]
        if not probes:
            unprobed += 1
            unprobed_names.append(node)
            continue
        probed += 1
        probes_seen += len(probes)
        lost: set[str] = set()
        for i, probe in enumerate(probes):
            for r in probe.get("results") or []:
                path = r.get("path", "?")
                key = normalised(run.rel(path))
                if key in lost or not is_bad(r):
                    continue
                if r.get("error") in OUTAGE_ERRORS and cut_off(run, node, ready["t"], probe["t"]):
                    continue   # the harness cut this node off the jail (a network fault), not a loss
                lost.add(key)
                removal = removal_before(run, path, node, probe["t"])
                chain = chain_of(run, removal) if removal else []
                after_ready = removal is not None and removal["t"] >= ready["t"]
                loader = loader_says(r)
                tail = f"; loader says: {loader}" if loader else ""
                if i == 0 and not after_ready:
                    text = (f"worker {node} reported ready at {run.at(ready)} but its first probe at "
                            f"{run.at(probe)} shows {run.rel(path)}: {what_went_wrong(r)}")
                    if removal:
                        text += f" ({cause_text(run, removal)})"
                    inv5.append(Violation("INV-5", text + tail, probe, sorted([ready] + chain, key=lambda e: e["t"])))
                else:
                    cause = (f" after {cause_text(run, removal)}" if removal else
                             "; nothing in the history removed it")
                    # on a network jail the remote unlink detaches only at the victim's next lookup (K-2)
                    still = late_detachment(run, removal, probe) if removal else None
                    if still:
                        cause += (f"; its mount outlived that unlink (still intact at {run.at(still)}) until its own "
                                  f"lookup at {run.at(probe)} found the file gone and detached it (K-2)")
                        chain = [*chain, still]
                    text = f"worker {node} lost {run.rel(path)}: {what_went_wrong(r)} at {run.at(probe)}{cause}"
                    inv1.append(Violation("INV-1", text + tail, probe, chain))
    if not spans:
        note, valid = "no worker became ready", UNKNOWN
    elif not probed:
        note, valid = f"no ready worker was probed ({len(spans)} ready spans)", UNKNOWN
    else:
        note, valid = f"{plural(probes_seen, 'probe')} of {plural(probed, 'ready span')}", True
        if unprobed:
            note += f"; never probed: {', '.join(sorted(set(unprobed_names))[:8])}"
    res1 = InvariantResult("INV-1", False if inv1 else valid, note, inv1)
    res5 = InvariantResult("INV-5", False if inv5 else valid, note, inv5)
    if inv1:
        res1.note = f"{plural(len(inv1), 'file')} lost on {plural(len({node_of(v.event) for v in inv1}), 'worker')}"
    if inv5:
        res5.note = (f"{plural(len(inv5), 'file')} bad at readiness on "
                     f"{plural(len({node_of(v.event) for v in inv5}), 'worker')}")
    return res1, res5



def content(run: Run) -> tuple[InvariantResult, InvariantResult]:
    """(INV-1, INV-5), computed once per run."""
    return run.memo("content", lambda: check_content(run))


def lost_content(run: Run) -> InvariantResult:
    """INV-1: no ready worker loses a file it verified."""
    return content(run)[0]


def honest_readiness(run: Run) -> InvariantResult:
    """INV-5: no worker reports ready while a GPU file is missing, detached or a placeholder."""
    return content(run)[1]
