"""The host outside the jail, seen copy-on-write by a worker node (SPEC REF-11, INV-3).

How this works
--------------
A promise of the contract is that an implementation never creates, changes or deletes anything
outside the jail. To check it whatever the script does (a write to `/tmp/x`, an edit in place, an
unlink, a write through `/proc/self/root`), a node sees the host through overlays of its own:

* `cover(shared, lowers)` runs in the node's fresh mount namespace before anything else is built.
  Every directory at the top of the host's root file system, and every file system mounted below
  one, gets an overlay mount of itself whose upper directory is on a tmpfs of the node's. The
  implementation sees the host as it is and may write wherever its rights allow, but every write
  lands in an upper directory and the host never changes. /proc, /sys, /dev and /run are left
  alone: /dev and /run are the node's own tmpfs (node_view.py), watched by `snapshot`.
  The paths the node must really share (the jail, the run's history and barriers) are bind-mounted
  back over their overlays, from descriptors opened before the overlays hid them. `lowers` adds a
  lower layer under a directory (the driver files of the node at their host paths).
* The tmpfs holding the upper directories is detached from every path once the overlays hold it:
  only the agent, through a descriptor, reads it, so a script cannot tidy its traces away.
* `HostView.changes()`, after each start, lists what is new in the upper directories since the
  last call: a character device 0:0 is overlayfs's whiteout (a deletion); anything else was
  created or changed, which the lower layers tell (the host's directory as it was, through a
  descriptor opened before the overlay). Directories that were only copied up to hold a child are
  not changes. `snapshot()` before and after a start gives the same for /dev and /run.
"""
from __future__ import annotations

import errno
import os
import stat

from gpujail.world.sysops import MNT_DETACH, MS_BIND, MS_REC, RealSys

SKIP = ("/proc", "/sys", "/dev", "/run")
STAGE = "/run/.gpujail-cow"
sysops = RealSys()


def _mountpoints() -> list[str]:
    """The mount points of this namespace, each once, parents before children."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point not in points:
                points.append(point)
    return sorted(points, key=lambda p: (p.count("/"), p))


def _open(paths, flags: int) -> list[tuple[str, int]]:
    """(path, descriptor) for each path that is still there: a mount listed a moment ago may be gone
    (a container's root that dockerd removed meanwhile); what is gone needs no cover."""
    out = []
    for p in paths:
        try:
            out.append((p, os.open(p, flags)))
        except FileNotFoundError:
            continue
    return out


def _covered(userns: bool, mountpoints: list[str]) -> list[str]:
    """What gets an overlay: the root file system's top directories, every mount below them and,
    in a user namespace, the user's own home and temporary directories. (There a copy-up must give
    the copy its original owner, which fails with EOVERFLOW for an owner the namespace does not map:
    a write under a directory of root's is refused, so the host is still never changed, but only
    an overlay rooted in a directory of the user's own can take, and so name, what a start writes.)"""
    tops = [f"/{n}" for n in sorted(os.listdir("/"))
            if not os.path.islink(f"/{n}") and os.path.isdir(f"/{n}") and f"/{n}" not in SKIP]
    own = [os.environ.get(k) for k in ("HOME", "TMPDIR")] if userns else []
    below = [p for p in mountpoints + [os.path.realpath(p) for p in own if p]
             if p != "/" and not p.startswith(tuple(s + "/" for s in SKIP)) and p not in SKIP and p not in tops
             and os.path.isdir(p)]
    return sorted(dict.fromkeys(tops + below), key=lambda p: (p.count("/"), p))


class HostView:
    """The overlays of one node: for each, its mount point, a descriptor of its upper directory and
    descriptors of its lower layers (the host's directory as it was, opened before the overlay hid
    it, and any extra layer), through which a change is told apart: created, changed or deleted."""

    def __init__(self, layers: list[tuple[str, int, list[str]]]):
        self.layers = layers
        self.seen: set[tuple] = set()

    def changes(self) -> list[dict]:
        """What the upper directories gained since the last call: [{path, change, mode}]."""
        found = []
        for point, fd, lowers in self.layers:
            base = f"/proc/self/fd/{fd}"
            for dirpath, dirs, files in os.walk(base):
                for name in dirs + files:
                    full = os.path.join(dirpath, name)
                    rel = os.path.relpath(full, base)
                    st = os.lstat(full)
                    before = _lstat_any(os.path.join(lower, rel) for lower in lowers)
                    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                        change = "deleted"    # overlayfs's whiteout
                    elif before is None:
                        change = "created"
                    elif stat.S_ISDIR(st.st_mode) and not _opaque(full) and st.st_mode == before.st_mode:
                        continue              # copied up to hold a new child, itself unchanged
                    else:
                        change = "changed"
                    key = (rel, point, change, st.st_mode, st.st_size, st.st_mtime_ns)
                    if key not in self.seen:
                        self.seen.add(key)
                        found.append({"path": os.path.join(point, rel), "change": change, "mode": st.st_mode})
        return found


def _lstat_any(paths) -> os.stat_result | None:
    for p in paths:
        try:
            return os.lstat(p)
        except OSError:
            pass
    return None


def _opaque(path: str) -> bool:
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            pass
    return False


def cover(shared: list[str], lowers: dict[str, str] | None = None) -> HostView:
    """Overlay the host (see the module's doc); `shared` paths stay the real ones."""
    lowers = lowers or {}
    keep = [(p, os.open(p, os.O_PATH | os.O_DIRECTORY)) for p in dict.fromkeys(shared) if os.path.isdir(p)]
    userns = os.getuid() != 0 or _in_user_namespace()
    mountpoints = _mountpoints()
    points = _covered(userns, mountpoints)
    # Opened before any overlay: once /mnt is overlaid, what is mounted below it is only reachable
    # through these descriptors. A file mounted over a file (a bind-mounted /etc/resolv.conf, a
    # driver file an engine put at its host path) cannot carry an overlay: it is bound back as is.
    sources = dict(_open(points, os.O_PATH | os.O_DIRECTORY))
    points = [p for p in points if p in sources]
    files = _open([p for p in mountpoints if not os.path.isdir(p) and os.path.exists(p)
                   and not p.startswith(tuple(s + "/" for s in SKIP))], os.O_PATH)
    os.makedirs(STAGE, exist_ok=True)
    sysops.mount("tmpfs", STAGE, "tmpfs", 0, "mode=0700")
    layers = []
    for i, point in enumerate(points):
        upper, work = f"{STAGE}/{i}/upper", f"{STAGE}/{i}/work"
        for d in (f"{STAGE}/{i}", upper, work):
            os.mkdir(d)
        lower = ":".join(filter(None, [lowers.get(point), f"/proc/self/fd/{sources[point]}"]))
        options = f"lowerdir={lower},upperdir={upper},workdir={work}" + (",userxattr" if userns else "")
        try:
            sysops.mount("overlay", point, "overlay", 0, options)
        except OSError as e:
            # a file system overlayfs cannot sit on (another overlay's upper, FUSE): left as is; or
            # a mount point gone since it was opened (ENOENT: dockerd removes a container's root at
            # any time): what is gone needs no cover
            if e.errno not in (errno.EINVAL, errno.EPERM, errno.ELOOP, errno.EOPNOTSUPP, errno.ENOENT):
                raise
            continue
        layers.append((point, os.open(upper, os.O_PATH | os.O_DIRECTORY),
                       [p for p in (f"/proc/self/fd/{sources.pop(point)}", lowers.get(point)) if p]))
    for fd in sources.values():   # those whose overlay could not be mounted
        os.close(fd)
    # Parents first: the run directory holds the jail, and bound after it would hide the jail's own
    # bind, leaving the jail no mount point of its own in this namespace (as a shared file system's is).
    for path, fd in sorted(keep, key=lambda k: k[0].rstrip("/").count("/")) + files:
        try:
            sysops.mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        except FileNotFoundError:
            if (path, fd) in keep:
                raise
            # a file mount gone since it was opened (as above): nothing to bind back
        finally:
            os.close(fd)
    sysops.umount(STAGE, MNT_DETACH)
    os.rmdir(STAGE)
    return HostView(layers)


def _in_user_namespace() -> bool:
    with open("/proc/self/uid_map") as f:
        return f.read().split() != ["0", "0", "4294967295"]


def snapshot(*roots: str) -> dict[str, tuple]:
    """path -> (type and mode, size, mtime) of everything under `roots` (the node's /dev and /run:
    small tmpfs trees), without following links. Device nodes compare by type, mode and device
    number only (their times move with every write to the host's /dev/null)."""
    out = {}
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                    out[full] = (st.st_mode, st.st_rdev)
                elif stat.S_ISDIR(st.st_mode):   # its times move with its entries, reported themselves
                    out[full] = (st.st_mode,)
                else:
                    out[full] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def compare(before: dict[str, tuple], after: dict[str, tuple]) -> list[dict]:
    """The changes between two snapshots, in the form of `HostView.changes`."""
    out = [{"path": p, "change": "deleted", "mode": before[p][0]} for p in before if p not in after]
    out += [{"path": p, "change": "changed" if p in before else "created", "mode": v[0]}
            for p, v in after.items() if before.get(p) != v]
    return sorted(out, key=lambda c: c["path"])
