"""INV-3 jail hygiene: the jail changed only by placeholders and bookkeeping (SPEC section 6).

How this works
--------------
`final_state["jail_before"]`/`["jail_after"]` (fixtures/jail.py `snapshot`: path -> (mode, size,
link)) may differ only by placeholders (regular files under 64 bytes named `lib*.so.*`, or under
`lib/firmware` or `usr/bin`; or, whatever their names, at a path a worker of the run mounted the host
file of that same path on: a `cli.mount` or `impl.mount` whose `dst` is its `src`, such as a vendor CDI
spec's `usr/share/nvidia/nvoptix.bin`, SPEC section 9) and their new parent directories, `etc/*.lock`, the flag file,
`etc/ld.so.cache` and ldconfig's soname symlinks in library directories. Removing or rewriting a
pre-existing placeholder or the flag is also a "difference by placeholders" (populate-jail cleanup
does it on purpose; the damage it does when a CLI does it is INV-1's business).
Paths the harness itself swapped in during the run (`final_state["planted"]`: a nemesis's symlink)
are not the workers' doing and are left out. `final_state["outside_changes"]` must be empty, and so
must every `impl.outside` event
(what a start wrote outside the jail, seen through its node's copy-on-write view of the host), but
for the host paths the harness itself changed under that node (`chaos.upgrade`: its driver upgraded).
Each unexpected change names the last `cli.*` or
`impl.*` event that touched its path, with the earlier ones as its chain.
"""
from __future__ import annotations

import fnmatch
import os
import stat

from gpujail.spec import DIR_MARKER, FLAG, IPC_DIRS, LDCACHE, PLACEHOLDER_MAX

from .queries import Run, node_of, normalised, same_file
from .results import MAX_LISTED, UNKNOWN, InvariantResult, Violation

LIBRARY_DIRS = ("lib/x86_64-linux-gnu", "lib/i386-linux-gnu", "lib64", "lib32", "lib")   # "usr/" removed


def _entry(value) -> tuple:
    mode, size, link = value
    return int(mode), size, link


def _placeholder(rel: str, entry: tuple, targets: frozenset[str] = frozenset()) -> bool:
    """A placeholder of any generation: 0-byte (CLI) or marker (REF-5), at a driver-file path: one
    of the driver's names, or one of `targets` (the run's own mount targets, `mount_targets`)."""
    mode, size, _ = entry
    n, name = normalised(rel), os.path.basename(rel)
    return (stat.S_ISREG(mode) and size is not None and size < PLACEHOLDER_MAX
            and (fnmatch.fnmatchcase(name, "lib*.so.*") or n.startswith(("lib/firmware/", "bin/"))
                 or (rel.rsplit("/", 1)[0] in IPC_DIRS and name == DIR_MARKER) or n in targets))


def mount_targets(run: Run) -> frozenset[str]:
    """Every jail path (normalised) a worker of the run bind-mounted a host file on at that file's
    own path (`cli.mount`, `impl.mount` whose `dst` is its `src` in the jail): the driver files of
    its file set, whatever their names (a CDI spec's `containerPath`, the host path: SPEC CDI-1).
    A mount anywhere else (a library flattened by CLI-3 has its name for that; a target reached
    through a jail symlink that leads elsewhere, hostile-links) makes no placeholder of its target."""
    out = set()
    for e in run.of("cli.mount", "impl.mount"):
        dst, src = e.get("dst"), e.get("src")
        if isinstance(dst, str) and isinstance(src, str) and src.startswith("/") and not run.rel(dst).startswith("/"):
            if normalised(run.rel(dst)) == normalised(src):
                out.add(normalised(src))
    return frozenset(out)


def _bookkeeping(rel: str, entry: tuple) -> bool:
    """Lock files, the flag, the linker cache: files the procedure writes on purpose."""
    return stat.S_ISREG(entry[0]) and (rel in (FLAG, LDCACHE) or (os.path.dirname(rel) == "etc" and rel.endswith(".lock")))


def _soname_link(rel: str, entry: tuple) -> bool:
    """A symlink ldconfig makes: lib*.so* in a library directory, pointing at a sibling."""
    mode, _, link = entry
    name = os.path.basename(rel)
    return (stat.S_ISLNK(mode) and os.path.dirname(normalised(rel)) in LIBRARY_DIRS
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
    starts = {}   # node -> its last impl.start, to say which start it was
    upgraded: dict[str, set[str]] = {}   # node -> the host paths the harness changed under it (chaos.upgrade)
    for e in run.events:
        if e.get("kind") == "chaos.upgrade":
            upgraded.setdefault(e["worker"], set()).update(e.get("paths") or [])
        elif e.get("kind") == "impl.start":
            starts[node_of(e)] = e
        elif e.get("kind") == "impl.outside":   # seen through the node's copy-on-write host (cow.py)
            start = starts.get(node_of(e))
            what = f"`{' '.join(start['argv'])}`" if start else "a start"
            for c in [c for c in e["changes"] if c["path"] not in upgraded.get(node_of(e), ())]:
                out.append(Violation("INV-3", f"jail hygiene (REF-11): worker {node_of(e)}'s start {what} {c['change']} "
                                              f"{c['path']} outside the jail, at {run.at(e)}", e, [start] if start else []))
    if before is None or after is None:
        if out:
            return InvariantResult("INV-3", False, f"{len(out)} changes outside the jail", out)
        return InvariantResult("INV-3", UNKNOWN, "final_state has no jail_before/jail_after snapshot")
    before = {k: _entry(v) for k, v in before.items()}
    after = {k: _entry(v) for k, v in after.items()}
    planted = run.final.get("planted") or []
    for p in planted:   # the harness's own (a symlink swapped in, what it moved aside): neither side counts
        for side in (before, after):
            for rel in [r for r in side if r == p or r.startswith(p + "/")]:
                del side[rel]
    targets = mount_targets(run)
    problems: list[tuple[str, str]] = []
    for rel, old in sorted(before.items()):
        new = after.get(rel)
        if new == old:
            continue
        if _placeholder(rel, old, targets) and (new is None or _placeholder(rel, new, targets)):
            continue
        if _bookkeeping(rel, old) and ((new is None and rel == FLAG) or (new is not None and _bookkeeping(rel, new))):
            continue
        if _soname_link(rel, old) and new is not None and _soname_link(rel, new):
            continue
        problems.append((rel, f"{rel} removed (was a {_kind(old)})" if new is None
                         else f"{rel} changed from a {_kind(old)} to a {_kind(new)}"))
    added = {rel: e for rel, e in after.items() if rel not in before}
    allowed_files = [rel for rel, e in added.items()
                     if _placeholder(rel, e, targets) or _bookkeeping(rel, e) or _soname_link(rel, e)]
    for rel, e in sorted(added.items()):
        if rel in allowed_files:
            continue
        if stat.S_ISDIR(e[0]):
            n = normalised(rel)
            if (n.startswith("lib/firmware") or n in LIBRARY_DIRS or rel in IPC_DIRS
                    or any(f.startswith(rel + "/") for f in allowed_files)):
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

