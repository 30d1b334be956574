"""Tests for gpujail/failpoints.py: the gofail-style fault injection every chaos run relies on (SPEC CLI-8).

Pure tests: no kernel backend, no mount. Each test gets its own history file and barrier directory and
forgets the failpoints the previous test armed (parsing is cached per process and spec).
"""
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpujail.world import failpoints, history
from gpujail.world.failpoints import Barrier, FailpointSpecError, parse

REPO = Path(__file__).resolve().parents[1]

NAME = "cli.before_mkdir"


@pytest.fixture
def armed(tmp_path, monkeypatch):
    """arm(spec) arms failpoints for this process, as GPUJAIL_FAILPOINTS does for a CLI; events()
    reads back what the history recorded."""
    hist = tmp_path / "history.jsonl"
    monkeypatch.setenv(history.ENV, str(hist))
    monkeypatch.setenv(failpoints.BARRIERS_ENV, str(tmp_path))
    monkeypatch.setenv("GPUJAIL_NODE", "n1")
    monkeypatch.delenv("GPUJAIL_SEED", raising=False)

    def arm(spec):
        monkeypatch.setenv(failpoints.ENV, spec)
        failpoints.set_process(failpoints.Process())  # a fresh process: hit counts start at 0

    arm.events = lambda: [e for e in history.load(str(hist)) if e["kind"] == "failpoint"]
    yield arm
    failpoints.set_process(None)


def outcomes(n, name=NAME):
    """What the next n hits of `name` do: None (passed) or the errno they raised."""
    out = []
    for _ in range(n):
        try:
            failpoints.hit(name)
            out.append(None)
        except OSError as e:
            out.append(e.errno)
    return out


# -- grammar -------------------------------------------------------------------------------------

def test_percent_miss_falls_through_to_the_next_term(armed):
    """CLI-8, gofail runtime/terms.go: a `P%term` that misses lets the hit fall through to the next
    term of the chain (it is not an `off`): every hit here fails, with EIO or with ENOSPC."""
    armed("cli.before_mkdir=50%return(EIO)->return(ENOSPC)")
    got = outcomes(64)
    assert set(got) == {errno.EIO, errno.ENOSPC}, got


def test_count_and_percent_combine(armed):
    """CLI-8: `N*P%term` needs both mods (gofail's modList): it can fire only within its first N
    hits, each with probability P; after those N hits the chain moves on."""
    armed("cli.before_mkdir=4*100%return(EIO)->return(ENOSPC)")
    assert outcomes(6) == [errno.EIO] * 4 + [errno.ENOSPC] * 2
    armed("cli.before_mkdir=4*0%return(EIO)->off")
    assert outcomes(6) == [None] * 6


@pytest.mark.parametrize("spec, expected", [
    ("cli.before_mkdir=off", [("off", None, None, None)]),
    ("cli.before_mkdir=return(EIO)", [("return", "EIO", None, None)]),
    ('cli.before_mkdir=return("disk on fire")', [("return", '"disk on fire"', None, None)]),
    ("cli.before_mkdir=sleep(5)", [("sleep", "5", None, None)]),
    ("cli.before_mkdir=pause(race)", [("pause", "race", None, None)]),
    ("cli.before_mkdir=kill", [("kill", None, None, None)]),
    ("cli.before_mkdir=panic", [("panic", None, None, None)]),
    ("cli.before_mkdir=print", [("print", None, None, None)]),
    ("cli.before_mkdir=1*pause(race)", [("pause", "race", 1, None)]),
    ("cli.before_mkdir=25%return(ENOSPC)", [("return", "ENOSPC", None, 25.0)]),
    ("cli.before_mkdir=12.5%print", [("print", None, None, 12.5)]),
    ("cli.before_mkdir=2*off->return(EIO)", [("off", None, 2, None), ("return", "EIO", None, None)]),
    ("cli.before_mkdir=3*50%return(EIO)", [("return", "EIO", 3, 50.0)]),
    ("cli.before_mkdir=1*sleep(50)->3*print->kill", [("sleep", "50", 1, None), ("print", None, 3, None),
                                                     ("kill", None, None, None)]),
    (" cli.before_mkdir = 1*off -> return(EIO) ", [("off", None, 1, None), ("return", "EIO", None, None)]),
])
def test_parse_accepts_the_gofail_grammar(spec, expected, monkeypatch, tmp_path):
    """CLI-8: NAME=TERM chains, `N*term`, `P%term`, actions off/return/sleep/pause/kill/panic/print."""
    monkeypatch.setenv(failpoints.BARRIERS_ENV, str(tmp_path))
    points = parse(spec)
    assert list(points) == [NAME]
    assert [(t.action, t.arg, t.count, t.percent) for t in points[NAME].terms] == expected


def test_parse_several_entries(monkeypatch, tmp_path):
    """CLI-8: `NAME=TERM;NAME=TERM` arms several failpoints; empty entries (a trailing `;`) are ignored."""
    monkeypatch.setenv(failpoints.BARRIERS_ENV, str(tmp_path))
    points = parse("cli.before_mkdir=1*pause(race);cli.after_mount=2*off->return(EIO);")
    assert sorted(points) == ["cli.after_mount", "cli.before_mkdir"]
    assert parse("") == {}


@pytest.mark.parametrize("spec, where, why", [
    ("cli.before_mkdir", "'cli.before_mkdir' at offset 0", "expected NAME=TERM"),
    ("cli.before_mkdir=frob", "at offset 0", "unknown action 'frob'"),
    ("cli.before_mkdir=return", "at offset 0", "return needs an argument"),
    ("cli.before_mkdir=pause", "at offset 0", "pause needs an argument"),
    ("cli.before_mkdir=sleep(soon)", "at offset 0", "sleep takes milliseconds, got 'soon'"),
    ("cli.before_mkdir=return(ENOTANERRNO)", "at offset 0", "return takes an errno name or a quoted message"),
    ("cli.before_mkdir=2*", "at offset 0", "bad term '2*'"),
    ("cli.before_mkdir=off->", "at offset 0", "bad term ''"),
    ("cli.before_mkdir=return(EIO", "at offset 0", "bad term 'return(EIO'"),
    ("cli.before_mkdir=off;cli.after_mount=((", "'cli.after_mount=((' at offset 21", "bad term '(('"),
])
def test_malformed_specs_say_where_parsing_stopped(spec, where, why):
    """CLI-8: a malformed spec raises FailpointSpecError naming the entry, its offset and the reason,
    so the CLI can print one line and exit 1 before touching anything."""
    with pytest.raises(FailpointSpecError) as exc:
        parse(spec)
    msg = str(exc.value)
    assert msg.startswith("GPUJAIL_FAILPOINTS: cannot parse"), msg
    assert where in msg and why in msg, msg
    assert "\n" not in msg


def test_unknown_failpoint_names_are_rejected():
    """CLI-8: only registered names; a typo must not silently arm nothing."""
    with pytest.raises(FailpointSpecError, match=r"unknown failpoint 'cli\.before_mkdri'"):
        parse("cli.before_mkdri=return(EIO)")
    assert all(name.startswith(("cli.", "ref.", "cdi.")) for name in failpoints.REGISTRY)


# -- evaluation ----------------------------------------------------------------------------------

def test_counted_chain_fires_exactly_on_the_third_hit(armed):
    """CLI-8: `2*off->return(EIO)` lets two hits pass, fails the 3rd, and (last term, no count) every
    later one; each hit is recorded in the history with its number and action."""
    armed("cli.before_mkdir=2*off->return(EIO)")
    assert outcomes(4) == [None, None, errno.EIO, errno.EIO]
    assert [(e["name"], e["hit"], e["action"], e["arg"]) for e in armed.events()] == [
        (NAME, 1, "off", None), (NAME, 2, "off", None), (NAME, 3, "return", "EIO"), (NAME, 4, "return", "EIO")]
    assert {e["node"] for e in armed.events()} == {"n1"}


def test_exhausted_chain_turns_off_and_other_names_never_fire(armed):
    """CLI-8: `1*return(ENOSPC)` fails once only; unarmed failpoints pass and record nothing."""
    armed("cli.before_mkdir=1*return(ENOSPC)")
    assert outcomes(3) == [errno.ENOSPC, None, None]
    assert outcomes(2, "cli.before_mount") == [None, None]
    assert [(e["hit"], e["action"]) for e in armed.events()] == [(1, "return"), (2, "off"), (3, "off")]


@pytest.mark.parametrize("spec, codes", [
    ("1*off", [3, 3]),                          # (a script calls for an armed name only)
    ("2*off->1*return(EIO)", [0, 0, 1, 3]),     # spent once the return has fired
    ("2*off->return(EIO)", [0, 0, 1, 1]),       # a term without a count never is
    ("1*return(EIO)->50%return(EIO)", None),    # nor a P% one: 1 or 0 by the draws, never 3
])
def test_a_scripts_helper_says_when_no_later_hit_can_act(tmp_path, spec, codes):
    """fixtures/bin/gpujail-failpoint, called as example.sh calls it for hits 1, 2, ...: exit 3 once
    the hit passed and the chain allows no later action, so the script stops starting a Python
    helper per marker; 1 is the injected error. Under --schedule every hit is a scheduling point,
    so never 3 (a socket nobody listens on: the hit goes on at once)."""
    env = {**os.environ, failpoints.ENV: f"{NAME}={spec}", history.ENV: str(tmp_path / "h.jsonl"),
           "GPUJAIL_NODE": "n1"}
    env.pop(failpoints.SCHEDULER_ENV, None)

    def helper(hit, **extra):
        return subprocess.run([REPO / "fixtures/bin/gpujail-failpoint", NAME, str(hit), "x"], env={**env, **extra},
                              capture_output=True, timeout=60).returncode
    got = [helper(n) for n in range(1, 7 if codes is None else len(codes) + 1)]
    assert got == codes if codes else got[0] == 1 and set(got) <= {0, 1}, got
    assert helper(1, **{failpoints.SCHEDULER_ENV: str(tmp_path / "none.sock")}) != 3


def test_return_raises_like_the_syscall(armed):
    """CLI-8: `return(ERRNO)` is an OSError as the failing syscall would raise (path from the context);
    `return("msg")` an EIO carrying the message."""
    armed("cli.before_mkdir=return(EEXIST);cli.before_mount=return(\"quota exceeded\")")
    with pytest.raises(FileExistsError) as exc:
        failpoints.hit(NAME, path="/jail/usr/lib/firmware")
    assert exc.value.filename == "/jail/usr/lib/firmware"
    with pytest.raises(OSError) as exc:
        failpoints.hit("cli.before_mount")
    assert exc.value.errno == errno.EIO and exc.value.strerror == "quota exceeded"
    assert [e.get("path") for e in armed.events()] == ["/jail/usr/lib/firmware", None]


def test_off_sleep_and_print_return_normally(armed, capsys):
    """CLI-8: `off` and `sleep(ms)` only record; `print` writes the failpoint name to stderr."""
    armed("cli.before_mkdir=1*off->1*sleep(5)->print")
    assert outcomes(3) == [None, None, None]
    assert capsys.readouterr().err == f"failpoint {NAME} hit 3\n"
    assert [(e["action"], e["arg"]) for e in armed.events()] == [("off", None), ("sleep", "5"), ("print", None)]


def test_percent_terms_are_seeded_per_node(armed, monkeypatch):
    """CLI-8: `P%term` fires with probability P from a generator seeded by GPUJAIL_SEED and the node, so
    a failing chaos run replays exactly from its seed."""
    armed("cli.before_mkdir=50%return(EIO)")
    first = outcomes(64)
    armed("cli.before_mkdir=50%return(EIO)")
    assert outcomes(64) == first
    assert set(first) == {None, errno.EIO}
    monkeypatch.setenv("GPUJAIL_SEED", "7")
    armed("cli.before_mkdir=50%return(EIO)")
    assert outcomes(64) != first
    armed("cli.before_mkdir=100%return(EIO)")
    assert outcomes(5) == [errno.EIO] * 5
    armed("cli.before_mkdir=0%return(EIO)")
    assert outcomes(5) == [None] * 5


_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gpujail.world import failpoints

failpoints.hit("cli.before_mkdir", path="/jail/x")
print("passed", flush=True)
"""


def _child(spec, tmp_path, **env):
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(REPO)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "GPUJAIL_FAILPOINTS": spec, "GPUJAIL_NODE": "child",
                                 "GPUJAIL_HISTORY": str(tmp_path / "child.jsonl"), **env})


@pytest.mark.parametrize("action, signal_number", [("kill", 9), ("panic", 6)])
def test_kill_and_panic_end_the_process_without_cleanup(tmp_path, action, signal_number):
    """CLI-8: `kill` is SIGKILL, `panic` SIGABRT: the process dies at the failpoint (no cleanup runs),
    after the hit was recorded."""
    p = _child(f"cli.before_mkdir={action}", tmp_path)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == -signal_number and "passed" not in out
    [event] = history.load(str(tmp_path / "child.jsonl"))
    assert (event["kind"], event["name"], event["action"], event["node"]) == ("failpoint", NAME, action, "child")


def _released_after_arrival(spec: str, tmp_path) -> tuple[subprocess.Popen, str, str]:
    """Run a child armed with `spec` on barrier `b`; once it has arrived (and is still waiting),
    release it. The child, its stdout and stderr."""
    barriers = tmp_path / "barriers"
    barriers.mkdir()
    p = _child(spec, tmp_path, GPUJAIL_BARRIERS=str(barriers))
    try:
        barrier = Barrier("b", directory=str(barriers))
        barrier.wait_arrivals(1)
        assert p.poll() is None, "the paused process must still be waiting"
        assert barrier.arrivals() == 1
        barrier.release()
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    return p, out, err


def test_barrier_round_trip_with_a_subprocess(tmp_path):
    """CLI-8: `pause(b)` blocks the process at the failpoint until the harness sees it arrive and
    releases the barrier: how a chaos test lines up N CLIs in the same window."""
    p, out, err = _released_after_arrival("cli.before_mkdir=pause(b)", tmp_path)
    assert p.returncode == 0 and out == "passed\n", err
    [event] = history.load(str(tmp_path / "child.jsonl"))
    assert (event["action"], event["arg"], event["path"]) == ("pause", "b", "/jail/x")


def test_wait_pauses_then_the_same_hit_goes_on_down_the_chain(tmp_path):
    """CLI-8: `1*wait(b)->return(EIO)` blocks the hit like `pause(b)` and, once released, fails that
    same hit: a step hit only once (cli.before_exit) can wait for its moment and then fail."""
    p, out, err = _released_after_arrival("cli.before_mkdir=1*wait(b)->return(EIO)", tmp_path)
    assert p.returncode != 0 and "passed" not in out and "Input/output error" in err, err
    events = history.load(str(tmp_path / "child.jsonl"))
    assert [(e["hit"], e["action"], e["arg"]) for e in events] == [(1, "wait", "b"), (1, "return", "EIO")]


def test_barrier_needs_a_directory(monkeypatch):
    """CLI-8: a `pause` without GPUJAIL_BARRIERS is a spec error when the spec is parsed (before
    anything is touched), not a hang or a failure half-way through a mount batch."""
    monkeypatch.delenv(failpoints.BARRIERS_ENV, raising=False)
    with pytest.raises(FailpointSpecError, match="GPUJAIL_BARRIERS"):
        Barrier("b")
    with pytest.raises(FailpointSpecError, match="GPUJAIL_BARRIERS"):
        parse("cli.before_mkdir=pause(b)")
