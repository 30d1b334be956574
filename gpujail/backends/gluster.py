"""A jail on GlusterFS: glusterd, its volume and brick, and the faults only a network file system has.

How this works
--------------
`glusterd -N` is started as the harness's child with its working, run and log directories and its
CLI socket under `run_dir/gluster-XXXX/`, in a network namespace of its own (`_isolated`: only
`lo`, up, holding the addresses the host's name resolves to) with its own `/run/gluster` (a tmpfs in
its mount namespace, where its bricks put their sockets). Its bricks inherit both. So its TCP port,
the fixed 24007 that bricks and clients assume, and the bricks' ports are this run's alone: any
number of runs share a machine, beside a host's own glusterd, and nothing lands in the host's
`/run/gluster`. Every client mount enters that network namespace (`nsenter --net`) and nothing else
of it: the client stays in the mount namespace it mounts in. The CLI reaches glusterd through its
unix socket, a path, which any network namespace reaches. A volume on a brick under
`run_dir/gluster-XXXX/brick` is created (`gluster --mode=script volume create NAME HOST:BRICK force`)
and started; the image already in the jail is moved aside and copied in through the harness's
client, mounted at the jail in a private mount namespace of the calling thread (`own_mount_ns`: the
host's namespace never holds it). On the way down the harness's client is unmounted, the volume
stopped and deleted, and glusterd stopped by pid; its namespaces go with its last brick.

glusterd and the `gluster` CLI run in mount namespaces of their own (glusterd's bricks inherit its)
in which the geo-replication helper, gsyncd, cannot be executed (`_isolated`): they then skip
geo-replication, as on a host without that package. No jail uses geo-replication, and otherwise
gsyncd, a Python program, runs about 30 times in one volume's life (glusterd configures it at
start, the CLI asks its version at each call): about 2.5 s of CPU a volume, about 85 s of a CI run
(1,040 Python starts in CI 70).

`GlusterVolume` is that half of jailfs.JailFS (a mixin: the fields it uses are JailFS's), with the
faults of SPEC section 7 a scenario injects: `kill_brick` (every client gets ENOTCONN/EIO),
`restart_brick`, `set_latency` (GlusterFS's delay-gen translator).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from gpujail.backends.fs_processes import CALL_TIMEOUT, Unavailable, alive, kill, run
from gpujail.world.sysops import MS_PRIVATE, MS_REC, RealSys

GLUSTER_RUN = "/run/gluster"   # where glusterd puts brick sockets whatever its run-directory
# where distributions install gsyncd (GSYNCD_PREFIX): Debian and Ubuntu, Fedora and RHEL, others
GSYNCD = ("/usr/lib/*/glusterfs/gsyncd", "/usr/libexec/glusterfs/gsyncd", "/usr/lib/glusterfs/gsyncd")
CLONE_NEWNS = 0x00020000
_libc = ctypes.CDLL(None, use_errno=True)
_sys = RealSys()


class GlusterVolume:
    """glusterd and the jail's volume, for jailfs.JailFS (`kind == "gluster"`)."""

    # -- faults only a network file system has (SPEC section 7) ---------------------------------------

    def _gluster(self, *args: str, timeout: float = CALL_TIMEOUT) -> str:
        if getattr(self, "kind", "gluster") != "gluster":   # no volume, no daemon: its CLI would log into the cwd
            raise RuntimeError(f"gluster {' '.join(args[:2])}: the jail is on {self.kind}, not a GlusterFS volume")
        return run(_isolated(self.state, ["gluster", "--mode=script", f"--glusterd-sock={self._gluster_sock}",
                                                f"--log-file={self.state}/log/cli.log", *args]), "gluster", timeout)

    def brick_pids(self) -> list[int]:
        pids = []
        for f in (self.state / "run/vols" / self.volume).glob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(f.read_text().strip())
                if alive(pid):
                    pids.append(pid)
        return pids

    def kill_brick(self) -> list[int]:
        """SIGKILL the brick process: every client gets ENOTCONN/EIO until `restart_brick`."""
        pids = self.brick_pids()
        for pid in pids:
            kill(pid)
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
        host = socket.gethostname()   # glusterd refuses localhost and loopback addresses for bricks
        self._glusterd = subprocess.Popen(_isolated(g, ["glusterd", "-N", "-f", str(g / "glusterd.vol"),
                                           "-p", str(self._run_short / "glusterd.pid"),
                                           "-l", str(g / "log/glusterd.log"), "--log-level", "WARNING"],
                                                    _own_addresses(host)),
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
        self._gluster("volume", "create", self.volume, f"{host}:{g / 'brick'}", "force")
        self._gluster("volume", "start", self.volume)
        # (glusterd's network namespace by its pid's path: glusterd outlives every client mount)
        self._mount_cmd = ["nsenter", f"--net=/proc/{self._glusterd.pid}/ns/net",
                           "mount", "-t", "glusterfs", "-o", f"log-file={g}/log/client.log,log-level=WARNING",
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
            kill(pid)
        if self._glusterd:
            if self._glusterd.poll() is None:
                self._glusterd.terminate()
                try:
                    self._glusterd.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._glusterd.kill()
                    self._glusterd.wait()
            self._glusterd.stderr.close()
        if self._run_short:
            shutil.rmtree(self._run_short, ignore_errors=True)

    def _seed_through_harness_client(self) -> None:
        """Move the image in `jail` aside, mount the harness's client at `jail`, copy the image in."""
        seed = self.jail.with_name(self.jail.name + ".seed")
        self.jail.rename(seed)
        self.jail.mkdir()
        run(self._mount_cmd, "mounting the harness's gluster client")
        self._harness_mounted = True
        run(["cp", "-a", f"{seed}/.", str(self.jail)], "copying the jail image into the volume", timeout=300)
        shutil.rmtree(seed)


@contextlib.contextmanager
def own_mount_ns() -> Iterator[None]:
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


def _isolated(state: Path, argv: list[str], addresses: list[str] | None = None) -> list[str]:
    """`argv` in a private mount namespace where gsyncd is a script whose interpreter does not exist:
    an exec of it fails with ENOENT, as where gsyncd is not installed, and glusterd and the CLI skip
    geo-replication (ENOENT, not another failure: that is the case glusterd's check reads as "module
    not installed"). Where no gsyncd is installed, or the bind fails, that part is skipped.
    With `addresses` (glusterd's): also a network namespace of its own, `lo` up and holding them,
    and a tmpfs at /run/gluster. The same process (no fork): a Popen's pid is glusterd's. Nothing is
    mounted in the host's namespace; both namespaces go once glusterd and its bricks have exited."""
    script, args = "", []
    gsyncd = _gsyncd()
    if gsyncd is not None:
        stub = state / "gsyncd-not-installed"
        if not stub.exists():
            stub.write_text("#!/nonexistent/gsyncd-not-installed\n")
            stub.chmod(0o755)
        script += 'mount --bind "$1" "$2"; shift 2; '
        args += [str(stub), gsyncd]
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if addresses is not None:
        unshare.insert(1, "--net")
        script += ('ip link set lo up && for a in $1; do ip addr add "$a" dev lo || exit; done && shift && '
                   f'mkdir -p {GLUSTER_RUN} && mount -t tmpfs -o mode=0755 gpujail-gluster-run {GLUSTER_RUN} || exit; ')
        args.append(" ".join(addresses))
    if not script:
        return argv
    return [*unshare, "sh", "-c", script + 'exec "$@"', "sh", *args, *argv]


def _own_addresses(host: str) -> list[str]:
    """The addresses `host` resolves to, but loopback's, which `lo` has already: glusterd makes a
    brick only on an address of its own, and every client reaches the brick by that name."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise Unavailable(f"this host's name {host!r} does not resolve (glusterd names its brick by it): {e}") from e
    return sorted({i[4][0] for i in infos} - {"127.0.0.1", "::1"})


@functools.cache
def _gsyncd() -> str | None:
    """Where gsyncd is installed, if it is (looked up once: every CLI call needs it)."""
    return next((p for pattern in GSYNCD for p in sorted(glob.glob(pattern))), None)
