"""Tests for gpujail/world/events.py: the one schema of every history event, and the writer's
validation against it (on in the self-tests: tests/conftest.py sets GPUJAIL_VALIDATE_HISTORY)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_checker import good_run

from gpujail.backends import kernel
from gpujail.chaos import runner, scenario
from gpujail.world import events, history
from gpujail.world.events import KINDS, EventError

REPO = Path(__file__).resolve().parents[1]
EMITTERS = ["gpujail", "fixtures", "reference_impl", "chaos"]
# history.record("kind", ...), history.append(path, "kind", ...), and the harness's log("kind", ...)
EMIT = re.compile(r"""(?:history\.record\(|history\.append\([^,(){]+,\s*|\blog\()\s*["']([\w.]+)["']""")


def emitted_kinds() -> dict[str, list[str]]:
    """Every kind the code emits, with where (path:line), found by reading the source."""
    out: dict[str, list[str]] = {}
    for top in EMITTERS:
        for path in sorted((REPO / top).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                for kind in EMIT.findall(line):
                    out.setdefault(kind, []).append(f"{path.relative_to(REPO)}:{n}")
    return out


def test_every_emitted_kind_is_in_the_schema_and_every_listed_kind_is_emitted():
    found = emitted_kinds()
    assert {k: where for k, where in found.items() if k not in KINDS} == {}
    assert sorted(set(KINDS) - set(found)) == []
    for name, kind in KINDS.items():   # the table says who emits it: that is where it is emitted
        assert any(w.split(":")[0] in kind.emitter.split() for w in found[name]), (name, found[name])
        assert kind.meaning


def test_a_valid_history_passes():
    assert events.validate_history(good_run().events) == []
    events.validate("cli.cleanup.unlink", {"path": "/j/usr/lib/libcuda.so.1", "size": 0})
    events.validate("cli.cleanup.unlink", {"path": "/j/usr/lib/libcuda.so.1", "why": "symlink"})
    events.validate("worker.exit", {"code": "killed", "error": None})
    events.validate("impl.lock.acquired", {"lock": "etc/x.lock", "waited": 0})   # an int is a number


@pytest.mark.parametrize("kind,fields,field,problem", [
    ("worker.redy", {"attempt": 0}, None, "unknown kind"),
    ("worker.ready", {}, "attempt", "missing (required: int)"),
    ("worker.ready", {"attempt": "0"}, "attempt", "expected int, found str '0'"),
    ("worker.ready", {"attempt": True}, "attempt", "expected int, found bool True"),
    ("impl.placeholders", {"total": 4, "missing": 0, "present": 4}, "present", "unexpected field"),
    ("probe", {"results": [{"path": "/j/x", "attached": "yes", "size": 1}]}, "attached", "expected bool"),
    ("probe", {"results": [{"attached": True, "size": 1}]}, "path", "missing (required: str)"),
    ("failpoint", {"name": "cli.before_mount", "hit": 1, "action": "off"}, "arg", "missing"),
])
def test_a_wrong_event_is_an_error_naming_kind_and_field(kind, fields, field, problem):
    with pytest.raises(EventError) as e:
        events.validate(kind, fields)
    assert e.value.kind == kind and e.value.field == field and problem in e.value.problem
    assert str(e.value).startswith(f"event {kind!r}" + (f", field {field!r}" if field else ""))


def test_the_writer_names_the_emitting_line(tmp_path):
    """With validation on, `append` and `record` raise on a bad event, pointing at the line that
    emitted it (and through the harness's `log` helper, at its caller); the event is still written,
    so a history whose writer's error was swallowed fails `validate_history`."""
    path = str(tmp_path / "history.jsonl")
    line = sys._getframe().f_lineno + 2
    with pytest.raises(EventError, match=rf"event 'worker.ready', field 'atempt'.*test_events.py:{line} in "):
        history.append(path, "worker.ready", node="w1", atempt=0)

    def log(kind, **fields):
        history.append(path, kind, node="host", **fields)
    line = sys._getframe().f_lineno + 2
    with pytest.raises(EventError, match=rf"'chaos.bgin'.*in log, called from .*test_events.py:{line} in "):
        log("chaos.bgin")
    with pytest.raises(EventError, match="field 'rootfs': missing"):
        history.record("cli.start", argv=[])
    history.append(path, "worker.ready", node="w1", attempt=0)
    saved = history.load(path)
    assert [e["kind"] for e in saved] == ["worker.ready", "chaos.bgin", "worker.ready"]
    problems = events.validate_history(saved)
    assert len(problems) == 2 and "field 'atempt': unexpected field" in problems[0] and "'chaos.bgin'" in problems[1]


def test_validation_is_off_without_the_variable(tmp_path):
    """Production runs write without checking, and without even importing the schema."""
    code = ("import sys; from gpujail.world import history; history.append(sys.argv[1], 'no.such.kind', x=1);"
            "print('gpujail.world.events' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != history.VALIDATE_ENV}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "h.jsonl")], env=env, capture_output=True, text=True)
    assert (r.returncode, r.stdout.strip()) == (0, "False"), r.stderr
    assert json.loads((tmp_path / "h.jsonl").read_text())["kind"] == "no.such.kind"


def test_the_kernel_backend_passes_validation_on_to_its_nodes(tmp_path):
    assert os.environ[history.VALIDATE_ENV] == "1"
    assert kernel.Fleet(tmp_path).env[history.VALIDATE_ENV] == "1"


def test_the_schema_reads_as_a_table():
    rows = events.table().splitlines()
    assert len(rows) == 2 + len(KINDS) and rows[2].startswith("| `worker.start` | `impl:str` `attempt:int` |")


# -- real runs: every process validated what it wrote; the saved history validates again ----------

@pytest.mark.kernel
@pytest.mark.parametrize("name,impl", [("mixed-roles", "legacy"), ("lock-holder-killed", "reference")])
def test_a_real_chaos_run_writes_a_valid_history(name, impl, tmp_path):
    """A chaos run on the kernel backend: the harness, node agents, implementations, fake CLIs and
    failpoints all wrote with validation on (an invalid event would have failed the process that
    wrote it), and the saved history validates as a whole, envelope included."""
    result = runner.run(scenario.load(name), impl, tmp_path / "run")
    saved = history.load(str(result.history_path))
    assert events.validate_history(saved) == []
    seen = {e["kind"] for e in saved}
    assert {"chaos.begin", "chaos.end", "node.up", "worker.start", "worker.ready", "impl.start", "impl.exit",
            "probe", "failpoint", "cli.start", "cli.mount", "cli.exit", "impl.begin"} <= seen
    if impl == "legacy":   # the failing neighbour's CLI cleans up, the CPU workers mount dummies
        assert {"cli.fail", "cli.cleanup.umount", "cli.cleanup.unlink", "impl.dummy_mounts"} <= seen
    else:                  # the lock holder is killed at the barrier, others wait and take over
        assert {"chaos.kill", "chaos.release", "impl.placeholders", "impl.lock.wait", "impl.lock.acquired",
                "impl.marker"} <= seen
    assert not {e["kind"] for e in saved} - set(KINDS)


@pytest.mark.kernel
def test_the_fake_cli_writes_a_valid_history(fleet):
    """The fake CLI on a node, failing at its fourth mount: start, mkdir/create, mounts, the
    failpoint, the failure and its cleanup, the exit; every event validated when written."""
    node = fleet.start("w1")
    env = node.contract_env(extra={"GPUJAIL_FAILPOINTS": "cli.before_mount=3*off->return(EIO)"})
    r = node.cli("configure", "--compute", "--utility", "--device=all", str(fleet.jail), env=env)
    assert r.code == 1, r.stderr
    saved = fleet.history()
    assert events.validate_history(saved) == []
    assert {"cli.start", "cli.create", "cli.mount", "failpoint", "cli.fail", "cli.cleanup.umount",
            "cli.cleanup.unlink", "cli.exit"} <= {e["kind"] for e in saved}
