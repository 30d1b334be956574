"""The Slurm launcher (`--launcher slurm`): the agents as the tasks of one `srun` step.

How this works
--------------
`srun --nodes N --ntasks-per-node 1 [--partition P] [--account A] -- python -m gpujail node --run-dir
DIR` from the coordinator's machine (a login node): Slurm allocates N nodes and starts one agent on
each, its index in SLURM_PROCID. With fewer nodes than agents (`--nodes`, e.g. the one-host test
cluster of scripts/slurm-cluster.sh) the step asks `--ntasks` agents on those nodes with
`--overcommit`, several agents per node. srun's own output goes to DIR/srun.log. Stopping: the
agents end when the coordinator writes DIR/stop and srun returns; past the timeout the job is
cancelled by its id (which the agents report from SLURM_JOB_ID) and srun is killed.

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

    def argv(self, run_dir: Path, count: int) -> list[str]:
        nodes = int(self.options.get("nodes") or count)
        shape = (["--nodes", str(count), "--ntasks-per-node", "1"] if nodes >= count
                 else ["--nodes", str(nodes), "--ntasks", str(count), "--overcommit"])
        return ["srun", f"--job-name=gpujail-{run_dir.name}-{os.getpid()}", *shape,
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

    def job_ids(self) -> set[str]:
        """The job ids the agents reported (SLURM_JOB_ID), from DIR/nodes/*/agent.json."""
        ids = set()
        for hello in (self.run_dir / "nodes").glob("*/agent.json"):
            ids.add(json.loads(hello.read_text()).get("slurm_job"))
        return ids - {None}

    def stop(self, timeout: float = 10.0) -> None:
        if not hasattr(self, "proc"):
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for job in self.job_ids():
                subprocess.run(["scancel", job], capture_output=True, timeout=20)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def leftovers(self) -> list[str]:
        ids = sorted(self.job_ids())
        if not ids:
            return []
        for _ in range(50):   # a finished job stays COMPLETING a moment while its steps are reaped
            r = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(ids)], capture_output=True, text=True,
                               timeout=20)
            jobs = [f"slurm job {ln}" for ln in r.stdout.splitlines() if ln.strip()]
            if not jobs:
                return []
            time.sleep(0.2)
        return jobs
