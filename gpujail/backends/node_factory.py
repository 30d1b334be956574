"""Nodes forked from a factory instead of started as new interpreters (warm path 1).

How this works
--------------
`Factory` (harness side) keeps one factory per harness process, `python -m gpujail.backends.node
--factory`, which has imported the node and everything a node runs (node.py `prepare`) and forks a
node per request (`factory_main`). As root the child is born PID 1 of the node's PID namespace
(namespaces.py `fork_node`); unprivileged it makes the user namespace first and stays behind as
the outer process that only waits for its PID 1. The node's pipes travel to it over a unix socket
(SCM_RIGHTS), and a pidfd of the node travels back: the harness waits for and kills a node it did
not fork itself (`NodeProcess`, what kernel.Node uses of a Popen). The PDEATHSIG chain stays whole:
harness thread, factory, node. The child then runs the node's main as `python -m
gpujail.backends.node CFG` would (forked_child.py `become`).
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

from gpujail.backends.forked_child import become, close_fds


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
            close_fds(in_w, out_r)
            raise
        finally:
            close_fds(in_r, out_w)

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
                close_fds(*fds)
                os.chdir(req["cwd"])
                enter(req["cfg"])
            finally:
                become([sys.argv[0], json.dumps(req["cfg"])], req["env"], run_node)
        close_fds(*fds)
        pidfd = os.pidfd_open(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        os.close(pidfd)
