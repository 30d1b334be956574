"""Docker backend: each worker node is a container of a real Docker Engine, the jail a shared volume.

How this works
--------------
`Fleet` and `Node` have the backends' interface (gpujail/backends/interface.py), so the contract runner,
the conformance `World`, the chaos runner, probes, history and checker work unchanged. A node is
one container, started through the `docker` SDK from the locally built worker image
(gpujail/docker_image.py), with:

* PID 1 the node agent (`python -m gpujail.backends.node`, the same code as the kernel backend), which builds
  the node-local `/dev` (NVIDIA device nodes made with `mknod`) and `/run` (the persistenced socket),
  binds them over `JAIL/dev` and `JAIL/run` in the container's mount namespace, then serves the
  harness's requests (run the implementation, probe, mounts) over a unix socket in a directory
  bind-mounted from the host;
* the node's driver files bind-mounted read-only by the engine at their real host paths;
* bind mounts at their host paths: the repository (read-only: the fake CLI, the bundled
  implementations, `PYTHONPATH`), the directory of a vendor's script named in the command
  (read-only), and the test's scratch directory, which holds the jail (shared by every container:
  the shared volume), the history, the barriers and the agents' sockets;
* `CAP_SYS_ADMIN` (not `--privileged`) with seccomp and AppArmor unconfined, so the agent and the
  implementation can bind-mount (SPEC K-5); no network.

A worker restart is a new container (as an orchestrator's restart makes one). The harness's
interpreter in a command (`sys.executable`, how the bundled implementations are addressed) is the
image's `/usr/bin/python3`. Containers run with auto-remove and are labelled with their fleet:
leaving the `Fleet` removes every container of it, and if the harness dies the agents see their
connection close and exit, so the engine removes their containers (SPEC INV-6). Engine failures
(unreachable, gone mid-run, a container it killed) are one `EngineError` line naming the node.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpujail import ROOT
from gpujail.backends import docker_image
from gpujail.backends.base import BaseFleet, BaseNode, RunResult, pythonpath
from gpujail.backends.docker_image import PYTHON, one_line
from gpujail.fixtures import drivers
from gpujail.spec import start_timeout

CTL = "/gpujail-ctl"   # the host's per-fleet socket directory, inside every container of the fleet
LABEL = "gpujail.fleet"
START_TIMEOUT = 60.0


class EngineError(Exception):
    """The Docker Engine failed the harness: one line naming the node and what the engine said. Not a
    RuntimeError: the contract runner counts those as a worker's failed attempt, and an engine
    failure is the harness's, not the worker's."""


def _errors() -> tuple[type[BaseException], ...]:
    import docker
    import requests
    return docker.errors.DockerException, requests.RequestException


def client():
    """A client of the engine named by DOCKER_HOST (default: the local unix socket)."""
    import docker
    return docker.from_env(timeout=120)


def containers_of(client, fleet_id: str) -> list:
    """The engine's containers of fleet `fleet_id`, skipping any removed while they are listed: the
    SDK inspects each container the list named, and the engine removes an auto-removed container at
    any moment (a node whose harness died), which failed that inspect with NotFound (CI 72)."""
    return client.containers.list(all=True, filters={"label": f"{LABEL}={fleet_id}"}, ignore_removed=True)


def precondition() -> str | None:
    """None when a Docker Engine is reachable here, else the reason the docker backend cannot run."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "docker backend needs the docker Python SDK (pip install 'gpujail[docker]')"
    try:
        client().ping()
    except _errors() as e:
        return f"docker backend needs a running Docker Engine ({one_line(e)})"
    return None


@dataclass
class Node(BaseNode):
    """One worker node: one container. Create through `Fleet.start`."""
    fleet: Fleet | None = field(default=None, repr=False)
    container: object = field(default=None, repr=False)
    sock: socket.socket | None = field(default=None, repr=False)
    killed: bool = False

    def start(self) -> Node:
        """Nothing yet: the container starts with its command, the implementation (`run`), or bare
        on the first other request (a node a test drives by hand)."""
        self._lock = threading.Lock()
        return self

    def _boot(self, argv: list[str] | None = None, env: dict[str, str] | None = None, timeout: float = 0) -> None:
        """Create and start the container: entrypoint the node agent, command `argv` (run by the
        agent once the node's view is built, with the container's environment `env` and working
        directory the jail, SPEC section 5), and connect to the agent."""
        fleet = self.fleet
        mounts, devices, socket_path = list(fleet.mounts()) + _command_mounts(argv or [], fleet.visible()), [], None
        if self.role == "gpu-worker":
            mounts += _driver_mounts(self.version)
            devices = [(f.path, *f.device) for f in drivers.catalogue(self.version) if f.kind == "device"]
            socket_path = drivers.PERSISTENCED_SOCKET
        seq = next(fleet.seq)   # atomic: nodes start from many threads at once
        name = f"gpujail-{fleet.id}-{seq}-{re.sub(r'[^a-zA-Z0-9_.-]', '_', self.node_id)}"[:120]
        cfg = {"jail": str(self.jail), "driver_tree": None, "devices": devices, "socket": socket_path,
               **self.options, "listen": f"{CTL}/{seq}.sock", "timeout": timeout,
               "env": {k: v for k, v in self.env.items() if k.startswith("GPUJAIL_")}}
        try:
            container = fleet.client.containers.run(
                fleet.image, argv or [], entrypoint=[PYTHON, "-S", "-m", "gpujail.backends.node", json.dumps(cfg)],
                environment=env or {"PYTHONPATH": pythonpath(), "LANG": "C.UTF-8"},
                working_dir=str(self.jail) if argv else "/", name=name, detach=True, auto_remove=True,
                labels={LABEL: fleet.id}, mounts=mounts, network_mode="none", cap_add=["SYS_ADMIN"],
                security_opt=["seccomp=unconfined", "apparmor=unconfined"])
        except _errors() as e:
            raise EngineError(f"node {self.node_id}: the engine did not start its container: {one_line(e)}") from None
        with self._lock:
            self.container, killed = container, self.killed
        if killed:   # a kill that came while the engine was creating it
            self.kill()
            raise RuntimeError(f"node {self.node_id}: killed while its container started")
        self.sock = self._connect(fleet.ctl_dir / f"{seq}.sock")
        self._in, self._out = self.sock.makefile("r"), self.sock.makefile("w")
        hello = self._read()
        if not hello.get("ready"):
            self.kill()
            raise RuntimeError(f"node {self.node_id}: {hello.get('error', 'did not start')}")

    def _connect(self, path: Path) -> socket.socket:
        """Wait for the agent's socket; a container that ends first is an error with its state."""
        deadline = time.monotonic() + START_TIMEOUT
        next_look = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if path.exists():
                s = socket.socket(socket.AF_UNIX)
                try:
                    # through the directory's descriptor: a unix socket path is limited to 107 bytes,
                    # and a test's scratch directory may be deeper than that
                    s.connect(f"/proc/self/fd/{self.fleet.ctl_fd}/{path.name}")
                    return s
                except OSError:
                    s.close()
            if time.monotonic() > next_look:   # ask the engine rarely: many nodes start at once
                next_look = time.monotonic() + 1.0
                state = self._state()
                if state not in ("running", "created"):
                    self.kill()
                    raise EngineError(f"node {self.node_id}: container {self.container.name} {state} before its "
                                      "agent listened")
            time.sleep(0.005)
        self.kill()
        raise EngineError(f"node {self.node_id}: container {self.container.name} did not start its agent "
                          f"within {START_TIMEOUT:.0f}s")

    def _state(self) -> str:
        try:
            self.container.reload()
            s = self.container.attrs["State"]
            return s["Status"] + (f" (exit code {s['ExitCode']}{', OOM-killed' if s.get('OOMKilled') else ''})"
                                  if s["Status"] == "exited" else "")
        except _errors() as e:
            return "gone" if "404" in str(e) or "No such container" in str(e) else f"unknown: {one_line(e)}"

    def _read(self) -> dict:
        try:
            line = self._in.readline()
        except (OSError, ValueError):
            line = ""
        if not line:
            why = "killed by the harness" if self.killed else self._state()
            return {"error": f"container {self.container.name} ended under the request: {why}"}
        return json.loads(line)

    def call(self, op: str, **args) -> dict:
        if self.container is None and not self.killed:
            self._boot()
        if self.sock is None or self.killed:
            raise RuntimeError(f"node {self.node_id} is not running")
        try:
            self._out.write(json.dumps({"op": op, **args}) + "\n")
            self._out.flush()
        except (OSError, ValueError):
            pass   # the reply's EOF says what happened
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"node {self.node_id}: {op}: {reply['error']}")
        return reply

    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None) -> RunResult:
        # The harness's interpreter is the image's: the bundled implementations are `sys.executable -m ...`.
        argv = [PYTHON if word == sys.executable else word for word in argv]
        if self.container is not None or self.killed:
            return super().run(argv, env, timeout)
        self._boot(argv, env if env is not None else self.contract_env(), timeout or start_timeout())
        r = self._read()   # the agent's report of the container's command
        if "error" in r:
            raise RuntimeError(f"node {self.node_id}: run: {r['error']}")
        return RunResult(r["code"], r["stdout"], r["stderr"], r["duration"])

    def contract_env(self, capabilities: str = "compute,utility", extra: dict | None = None) -> dict[str, str]:
        env = super().contract_env(capabilities, extra)
        host_python = os.path.dirname(sys.executable)   # not in the container: the image has its own
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != host_python)
        return env

    @property
    def alive(self) -> bool:
        return self.sock is not None and not self.killed

    def kill(self) -> None:
        """SIGKILL the container (every process in it, its mount namespace with them) and remove it."""
        with self._lock:
            self.killed = True
            container = self.container
        if container is not None:
            try:
                container.remove(force=True)
            except _errors() as e:
                if "404" not in str(e) and "409" not in str(e) and "No such container" not in str(e):
                    self.fleet.engine_errors.append(f"node {self.node_id}: {one_line(e)}")
        if self.sock is not None:
            try:   # wakes a thread waiting for a reply (EOF); the agent, if still alive, exits on it
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            for f in (self._in, self._out, self.sock):
                try:
                    f.close()
                except (OSError, ValueError):
                    pass


SYSTEM = ("/usr/", "/bin/", "/sbin/", "/lib", "/etc/", "/proc/", "/dev/", "/sys/", "/run/")


def _command_mounts(argv: list[str], visible: list[Path]) -> list:
    """A vendor's command names its own files (`bash /opt/vendor/mine.sh -j {jail}`): each word that
    is an existing host file outside the image's system directories and outside what every
    container already sees gets its directory bind-mounted read-only at the same path."""
    from docker.types import Mount
    dirs = set()
    for word in argv:
        if os.path.isabs(word) and os.path.isfile(word) and not word.startswith(SYSTEM):
            d = Path(os.path.normpath(word)).parent
            if not any(d == v or v in d.parents for v in visible):
                dirs.add(d)
    return [Mount(str(d), str(d), type="bind", read_only=True) for d in sorted(dirs)]


def _driver_mounts(version: str) -> list:
    """Read-only binds of the cached driver tree's files at their real host paths."""
    from docker.types import Mount
    tree = drivers.materialise(version)
    return [Mount("/" + drivers.tree_path(f), str(tree / drivers.tree_path(f)), type="bind", read_only=True)
            for f in drivers.catalogue(version) if f.on_disk]


class Fleet(BaseFleet):
    """Containers sharing one jail. Use as a context manager: every container is removed on exit."""
    no_shared_host = "each container's mount namespace is the engine's to make: no node can be a peer of one holder's"

    def __init__(self, jail: str | os.PathLike, env: dict[str, str] | None = None):
        super().__init__(jail, env)
        self.id = secrets.token_hex(4)
        self.seq = itertools.count()
        self._setup = threading.Lock()
        self.engine_errors: list[str] = []
        self._client = self.image = self.ctl_dir = None

    @property
    def client(self):
        if self._client is None:
            try:
                self._client = client()
                self._client.ping()
            except _errors() as e:
                raise EngineError(f"docker engine not reachable: {one_line(e)}") from None
        return self._client

    def shared_dirs(self) -> list[Path]:
        """Host directories every container sees at their host paths: the scratch directory holding
        the jail and the run's history and barriers (their common parent, which also holds a test's
        own scripts), or each of them where that parent would be a system directory."""
        hist = self.env.get("GPUJAIL_HISTORY")
        dirs = [self.jail.resolve().parent] + ([Path(hist).resolve().parent] if hist else [])
        common = Path(os.path.commonpath(dirs))
        if len(common.parts) >= 3 and str(common) not in ("/tmp", "/var/tmp", str(Path.home())):
            return [common]
        return sorted({self.jail.resolve(), *dirs[1:]})

    def visible(self) -> list[Path]:
        """Host directories every container of the fleet sees at their host paths."""
        return [ROOT, *self.shared_dirs()]

    def mounts(self) -> list:
        from docker.types import Mount
        return [Mount(str(ROOT), str(ROOT), type="bind", read_only=True),
                Mount(CTL, str(self.ctl_dir), type="bind"),
                *[Mount(str(d), str(d), type="bind") for d in self.shared_dirs()]]

    def start(self, node_id: str, role: str = "gpu-worker", version: str | None = drivers.DEFAULT_VERSION,
              **options) -> Node:
        with self._setup:   # the first nodes start from many threads at once
            if self.image is None:
                try:
                    self.image = docker_image.ensure(self.client)
                except _errors() as e:
                    raise EngineError(f"docker engine failed while preparing the worker image: {one_line(e)}") from None
                # beside the history (or the jail), never in /tmp: a SIGKILLed harness leaves nothing there
                hist = self.env.get("GPUJAIL_HISTORY")
                self.ctl_dir = (Path(hist) if hist else self.jail).resolve().parent / f".gpujail-ctl-{self.id}"
                self.ctl_dir.mkdir()
                self.ctl_fd = os.open(self.ctl_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        node = Node(node_id, self.jail, role, version, {**self.env, "GPUJAIL_NODE": node_id}, options, fleet=self)
        self.nodes.append(node)
        return node.start()

    def leftovers(self) -> list[str]:
        """Containers of this fleet the engine still has (none after leaving the fleet)."""
        if self._client is None:
            return []
        try:
            return [c.name for c in containers_of(self._client, self.id)]
        except _errors() as e:   # cannot tell: say so, so that the checker cannot pass INV-6 silently
            return [f"(unknown: the engine did not answer: {one_line(e)})"]

    def __exit__(self, exc_type, *exc) -> None:
        """Remove every container of the fleet. When the engine failed at that (and nothing else is
        already failing), one EngineError line says so: a test must not pass over leftovers."""
        for n in self.nodes:
            n.kill()
        if self._client is not None:
            from docker.errors import NotFound
            try:
                for c in containers_of(self._client, self.id):
                    with contextlib.suppress(NotFound):   # removed meanwhile (auto-remove): gone, as wanted
                        c.remove(force=True)
            except _errors() as e:
                self.engine_errors.append(f"cleanup: {one_line(e)}")
        if self.ctl_dir is not None:
            os.close(self.ctl_fd)
            shutil.rmtree(self.ctl_dir, ignore_errors=True)
        if self.engine_errors and exc_type is None:
            raise EngineError(f"fleet {self.id}: the engine failed while removing its containers: "
                              f"{self.engine_errors[0]}" + (f" (and {len(self.engine_errors) - 1} more)"
                                                            if len(self.engine_errors) > 1 else ""))
