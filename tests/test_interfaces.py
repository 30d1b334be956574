"""The backends' protocols (gpujail/backends/interface.py): every bundled backend and wrapper has
every member the suites use, none of them by inheriting from the kernel backend's classes, and a
nemesis's failure is kept for the run to raise."""
import threading

import pytest

from gpujail.backends import docker_backend, interface, jailfs_fleet, kernel, shared_host
from gpujail.launchers import coordinator

FLEETS = {"kernel": kernel.Fleet, "docker": docker_backend.Fleet, "coordinator": coordinator.Fleet,
          "shared-host": shared_host.on_shared_host(kernel.Fleet), "bindfs": jailfs_fleet.fleet_class(kernel.Fleet, "bindfs"),
          "docker-on-shared-host": shared_host.on_shared_host(docker_backend.Fleet)}
NODES = {"kernel": kernel.Node, "docker": docker_backend.Node, "coordinator": coordinator.AgentNode}


@pytest.mark.parametrize("name", FLEETS)
def test_every_fleet_has_the_fleet_protocol(name):
    assert interface.gaps(FLEETS[name], interface.Fleet) == []


@pytest.mark.parametrize("name", NODES)
def test_every_node_has_the_node_protocol(name):
    assert interface.gaps(NODES[name], interface.Node) == []


def test_no_backend_is_a_kernel_backend_underneath():
    """docker's and the coordinator's classes share base.py with the kernel backend's, not the
    kernel backend itself."""
    for cls in (docker_backend.Fleet, coordinator.Fleet):
        assert kernel.Fleet not in cls.__mro__
    for cls in (docker_backend.Node, coordinator.AgentNode):
        assert kernel.Node not in cls.__mro__


def test_gaps_names_what_is_missing_or_cannot_be_called_so():
    class HalfFleet:
        jail = env = None
        no_shared_host = ""

        def start(self, node_id):   # no role, no version, no options
            pass

        def history(self):
            return []

    gaps = interface.gaps(HalfFleet, interface.Fleet)
    assert {"__enter__: missing", "__exit__: missing", "leftovers: missing", "recording: missing"} <= set(gaps)
    assert "start: takes no 'role'" in gaps and "start: takes no 'version'" in gaps
    assert not any(g.startswith(("jail", "env", "history")) for g in gaps)


def test_a_thread_nemesis_keeps_its_failure():
    release = threading.Event()

    def act():
        release.wait()
        raise OSError("the brick would not restart")

    n = interface.ThreadNemesis("the kill-brick fault's injector", act)
    assert interface.gaps(interface.ThreadNemesis, interface.Nemesis) == []
    n.start()
    assert n.is_alive() and n.error is None
    release.set()
    n.stop()
    assert not n.is_alive() and isinstance(n.error, OSError) and "restart" in str(n.error)
