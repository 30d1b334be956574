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
* `gluster`: `glusterd -N` is started as our child with its working, run and log directories and its
  CLI socket under `run_dir/gluster-XXXX/` (its TCP port is the fixed 24007 that bricks and clients
  assume, so one run at a time per machine: a `flock` on the glusterd binary serialises them). A
  volume on a brick under `run_dir/gluster-XXXX/brick` is created (`gluster --mode=script volume create
  NAME HOST:BRICK force`) and started; the image already in `jail` is moved aside and copied in
  through the harness's client, mounted at `jail` for the lifetime of the context in a private
  mount namespace of the calling thread (`_own_mount_ns`: the chaos runner and the fixtures read and
  write the jail at one path; the host's namespace never holds it). Each node gets a
  *client holder*: a process in a private mount namespace of its own (`unshare --mount`) in which a
  second FUSE client is mounted over `jail`; the node's agent enters that namespace before it makes
  its own (node.py, `mount_ns`), so each node looks the jail up through its own client, with its own
  dentry and attribute caches (K-2: a remote unlink detaches at that node's next lookup). The client
  daemon lives in the host's PID namespace and keeps the holder's mount namespace: on exit every
  client is unmounted in its own namespace (`nsenter -t HOLDER -m umount JAIL`), its holder killed
  by pid, the harness's client unmounted, the volume stopped and deleted, glusterd stopped by pid,
  and the sockets glusterd left under /run/gluster removed: nothing is left, also on an exception or
  Ctrl-C.
* `nodelocal-locks`: the jail is one directory, and each node's holder mounts a `bindfs` view of it
  over itself: shared data, but `flock` serialises only within one view (a lock that is only
  node-local, like NFS with `local_lock=all`). The harness uses the directory itself.

`provide(..., cache_timeout=0)` makes the nodes' GlusterFS clients and bindfs views revalidate at every lookup (the
suites' choice, CHAOS_CACHE_TIMEOUT). `fleet_class(kernel.Fleet, kind, faults)` is the Fleet the
suites use: the file system around each fleet's life, each node started from its client's
namespace, and the scenario's network faults (`NetFault`) injected and recorded in the history.

A SIGKILLed or SIGTERMed harness (pytest does not turn SIGTERM into cleanup; `gpujail run` does)
leaves glusterd, the brick and the clients running: stop them by the pids `leftovers()` names.

`unavailable(kind)` says why a kind cannot run here (None when it can), after installing the Debian
packages through apt when they are missing and we are root (as scripts/with-dockerd.sh does for
docker.io); the command and the plugin turn the reason into exit 3 or a skip.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpujail.world.sysops import MS_PRIVATE, MS_REC, RealSys

KINDS = ("local", "gluster", "nodelocal-locks")
PACKAGES = {"gluster": {"glusterd": "glusterfs-server", "mount.glusterfs": "glusterfs-client"},
            "nodelocal-locks": {"bindfs": "bindfs"}}
GLUSTER_RUN = Path("/run/gluster")   # where glusterd puts brick sockets whatever its run-directory
CALL_TIMEOUT = 60.0
CLONE_NEWNS = 0x00020000
_libc = ctypes.CDLL(None, use_errno=True)
_sys = RealSys()


class Unavailable(RuntimeError):
    """This host cannot provide the kind asked for (exit 3, EXIT["backend"])."""


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
    missing = sorted({pkg for prog, pkg in PACKAGES[kind].items() if not _which(prog)})
    if missing and install and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
            subprocess.run(argv, env=env, capture_output=True, timeout=600)
        missing = sorted({pkg for prog, pkg in PACKAGES[kind].items() if not _which(prog)})
    if missing:
        return f"jail filesystem {kind!r} needs the Debian package(s) {', '.join(missing)}, not installed"
    return None


def _which(prog: str) -> str | None:
    return shutil.which(prog, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def _run(argv: list[str], what: str, timeout: float = CALL_TIMEOUT) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{what}: {' '.join(argv)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}")
    return r.stdout


def _kill(pid: int, sig: int = signal.SIGKILL, wait: float = 10.0) -> None:
    """Signal `pid` and wait until it is gone (or a zombie awaiting its reaper)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + wait
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def _ns_pids(holder: int) -> list[int]:
    """The processes in `holder`'s mount namespace besides itself (the FUSE client daemon)."""
    try:
        ns = os.readlink(f"/proc/{holder}/ns/mnt")
    except OSError:
        return []
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != holder:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{d}/ns/mnt") == ns and _alive(int(d)):
                    out.append(int(d))
    return out


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
        return _ns_pids(self.holder.pid)


@dataclass
class JailFS:
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
    _run_before: set[str] = field(default_factory=set)
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
            raise RuntimeError(f"{self.kind} client for node {node_id}: mount failed: {err.strip()[-400:]}")
        return Client(node_id, p)

    def _end_client(self, client: Client) -> None:
        if client.alive:
            subprocess.run(["nsenter", "-t", str(client.holder.pid), "-m", "umount", "-l", str(self.jail)],
                           capture_output=True, timeout=CALL_TIMEOUT)
        for pid in client.daemons():   # a client daemon outlives its unmount only when it is wedged
            _kill(pid, signal.SIGTERM, wait=5)
            _kill(pid)
        if client.holder.poll() is None:
            client.holder.kill()
        client.holder.wait()
        for f in (client.holder.stdout, client.holder.stderr):
            f.close()

    # -- faults only a network file system has (SPEC section 7) ---------------------------------------

    def _gluster(self, *args: str, timeout: float = CALL_TIMEOUT) -> str:
        return _run(["gluster", "--mode=script", f"--glusterd-sock={self._gluster_sock}",
                     f"--log-file={self.state}/log/cli.log", *args], "gluster", timeout)

    def brick_pids(self) -> list[int]:
        pids = []
        for f in (self.state / "run/vols" / self.volume).glob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(f.read_text().strip())
                if _alive(pid):
                    pids.append(pid)
        return pids

    def kill_brick(self) -> list[int]:
        """SIGKILL the brick process: every client gets ENOTCONN/EIO until `restart_brick`."""
        pids = self.brick_pids()
        for pid in pids:
            _kill(pid)
        # A killed brick may stay a zombie (its reaper is whoever adopted the daemon), and glusterd
        # takes a pid file naming an existing /proc entry for a running brick: without the file,
        # `volume start force` starts a new one.
        for f in (self.state / "run/vols" / self.volume).glob("*.pid"):
            f.unlink(missing_ok=True)
        return pids

    def restart_brick(self, timeout: float = 30.0) -> None:
        """Start the brick again and wait until the harness's client reads the jail again (clients
        reconnect on their own, within seconds): the harness's after-run snapshot must see the jail."""
        self._gluster("volume", "start", self.volume, "force")
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.listdir(self.jail)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def set_latency(self, ms: float, percent: int = 100) -> None:
        """Latency on every file operation of the brick (GlusterFS's delay-gen translator); 0 clears it."""
        if ms <= 0:
            self._gluster("volume", "reset", self.volume, "delay-gen.enable")
            self._gluster("volume", "set", self.volume, "debug.delay-gen", "off")
            return
        self._gluster("volume", "set", self.volume, "debug.delay-gen", "posix")
        self._gluster("volume", "set", self.volume, "delay-gen.delay-duration", str(int(ms * 1000)))
        self._gluster("volume", "set", self.volume, "delay-gen.delay-percentage", str(percent))
        self._gluster("volume", "set", self.volume, "delay-gen.enable", "lookup,stat,open,create,mkdir,"
                      "unlink,rename,read,write,flush,fsync,readdir,readdirp,setxattr,getxattr,inodelk,"
                      "entrylk,lk,symlink,link,truncate,ftruncate,setattr,fsetattr")

    def lose_client(self, node_id: str) -> list[int]:
        """The node's client goes away under it (its FUSE daemon is killed): the node's jail answers
        ENOTCONN until the node is replaced; its replacement gets a fresh client."""
        client = self.clients.get(node_id)
        pids = client.daemons() if client else []
        for pid in pids:
            _kill(pid)
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
        if GLUSTER_RUN.is_dir() and self.kind == "gluster":
            out += [f"{GLUSTER_RUN / n} (left by glusterd)" for n in set(os.listdir(GLUSTER_RUN)) - self._run_before]
        return sorted(set(out))

    def _daemons(self) -> list[tuple[int, str]]:
        """(pid, command line) of every live GlusterFS or bindfs process of this run (named by its paths)."""
        out = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError):
                    cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
                    if str(self.run_dir) in cmd and re.search(r"gluster|bindfs", cmd) and _alive(int(d)):
                        out.append((int(d), cmd))
        return out

    def _end_daemons(self) -> None:
        """The last step down: a client daemon still running once its mounts are gone (one that
        was talking to a killed brick may linger) is stopped by its pid."""
        deadline = time.monotonic() + 5
        while self._daemons() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid, _ in self._daemons():
            _kill(pid, signal.SIGTERM, wait=3)
            _kill(pid)

    # -- up and down ---------------------------------------------------------------------------------

    def _start_gluster(self) -> None:
        # A directory of its own each time: a brick that held a volume cannot make another one.
        self.run_dir.mkdir(parents=True, exist_ok=True)
        g = self.state = Path(tempfile.mkdtemp(prefix="gluster-", dir=self.run_dir))
        for d in ("work", "log", "brick"):
            (g / d).mkdir(parents=True, exist_ok=True)
        # glusterd's sockets live in its run directory, and a unix socket's path must fit in 108
        # bytes: a short directory of its own (g/run links to it), removed in _stop_gluster
        self._run_short = Path(tempfile.mkdtemp(prefix="gpujail-glusterd-", dir="/tmp"))
        (g / "run").symlink_to(self._run_short)
        self._gluster_sock = str(self._run_short / "glusterd.sock")
        (g / "glusterd.vol").write_text(f"""volume management
    type mgmt/glusterd
    option working-directory {g}/work
    option run-directory {self._run_short}
    option logging-directory {g}/log
    option glusterd-sockfile {self._gluster_sock}
    option transport-type socket
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
end-volume
""")
        self._run_before = set(os.listdir(GLUSTER_RUN)) if GLUSTER_RUN.is_dir() else set()
        self._glusterd = subprocess.Popen(["glusterd", "-N", "-f", str(g / "glusterd.vol"),
                                           "-p", str(self._run_short / "glusterd.pid"),
                                           "-l", str(g / "log/glusterd.log"), "--log-level", "WARNING"],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                self._gluster("volume", "list", timeout=10)
                break
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                if self._glusterd.poll() is not None:
                    raise Unavailable(f"glusterd exited at start-up (code {self._glusterd.returncode}): "
                                      f"{self._glusterd.stderr.read().decode(errors='replace').strip()[-300:]}") from e
                if time.monotonic() > deadline:
                    raise Unavailable(f"glusterd did not answer within 60 s: {e}") from e
                time.sleep(0.1)
        self.volume = f"gpujail{os.getpid()}x{int(time.time() * 1000) % 100000}"
        host = socket.gethostname()   # glusterd refuses localhost and loopback addresses for bricks
        self._gluster("volume", "create", self.volume, f"{host}:{g / 'brick'}", "force")
        self._gluster("volume", "start", self.volume)
        self._mount_cmd = ["mount", "-t", "glusterfs", "-o", f"log-file={g}/log/client.log,log-level=WARNING",
                           f"{host}:/{self.volume}", str(self.jail)]

    def _stop_gluster(self) -> None:
        if self._harness_mounted:
            subprocess.run(["umount", "-l", str(self.jail)], capture_output=True, timeout=CALL_TIMEOUT)
            self._harness_mounted = False
        if self.volume and self._glusterd and self._glusterd.poll() is None:
            for args in (("volume", "stop", self.volume, "force"), ("volume", "delete", self.volume)):
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self._gluster(*args)
        for pid in self.brick_pids():   # stop failed: the brick is ours, by its pid file
            _kill(pid)
        if self._glusterd:
            if self._glusterd.poll() is None:
                self._glusterd.terminate()
                try:
                    self._glusterd.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._glusterd.kill()
                    self._glusterd.wait()
            self._glusterd.stderr.close()
        if GLUSTER_RUN.is_dir():   # brick sockets glusterd does not remove when it stops
            for name in set(os.listdir(GLUSTER_RUN)) - self._run_before:
                path = GLUSTER_RUN / name
                with contextlib.suppress(OSError):
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        if self._run_short:
            shutil.rmtree(self._run_short, ignore_errors=True)

    def _seed_through_harness_client(self) -> None:
        """Move the image in `jail` aside, mount the harness's client at `jail`, copy the image in."""
        seed = self.jail.with_name(self.jail.name + ".seed")
        self.jail.rename(seed)
        self.jail.mkdir()
        _run(self._mount_cmd, "mounting the harness's gluster client")
        self._harness_mounted = True
        _run(["cp", "-a", f"{seed}/.", str(self.jail)], "copying the jail image into the volume", timeout=300)
        shutil.rmtree(seed)


@contextlib.contextmanager
def _own_mount_ns() -> Iterator[None]:
    """This thread, and the threads and processes it starts from now on, in a private copy of its
    mount namespace: the harness's client is mounted there, never in the host's namespace, where
    every namespace made meanwhile (other runs' nodes) would copy it, and see it fail in a brick
    outage. (unshare(CLONE_NEWNS) gives the calling thread alone its own namespace.) On exit this
    thread goes back, unless threads it started still share its file system context: then it stays
    in the copy, whose own mounts are gone by then."""
    back = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY)
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)   # setns(2) moves the thread to the root: back here after
    try:
        if _libc.unshare(CLONE_NEWNS) != 0:
            e = ctypes.get_errno()
            raise Unavailable(f"cannot make a private mount namespace for the harness's client: {os.strerror(e)}")
        _sys.mount(None, "/", None, MS_REC | MS_PRIVATE)
        yield
    finally:
        _libc.setns(back, CLONE_NEWNS)
        os.fchdir(cwd)
        os.close(cwd)
        os.close(back)


@contextlib.contextmanager
def _machine_lock(kind: str, timeout: float) -> Iterator[None]:
    """One gluster run per machine (glusterd's port 24007 is fixed): a flock on the glusterd binary,
    which every run opens read-only, so no lock file is left anywhere."""
    if kind != "gluster":
        yield
        return
    fd = os.open(_which("glusterd"), os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Unavailable(f"another gluster run held this machine's glusterd for {timeout:g} s") from None
                time.sleep(0.2)
        if subprocess.run(["pgrep", "-x", "glusterd"], capture_output=True).returncode == 0:
            raise Unavailable("a glusterd not started by gpujail already runs on this machine (port 24007)")
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def provide(kind: str, run_dir: str | os.PathLike, jail: str | os.PathLike | None = None,
            nodes: list[str] | tuple[str, ...] = (), lock_timeout: float = 600.0,
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
    with _machine_lock(kind, lock_timeout), (_own_mount_ns() if kind == "gluster" else contextlib.nullcontext()):
        try:
            if kind == "gluster":
                fs._start_gluster()
                fs._seed_through_harness_client()
                if cache_timeout is not None:   # the nodes' clients only; the harness's keeps the default
                    fs._mount_cmd[4] += f",entry-timeout={cache_timeout:g},attribute-timeout={cache_timeout:g}"
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


# -- a fleet on a jail file system -------------------------------------------------------------------

@dataclass(frozen=True)
class NetFault:
    """A fault only a network file system has (SPEC section 7), as scenario data:
    `{ fault = "kill-brick" | "latency" | "lose-client", after_ready = N, delay = SECONDS, hold = SECONDS,
    worker = "w1", ms = 40 }`: `delay` seconds after N workers have reported ready (0: after the
    first start began), the fault starts; after `hold`
    seconds it clears (the brick restarts, the latency goes; a lost client is never given back to
    its node: the node's replacement gets a fresh one)."""
    fault: str
    after_ready: int = 1
    delay: float = 0.0     # seconds after the trigger
    hold: float = 1.0
    worker: str = ""
    ms: float = 0.0


NET_FAULTS = ("kill-brick", "latency", "lose-client")
# The suites' nodes revalidate at every lookup: a file another node removed is then detached at the
# victim's very next probe (K-2 still: at its lookup, not at the unlink). With GlusterFS's default
# 1 s cache, a loss in a run's last second would show only after the run, when nobody looks.
CHAOS_CACHE_TIMEOUT = 0.0


def fleet_class(base, kind: str, faults: tuple[NetFault, ...] | list[NetFault] = ()):
    """`base` (kernel.Fleet) whose fleets see the jail on `kind`: `recording(jail, run_dir, seed)`
    provides the file system around the fleet's life (see the module's doc), and `faults` are
    injected from a thread while it runs, each recorded as `jailfs.fault` and `jailfs.clear`."""
    if kind == "local" and not faults:
        return base

    class OnJailFS(base):
        jail_fs = kind

        def __enter__(self):
            self._fs_cm = provide(kind, self.env_run_dir(), self.jail, cache_timeout=CHAOS_CACHE_TIMEOUT)
            self.jailfs = self._fs_cm.__enter__()
            self._stop, self._faulty = threading.Event(), threading.Event()
            self._nemesis = [threading.Thread(target=self._inject, args=(f,), daemon=True) for f in faults]
            for t in self._nemesis:
                t.start()
            return super().__enter__()

        def start(self, node_id: str, *args, **kw):
            """A node is started through its client; while a fault keeps the jail unreachable the
            node cannot be set up (its /dev and /run are bound into the jail), and it is set up
            again once the fault clears, as an orchestrator retries a container it could not create."""
            while True:
                try:
                    return super().start(node_id, *args, **kw)
                except RuntimeError as e:
                    if "Transport endpoint is not connected" not in str(e) or not self._faulty.is_set():
                        raise
                    self.nodes = [n for n in self.nodes if n.alive]
                    while self._faulty.is_set() and not self._stop.is_set():
                        self._stop.wait(0.05)
                    self._stop.wait(0.5)   # the clients reconnect (GlusterFS: about a second)

        def env_run_dir(self) -> Path:
            from gpujail.world import history
            hist = self.env.get(history.ENV)
            return Path(hist).parent if hist else self.jail.parent

        def _inject(self, f: NetFault) -> None:
            from gpujail.world import history
            hist = self.env.get(history.ENV)
            log = lambda k, **kw: history.append(hist, k, node="host", **kw)   # noqa: E731
            kind, n = ("worker.ready", f.after_ready) if f.after_ready else ("worker.start", 1)
            while not self._stop.is_set() and sum(1 for e in history.load(hist or "") if e.get("kind") == kind) < n:
                self._stop.wait(0.02)
            if self._stop.wait(f.delay) or self._stop.is_set():
                return
            fs = self.jailfs
            self._faulty.set()
            began = time.monotonic()   # the fault acts from here on, before its event is written
            if f.fault == "kill-brick":
                pids = fs.kill_brick()
            elif f.fault == "latency":
                fs.set_latency(f.ms)
                pids = []
            else:
                pids = fs.lose_client(f.worker)
            log("jailfs.fault", fault=f.fault, worker=f.worker, pids=pids, began=began)
            self._stop.wait(f.hold)
            if f.fault == "kill-brick":
                fs.restart_brick()
            elif f.fault == "latency":
                fs.set_latency(0)
            log("jailfs.clear", fault=f.fault, worker=f.worker)
            self._faulty.clear()

        def leftovers(self) -> list[str]:
            return super().leftovers() + self._fs_left

        def __exit__(self, *exc):
            self._stop.set()
            try:
                super().__exit__(*exc)
            finally:
                for t in self._nemesis:
                    t.join(timeout=CALL_TIMEOUT)
                fs = self.jailfs
                self._fs_cm.__exit__(*exc)
                self._fs_left = fs.leftovers()

        _fs_left: list[str] = []

    OnJailFS.__name__ = f"{base.__name__}On{kind.title().replace('-', '')}"
    return OnJailFS
