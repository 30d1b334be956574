"""A bundled implementation forked warm from its node behaves as the exec'd interpreter (issue 19; SPEC REF-11, INV-6).

gpujail/backends/node.py runs `python -S -m gpujail.reference_impl ...` in a child forked from the
node (its imports already done) instead of a new interpreter. Each test below starts real
kernel-backend nodes both ways (`GPUJAIL_WARM_STARTS=0` in a node's environment: exec every start)
and asks for the same exit code, output, history, timeout kill and outside writes; and that a
vendor's command is still exec'd as given.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from gpujail.backends import warm as warm_paths
from gpujail.contract import command_for
from gpujail.fixtures.jail import make_jail
from gpujail.spec import IMPL_EXIT

pytestmark = [pytest.mark.kernel, pytest.mark.unprivileged]


def start(fleet, monkeypatch, node_id: str, warm: bool):
    """A node whose bundled starts are forked warm (or exec'd): the agent reads it at its start."""
    monkeypatch.setenv(warm_paths.WARM_ENV, "1" if warm else "0")
    return fleet.start(node_id)


def kinds(fleet, node_id: str) -> list[str]:
    """The node's start events as the implementation and the CLIs record them, without pids or times."""
    return [e["kind"] for e in fleet.history() if e.get("node") == node_id and e["kind"] != "node.up"]


def children(pid1: int) -> dict[int, str]:
    """The processes whose parent is `pid1` (host pids), with their command lines."""
    found = {}
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid1:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    found[int(d)] = f.read().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_a_reference_start_is_the_same_forked_or_execd(fleet, jail, monkeypatch):
    argv = command_for("reference", str(jail), "w", "gpu-worker")
    prewarm = start(fleet, monkeypatch, "prewarm", False)   # both starts below then take the warm jail's path
    assert prewarm.run(argv, env=prewarm.contract_env()).code == 0
    results = {}
    for warm in (False, True):
        node = start(fleet, monkeypatch, f"w-{warm}", warm)
        results[warm] = node.run(argv, env=node.contract_env())
    assert results[True].code == results[False].code == 0, results
    assert (results[True].stdout, results[True].stderr) == (results[False].stdout, results[False].stderr)
    assert results[True].outside == results[False].outside == []
    assert kinds(fleet, "w-True") == kinds(fleet, "w-False")
    assert {"impl.begin", "cli.start", "impl.ready", "impl.exit"} <= set(kinds(fleet, "w-True"))


@pytest.mark.parametrize("args,code", [(["reference", "bogus-action"], IMPL_EXIT["bad-input"]),
                                       (["mutant:no-such-mutant"], IMPL_EXIT["bad-input"]), ([], IMPL_EXIT["bad-input"])],
                         ids=["bad-action", "unknown-mutant", "no-name"])
def test_bad_input_gives_the_same_code_and_line(fleet, monkeypatch, args, code):
    argv = [sys.executable, "-S", "-m", "gpujail.reference_impl", *args]
    results = {}
    for warm in (False, True):
        node = start(fleet, monkeypatch, f"w-{warm}", warm)
        results[warm] = node.run(argv, env=node.contract_env())
    assert results[True].code == results[False].code == code
    assert results[True].stderr == results[False].stderr and results[True].stderr.strip()


def test_a_missing_working_directory_fails_the_same(fleet, jail, tmp_path, monkeypatch):
    argv = command_for("reference", str(jail), "w", "gpu-worker")
    replies = {}
    for warm in (False, True):
        node = start(fleet, monkeypatch, f"w-{warm}", warm)
        replies[warm] = node.call("run", argv=argv, env=node.contract_env(), cwd=str(tmp_path / "gone"), timeout=30)
    assert replies[True]["code"] == replies[False]["code"] == 127
    assert replies[True]["stderr"] == replies[False]["stderr"]


def test_writes_outside_the_jail_are_caught_the_same(fleet, jail, tmp_path, monkeypatch):
    """A bundled implementation pointed at a directory outside the jail writes there: the node's
    copy-on-write view records it (and keeps the host as it was) whether the start was forked or exec'd."""
    elsewhere = make_jail(tmp_path / "not-the-jail")
    before = sorted(p.name for p in (elsewhere / "usr/lib/x86_64-linux-gnu").iterdir())
    argv = command_for("reference", str(jail), "w", "gpu-worker")
    outside = {}
    for warm in (False, True):
        node = start(fleet, monkeypatch, f"w-{warm}", warm)
        r = node.run(argv, env=node.contract_env(extra={"GPUJAIL_JAIL": str(elsewhere)}))
        outside[warm] = sorted((c["change"], c["path"]) for c in r.outside)
    assert outside[True] and outside[True] == outside[False], outside
    assert all(path.startswith(str(elsewhere)) for _, path in outside[True])
    assert sorted(p.name for p in (elsewhere / "usr/lib/x86_64-linux-gnu").iterdir()) == before


def test_a_bundled_start_is_forked_a_vendor_command_execd_and_both_killed_at_the_deadline(fleet, jail, monkeypatch):
    """While each start sleeps, the node's child is the forked node (its command line) for the
    bundled implementation and the command itself for a script; at the deadline both are killed
    with everything they started, and the node runs the next start."""
    node = start(fleet, monkeypatch, "w", True)
    slow = {"GPUJAIL_FAILPOINTS": "ref.before_list=sleep(60000)"}
    for argv, expect in ((command_for("reference", str(jail), "w", "gpu-worker"), "gpujail.backends.node"),
                         (["sh", "-c", "sleep 60 & sleep 60"], "sh -c sleep 60")):
        seen: dict[int, str] = {}
        done = threading.Event()

        def watch():
            # each child's latest command line, for as long as the start runs: a forked child shows
            # the node's until its exec, so the first sample alone could catch a vendor command
            # before its exec (seen in CI) or a bundled one wrongly exec'd before it
            while not done.is_set():
                seen.update({pid: cmd for pid, cmd in children(node.pid1).items() if cmd})   # a zombie's is ""
                time.sleep(0.01)
        t = threading.Thread(target=watch)
        t.start()
        r = node.run(argv, env=node.contract_env(extra=slow), timeout=2)
        done.set()
        t.join()
        assert r.code == "timeout", r
        assert "timeout after 2 s" in r.stderr
        assert [cmd for cmd in seen.values() if expect in cmd], (expect, seen)
        assert children(node.pid1) == {}, "a start outlived its deadline"
    assert node.run(["true"]).code == 0


def test_only_this_interpreter_running_a_bundled_module_from_this_gpujail_is_forked(jail):
    import gpujail  # the directory this gpujail was imported from first (a checkout, or site-packages)
    here = os.path.dirname(os.path.dirname(os.path.realpath(gpujail.__file__)))
    env = {"PYTHONPATH": os.pathsep.join([here, *sys.path]), "PYTHONDONTWRITEBYTECODE": "1"}
    bundled = [sys.executable, "-S", "-m", "gpujail.reference_impl", "reference"]
    assert warm_paths.warm_module(bundled, env, str(jail)) == "gpujail.reference_impl"
    assert warm_paths.warm_module(["sh", "-c", "true"], env, str(jail)) is None              # a vendor's command
    assert warm_paths.warm_module(["python3", *bundled[1:]], env, str(jail)) is None         # another interpreter
    assert warm_paths.warm_module([sys.executable, "-m", *bundled[2:]], env, str(jail)) is None   # with site
    assert warm_paths.warm_module(bundled, {**env, "PYTHONHASHSEED": "1"}, str(jail)) is None
    assert warm_paths.warm_module(bundled, {"PYTHONPATH": "/nonexistent"}, str(jail)) is None   # no gpujail there


def test_a_node_writes_the_bytecode_a_start_reads_once(tmp_path):
    """A checkout without bytecode (PYTHONDONTWRITEBYTECODE everywhere) gets it from the first node,
    before its namespaces; the next node finds it all written and writes nothing."""
    import gpujail
    for sub in ("gpujail", "fixtures", "reference_impl", "conformance"):
        if not (gpujail.ROOT / sub).is_dir():   # installed: they are inside gpujail/
            continue
        shutil.copytree(gpujail.ROOT / sub, tmp_path / sub, ignore=shutil.ignore_patterns("__pycache__"))
    code = "from gpujail.backends import node; node.write_bytecode()"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}

    def written() -> dict[str, float]:
        return {str(p): p.stat().st_mtime for p in tmp_path.rglob("*.pyc")}
    subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd="/", check=True)
    first = written()
    assert any(p.endswith(f"fake_cli.{sys.implementation.cache_tag}.pyc") for p in first)
    assert any(p.endswith(f"reference.{sys.implementation.cache_tag}.pyc") for p in first)
    subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd="/", check=True)
    assert written() == first
