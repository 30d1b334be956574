"""Warm starts: a worker start's processes forked from a process that has imported their code,
instead of new Python interpreters (issue 19: 16 workers on 2 cores at 50 starts/s).

How this works
--------------
A start on the kernel backend used to pay four interpreter start-ups with their imports (25-50 ms
of CPU each): its node, the implementation, and two fake CLI runs. Three warm paths remove them.
Each is a plain fork of a process that imported the code once, and the child then runs exactly
the code a new interpreter would have, with the same argv, environment, cwd, standard streams and
exit status (`become`: the one copy of "be that process"):

1. **Nodes.** `Factory` (harness side) keeps one factory per harness process, `python -m
   gpujail.backends.node --factory`, which has imported the node and everything a node runs and
   forks a node per request (`factory_main`). As root the child is born PID 1 of the node's PID
   namespace (node.py `fork_node`); unprivileged it makes the user namespace first and stays
   behind as the outer process that only waits for its PID 1. The node's pipes travel to it over a
   unix socket (SCM_RIGHTS), and a pidfd of the node travels back: the harness waits for and kills
   a node it did not fork itself. The PDEATHSIG chain stays whole: harness thread, factory, node.
2. **Bundled implementations.** `python -S -m gpujail.reference_impl ...` (reference, legacy,
   direct, the mutants) runs in a child forked from its node (`warm_module`, `fork_start`).
3. **The fake CLI.** A worker's `nvidia-container-cli` (fixtures/bin) is a bash client. In a node
   it connects to the node's `CliServer` (127.0.0.1, the port in GPUJAIL_CLI_SERVER), served by the
   node's PID 1 in the loop where it waits for the start (node.py `op_run`), sends its pid, its
   parent's pid and its argument count, and waits. The server checks that the peer is that process
   (its fd 3 is the other end of the connection), takes its argv, environment, cwd, umask and
   mount namespace from /proc and its stdin, stdout and stderr with pidfd_getfd(2), and forks the
   fake for it with the client's parent as the CLI's parent (SPEC CLI-5). The client exits with
   the fake's status or dies of its signal, and a client killed first takes its fake with it. A
   client the server cannot stand in for exactly (another user or PID namespace, other
   credentials or root, no pidfd_getfd) is told to `exec`: it runs the fake in a new interpreter
   (fixtures/standalone/). So does a client outside a node, and every CLI run under strace
   (fixtures/wrap/), whose faults must land in the process strace started.
   A bundled implementation forked warm (2) needs no client: its `sysops.run` of the bundled CLI
   forks the fake from itself (`run_cli_forked`), which then has the implementation as its real
   parent, and its environment, cwd, umask and namespaces; stdin /dev/null, stdout and stderr
   pipes and no other descriptor, as subprocess.run gives an exec'd CLI. A vendor's script, the
   shell example among them, goes through the client.

`GPUJAIL_WARM_STARTS=0` in the harness's environment turns all three off (the benchmarks compare).
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import locale
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from gpujail.fixtures import BIN
from gpujail.world import history, sysops

WARM_ENV = "GPUJAIL_WARM_STARTS"
CLI_SERVER_ENV = "GPUJAIL_CLI_SERVER"
_libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_getfd = 438
PR_SET_NAME = 15


def enabled(env=os.environ) -> bool:
    return env.get(WARM_ENV) != "0" and hasattr(os, "pidfd_open")


def become(argv: list[str], env: dict, main) -> None:
    """In a child just forked, with its fds 0-2 and cwd in place: be the process a new interpreter
    running `main` as `argv` with `env` would be (fresh standard streams, SystemExit's code, a
    traceback and 1 on an exception), flush, and _exit with the status. Never returns."""
    code = 1
    try:
        # Only what differs: clearing and refilling os.environ rewrites the C environment, whose
        # pages the child would copy (a third of a child's copy-on-write faults before its main)
        for key in [k for k in os.environ if k not in env]:
            del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        # An exec'd interpreter writes no bytecode under PYTHONDONTWRITEBYTECODE (a write outside the jail)
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        # Fresh streams, as a new interpreter has on pipes: stdout block-buffered, stderr by line.
        sys.stdin = _stream(0, "r")
        sys.stdout = _stream(1, "w")
        sys.stderr = _stream(2, "w", errors="backslashreplace", buffering=1)
        sys.argv = list(argv)
        # the name ps, pgrep and /proc/PID/comm show, as exec gives it: the program's base name
        _libc.prctl(PR_SET_NAME, os.path.basename(argv[0]).encode()[:15], 0, 0, 0)
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:   # as the interpreter does: the traceback on stderr, exit 1
            import traceback
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    except BaseException:   # the child's own set-up failed: say why where its stderr goes
        import traceback
        traceback.print_exc()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def _stream(fd: int, mode: str, **kw):
    try:
        os.fstat(fd)
    except OSError:
        return None   # a closed standard stream is None, as in a new interpreter
    return open(fd, mode, encoding="utf-8", closefd=False, **kw)


def _streams(out_w: int, err_w: int) -> None:
    """In a child just forked: stdin /dev/null, stdout and stderr the given pipes' write ends, as
    Popen(stdin=DEVNULL, stdout=PIPE, stderr=PIPE) gives them."""
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out_w, 1), (err_w, 2)):
        os.dup2(fd, target)
    os.close(null)


def _close(*fds) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


# -- 2. bundled implementations forked from their node ---------------------------------------------

# The modules `python -S -m MODULE` may run forked from the node rather than in a new interpreter:
# the bundled implementations (reference, legacy, direct, mutants), whose code this repository owns.
# Named, not imported: the backends sit below them in the layers and only run them as `-m` would.
WARM_MODULES = ("gpujail.reference_impl",)
_warmed: set[str] = set()


def warm_module(argv: list[str], env: dict, cwd: str) -> str | None:
    """The module of a start the node may fork warm, or None (exec it). Only this interpreter
    running a bundled module found in this node's own gpujail qualifies: then the forked child runs
    exactly the code the exec'd interpreter would have. Anything else, a vendor's command above all,
    is exec'd as given."""
    if not enabled():
        return None
    if len(argv) < 4 or argv[0] != sys.executable or argv[1:3] != ["-S", "-m"] or argv[3] not in WARM_MODULES:
        return None
    if any(k.startswith("PYTHON") and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED") for k in env):
        return None   # an interpreter setting: only a fresh interpreter honours it
    # Where `python -S -m` would find gpujail: the first of cwd and $PYTHONPATH holding it (no site)
    mine = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    for d in [cwd, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]:
        if os.path.isdir(os.path.join(d, "gpujail")):
            return argv[3] if os.path.realpath(d) == mine else None
    return None


def warmed_up(module: str) -> bool:
    """Import `module`'s __main__ and everything it imports into this process, once; False if that
    fails (then the start is exec'd, and fails there as it would have)."""
    import importlib
    if module not in _warmed:
        try:
            importlib.import_module(module + ".__main__")
        except Exception:
            return False
        sys.modules.pop(module + ".__main__")   # itself runs as __main__ in each child, as `-m` runs it
        _warmed.add(module)
    return True


class Forked:
    """What the node's op_run uses of a Popen, for a start forked from it: its pid, its output
    pipes, `wait(timeout)` (a pidfd: woken by the exit itself, not by polling)."""

    def __init__(self, pid: int, stdout, stderr):
        self.pid, self.stdout, self.stderr, self.returncode = pid, stdout, stderr, None
        self.pidfd = os.pidfd_open(pid)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
            os.close(self.pidfd)
        return self.returncode


def fork_start(module: str, argv: list[str], env: dict, cwd: str) -> Forked:
    """Fork a child that does what `python -S -m MODULE ARGS` started by Popen(start_new_session,
    stdin=DEVNULL, stdout/stderr=PIPE, env, cwd) would: its own session, cwd, environment, argv,
    standard streams, the module run as __main__, its exit status. OSError (a bad cwd) as Popen
    raises it, before the child exists."""
    import runpy
    os.close(os.open(cwd, os.O_RDONLY | os.O_DIRECTORY))   # a bad cwd fails here, as Popen's chdir would
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    gc.freeze()   # the node's objects stay out of the child's collections (no copy-on-write for them)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.chdir(cwd)
            _streams(out_w, err_w)
            _close(out_r, out_w, err_r, err_w)
        finally:
            sysops.run_without_exec = run_cli_forked   # (3): its own runs of the bundled CLI
            become([argv[0], *argv[4:]], env, lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    _close(out_w, err_w)
    return Forked(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))


# -- 3. the fake CLI, forked for its client --------------------------------------------------------

class Decline(Exception):
    """This client must run the fake itself (its reason is the message)."""


class CliServer:
    """The node's fake-CLI server, served by the node's PID 1 in the loop where it waits for a start
    (node.py `op_run`): `begin(fds)` as a start begins (the loop's own descriptors, which no fake
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
            _close(client)
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
                _close(fd)

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
            _close(pidfd, *taken)
            return None
        fake = os.fork()
        if fake == 0:
            try:
                self.sock.close()
                conn.close()
                _close(*self.loop_fds, *self.runs)   # the node's loop: not the fake's to hold
                for other in self.runs.values():
                    other[0].close()
                for target, fd in enumerate(taken[:3]):   # first: a failure below is told to the client
                    if fd is None:
                        _close(target)
                    else:
                        os.dup2(fd, target)
                if mnt is not None:
                    _setns(mnt)
                os.fchdir(cwd)   # fails on a jail whose network filesystem is down (ENOTCONN)
                os.umask(it["umask"])
                _close(pidfd, cwd, mnt, *taken)
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
        _close(cwd, mnt, *taken)
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
            _streams(out_w, err_w)
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))   # as subprocess's close_fds: no lock of ours held
            history.reopen()
        finally:
            become([prog, *argv[1:]], dict(os.environ), lambda: sys.exit(fake_cli.main(argv[1:])))
    _close(out_w, err_w)
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
        _close(out_r, err_r)
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


# -- 1. nodes forked from a factory ------------------------------------------------------------------

class NodeProcess:
    """What kernel.Node uses of a Popen, for a node the factory forked: its pid, its pipes,
    poll/wait/kill through a pidfd. The factory, not the harness, is its parent and reaps it: its
    exit code is not known here (`returncode` is -1 once it has exited)."""

    def __init__(self, pid: int, pidfd: int, stdin, stdout):
        self.pid, self._pidfd, self.stdin, self.stdout, self.returncode = pid, pidfd, stdin, stdout, None
        self._lock = threading.Lock()   # a chaos thread may kill a node while the start waits on it

    def poll(self):
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None):
        with self._lock:   # each waiter selects on a copy: another may close the pidfd meanwhile
            if self.returncode is not None:
                return self.returncode
            fd = os.dup(self._pidfd)
        try:
            ready = select.select([fd], [], [], timeout)[0]
        finally:
            os.close(fd)
        if not ready:
            if timeout == 0:
                return None
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        with self._lock:
            if self.returncode is None:
                self.returncode = -1
                os.close(self._pidfd)
        return self.returncode

    def kill(self) -> None:
        with self._lock:
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)


class Factory:
    """Harness side of the node factory: `spawn(cfg, env, cwd)` -> a NodeProcess whose stdin and
    stdout are text pipes, as Popen([..., "-m", "gpujail.backends.node", cfg]) gave."""

    def __init__(self, popen):
        """`popen(argv, pass_fds)`: starts the factory (the caller's long-lived thread, for PDEATHSIG)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = popen([sys.executable, "-m", "gpujail.backends.node", "--factory", str(theirs.fileno())],
                          (theirs.fileno(),))
        theirs.close()
        self.sock, self.lock = ours, threading.Lock()
        if socket.recv_fds(ours, 64, 1)[0] != b"ready":   # after its imports: the first node waits no longer
            self.proc.kill()
            self.proc.wait()
            raise OSError("the node factory exited before it was ready (its error is on the harness's stderr)")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, cfg: dict, env: dict, cwd: str) -> NodeProcess:
        (in_r, in_w), (out_r, out_w) = os.pipe2(os.O_CLOEXEC), os.pipe2(os.O_CLOEXEC)
        try:
            with self.lock:
                socket.send_fds(self.sock, [json.dumps({"cfg": cfg, "env": env, "cwd": cwd}).encode()], [in_r, out_w])
                msg, fds, _, _ = socket.recv_fds(self.sock, 65536, 1)
            reply = json.loads(msg) if msg else {"error": "the node factory exited"}
            if not fds:
                raise OSError(f"the node factory could not fork a node: {reply.get('error')}")
            os.set_inheritable(fds[0], False)
            return NodeProcess(reply["pid"], fds[0], os.fdopen(in_w, "w"), os.fdopen(out_r, "r"))
        except BaseException:
            _close(in_w, out_r)
            raise
        finally:
            _close(in_r, out_w)

    def close(self) -> None:
        self.sock.close()   # the factory sees EOF and exits; its nodes die with it (PDEATHSIG)
        self.proc.wait()


def factory_main(fd: int, prepare, fork, enter, run_node) -> None:
    """The factory process: `prepare()` once (imports, bytecode), then a node per request, forked,
    running `run_node()` as `python -m gpujail.backends.node CFG` would, until the harness closes
    the socket. `fork(cfg)` forks: as root, a child born PID 1 of the node's PID namespace.
    `enter(cfg)` runs first in the child: it enters the node's (other) namespaces; unprivileged,
    the child stays behind there as the namespaces' outer process, which only waits, and only its
    PID 1 goes on. It reaps the nodes as they end
    (their CPU time counts as this process's children's, as a Popen'd node's counted as the
    harness's); the harness waits on their pidfds."""
    sock = socket.socket(fileno=fd)
    prepare()
    gc.freeze()   # what the nodes inherit stays out of every collection: no copy-on-write of it for the GC's sake
    sock.send(b"ready")

    def reap(*_):
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
    signal.signal(signal.SIGCHLD, reap)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
        except ConnectionResetError:
            return
        if not msg:
            return
        req = json.loads(msg)
        # SIGCHLD held until the pidfd exists: a node that died at once is not reaped (and its pid
        # reused) before the pidfd names it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = fork(req["cfg"])
        except OSError as e:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            socket.send_fds(sock, [json.dumps({"error": str(e)}).encode()], [])
            continue
        if pid == 0:
            try:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
                os.dup2(fds[0], 0)
                os.dup2(fds[1], 1)
                _close(*fds)
                os.chdir(req["cwd"])
                enter(req["cfg"])
            finally:
                become([sys.argv[0], json.dumps(req["cfg"])], req["env"], run_node)
        _close(*fds)
        pidfd = os.pidfd_open(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        os.close(pidfd)
