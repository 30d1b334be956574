"""History queries every checker shares: the run indexed by node and kind, paths, probes, causes.

How this works
--------------
`Run` holds the history in time order (a copy: the caller's list is left alone) and
`final_state`, indexed by node and kind. A worker's events are those of its node; the harness's
events about a worker (`chaos.fault`, `chaos.kill`, node "host") count as that worker's
(`node_of`). Paths are compared jail-relative with the merged-usr `usr/` removed: a probe through
`lib -> usr/lib` names the file the CLI resolved to `usr/lib` (`same_file`); a path outside every
known jail root (`cli.start` rootfs and `final_state["jail"]`) is compared on parent directory +
basename.

The causal chain of a lost file is found backwards from the bad probe (`removal_before`,
`chain_of`): the latest `cli.cleanup.unlink` by *another* node of the same file (or an
`impl.populate_cleanup` that removed it, or a `cdi.symlink`: create-symlinks renaming its link over a
regular file there, SPEC CDI-3), then, in that CLI process (same node and pid, after its
`cli.start`), the `cli.fail` that started the cleanup and the failpoint that fired before it, then
the harness's `chaos.fault` that armed that failpoint; for a rename, the `cdi.hook` that made it.
`describe` prints one event on one line;
times are seconds since the history's first event.

The racing pair of a violation of the seed bug's shape (`racing_pair`) is read from its chain: the
cleanup's unlink that removed the file, the victim's mount of that path before it, who created
the placeholder, and the scheduler's step of each when the run was scheduled. `gpujail reproduce
--shrink` prints it in words and the timeline picture marks it, both from this one finder.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from gpujail.backends.probes import NO_RESULT
from gpujail.spec import PLACEHOLDER_MAX

from .results import plural

FAULT_ACTIONS = ("return", "panic", "kill")       # failpoint actions that make a step fail


# -- the run: sorted events, the jail roots, time and path helpers -------------------------------

class Run:
    """The history in time order (a copy: the caller's list is left alone) with `final_state`."""

    def __init__(self, history: list[dict], final_state: dict | None):
        self.events = sorted(history, key=lambda e: e.get("t", 0.0))
        self.final = final_state or {}
        self.t0 = self.events[0].get("t", 0.0) if self.events else 0.0
        roots = {e["rootfs"] for e in self.events if e.get("kind") == "cli.start" and e.get("rootfs")}
        if self.final.get("jail"):
            roots.add(str(self.final["jail"]))
        self.jails = tuple(sorted((r.rstrip("/") for r in roots), key=len, reverse=True))
        self._by_node: dict[str, list[dict]] = {}
        self._by_kind: dict[str, list[dict]] = {}
        for e in self.events:
            self._by_node.setdefault(node_of(e), []).append(e)
            self._by_kind.setdefault(e.get("kind"), []).append(e)
        self.removals = [e for e in self.of("cli.cleanup.unlink", "impl.populate_cleanup", "impl.mutant.unlink",
                                            "cdi.symlink") if e.get("kind") != "cdi.symlink" or replaced_a_file(e)]
        self._memo: dict = {}

    def memo(self, key: str, compute):
        """`compute()` once per run, shared by the checkers that need it (INV-1 and INV-5 judge
        the same pass over the ready spans)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def of(self, *kinds: str) -> list[dict]:
        """Events of these kinds, in time order."""
        if len(kinds) == 1:
            return self._by_kind.get(kinds[0], [])
        return [e for e in self.events if e.get("kind") in kinds]

    def node_events(self, node: str) -> list[dict]:
        return self._by_node.get(node, [])

    def rel(self, path: str) -> str:
        return relative(path, self.jails)

    def at(self, event: dict) -> str:
        return f"t={event.get('t', 0.0) - self.t0:.3f}s"


def driver_versions(run: Run) -> dict[str, str]:
    """Each GPU node's driver version, as the run's `chaos.begin` lists them ({} when it does not):
    the nodes a GPU job runs on, whose ready spans the probes must reach (CPU workers and login
    nodes have none)."""
    return run.memo("versions", lambda: next((e.get("versions") or {} for e in run.of("chaos.begin")), {}))


def node_of(event: dict) -> str:
    """The worker an event belongs to: its node, or for harness events about a worker, that worker."""
    node = event.get("node") or "host"
    if node == "host" and event.get("worker"):
        return str(event["worker"])
    return str(node)


def relative(path, jails: tuple[str, ...] = ()) -> str:
    """`path` relative to the jail root it lies under (already relative paths are kept)."""
    path = str(path)
    if not path.startswith("/"):
        return path
    for root in jails:
        if path.startswith(root + "/"):
            return path[len(root) + 1:]
    return path


def normalised(rel: str) -> str:
    """Jail-relative path with the merged-usr prefix removed: `lib/x` and `usr/lib/x` are one file."""
    return os.path.normpath(rel).lstrip("/").removeprefix("usr/")


def same_file(a, b, jails: tuple[str, ...] = ()) -> bool:
    """Do two recorded paths name the same jail file (through the jail's merged-usr symlinks)?"""
    ra, rb = relative(a, jails), relative(b, jails)
    if not ra.startswith("/") and not rb.startswith("/"):
        return normalised(ra) == normalised(rb)
    return _tail(ra) == _tail(rb)


def _tail(path: str) -> str:
    return "/".join(os.path.normpath(path).split("/")[-2:])


# -- probe results --------------------------------------------------------------------------

def is_bad(result: dict) -> bool:
    loader = result.get("loader")
    return (result.get("attached", True) is False or result.get("size") is None
            or result.get("same_bytes") is False or (loader is not None and loader != "ok"))


def what_went_wrong(result: dict) -> str:
    """What a GPU job saw instead of the driver file, in a few words."""
    if str(result.get("error") or "").startswith(NO_RESULT):   # the probe could not clear it: say why
        return result["error"]
    if result.get("lookup") and result.get("size") is None:   # the loader found no usable file for the soname
        return "nothing loaded" + (f" ({result['resolved']})" if result.get("resolved") else "")
    parts = []
    if result.get("attached", True) is False:
        parts.append("mount detached")
    size = result.get("size")
    if size is None:
        parts.append("file missing" + (f" ({result['error']})" if result.get("error") else ""))
    elif result.get("same_bytes") is False or size < PLACEHOLDER_MAX:
        parts.append(f"{size}-byte file that is not the host file" + (" (a placeholder)" if size < PLACEHOLDER_MAX else ""))
    if not parts:
        parts.append("loader failed")
    if result.get("lookup") and result.get("resolved"):
        parts.insert(0, f"the lookup gave {result['resolved']}")
    return ", ".join(parts)


def loader_says(result: dict) -> str | None:
    """The loader's complaint without the leading path (`/j/usr/lib/libx.so.1: file too short`), or
    the soname a lookup asked for (`libx.so.1: cannot open shared object file`)."""
    loader = result.get("loader")
    if loader is None or loader == "ok":
        return None
    head, sep, rest = str(loader).partition(": ")
    return rest if sep and (head.startswith("/") or head == result.get("lookup")) else str(loader)


def describe(event: dict, t0: float = 0.0, jails: tuple[str, ...] = ()) -> str:
    """One line per event: `t=0.412s w3: cli.cleanup.unlink usr/lib/...  size=0`."""
    kind = event.get("kind", "?")
    head = f"t={event.get('t', 0.0) - t0:.3f}s {node_of(event)}: {kind}"
    f = {k: v for k, v in event.items() if k not in ("t", "node", "pid", "kind")}

    def rel(p) -> str:
        return relative(p, jails)

    if kind == "probe":
        results = f.get("results") or []
        bad = [r for r in results if is_bad(r)]
        if not bad:
            return f"{head} {len(results)} files, all intact"
        r = bad[0]
        text = f"{head} {len(results)} files, {len(bad)} bad: {rel(r.get('path', '?'))}: {what_went_wrong(r)}"
        return text + (f"; loader says: {loader_says(r)}" if loader_says(r) else "")
    if kind == "failpoint":
        arg = f"({f['arg']})" if f.get("arg") is not None else ""
        where = f" at {rel(f['path'])}" if f.get("path") else ""
        return f"{head} {f.get('name')} hit {f.get('hit')}: {f.get('action')}{arg}{where}"
    if kind == "cli.fail":
        return f"{head} {f.get('error')} (after {plural(f.get('mounted') or 0, 'mount')})"
    if kind in ("cli.cleanup.unlink", "cli.cleanup.keep"):
        why = f"{f['size']} bytes" if "size" in f else f.get("why", "")
        return f"{head} {rel(f.get('path', '?'))} ({why})"
    if kind == "chaos.fault":
        return f"{head} {f.get('failpoint')}={f.get('term')} armed on worker {f.get('worker')}"
    parts = []
    for k, v in f.items():
        if k in ("path", "dst", "src", "rootfs") and isinstance(v, str):
            v = rel(v)
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        text = " ".join(str(text).split())
        parts.append(f"{k}={text[:157] + '...' if len(text) > 160 else text}")
    return " ".join([head, *parts])


# -- causes ---------------------------------------------------------------------------------

def replaced_a_file(event: dict) -> bool:
    """A `cdi.symlink` whose rename replaced a regular file (`replaced` "- N bytes", fixtures/fake_cdi_hook.py):
    that file's removal, as an unlink is (CDI-3: mounts on it detach, K-1). A link flip or a new link is none."""
    return event.get("kind") == "cdi.symlink" and str(event.get("replaced", "")).startswith("- ")


def _hook_of(run: Run, event: dict) -> dict | None:
    """The `cdi.hook` (same node and pid, before it) whose run recorded `event`."""
    hooks = [e for e in run.node_events(node_of(event)) if e.get("kind") == "cdi.hook"
             and e.get("pid") == event.get("pid") and e.get("t", 0.0) <= event.get("t", 0.0)]
    return hooks[-1] if hooks else None


def _renamed_path(run: Run, event: dict) -> str:
    """A `cdi.symlink`'s path (relative to its hook's container root) as a path in that root."""
    hook = _hook_of(run, event)
    path = str(event.get("path", ""))
    return os.path.join(hook["root"], path.lstrip("/")) if hook and hook.get("root") else path.lstrip("/")


def removal_before(run: Run, path: str, victim: str, t: float) -> dict | None:
    """The latest event by a node other than `victim` that removed the jail file `path` and may have
    acted before `t`: it took effect from its `began` on, and its record is written after the system
    call, so one written just after a probe's can be what that probe saw (a probe written 1 ms before
    an unlink found the placeholder that unlink was detaching its mount from)."""
    for e in reversed(run.removals):
        if e.get("began", e.get("t", 0.0)) > t or node_of(e) == victim:
            continue
        if e.get("kind") in ("cli.cleanup.unlink", "impl.mutant.unlink") and same_file(e.get("path", ""), path,
                                                                                        run.jails):
            return e
        if e.get("kind") == "impl.populate_cleanup" and any(
                same_file(p, path, run.jails) for p in e.get("removed") or []):
            return e
        if e.get("kind") == "cdi.symlink" and same_file(_renamed_path(run, e), path, run.jails):
            return e
    return None


def chain_of(run: Run, removal: dict) -> list[dict]:
    """What led to `removal`: [chaos.fault?, failpoint?, cli.fail?, removal] (a rename: [cdi.hook?,
    removal]), oldest first."""
    if removal.get("kind") == "cdi.symlink":
        return [e for e in (_hook_of(run, removal), removal) if e]
    if removal.get("kind") != "cli.cleanup.unlink":
        return [removal]
    node, pid, t = node_of(removal), removal.get("pid"), removal["t"]
    same_cli = [e for e in run.node_events(node) if e.get("pid") == pid and e["t"] <= t]
    starts = [e for e in same_cli if e.get("kind") == "cli.start"]
    since = starts[-1]["t"] if starts else float("-inf")   # pids repeat across a worker's restarts
    fails = [e for e in same_cli if e.get("kind") == "cli.fail" and e["t"] >= since]
    cli_fail = fails[-1] if fails else None
    upto = cli_fail["t"] if cli_fail else t
    # the fault that failed it: one of its failpoints, or a syscall strace injected into it (whose
    # event the wrapper records under its own pid, naming the CLI's)
    fps = [e for e in run.node_events(node) if since <= e["t"] <= upto and (
        (e.get("kind") == "failpoint" and e.get("pid") == pid and e.get("action") in FAULT_ACTIONS)
        or (e.get("kind") == "cli.syscall_fault" and e.get("cli_pid") == pid))]
    fp = fps[-1] if fps else None
    chain = [e for e in (fp, cli_fail) if e] + [removal]
    anchor = chain[0]["t"]
    fault_name = fp and (fp.get("name") or "syscall." + fp.get("syscall", ""))
    faults = [e for e in run.of("chaos.fault") if str(e.get("worker")) == node and e["t"] <= anchor
              and (fp is None or not e.get("failpoint") or e.get("failpoint") == fault_name)]
    return ([faults[-1]] if faults else []) + chain


def probe_began(probe: dict) -> float:
    """When a probe round began its lookups. Its event is written when it ends (`t`), and a round
    under GlusterFS latency can take seconds: a file it looked at before a neighbour's cleanup or a
    fault says nothing about after it, so a round is evidence only about what happened before it
    began (SPEC 6). A round with no `began` (the model's take no time) began when it was written."""
    return probe.get("began", probe["t"])


def late_detachment(run: Run, removal: dict, probe: dict) -> dict | None:
    """The victim's last probe after `removal` that still saw the removed file intact (the mount
    outlived the remote unlink), or None when the first probe after it already found it gone (K-1,
    or a client that revalidates at every lookup)."""
    victim = node_of(probe)
    paths = {normalised(run.rel(r.get("path", ""))) for r in probe.get("results") or [] if is_bad(r)}
    good = None
    for p in run.node_events(victim):
        if p.get("kind") != "probe" or not (removal["t"] < probe_began(p) and p["t"] < probe["t"]):
            continue
        if any(normalised(run.rel(r.get("path", ""))) in paths and not is_bad(r) for r in p.get("results") or []):
            good = p
    return good


def cut_off(run: Run, node: str, since: float, probe: dict) -> dict | None:
    """The network fault (`jailfs.fault`, gpujail/backends/jailfs.py) that cut `node` off from the
    jail during the probe round `probe` (from when it began to when it was written), for a node alive
    since `since`: its own client killed by the harness (for the rest of that node's life), or the
    brick down (until it cleared). The round's OUTAGE_ERRORS then are the injected fault's, not a
    loss an implementation caused. The fault acts from when the harness began it (`began`), before
    its event was written (a killed client's daemon is waited for)."""
    began, t = probe_began(probe), probe["t"]
    for f in run.of("jailfs.fault"):
        if not since <= f.get("began", f["t"]) <= t:
            continue
        if f.get("worker"):
            if f["worker"] == node:
                return f
            continue
        clears = [c["t"] for c in run.of("jailfs.clear") if c["t"] >= f["t"] and c.get("fault") == f.get("fault")]
        if began <= min(clears, default=float("inf")):   # still down when the round began
            return f
    return None


def cause_text(run: Run, removal: dict) -> str:
    who = node_of(removal)
    if removal.get("kind") == "impl.populate_cleanup":
        return f"worker {who}'s populate-jail cleanup removed it at {run.at(removal)}"
    if removal.get("kind") == "impl.mutant.unlink":
        return f"worker {who}'s implementation removed or replaced it at {run.at(removal)}"
    if removal.get("kind") == "cdi.symlink":
        size = str(removal.get("replaced", "")).removeprefix("- ").removesuffix(" bytes")
        return (f"worker {who}'s create-symlinks replaced it (a {size}-byte file) with a link to "
                f"{removal.get('target')} at {run.at(removal)}")
    return f"worker {who}'s CLI cleanup unlinked it at {run.at(removal)}"


# -- the racing pair of the seed bug ---------------------------------------------------------------

@dataclass(frozen=True)
class RacingPair:
    """The two steps whose order makes the headline violation: another worker's CLI cleanup
    `unlink`ed the placeholder the victim had `mount`ed over, before the victim's `probe`."""
    unlink: dict
    mount: dict
    probe: dict                      # the violation
    path: str                        # jail-relative
    created: dict | None = None      # the first `cli.create` of the placeholder before the unlink
    steps: dict[str, dict] = field(default_factory=dict)   # "unlink", "mount", "created": its sched.step
    t0: float = 0.0

    @property
    def victim(self) -> str:
        return node_of(self.probe)

    @property
    def remover(self) -> str:
        return node_of(self.unlink)

    def step(self, which: str) -> str:
        """` (step N, failpoint)` when the run was scheduled, else ''."""
        s = self.steps.get(which)
        return f" (step {s['step']}, {s['failpoint']})" if s else ""

    def at(self, event: dict) -> str:
        return f"t={event['t'] - self.t0:.3f}s"

    def words(self) -> str:
        """The pair in one sentence (what `gpujail reproduce --shrink` prints after `racing pair: `)."""
        made = self.created
        over = (f", the placeholder {node_of(made)} created{self.step('created')} at {self.at(made)}" if made
                else " it")
        return (f"{self.remover}'s unlink({self.path}) (CLI cleanup{self.step('unlink')}, "
                f"{self.at(self.unlink)}) ran after {self.victim}'s mount({self.path}){self.step('mount')} "
                f"at {self.at(self.mount)} over{over}, and before {self.victim}'s probe at {self.at(self.probe)}")

    def label(self) -> str:
        """The pair in a few words, for the picture."""
        def one(who: str, what: str, which: str) -> str:
            s = self.steps.get(which)
            return f"{who} {what}" + (f" (step {s['step']})" if s else "")
        return (f"racing pair: {one(self.remover, 'unlink', 'unlink')} after "
                f"{one(self.victim, 'mount', 'mount')} of {os.path.basename(self.path)}")


def racing_pair(history: list[dict], verdict) -> RacingPair | None:
    """The racing pair of `verdict` (a chaos.checker.Verdict of `history`): the last CLI cleanup
    unlink of its chain, and the victim's latest mount of that same path before it. None when the
    run is valid or its violation is not of the seed bug's shape (no cleanup unlink in its chain, no
    such mount)."""
    probe = verdict.first_violation
    unlink = next((e for e in reversed(verdict.chain) if e.get("kind") == "cli.cleanup.unlink"), None)
    if unlink is None or not probe or not probe.get("node"):
        return None
    victim = probe["node"]
    events = sorted(history, key=lambda e: e.get("t", 0.0))
    before = [e for e in events if e.get("t", 0.0) < unlink["t"]]
    mount = next((e for e in reversed(before) if e.get("kind") == "cli.mount" and e.get("node") == victim
                  and e.get("dst") == unlink["path"]), None)
    if mount is None:
        return None
    rel = relative(unlink["path"], verdict.jails)
    made = next((e for e in before if e.get("kind") == "cli.create" and e.get("path") == unlink["path"]), None)

    def step(event: dict | None, failpoint: str) -> dict | None:
        """The scheduler's release of this event's worker at `failpoint` on this path just before it."""
        if event is None:
            return None
        return next((e for e in reversed(before) if e.get("kind") == "sched.step" and e.get("worker") == event["node"]
                     and e.get("failpoint") == failpoint and e.get("path") == rel and e["t"] < event["t"]), None)

    steps = {which: s for which, s in (("unlink", step(unlink, "cli.before_remove")),
                                       ("mount", step(mount, "cli.before_mount")),
                                       ("created", step(made, "cli.before_create"))) if s}
    return RacingPair(unlink, mount, probe, rel, made, steps, verdict.t0)
