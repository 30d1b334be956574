"""The node agent (`gpujail node`) and the coordinator that drives it through a run directory.

Real parts throughout: agents are `python -m gpujail node` processes started by the local launcher,
their nodes real mount and PID namespaces (the kernel backend's), the implementation the bundled
reference, the probes the real loader. The only shared slot between coordinator and agents is the
run directory: `run.json`, `heartbeat`, `stop`, and per agent `nodes/I/` (in/, out/, agent.json,
history.jsonl, result.json). One test puts an agent in a time namespace of its own (a monotonic
clock 1000 s ahead) to check that its history is moved onto the coordinator's clock.
"""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpujail.backends.file_channel import FileChannel
from gpujail.backends.kernel import precondition
from gpujail.contract import start_worker
from gpujail.fixtures.jail import make_jail
from gpujail.launchers import coordinator, fleet_class, local
from gpujail.launchers.agent import index_from_env
from gpujail.world import history

pytestmark = pytest.mark.kernel
SKIP = precondition()


@pytest.fixture
def jail(tmp_path):
    if SKIP:
        pytest.skip(SKIP)
    return make_jail(tmp_path / "run" / "jail")


def test_file_channel_answers_in_order_and_notices_a_dead_server(tmp_path):
    channel = FileChannel(str(tmp_path / "ch"))
    seqs = [channel.send({"n": n}) for n in range(3)]
    stop = threading.Event()
    got = []

    def serve():
        for seq, req in channel.requests(stop.is_set):
            got.append(req["n"])
            channel.reply(seq, {"twice": 2 * req["n"]})
    t = threading.Thread(target=serve)
    t.start()
    try:
        assert [channel.wait(s, timeout=10)["twice"] for s in seqs] == [0, 2, 4]
    finally:
        stop.set()
        t.join()
    assert got == [0, 1, 2]
    assert not os.listdir(tmp_path / "ch" / "in") and not os.listdir(tmp_path / "ch" / "out")
    with pytest.raises(RuntimeError, match="server gone"):   # nobody serves now: the caller learns why
        channel.call({"n": 9}, alive=lambda: "server gone")


def test_file_channels_keep_no_inotify_instance_once_gone(tmp_path):
    """A channel keeps its reply watches for the next call, and lets them go with it: a user has few
    inotify instances (128 by default), and a harness makes a channel per agent of every fleet."""
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))
    before = open_fds()
    for i in range(20):
        channel = FileChannel(str(tmp_path / f"ch{i}"))
        channel.reply(1, {"ok": True})
        assert channel.wait(1, timeout=10) == {"ok": True}
        del channel
    assert open_fds() == before


def test_index_comes_from_the_flag_then_slurm_then_kubernetes(monkeypatch):
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    assert index_from_env(None) == 0
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "5")
    assert index_from_env(None) == 5
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert index_from_env(None) == 3
    assert index_from_env(7) == 7


def test_agent_without_a_run_dir_says_so_and_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpujail", "node", "--run-dir", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"gpujail node: --run-dir {tmp_path / 'none'}: no run.json there "
                                             "(the coordinator writes it first)"]


def test_workers_started_through_agents_are_real_nodes_and_leave_nothing(jail, tmp_path):
    """Two agents, three workers (round robin: w0 and w2 on agent 0). Each becomes ready in a node
    of its own, and a GPU job in it loads the driver through the jail; a kill reaches the node's
    PID 1. Afterwards: the agents ended, their histories are in the run's, the node processes are
    gone."""
    run = tmp_path / "run"
    with fleet_class("local", agents=2).recording(jail, run, 0) as fleet:
        workers = [start_worker(fleet, f"w{i}", "reference") for i in range(3)]
        assert [w.ready for w in workers] == [True, True, True], [w.attempts[-1].stderr for w in workers]
        results = workers[0].node.probe([{"path": str(jail / "usr/lib/x86_64-linux-gnu/libcuda.so.1"), "load": True}])
        assert results[0]["loader"] == "ok", results
        pids = [w.node.pid1 for w in workers]
        assert all(Path(f"/proc/{p}").exists() for p in pids)
        workers[1].node.kill()   # answered once the agent saw PID 1 gone (kernel.Node.kill waits)
        assert not workers[1].node.alive and _zombie(pids[1])
        with pytest.raises(RuntimeError, match="not running"):
            workers[1].node.probe([])
    assert {json.loads((run / "nodes" / i / "result.json").read_text())["starts"] for i in "01"} == {2, 1}
    events = history.load(str(run / "history.jsonl"))
    assert {e["node"] for e in events if e["kind"] == "node.up"} == {"w0", "w1", "w2"}
    assert sum(e["kind"] == "worker.ready" for e in events) == 3
    # every node ended with its agent: polled (a loaded machine reaps late), where a node left
    # running, a namespace's PID 1 nobody kills, stays for good
    deadline = time.monotonic() + 30
    while (running := [p for p in pids if not _zombie(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running == []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_same_clock_is_measured_within_its_uncertainty(jail, tmp_path):
    """Agents on this machine share CLOCK_MONOTONIC: the offset measured at the rendezvous must lie
    within its own uncertainty of zero (the agent's reading falls inside the round trip), and is
    applied as 0."""
    with fleet_class("local", agents=2).recording(jail, tmp_path / "run", 0) as fleet:
        clocks = [a.clock for a in fleet.agents]
    for c in clocks:
        assert c["same_clock"] and c["offset"] == 0.0
        assert abs(c["measured_offset"]) <= c["uncertainty"] < 0.5
    assert json.loads((tmp_path / "run" / "clocks.json").read_text()) == clocks


def test_an_agent_on_another_clock_is_moved_onto_the_coordinators(jail, tmp_path, monkeypatch):
    """Agent 1 runs in a time namespace whose monotonic clock is 1000 s ahead (as a node whose clock
    differs). The rendezvous measures that offset within its uncertainty, and in the merged
    history the worker's events on that agent fall between the coordinator's own worker.start and
    worker.ready for it, not 1000 s later; a probe's `began` is moved with its `t`."""
    if os.getuid() != 0:
        pytest.skip("a time namespace needs root here")
    plain = local.agent_argv
    monkeypatch.setattr(local, "agent_argv", lambda run_dir, i: (
        ["unshare", "--time", "--fork", "--monotonic", "1000", "--"] if i == 1 else []) + plain(run_dir, i))
    run = tmp_path / "run"
    with fleet_class("local", agents=2).recording(jail, run, 0) as fleet:
        w = start_worker(fleet, "w0", "reference"), start_worker(fleet, "w1", "reference")
        assert [x.ready for x in w] == [True, True], [x.attempts[-1].stderr[-500:] for x in w]
        w[1].node.probe([{"path": "/etc/hostname"}])
        skewed = fleet.agents[1].clock
    assert not skewed["same_clock"], skewed
    assert abs(skewed["offset"] - 1000) <= skewed["uncertainty"] + 1e-3, skewed
    events = history.load(str(run / "history.jsonl"))
    start = next(e["t"] for e in events if e["kind"] == "worker.start" and e["node"] == "w1")
    ready = next(e["t"] for e in events if e["kind"] == "worker.ready" and e["node"] == "w1")
    own = [e["t"] for e in events if e["node"] == "w1" and e["kind"] in ("impl.start", "impl.exit")]
    assert len(own) == 2 and all(start - skewed["uncertainty"] <= t <= ready + skewed["uncertainty"] for t in own), \
        (skewed, start, own, ready)
    probe = next(e for e in events if e["node"] == "w1" and e["kind"] == "probe")
    assert ready - skewed["uncertainty"] <= probe["began"] <= probe["t"], (skewed, ready, probe)


def test_a_dead_agent_fails_the_call_instead_of_hanging(jail, tmp_path):
    run = tmp_path / "run"
    with fleet_class("local", agents=1).recording(jail, run, 0) as fleet:
        node = fleet.start("w0")
        fleet.launcher.procs[0].kill()
        with pytest.raises(RuntimeError, match="^agent 0 exited with code -9$"):   # one prefix
            node.run(["true"])


def test_an_orphaned_agent_ends_by_itself(jail, tmp_path, monkeypatch):
    """The coordinator died (no heartbeat): the agent kills its nodes and exits on its own."""
    monkeypatch.setattr("gpujail.launchers.agent.ORPHANED", 1.0)
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "run.json").write_text(json.dumps({"agents": 1, "env": {}}))
    (run / "heartbeat").write_text("0")
    from gpujail.launchers.agent import Agent
    agent = Agent(run, 0)
    t0 = time.monotonic()
    assert agent.serve() == 0
    assert 1.0 <= time.monotonic() - t0 < 30
    assert json.loads((run / "nodes/0/result.json").read_text())["starts"] == 0


def test_coordinator_leaves_its_directory_clean_of_requests(jail, tmp_path):
    """Every request and reply file is read and removed; the local launcher's request directory (a
    tmpfs of this machine, launchers/local.py) goes with the run."""
    run = tmp_path / "run"
    with fleet_class("local", agents=1).recording(jail, run, 0) as fleet:
        assert fleet.start("w0").run(["true"]).code == 0
        channels = Path(json.loads((run / "run.json").read_text())["channels"])
        assert os.listdir(channels / "0" / "in") == [] and os.listdir(channels / "0" / "out") == []
    assert not channels.exists() and not channels.is_relative_to(run)
    assert (run / "stop").exists()
    assert "1 agents on 1 host(s)" in coordinator.clock_line(json.loads((run / "clocks.json").read_text()))
