"""The chaos checker: a pure judge of one run's history (SPEC section 6), in the style of Jepsen.

How this works
--------------
A run only *records*: every process appends events to the history (gpujail/history.py) and the
harness adds what it saw at the end (`final_state`). `check(history, final_state)` reads both and
returns a `Verdict`; it touches no file, no clock and no kernel, so the same history always gives
the same verdict, and a history saved from a failing CI run can be judged again on a laptop.

Each invariant is one function from the run to an `InvariantResult`: PASS (`True`), FAIL (`False`,
with every `Violation` found) or UNKNOWN (`"unknown"`: the run does not hold the data to decide,
which is never a pass). A violation names its event, the chain of earlier events that caused it,
and one line a person can act on. The verdict is FAIL if any invariant fails, else UNKNOWN if any
is unknown, else PASS; its headline is the violation that happened first.

The invariants (SPEC section 6):

* INV-1 no lost content. A worker is *ready* from its `worker.ready` until its next `worker.exit`,
  `worker.start`, `worker.restart` or `chaos.kill`. Every `probe` its node records in that span
  must show each file attached, readable (`size` not None), the host's bytes (`same_bytes` not
  False) and, where loaded, `loader == "ok"`. The first bad result of each file is a violation.
* INV-2 convergence. With `final_state["transient_only"]`, every worker that started ends ready
  (its last `worker.start`/`worker.exit`/`worker.ready` is a `worker.ready`), within
  `final_state["max_restarts"]` restarts when given.
* INV-3 jail hygiene. `final_state["jail_before"]`/`["jail_after"]` (fixtures/jail.py `snapshot`)
  differ only by placeholders (regular files under 64 bytes named `lib*.so.*`, or under
  `lib/firmware` or `usr/bin`) and their new parent directories, `etc/*.lock`, the flag file,
  `etc/ld.so.cache` and ldconfig's soname symlinks in library directories. Removing or rewriting a
  pre-existing placeholder or the flag is also a "difference by placeholders" (populate-jail
  cleanup does it on purpose; the damage it does when a CLI does it is INV-1's business).
  `final_state["outside_changes"]` must be empty.
* INV-4 no lock on warm starts. In one implementation run of a node (the events between its
  `impl.start`/`impl.exit` boundaries), an `impl.placeholders` with `missing == 0` forbids any
  `impl.lock.wait` on the placeholder lock. Without any `impl.placeholders` event the run cannot
  tell warm from cold: UNKNOWN, unless the implementation is instrumented (`impl.begin`) and never
  waited for that lock at all.
* INV-5 honest readiness. The first probe of a ready span must be intact. A file already bad there
  is INV-5, unless another node's cleanup removed it *after* the worker became ready: then the
  worker was honest and lost the file later, which is INV-1.
* INV-6 no host residue. `final_state["host_mounts"]`, `["processes"]`, `["temp_dirs"]` are empty.

The causal chain of a lost file (INV-1, INV-5) is found backwards from the bad probe: the latest
`cli.cleanup.unlink` by *another* node of the same file (or an `impl.populate_cleanup` that removed
it), then, in that CLI process (same node and pid, after its `cli.start`), the `cli.fail` that
started the cleanup and the failpoint that fired before it, then the harness's `chaos.fault` that
armed that failpoint. "The same file" is decided on the jail-relative path with a leading `usr/`
removed (a probe through `lib -> usr/lib` names the file the CLI resolved to `usr/lib`), or on
parent directory + basename when a path is outside every known jail root (`cli.start` rootfs and
`final_state["jail"]`).

Times in messages are seconds since the history's first event.
"""
from __future__ import annotations

import fnmatch
import json
import os
import stat
import sys
from dataclasses import dataclass, field

from gpujail.spec import FLAG, INVARIANTS, LDCACHE, PLACEHOLDER_MAX
from gpujail.spec import LOCK as PLACEHOLDER_LOCK

UNKNOWN = "unknown"
LIBRARY_DIRS = ("lib/x86_64-linux-gnu", "lib/i386-linux-gnu", "lib64", "lib32", "lib")   # "usr/" removed
FAULT_ACTIONS = ("return", "panic", "kill")       # failpoint actions that make a step fail
SPAN_END = ("worker.exit", "worker.start", "worker.restart", "chaos.kill")
MAX_LISTED = 10                                   # violations listed by summary() beyond the first


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# -- results ----------------------------------------------------------------------------------

@dataclass
class Violation:
    invariant: str
    explanation: str
    event: dict | None = None                     # the violating event (None: found in final_state)
    chain: list[dict] = field(default_factory=list)   # earlier events that caused it, oldest first


@dataclass
class InvariantResult:
    invariant: str
    valid: bool | str                             # True, False or "unknown"
    note: str = ""                                # what was checked, or why it is unknown
    violations: list[Violation] = field(default_factory=list)

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL"}.get(self.valid, "UNKNOWN")


@dataclass
class Verdict:
    valid: bool | str
    results: dict[str, InvariantResult]
    invariant: str | None = None                  # the headline violation's invariant
    first_violation: dict | None = None
    chain: list[dict] = field(default_factory=list)
    explanation: str | None = None
    t0: float = 0.0                               # time of the history's first event
    jails: tuple[str, ...] = ()                   # jail roots seen (to print jail-relative paths)

    def violations(self) -> list[Violation]:
        """Every violation of every invariant, the earliest first (end-state ones last)."""
        out = [v for r in self.results.values() for v in r.violations]
        order = list(INVARIANTS)
        return sorted(out, key=lambda v: (v.event is None, v.event["t"] if v.event else 0.0,
                                          order.index(v.invariant) if v.invariant in order else 99))

    def summary(self) -> str:
        head = {True: "VALID", False: "INVALID", UNKNOWN: "UNKNOWN"}[self.valid]
        lines = [f"verdict: {head}" + (f" ({self.invariant})" if self.invariant else "")]
        for inv, r in self.results.items():
            lines.append(f"  {inv} {INVARIANTS.get(inv, ''):<24} {r.status:<8} {r.note}".rstrip())
        if self.explanation:
            lines += ["", self.explanation]
        if self.chain or self.first_violation:
            lines.append("causal chain:")
            for e in self.chain:
                lines.append("  " + describe(e, self.t0, self.jails))
            if self.first_violation:
                lines.append("  " + describe(self.first_violation, self.t0, self.jails) + "   <- violation")
        others = self.violations()[1:]
        if others:
            lines += ["", f"{len(others)} more violation(s):"]
            lines += [f"  {v.invariant}: {v.explanation}" for v in others[:MAX_LISTED]]
            if len(others) > MAX_LISTED:
                lines.append(f"  ... and {len(others) - MAX_LISTED} more")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready, for a run report."""
        return {"valid": self.valid, "invariant": self.invariant, "explanation": self.explanation,
                "first_violation": self.first_violation, "chain": self.chain,
                "results": {k: {"status": r.status, "note": r.note,
                                "violations": [{"explanation": v.explanation, "event": v.event, "chain": v.chain}
                                               for v in r.violations]}
                            for k, r in self.results.items()}}


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
        self.removals = self.of("cli.cleanup.unlink", "impl.populate_cleanup")

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


def _normalised(rel: str) -> str:
    """Jail-relative path with the merged-usr prefix removed: `lib/x` and `usr/lib/x` are one file."""
    return os.path.normpath(rel).lstrip("/").removeprefix("usr/")


def same_file(a, b, jails: tuple[str, ...] = ()) -> bool:
    """Do two recorded paths name the same jail file (through the jail's merged-usr symlinks)?"""
    ra, rb = relative(a, jails), relative(b, jails)
    if not ra.startswith("/") and not rb.startswith("/"):
        return _normalised(ra) == _normalised(rb)
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
    return ", ".join(parts)


def loader_says(result: dict) -> str | None:
    """The loader's complaint without the leading path (`/j/usr/lib/libx.so.1: file too short`)."""
    loader = result.get("loader")
    if loader is None or loader == "ok":
        return None
    head, sep, rest = str(loader).partition(": ")
    return rest if sep and head.startswith("/") else str(loader)


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

def removal_before(run: Run, path: str, victim: str, t: float) -> dict | None:
    """The latest event before `t` by a node other than `victim` that removed the jail file `path`."""
    for e in reversed(run.removals):
        if e.get("t", 0.0) > t or node_of(e) == victim:
            continue
        if e.get("kind") == "cli.cleanup.unlink" and same_file(e.get("path", ""), path, run.jails):
            return e
        if e.get("kind") == "impl.populate_cleanup" and any(
                same_file(p, path, run.jails) for p in e.get("removed") or []):
            return e
    return None


def chain_of(run: Run, removal: dict) -> list[dict]:
    """What led to `removal`: [chaos.fault?, failpoint?, cli.fail?, removal], oldest first."""
    if removal.get("kind") != "cli.cleanup.unlink":
        return [removal]
    node, pid, t = node_of(removal), removal.get("pid"), removal["t"]
    same_cli = [e for e in run.node_events(node) if e.get("pid") == pid and e["t"] <= t]
    starts = [e for e in same_cli if e.get("kind") == "cli.start"]
    since = starts[-1]["t"] if starts else float("-inf")   # pids repeat across a worker's restarts
    fails = [e for e in same_cli if e.get("kind") == "cli.fail" and e["t"] >= since]
    cli_fail = fails[-1] if fails else None
    upto = cli_fail["t"] if cli_fail else t
    fps = [e for e in same_cli if e.get("kind") == "failpoint" and since <= e["t"] <= upto
           and e.get("action") in FAULT_ACTIONS]
    fp = fps[-1] if fps else None
    chain = [e for e in (fp, cli_fail) if e] + [removal]
    anchor = chain[0]["t"]
    faults = [e for e in run.of("chaos.fault") if str(e.get("worker")) == node and e["t"] <= anchor
              and (fp is None or not e.get("failpoint") or e.get("failpoint") == fp.get("name"))]
    return ([faults[-1]] if faults else []) + chain


def _cause_text(run: Run, removal: dict) -> str:
    who = node_of(removal)
    if removal.get("kind") == "impl.populate_cleanup":
        return f"worker {who}'s populate-jail cleanup removed it at {run.at(removal)}"
    return f"worker {who}'s CLI cleanup unlinked it at {run.at(removal)}"


# -- INV-1 and INV-5: what ready workers saw --------------------------------------------------

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
                key = _normalised(run.rel(path))
                if key in lost or not is_bad(r):
                    continue
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
                        text += f" ({_cause_text(run, removal)})"
                    inv5.append(Violation("INV-5", text + tail, probe, sorted([ready] + chain, key=lambda e: e["t"])))
                else:
                    cause = (f" after {_cause_text(run, removal)}" if removal else
                             "; nothing in the history removed it")
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


# -- INV-2: convergence ----------------------------------------------------------------------

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


# -- INV-3: jail hygiene ---------------------------------------------------------------------

def _entry(value) -> tuple:
    mode, size, link = value
    return int(mode), size, link


def _placeholder(rel: str, entry: tuple) -> bool:
    """A placeholder of any generation: 0-byte (CLI) or marker (REF-5), at a driver-file path."""
    mode, size, _ = entry
    n, name = _normalised(rel), os.path.basename(rel)
    return (stat.S_ISREG(mode) and size is not None and size < PLACEHOLDER_MAX
            and (fnmatch.fnmatchcase(name, "lib*.so.*") or n.startswith(("lib/firmware/", "bin/"))))


def _bookkeeping(rel: str, entry: tuple) -> bool:
    """Lock files, the flag, the linker cache: files the procedure writes on purpose."""
    return stat.S_ISREG(entry[0]) and (rel in (FLAG, LDCACHE) or (os.path.dirname(rel) == "etc" and rel.endswith(".lock")))


def _soname_link(rel: str, entry: tuple) -> bool:
    """A symlink ldconfig makes: lib*.so* in a library directory, pointing at a sibling."""
    mode, _, link = entry
    name = os.path.basename(rel)
    return (stat.S_ISLNK(mode) and os.path.dirname(_normalised(rel)) in LIBRARY_DIRS
            and name.startswith("lib") and ".so" in name and bool(link) and "/" not in str(link))


def _kind(entry: tuple) -> str:
    mode, size, link = entry
    if stat.S_ISLNK(mode):
        return f"symlink to {link}"
    if stat.S_ISDIR(mode):
        return f"directory {stat.S_IMODE(mode):o}"
    if stat.S_ISREG(mode):
        return f"{size}-byte file {stat.S_IMODE(mode):o}"
    return f"special file {mode:o}"


def touching(run: Run, rel: str) -> list[dict]:
    """Events that created, removed or mounted over the jail path `rel`, oldest first."""
    out = []
    for e in run.events:
        paths = [e[k] for k in ("path", "dst") if isinstance(e.get(k), str)] + list(e.get("removed") or [])
        if e.get("kind", "").startswith(("cli.", "impl.")) and any(same_file(p, rel, run.jails) for p in paths):
            out.append(e)
    return out


def check_hygiene(run: Run) -> InvariantResult:
    before, after = run.final.get("jail_before"), run.final.get("jail_after")
    outside = run.final.get("outside_changes")
    out: list[Violation] = []
    for p in outside or []:
        out.append(Violation("INV-3", f"jail hygiene: {p} changed outside the jail"))
    if before is None or after is None:
        if out:
            return InvariantResult("INV-3", False, f"{len(out)} changes outside the jail", out)
        return InvariantResult("INV-3", UNKNOWN, "final_state has no jail_before/jail_after snapshot")
    before = {k: _entry(v) for k, v in before.items()}
    after = {k: _entry(v) for k, v in after.items()}
    problems: list[tuple[str, str]] = []
    for rel, old in sorted(before.items()):
        new = after.get(rel)
        if new == old:
            continue
        if _placeholder(rel, old) and (new is None or _placeholder(rel, new)):
            continue
        if _bookkeeping(rel, old) and ((new is None and rel == FLAG) or (new is not None and _bookkeeping(rel, new))):
            continue
        if _soname_link(rel, old) and new is not None and _soname_link(rel, new):
            continue
        problems.append((rel, f"{rel} removed (was a {_kind(old)})" if new is None
                         else f"{rel} changed from a {_kind(old)} to a {_kind(new)}"))
    added = {rel: e for rel, e in after.items() if rel not in before}
    allowed_files = [rel for rel, e in added.items() if _placeholder(rel, e) or _bookkeeping(rel, e) or _soname_link(rel, e)]
    for rel, e in sorted(added.items()):
        if rel in allowed_files:
            continue
        if stat.S_ISDIR(e[0]):
            n = _normalised(rel)
            if n.startswith("lib/firmware") or n in LIBRARY_DIRS or any(f.startswith(rel + "/") for f in allowed_files):
                continue
        problems.append((rel, f"{rel} appeared (a {_kind(e)}, not a placeholder, lock, flag or ldconfig output)"))
    for rel, text in problems:
        events = touching(run, rel)
        last = events[-1] if events else None
        by = f"; last touched by worker {node_of(last)}'s {last['kind']} at {run.at(last)}" if last else ""
        out.append(Violation("INV-3", f"jail hygiene: {text}{by}", last, events[-MAX_LISTED:-1] if events else []))
    if out:
        return InvariantResult("INV-3", False, f"{len(out)} unexpected changes", out)
    if outside is None:
        return InvariantResult("INV-3", UNKNOWN, "jail clean, but final_state has no outside_changes")
    return InvariantResult("INV-3", True, f"{len(added)} new entries, all placeholders/locks/flag/ldconfig outputs")


# -- INV-4: no lock on warm starts -----------------------------------------------------------

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


# -- INV-6: no host residue ------------------------------------------------------------------

RESIDUE = (("host_mounts", "mount", "mounts", "of the run left in the host namespace"),
           ("processes", "process", "processes", "left running"),
           ("temp_dirs", "temporary directory", "temporary directories", "left"))


def check_residue(run: Run) -> InvariantResult:
    out, counts, missing = [], [], []
    for key, one, many, where in RESIDUE:
        left = run.final.get(key)
        if left is None:
            missing.append(key)
        elif left:
            left = list(left)
            shown = ", ".join(str(x) for x in left[:5]) + (" ..." if len(left) > 5 else "")
            what = f"{len(left)} {one if len(left) == 1 else many} {where}"
            out.append(Violation("INV-6", f"host residue: {what}: {shown}"))
            counts.append(what)
    if out:
        return InvariantResult("INV-6", False, "; ".join(counts), out)
    if missing:
        return InvariantResult("INV-6", UNKNOWN, f"final_state has no {', '.join(missing)}")
    return InvariantResult("INV-6", True, "no mount, process or temporary directory left")


# -- the verdict -----------------------------------------------------------------------------

def check(history: list[dict], final_state: dict | None = None) -> Verdict:
    """Judge one run: its history (events, any order) and what the harness found at the end."""
    run = Run(history, final_state)
    inv1, inv5 = check_content(run)
    results = {"INV-1": inv1, "INV-2": check_convergence(run), "INV-3": check_hygiene(run),
               "INV-4": check_warm_locks(run), "INV-5": inv5, "INV-6": check_residue(run)}
    statuses = [r.valid for r in results.values()]
    valid = False if False in statuses else UNKNOWN if UNKNOWN in statuses else True
    verdict = Verdict(valid, results, t0=run.t0, jails=run.jails)
    found = verdict.violations()
    if found:
        first = found[0]
        verdict.invariant, verdict.first_violation = first.invariant, first.event
        verdict.chain, verdict.explanation = first.chain, first.explanation
    return verdict


def main(argv: list[str] | None = None) -> int:
    """Judge a saved run: print the verdict; exit 0 valid, 1 invalid, 2 unknown."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gpujail.chaos.checker", description=main.__doc__)
    ap.add_argument("history", help="the run's history (JSON lines)")
    ap.add_argument("final_state", nargs="?", help="what the harness found at the end (JSON)")
    ap.add_argument("--timeline", metavar="OUT.html", help="also draw the run")
    args = ap.parse_args(argv)
    with open(args.history) as f:
        history = [json.loads(line) for line in f if line.strip()]
    final = None
    if args.final_state:
        with open(args.final_state) as f:
            final = json.load(f)
    verdict = check(history, final)
    print(verdict.summary())
    if args.timeline:
        from gpujail.chaos import timeline
        print(f"timeline: {timeline.render(history, verdict, args.timeline)}")
    return {True: 0, False: 1}.get(verdict.valid, 2)


if __name__ == "__main__":
    sys.exit(main())
