"""What the suites ask of a backend and of a fault source: three small protocols.

How this works
--------------
The chaos runner, the contract (`start_worker`) and the suites' fixtures drive worker nodes through
`Fleet` and `Node` only, so any backend that has these members works with them unchanged: the
kernel backend (kernel.py: each node a process in fresh namespaces), docker (docker_backend.py:
each node a container), the launchers' coordinator (launchers/coordinator.py: each node made by
an agent on a cluster node), and the wrappers that add a jail file system (jailfs_fleet.py) or a
shared host mount (shared_host.py) to any of them. They are `typing.Protocol`s: a backend
conforms by its members, not by inheriting from the kernel's classes; `gaps(cls, protocol)` says
what a class lacks (the self-tests check every bundled backend with it).

A `Nemesis` is a fault source that acts beside the workers during a run: started once the fleet is
up, stopped before the run is judged, what it did recorded in the history. `ThreadNemesis` is the
one way the bundled ones run (the ldconfig nodes, the live populate job and the barrier keeper of
chaos/runner.py, the jail file system's network faults): a thread whose exception is kept, never
lost, and raised by the run once every thread is joined. The faults armed in a worker's own
environment (failpoint terms, strace terms) are not nemeses: they act inside the implementation.
"""
from __future__ import annotations

import inspect
import os
import threading
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable


@runtime_checkable
class Node(Protocol):
    """One worker node: a place where an implementation starts, with its own mount namespace."""
    node_id: str
    jail: Path
    role: str
    version: str | None

    def start(self) -> Node: ...
    @property
    def alive(self) -> bool: ...
    def contract_env(self, capabilities: str = "compute,utility", extra: dict | None = None) -> dict[str, str]:
        """The environment SPEC section 5 promises an implementation on this node."""
    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None):
        """Run a command in the node's namespace, cwd = the jail; a kernel.RunResult."""
    def cli(self, *args: str, env: dict | None = None, timeout: float = 60.0):
        """Run the fake nvidia-container-cli there."""
    def probe(self, files: list[dict]) -> list[dict]:
        """What the node sees at each path (size, attached, what the loader makes of it)."""
    def mounts(self, under: str | None = None) -> list[dict]: ...
    def kill(self) -> None:
        """SIGKILL the node with everything in it, and wait until it is gone."""


@runtime_checkable
class Fleet(Protocol):
    """Nodes sharing one jail; a context manager that kills every node on exit."""
    jail: Path
    env: dict[str, str]
    no_shared_host: str   # why its nodes cannot be peers of a shared host mount ('' if they can)

    @classmethod
    def recording(cls, jail: str | os.PathLike, run_dir: Path, seed: int | str = 0) -> Fleet:
        """A fleet whose processes record into run_dir/history.jsonl and meet at its barriers."""
    def start(self, node_id: str, role: str = "gpu-worker", version: str | None = ..., **options) -> Node: ...
    def history(self) -> list[dict]: ...
    def leftovers(self) -> list[str]:
        """What of the fleet outlived it besides host processes and mounts (INV-6)."""
    def __enter__(self) -> Fleet: ...
    def __exit__(self, *exc) -> None: ...


@runtime_checkable
class Nemesis(Protocol):
    """A fault source acting beside the workers for the length of a run."""
    name: str
    error: BaseException | None   # what went wrong in it, for the run to raise

    def start(self) -> None: ...
    def stop(self) -> None:
        """Wait until it is done (the run tells it to finish by its own means: an event, the end of
        the workers' threads); raises nothing."""


class ThreadNemesis:
    """A nemesis that is one thread running `act()`; its exception is kept in `error`."""
    name: str
    error: BaseException | None

    def __init__(self, name: str, act: Callable[[], None], daemon: bool = False):
        self.name, self.error = name, None
        self._thread = threading.Thread(target=self._run, args=(act,), name=name, daemon=daemon)

    def _run(self, act) -> None:
        try:
            act()
        except BaseException as e:   # a harness thread never dies in silence: the run raises it
            self.error = e

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()


def gaps(cls: type, protocol: type) -> list[str]:
    """What `cls` lacks of `protocol`: each member missing, or a method that cannot be called as the
    protocol calls it (a parameter the protocol passes that it does not take)."""
    missing = []
    for name in members(protocol):
        if not hasattr(cls, name) and not any(name in getattr(k, "__annotations__", {}) for k in cls.__mro__):
            missing.append(f"{name}: missing")
            continue
        want = inspect.getattr_static(protocol, name, None)
        have = inspect.getattr_static(cls, name, None)
        if not callable(getattr(want, "__func__", want)) or isinstance(want, property):
            continue
        missing += [f"{name}: {why}" for why in _uncallable(want, have)]
    return missing


def members(protocol: type) -> list[str]:
    """The members a protocol declares: its attributes, methods and properties (and the context
    manager's two methods), not what every class has."""
    body = set(vars(protocol)) | set(getattr(protocol, "__annotations__", {}))
    return sorted(n for n in body if not n.startswith("_") or n in ("__enter__", "__exit__"))


def _uncallable(want, have) -> list[str]:
    """The parameters of `want` that a call by them would not reach in `have`."""
    def sig(f):
        return inspect.signature(getattr(f, "__func__", f))
    try:
        w, h = sig(want), sig(have)
    except (TypeError, ValueError):
        return ["not a method"]
    params = h.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params) and any(p.kind is p.VAR_POSITIONAL for p in params):
        return []
    out = []
    for p in w.parameters.values():
        if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name not in h.parameters and not any(q.kind is q.VAR_KEYWORD for q in params):
            out.append(f"takes no {p.name!r}")
    return out
