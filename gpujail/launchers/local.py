"""The local launcher: the agents as processes of this machine (`--launcher local`).

How this works
--------------
One `gpujail node --run-dir DIR --index I` process per agent, in its own session (a terminal's
Ctrl-C goes to the coordinator, which stops them through DIR/stop). The same agent and files as on
a cluster, with one clock: what a run through `local` shows is what the launcher path costs, but
for one thing. The request and reply files, which only this machine's processes read, go to a
directory on /dev/shm (a tmpfs, removed at the end) rather than to the run directory: creating,
renaming and deleting a file there costs a third of what a disk's journal makes it cost (0.6 against
1.9 ms of CPU a round trip, measured here), and a start makes two round trips.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpujail.launchers import Launcher as Base
from gpujail.launchers import agent_argv

TMPFS = "/dev/shm"


class Launcher(Base):
    name = "local"
    _channels: Path | None = None

    def channels(self, run_dir: Path) -> Path:
        if os.path.isdir(TMPFS) and os.access(TMPFS, os.W_OK | os.X_OK):   # named so that a later run sweeps it
            self._channels = Path(tempfile.mkdtemp(prefix=f"gpujail-channels-{os.getpid()}-", dir=TMPFS))
            return self._channels
        return super().channels(run_dir)

    def start(self, run_dir: Path, count: int) -> None:
        self.procs = []
        for i in range(count):
            log = open(run_dir / "nodes" / f"agent-{i}.log", "w")
            self.procs.append(subprocess.Popen(agent_argv(run_dir, i), stdin=subprocess.DEVNULL, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))
            log.close()

    def gone(self) -> str | None:
        dead = [(i, p.returncode) for i, p in enumerate(self.procs) if p.poll() is not None]
        return f"agent {dead[0][0]} exited with code {dead[0][1]}" if dead else None

    def stop(self, timeout: float = 10.0) -> None:
        for p in getattr(self, "procs", []):
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._channels:
            shutil.rmtree(self._channels, ignore_errors=True)
