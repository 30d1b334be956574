"""What the bundled backends' nodes and fleets share: the node's requests and the fleet's book.

How this works
--------------
The suites drive nodes and fleets through the protocols of interface.py. The bundled backends
(kernel.py, docker_backend.py, launchers/coordinator.py) differ in how a node is made and reached
(a process and its pipe, a container and its socket, an agent and its files) and share the rest,
which lives here rather than in any one backend:

* `BaseNode`: one worker node's identity and the requests built on `call(op, **args)` (which each
  backend provides): `contract_env` (SPEC section 5's environment), `run`, `cli`, `probe`, `mounts`.
* `BaseFleet`: the nodes of one jail, the environment every node's processes get (history,
  barriers, seed: `recording`), the history, and a context manager that kills every node on exit.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpujail import ROOT
from gpujail.fixtures import BIN, cdi_spec, syscall_faults
from gpujail.spec import settings, start_timeout
from gpujail.world import history


@dataclass
class RunResult:
    code: int | str            # exit code, or "timeout"
    stdout: str
    stderr: str
    duration: float
    outside: list[dict] = field(default_factory=list)   # what it did outside the jail: [{change, path}]

    @property
    def error_line(self) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return lines[-1] if lines else ""


def pythonpath() -> str:
    """The bundled code first on an implementation's and a node's PYTHONPATH."""
    return os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


@dataclass
class BaseNode:
    """One worker node, reached through `call`, which each backend defines. Create through a fleet's `start`."""
    node_id: str
    jail: Path
    role: str
    version: str | None
    env: dict[str, str]
    options: dict = field(default_factory=dict)   # jail_readonly: bool, jail_tmpfs: "80k" (this node only), mps: bool
    pid1: int | None = None                        # the node's PID 1, as the host sees it (if it does)
    vendor: cdi_spec.VendorSpec | None = field(default=None, repr=False)   # --cdi-spec: the driver it serves

    def call(self, op: str, **args) -> dict:
        raise NotImplementedError

    def contract_env(self, capabilities: str = "compute,utility", extra: dict | None = None) -> dict[str, str]:
        """The environment SPEC section 5 promises an implementation."""
        path = os.pathsep.join([str(BIN), os.path.dirname(sys.executable),
                                "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        env = {"PATH": path, "HOME": "/root" if os.getuid() == 0 else os.environ.get("HOME", "/"),
               "LANG": "C.UTF-8", "PYTHONPATH": pythonpath(),
               # no .pyc written next to the bundled code: that would be a write outside the jail
               "PYTHONDONTWRITEBYTECODE": "1",
               "GPUJAIL_JAIL": str(self.jail), "GPUJAIL_NODE": self.node_id, "GPUJAIL_ROLE": self.role,
               "NVIDIA_DRIVER_CAPABILITIES": capabilities}
        run = settings()
        if run.cli_variant:   # --cli: which fake CLI the workers get
            env["GPUJAIL_CLI_VARIANT"] = run.cli_variant
        if self.vendor is not None:   # --cdi-spec: the fake nvidia-ctk prints the vendor's spec
            env[cdi_spec.ENV] = self.vendor.path
        env.update({k: v for k, v in self.env.items()})
        env.update(extra or {})
        if run.cli_target:   # --cli real: the host's CLI, through the wrapper
            env.setdefault(syscall_faults.TARGET_ENV, run.cli_target)
        if env.get(syscall_faults.TARGET_ENV) or env.get(syscall_faults.ENV):
            # the wrapper goes first on PATH: it runs that CLI (or the fake) under strace --inject
            env["PATH"] = os.pathsep.join([str(syscall_faults.WRAP), env["PATH"]])
        return env

    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None) -> RunResult:
        """Run a command in this node's namespace, cwd = jail (SPEC section 5). At the deadline
        (default: the start timeout) it is killed with everything it started, code "timeout"."""
        env = env if env is not None else self.contract_env()
        r = self.call("run", argv=argv, env=env, cwd=str(self.jail), timeout=timeout or start_timeout())
        outside = [{"change": c["change"], "path": c["path"]} for c in r.get("outside", [])]
        return RunResult(r["code"], r["stdout"], r["stderr"], r["duration"], outside)

    def cli(self, *args: str, env: dict | None = None, timeout: float = 60.0) -> RunResult:
        """Run the fake nvidia-container-cli in this node."""
        return self.run([str(BIN / "nvidia-container-cli"), *args], env=env, timeout=timeout)

    def probe(self, files: list[dict]) -> list[dict]:
        """[{path, host?, load?}] -> what this node sees at each path (size, attached, loader, bytes)."""
        return self.call("probe", files=files)["results"]

    def mounts(self, under: str | None = None) -> list[dict]:
        return self.call("mounts", under=under or str(self.jail))["mounts"]


class BaseFleet:
    """Nodes sharing one jail. Use as a context manager: every node is killed on exit."""

    no_shared_host = ""   # why this fleet's nodes cannot be peers of a shared host mount (shared_host.py)
    jail: Path
    env: dict[str, str]   # what every node's processes get: the history, the barriers, the seed

    def __init__(self, jail: str | os.PathLike, env: dict[str, str] | None = None):
        self.jail = Path(jail)
        self.env = dict(env or {})
        if os.environ.get(history.VALIDATE_ENV):   # self-tests: the nodes' processes check their events too
            self.env.setdefault(history.VALIDATE_ENV, os.environ[history.VALIDATE_ENV])
        self.nodes: list = []

    @classmethod
    def recording(cls, jail: str | os.PathLike, run_dir: Path, seed: int | str = 0):
        """A fleet whose processes record into `run_dir/history.jsonl` and meet at barriers in
        `run_dir/barriers/`, with failpoint randomness seeded by `seed`."""
        (run_dir / "barriers").mkdir(parents=True, exist_ok=True)
        return cls(jail, {"GPUJAIL_HISTORY": str(run_dir / "history.jsonl"),
                          "GPUJAIL_BARRIERS": str(run_dir / "barriers"), "GPUJAIL_SEED": str(seed)})

    def history(self) -> list[dict]:
        return history.load(self.env.get(history.ENV, ""))

    def leftovers(self) -> list[str]:
        """What of this fleet outlived it besides host processes and mounts (none for processes;
        the docker backend's containers)."""
        return []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for n in self.nodes:
            n.kill()
