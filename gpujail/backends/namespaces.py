"""A node's namespaces: how a node process becomes PID 1 of its own mount and PID namespaces.

How this works
--------------
A node (gpujail/backends/node.py) is a process with a private mount namespace and a PID namespace
of its own, of which it is PID 1: when it dies the kernel kills every process of the node, and
when the last one goes the mount namespace and its mounts go too (SPEC INV-6). Two ways in:

* `enter_namespaces()`: a node started as `python -m gpujail.backends.node` unshares the mount
  and PID namespaces (plus a user namespace when not root, SPEC K-5), makes every mount private
  and forks: the child is PID 1 and goes on, the outer process only relays its exit status.
* `fork_node(cfg)` then `enter(cfg)`: the node factory (node_factory.py) forks each node. As root the
  child is born PID 1 of a new PID namespace (`unshare(CLONE_NEWPID)` before the fork, `setns`
  back after it), so it only needs a mount namespace; unprivileged, the child makes the user
  namespace first and goes through `enter_namespaces` like a started node. `enter` records in
  `entered` whether that worked (or the OSError why not), for node.py's `main` to say on the
  node's stdout, as a started node says it.

`enter_mount_ns(path)` first moves a node into another mount namespace than the harness's: one
holding the node's own client of a network jail (jailfs.py), or the stand-in of a host whose jail
mount is shared (shared_host.py; there the node's copy keeps its propagation: `propagation = "shared"`).
Every process here asks to be SIGKILLed when its parent dies (`die_with_parent`), so a dead harness
leaves nothing behind.
"""
from __future__ import annotations

import ctypes
import os
import signal

from gpujail.world.sysops import MS_PRIVATE, MS_REC, RealSys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
sysops = RealSys()


def die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare: {os.strerror(e)}")


def enter_namespaces(pid1: bool = False, shared: bool = False) -> None:
    """Private mount + PID namespace (+ user namespace when unprivileged). Forks: returns in PID 1.
    `pid1`: this process already is the PID 1 of a new PID namespace (fork_node): the mount
    namespace only. `shared`: the mounts keep their propagation (a node on a shared host,
    shared_host.py, whose namespace is private from the machine's but for the shared jail mount)."""
    uid, gid = os.getuid(), os.getgid()
    if pid1:
        unshare(CLONE_NEWNS)
        if not shared:
            sysops.mount(None, "/", None, MS_REC | MS_PRIVATE)
        die_with_parent()
        return
    flags = CLONE_NEWNS | CLONE_NEWPID
    if uid != 0:
        flags |= CLONE_NEWUSER
    unshare(flags)
    if uid != 0:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    if not shared:
        sysops.mount(None, "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid:  # the outer process only relays the exit status of PID 1
        die_with_parent()
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    die_with_parent()


def enter_mount_ns(path: str) -> None:
    """Start from another mount namespace than the harness's: one holding this node's own client of
    a network jail (gpujail/backends/jailfs.py), so the copy this node makes sees the jail through it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNS) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {path}: {os.strerror(e)}")
    finally:
        os.close(fd)
    os.chdir("/")


entered: bool | OSError | None = None   # set by `enter` in the factory's child: done, or why not
HOST_UID = os.getuid()   # the uid that started the node, before a user namespace made it 0


def fork_node(cfg: dict) -> int:
    """The factory's fork of a node (node_factory.py): 0 in the child, its pid in the factory. As root
    the child is born PID 1 of a new PID namespace, so no outer process stays behind to wait for it:
    unshare(CLONE_NEWPID) names the namespace of the children to come, and setns back to the
    factory's own makes the next one possible (a second unshare would fail with EINVAL).
    Unprivileged, the child makes a user namespace first, the PID namespace in it, and waits as
    their outer process (enter_namespaces)."""
    if HOST_UID != 0 or cfg.get("listen"):
        return os.fork()
    global _own_pid_ns
    if _own_pid_ns is None:
        _own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    unshare(CLONE_NEWPID)
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0 and _libc.setns(_own_pid_ns, CLONE_NEWPID) != 0:   # the factory, also when fork failed
            e = ctypes.get_errno()
            raise OSError(e, f"setns back to the factory's PID namespace: {os.strerror(e)}")
    return pid


_own_pid_ns: int | None = None   # the factory's PID namespace, to return to after each fork_node


def enter(cfg: dict) -> None:
    """Into the node's namespaces (step 1), in the child of fork_node: returns in PID 1."""
    global entered
    try:
        if cfg.get("mount_ns"):
            enter_mount_ns(cfg["mount_ns"])
        enter_namespaces(pid1=os.getpid() == 1, shared=cfg.get("propagation") == "shared")
        entered = True
    except OSError as e:   # said by node.py's main, on the node's stdout
        entered = e
