"""The host processes a jail file system runs: found in /proc, signalled, waited for.

How this works
--------------
A network jail (jailfs.py) is a handful of daemons on this host: glusterd and its brick
(gluster.py), a FUSE client daemon per node, bindfs views, and the client holders whose mount
namespaces hold those clients. None of them is a child the harness can simply wait for (a FUSE
daemon forks away from its mount command), so they are named by what /proc says: `alive` reads a
process's state (a zombie awaiting its reaper is gone), `ns_pids` finds the processes in a
holder's mount namespace, `kill` signals one and waits until it is gone. `run` runs a tool
(gluster, mount, cp) and turns a failure into one RuntimeError line; `which` also looks in the
sbin directories, where the daemons live. `Unavailable` is a host that cannot provide a kind.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time

CALL_TIMEOUT = 60.0

# What a node's file operations answer while its jail is cut off (its client killed, the brick
# down): ENOTCONN once the FUSE connection is gone, ECONNABORTED for a request that was in flight
# when it went (the kernel ends those with it): CLIENT_GONE; and EIO from GlusterFS while the
# brick is down.
CLIENT_GONE = ("Transport endpoint is not connected", "Software caused connection abort")
OUTAGE_ERRORS = CLIENT_GONE + ("Input/output error",)


class Unavailable(RuntimeError):
    """This host cannot provide the kind asked for (exit 3, EXIT["backend"])."""


def which(prog: str) -> str | None:
    return shutil.which(prog, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def run(argv: list[str], what: str, timeout: float = CALL_TIMEOUT) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{what}: {' '.join(argv)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}")
    return r.stdout


def kill(pid: int, sig: int = signal.SIGKILL, wait: float = 10.0) -> None:
    """Signal `pid` and wait until it is gone (or a zombie awaiting its reaper)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + wait
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def ns_pids(holder: int) -> list[int]:
    """The processes in `holder`'s mount namespace besides itself (the FUSE client daemon)."""
    try:
        ns = os.readlink(f"/proc/{holder}/ns/mnt")
    except OSError:
        return []
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != holder:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{d}/ns/mnt") == ns and alive(int(d)):
                    out.append(int(d))
    return out
