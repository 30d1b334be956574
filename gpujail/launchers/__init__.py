"""Launchers: how the node agents of a run get started on the user's nodes (local processes, Slurm, Kubernetes).

How this works
--------------
A run through a launcher has three parts, which share nothing but one run directory (on a real
cluster, the shared file system every node mounts):

* the coordinator (`coordinator.py`): a `Fleet` with the kernel backend's interface, so the chaos
  runner, the contract and the suites drive it unchanged. It writes `DIR/run.json`, starts the agents
  through a launcher, meets each at a rendezvous (its clock offset), sends every node request
  (start, run, probe, kill) as a file, and copies the agents' histories into the run's as they
  grow (once a second, and at the end);
* the agents (`agent.py`, the command `gpujail node --run-dir DIR [--index I]`): one per node, each
  making worker namespaces exactly as the kernel backend does and answering the files;
* a launcher (this interface): starts `count` agents with `agent_argv(DIR)` as their command, says
  when they are gone, stops them, and names what of them outlived the run.

    local.py       agents as local processes
    slurm.py       one `srun` step, one task per node
    kubernetes.py  an Indexed Job (written by the Kubernetes launcher's owner)
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

NAMES = ("local", "slurm", "kubernetes")


class LaunchFailed(RuntimeError):
    """One line for the user; `outcome` is a key of gpujail.spec.EXIT: 'backend' when the cluster
    cannot run the agents (no access, unschedulable, no image, no resources), 'bad-input' for a
    setting it refuses (an unknown partition), 'error' when an agent failed. It reaches the exit
    code through the coordinator (`coordinator.outcome`)."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome


class Launcher:
    """Starts the agents of one run and stops them. Options come from the command line
    (`--partition`, `--account`, `--nodes` for Slurm), unknown ones are ignored."""

    name = "?"

    def __init__(self, **options):
        self.options = options

    @staticmethod
    def unavailable() -> str | None:
        """None when this launcher can start agents from here, else why not (one line)."""
        return None

    def channels(self, run_dir: Path) -> Path:
        """Where the agents' request and reply files go (`CHANNELS/I/in`, `CHANNELS/I/out`): in the
        run directory, the one thing a cluster's nodes share."""
        return run_dir / "nodes"

    def start(self, run_dir: Path, count: int) -> None:
        """Start agents 0..count-1, each running `agent_argv(run_dir)` with its index in its
        environment (SLURM_PROCID, JOB_COMPLETION_INDEX) or as `--index`."""
        raise NotImplementedError

    def gone(self) -> str | None:
        """Why the agents are no longer running (they died, the job was cancelled), or None. A
        launcher may instead raise `LaunchFailed`, whose `outcome` then decides the run's exit code."""
        return None

    def pending(self) -> str | None:
        """What the launcher says while its agents have not started yet (a job waiting in a queue), or
        None: said when the agents' deadline passes, which then is the cluster's failure."""
        return None

    def stop(self, timeout: float = 10.0) -> None:
        """After the coordinator wrote DIR/stop: wait up to `timeout` for the agents to end, then end
        them by force. Must leave nothing running."""

    def leftovers(self) -> list[str]:
        """What of this launcher still exists after `stop` (a job in the queue, a pod): residue."""
        return []


def agent_argv(run_dir: Path, index: int | None = None) -> list[str]:
    """The agent's command (`gpujail node`, as a module: without the command line's imports): this
    interpreter and this gpujail (a cluster's nodes must reach both at the same paths, e.g. a
    virtualenv on the shared file system)."""
    return [sys.executable, "-m", "gpujail.launchers.agent", "--run-dir", str(run_dir),
            *(["--index", str(index)] if index is not None else [])]


def get(name: str, **options) -> Launcher:
    if name not in NAMES:
        raise ValueError(f"unknown launcher {name!r}, expected one of {', '.join(NAMES)}")
    return importlib.import_module(f"gpujail.launchers.{name}").Launcher(**options)


def unavailable(name: str) -> str | None:
    """None when launcher `name` can be used here, else why not (as backends.unavailable)."""
    if name not in NAMES:
        return f"unknown launcher {name!r}, expected one of {', '.join(NAMES)}"
    try:
        module = importlib.import_module(f"gpujail.launchers.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"gpujail.launchers.{name}":
            return f"launcher {name!r} is not available in this build"
        return f"launcher {name!r} needs the Python package {e.name!r}, which is not installed"
    return module.Launcher.unavailable()


def fleet_class(name: str, **options):
    """A `Fleet` class (the kernel backend's interface) whose nodes are started by agents through
    launcher `name`: what the chaos runner and the plugin take as `fleet_class`."""
    from gpujail.launchers.coordinator import Fleet
    return type(f"{name.capitalize()}Fleet", (Fleet,), {"launcher_name": name, "launcher_options": options})
