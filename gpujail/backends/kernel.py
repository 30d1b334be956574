"""Kernel backend, harness side: start worker nodes, run implementations in them, probe them.

How this works
--------------
A `Node` is a `python -m gpujail.backends.node` process (see that module) holding its own mount namespace
with the host's driver files of one driver version at their real host paths, node-local `/dev` and
`/run`, and the shared jail. The harness talks to it over a pipe, one JSON line per request.
`Fleet` starts and stops many nodes together and is a context manager: leaving it (normally, on an
exception, on a timeout or on Ctrl-C) kills every node, and with them their namespaces, mounts and
processes (SPEC INV-6).

`precondition()` says why this host cannot run the kernel backend (no root and no unprivileged user
namespaces), so tests skip with that reason instead of passing silently.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpujail import ROOT
from gpujail.backends import node_factory, warm
from gpujail.backends.base import BaseFleet, BaseNode, RunResult, pythonpath  # noqa: F401 (RunResult: kernel's, as before)
from gpujail.fixtures import cdi_spec, drivers

_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpujail-node-spawner")
_FACTORY: list[node_factory.Factory] = []
_FACTORY_LOCK = threading.Lock()


def start_factory() -> None:
    """Start this process's node factory now rather than at the first node (a node agent does, so
    that its first start is as warm as any)."""
    if warm.enabled():
        _factory()


def _factory() -> node_factory.Factory:
    """This process's node factory (node_factory.py, warm path 1), started on first use and again if it died; from
    the spawner thread, as the nodes were, so that it dies with this process."""
    with _FACTORY_LOCK:
        if not _FACTORY or not _FACTORY[0].alive:
            def popen(argv, fds):
                return _SPAWNER.submit(subprocess.Popen, argv, cwd=ROOT, pass_fds=fds, stdin=subprocess.DEVNULL,
                                       env=_node_env(), start_new_session=True).result()
            _FACTORY[:] = [node_factory.Factory(popen)]
        return _FACTORY[0]


def precondition() -> str | None:
    """None when the kernel backend works here, else the reason it cannot."""
    if sys.platform != "linux":
        return "kernel backend needs Linux mount namespaces"
    if os.getuid() == 0:
        return None
    try:
        subprocess.run(["unshare", "-Urm", "true"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return f"kernel backend needs root or unprivileged user namespaces ({e})"
    return None


@dataclass
class Node(BaseNode):
    """One worker node: a process holding its namespaces. Create through `Fleet.start`."""
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> Node:
        devices, socket_path, tree = [], None, None
        layout = self.options.get("layout", "debian")   # the host's distribution (where its libraries are)
        # --cdi-spec: the vendor's driver, from their own spec, stands in for the default fixture driver
        self.vendor = cdi_spec.for_node(self.version, layout) if self.role == "gpu-worker" else None
        if self.vendor is not None:
            tree = str(self.vendor.materialise(mps=bool(self.options.get("mps"))))
            devices, socket_path = self.vendor.devices, self.vendor.sockets
        elif self.role == "gpu-worker":
            tree = str(drivers.materialise(self.version, mps=bool(self.options.get("mps")), layout=layout))
            cat = drivers.catalogue(self.version, layout)
            devices = [(f.path, *f.device) for f in cat if f.kind == "device"]
            socket_path = drivers.PERSISTENCED_SOCKET
        cfg = {"jail": str(self.jail), "driver_tree": tree, "devices": devices, "socket": socket_path,
               **self.options,
               "env": {k: v for k, v in self.env.items() if k.startswith("GPUJAIL_")}}
        env = _node_env()
        if warm.enabled():
            self.proc = _factory().spawn(cfg, env, str(ROOT))
        else:
            # Spawned from one long-lived thread: the node dies with its parent *thread* (PDEATHSIG),
            # and a test may start nodes from short-lived threads. In its own session: a terminal's
            # Ctrl-C goes to the harness, which stops its nodes (as an orchestrator, not the terminal,
            # stops containers).
            self.proc = _SPAWNER.submit(subprocess.Popen, [sys.executable, "-m", "gpujail.backends.node", json.dumps(cfg)],
                                        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=env, start_new_session=True).result()
        hello = self._read()
        if not hello.get("ready"):
            self.kill()
            raise RuntimeError(f"node {self.node_id}: {hello.get('error', 'did not start')}")
        self.pid1 = hello["host_pid"]
        return self

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            return {"error": "node process exited" + (f" with code {code}" if code != -1 else "")}
        return json.loads(line)

    def call(self, op: str, **args) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"node {self.node_id} is not running")
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"node {self.node_id}: {op}: {reply['error']}")
        return reply

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the node's PID 1 (the kernel then kills every process in its PID namespace, and
        the mount namespace goes with the last of them) and wait until it is gone."""
        if self.pid1:
            try:
                os.kill(self.pid1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.proc.wait()
        deadline = time.monotonic() + 5
        while self.pid1 and _alive(self.pid1) and time.monotonic() < deadline:
            time.sleep(0.002)
        if self.proc:
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass


def _alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (a dead PID 1 may wait for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):   # ESRCH: it went while read
        return False


def _node_env() -> dict[str, str]:
    """The environment a node (and the factory that forks nodes) starts with: this process's."""
    return {**os.environ, "PYTHONPATH": pythonpath()}


class Fleet(BaseFleet):
    """Nodes sharing one jail, each a process. Use as a context manager: every node is killed on exit."""

    def __init__(self, jail: str | os.PathLike, env: dict[str, str] | None = None):
        super().__init__(jail, env)
        self.jailfs = None   # a jailfs.JailFS: each node then sees the jail through its own client

    def start(self, node_id: str, role: str = "gpu-worker", version: str | None = drivers.DEFAULT_VERSION,
              **options) -> Node:
        if self.jailfs is not None:
            options = {**self.jailfs.node_options(node_id), **options}
        node = Node(node_id, self.jail, role, version, {**self.env, "GPUJAIL_NODE": node_id}, options)
        self.nodes.append(node)
        return node.start()
