"""A node's view of the host and of the jail, built in the node's own mount namespace (step 2 of node.py).

How this works
--------------
`build_view(cfg)` runs in the node's PID 1, after it entered its namespaces (namespaces.py), and
changes mounts only there: the host's own `/usr`, `/dev`, `/run` are never written.

* The host is seen copy-on-write (cow.py): what a start writes outside the jail is recorded, never
  done; the jail, the history's directory and the barriers are bound back for real. `host_view`
  keeps that cover, for the run request (node_starts.py) to ask what a start changed.
* The cached driver tree is a read-only lower layer of `/usr` (the driver files at their real host
  paths).
* `/run` is a fresh tmpfs holding the persistenced socket (a real AF_UNIX socket), `/dev` a fresh
  tmpfs holding the usual devices (bind mounts of the host's) and the NVIDIA device nodes
  (`_node_dev`); both are bind-mounted over `JAIL/dev` and `JAIL/run`, which is how a real jail
  sees node-local objects (SPEC REF-3), and the node's own procfs over `JAIL/proc` (`_jail_proc`).
* Scenario options: a small tmpfs under the jail holding a copy of it (`jail_tmpfs`, for ENOSPC),
  a read-only jail (`jail_readonly`), a jail that is no mount point of its own, only a directory of
  the run directory's (`jail_mount_point = False`).
"""
from __future__ import annotations

import os
import shutil
import socket

from gpujail.backends import cow
from gpujail.world.sysops import MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REC, RealSys

MS_MOVE = 8192
HOST_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
sysops = RealSys()
host_view: cow.HostView | None = None   # set by build_view; None in a container (the engine's layers)


def build_view(cfg: dict) -> None:
    """The node's view of the host and of the jail, in this mount namespace only."""
    global host_view
    tree, jail = cfg.get("driver_tree"), cfg["jail"]
    lowers = {os.path.realpath("/" + top): os.path.join(tree, top) for top in sorted(os.listdir(tree))} if tree else {}
    sysops.mount("tmpfs", "/run", "tmpfs", 0, "mode=0755")
    if cfg.get("cow", True):
        # The host copy-on-write (cow.py): what a start writes outside the jail is seen, never done.
        history_file, barriers = cfg["env"].get("GPUJAIL_HISTORY"), cfg["env"].get("GPUJAIL_BARRIERS")
        shared = [jail, *([os.path.dirname(history_file)] if history_file else []), *([barriers] if barriers else [])]
        if cfg.get("jail_mount_point") is False:
            # The jail a plain directory of the run directory's mount, not a mount point of its own
            # (a jail under a shared file system's mount point): reached through that bind only.
            if not any(jail.startswith(p.rstrip("/") + "/") for p in shared[1:]):
                raise OSError(f"jail_mount_point = false needs the jail inside the run directory, not at {jail}")
            shared.remove(jail)
        host_view = cow.cover(shared, lowers)
        lowers = {p: lower for p, lower in lowers.items() if p not in {point for point, *_ in host_view.layers}}
    for target, lower in lowers.items():   # driver files at their host paths, read-only
        sysops.mount("overlay", target, "overlay", 0, f"lowerdir={lower}:{target}")
    _node_dev(cfg)
    if cfg.get("jail_tmpfs"):
        # A small file system under the jail (this node only), holding a copy of the jail: for
        # ENOSPC scenarios. Staged through /run because the tmpfs hides what it is mounted on.
        stage = "/run/.jail-copy"
        shutil.copytree(jail, stage, symlinks=True)
        sysops.mount("tmpfs", jail, "tmpfs", 0, f"size={cfg['jail_tmpfs']},mode=0755")
        shutil.copytree(stage, jail, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(stage)
    if cfg.get("jail_readonly"):
        sysops.mount(jail, jail, None, MS_BIND | MS_REC)
        sysops.remount(jail, MS_RDONLY)
    for path in [cfg["socket"]] if isinstance(cfg.get("socket"), str) else cfg.get("socket") or []:   # list: --cdi-spec
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)   # a real socket inode; nobody needs to listen for a bind mount of it
        s.close()
        os.chmod(path, 0o777)
    for d in ("dev", "run"):
        # A hostile jail may have replaced dev/ or run/ with a symlink: mount on the real directory
        # only (O_NOFOLLOW on the last component), never follow it out of the jail.
        fd = os.open(os.path.join(jail, d), os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
        try:
            sysops.mount(f"/{d}", f"/proc/self/fd/{fd}", None, MS_BIND | MS_REC)
        finally:
            os.close(fd)
    _jail_proc(jail)


def _jail_proc(jail: str) -> None:
    """The worker's own procfs on JAIL/proc, as the operator's workers have: a standalone CLI (no
    `--pid`) finds its parent's owner and mount namespace at ROOTFS/proc/<ppid> (SPEC CLI-5,
    nvc_container.c). Mounted by this process, PID 1 of the node's PID namespace, so it shows that
    namespace: a parent outside the node is ppid 0, which no proc shows. A jail whose proc/ is not a
    directory (a hostile symlink, none at all) gets none, like a real node's: the CLI fails then."""
    try:
        fd = os.open(os.path.join(jail, "proc"), os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
    except OSError:
        return
    try:
        sysops.mount("proc", f"/proc/self/fd/{fd}", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    finally:
        os.close(fd)


def _node_dev(cfg: dict) -> None:
    """A tmpfs /dev with the host's everyday devices (bind mounts) and this node's NVIDIA nodes.

    Built in a staging tmpfs under /run while the host's /dev is still visible, then moved over /dev
    (fds opened before unshare belong to the old namespace and cannot be bind sources)."""
    stage = "/run/.node-dev"
    os.mkdir(stage)
    sysops.mount("tmpfs", stage, "tmpfs", 0, "mode=0755")
    for name in HOST_DEVICES:
        open(f"{stage}/{name}", "w").close()
        sysops.bind_mount(f"/dev/{name}", f"{stage}/{name}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{stage}/{name}")
    os.mkdir(f"{stage}/shm", 0o1777)
    os.chmod(f"{stage}/shm", 0o1777)
    for path, major, minor in cfg.get("devices", []):
        local = stage + path[len("/dev"):]
        os.makedirs(os.path.dirname(local), exist_ok=True)   # /dev/nvidia-caps/... (--cdi-spec)
        if cfg["privileged"]:
            os.mknod(local, 0o020666, os.makedev(major, minor))
            os.chmod(local, 0o666)
        else:  # no mknod in a user namespace: a bind mount of /dev/null stands in for the node
            open(local, "w").close()
            sysops.bind_mount("/dev/null", local)
    sysops.mount(stage, "/dev", None, MS_MOVE)
    os.rmdir(stage)
