"""Fault windows: did a run exercise what its scenario exists for? (the "sometimes" assertions of
deterministic-simulation tools)

How this works
--------------
A scenario declares, as data, the windows it exists to open (`windows = ["failure-while-ready"]`
in its TOML). Each window is a pure predicate of the history, like a checker: `opened(name, run)`
returns (opened?, one line saying where or why not). A run whose invariants all hold but in which a
declared window never opened proved nothing about that fault: it is INCONCLUSIVE, never PASS
(chaos/runner.py `ChaosRun.judge`). A violation stays a violation whether or not the window opened.

The windows (WINDOWS: name -> (description, predicate)):

* `overlap`: two workers' starts ran at the same time (a cold race is possible at all);
* `failure-while-ready`: a start failed (exit code non-zero, a killed CLI included) while another
  worker was ready: the failing neighbour whose cleanup could hurt it;
* `kill-while-ready`: the harness killed a node while another worker was ready;
* `kill`: the harness killed a node at all (e.g. the lock holder, before anyone is ready);
* `restart`: some worker was restarted;
* `other-version-ready`: a worker on one driver version became ready while a worker on another was
  ready (REF-12: the moment a shared soname link would flip);
* `ldconfig-while-ready`: an ldconfig ran on the jail (the scenario's ldconfig nemesis) while a worker
  other than the nemesis's own node was ready, and that worker was probed after it (PR #2621, PR #2682);
* `stopped-holder`: a worker was stopped (failpoint action `stop`: SIGSTOP) holding the placeholder
  lock, and another worker's start failed before it was continued (its bounded lock wait gave up);
* `lock-lost`: the runner took the lock file from under its holder (`chaos.lock_fault`), and another
  worker took the lock or became ready before that holder went on: two holders at once;
* `link-swapped`: the runner swapped a symlink into the jail (`chaos.link`) while a start that had
  begun before it was still under way (it checked the jail before the link was there);
* `populate-while-ready`: the populate-jail cleanup (REF-9) removed placeholders while a worker was ready;
* `host-upgraded-mid-start`: the runner upgraded a host's driver (`chaos.upgrade`) while its worker's
  start was under way (a file set taken from `list` before it, a `configure` after it);
* `torn-marker`: a start was killed inside the write of a marker it had just created exclusively
  (failpoint `kill(write)` at `ref.before_marker`): a 0-byte marker left for the next start (REF-3/REF-5).

A window opens only on a worker that is alive and ready at that moment: the ready spans end at a
kill (content.ready_spans), so a node the harness retired (the prewarm node) opens nothing after.
"""
from __future__ import annotations

from collections.abc import Callable

from gpujail.spec import LOCK as PLACEHOLDER_LOCK

from .content import ready_spans
from .locks import holds_lock
from .queries import Run, driver_versions, node_of, probe_began


def _starts(run: Run) -> list[tuple[str, float, float]]:
    """(worker, start time, end time) of every start attempt (worker.start to its worker.exit)."""
    out = []
    for s in run.of("worker.start") + run.of("worker.restart"):
        node = node_of(s)
        ends = [e["t"] for e in run.node_events(node) if e.get("kind") == "worker.exit" and e["t"] >= s["t"]]
        out.append((node, s["t"], min(ends, default=float("inf"))))
    return out


def _ready_at(run: Run, t: float, other_than: str | None = None) -> list[str]:
    return [n for n, ready, end in ready_spans(run) if ready["t"] <= t < end and n != other_than]


def overlap(run: Run) -> tuple[bool, str]:
    starts = sorted(_starts(run), key=lambda s: s[1])
    for i, (a, t0, t1) in enumerate(starts):
        for b, u0, _ in starts[i + 1:]:
            if u0 >= t1:
                break
            if b != a:
                return True, f"{a} and {b} started at once (t={u0 - run.t0:.3f}s)"
    return False, "no two starts ran at the same time"


def failure_while_ready(run: Run) -> tuple[bool, str]:
    for e in run.of("worker.exit"):
        if e.get("code") in (0, "0"):
            continue
        others = _ready_at(run, e["t"], node_of(e))
        if others:
            return True, f"{node_of(e)}'s start failed at {run.at(e)} while {others[0]} was ready"
    return False, "no start failed while another worker was ready"


def fault_kills(run: Run) -> list[dict]:
    """The harness's kills that are faults: a node it retires when its job is done (the prewarm
    node: `barrier` empty) ends that node's ready span but is no fault."""
    return [e for e in run.of("chaos.kill") if e.get("barrier") != ""]


def kill_while_ready(run: Run) -> tuple[bool, str]:
    for e in fault_kills(run):
        others = _ready_at(run, e["t"], e.get("worker"))
        if others:
            return True, f"{e.get('worker')} killed at {run.at(e)} while {others[0]} was ready"
    return False, "no node was killed while another worker was ready"


def kill(run: Run) -> tuple[bool, str]:
    kills = fault_kills(run)
    return (True, f"{kills[0].get('worker')} killed at {run.at(kills[0])}") if kills else (False, "nobody was killed")


def restart(run: Run) -> tuple[bool, str]:
    r = run.of("worker.restart")
    return (True, f"{node_of(r[0])} restarted at {run.at(r[0])}") if r else (False, "no worker restarted")


def other_version_ready(run: Run) -> tuple[bool, str]:
    versions = driver_versions(run)
    for node, ready, _ in ready_spans(run):
        for other in _ready_at(run, ready["t"], node):
            if versions.get(node) and versions.get(other) and versions[node] != versions[other]:
                return True, (f"{node} (driver {versions[node]}) became ready at {run.at(ready)} while {other} "
                              f"(driver {versions[other]}) was ready")
    return False, "no worker became ready while one on another driver version was ready"


def ldconfig_while_ready(run: Run) -> tuple[bool, str]:
    spans = ready_spans(run)
    for e in run.of("chaos.ldconfig"):
        for node, ready, end in spans:
            if node != node_of(e) and ready["t"] <= e["t"] < end and any(
                    p.get("kind") == "probe" and e["t"] < probe_began(p) and p["t"] < end for p in run.node_events(node)):
                return True, f"ldconfig ({e.get('view')}) at {run.at(e)} while {node} was ready and probed after it"
    return False, "no ldconfig ran while a probed worker was ready"


def _release_after(run: Run, barrier: str | None, t: float) -> float:
    """When barrier `barrier` opened after time `t` (inf: never)."""
    return min((e["t"] for e in run.of("chaos.release") if e.get("barrier") == barrier and e["t"] >= t),
               default=float("inf"))


def stopped_holder(run: Run) -> tuple[bool, str]:
    for e in run.of("failpoint"):
        if e.get("action") != "stop" or not holds_lock(run, node_of(e), e["t"]):
            continue
        resumed = _release_after(run, e.get("arg"), e["t"])
        for x in run.of("worker.exit"):
            if node_of(x) != node_of(e) and e["t"] < x["t"] < resumed and x.get("code") not in (0, "0"):
                return True, (f"{node_of(e)} stopped holding the lock at {run.at(e)}; {node_of(x)}'s start failed "
                              f"at {run.at(x)} ({x.get('code')}) before it was continued")
    return False, "no start failed while a stopped worker held the lock"


def lock_lost(run: Run) -> tuple[bool, str]:
    for f in run.of("chaos.lock_fault"):
        holder, lock = f.get("holder"), f.get("lock", PLACEHOLDER_LOCK)
        if not holds_lock(run, holder, f["t"], lock):
            continue
        goes_on = _release_after(run, f.get("barrier"), f["t"])
        for x in run.of("impl.lock.acquired", "worker.ready"):
            if node_of(x) != holder and f["t"] < x["t"] < goes_on and x.get("lock", lock) == lock:
                what = "took the lock" if x["kind"] == "impl.lock.acquired" else "became ready"
                return True, (f"{holder}'s lock file {f.get('fault')}d at {run.at(f)} while it held the lock; "
                              f"{node_of(x)} {what} at {run.at(x)}, before {holder} went on")
    return False, "no lock fault let another worker past a live holder"


def link_swapped(run: Run) -> tuple[bool, str]:
    for e in run.of("chaos.link"):
        for node, t0, t1 in _starts(run):
            if t0 < e["t"] < t1:
                return True, f"{e.get('path')} swapped to a symlink at {run.at(e)} during {node}'s start"
    return False, "no symlink was swapped in while a start was under way"


def populate_while_ready(run: Run) -> tuple[bool, str]:
    for e in run.of("impl.populate_cleanup"):
        ready = _ready_at(run, e["t"], node_of(e))
        if ready and e.get("removed"):
            return True, (f"{node_of(e)}'s populate-jail cleanup removed {len(e['removed'])} placeholders at "
                          f"{run.at(e)} while {ready[0]} was ready")
    return False, "no populate-jail cleanup removed anything while a worker was ready"


def host_upgraded_mid_start(run: Run) -> tuple[bool, str]:
    for e in run.of("chaos.upgrade"):
        for node, t0, t1 in _starts(run):
            if node == e["worker"] and t0 < e["t"] < t1:
                return True, (f"{node}'s host driver upgraded to {e.get('version')} at {run.at(e)} under its start "
                              f"(after its `list`, at barrier {e.get('barrier')})")
    return False, "no host was upgraded while its worker's start was under way"


def torn_marker(run: Run) -> tuple[bool, str]:
    for e in run.of("failpoint"):
        if (e.get("name"), e.get("action"), e.get("arg")) != ("ref.before_marker", "kill", "write"):
            continue
        for x in run.node_events(node_of(e)):
            if x["t"] > e["t"] and x.get("kind") == "worker.exit" and x.get("code") not in (0, "0"):
                return True, (f"{node_of(e)} killed inside the write of marker {e.get('path')} at {run.at(e)}: "
                              f"a 0-byte marker left behind")
    return False, "no start was killed inside a marker's write"


WINDOWS: dict[str, tuple[str, Callable[[Run], tuple[bool, str]]]] = {
    "overlap": ("two starts ran at the same time", overlap),
    "failure-while-ready": ("a start failed while another worker was ready", failure_while_ready),
    "kill-while-ready": ("a node was killed while another worker was ready", kill_while_ready),
    "kill": ("a node was killed", kill),
    "restart": ("a worker was restarted", restart),
    "other-version-ready": ("a worker became ready while one on another driver version was ready",
                            other_version_ready),
    "ldconfig-while-ready": ("an ldconfig ran on the jail while a probed worker was ready", ldconfig_while_ready),
    "stopped-holder": ("a start failed while a stopped worker held the lock", stopped_holder),
    "lock-lost": ("another worker got past the lock while its holder lived", lock_lost),
    "torn-marker": ("a start was killed inside a marker's write", torn_marker),
    "link-swapped": ("a symlink was swapped into the jail during a start", link_swapped),
    "populate-while-ready": ("the populate-jail cleanup removed placeholders while a worker was ready",
                             populate_while_ready),
    "host-upgraded-mid-start": ("a host's driver was upgraded under its worker's start", host_upgraded_mid_start),
}


def opened(name: str, run: Run) -> tuple[bool, str]:
    """(opened?, where or why not) for window `name`; a predicate that raises says so, not opened."""
    try:
        return WINDOWS[name][1](run)
    except Exception as e:   # noqa: BLE001 (like check_safe: a broken window is not a pass)
        return False, f"window {name} raised {type(e).__name__}: {e}"
