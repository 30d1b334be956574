"""A jail on a network file system: the fault windows of its faults, and K-2 in a causal chain.

How this works
--------------
Runs on `gluster` or `nodelocal-locks` (gpujail/backends/jailfs.py) record two more kinds of event:
`jailfs.fault` when the harness kills the brick, adds latency or kills a node's client, and
`jailfs.clear` when that fault ends. This module judges them like windows.py's windows, as pure
predicates of the history, registered in `windows.WINDOWS` when imported (chaos/scenario.py does):

* `net-fault-while-starting`: a network fault began while a start was in progress, and that start
  failed (the fail-safe case: it must exit non-zero and delete nothing);
* `net-fault-while-ready`: a network fault began while a worker was ready, and a probe round of
  that worker began under the fault, before it cleared (its mounts must outlive the fault);
* `net-fault-cleared`: a fault cleared and a worker became ready after it (convergence).

`late_detachment(run, removal, probe)` explains a loss on a file system whose nodes revalidate
(K-2): the remote unlink did not detach the victim's mount; the victim's probes after it still saw
the file (the last one is returned) until the lookup of `probe` found it gone. `explain(run,
violation)` turns that into the chain a person reads: the removal's chain, the last probe that
still saw the file, the probe whose lookup detached it.
"""
from __future__ import annotations

from .content import ready_spans
from .queries import Run, is_bad, late_detachment, node_of, probe_began, removal_before
from .windows import WINDOWS, _starts


def _spans(run: Run) -> list[tuple[dict, float]]:
    """(jailfs.fault event, time it cleared or the end of the run) for every network fault."""
    clears = run.of("jailfs.clear")
    out = []
    for f in run.of("jailfs.fault"):
        ends = [c["t"] for c in clears if c["t"] >= f["t"] and c.get("fault") == f.get("fault")]
        out.append((f, min(ends, default=float("inf"))))
    return out


def _what(f: dict) -> str:
    return f["fault"] + (f" of {f['worker']}" if f.get("worker") else "")


def net_fault_while_starting(run: Run) -> tuple[bool, str]:
    for f, _ in _spans(run):
        for node, t0, t1 in _starts(run):
            if not t0 <= f["t"] < t1:
                continue
            exits = [e for e in run.node_events(node) if e.get("kind") == "worker.exit" and e["t"] == t1]
            if exits and exits[0].get("code") not in (0, "0"):
                return True, (f"{_what(f)} at {run.at(f)} while {node} was starting; "
                              f"that start failed at {run.at(exits[0])}")
    return False, "no network fault began during a start that then failed"


def net_fault_while_ready(run: Run) -> tuple[bool, str]:
    spans = ready_spans(run)
    for f, end in _spans(run):
        for node, ready, stop in spans:
            # probed under the fault: a round that began after it began and before it cleared
            if ready["t"] <= f["t"] < stop and any(
                    p.get("kind") == "probe" and f["t"] < probe_began(p) < end and p["t"] < stop
                    for p in run.node_events(node)):
                return True, f"{_what(f)} at {run.at(f)} while {node} was ready, probed under it"
    return False, "no network fault began while a probed worker was ready"


def net_fault_cleared(run: Run) -> tuple[bool, str]:
    for c in run.of("jailfs.clear"):
        later = [r for r in run.of("worker.ready") if r["t"] > c["t"]]
        if later:
            return True, f"{c['fault']} cleared at {run.at(c)}; {node_of(later[0])} ready after it at {run.at(later[0])}"
    faults = run.of("jailfs.fault")
    if faults and not run.of("jailfs.clear"):
        return False, f"{_what(faults[0])} never cleared"
    return False, "no worker became ready after a network fault cleared"


WINDOWS.update({
    "net-fault-while-starting": ("a network fault began during a start, which failed", net_fault_while_starting),
    "net-fault-while-ready": ("a network fault began while a probed worker was ready", net_fault_while_ready),
    "net-fault-cleared": ("a network fault cleared and a worker became ready after it", net_fault_cleared),
})


# -- K-2: the lookup that detached --------------------------------------------------------------

def explain(run: Run, violation) -> list[str]:
    """The K-2 reading of an INV-1 violation, in lines: the remote unlink, how long the victim's
    probes still saw the file, and the lookup that detached it; [] when K-2 played no part."""
    probe = violation.event
    bad = [r for r in probe.get("results") or [] if is_bad(r)]
    if probe.get("kind") != "probe" or not bad:
        return []
    removal = removal_before(run, bad[0].get("path", ""), node_of(probe), probe["t"])
    if removal is None:
        return []
    still = late_detachment(run, removal, probe)
    if still is None:
        return []
    return [f"{node_of(removal)} unlinked {run.rel(bad[0].get('path', ''))} at {run.at(removal)} through its own client",
            f"{node_of(probe)} still saw it attached at {run.at(still)} (its client's cached dentry, K-2)",
            f"{node_of(probe)}'s lookup at {run.at(probe)} found it gone and detached its mount"]
