"""`gpujail qualify PATH`: is this shared filesystem safe for the reference procedure?

How this works
--------------
The same command runs on two nodes that mount one shared filesystem at PATH (two terminals,
`srun -N2`, `kubectl exec` into two pods, two client mounts on one machine). The first to create the
rendezvous file `PATH/.gpujail-qualify` (O_CREAT|O_EXCL) is the *leader*; it names a run directory
`PATH/.gpujail-qualify-TOKEN/`, and the second, the *follower*, joins by creating `follower.join`
there. From then on the two talk only through that directory: a side *says* a step by renaming a
small JSON file into place (`leader.NAME`, `follower.NAME`) and the other *waits* for it by opening
it again and again, so the test needs nothing but the filesystem under test.

They measure, in this order (SPEC section 8, "a user's own" jail filesystem):

    flock       the leader holds flock(LOCK_EX); the follower's LOCK_NB attempt must fail, and its
                blocking one must succeed once the leader lets go
    posix       the same with POSIX record locks (fcntl F_SETLK)
    excl        both race to create the same 200 names with O_CREAT|O_EXCL (one forwards, one
                backwards); no name may be won twice, and each file keeps its winner's bytes
    visible     the leader creates a file with its bytes; the follower's next open must show them
                all. Then the leader rewrites it in place (same size) and the follower opens it again:
                is the *rewrite* seen (close-to-open consistency for a changed file)?
    detach      the follower (in a private mount namespace: root, or `unshare -Urm`) bind-mounts a
                file over a 0-byte file on PATH, the leader unlinks it; the follower reads its mount
                table (no lookup) and then stats the path until the mount is gone: detached at once
                (K-1), at the next lookup (K-2), or never within DETACH_PATIENCE seconds

The follower sends what it saw, the leader judges and sends the table back, and both print it and
exit with the same code. The properties the reference procedure relies on (SPEC section 4) are
REQUIRED: flock serialises (REF-5's lock), O_EXCL is atomic (REF-5's markers are created with it, so
a node never truncates another's marker) and a new file is whole at the other node's next open (the
re-check under the lock sees the markers the previous holder made: unseen, its O_EXCL create fails
and the worker exits non-zero for nothing). POSIX locks, rewrites and detachment are reported, not
required: the procedure uses flock, writes each marker once (a 0-byte placeholder is filled in place,
and filling it again is harmless), and is safe under every answer of the last (which says whether
the chaos suite's findings apply with K-1 or K-2). GlusterFS with its default caches, for one, does
not show a same-size rewrite at the other client's next open within about a second.

Exit codes (gpujail.spec.EXIT): 0 every required property holds, 1 one does not (named), 2 bad input
(PATH missing, not a directory, not writable; a pair already running there), 4 inconclusive (the
partner never came or went away). Each side removes what it created on PATH, also on failure or
Ctrl-C; the leader removes the run directory.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import socket
import tempfile
import time
from contextlib import suppress

from gpujail.commands import Stop
from gpujail.spec import EXIT

RENDEZVOUS = ".gpujail-qualify"
RACES = 200
POLL = 0.01
HOLD = 0.2                 # how long the leader keeps a lock the follower is waiting for
DETACH_PATIENCE = 5.0      # beyond every FUSE/NFS attribute cache default (1 s, 3-60 s for NFS: see docs/cluster.md)
REQUIRED = {"flock": "flock serialises across nodes (REF-5: the lock)",
            "excl": "O_CREAT|O_EXCL is atomic across nodes (REF-5: markers are created with it)",
            "visible": "a new file is whole at the other node's next open (REF-5: the re-check under the lock)"}
TITLES = {"flock": "flock(LOCK_EX) serialises across nodes", "posix": "POSIX fcntl locks serialise across nodes",
          "excl": "O_CREAT|O_EXCL is atomic across nodes", "visible": "a new file is whole at the other's next open",
          "rewrite": "an in-place rewrite is seen at the next open", "detach": "a remote unlink detaches a bind mount"}
HELP = ("Run the same command on two nodes that mount one shared filesystem at PATH; they pair up through "
        "a rendezvous file on PATH and measure what the reference procedure relies on. Exit 0 when flock "
        "serialises across the nodes, O_CREAT|O_EXCL is atomic and a new file is whole at the other node's "
        "next open (SPEC section 4, REF-5); 1 otherwise, naming which. POSIX locks, in-place rewrites and whether a remote "
        "unlink detaches a bind mount (at once, at next lookup, never; needs root or `unshare -Urm`) are "
        "reported, not required. 2 bad input, 4 the partner never came.")


class Partner(Exception):
    """The partner did not say a step in time: the run is inconclusive."""


def add_parser(sub) -> None:
    q = sub.add_parser("qualify", help="is a shared filesystem safe for the procedure? (run on two nodes)",
                       description=HELP)
    q.add_argument("path", metavar="PATH", help="a writable directory on the shared filesystem, the same one on both nodes")
    q.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="seconds to wait for the partner, to arrive and at each step (default 120)")


def qualify(args) -> int:
    root = checked_path(args.path)
    if not args.timeout > 0:
        raise Stop("bad-input", f"gpujail qualify: --timeout {args.timeout}: must be a positive number of seconds")
    mount_ns = private_mount_namespace()
    side = None
    try:
        side = Side.pair_up(root, args.timeout)
        table, code = side.run(mount_ns)
    except Partner as e:
        raise Stop("inconclusive", f"gpujail qualify {root}: inconclusive: {e}") from None
    finally:
        if side is not None:
            side.clean()
    print(table)
    return code


def checked_path(path: str) -> str:
    if not os.path.exists(path):
        raise Stop("bad-input", f"gpujail qualify: {path}: no such directory")
    if not os.path.isdir(path):
        raise Stop("bad-input", f"gpujail qualify: {path}: not a directory")
    probe = os.path.join(path, f"{RENDEZVOUS}-probe-{socket.gethostname()}-{os.getpid()}")
    try:   # access(2) says yes to root on a read-only mount: try it
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        os.unlink(probe)
    except OSError as e:
        raise Stop("bad-input", f"gpujail qualify: {path}: not writable ({e.strerror})") from None
    return os.path.realpath(path)


def private_mount_namespace() -> str | None:
    """Move this process into a mount namespace of its own, for the detach check's bind mount (gone
    with the process). Returns why not, or None."""
    from gpujail.backends.namespaces import CLONE_NEWNS, unshare
    from gpujail.world.sysops import MS_PRIVATE, MS_REC, RealSys
    try:
        unshare(CLONE_NEWNS)
        RealSys().mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as e:
        return f"not measured: no private mount namespace ({e.strerror}); run as root or under `unshare -Urm`"
    return None


# -- the pair and its messages ----------------------------------------------------------------------

class Side:
    """One of the two processes: its role, the run directory, what it created there."""

    def __init__(self, root: str, role: str, run: str, timeout: float):
        self.root, self.role, self.run_dir, self.timeout = root, role, run, timeout
        self.other = "follower" if role == "leader" else "leader"
        self.created: list[str] = []
        self.me = f"{socket.gethostname()} pid {os.getpid()}"

    @classmethod
    def pair_up(cls, root: str, timeout: float) -> Side:
        """First comer leads: O_EXCL on the rendezvous file. The second joins the run it names."""
        rendezvous = os.path.join(root, RENDEZVOUS)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fd = os.open(rendezvous, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                joined = cls._join(root, rendezvous, timeout)
                if joined is not None:
                    return joined
            else:
                return cls._lead(root, rendezvous, fd, timeout, deadline)
            if time.monotonic() > deadline:
                raise Stop("inconclusive", f"gpujail qualify {root}: inconclusive: {rendezvous} stayed unreadable "
                                           f"for {timeout:g} s")
            time.sleep(POLL)

    @classmethod
    def _lead(cls, root, rendezvous, fd, timeout, deadline) -> Side:
        run = os.path.join(root, f"{RENDEZVOUS}-{secrets.token_hex(4)}")
        side = cls(root, "leader", run, timeout)
        side.created.append(rendezvous)
        try:
            os.mkdir(run, 0o755)
            side.created.append(run)
            os.write(fd, json.dumps({"run": os.path.basename(run), "leader": side.me,
                                     "expires": time.time() + timeout}).encode())
            os.close(fd)
            print(f"gpujail qualify {root}: leader ({side.me}); waiting up to {timeout:g} s for the partner "
                  f"(the same command on the other node)", flush=True)
            side.partner = side.wait("join", deadline)["me"]
            os.unlink(rendezvous)   # the next pair may start while this one measures
            side.created.remove(rendezvous)
        except BaseException:
            side.clean()
            raise
        return side

    @classmethod
    def _join(cls, root, rendezvous, timeout) -> Side | None:
        """Join the leader the rendezvous file names; None to try again (not written yet, or stale)."""
        try:
            with open(rendezvous) as f:
                leader = json.loads(f.read())
        except (OSError, ValueError):
            return None   # gone, or its leader has not written it yet
        if not (isinstance(leader, dict) and re.fullmatch(rf"{re.escape(RENDEZVOUS)}-[0-9a-f]{{8}}", str(leader.get("run")))
                and isinstance(leader.get("expires"), (int, float))):
            raise Stop("bad-input", f"gpujail qualify: {rendezvous}: not a qualify rendezvous file (remove it)")
        if leader["expires"] < time.time():   # its leader was killed before it could clean: take over
            stale = cls(root, "leader", os.path.join(root, leader["run"]), timeout)
            stale.created.append(rendezvous)
            stale.clean()
            return None
        side = cls(root, "follower", os.path.join(root, leader["run"]), timeout)
        side.partner = leader["leader"]
        try:
            side.say("join", me=side.me, exclusive=True)
        except FileExistsError:
            raise Stop("bad-input", f"gpujail qualify: {root}: a qualify pair is already running there "
                                    f"(leader {leader['leader']})") from None
        except FileNotFoundError:
            return None   # the leader gave up between our read and our join
        print(f"gpujail qualify {root}: follower ({side.me}) of leader {side.partner}", flush=True)
        return side

    def path(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def say(self, step: str, exclusive: bool = False, **data) -> None:
        """Tell the partner a step is done: the file appears whole (rename), or O_EXCL for the join."""
        final = self.path(f"{self.role}.{step}")
        tmp = final if exclusive else self.path(f".{self.role}.{step}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC), 0o644)
        self.created.append(final)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data))
        if not exclusive:
            os.rename(tmp, final)

    def wait(self, step: str, deadline: float | None = None) -> dict:
        """What the partner said at `step`, once its file can be opened and read whole."""
        name = self.path(f"{self.other}.{step}")
        deadline = deadline or time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            with suppress(OSError, ValueError):
                with open(name) as f:
                    return json.loads(f.read())
            time.sleep(POLL)
        who = "no partner came" if step == "join" else f"the {self.other} did not say '{step}'"
        raise Partner(f"{who} within {self.timeout:g} s (run the same command on the other node, on the same "
                      f"shared filesystem; --timeout to wait longer)")

    def clean(self) -> None:
        """Remove what this side created; the leader removes the run directory and what is left in it."""
        for p in reversed(self.created):
            with suppress(OSError):
                os.rmdir(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        if self.role == "leader" and os.path.isdir(self.run_dir):
            for name in os.listdir(self.run_dir):   # the protocol's files only: no directories
                with suppress(OSError):
                    os.unlink(self.path(name))
            with suppress(OSError):
                os.rmdir(self.run_dir)

    # -- the measurements ------------------------------------------------------------------------
    def run(self, mount_ns: str | None) -> tuple[str, int]:
        seen, took = {}, {}
        for check in (self.lock_check("flock"), self.lock_check("posix"), self.excl_check, self.visible_check,
                      lambda: self.detach_check(mount_ns)):
            start = time.monotonic()
            name, result = check()
            seen[name], took[name] = result, time.monotonic() - start
        if self.role == "follower":
            self.say("seen", seen=seen)
            verdict = self.wait("verdict")
            self.say("bye")
            return verdict["table"], verdict["code"]
        theirs = self.wait("seen")["seen"]
        seen["rewrite"], theirs["rewrite"] = seen["visible"], theirs["visible"]   # one check, two rows
        table, code = judge(self.root, {k: merge(k, seen[k], theirs[k]) for k in TITLES}, took,
                            f"leader {self.me}, follower {self.partner}")
        self.say("verdict", table=table, code=code)
        with suppress(Partner):
            self.wait("bye", time.monotonic() + min(self.timeout, 5))
        return table, code

    def lock_check(self, kind: str):
        def check():
            fd = os.open(self.path(f"lock.{kind}"), os.O_RDWR | os.O_CREAT, 0o644)
            self.created.append(self.path(f"lock.{kind}"))
            try:
                if self.role == "leader":
                    _lock(fd, kind, block=True)
                    self.say(f"{kind}.held")
                    self.wait(f"{kind}.tried")
                    time.sleep(HOLD)   # the follower is now waiting in a blocking attempt, if it was refused
                    _unlock(fd, kind)
                    return kind, {}
                self.wait(f"{kind}.held")
                refused = not _lock(fd, kind, block=False)
                if not refused:
                    _unlock(fd, kind)
                self.say(f"{kind}.tried")
                handed = refused and _lock(fd, kind, block=True, deadline=time.monotonic() + self.timeout)
                return kind, {"refused": refused, "handed_over": handed}
            finally:
                os.close(fd)   # closing drops both kinds of lock
        return check

    def excl_check(self):
        self.say("excl.ready")
        self.wait("excl.ready")
        names = range(RACES) if self.role == "leader" else reversed(range(RACES))
        won = []
        for i in names:
            try:
                fd = os.open(self.path(f"excl.{i}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            self.created.append(self.path(f"excl.{i}"))
            os.write(fd, self.role.encode())
            os.close(fd)
            won.append(i)
        self.say("excl.done")
        self.wait("excl.done")
        kept = []
        for i in won:   # the winner's bytes must survive the loser's attempt (no O_TRUNC, no second create)
            with open(self.path(f"excl.{i}"), "rb") as f:
                kept.append(f.read() == self.role.encode())
        return "excl", {"won": won, "intact": all(kept)}

    def visible_check(self):
        name = self.path("visible")
        if self.role == "leader":
            with open(name, "xb") as f:
                self.created.append(name)
                f.write(b"1" * 4096)
            self.say("visible.v1")
            self.wait("visible.read1")
            with open(name, "r+b") as f:   # in place: same inode, same size, as a marker is filled
                f.write(b"2" * 4096)
            self.say("visible.v2")
            self.wait("visible.read2")
            return "visible", {}
        self.wait("visible.v1")
        first = _read(name)
        self.say("visible.read1")
        self.wait("visible.v2")
        second = _read(name)
        self.say("visible.read2")
        return "visible", {"first": first == b"1" * 4096, "second": second == b"2" * 4096}

    def detach_check(self, mount_ns: str | None):
        victim = self.path("victim")
        if self.role == "leader":
            os.close(os.open(victim, os.O_WRONLY | os.O_CREAT, 0o644))   # a 0-byte placeholder
            self.created.append(victim)
            self.say("victim.made")
            self.wait("victim.mounted")
            try:
                os.unlink(victim)
                unlinked = "ok"
            except OSError as e:
                unlinked = errno.errorcode.get(e.errno, str(e.errno))
            self.say("victim.unlinked", result=unlinked)
            self.wait("victim.seen")
            return "detach", {"unlink": unlinked}
        self.wait("victim.made")
        if mount_ns is not None:
            self.say("victim.mounted")
            self.wait("victim.unlinked")
            self.say("victim.seen")
            return "detach", {"skipped": mount_ns}
        from gpujail.world.sysops import MNT_DETACH, RealSys
        real = RealSys()
        with tempfile.NamedTemporaryFile(prefix="gpujail-qualify-") as source:
            source.write(b"x" * 2048)
            source.flush()
            try:
                real.bind_mount(source.name, victim)
            except OSError as e:
                self.say("victim.mounted")
                self.wait("victim.unlinked")
                self.say("victim.seen")
                return "detach", {"skipped": f"not measured: bind mount failed ({e.strerror})"}
            try:
                self.say("victim.mounted")
                self.wait("victim.unlinked")
                result = _watch_detach(real, victim)
            finally:
                with suppress(OSError):
                    real.umount(victim, MNT_DETACH)
        self.say("victim.seen")
        return "detach", result


def _watch_detach(real, victim: str) -> dict:
    """After the remote unlink: is the mount still in our table before any lookup, and which lookup
    (stat) finds the path gone and the mount detached?"""
    def attached():
        return any(m.mountpoint == victim for m in real.mounts())
    if not attached():
        return {"when": "at once"}
    start, lookups = time.monotonic(), 0
    while time.monotonic() - start < DETACH_PATIENCE:
        lookups += 1
        try:
            os.stat(victim)
            error = None
        except OSError as e:
            error = errno.errorcode.get(e.errno, str(e.errno))
        if not attached():
            return {"when": "at next lookup", "lookups": lookups, "after": time.monotonic() - start, "error": error}
        time.sleep(0.05)
    return {"when": "never", "lookups": lookups, "after": time.monotonic() - start}


def _lock(fd: int, kind: str, block: bool, deadline: float | None = None) -> bool:
    """Take the lock; False when refused (LOCK_NB), or not handed over before the deadline."""
    op = fcntl.flock if kind == "flock" else fcntl.lockf
    while True:
        try:
            op(fd, fcntl.LOCK_EX | (0 if block and deadline is None else fcntl.LOCK_NB))
            return True
        except BlockingIOError:
            pass
        except OSError as e:   # lockf's F_SETLK says EACCES or EAGAIN
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise
        if not block or time.monotonic() > deadline:
            return False
        time.sleep(POLL)


def _unlock(fd: int, kind: str) -> None:
    (fcntl.flock if kind == "flock" else fcntl.lockf)(fd, fcntl.LOCK_UN)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# -- judging ------------------------------------------------------------------------------------------

def merge(kind: str, leader: dict, follower: dict) -> tuple[bool | None, str]:
    """One property from both sides' observations: (holds, what to print). None: not measured."""
    if kind in ("flock", "posix"):
        if not follower["refused"]:
            return False, "no: the other node took the lock while it was held"
        if not follower["handed_over"]:
            return False, "no: refused, but never handed over after release"
        return True, "yes"
    if kind == "excl":
        twice = sorted(set(leader["won"]) & set(follower["won"]))
        lost = set(range(RACES)) - set(leader["won"]) - set(follower["won"])
        if twice or lost:
            return False, f"no: {len(twice)} of {RACES} names created by both, {len(lost)} by neither"
        if not (leader["intact"] and follower["intact"]):
            return False, "no: a winner's file lost its bytes to the loser"
        return True, f"yes ({len(leader['won'])}/{len(follower['won'])} of {RACES} races)"
    if kind == "visible":
        return (True, "yes") if follower["first"] else (False, "no: not there, or not all its bytes")
    if kind == "rewrite":
        return (None, "yes") if follower["second"] else (None, "no: the old bytes (a client cache)")
    if "skipped" in follower:
        return None, follower["skipped"]
    if leader["unlink"] != "ok":
        return None, f"remote unlink refused ({leader['unlink']})"
    if follower["when"] == "at next lookup":
        cached = " (the earlier ones answered from the client's cache)" if follower["lookups"] > 1 else ""
        return None, (f"at next lookup (K-2): stat {follower['lookups']}, {follower['after']:.2f} s after the "
                      f"unlink, said {follower['error'] or 'the path exists'}{cached}")
    if follower["when"] == "never":
        return None, f"never (still attached after {follower['after']:.1f} s, {follower['lookups']} lookups)"
    return None, "at once (K-1)"


def judge(root: str, results: dict, took: dict, who: str) -> tuple[str, int]:
    width = max(len(t) for t in TITLES.values())
    lines = [f"gpujail qualify {root} ({who})", "",
             f"{'property':<{width}}  {'needed':<6}  {'took':>7}  result"]
    for kind, (holds, text) in results.items():
        took_s = f"{took[kind]:6.2f}s" if kind in took else ""
        lines.append(f"{TITLES[kind]:<{width}}  {'yes' if kind in REQUIRED else 'no':<6}  {took_s:>7}  {text}")
    failed = [REQUIRED[k] for k, (holds, _) in results.items() if k in REQUIRED and not holds]
    lines.append("")
    if failed:
        lines.append("verdict: NOT safe for the reference procedure: " + "; ".join(f"not: {f}" for f in failed))
        return "\n".join(lines), EXIT["failed"]
    lines.append("verdict: safe for the reference procedure (every property SPEC section 4 relies on holds)")
    return "\n".join(lines), EXIT["passed"]
