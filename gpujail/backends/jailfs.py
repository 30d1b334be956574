"""The jail's file system (SPEC section 8): one local directory, GlusterFS, or node-local locks.

How this works
--------------
The jail's file system is an axis of its own, independent of the backend. `provide` is a context
manager that makes one and takes it down again:

    with jailfs.provide("gluster", run_dir, jail) as fs:   # jail: a directory already holding the image
        fs.jail                     # the path every node, and the harness, sees the jail at
        fs.node_options("w1")       # what Node.start passes to the agent: {"mount_ns": "/proc/PID/ns/mnt"}
        fs.kill_brick(); fs.restart_brick(); fs.lose_client("w1"); fs.set_latency(ms)   # faults
        fs.leftovers()              # what of it outlived it (INV-6), [] when all is well

Kinds (KINDS):

* `local`: the jail is the directory itself; every node sees the same dentries (K-1: a remote
  unlink detaches at once). No client, no daemon: `node_options` is {}.
* `gluster`: glusterd, a volume on a brick of this run, and the harness's own client mounted at
  `jail` for the lifetime of the context in a private mount namespace of the calling thread (the
  chaos runner and the fixtures read and write the jail at one path; the host's namespace never
  holds it): gluster.py, whose `GlusterVolume` is JailFS's GlusterFS half. Each node gets a
  *client holder*: a process in a private mount namespace of its own (`unshare --mount`) in which a
  second FUSE client is mounted over `jail`; the node's agent enters that namespace before it makes
  its own (namespaces.py, `mount_ns`), so each node looks the jail up through its own client, with its own
  dentry and attribute caches (K-2: a remote unlink detaches at that node's next lookup). The client
  daemon lives in the host's PID namespace and keeps the holder's mount namespace: on exit every
  client is unmounted in its own namespace (`nsenter -t HOLDER -m umount JAIL`), its holder killed
  by pid, the harness's client unmounted, the volume stopped and deleted, glusterd stopped by pid
  (its network namespace and its /run/gluster, which are its own, go with it): nothing is left, also
  on an exception or Ctrl-C. Any number of runs' glusterds share a machine.
* `nodelocal-locks`: the jail is one directory, and each node's holder mounts a `bindfs` view of it
  over itself: shared data, but `flock` serialises only within one view (a lock that is only
  node-local, like NFS with `local_lock=all`). The harness uses the directory itself.

`provide(..., cache_timeout=0)` makes the nodes' GlusterFS clients and bindfs views revalidate at every lookup (the
suites' choice). `NetFault` is a network fault as scenario data; jailfs_fleet.py's
`fleet_class(kernel.Fleet, kind, faults)` is the Fleet the suites use: the file system around each
fleet's life, each node started from its client's namespace, and the faults injected and recorded.
The daemons are host processes, found and stopped through /proc (fs_processes.py).

A SIGKILLed harness leaves glusterd, the brick and the clients running: stop them by the pids
`leftovers()` names. SIGTERM and SIGHUP unwind as Ctrl-C does (`gpujail run`, and the plugin in any
pytest session of a suite: gpujail/plugin `stop_on_signals`), so the fleet's cleanup stops them.

`unavailable(kind)` says why a kind cannot run here (None when it can), after installing the Debian
packages through apt when they are missing and we are root (as scripts/with-dockerd.sh does for
docker.io); the command and the plugin turn the reason into exit 3 or a skip.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpujail.backends.fs_processes import CALL_TIMEOUT, Unavailable, alive, kill, ns_pids, which
from gpujail.backends.gluster import GlusterVolume, own_mount_ns

KINDS = ("local", "gluster", "nodelocal-locks")
# A node's new client did not come up (mount.glusterfs stats the mount point, which fails while the
# brick is down): jailfs_fleet's start retries it once the outage is over, as it does a lost client.
MOUNT_FAILED = "mount failed"
PACKAGES = {"gluster": {"glusterd": "glusterfs-server", "mount.glusterfs": "glusterfs-client", "ip": "iproute2"},
            "nodelocal-locks": {"bindfs": "bindfs"}}


def missing_packages(*kinds: str) -> list[str]:
    """The Debian packages `kinds` (default: every kind) need and this host lacks (./run-tests
    installs them in one apt-get run with its other packages)."""
    return sorted({pkg for kind in kinds or PACKAGES for prog, pkg in PACKAGES[kind].items() if not which(prog)})


def unavailable(kind: str, install: bool = True) -> str | None:
    """None when `kind` can run here, else why not. As root, installs missing packages through apt."""
    if kind == "local":
        return None
    if kind not in KINDS:
        return f"unknown jail filesystem {kind!r} (expected one of {', '.join(KINDS)})"
    if os.getuid() != 0:
        return f"jail filesystem {kind!r} needs root (FUSE mounts in each node's namespace)"
    if not os.path.exists("/dev/fuse"):
        return f"jail filesystem {kind!r} needs FUSE, and this host has no /dev/fuse"
    missing = missing_packages(kind)
    if missing and install and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]):
            subprocess.run(argv, env=env, capture_output=True, timeout=600)
        missing = missing_packages(kind)
    if missing:
        return f"jail filesystem {kind!r} needs the Debian package(s) {', '.join(missing)}, not installed"
    return None


@dataclass
class Client:
    """One node's view of the jail: a holder process whose private mount namespace has the FUSE
    client mounted over the jail path."""
    node_id: str
    holder: subprocess.Popen

    @property
    def mount_ns(self) -> str:
        return f"/proc/{self.holder.pid}/ns/mnt"

    @property
    def alive(self) -> bool:
        return self.holder.poll() is None

    def daemons(self) -> list[int]:
        return ns_pids(self.holder.pid)


@dataclass
class JailFS(GlusterVolume):
    kind: str
    run_dir: Path
    jail: Path
    clients: dict[str, Client] = field(default_factory=dict)
    _mount_cmd: list[str] = field(default_factory=list)   # argv mounting a client at the jail ("$@")
    volume: str = ""
    _glusterd: subprocess.Popen | None = None
    _gluster_sock: str = ""
    _harness_mounted: bool = False
    _run_short: Path | None = None   # glusterd's run directory (its sockets): a short path of its own
    state: Path = Path()   # gluster: glusterd's working, run and log directories and the brick

    # -- what nodes get ----------------------------------------------------------------------------

    def node_options(self, node_id: str) -> dict:
        """The agent's config for node `node_id`: the mount namespace holding its own client."""
        if self.kind == "local":
            return {}
        client = self.clients.get(node_id)
        if client is None or not client.alive or (self.kind == "gluster" and not client.daemons()):
            if client is not None:
                self._end_client(client)
            client = self.clients[node_id] = self._new_client(node_id)
        return {"mount_ns": client.mount_ns}

    def _new_client(self, node_id: str) -> Client:
        # The holder unshares a mount namespace (private propagation: nothing of it reaches the host),
        # mounts the client over the jail, says so, then only waits: the namespace lives while it does.
        # (mount.glusterfs refuses a path its mtab already shows mounted: the copy of the harness's
        # client this namespace inherits is dropped first, in this namespace only.)
        script = ('[ -z "$GPUJAIL_UNDER" ] || umount -l "$GPUJAIL_UNDER"; '
                  '"$@" || exit $?; echo ready; exec sleep infinity')
        p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "holder",
                              *self._mount_cmd],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True,
                             env={**os.environ, "GPUJAIL_UNDER": str(self.jail) if self._harness_mounted else ""})
        line = p.stdout.readline()
        if line.strip() != "ready":
            err = p.stderr.read() if p.wait(timeout=CALL_TIMEOUT) is not None else ""
            raise RuntimeError(f"{self.kind} client for node {node_id}: {MOUNT_FAILED}: {err.strip()[-400:]}")
        return Client(node_id, p)

    def _end_client(self, client: Client) -> None:
        if client.alive:
            subprocess.run(["nsenter", "-t", str(client.holder.pid), "-m", "umount", "-l", str(self.jail)],
                           capture_output=True, timeout=CALL_TIMEOUT)
        for pid in client.daemons():   # a client daemon outlives its unmount only when it is wedged
            kill(pid, signal.SIGTERM, wait=5)
            kill(pid)
        if client.holder.poll() is None:
            client.holder.kill()
        client.holder.wait()
        for f in (client.holder.stdout, client.holder.stderr):
            f.close()

    def lose_client(self, node_id: str) -> list[int]:
        """The node's client goes away under it (its FUSE daemon is killed): the node's jail answers
        ENOTCONN until the node is replaced; its replacement gets a fresh client."""
        client = self.clients.get(node_id)
        pids = client.daemons() if client else []
        for pid in pids:
            kill(pid)
        return pids

    # -- what outlived it (INV-6) --------------------------------------------------------------------

    def leftovers(self) -> list[str]:
        out = [f"{self.kind} client holder of node {c.node_id} (pid {c.holder.pid})"
               for c in self.clients.values() if c.alive]
        if self._glusterd and self._glusterd.poll() is None:
            out.append(f"glusterd (pid {self._glusterd.pid})")
        marker = str(self.run_dir)
        out += [f"process {pid}: {cmd[:200]}" for pid, cmd in self._daemons()]
        for ns in ("/proc/thread-self/mountinfo", "/proc/1/mountinfo"):   # ours, and the host's
            with contextlib.suppress(OSError), open(ns) as f:
                out += [f"mount {ln.split()[4]}" for ln in f if ln.split()[4].startswith(marker)]
        return sorted(set(out))

    def _daemons(self) -> list[tuple[int, str]]:
        """(pid, command line) of every live GlusterFS or bindfs process of this run (named by its paths)."""
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError):
                    cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
                    if str(self.run_dir) in cmd and re.search(r"gluster|bindfs", cmd) and alive(int(d)):
                        out.append((int(d), cmd))
        return out

    def _end_daemons(self) -> None:
        """The last step down: a client daemon still running once its mounts are gone (one that
        was talking to a killed brick may linger) is stopped by its pid."""
        deadline = time.monotonic() + 5
        while self._daemons() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid, _ in self._daemons():
            kill(pid, signal.SIGTERM, wait=3)
            kill(pid)

@contextlib.contextmanager
def provide(kind: str, run_dir: str | os.PathLike, jail: str | os.PathLike | None = None,
            nodes: list[str] | tuple[str, ...] = (),
            cache_timeout: float | None = None) -> Iterator[JailFS]:
    """The jail at `jail` (default `run_dir/jail`, created empty if missing) on file system `kind`,
    with clients for `nodes` made up front (others on first `node_options`). `cache_timeout`: the
    nodes' GlusterFS clients keep dentries and attributes this many seconds before they revalidate
    (None: GlusterFS's default, 1 s). See the module's doc."""
    reason = unavailable(kind)
    if reason:
        raise Unavailable(reason)
    run_dir = Path(run_dir)
    jail = Path(jail) if jail is not None else run_dir / "jail"
    jail.mkdir(parents=True, exist_ok=True)
    fs = JailFS(kind, run_dir, jail)
    with own_mount_ns() if kind == "gluster" else contextlib.nullcontext():
        try:
            if kind == "gluster":
                fs._start_gluster()
                fs._seed_through_harness_client()
                if cache_timeout is not None:   # the nodes' clients only; the harness's keeps the default
                    options = fs._mount_cmd.index("-o") + 1
                    fs._mount_cmd[options] += f",entry-timeout={cache_timeout:g},attribute-timeout={cache_timeout:g}"
                    # the FUSE timeouts alone are not enough: GlusterFS's md-cache (a volume option, whole
                    # seconds) still answers a lookup for about a second after another client's unlink
                    fs._gluster("volume", "set", fs.volume, "performance.md-cache-timeout", str(int(cache_timeout)))
            elif kind == "nodelocal-locks":
                fs._mount_cmd = ["bindfs", "-o", "fsname=gpujail-jailfs", str(jail), str(jail)]
                if cache_timeout is not None:   # libfuse's own caches: a remote unlink detaches at the next lookup (K-2)
                    fs._mount_cmd[2] += f",entry_timeout={cache_timeout:g},attr_timeout={cache_timeout:g}"
            if kind != "local" and nodes:
                with ThreadPoolExecutor(max_workers=8) as pool:   # clients mount in parallel
                    list(pool.map(fs.node_options, nodes))
            yield fs
        finally:
            for c in list(fs.clients.values()):
                fs._end_client(c)
            fs.clients.clear()
            if kind == "gluster":
                fs._stop_gluster()
            fs._end_daemons()


# -- the faults a scenario may ask of a network jail (jailfs_fleet.py injects them) ---------------------

@dataclass(frozen=True)
class NetFault:
    """A fault only a network file system has (SPEC section 7), as scenario data:
    `{ fault = "kill-brick" | "latency" | "lose-client", after_ready = N, delay = SECONDS, hold = SECONDS,
    worker = "w1", ms = 40, barrier = "B" }`: `delay` seconds after N workers have reported ready (0:
    after the first start began), the fault starts; after `hold` seconds it clears (the brick
    restarts, the latency goes; a lost client is never given back to its node: the node's
    replacement gets a fresh one).
    With `barrier`, the fault lands at a step rather than at a time: it starts once a worker is
    paused at that barrier (and N are ready), the barrier opens only then (chaos/nemesis.py
    keep_barriers), and the fault clears `hold` seconds after the held starts ended: a start under
    way meets the fault every run, whatever the machine's load."""
    fault: str
    after_ready: int = 1
    delay: float = 0.0     # seconds after the trigger
    hold: float = 1.0
    worker: str = ""
    ms: float = 0.0
    barrier: str = ""


NET_FAULTS = ("kill-brick", "latency", "lose-client")
