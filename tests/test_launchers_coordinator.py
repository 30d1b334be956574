"""The coordinator (gpujail/launchers/coordinator.py) as `gpujail run` and `gpujail reproduce` watch
it: the run's history grows while the run goes, and a launcher's failure keeps its exit code.

Real parts: agents are `python -m gpujail.launchers.agent` processes of the local launcher, their
nodes real mount and PID namespaces, the implementation the bundled reference, its CLI the fake with
a failpoint armed for the first attempt. Shared slots: the run directory (run.json, heartbeat, stop,
nodes/0/ with the agent's own history), and the run's history, DIR/history.jsonl, which the
coordinator writes and the progress line (`HistoryWatch`) reads while the run goes.
"""
import time

import pytest

from gpujail.backends.kernel import precondition
from gpujail.commands.progress import HistoryWatch
from gpujail.contract import RestartPolicy, start_worker
from gpujail.fixtures.jail import make_jail
from gpujail.launchers import coordinator, fleet_class
from gpujail.launchers.kubernetes import BadSetting, LaunchFailed
from gpujail.world import history

SKIP = precondition()


@pytest.mark.kernel
def test_faults_reach_the_runs_history_while_the_run_goes_and_once(tmp_path):
    """A failpoint fires in a CLI on an agent's node (the first attempt fails, the restart is
    ready). While the fleet is still up, the run's history already holds it, so the progress line
    counts it; after the end every event of the agent's history is in the run's exactly once."""
    if SKIP:
        pytest.skip(SKIP)
    run = tmp_path / "run"
    jail = make_jail(run / "jail")
    watch = HistoryWatch(lambda: [run / "history.jsonl"])
    with fleet_class("local", agents=1).recording(jail, run, 0) as fleet:
        w = start_worker(fleet, "w0", "reference", policy=RestartPolicy(max_restarts=1),
                         first_attempt_env={"GPUJAIL_FAILPOINTS": "cli.before_exit=1*return(EIO)"})
        assert w.ready and len(w.attempts) == 2, [a.error_line for a in w.attempts]
        deadline = time.monotonic() + 30   # the coordinator copies the agents' histories every MERGE_EVERY s
        while not watch.faults and time.monotonic() < deadline:
            watch.poll()
            time.sleep(0.05)
        assert watch.faults == 1, "the failpoint that fired is not in the run's history while the run goes"
        assert any(e["kind"] == "failpoint" and e["action"] == "return" for e in fleet.history())
    watch.poll()
    assert watch.faults == 1   # the end merged nothing twice
    merged = history.load(str(run / "history.jsonl"))
    own = history.load(str(run / "nodes" / "0" / "history.jsonl"))
    assert own and [e for e in own if merged.count(e) != 1] == []
    assert sum(e["kind"] == "failpoint" and e["action"] != "off" for e in merged) == 1


def test_a_launch_failure_keeps_its_outcome_through_the_runners_wrapping():
    """The chaos runner wraps a worker's failure (`worker w1 could not be started: ...` from it): the
    exit code is still the launcher's ('backend': the cluster cannot run the agents)."""
    unschedulable = LaunchFailed("backend", "pod p (agent index 1) cannot be scheduled")
    try:
        try:
            raise unschedulable
        except RuntimeError as e:
            raise RuntimeError(f"worker w1 could not be started: {e}") from e
    except RuntimeError as wrapped:
        assert coordinator.outcome(wrapped) == "backend"
    assert coordinator.outcome(BadSetting("--k8s-pvc: required")) == "bad-input"
    assert coordinator.outcome(LaunchFailed("error", "pod p failed")) == "error"
    assert coordinator.outcome(RuntimeError("agent 0 exited with code 1")) == "error"
