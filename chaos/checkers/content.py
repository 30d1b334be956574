"""INV-1 no lost content and INV-5 honest readiness: what ready workers saw (SPEC section 6).

How this works
--------------
A worker is *ready* from its `worker.ready` until its next `worker.exit`, `worker.start`,
`worker.restart` or `chaos.kill` (a killed node's span ends at the kill). Every `probe` its node
records in that span must show each file attached, readable (`size` not None), the host's bytes
(`same_bytes` not False) and, where loaded, `loader == "ok"`. A probe round answers every file the
worker's probes ask about (the files of all its rounds): a file a round has no result for, or one
the probe could not clear (`error` starting with probes.NO_RESULT: its probe crashed or timed out),
counts as bad, never as clean. The first bad result of each file is a violation:

* INV-5 when it is the span's first probe: the worker reported ready with the file already bad,
  unless another node's cleanup removed it *after* the worker became ready (then the worker was
  honest and lost the file later, which is INV-1);
* INV-1 otherwise, with the causal chain of the removal (queries.chain_of).

Missing evidence is never a pass (SPEC section 6, "What a PASS means"): every ready span of a GPU
node (those `chaos.begin` gives a driver version, or every node when it names none) must be
probed, and probed again after each thing another node did during it that can take a file away or
change what a lookup finds (`DISTURBANCES`: a failed start, a kill, an ldconfig on the jail, a
recorded removal, a worker on another driver version becoming ready). A span the probes did not
reach makes INV-1 and INV-5 UNKNOWN, naming the worker and what it was not probed after (a
violation found elsewhere still makes them FAIL).

Both invariants judge one pass over the spans (`content`, memoised on the run); `lost_content` and
`honest_readiness` are the two checkers.
"""
from __future__ import annotations

from gpujail.backends.fs_processes import OUTAGE_ERRORS
from gpujail.backends.probes import unanswered

from .queries import (
    Run,
    cause_text,
    chain_of,
    cut_off,
    driver_versions,
    is_bad,
    late_detachment,
    loader_says,
    node_of,
    normalised,
    probe_began,
    removal_before,
    what_went_wrong,
)
from .results import MAX_LISTED, UNKNOWN, InvariantResult, Violation, plural

NOBODY_READY = "no worker became ready"   # INV-1 and INV-5 UNKNOWN: nothing to judge (a hostile jail may allow it)
SPAN_END = ("worker.exit", "worker.start", "worker.restart", "chaos.kill")


def ready_spans(run: Run) -> list[tuple[str, dict, float]]:
    """(worker, its worker.ready event, end time) for every ready span of every worker."""
    spans = []
    for ready in run.of("worker.ready"):
        node, t = node_of(ready), ready["t"]
        ends = [e["t"] for e in run.node_events(node) if e["t"] > t and e.get("kind") in SPAN_END]
        spans.append((node, ready, min(ends, default=float("inf"))))
    return spans


DISTURBANCES = ("worker.exit", "chaos.kill", "chaos.ldconfig", "cli.cleanup.unlink", "impl.populate_cleanup",
                "impl.mutant.unlink", "worker.ready")


def disturbances(run: Run, node: str, start: float, end: float) -> list[dict]:
    """What other nodes did in [start, end) that can take a file from `node` or change what its
    lookups find: a failed start (its cleanup), a kill, an ldconfig, a removal, a worker on another
    driver version becoming ready (REF-12: the shared soname links may flip)."""
    versions = driver_versions(run)
    out = []
    for e in run.memo("disturbances", lambda: run.of(*DISTURBANCES)):
        if not start <= e["t"] < end or node_of(e) == node:
            continue
        if e["kind"] == "worker.exit" and e.get("code") in (0, "0"):
            continue
        if e["kind"] == "worker.ready" and not (versions.get(node) and versions.get(node_of(e))
                                                and versions[node] != versions[node_of(e)]):
            continue
        out.append(e)
    return out


FLEET_SETTLES = ("worker.ready", "worker.exit", "worker.start")   # the runner's last probe round follows them all


def evidence_gap(run: Run, node: str, ready: dict, end: float, probes: list[dict]) -> str | None:
    """Why the probes of this ready span are not enough to judge it (SPEC section 6: probed at
    least once, and after everything that could have hurt it), or None."""
    if driver_versions(run) and node not in driver_versions(run):
        return None   # a CPU worker or login node: no GPU file to probe
    if not probes:
        return f"{node} was never probed while ready (from {run.at(ready)})"
    last = max(map(probe_began, probes))   # a round that began before a disturbance is no evidence after it
    missed = [e for e in disturbances(run, node, ready["t"], end) if e["t"] >= last]
    if missed:
        return f"{node} was not probed after {node_of(missed[0])}'s {missed[0]['kind']} at {run.at(missed[0])}"
    if end == float("inf"):   # open at the run's end: judged at its end, after the fleet settled (SPEC 6)
        settled = run.memo("settled", lambda: max((e["t"] for e in run.of(*FLEET_SETTLES)), default=float("-inf")))
        if last < settled:
            return (f"{node} was not probed at the end of its ready span (its last probe began at "
                    f"{run.at({'t': last})}, the fleet's last start or exit at {run.at({'t': settled})})")
    return None


def asked_of(run: Run, node: str) -> dict[str, str]:
    """The files `node`'s probe rounds ask about: every file any of its rounds was asked (`asked`) or
    answered (the harness asks a worker about the same files every round, so a file one round
    leaves out is short there, and one every round leaves out is short in each). normalised path -> path."""
    paths = [p for e in run.node_events(node) if e.get("kind") == "probe"
             for p in [*(e.get("asked") or []), *(r.get("path", "?") for r in e.get("results") or [])]]
    return {normalised(run.rel(p)): p for p in paths}


def round_results(probe: dict, asked: dict[str, str], run: Run) -> list[dict]:
    """The probe's results, plus a not-cleared result for each asked file it has none for (a round
    with no results at all stands for every file it should have covered)."""
    results = probe.get("results") or []
    got = {normalised(run.rel(r.get("path", "?"))) for r in results}
    missing = [{"path": path} for key, path in asked.items() if key not in got] or (
        [] if results else [{"path": "(every file of the round)"}])
    return results + unanswered(missing, f"the probe round returned {len(results)} of "
                                         f"{max(len(asked), len(results) + len(missing))} results")


def check_content(run: Run) -> tuple[InvariantResult, InvariantResult]:
    inv1, inv5 = [], []
    spans = ready_spans(run)
    probed = probes_seen = 0
    gaps = []
    for node, ready, end in spans:
        probes = [e for e in run.node_events(node) if e.get("kind") == "probe" and ready["t"] <= e["t"] < end]
        gap = evidence_gap(run, node, ready, end, probes)
        if gap:
            gaps.append(gap)
        if not probes:
            continue
        probed += 1
        probes_seen += len(probes)
        asked = asked_of(run, node)
        lost: set[str] = set()
        for i, probe in enumerate(probes):
            for r in round_results(probe, asked, run):
                path = r.get("path", "?")
                key = normalised(run.rel(path))
                if key in lost or not is_bad(r):
                    continue
                if r.get("error") in OUTAGE_ERRORS and cut_off(run, node, ready["t"], probe):
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
        note, valid = NOBODY_READY, UNKNOWN
    elif gaps:   # missing evidence is never a pass
        note, valid = (f"{plural(len(gaps), 'ready span')} of {len(spans)} not probed enough: "
                       + "; ".join(gaps[:MAX_LISTED]) + ("; ..." if len(gaps) > MAX_LISTED else "")), UNKNOWN
    else:
        note, valid = f"{plural(probes_seen, 'probe')} of {plural(probed, 'ready span')}", True
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
