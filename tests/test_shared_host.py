"""A host whose jail mount is shared (gpujail/backends/shared_host.py), and what keeps a start's mounts
its own (RealSys.make_private, which reference, direct and cdi call before their first mount).

The scenario `shared-propagation` shows the whole story against every implementation; these tests pin
the two halves: the holder makes nodes peers and sees what they leak, and `make_private` cuts a
namespace out of the peer group both when the jail is a mount point (one recursive call) and when it
is not (the holder mount found by walking up, then each mount under the jail), leaving the mounts
beside the jail as they were.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpujail.backends import kernel, shared_host

pytestmark = pytest.mark.kernel

# Run in a mount namespace of its own (private from the machine's): J is the jail, S a shared mount
# under it, B a shared mount beside it; `make_private(J)`, then which mounts are still shared.
CHILD = r"""
import json, os, sys
from gpujail.world.sysops import MS_BIND, RealSys
MS_SHARED = 1 << 20
top, jail_is_mount = sys.argv[1], sys.argv[2] == "1"
sysops = RealSys()
J, S, B = f"{top}/jail", f"{top}/jail/usr", f"{top}/beside"
for d in (J, S, B):
    os.makedirs(d, exist_ok=True)
sysops.mount(top, top, None, MS_BIND)          # the mount holding the jail ...
if jail_is_mount:
    sysops.mount(J, J, None, MS_BIND)
sysops.mount(None, top, None, MS_SHARED)      # ... shared, as systemd's /
for d in (S, B):
    sysops.mount(d, d, None, MS_BIND)
    sysops.mount(None, d, None, MS_SHARED)
sysops.make_private(J)
shared = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split(" - ")[0].split()
    if fields[4].startswith(top):
        shared[fields[4][len(top):] or "/"] = any(t.startswith("shared:") for t in fields[6:])
print(json.dumps(shared))
"""


def _in_own_namespace(top, jail_is_mount: bool) -> dict[str, bool]:
    userns = [] if os.getuid() == 0 else ["--user", "--map-root-user"]
    r = subprocess.run(["unshare", *userns, "--mount", "--propagation", "private", sys.executable, "-c", CHILD,
                        str(top), "1" if jail_is_mount else "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.unprivileged
def test_make_private_on_a_jail_that_is_a_mount_point(tmp_path):
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    shared = _in_own_namespace(tmp_path, jail_is_mount=True)
    assert shared == {"/": True, "/jail": False, "/jail/usr": False, "/beside": True}


@pytest.mark.unprivileged
def test_make_private_walks_up_to_the_mount_holding_the_jail(tmp_path):
    """The jail is a plain directory: the mount holding it (the top) is made private, alone, then the
    mount under the jail; the mount beside the jail keeps its propagation."""
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    shared = _in_own_namespace(tmp_path, jail_is_mount=False)
    assert shared == {"/": False, "/jail/usr": False, "/beside": True}


def _peer(host: shared_host.SharedHost, script: str) -> None:
    """`script` in a mount namespace copied from the host's without making it private: a peer."""
    r = subprocess.run(["nsenter", "-t", str(host.holder.pid), "-m", "unshare", "--mount", "--propagation", "unchanged",
                        "sh", "-ec", script, "peer", host.point], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_shared_host_sees_what_a_peer_leaks_and_nothing_else(tmp_path):
    why = shared_host.unavailable(kernel.Fleet) or kernel.precondition()
    if why:
        pytest.skip(why)
    jail = tmp_path / "jail"
    (jail / "usr/lib").mkdir(parents=True)
    (jail / "usr/lib/a").write_text("placeholder")
    (jail / "usr/lib/b").write_text("placeholder")
    with shared_host.SharedHost(jail) as host:
        assert host.residue() == []
        _peer(host, 'mount --make-rprivate "$1"; mount --bind /etc/hostname "$1/lib/a"')   # made private first
        assert host.residue() == []
        _peer(host, 'mount --bind /etc/hostname "$1/lib/b"')                              # kept the propagation
        assert host.residue() == [f"{jail}/usr/lib/b"]
        holder = host.holder.pid
    assert not os.path.exists(f"/proc/{holder}"), "the holder outlived its host"
    assert str(jail) not in open("/proc/self/mountinfo").read()
