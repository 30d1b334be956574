"""The Slurm launcher (`--launcher slurm`): the agents as the tasks of one `srun` step.

How this works
--------------
`srun --nodes N --ntasks-per-node 1 [--partition P] [--account A] -- python -m gpujail node --run-dir
DIR` from the coordinator's machine (a login node): Slurm allocates N nodes and starts one agent on
each, its index in SLURM_PROCID. With fewer nodes than agents (`--nodes`, e.g. the one-host test
cluster of scripts/slurm-cluster.sh) the step asks `--ntasks` agents on those nodes with
`--overcommit`, several agents per node. srun's own output goes to DIR/srun.log. Stopping: the
agents end when the coordinator writes DIR/stop and srun returns; past the timeout (at once for a
step Slurm still keeps queued, whose agents never started) the job is cancelled by its name and
srun is killed. A step still queued when the agents' deadline passes ends the run as the
cluster's (exit 3), with srun's `queued and waiting for resources` line.

Slurm's commands find the cluster as usual (slurm.conf, or SLURM_CONF in the environment).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from gpujail.launchers import Launcher as Base
from gpujail.launchers import LaunchFailed, agent_argv


class Launcher(Base):
    name = "slurm"

    @staticmethod
    def unavailable() -> str | None:
        if not shutil.which("srun"):
            return "no srun on PATH (Slurm's client commands: Debian's slurm-client)"
        conf = os.environ.get("SLURM_CONF")
        if conf and not os.path.isfile(conf):   # sinfo would retry for a minute
            return f"SLURM_CONF={conf}: no such file (scripts/slurm-cluster.sh start prints the one to use)"
        try:
            r = subprocess.run(["sinfo", "-h", "-o", "%a"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as e:
            return f"sinfo failed: {e}"
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            return f"no Slurm controller answers (sinfo: {lines[-1] if lines else r.returncode})"
        return None

    @staticmethod
    def job_name(run_dir: Path) -> str:
        """The step's job name: how this run finds its job before any agent reported its id."""
        return f"gpujail-{run_dir.name}-{os.getpid()}"

    def argv(self, run_dir: Path, count: int) -> list[str]:
        nodes = int(self.options.get("nodes") or count)
        shape = (["--nodes", str(count), "--ntasks-per-node", "1"] if nodes >= count
                 else ["--nodes", str(nodes), "--ntasks", str(count), "--overcommit"])
        return ["srun", f"--job-name={self.job_name(run_dir)}", *shape,
                *([f"--partition={self.options['partition']}"] if self.options.get("partition") else []),
                *([f"--account={self.options['account']}"] if self.options.get("account") else []),
                "--kill-on-bad-exit=1", "--", *agent_argv(run_dir)]

    def start(self, run_dir: Path, count: int) -> None:
        self.run_dir = run_dir
        with open(run_dir / "srun.log", "w") as log:
            self.proc = subprocess.Popen(self.argv(run_dir, count), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def gone(self) -> str | None:
        """Why the step ended; `LaunchFailed` when Slurm refused to allocate it: 'bad-input' for a
        partition or account it does not know (--partition, --account), else 'backend'."""
        if self.proc.poll() is None:
            return None
        lines = [ln for ln in (self.run_dir / "srun.log").read_text().splitlines() if ln.strip()]
        for ln in lines:
            _, refused, why = ln.partition("Unable to allocate resources:")
            if refused:
                setting = re.search(r"[Ii]nvalid (partition|account)", why)
                raise LaunchFailed("bad-input" if setting else "backend",
                                   f"srun: Slurm cannot allocate the agents' step: {why.strip()}"
                                   + (f" (--{setting.group(1)} {self.options.get(setting.group(1))})" if setting else ""))
        return f"srun exited with code {self.proc.returncode}" + (f": {lines[-1]}" if lines else "")

    def pending(self) -> str | None:
        """srun's line while Slurm keeps the step queued (`job N queued and waiting for resources`)."""
        lines = (self.run_dir / "srun.log").read_text().splitlines()
        queued = [ln.strip() for ln in lines if "queued and waiting for resources" in ln]
        return queued[-1] if queued else None

    def job_ids(self) -> set[str]:
        """The job ids the agents reported (SLURM_JOB_ID), from DIR/nodes/*/agent.json."""
        ids = set()
        for hello in (self.run_dir / "nodes").glob("*/agent.json"):
            ids.add(json.loads(hello.read_text()).get("slurm_job"))
        return ids - {None}

    def _queue(self, *args: str) -> subprocess.CompletedProcess:
        """squeue or scancel on this run's job, found by its name (a queued step has no agent to
        report its id), as the user who submitted it."""
        return subprocess.run([*args, f"--name={self.job_name(self.run_dir)}", f"--user={os.getuid()}"],
                              capture_output=True, text=True, timeout=20)

    def stop(self, timeout: float = 10.0) -> None:
        if not hasattr(self, "proc"):
            return
        try:   # agents that started end on DIR/stop; a step still queued never will: cancelled at once
            self.proc.wait(timeout=timeout if self.job_ids() else 0.5)
        except subprocess.TimeoutExpired:
            self._queue("scancel")
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def leftovers(self) -> list[str]:
        if not hasattr(self, "proc"):
            return []
        for _ in range(50):   # a finished job stays COMPLETING a moment while its steps are reaped
            r = self._queue("squeue", "-h", "-o", "%i %T")
            jobs = [f"slurm job {ln}" for ln in r.stdout.splitlines() if ln.strip()]
            if not jobs:
                return []
            time.sleep(0.2)
        return jobs
