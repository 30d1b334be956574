"""run-tests' steps (scripts/steps.sh): each step's status and times, a TERM that stops the step
running at once instead of after it (a CI system stopping a job sends TERM to its top process, then
KILL after a grace; the cleanup must have stopped the steps and the daemon lane by then), and the
shared steps that two lanes take from one list."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def runs_steps(tmp_path: Path, body: str) -> Path:
    """A bash script that sets the traps run-tests' daemon lane sets, then runs `body`."""
    script = tmp_path / "runs-steps"
    script.write_text(f"source {REPO}/scripts/steps.sh\nstatus=0\n"
                      "trap 'stop_step; exit 130' INT TERM\n" + body + "\nexit $status\n")
    return script


def test_a_step_reports_its_times_and_its_failure(tmp_path):
    script = runs_steps(tmp_path, "step true\nstep sh -c 'exit 3'\nstep true\necho after: $status")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 1, out
    assert lines[0] == "== true" and lines[2] == "== sh -c exit 3" and lines[-1] == "after: 1"
    assert lines[3].startswith("== 0 s, CPU 0 s: sh -c exit 3"), lines


def test_a_term_to_the_script_stops_the_running_step_at_once_and_waits_for_its_teardown(tmp_path):
    pid_file, torn_down = tmp_path / "step.pid", tmp_path / "torn-down"
    step = (f"trap 'sleep 1; echo yes > {torn_down}; exit 143' TERM; echo $$ > {pid_file}; "
            "sleep 600 & wait")   # (a foreground sleep would defer the trap: pytest does not)
    script = runs_steps(tmp_path, f'step sh -c "{step}"\necho not stopped')
    log = tmp_path / "out"   # (not a pipe: reading it to its end would wait for the step too)
    proc = subprocess.Popen(["bash", str(script)], stdout=log.open("w"), start_new_session=True)
    stepper = None
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        stepper = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)   # to the script alone, as a CI system does
        proc.wait(timeout=30)   # the step sleeps 600 s: only a stopped step ends it sooner
        assert proc.returncode == 130 and "not stopped" not in log.read_text()
        assert torn_down.exists(), "the script ended before its step's teardown"
        for _ in range(100):   # (its parent reaped it, or init does)
            if not alive(stepper):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the step's process {stepper} outlived the script")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if stepper and alive(stepper):   # (the step group: the script's kill does not reach it)
            os.killpg(os.getpgid(stepper), signal.SIGKILL)


def test_two_lanes_share_the_steps_each_step_run_once(tmp_path):
    """Both lanes, started together, take steps from one list: every step runs exactly once, in
    list order within a lane, and each lane runs some (a failing one sets that lane's status)."""
    names = ["s1", "s2", "fails", "s4", "s5", "s6"]
    ran, claims = tmp_path / "ran", tmp_path / "claims"
    claims.mkdir()
    lane = runs_steps(tmp_path, f"""
shared_step() {{ step sh -c "echo $1 $LANE >> {ran}; sleep 0.2; [ $1 != fails ]"; }}
touch {tmp_path}/ready.$LANE
while [ ! -e {tmp_path}/ready.a ] || [ ! -e {tmp_path}/ready.b ]; do sleep 0.01; done
shared_steps {claims} {' '.join(names)}""")
    lanes = {name: subprocess.Popen(["bash", str(lane)], env={**os.environ, "LANE": name},
                                    stdout=subprocess.DEVNULL) for name in "ab"}
    try:
        codes = {name: proc.wait(timeout=60) for name, proc in lanes.items()}
    finally:   # a lane still running (a hang): its trap stops its step, as run-tests' cleanup does
        for proc in lanes.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    runs = [line.split() for line in ran.read_text().splitlines()]
    assert sorted(step for step, _ in runs) == sorted(names), runs
    by_lane = {name: [step for step, lane_name in runs if lane_name == name] for name in "ab"}
    assert all(by_lane.values()), by_lane
    for taken in by_lane.values():
        assert taken == sorted(taken, key=names.index)
    assert {name: code != 0 for name, code in codes.items()} == {name: "fails" in by_lane[name] for name in "ab"}


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
