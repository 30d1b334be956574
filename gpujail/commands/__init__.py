"""The `gpujail` subcommands, one module per family, below the front door (gpujail/cli.py).

How this works
--------------
gpujail/cli.py parses the command line and checks the input a subcommand depends on (the
implementation, the backend, the expectations file) with the plugin's own checks; then it calls
one function here, which does the work and returns a code of `gpujail.spec.EXIT`:

    run.py        `run`: the suites in this process, a progress line, the summary and the reports
    scenarios.py  `reproduce`, `scenarios`, `failpoints`: one chaos scenario and what they are made of
    tools.py      `killmatrix`, `expectations`, `check`, `explore`, `bench`: the project's other
                  tools, each also `python -m gpujail...` (their own modules sit in the layers below)
    qualify.py    `qualify PATH`: two nodes measure whether a shared filesystem is safe for the jail
    node.py       `node`: the node agent a launcher starts on each node (gpujail/launchers/)

A mistake in the input is a `Stop`: one line on stderr and its exit code, raised before anything
runs. SIGTERM (CI cancellation, `timeout`) and SIGHUP (a closed terminal) stop a run as Ctrl-C
does (`stop_on_signals`): nodes stopped, summary printed, exit 128 + the signal's number. A run's
temporary directory carries its pid (`scratch`), so the next run removes those of runs that were
killed outright (`sweep`). These modules never import gpujail.cli (the layer above them, pyproject's import-linter
contract).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from gpujail.plugin import STOPPED_BY
from gpujail.spec import EXIT


class Stop(Exception):
    """One line for the user and the exit code that goes with it."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.code = interrupted_code() if outcome == "interrupted" else EXIT[outcome]


def check_backend(name: str) -> None:
    from gpujail import backends, options
    try:
        options.check_backend(options.flag("backend", name))
    except options.BadInput as e:
        raise Stop("bad-input", str(e)) from None
    reason = backends.unavailable(name)
    if reason:
        raise Stop("backend", f"--backend {name}: {reason}")


def load_scenario(source: str):
    from gpujail.chaos.scenario import ScenarioError, load
    try:
        return load(source)
    except ScenarioError as e:
        raise Stop("bad-input", str(e)) from None


_terminal = None


def terminal():
    """The real standard output, even while pytest captures file descriptor 1 or we redirect sys.stdout."""
    global _terminal
    if _terminal is None:
        _terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    return _terminal


def silence_outputs() -> None:
    """The reader went away (`gpujail ... | head`): send what is still written to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for f in (sys.stdout, _terminal):
        if f is not None:
            os.dup2(devnull, f.fileno())


def remove_tree(path: Path) -> None:
    """Remove a run's temporary tree, making a directory a test left read-only writable again (its
    parent only: rmtree does not follow symlinks, so nothing outside the tree is touched)."""
    def writable(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o755)
        func(p)
    try:
        shutil.rmtree(path, **({"onexc": writable} if sys.version_info >= (3, 12) else {"onerror": writable}))
    except OSError as e:
        print(f"gpujail: could not remove the temporary directory {path}: {e}", file=sys.stderr)


def interrupted_code() -> int:
    """128 + the signal that stopped the run: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + STOPPED_BY["signal"]   # set by stop_on_signals (gpujail/plugin), 2 (SIGINT) else


SCRATCH = re.compile(r"gpujail-(?:run|reproduce|channels)-(\d+)-\w+")


def scratch(kind: str) -> Path:
    """A run's temporary directory, `gpujail-KIND-PID-XXXX`, after sweeping away stale ones (also
    the local launcher's request directories on /dev/shm)."""
    sweep(Path(tempfile.gettempdir()))
    if os.path.isdir("/dev/shm"):
        sweep(Path("/dev/shm"))
    return Path(tempfile.mkdtemp(prefix=f"gpujail-{kind}-{os.getpid()}-"))


def sweep(where: Path) -> list[Path]:
    """Remove the temporary directories (and staged reports) that runs killed outright left in
    `where`: only those whose owner process is gone. Returns what it removed."""
    gone = []
    for d in where.glob("*gpujail-*-*-*"):
        m = SCRATCH.fullmatch(d.name.lstrip("."))
        if m and d.is_dir() and not _alive(int(m[1])):
            remove_tree(d)
            gone.append(d)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's: alive, and not ours to judge
        pass
    return True
