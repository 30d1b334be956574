"""A node's `run` request: one bounded start of an implementation, in the node (node.py, step 3).

How this works
--------------
`op_run(req)` runs `req["argv"]` with the contract's environment and the jail as working
directory, and answers its exit code, its output, its duration and what it changed outside the jail:

* A bundled implementation (`python -S -m gpujail.reference_impl ...`) is forked from this node,
  which imported it already (warm.py, warm path 2); anything else, a vendor's command above all, is exec'd
  as given, in a session of its own.
* While it runs, this process reads its output as it comes (`_Tail`: a writer never blocks on a
  full pipe, and only the last OUTPUT_CAP bytes of each stream are kept, so a chatty script cannot
  grow the harness) and serves its CLI runs, forking the fake `nvidia-container-cli` for each bash
  client (cli_server.py: `cli_server`, set by node.py's main), all in one loop (`_wait`).
* At its deadline, or when it exits, every process it started is killed (`_end_strays`: as PID 1
  of the node's PID namespace, kill(-1) reaches exactly the node's processes), so nothing a start
  runs outlives it.
* What it changed outside the jail: the host's copy-on-write cover (node_view.host_view) and, for
  a start that reports ready, what it deleted or changed of the node's own `/dev` and `/run`.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time

from gpujail.backends import cow, node_view, warm
from gpujail.backends.cli_server import CLI_SERVER_ENV, CliServer
from gpujail.world import history

NODE_LOCAL = ("/dev", "/run")   # the node's own tmpfs trees, compared before and after each start
cli_server: CliServer | None = None   # set by node.py's main when warm starts are on (cli_server.py)
OUTPUT_CAP = 256 * 1024   # bytes kept of each output stream (the tail): a chatty script cannot grow the harness


class _Tail:
    """One output pipe of a start, read as the data comes by op_run's loop (so a writer never blocks
    on a full pipe), keeping only the last OUTPUT_CAP bytes and counting what it dropped."""

    def __init__(self, pipe):
        self.pipe, self.data, self.dropped, self.open = pipe, bytearray(), 0, True
        os.set_blocking(pipe.fileno(), False)

    def fileno(self) -> int:
        return self.pipe.fileno()

    def read(self) -> None:
        """What the pipe holds now (closed at end of file)."""
        while self.open:
            try:
                chunk = os.read(self.pipe.fileno(), 65536)
            except BlockingIOError:
                return
            self._keep(chunk)

    def _keep(self, chunk: bytes) -> None:
        if not chunk:
            self.open = False
            return
        self.data += chunk
        if len(self.data) > OUTPUT_CAP:
            self.dropped += len(self.data) - OUTPUT_CAP
            del self.data[:len(self.data) - OUTPUT_CAP]

    def text(self) -> str:
        """The rest, to the end of file (every writer is dead by now: _end_strays), and the tail."""
        os.set_blocking(self.pipe.fileno(), True)
        while self.open:
            self._keep(os.read(self.pipe.fileno(), 65536))
        self.pipe.close()
        head = f"[gpujail: {self.dropped} earlier bytes of this output dropped]\n" if self.dropped else ""
        return head + self.data.decode(errors="replace")


def _wait(p, tails: list[_Tail], timeout: float | None, serving: CliServer | None) -> int | str:
    """Until the start `p` exits (its exit code) or reaches its deadline ("timeout"), reading its
    output and serving its CLI runs meanwhile: all in this one thread, which forks the fakes."""
    pidfd = p.pidfd if isinstance(p, warm.Forked) else os.pidfd_open(p.pid)
    deadline = None if timeout is None else time.monotonic() + timeout
    if serving:
        serving.begin([pidfd, *(t.fileno() for t in tails)])
    try:
        while True:
            watched = [pidfd, *(t for t in tails if t.open), *(serving.fds() if serving else [])]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = select.select(watched, [], [], left)[0]
            if not ready and deadline is not None and time.monotonic() >= deadline:
                return "timeout"
            for r in ready:
                if isinstance(r, _Tail):
                    r.read()
                elif r != pidfd:
                    serving.handle(r)
            if pidfd in ready:
                return p.wait()
    finally:
        if not isinstance(p, warm.Forked):
            os.close(pidfd)


def _end_strays(p: subprocess.Popen) -> None:
    """Nothing a start runs may outlive it: a daemon it `setsid`'d would hold its output pipes open
    (and the node) forever. As PID 1 of the node's PID namespace, kill(-1) reaches exactly the
    node's processes, this agent excepted; then reap them (orphans are reparented to PID 1)."""
    if os.getpid() != 1:   # not in a node of our own (a self-test calling op_run): the start's group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    p.wait()
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def op_run(req: dict) -> dict:
    env, timeout = req["env"], req.get("timeout")
    start = time.monotonic()
    history.record("impl.start", argv=req["argv"])
    local = cow.snapshot(*NODE_LOCAL)
    serving = cli_server if cli_server and os.getpid() == 1 else None   # (cli_server.py)
    if serving:
        env = {**env, CLI_SERVER_ENV: serving.address}
    module = warm.warm_module(req["argv"], env, req["cwd"])
    module = module if module and warm.warmed_up(module) else None
    try:
        if module:
            p = warm.fork_start(module, req["argv"], env, req["cwd"])
        else:
            p = subprocess.Popen(req["argv"], cwd=req["cwd"], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        history.record("impl.exit", code=127, error=str(e))
        return {"code": 127, "stdout": "", "stderr": f"{req['argv'][0]}: {e.strerror}\n", "duration": 0.0}
    out, err = _Tail(p.stdout), _Tail(p.stderr)
    code = _wait(p, [out, err], timeout, serving)
    _end_strays(p)
    if serving:
        serving.end()
    duration = time.monotonic() - start
    stdout, stderr = out.text(), err.text()
    if code == "timeout":
        stderr += f"timeout after {timeout:g} s: the start and everything it started were killed\n"
    # The node-local /dev and /run are the worker's own (a container's): what a start adds there is
    # its scratch space, but deleting or changing what the node had (its device nodes, the
    # persistenced socket) counts, for a start that reports ready. A failed start's node is replaced
    # (a restarted container gets fresh ones), and a failing CLI's own cleanup deletes the device
    # nodes and sockets it mounted over (CLI-6), which is not the start's doing.
    node_local = [c for c in cow.compare(local, cow.snapshot(*NODE_LOCAL)) if c["change"] != "created"]
    outside = (node_view.host_view.changes() if node_view.host_view else []) + (node_local if code == 0 else [])
    if outside:
        history.record("impl.outside", changes=outside)
    history.record("impl.exit", code=code, duration=duration, stderr=stderr[-2000:])
    return {"code": code, "stdout": stdout, "stderr": stderr, "duration": duration, "outside": outside}
