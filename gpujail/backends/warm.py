"""Warm starts: a worker start's processes forked from a process that has imported their code,
instead of new Python interpreters (issue 19: 16 workers on 2 cores at 50 starts/s).

How this works
--------------
A start on the kernel backend used to pay four interpreter start-ups with their imports (25-50 ms
of CPU each): its node, the implementation, and two fake CLI runs. Three warm paths remove them.
Each is a plain fork of a process that imported the code once, and the child then runs exactly
the code a new interpreter would have, with the same argv, environment, cwd, standard streams and
exit status (forked_child.py `become`: the one copy of "be that process"):

1. **Nodes** (node_factory.py). One factory per harness process, `python -m gpujail.backends.node
   --factory`, has imported the node and everything a node runs and forks a node per request;
   as root the child is born PID 1 of the node's PID namespace (namespaces.py `fork_node`).
2. **Bundled implementations** (this module). `python -S -m gpujail.reference_impl ...`
   (reference, legacy, direct, the mutants) runs in a child forked from its node (`warm_module`,
   `fork_start`): the node imported it once (`warmed_up`), and the child runs it as `-m` would.
3. **The fake CLI** (cli_server.py). A worker's bash client of `nvidia-container-cli` is served by
   its node's PID 1, which forks the fake in the client's place; a bundled implementation forked
   warm (2) forks the fake from itself (`run_cli_forked`, set here as its `sysops.run_without_exec`).

`GPUJAIL_WARM_STARTS=0` in the harness's environment turns all three off (the benchmarks compare).
"""
from __future__ import annotations

import gc
import os
import select
import subprocess
import sys

from gpujail.backends.cli_server import run_cli_forked
from gpujail.backends.forked_child import become, close_fds, stdio_to_pipes
from gpujail.world import sysops

WARM_ENV = "GPUJAIL_WARM_STARTS"


def enabled(env=os.environ) -> bool:
    return env.get(WARM_ENV) != "0" and hasattr(os, "pidfd_open")


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
            stdio_to_pipes(out_w, err_w)
            close_fds(out_r, out_w, err_r, err_w)
        finally:
            sysops.run_without_exec = run_cli_forked   # (3): its own runs of the bundled CLI
            become([argv[0], *argv[4:]], env, lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    close_fds(out_w, err_w)
    return Forked(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
