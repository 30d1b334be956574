"""The docker backend's own pieces (issue 7): containers as nodes, the cached worker image, and
what happens when the engine fails us. The conformance and chaos suites run on top of it with
`--backend docker` (./run-tests); these check what those suites take for granted.

Every test skips, with the reason, where no Docker Engine answers (scripts/with-dockerd.sh starts
one as root). The daemon test starts a private engine of its own and stops it by its pid.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gpujail.backends import docker_backend, docker_image
from gpujail.backends.probes import gpu_files, problems
from gpujail.contract import RestartPolicy, start_worker
from gpujail.fixtures.jail import make_jail
from gpujail.world.failpoints import Barrier

pytestmark = pytest.mark.skipif(docker_backend.precondition() is not None,
                                reason=str(docker_backend.precondition()))


@pytest.fixture
def dfleet(jail, run_dir):
    with docker_backend.Fleet.recording(jail, run_dir) as f:
        yield f
    assert f.leftovers() == [] and f.engine_errors == []


def container_names(fleet) -> list[str]:
    return [c.name for c in docker_backend.containers_of(docker_backend.client(), fleet.id)]


def test_worker_is_a_container_with_the_contract_view(dfleet, jail):
    """SPEC section 5 in a container: the implementation is the container's command, with the
    contract's environment and the jail as working directory, in the container's own mount and PID
    namespaces, with CAP_SYS_ADMIN but not privileged and without network; a GPU job there sees
    every driver file through the shared jail."""
    w = start_worker(dfleet, "w", "reference")
    assert w.ready, w.attempts[-1].stderr
    assert problems(w.node.probe(gpu_files(jail))) == []
    config = w.node.container.attrs["Config"]
    assert config["Cmd"] == [docker_image.PYTHON, "-S", "-m", "gpujail.reference_impl", "reference"]
    assert config["WorkingDir"] == str(jail) and {"GPUJAIL_NODE=w", f"GPUJAIL_JAIL={jail}"} <= set(config["Env"])
    host = w.node.container.attrs["HostConfig"]
    assert (host["Privileged"], host["CapAdd"], host["NetworkMode"]) == (False, ["SYS_ADMIN"], "none")
    r = w.node.run(["readlink", "/proc/self/ns/mnt", "/proc/self/ns/pid"])
    assert r.code == 0 and set(r.stdout.split()).isdisjoint({os.readlink("/proc/self/ns/mnt"),
                                                             os.readlink("/proc/self/ns/pid")})
    assert str(jail) + "/" not in Path("/proc/self/mountinfo").read_text()   # nothing in the host's view


def test_restart_is_a_new_container(dfleet):
    """A failing start is restarted as a new container; the failed one is gone."""
    nodes = []
    w = start_worker(dfleet, "w", "reference", policy=RestartPolicy(max_restarts=1),
                     first_attempt_env={"GPUJAIL_FAILPOINTS": "cli.before_list=return(EIO)"}, on_node=nodes.append)
    assert [a.code for a in w.attempts][1:] == [0] and w.attempts[0].code != 0
    names = [n.container.name for n in nodes]
    assert len(set(names)) == 2 and container_names(dfleet) == [names[1]]


def test_vendor_script_outside_the_repository(dfleet):
    """`--impl 'sh /somewhere/mine.sh -j {jail}'`: the script's directory is mounted read-only into
    the container at its host path, and the command runs as given."""
    vendor = Path(tempfile.mkdtemp(prefix="gpujail-vendor-"))
    try:
        (vendor / "mine.sh").write_text('#!/bin/sh\n[ "$1" = -j ] && [ "$2" = "$GPUJAIL_JAIL" ] || exit 2\n'
                                        "exec python3 -S -m gpujail.reference_impl reference\n")
        w = start_worker(dfleet, "w", f"sh {vendor}/mine.sh -j {{jail}}")
        assert w.ready, w.attempts[-1].stderr
        assert {"Source": str(vendor), "Destination": str(vendor), "RW": False} in [
            {k: m[k] for k in ("Source", "Destination", "RW")} for m in w.node.container.attrs["Mounts"]]
    finally:
        shutil.rmtree(vendor)


def test_image_is_cached_by_content_hash():
    """The image is imported once per set of inputs: asking again finds it, a changed input names
    another tag, and only one gpujail-worker image is kept."""
    client = docker_backend.client()
    tag = docker_image.ensure(client)
    image_id = client.images.get(tag).id
    assert docker_image.ensure(client) == tag and client.images.get(tag).id == image_id
    files = docker_image.inputs()
    changed = dict(files, **{"usr/bin/cat": files["usr/bin/tail"]})
    assert docker_image.tag_for(changed) != tag
    assert [t for i in client.images.list(name=docker_image.REPOSITORY) for t in i.tags] == [tag]


def test_image_build_failure_is_one_line_and_leaves_nothing():
    """An input the host lacks: one line naming it, and no image left behind."""
    client = docker_backend.client()
    images = {i.id for i in client.images.list(all=True)}
    with pytest.raises(docker_image.ImageError) as e:
        docker_image.ensure(client, tools=(*docker_image.TOOLS, "gpujail-no-such-tool"))
    assert "gpujail-no-such-tool" in str(e.value) and "\n" not in str(e.value)
    assert {i.id for i in client.images.list(all=True)} == images


def test_container_killed_by_the_engine(dfleet, run_dir):
    """The engine kills a worker's container while its implementation runs (held at a failpoint
    barrier): the attempt ends as `killed` with one line naming the container, the restart is a new
    container that becomes ready, and nothing of the killed one is left."""
    client = docker_backend.client()
    nodes = []
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("w", start_worker(
        dfleet, "w", "reference", policy=RestartPolicy(max_restarts=1), on_node=nodes.append,
        first_attempt_env={"GPUJAIL_FAILPOINTS": "cli.before_list=pause(hold)"})))
    t.start()
    Barrier("hold", str(run_dir / "barriers")).wait_arrivals(1, timeout=60)
    client.containers.get(nodes[0].container.name).kill()
    t.join()
    w = result["w"]
    assert w.attempts[0].code == "killed" and nodes[0].container.name in w.attempts[0].stderr
    assert len(w.attempts[0].stderr.strip().splitlines()) == 1
    assert w.ready and container_names(dfleet) == [nodes[1].container.name]


@pytest.fixture
def private_engine(tmp_path, monkeypatch):
    """A Docker Engine of this test's own (its own data and exec roots and socket), stopped by its
    pid at the end, whatever happened."""
    if os.getuid() != 0 or not shutil.which("dockerd"):
        pytest.skip("a private Docker Engine needs root and dockerd")
    root = Path(tempfile.mkdtemp(prefix="gpujail-dk-", dir="/tmp"))   # short: unix socket paths
    sock = f"unix://{root}/d.sock"
    daemon = subprocess.Popen(["dockerd", "--iptables=false", "--bridge=none", "--data-root", f"{root}/data",
                               "--exec-root", f"{root}/x", "--host", sock, "--pidfile", f"{root}/d.pid",
                               "--shutdown-timeout", "2"],
                              stdout=open(root / "log", "w"), stderr=subprocess.STDOUT)
    monkeypatch.setenv("DOCKER_HOST", sock)
    try:
        deadline = time.monotonic() + 60
        while docker_backend.precondition() is not None:
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"the private engine did not start: {(root / 'log').read_text()[-300:]}")
            time.sleep(0.1)
        yield daemon
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        subprocess.run(["umount", "-R", "-l", *[m for m in mounts_under(root)]], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def mounts_under(root: Path) -> list[str]:
    return [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if ln.split()[4].startswith(str(root))]


def test_engine_going_away_mid_run(private_engine, jail, run_dir):
    """The engine stops while a worker is ready and the next one is starting: the ready worker's
    node is reported gone, the next start fails with one line naming the node and the engine's
    error, leaving the fleet says in one line that the engine could not confirm the removal, and
    no container process or mount of the run is left on the host."""
    with pytest.raises(docker_backend.EngineError, match="the engine failed while removing its containers"):
        with docker_backend.Fleet.recording(jail, run_dir) as fleet:
            a = start_worker(fleet, "a", "reference")
            assert a.ready, a.attempts[-1].stderr
            private_engine.send_signal(signal.SIGTERM)
            private_engine.wait(60)
            with pytest.raises(RuntimeError, match="node a: probe: container .* ended under the request"):
                a.node.probe(gpu_files(jail))
            with pytest.raises(docker_backend.EngineError) as e:
                start_worker(fleet, "b", "reference")
            assert str(e.value).startswith("node b: the engine did not start its container: ")
            assert "\n" not in str(e.value)
    leftover = [p for p in os.listdir("/proc") if p.isdigit() and str(jail) in _cmdline(p)]
    assert leftover == [] and str(jail) not in Path("/proc/self/mountinfo").read_text()


_HARNESS = """
import sys, time
sys.path.insert(0, sys.argv[1])
from gpujail.backends import docker_backend
from gpujail.contract import start_worker
fleet = docker_backend.Fleet(sys.argv[2])
w = start_worker(fleet, "orphan", "reference")
print(fleet.id if w.ready else w.attempts[-1].stderr, flush=True)
time.sleep(600)
"""


def test_nothing_left_after_the_harness_is_sigkilled(tmp_path):
    """INV-6: a harness SIGKILLed with a ready worker gets no chance to remove its container; the
    node agent sees its connection close and exits, and the engine removes the container."""
    jail = make_jail(tmp_path / "jail")
    harness = subprocess.Popen([sys.executable, "-c", _HARNESS, str(Path(__file__).resolve().parents[1]), str(jail)],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        fleet_id = harness.stdout.readline().strip()
        assert len(fleet_id) == 8, fleet_id
    finally:
        os.kill(harness.pid, signal.SIGKILL)
        harness.wait()
        harness.stdout.close()
    client, deadline = docker_backend.client(), time.monotonic() + 30
    while docker_backend.containers_of(client, fleet_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert docker_backend.containers_of(client, fleet_id) == []
    assert not [p for p in os.listdir("/proc") if p.isdigit() and str(jail) in _cmdline(p)]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("impl", ["legacy", "reference"])
def test_seed_bug_across_containers(impl, tmp_path):
    """The deterministic cold-race scenario with every worker a container: against `legacy` the
    seed bug shows exactly as across namespaces (a loser's CLI cleanup unlinks the 0-byte
    placeholders under the winners' mounts, INV-1), against `reference` the run is valid."""
    from gpujail.chaos import runner, scenario
    result = runner.run(scenario.load("cold-race"), impl, tmp_path / "run", fleet_class=docker_backend.Fleet)
    if impl == "reference":
        assert result.verdict.valid is True, result.report()
        return
    assert result.verdict.results["INV-1"].valid is False, result.report()
    assert "CLI cleanup unlinked" in result.report(), result.report()
    assert result.verdict.results["INV-6"].valid is True, result.report()
