"""The model backend: a deterministic simulation of the shared jail, mount namespaces and locks.

How this works
--------------
The same implementations and the same fake CLI run on a simulation of the shared file system
instead of the kernel, where every file-system call is a scheduling point, so a plan (an
interleaving plus faults) replays exactly and Hypothesis can search and shrink plans
(chaos/explore.py). Four files, each one job:

* fs.py: the tree in memory, a mount table per namespace, the kernel rules (K-1 detach, K-3);
* sched.py: simulated processes, the baton (who takes the next step), descriptors and flocks (K-4);
* sys.py: `ModelSys`, the world's `Sys` interface on the model (and the CLI and ldconfig as
  simulated children);
* world.py: the host and jail a run starts from, the workers' lives, the history it records.

The model never imports an implementation: whoever builds a `ModelWorld` passes one in as a callable
`entry(sys, env) -> exit code` (gpujail/reference_impl `in_process(name)` gives the bundled ones).
Nor does it judge: it writes the kernel backend's history and the chaos checker reads it.
"""
from __future__ import annotations

from .fs import JAIL, LOADER_MIN, Inode, ModelFS, Namespace, loader_view
from .sched import Bounded, Killed, Proc, Scheduler, Step, Worker
from .sys import ModelSys
from .world import SMALL_DRIVER, Entry, ModelWorld, build

__all__ = ["JAIL", "LOADER_MIN", "SMALL_DRIVER", "Bounded", "Entry", "Inode", "Killed", "ModelFS", "ModelSys", "Namespace",
           "Proc", "Scheduler", "Step", "Worker", "ModelWorld", "build", "loader_view", "precondition"]


def precondition() -> str | None:
    """The model needs nothing from the host: always available (gpujail/backends/__init__.py asks)."""
    return None
