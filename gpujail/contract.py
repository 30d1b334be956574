"""The implementation contract (SPEC section 5, CONTRACT.md): run any implementation as a worker.

How this works
--------------
`command_for(impl)` turns an implementation name into a command template: the bundled ones by
name (`reference`, `legacy`, `direct`, `example-shell`), anything else as a command string in which
`{jail}`, `{node}`, `{role}` are substituted per word (so `bash vendor.sh -j {jail}` works).
`start_worker` runs it in a fresh node of the kernel backend, the way an orchestrator starts a
container: the contract environment, cwd = the jail, exit 0 = ready. A non-zero exit restarts it
by the `RestartPolicy`, each restart in a *new* node (a container restart gets a new mount
namespace), with exponential backoff. Every start, exit and restart goes into the history.
Under a schedule with `syscalls` (`--schedule pct:syscalls`, docs/scheduler.md) each start runs
under fixtures/bin/gpujail-syscall-points, which makes its system calls on the jail scheduling points.
"""
from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpujail import reference_impl
from gpujail.backends.base import RunResult
from gpujail.backends.interface import Fleet, Node
from gpujail.fixtures import BIN
from gpujail.spec import CLI_COMMANDS, start_timeout
from gpujail.world import history, schedule

# -S: no site-packages scan at start-up (PYTHONPATH names the repository), which is a third of a
# worker start's Python start-up cost here.
BUNDLED = {
    "reference": [sys.executable, "-S", "-m", "gpujail.reference_impl", "reference"],
    "legacy": [sys.executable, "-S", "-m", "gpujail.reference_impl", "legacy"],
    "direct": [sys.executable, "-S", "-m", "gpujail.reference_impl", "direct"],
    "cdi-naive": [sys.executable, "-S", "-m", "gpujail.reference_impl", "cdi-naive"],
    "cdi": [sys.executable, "-S", "-m", "gpujail.reference_impl", "cdi"],
    "example-shell": ["sh", str(Path(reference_impl.__file__).resolve().parent / "example.sh")],
}


# What the bundled implementations that do not run both `nvidia-container-cli list` and `configure`
# run of it: direct mounts the files `list` names itself, the CDI ones take a spec's (SPEC section 9).
CLI_RUNS = {"direct": ("list",), "cdi": (), "cdi-naive": ()}


def cli_commands(impl: str, declared: list[str] | None = None) -> frozenset[str]:
    """Which of CLI_COMMANDS `impl` runs, so that the tests of what a failing or a stubbed command
    must lead to (marker `needs_cli(command)`) apply to it only then: what its expectations file
    declares (`cli = ["list"]`), else CLI_RUNS for a bundled one, none for a run's own command in
    CDI mode (--cdi-spec), both for everything else (a vendor's script runs the CLI)."""
    if declared is not None:
        return frozenset(declared)
    if impl in CLI_RUNS:
        return frozenset(CLI_RUNS[impl])
    from gpujail.backends.probes import cdi_mode
    return frozenset() if cdi_mode(impl) else frozenset(CLI_COMMANDS)


class UnknownImplementation(ValueError):
    pass


def command_for(impl: str, jail: str, node: str, role: str) -> list[str]:
    """argv for implementation `impl` (a bundled name or a command string)."""
    if impl in BUNDLED:
        return list(BUNDLED[impl])
    if impl.startswith("mutant:"):
        from gpujail.reference_impl.mutants import MUTANTS
        if impl.split(":", 1)[1] not in MUTANTS:
            raise UnknownImplementation(f"unknown mutant {impl!r}; known: {', '.join(sorted(MUTANTS))}")
        return [sys.executable, "-S", "-m", "gpujail.reference_impl", impl]
    try:
        words = shlex.split(impl)
    except ValueError as e:
        raise UnknownImplementation(f"cannot parse implementation command {impl!r}: {e}") from None
    if not words:
        raise UnknownImplementation("empty implementation command")
    argv = [w.replace("{jail}", jail).replace("{node}", node).replace("{role}", role) for w in words]
    if "/" in argv[0] and not Path(argv[0]).exists():
        raise UnknownImplementation(f"implementation command not found: {argv[0]}")
    return argv


@dataclass
class RestartPolicy:
    """How an orchestrator restarts a failing container: up to `max_restarts`, with backoff."""
    max_restarts: int = 0
    backoff: float = 0.05
    factor: float = 2.0
    max_backoff: float = 2.0

    def delay(self, restart: int) -> float:
        return min(self.backoff * self.factor ** restart, self.max_backoff)


@dataclass
class Worker:
    node_id: str
    role: str
    node: Node | None = None              # the node of the last attempt (kept alive when ready)
    attempts: list[RunResult] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return bool(self.attempts) and self.attempts[-1].code == 0


def start_worker(fleet: Fleet, node_id: str, impl: str, role: str = "gpu-worker",
                 version: str | None = None, policy: RestartPolicy | None = None,
                 capabilities: str = "compute,utility", env: dict[str, str] | None = None,
                 timeout: float | None = None, node_options: dict | None = None,
                 first_attempt_env: dict[str, str] | None = None, on_node=None,
                 attempt_env: dict[int, dict[str, str]] | None = None, syscall_points: bool = False) -> Worker:
    """Start a worker and restart it by `policy` until it reports ready or gives up.
    `first_attempt_env` is added to the first start only (a transient fault), `attempt_env[i]` to
    start i (0 the first: a fault that hits the restart, not the start before it); `syscall_points`:
    every start runs under fixtures/bin/gpujail-syscall-points, so its system calls on the jail are
    scheduling points of the scheduler its env names (`--schedule ...:syscalls`); `on_node(node)` is
    called with each new node (the chaos runner uses it to kill nodes). A node that dies under the
    implementation (killed) counts as a failed attempt with code "killed". A restart whose node cannot be set
    up is a failed attempt with code "no-node". A start that reaches its
    deadline (`timeout`, default the start timeout) is killed and not restarted: a restart would
    only wait again, and a run against a hanging script must end in about one deadline."""
    from gpujail.fixtures.drivers import DEFAULT_VERSION
    policy = policy or RestartPolicy()
    version = version or (DEFAULT_VERSION if role == "gpu-worker" else None)
    worker = Worker(node_id, role)

    def log(kind: str, **fields) -> None:
        history.append(fleet.env.get(history.ENV), kind, node=node_id, **fields)

    for attempt in range(policy.max_restarts + 1):
        if attempt:
            time.sleep(policy.delay(attempt - 1))
            log("worker.restart", attempt=attempt)
        try:
            node = fleet.start(node_id, role=role, version=version if role == "gpu-worker" else None,
                               **(node_options or {}))
        except RuntimeError as e:
            if not attempt:   # a worker's first node: this host cannot run the harness, say so
                raise
            # a restarted container whose set-up fails (its jail client down in a brick outage) is a
            # failed attempt like any other: the restart policy decides, as a real orchestrator would
            worker.attempts.append(RunResult("no-node", "", f"{e}\n", 0.0))
            log("worker.start", impl=impl, attempt=attempt)
            log("worker.exit", code="no-node", error=str(e))
            continue
        argv = command_for(impl, str(fleet.jail), node_id, role)
        log("worker.start", impl=impl, attempt=attempt)
        if on_node:
            on_node(node)
        extra = {**(env or {}), **((first_attempt_env or {}) if attempt == 0 else {}),
                 **(attempt_env or {}).get(attempt, {})}
        if syscall_points and extra.get(schedule.ENV):   # its system calls are scheduling points too
            argv = [sys.executable, "-S", str(BIN / "gpujail-syscall-points"), *argv]
        try:
            result = node.run(argv, env=node.contract_env(capabilities, extra), timeout=timeout)
        except RuntimeError as e:   # the node died under it: killed, as a container can be
            result = RunResult("killed", "", f"{e}\n", 0.0)
        if result.code == "timeout":   # the one line a person reads says where
            result.stderr += (f"gpujail: timeout after {timeout or start_timeout():g} s in start {attempt + 1} "
                              f"of worker {node_id}\n")
        worker.attempts.append(result)
        worker.node = node
        if result.code == 0:
            log("worker.ready", attempt=attempt)
            return worker
        log("worker.exit", code=result.code, error=result.error_line)
        node.kill()
        if result.code == "timeout":
            break
    return worker
