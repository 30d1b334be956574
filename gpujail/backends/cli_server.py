"""The fake CLI forked for its client: the node's CLI server, and an implementation's own CLI runs (warm path 3).

How this works
--------------
A worker's `nvidia-container-cli` (fixtures/bin) is a bash client. In a node it connects to the
node's `CliServer` (127.0.0.1, the port in GPUJAIL_CLI_SERVER), served by the node's PID 1 in the
loop where it waits for the start (node_starts.py `op_run`), sends its pid, its parent's pid and
its argument count, and waits. The server checks that the peer is that process (its fd 3 is the
other end of the connection), takes its argv, environment, cwd, umask and mount namespace from
/proc and its stdin, stdout and stderr with pidfd_getfd(2), and forks the fake for it with the
client's parent as the CLI's parent (SPEC CLI-5). The client exits with the fake's status or dies
of its signal, and a client killed first takes its fake with it. A client the server cannot stand
in for exactly (another user or PID namespace, other credentials or root, no pidfd_getfd) is told
to `exec` (`Decline`): it runs the fake in a new interpreter (fixtures/standalone/). So does a
client outside a node, and every CLI run under strace (fixtures/wrap/), whose faults must land in
the process strace started.

A bundled implementation forked warm (warm.py, 2) needs no client: its `sysops.run` of the bundled
CLI forks the fake from itself (`run_cli_forked`), which then has the implementation as its real
parent, and its environment, cwd, umask and namespaces; stdin /dev/null, stdout and stderr pipes
and no other descriptor, as subprocess.run gives an exec'd CLI. A vendor's script, the shell
example among them, goes through the client.
"""
from __future__ import annotations

import contextlib
import ctypes
import locale
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time

from gpujail.backends.forked_child import become, close_fds, stdio_to_pipes
from gpujail.fixtures import BIN
from gpujail.world import history

CLI_SERVER_ENV = "GPUJAIL_CLI_SERVER"
_libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_getfd = 438


class Decline(Exception):
    """This client must run the fake itself (its reason is the message)."""


class CliServer:
    """The node's fake-CLI server, served by the node's PID 1 in the loop where it waits for a start
    (node_starts.py `op_run`): `begin(fds)` as a start begins (the loop's own descriptors, which no fake
    may keep), `fds()` to watch, `handle(fd)` when one is ready, `end()` once the start's processes
    are killed and reaped. The listening socket is the node's, made once."""

    def __init__(self):
        from gpujail.fixtures import fake_cli  # imported once here, in every CLI child already
        self.fake_cli = fake_cli
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.address = "%s:%d" % self.sock.getsockname()
        self._me = _identity("/proc/self")
        self.runs: dict[int, list] = {}   # client pidfd and fake pidfd -> [conn, client pidfd, fake pidfd, fake pid]
        self.loop_fds: tuple = ()

    def begin(self, loop_fds) -> None:
        self.loop_fds = tuple(loop_fds)

    def fds(self) -> list:
        return [self.sock, *self.runs]

    def handle(self, fd) -> None:
        if fd is self.sock:
            conn, _ = self.sock.accept()
            run = self._start(conn)
            if run:
                self.runs[run[1]] = self.runs[run[2]] = run
            return
        run = self.runs.get(fd)
        if run is None:
            return
        conn, client, fake, pid = run
        if fd == client:   # the client is gone before its fake: the fake goes too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            del self.runs[client]
            close_fds(client)
            return
        _, status = os.waitpid(pid, 0)
        reply = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        with contextlib.suppress(OSError):
            conn.sendall(reply.encode() + b"\n")
        self._forget(run)

    def end(self) -> None:
        """After the start: what is left of its runs (their processes are dead and reaped)."""
        for run in list(self.runs.values()):
            self._forget(run)
        self.loop_fds = ()

    def _forget(self, run: list) -> None:
        conn, client, fake, _ = run
        conn.close()
        for fd in (client, fake):
            if self.runs.pop(fd, None) is not None:
                close_fds(fd)

    def _start(self, conn: socket.socket) -> list | None:
        """Read a client's request and fork its fake; None when it was declined (told `exec`)."""
        pidfd = None
        taken: list[int | None] = []
        try:
            conn.settimeout(5)
            line = b""
            while not line.endswith(b"\n") and len(line) < 100:
                chunk = conn.recv(100)
                if not chunk:
                    raise Decline("no request")
                line += chunk
            conn.settimeout(None)
            pid, ppid, nargs = (int(x) for x in line.split())
            pidfd = os.pidfd_open(pid)
            proc = f"/proc/{_host_pid(pidfd)}"
            # its fds 0-2 as it saved them in 5-7 (bash swaps 0-2 while a builtin's redirection lasts)
            taken = [_getfd(pidfd, fd) for fd in (5, 6, 7, 3)]
            if taken[3] is None or _peer_of(taken[3]) != conn.getpeername():
                raise Decline("the peer is not that process")
            me, it = self._me, _identity(proc)
            differs = [k for k in me if k not in TAKEN and me[k] != it[k]]
            if differs:
                raise Decline(f"its {differs[0]} differs from the server's")
            with open(f"{proc}/cmdline", "rb") as f:
                cmdline = [a.decode(errors="surrogateescape") for a in f.read().split(b"\0")[:-1]]
            with open(f"{proc}/environ", "rb") as f:
                env = dict(e.decode(errors="surrogateescape").split("=", 1) for e in f.read().split(b"\0") if b"=" in e)
            if len(cmdline) < nargs + 1:
                raise Decline("its command line is not its arguments")
            args = cmdline[len(cmdline) - nargs:]
            cwd = os.open(f"{proc}/cwd", os.O_PATH | os.O_DIRECTORY)
            mnt = os.open(f"{proc}/ns/mnt", os.O_RDONLY) if it["mnt"] != me["mnt"] else None
        except (Decline, OSError, ValueError) as e:
            with contextlib.suppress(OSError):
                conn.sendall(f"exec {str(e).replace(chr(10), ' ')}\n".encode())
            conn.close()
            close_fds(pidfd, *taken)
            return None
        fake = os.fork()
        if fake == 0:
            try:
                self.sock.close()
                conn.close()
                close_fds(*self.loop_fds, *self.runs)   # the node's loop: not the fake's to hold
                for other in self.runs.values():
                    other[0].close()
                for target, fd in enumerate(taken[:3]):   # first: a failure below is told to the client
                    if fd is None:
                        close_fds(target)
                    else:
                        os.dup2(fd, target)
                if mnt is not None:
                    _setns(mnt)
                os.fchdir(cwd)   # fails on a jail whose network filesystem is down (ENOTCONN)
                os.umask(it["umask"])
                close_fds(pidfd, cwd, mnt, *taken)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            except BaseException as e:
                # As a CLI that could not start there: exit 1 with one line on the client's stderr.
                # Never go on to run the fake: until the loop above, fds 0-2 are the server's own,
                # the node's protocol channel, which the fake's output would corrupt.
                with contextlib.suppress(BaseException):
                    os.write(2, f"nvidia-container-cli: cannot start in the caller's place: {e}\n".encode())
                os._exit(1)
            cli = self.fake_cli
            become([cmdline[1] if len(cmdline) > 1 else cmdline[0], *args], env,
                   lambda: sys.exit(cli.main(args, sysops=cli.CliSys(ppid=ppid))))
        close_fds(cwd, mnt, *taken)
        return [conn, pidfd, os.pidfd_open(fake), fake]


def run_cli_forked(argv: list[str], timeout: float | None) -> tuple[int, str, str] | None:
    """`sysops.run` in an implementation forked warm (2): when `argv[0]` is the bundled CLI's client
    on this process's PATH and a node serves this start, run the fake in a child of this process, as
    the server would fork it for the client (3), and return what subprocess.run(capture_output,
    text, stdin=DEVNULL) would (TimeoutExpired on `timeout`, the child killed); else None."""
    prog = shutil.which(argv[0])
    if not prog or not os.environ.get(CLI_SERVER_ENV) or os.path.realpath(prog) != _CLIENT:
        return None
    from gpujail.fixtures import fake_cli
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            stdio_to_pipes(out_w, err_w)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))   # as subprocess's close_fds: no lock of ours held
            history.reopen()
        finally:
            become([prog, *argv[1:]], dict(os.environ), lambda: sys.exit(fake_cli.main(argv[1:])))
    close_fds(out_w, err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    reading = [out_r, err_r]
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while reading:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            ready = select.select(reading, [], [], left)[0]
            if not ready:   # as subprocess.run: the child killed (and reaped), then TimeoutExpired
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(argv, timeout)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                chunks[fd].append(chunk)
                if not chunk:
                    reading.remove(fd)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    finally:
        close_fds(out_r, err_r)
    return code, _text(b"".join(chunks[out_r])), _text(b"".join(chunks[err_r]))


def _text(data: bytes) -> str:
    """As subprocess.run(text=True) decodes a stream: the locale's encoding, universal newlines."""
    encoding = "utf-8" if sys.flags.utf8_mode else locale.getencoding()
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


_CLIENT = os.path.realpath(BIN / "nvidia-container-cli")
TAKEN = ("umask", "mnt")   # what the fake's child takes from its client; the rest of _identity must be equal


def _identity(proc: str) -> dict:
    """What the server and a client must share for the fork to be that client: credentials,
    capabilities, user and PID namespace, root; and its umask and mount namespace, which the fake's
    child takes from the client."""
    fields = {}
    with open(f"{proc}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "Groups", "CapEff", "CapPrm", "Umask", "NoNewPrivs", "Seccomp"):
                fields[key] = value.split()
    root = os.stat(f"{proc}/root")
    ns = {kind: os.stat(f"{proc}/ns/{kind}").st_ino for kind in ("user", "pid", "mnt")}
    return {"credentials": (fields.get("Uid"), fields.get("Gid"), fields.get("Groups")),
            "capabilities": (fields.get("CapEff"), fields.get("CapPrm")),
            "confinement": (fields.get("NoNewPrivs"), fields.get("Seccomp")),
            "user namespace": ns["user"], "PID namespace": ns["pid"], "root": (root.st_dev, root.st_ino),
            "umask": int(fields.get("Umask", ["022"])[0], 8), "mnt": ns["mnt"]}


def _host_pid(pidfd: int) -> int:
    """The pid of a pidfd's process as this /proc names it (the server sits in the node's PID
    namespace; the procfs at /proc may be the host's)."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        for line in f:
            if line.startswith("Pid:"):
                pid = int(line.split()[1])
                if pid > 0:
                    return pid
    raise Decline("its process is gone")


def _getfd(pidfd: int, fd: int) -> int | None:
    """pidfd_getfd(2): a duplicate of another process's open file (the same open file description,
    offset and all), or None when it has no such fd."""
    got = _libc.syscall(SYS_pidfd_getfd, pidfd, fd, 0)
    if got < 0:
        e = ctypes.get_errno()
        if e == 9:   # EBADF: that fd is closed in the client
            return None
        raise OSError(e, f"pidfd_getfd: {os.strerror(e)}")
    return got


def _peer_of(fd: int):
    s = socket.socket(fileno=os.dup(fd))
    try:
        return s.getsockname()
    except OSError:
        return None
    finally:
        s.close()


def _setns(fd: int) -> None:
    if _libc.setns(fd, 0x00020000) != 0:   # CLONE_NEWNS
        e = ctypes.get_errno()
        raise OSError(e, f"setns: {os.strerror(e)}")
