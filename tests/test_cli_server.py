"""The fake CLI forked for its client by the node's CLI server behaves as the fake in an interpreter of
its own (issue 19; SPEC CLI-1..7, INV-6; gpujail/backends/cli_server.py), and so does the fake a bundled
implementation forks from itself (`cli_server.run_cli_forked`).

A worker's `nvidia-container-cli` is a bash client; in a node it asks the node's CLI server to fork
the fake for it. Each test runs the same command both ways in real kernel-backend nodes (`served`,
and `standalone`: GPUJAIL_CLI_SERVER removed from the environment, so the client runs the fake
itself) and asks for the same exit status, output, placeholders and mounts; and that a client the
server cannot stand in for, or one killed under its fake, is handled as a CLI process would be.
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from gpujail.backends import cli_server, kernel
from gpujail.fixtures.jail import make_jail
from gpujail.world import history

pytestmark = [pytest.mark.kernel, pytest.mark.unprivileged]

CONFIGURE = "nvidia-container-cli configure --compute --utility --device=all --ldconfig=/usr/bin/true"


def run(node, script: str, served: bool, env: dict | None = None):
    """`bash -c SCRIPT` in `node`, with the node's CLI server offered to its CLIs or not (the node
    adds the server's address to each start's environment: the script hides it from its CLIs)."""
    if not served:
        script = f"unset {cli_server.CLI_SERVER_ENV}; {script}"
    return node.run(["bash", "-c", script], env=node.contract_env(extra=env))


def fresh_node(tmp_path: Path, name: str):
    """A node of its own fleet on a jail of its own (so that each way starts from the same jail)."""
    fleet = kernel.Fleet.recording(make_jail(tmp_path / f"jail-{name}"), tmp_path / f"run-{name}")
    return fleet, fleet.start(name)


def tree(jail: Path) -> dict[str, tuple]:
    """Every path under the jail with its type, mode and size: what the CLI created there."""
    out = {}
    for p in sorted(jail.rglob("*")):
        if p.is_relative_to(jail / "proc") or p.is_relative_to(jail / "dev") or p.is_relative_to(jail / "run"):
            continue
        st = p.lstat()
        out[str(p.relative_to(jail))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size if p.is_file() else 0)
    return out


SCRIPTS = {
    "version": "nvidia-container-cli --version",
    "bad usage": "nvidia-container-cli bogus; echo rc=$?",
    "list": "nvidia-container-cli list",
    "list, stdin closed": "nvidia-container-cli list <&-",
    "info to stderr": "nvidia-container-cli info >&2",
    "configure": f"{CONFIGURE} $GPUJAIL_JAIL; echo rc=$?",
    "configure, umask 077, from /tmp": f"umask 077; cd /tmp; {CONFIGURE} $GPUJAIL_JAIL; echo rc=$?",
    "configure failing at a mount (CLI-6 cleanup)":
        f"GPUJAIL_FAILPOINTS='cli.after_mount=3*off->return(EIO)' {CONFIGURE} $GPUJAIL_JAIL; echo rc=$?",
    "killed by its failpoint": f"GPUJAIL_FAILPOINTS='cli.before_list=kill' {CONFIGURE} $GPUJAIL_JAIL; echo rc=$?",
    "through a wrapper (parent is the wrapper)": f"bash -c '{CONFIGURE} \"$GPUJAIL_JAIL\"; echo rc=$?'",
}


@pytest.mark.parametrize("script", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_a_cli_run_is_the_same_served_or_standalone(tmp_path, script):
    results = {}
    for served in (True, False):
        fleet, node = fresh_node(tmp_path, f"served-{served}")
        with fleet:
            r = run(node, script, served)
            jail = node.jail
            mounts = sorted(m["mountpoint"][len(str(jail)):] for m in node.mounts() if m["mountpoint"] != str(jail))
            cli = [e["kind"] for e in fleet.history() if e["kind"].startswith("cli.")]
            # bash names a killed child by pid, and the server takes a pid of the node's: not compared
            stderr = re.sub(r"^(bash: line \d+: +)\d+", r"\1PID", r.stderr.replace(str(jail), "JAIL"), flags=re.M)
            results[served] = (r.code, r.stdout.replace(str(jail), "JAIL"), stderr, tree(jail), mounts, cli)
    assert results[True] == results[False]


def cli_pids(fleet, node_id: str) -> list[int]:
    return [e["pid"] for e in history.select(fleet.history(), "cli.start", node=node_id)]


def test_a_served_cli_runs_in_a_forked_fake_and_a_standalone_one_in_its_client(fleet):
    """What the comparisons above rest on: served, the fake is another process than the client
    (forked by the server); standalone, the client became the fake (exec)."""
    node = fleet.start("w")
    for served in (True, False):
        r = run(node, f"{CONFIGURE} $GPUJAIL_JAIL & echo $!; wait $!", served)
        assert r.code == 0, r.stderr
        client = int(r.stdout.split()[0])
        assert (cli_pids(fleet, "w")[-1] != client) == served


def test_a_client_in_another_user_namespace_runs_the_fake_itself(fleet):
    """The fake's namespaces are its client's (its setns, its mounts): a client in a user namespace
    other than the server's is told to exec, and its fake runs in the client process."""
    node = fleet.start("w")
    r = run(node, f"unshare --user --map-root-user {CONFIGURE} $GPUJAIL_JAIL & echo $!; wait $!", True)
    client = int(r.stdout.split()[0])
    assert cli_pids(fleet, "w")[-1:] == [client], (r.stdout, r.stderr)


@pytest.mark.skipif(os.getuid() != 0, reason="changing uid needs root")
def test_a_client_of_another_user_gets_that_users_rights(fleet):
    """Served as the server's root, a `nobody` client's configure would mount; run as itself it
    cannot (no setns, no mount): it fails and the jail gets no mount."""
    node = fleet.start("w")
    before = node.mounts()
    r = run(node, f"setpriv --reuid 65534 --regid 65534 --clear-groups {CONFIGURE} $GPUJAIL_JAIL; echo rc=$?", True)
    assert r.stdout.strip() not in ("", "rc=0"), (r.stdout, r.stderr)
    assert node.mounts() == before


def test_a_client_killed_under_its_fake_takes_the_fake_with_it(fleet):
    """Killing the CLI process ends the CLI's work (INV-6): the fake forked for a client that was
    SIGKILLed dies too, and prints nothing after (its output would keep the start's pipe open)."""
    node = fleet.start("w")
    r = run(node, "GPUJAIL_FAILPOINTS='cli.before_list=sleep(1000)' timeout -s KILL 0.3 nvidia-container-cli list; "
                  "echo rc=$?; sleep 2", True)
    assert r.stdout == "rc=137\n", r.stdout
    assert "libnvidia-ml" not in r.stdout + r.stderr


def test_the_node_keeps_nothing_open_from_its_cli_runs(fleet):
    """The node's PID 1 serves every CLI run of every start: what it opened for one (connection,
    pidfds, the client's streams) is closed when the run or the start ends, however it ended."""
    node = fleet.start("w")
    script = ("nvidia-container-cli --version >/dev/null; "
              "GPUJAIL_FAILPOINTS='cli.before_list=sleep(1000)' timeout -s KILL 0.2 nvidia-container-cli list; "
              "GPUJAIL_FAILPOINTS='cli.before_list=kill' nvidia-container-cli list; "
              "nvidia-container-cli list >/dev/null & exit 0")   # the start ends under this last one
    assert run(node, script, True).code == 0
    before = sorted(os.listdir(f"/proc/{node.pid1}/fd"))
    for _ in range(3):
        assert run(node, script, True).code == 0
    assert sorted(os.listdir(f"/proc/{node.pid1}/fd")) == before


def test_a_cli_outside_any_node_runs_the_fake_itself(tmp_path):
    """No server (a vendor's own test, a shell on the host): the same client runs the fake in an
    interpreter of its own, and says what it is."""
    import subprocess

    from gpujail.fixtures import BIN
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", cli_server.CLI_SERVER_ENV: "127.0.0.1:1"}
    r = subprocess.run(["nvidia-container-cli", "--version"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("cli-version: "), r


# -- the fake a bundled implementation forks from itself ---------------------------------------------

RUN = """
import json, sys
from gpujail.backends import cli_server
from gpujail.world import sysops
if sys.argv[1] == "forked":
    sysops.run_without_exec = cli_server.run_cli_forked
print(json.dumps(sysops.RealSys().run(sys.argv[2:])))
"""

RUNS = {
    "list": (["nvidia-container-cli", "list"], {}),
    "configure": (CONFIGURE.split() + ["JAIL"], {}),
    "configure failing at a mount (CLI-6 cleanup)": (CONFIGURE.split() + ["JAIL"],
                                                     {"GPUJAIL_FAILPOINTS": "cli.after_mount=3*off->return(EIO)"}),
    "killed by its failpoint": (CONFIGURE.split() + ["JAIL"], {"GPUJAIL_FAILPOINTS": "cli.before_list=kill"}),
    "bad usage": (["nvidia-container-cli", "bogus"], {}),
}


@pytest.mark.parametrize("argv, env", RUNS.values(), ids=RUNS.keys())
def test_sysops_run_of_the_cli_is_the_same_forked_or_executed(tmp_path, argv, env):
    """`RealSys.run` of the bundled CLI in a node: forked from the calling process (what a bundled
    implementation forked warm does) or exec'd through the client, the same (exit status, stdout,
    stderr), with the same placeholders, mounts and CLI events."""
    results = {}
    for way in ("forked", "exec"):
        fleet, node = fresh_node(tmp_path, way)
        with fleet:
            jail = str(node.jail)
            r = node.run([sys.executable, "-c", RUN, way, *[a.replace("JAIL", jail) for a in argv]],
                         env=node.contract_env(extra=env))
            assert r.code == 0, r.stderr
            mounts = sorted(m["mountpoint"][len(jail):] for m in node.mounts() if m["mountpoint"] != jail)
            cli = [e["kind"] for e in fleet.history() if e["kind"].startswith("cli.")]
            results[way] = (json.loads(r.stdout.replace(jail, "JAIL")), tree(node.jail), mounts, cli)
    assert results["forked"] == results["exec"]
    if "kill" in env.get("GPUJAIL_FAILPOINTS", ""):
        assert results["forked"][0][0] == -9   # died of its signal, as an exec'd CLI does


def test_a_warm_reference_start_forks_its_cli_runs_itself(fleet):
    """The reference forked warm runs `list` and `configure` as its own children, with no client in
    between: in the node's fresh PID namespace they take the two pids after the implementation's
    (through the client, each run would take two: the client's and its fake's)."""
    from gpujail.contract import start_worker
    worker = start_worker(fleet, "w", "reference")
    assert worker.ready, worker.attempts[-1].stderr
    impl = history.select(fleet.history(), "impl.begin", node="w")[0]["pid"]
    assert cli_pids(fleet, "w") == [impl + 2]   # configure's (`list` records no cli.start)
