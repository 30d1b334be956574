"""The local launcher: the agents as processes of this machine (`--launcher local`).

How this works
--------------
One `gpujail node --run-dir DIR --index I` process per agent, in its own session (a terminal's
Ctrl-C goes to the coordinator, which stops them through DIR/stop). The same agent and files as on
a cluster, with one clock: what a run through `local` shows is what the launcher path costs.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from gpujail.launchers import Launcher as Base
from gpujail.launchers import agent_argv


class Launcher(Base):
    name = "local"

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
