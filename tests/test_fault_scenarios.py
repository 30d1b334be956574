"""Faults real clusters inject (issue 26, item 3): a lock holder stopped rather than killed, a lock lost
while its holder lives, a start killed inside a marker's write. Their mechanisms are tested here:

* the failpoint actions `stop(barrier)` (a real SIGSTOP, continued at the barrier's release) and
  `kill(write)` (a kill inside the process's next write(2)), on real subprocesses, and what a process
  they cannot act on (a simulated one, a shell's helper) gets instead (gpujail/world/failpoints.py);
* the runner's lock fault (chaos/nemesis.py `lose_lock`), its symlink swapped in during the run
  (`swap_link`, and INV-3 leaving the harness's own link out), and the scenario keys that drive them
  (`lock_faults`, `swapped_links`, `populate_at`, `barriers.open = "others-failed"`, `start_timeout`;
  chaos/scenario.py);
* the fault windows `stopped-holder`, `lock-lost`, `torn-marker`, `link-swapped` and
  `populate-while-ready` (chaos/checkers/windows.py) on synthetic histories;
Each new scenario catching the mutant with the bug it guards against is tests/test_chaos_kills.py's;
the passes against reference, direct and example-shell are chaos/test_scenarios.py's.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpujail.chaos import nemesis, scenario
from gpujail.chaos.checkers.hygiene import check_hygiene
from gpujail.chaos.checkers.queries import Run
from gpujail.chaos.checkers.windows import opened
from gpujail.chaos.scenario import LockFault, ScenarioError, SwappedLink
from gpujail.spec import LOCK
from gpujail.world import failpoints, history
from gpujail.world.failpoints import Barrier, FailpointSpecError, parse

REPO = Path(__file__).resolve().parents[1]

# A child that hits cli.before_mkdir once, then creates `path` exclusively and writes to it, as a
# marker is written (reference_impl/core.py place_marker -> Sys.write_new_beneath).
_CHILD = """
import os, sys
sys.path.insert(0, sys.argv[1])
from gpujail.world import failpoints

failpoints.hit("cli.before_mkdir", path=sys.argv[2])
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, b"nvidia-placeholder-marker\\n")
os.close(fd)
print("written", flush=True)
"""


def _child(spec: str, tmp_path: Path, target: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(REPO), str(target)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "GPUJAIL_FAILPOINTS": spec, "GPUJAIL_NODE": "child",
                                 "GPUJAIL_HISTORY": str(tmp_path / "child.jsonl"), **env})


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# -- the failpoint actions ---------------------------------------------------------------------

@pytest.mark.parametrize("spec,ok", [
    ("cli.before_mkdir=1*stop(b)", True),
    ("cli.before_mkdir=3*off->1*kill(write)", True),
    ("cli.before_mkdir=kill", True),
    ("cli.before_mkdir=stop", False),            # stop needs its barrier
    ("cli.before_mkdir=kill(now)", False),       # kill takes nothing or `write`
])
def test_stop_and_kill_at_write_parse(spec, ok, tmp_path, monkeypatch):
    monkeypatch.setenv(failpoints.BARRIERS_ENV, str(tmp_path))
    if ok:
        parse(spec)
    else:
        with pytest.raises(FailpointSpecError):
            parse(spec)


def test_stop_without_a_barrier_directory_is_a_spec_error(monkeypatch):
    monkeypatch.delenv(failpoints.BARRIERS_ENV, raising=False)
    with pytest.raises(FailpointSpecError, match="stop needs"):
        parse("cli.before_mkdir=stop(b)")


def test_stop_is_a_real_sigstop_continued_at_the_release(tmp_path):
    """`stop(b)`: the process is stopped (state T, as by SIGSTOP: it runs nothing, holds what it
    holds) once it has arrived at b, and goes on from the failpoint after the release."""
    barriers = tmp_path / "barriers"
    barriers.mkdir()
    target = tmp_path / "marker"
    p = _child("cli.before_mkdir=1*stop(b)", tmp_path, target, GPUJAIL_BARRIERS=str(barriers))
    try:
        b = Barrier("b", directory=str(barriers))
        b.wait_arrivals(1)
        deadline = time.monotonic() + 10
        while _state(p.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(p.pid) == "T", "the process must be stopped, not merely waiting"
        [arrival] = os.listdir(barriers)
        assert arrival.endswith(f".{p.pid}"), "the watcher arrives for the stopped process"
        time.sleep(0.2)
        assert _state(p.pid) == "T" and not target.exists()
        b.release()
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 0 and out == "written\n", err
    assert target.read_bytes() == b"nvidia-placeholder-marker\n"
    [event] = [e for e in history.load(str(tmp_path / "child.jsonl")) if e["kind"] == "failpoint"]
    assert (event["action"], event["arg"]) == ("stop", "b")


def test_kill_at_write_dies_between_the_exclusive_create_and_the_write(tmp_path):
    """`kill(write)`: the kill lands inside the next write(2), not at the failpoint: the exclusive
    create happened, nothing was written, no core file was left in the working directory."""
    target = tmp_path / "marker"
    p = _child("cli.before_mkdir=kill(write)", tmp_path, target)
    out, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGXFSZ and "written" not in out, (p.returncode, err)
    assert target.exists() and target.stat().st_size == 0, "a 0-byte marker is what the kill leaves"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["child.jsonl", "marker"]
    [event] = [e for e in history.load(str(tmp_path / "child.jsonl")) if e["kind"] == "failpoint"]
    assert (event["action"], event["arg"]) == ("kill", "write")


class _Simulated(failpoints.Process):
    """A process stop and kill(write) cannot act on (the model's, a shell's failpoint helper)."""
    died: str | None = None

    def die(self, action: str) -> None:
        self.died = action
        raise SystemExit(action)


def test_a_process_the_actions_cannot_act_on_gets_the_nearest_thing(tmp_path, monkeypatch):
    """kill(write) kills at the failpoint and is recorded as a plain kill (no torn write to count);
    stop pauses at the barrier."""
    hist = tmp_path / "h.jsonl"
    monkeypatch.setenv(history.ENV, str(hist))
    monkeypatch.setenv(failpoints.BARRIERS_ENV, str(tmp_path))
    monkeypatch.setenv(failpoints.ENV, "cli.before_mkdir=kill(write)")
    proc = _Simulated()
    failpoints.set_process(proc)
    try:
        with pytest.raises(SystemExit):
            failpoints.hit("cli.before_mkdir", path="x")
        assert proc.died == "kill"
        [event] = history.load(str(hist))
        assert (event["action"], event["arg"]) == ("kill", None)
        monkeypatch.setenv(failpoints.ENV, "cli.before_mkdir=stop(b)")
        Barrier("b", str(tmp_path)).release()   # released already: the pause returns at once
        failpoints.hit("cli.before_mkdir", path="x")
        assert any(f.name.startswith("b.arrived.") for f in tmp_path.iterdir())
    finally:
        failpoints.set_process(None)


# -- the lock fault ----------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["remove", "replace"])
def test_lose_lock_leaves_the_holder_its_flock_and_the_next_opener_another(tmp_path, fault):
    jail = tmp_path / "jail"
    (jail / "etc").mkdir(parents=True)
    path = jail / LOCK
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)
    events = []
    nemesis.lose_lock(jail, LockFault("resume", fault), "w0", lambda kind, **f: events.append((kind, f)))
    assert events == [("chaos.lock_fault", {"fault": fault, "lock": LOCK, "barrier": "resume", "holder": "w0",
                                             "existed": True})]
    assert path.exists() == (fault == "replace")
    other = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)   # granted at once: a second holder
        assert os.fstat(other).st_ino != os.fstat(holder).st_ino
    finally:
        os.close(other)
        os.close(holder)


def test_swap_link_moves_what_was_there_out_and_hygiene_leaves_the_link_out(tmp_path):
    jail, outside = tmp_path / "jail", tmp_path / "outside"
    (jail / "usr/lib/firmware/nvidia/550").mkdir(parents=True)
    outside.mkdir()
    events = []
    planted = nemesis.swap_link(jail, outside, SwappedLink("swap", "usr/lib/firmware/nvidia", "@OUTSIDE"), "w0",
                               lambda kind, **f: events.append((kind, f)))
    assert planted == "usr/lib/firmware/nvidia"
    assert os.readlink(jail / planted) == str(outside)
    assert (tmp_path / "swapped-aside" / "usr_lib_firmware_nvidia" / "550").is_dir()
    [(kind, fields)] = events
    assert kind == "chaos.link" and fields["moved"].endswith("usr_lib_firmware_nvidia")
    before = {"usr/lib/firmware/nvidia": [0o40755, 4096, None], "usr/lib/firmware/nvidia/550": [0o40755, 4096, None]}
    after = {"usr/lib/firmware/nvidia": [0o120777, 10, str(outside)]}
    final = {"jail_before": before, "jail_after": after, "outside_changes": []}
    assert check_hygiene(Run([], {**final, "planted": [planted]})).valid is True
    assert check_hygiene(Run([], final)).valid is False   # the same change by a worker is a violation


def test_scenario_keys_are_checked(tmp_path):
    def load(text: str):
        p = tmp_path / "s.toml"
        p.write_text('name = "s"\ngpu_workers = 2\n' + text)
        return scenario.load(p)

    sc = load('barriers = [{ name = "resume", open = "others-failed" }]\nstart_timeout = 12.5\n'
              'lock_faults = [{ barrier = "resume", fault = "replace" }]\npopulate_at = "resume"\n'
              'swapped_links = [{ barrier = "resume", path = "usr/lib/firmware/nvidia", target = "@OUTSIDE" }]\n')
    assert sc.barriers == ["resume"] and sc.barrier_opens == {"resume": "others-failed"}
    assert sc.start_timeout == 12.5 and sc.lock_faults == [LockFault("resume", "replace")]
    assert sc.populate_at == "resume" and sc.swapped_links == [SwappedLink("resume", "usr/lib/firmware/nvidia", "@OUTSIDE")]
    for bad, words in [('barriers = [{ name = "r", open = "never" }]\n', "open"),
                       ('barriers = [{ name = "r", opens = "others-failed" }]\n', "unknown key"),
                       ('barriers = [{ name = "r" }]\nlock_faults = [{ barrier = "r", fault = "burn" }]\n', "burn"),
                       ('lock_faults = [{ barrier = "nosuch" }]\n', "no barrier"),
                       ("start_timeout = 0\n", "start_timeout"),
                       ('populate_at = "nosuch"\n', "populate_at"),
                       ('barriers = [{ name = "r" }]\nswapped_links = [{ barrier = "r", path = "/etc", target = "x" }]\n',
                        "jail-relative"),
                       ('swapped_links = [{ barrier = "r", path = "etc", target = "x" }]\n', "no barrier"),
                       ('barriers = [{ name = "r" }]\nhost_upgrades = [{ worker = "w1", barrier = "r", '
                        'version = "550.54.15" }]\n', "must be another"),
                       ('barriers = [{ name = "r" }]\nhost_upgrades = [{ worker = "w9", barrier = "r", '
                        'version = "570.86.15" }]\n', "no GPU worker"),
                       ('host_upgrades = [{ worker = "w1", barrier = "r", version = "570.86.15" }]\n', "no barrier"),
                       ('jail_fs = "gluster"\nnet_faults = [{ fault = "lose-client", worker = "w1", barrier = "r" }]\n',
                        "net_faults: no barrier"),
                       ('net_faults = [{ fault = "kill-brick" }]\n', 'net_faults need jail_fs = "gluster"'),
                       ('jail_fs = "nodelocal-locks"\nnet_faults = [{ fault = "latency", ms = 5 }]\n',
                        "given nodelocal-locks"),
                       ('[worker_capabilities]\nw1 = "compute,vulkan"\n', "unknown capability 'vulkan'"),
                       ('[worker_capabilities]\nw7 = "compute"\n', "no worker 'w7'"),
                       ("fail_count = 1\n", "fail_count"),
                       ('mode = "random"\nfail_count = -1\n', "fail_count"),
                       ('mode = "random"\nfail_after = [5, 2]\n', "fail_after"),
                       ('mode = "random"\nfail_after = [0, 2]\n', "fail_after")]:
        with pytest.raises(ScenarioError, match=words):
            load(bad)


def test_one_random_cli_fault_is_exactly_one_and_fires():
    """cold-race-one-fault (issue 29's unscripted setup): every seed fails exactly one worker's CLI,
    picked by the seed, at a mount before its last (a compute start mounts 24 files); the same seed
    gives the same schedule, and cold-race-random's draws are unchanged by the new keys."""
    sc = scenario.load("cold-race-one-fault").with_workers(4)
    failing = []
    for seed in range(40):
        fails = {w: t for w, spec in sc.schedule(seed).items() for t in spec.split(";") if "EIO" in t}
        assert len(fails) == 1, (seed, fails)
        (w, term), = fails.items()
        assert 2 <= int(term.split("=")[1].split("*")[0]) <= 20
        failing.append(w)
    assert set(failing) == {"w0", "w1", "w2", "w3"}
    assert sc.schedule(7) == sc.schedule(7)
    assert scenario.load("cold-race-random").with_workers(2).schedule(4) == {
        "w0": "cli.before_mkdir=25%sleep(3);cli.before_mount=7*off->return(EIO);ref.before_configure=35%sleep(16)",
        "w1": "cli.before_mkdir=11%sleep(4);cli.before_mount=22%sleep(2);ref.before_configure=13%sleep(8)"}


def test_the_new_scenarios_load_with_their_windows():
    for name, window in [("lock-holder-stopped", "stopped-holder"), ("lock-lost", "lock-lost"),
                         ("marker-torn", "torn-marker"), ("links-swapped", "link-swapped"),
                         ("host-upgraded-mid-start", "host-upgraded-mid-start"),
                         (scenario.DIR / "known-failing/populate-live.toml", "populate-while-ready")]:
        sc = scenario.load(name)
        assert window in sc.windows


# -- the windows -------------------------------------------------------------------------------

def _e(t, kind, node="host", **f):
    return {"t": t, "kind": kind, "node": node, **f}


def _begin():
    return [_e(0.0, "chaos.begin", scenario="s", impl="x", seed=0, schedule={}),
            _e(0.1, "worker.start", "w0", impl="x", attempt=0), _e(0.1, "impl.begin", "w0", impl="x",
                                                                    role="gpu-worker", action="start"),
            _e(0.2, "impl.lock.acquired", "w0", lock=LOCK, waited=0.0)]


def test_window_stopped_holder():
    events = _begin() + [_e(0.3, "failpoint", "w0", name="ref.before_marker", hit=4, action="stop", arg="resume"),
                         _e(1.4, "worker.exit", "w1", code=3, error="lock not acquired"),
                         _e(1.5, "chaos.release", barrier="resume", arrived=["w0"])]
    assert opened("stopped-holder", Run(events, None))[0] is True
    late = [e for e in events if e["kind"] != "worker.exit"] + [_e(1.6, "worker.exit", "w1", code=3, error="x")]
    assert opened("stopped-holder", Run(sorted(late, key=lambda e: e["t"]), None))[0] is False
    unlocked = [e for e in events if e["kind"] != "impl.lock.acquired"]   # stopped, but not holding the lock
    assert opened("stopped-holder", Run(unlocked, None))[0] is False


def test_window_lock_lost():
    events = _begin() + [_e(0.3, "chaos.lock_fault", fault="remove", lock=LOCK, barrier="resume", holder="w0",
                            existed=True),
                         _e(0.5, "impl.lock.acquired", "w1", lock=LOCK, waited=0.0),
                         _e(0.9, "chaos.release", barrier="resume", arrived=["w0"])]
    ok, why = opened("lock-lost", Run(events, None))
    assert ok is True and "w1 took the lock" in why
    after = [e for e in events if not (e["kind"] == "impl.lock.acquired" and e["node"] == "w1")]
    after.append(_e(1.0, "impl.lock.acquired", "w1", lock=LOCK, waited=0.7))   # only once w0 went on
    assert opened("lock-lost", Run(after, None))[0] is False


def test_window_torn_marker():
    kill = _e(0.3, "failpoint", "w0", name="ref.before_marker", hit=4, action="kill", arg="write", path="usr/bin/x")
    events = _begin() + [kill, _e(0.31, "worker.exit", "w0", code=-25, error="")]
    assert opened("torn-marker", Run(events, None))[0] is True
    at_failpoint = _begin() + [{**kill, "arg": None}, _e(0.31, "worker.exit", "w0", code=-9, error="")]
    assert opened("torn-marker", Run(at_failpoint, None))[0] is False   # killed before the create


def test_window_link_swapped():
    events = _begin() + [_e(0.3, "chaos.link", path="usr/lib/firmware/nvidia", target="@OUTSIDE", barrier="swap",
                            arrived="w0", moved=""),
                         _e(0.5, "worker.exit", "w0", code=7, error="unsafe jail")]
    assert opened("link-swapped", Run(events, None))[0] is True
    before = [e for e in events if e["kind"] != "chaos.link"] + [{**events[4], "t": 0.6}]   # after every start ended
    assert opened("link-swapped", Run(sorted(before, key=lambda e: e["t"]), None))[0] is False


def test_window_populate_while_ready():
    events = _begin() + [_e(0.3, "worker.ready", "w0", attempt=0),
                         _e(0.5, "impl.populate_cleanup", "populate-live", removed=["usr/lib/x/libcuda.so.1"])]
    assert opened("populate-while-ready", Run(events, None))[0] is True
    nothing = events[:-1] + [{**events[-1], "removed": []}]
    assert opened("populate-while-ready", Run(nothing, None))[0] is False


def test_window_host_upgraded_mid_start():
    upgrade = _e(0.3, "chaos.upgrade", worker="w0", version="570.86.15", old="550.54.15", barrier="upgrade",
                 paths=["/usr/bin/nvidia-smi"])
    events = _begin() + [upgrade, _e(0.5, "worker.exit", "w0", code=5, error="not mounted after configure")]
    assert opened("host-upgraded-mid-start", Run(events, None))[0] is True
    other = _begin() + [{**upgrade, "worker": "w1"}, events[-1]]   # another host's: not under w0's start
    assert opened("host-upgraded-mid-start", Run(other, None))[0] is False


def test_hygiene_leaves_out_what_the_harness_upgraded_under_a_node():
    """A host upgrade (chaos.upgrade) writes the node's host view outside the jail: those paths, on
    that node, are the harness's; the same write by the start, or on another node, is REF-11's."""
    changes = [{"path": "/usr/bin/nvidia-smi", "change": "changed"}]
    upgrade = _e(0.3, "chaos.upgrade", worker="w0", version="570.86.15", old="550.54.15", barrier="upgrade",
                 paths=["/usr/bin/nvidia-smi"])
    final = {"jail_before": {}, "jail_after": {}, "outside_changes": []}
    upgraded = _begin() + [upgrade, _e(0.5, "impl.outside", "w0", changes=changes)]
    assert check_hygiene(Run(upgraded, final)).valid is True
    elsewhere = _begin() + [{**upgrade, "worker": "w1"}, _e(0.5, "impl.outside", "w0", changes=changes)]
    assert check_hygiene(Run(elsewhere, final)).valid is False


def test_every_guarded_scenario_and_its_mutant_exist():
    """scenario.GUARDS, the one table of which mutant each scenario guards against (the kill tests and
    the benchmarks read it), names only scenarios that load and mutants that exist."""
    from gpujail.reference_impl.mutants import MUTANTS
    for name, impl in scenario.GUARDS.items():
        scenario.load(name)
        assert impl.startswith("mutant:") and impl[len("mutant:"):] in MUTANTS, (name, impl)


def test_unscripted_drops_only_the_barriers_that_time_the_run():
    """A barrier where workers only pause is timing: unscripted() drops it, and its pause terms become
    `off`, so every fault still fires at the same hit. A barrier that carries a fault stays: a kill
    there (lock-holder-killed), a stop (lock-holder-stopped), a host upgrade (host-upgraded-mid-start),
    a system-call fault's pause (strace-mount-eio)."""
    cold = scenario.load("failing-neighbour")
    u = cold.unscripted()
    assert cold.barriers == ["late"] and u.barriers == []
    assert [f.term for f in cold.faults] == ["10*off->1*pause(late)->return(EIO)"]
    assert [f.term for f in u.faults] == ["10*off->1*off->return(EIO)"]
    for name in ("lock-holder-killed", "lock-holder-stopped", "strace-mount-eio"):
        sc = scenario.load(name)
        assert sc.unscripted() == sc, name
    upgraded = scenario.load("host-upgraded-mid-start").unscripted()
    assert upgraded.barriers == ["upgrade"] and all("pause(late)" not in f.term and "pause(order)" not in f.term
                                               for f in upgraded.faults)
    assert any("pause(upgrade)" in f.term for f in upgraded.faults)


def test_a_barrier_with_a_network_fault_opens_only_once_the_fault_began(tmp_path):
    """A network fault placed at a step (net_faults' `barrier`): with a worker held there and every
    other one finished, the keeper still waits for the fault (jailfs.fault, written by the fleet's
    injector), then opens the barrier at once: the held start always meets the fault."""
    p = tmp_path / "s.toml"
    p.write_text('name = "s"\ngpu_workers = 2\nbarriers = [{ name = "lost" }]\njail_fs = "gluster"\n'
                 'net_faults = [{ fault = "lose-client", worker = "w1", barrier = "lost" }]\n')
    sc = scenario.load(p)
    run = tmp_path / "run"
    (run / "barriers").mkdir(parents=True)
    hist = str(run / "history.jsonl")

    class Thread:
        def __init__(self, alive: bool):
            self.alive = alive

        def is_alive(self) -> bool:
            return self.alive

    (run / "barriers" / "lost.arrived.w1.123").touch()   # w1 held there, w0 finished
    log = lambda kind, **kw: history.append(hist, kind, node="host", **kw)   # noqa: E731
    keeper = threading.Thread(target=nemesis.keep_barriers, args=(sc, run, {"w0": Thread(False), "w1": Thread(True)},
                                                                 {}, log, None, None, None, sc.net_faults), daemon=True)
    keeper.start()
    released = (run / "barriers" / "lost.release").exists
    time.sleep(0.5)   # (the keeper looks every 2 ms: the old one had opened it by now)
    assert not released(), "opened before its network fault began"
    log("jailfs.fault", fault="lose-client", worker="w1", pids=[], barrier="lost", held=["w1"])
    keeper.join(timeout=30)
    assert released() and not keeper.is_alive()
    assert [e["kind"] for e in history.load(hist)] == ["jailfs.fault", "chaos.release"]
