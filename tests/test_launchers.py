"""The launchers (gpujail/launchers/): the interface, the Slurm step's shape, the command's flags,
and cold-race through real agents: local processes always, Slurm when a cluster answers.

The Slurm tests need a controller: ./run-tests starts a one-host cluster for them
(scripts/slurm-cluster.sh, as root) and exports SLURM_CONF; without one they skip, saying so.
Shared slots of a run: the run directory (run.json, nodes/I/, barriers/, the history), the jail.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpujail import launchers
from gpujail.backends.kernel import precondition
from gpujail.launchers import slurm
from gpujail.spec import EXIT

NO_SLURM = launchers.unavailable("slurm")


def gpujail(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpujail", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_unknown_launcher_is_bad_input_in_one_line():
    assert launchers.unavailable("pbs").startswith("unknown launcher 'pbs'")
    with pytest.raises(ValueError, match="expected one of local, slurm, kubernetes"):
        launchers.get("pbs")
    r = gpujail("reproduce", "cold-race", "--launcher", "pbs")
    assert r.returncode == EXIT["bad-input"]
    assert r.stderr.strip() == "gpujail: --launcher 'pbs': expected one of local, slurm, kubernetes"


def test_slurm_without_a_controller_is_backend_unavailable(tmp_path):
    r = gpujail("reproduce", "cold-race", "--launcher", "slurm", env={"SLURM_CONF": str(tmp_path / "none.conf")})
    assert r.returncode == EXIT["backend"]
    if shutil.which("srun") is None:   # a fresh machine: ./run-tests installs Slurm only for its Slurm step
        assert r.stderr.strip() == "gpujail: --launcher slurm: no srun on PATH (Slurm's client commands: Debian's slurm-client)"
    else:
        assert r.stderr.strip() == (f"gpujail: --launcher slurm: SLURM_CONF={tmp_path / 'none.conf'}: no such file "
                                    "(scripts/slurm-cluster.sh start prints the one to use)")
    nodes = gpujail("reproduce", "cold-race", "--launcher", "slurm", "--nodes", "two")
    assert nodes.returncode == EXIT["bad-input"] and "--nodes 'two'" in nodes.stderr


def test_slurm_step_is_one_task_per_node_or_overcommitted(tmp_path):
    run = tmp_path / "run"
    one_each = slurm.Launcher(partition="gpu", account="ops").argv(run, 4)
    assert one_each[:1] == ["srun"] and one_each[one_each.index("--"):] == ["--", *launchers.agent_argv(run)]
    assert "--nodes 4 --ntasks-per-node 1 --partition=gpu --account=ops" in " ".join(one_each)
    shared = " ".join(slurm.Launcher(nodes="1").argv(run, 8))
    assert "--nodes 1 --ntasks 8 --overcommit" in shared and "--partition" not in shared


@pytest.mark.kernel
@pytest.mark.parametrize("launcher", ["local", pytest.param("slurm", marks=pytest.mark.skipif(
    bool(NO_SLURM), reason=f"no Slurm cluster here ({NO_SLURM}); ./run-tests starts one as root"))])
def test_cold_race_through_agents_catches_legacy_and_passes_reference(launcher, tmp_path):
    """cold-race (8 workers, barriers `race` and `cleanup` in DIR/barriers) with every node made by
    an agent the launcher started: legacy loses files (INV-1), reference is clean, and afterwards no
    agent, node, mount or Slurm job of the run is left."""
    if precondition():
        pytest.skip(precondition())
    flags = ["--launcher", launcher, *(["--nodes", "1"] if launcher == "slurm" else [])]
    scratch = tmp_path / "tmp"   # the runs' directories (and so every agent's and node's command line)
    scratch.mkdir()
    env = {"TMPDIR": str(scratch)}
    bad = gpujail("reproduce", "cold-race", "--impl", "legacy", "--out", str(tmp_path / "legacy"), *flags, env=env)
    assert bad.returncode == EXIT["failed"], bad.stdout + bad.stderr
    assert "INV-1 no lost content          FAIL" in bad.stdout
    good = gpujail("reproduce", "cold-race", "--impl", "reference", "--out", str(tmp_path / "reference"), *flags,
                   env=env)
    assert good.returncode == EXIT["passed"], good.stdout + good.stderr
    assert f"launcher {launcher}: clocks: 8 agents on 1 host(s)" in good.stdout
    for out in ("legacy", "reference"):
        clocks = (tmp_path / out / "clocks.json").read_text()
        assert '"same_clock": true' in clocks
    assert [p for p in _processes() if str(scratch) in p] == []
    assert os.listdir(scratch) == []   # the runs' directories were removed
    with open("/proc/self/mountinfo") as f:
        assert [m for m in f if str(tmp_path) in m] == []
    if launcher == "slurm":
        queue = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=30).stdout
        assert "gpujail-run-" not in queue, queue


def _processes() -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return out


@pytest.mark.skipif(bool(NO_SLURM), reason=f"no Slurm cluster here ({NO_SLURM}); ./run-tests starts one as root")
def test_a_partition_slurm_does_not_know_is_bad_input_in_one_line(tmp_path):
    """srun refuses the step (`Unable to allocate resources: Invalid partition name specified`): the
    run says so in one line naming the setting, exit 2 (a setting of the user's, not a failed agent),
    and leaves no job."""
    r = gpujail("reproduce", "cold-race", "--launcher", "slurm", "--nodes", "1", "--partition", "no-such-partition",
                "--out", str(tmp_path / "out"), env={"TMPDIR": str(tmp_path)})
    assert r.returncode == EXIT["bad-input"], r.stdout + r.stderr
    assert r.stderr == ("gpujail: scenario cold-race: srun: Slurm cannot allocate the agents' step: Invalid partition "
                        "name specified (--partition no-such-partition)\n"), r.stderr
    queue = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=30).stdout
    assert "gpujail-run-" not in queue, queue   # (a test beside it may hold its own, gpujail-held-PID)


@pytest.mark.skipif(bool(NO_SLURM), reason=f"no Slurm cluster here ({NO_SLURM}); ./run-tests starts one as root")
def test_a_step_slurm_keeps_queued_is_the_clusters_failure_and_leaves_no_job(tmp_path, monkeypatch):
    """The agents' step goes to a partition that is down: Slurm accepts it and keeps it queued. At
    the agents' deadline the run ends as the cluster's failure (LaunchFailed 'backend', exit 3) with
    srun's line, and the queued job is cancelled: it has no agent that could report its id."""
    from gpujail.fixtures.jail import make_jail
    from gpujail.launchers import LaunchFailed, coordinator
    partition = f"gpujail-held-{os.getpid()}"
    node = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, timeout=30).stdout.split()[0]
    made = subprocess.run(["scontrol", "create", f"PartitionName={partition}", f"Nodes={node}", "State=DOWN"],
                          capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    try:
        monkeypatch.setattr(coordinator, "HELLO_TIMEOUT", 5.0)
        fleet = launchers.fleet_class("slurm", agents=2, nodes="1", partition=partition).recording(
            make_jail(tmp_path / "jail"), tmp_path / "held")   # its job, gpujail-held-PID, is no other test's
        with pytest.raises(LaunchFailed) as failed:
            fleet.__enter__()
        assert failed.value.outcome == "backend"
        assert str(failed.value).startswith("agent 0 did not start within 5 s: srun: job "), str(failed.value)
        assert str(failed.value).endswith(" queued and waiting for resources"), str(failed.value)
        assert fleet.leftovers() == []
        queue = subprocess.run(["squeue", "-h", "-o", "%i %j", "-p", partition], capture_output=True, text=True,
                               timeout=30).stdout
        assert queue == "", queue
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={partition}"], capture_output=True, timeout=30)
