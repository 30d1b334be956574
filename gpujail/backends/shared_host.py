"""A host whose jail mount is shared: systemd's default (`/` is `shared`), a Kubernetes `Bidirectional`
volume (`rshared`).

How this works
--------------
On such a host a container's mount namespace starts as a peer of the host's for the shared mounts:
whatever a worker mounts or unmounts under them reaches the host's namespace and every other
worker's, unless the worker makes its jail's mounts private first (runtimes make a container's root
`rslave` or `rprivate`; a procedure mounting into a shared jail must do it itself). The harness builds
that world without touching the machine's own mounts:

* a holder process (`SharedHost`, started with `__enter__`) unshares a mount namespace with private
  propagation, so nothing of it reaches the machine, bind-mounts `JAIL/usr` on itself and makes that
  mount shared, then only waits: its namespace stands in for the host's;
* each node enters the holder's namespace before it makes its own (`node_options`: `mount_ns`, and
  `propagation = "shared"`, so namespaces.py does not make its copy private): its `JAIL/usr` is then a
  peer of the holder's and of every other node's. Only `usr`, where the CLI mounts libraries and
  binaries, is shared: the node's own `JAIL/dev`, `run` and `proc` stay its own (node_view.py). The
  node's copy-on-write cover (cow.py) mounts its overlays on the node's own private mounts, and binds
  the jail back recursively: the copy of the shared mount in it is a peer too (a bind of a shared
  mount joins its peer group);
* `residue()`, asked before the holder goes, lists what is still mounted under the shared mount in
  the host's stand-in namespace: every mount a worker let through, which outlives that worker there
  (SPEC INV-6). `__exit__` then kills the holder, and its namespace goes with all of it.

`on_shared_host(Fleet)` is a fleet class whose nodes all start on one such host: the holder lives as
long as the fleet, and once the nodes are gone the fleet's `host_mounts` says what they left in it.

Root only: in a user namespace the copies of a more privileged namespace's shared mounts are slaves,
never peers. Docker containers, launched nodes and a jail on a network file system cannot be peers of
one holder either: a fleet class says so in `no_shared_host` (kernel.Fleet: "" = possible).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpujail.world.sysops import parse_mountinfo

SHARED = "usr"   # the jail's directory mounted shared: where the CLI's libraries and binaries go


def unavailable(fleet_class) -> str:
    """Why nodes of `fleet_class` cannot share a host's mount here ("": they can)."""
    if os.getuid() != 0:
        return "a shared host mount needs root: in a user namespace the nodes' copies of it are slaves, not peers"
    return getattr(fleet_class, "no_shared_host", "")


class SharedHost:
    """The holder of a shared `JAIL/usr` mount, standing in for the host's namespace."""

    def __init__(self, jail: Path):
        self.jail = Path(jail)
        self.point = str(self.jail / SHARED)
        self.holder: subprocess.Popen | None = None

    def __enter__(self) -> SharedHost:
        script = 'mount --bind -- "$1" "$1" && mount --make-shared -- "$1" || exit $?; echo ready; exec sleep infinity'
        # SIGKILLed if the harness dies (kept across the execs): a dead run leaves no holder behind
        self.holder = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "unshare", "--mount", "--propagation",
                                        "private", "--", "sh", "-c", script, "shared-host", self.point],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, start_new_session=True)
        if self.holder.stdout.readline().strip() != "ready":
            err = self.holder.stderr.read() if self.holder.wait(timeout=10) is not None else ""
            self.__exit__()
            raise RuntimeError(f"the shared host mount of {self.point} could not be made: {err.strip()[-300:]}")
        self.mount_id = self._mounts()[-1].mount_id   # the shared mount: the only one there yet
        return self

    def node_options(self) -> dict:
        """What a node's config needs to start in this host's namespace, keeping the propagation."""
        return {"mount_ns": f"/proc/{self.holder.pid}/ns/mnt", "propagation": "shared"}

    def _mounts(self) -> list:
        """The host stand-in's mounts at or under the shared mount point."""
        with open(f"/proc/{self.holder.pid}/mountinfo") as f:
            return [m for m in parse_mountinfo(f.read()) if m.mountpoint == self.point
                    or m.mountpoint.startswith(self.point + "/")]

    def residue(self) -> list[str]:
        """The mount points at or under the shared mount in the host's stand-in namespace, but for
        the shared mount itself: what the nodes' mounts left there (one stacked on the shared mount
        point, an overlay of the whole directory, counts too)."""
        return sorted({m.mountpoint for m in self._mounts() if m.mount_id != self.mount_id})

    def __exit__(self, *exc) -> None:
        if self.holder is None:
            return
        if self.holder.poll() is None:
            self.holder.kill()
        self.holder.wait()
        for f in (self.holder.stdout, self.holder.stderr):
            f.close()


def on_shared_host(base):
    """`base` (a kernel.Fleet) whose nodes start on one shared host (see the module's doc)."""
    class OnSharedHost(base):
        host_mounts: list[str] = []   # after the fleet: what its nodes left mounted in the host's namespace

        def __enter__(self):
            self.shared_host = SharedHost(self.jail).__enter__()
            return super().__enter__()

        def start(self, node_id: str, *args, **options):
            return super().start(node_id, *args, **{**self.shared_host.node_options(), **options})

        def __exit__(self, *exc) -> None:
            try:
                super().__exit__(*exc)   # the nodes first: what is still mounted then outlived them
                self.host_mounts = self.shared_host.residue()
            finally:
                self.shared_host.__exit__()

    return OnSharedHost
