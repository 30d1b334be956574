"""The harness's own doings during a chaos run: the faults it injects into the world, and its jobs.

How this works
--------------
`chaos/runner.py` runs the workers and the probes; everything else the harness does to the world
beside them is here, each a plain function of the jail, the nodes and the history's `log`:

* before the workers start: `dress_as_reused` (an earlier cluster's leftovers in the jail);
* beside them: `ldconfig_node` (a node re-running ldconfig on the shared jail) and `populate_job`
  (the populate-jail cleanup, REF-9, from a node of its own);
* at a barrier, through `keep_barriers`, which releases each barrier once every GPU worker arrived
  or finished and, there, kills nodes, takes the lock from under its holder (`lose_lock`), swaps a
  symlink into the jail (`swap_link`) or upgrades a host's driver under a running start
  (`upgrade_host`).

Each records what it did as a `chaos.*` event, so the checker tells the harness's changes from the
workers' (a swapped link, an upgraded host's files) and the fault windows see when they happened.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpujail.chaos.scenario import HostUpgrade, LockFault, Scenario, SwappedLink
from gpujail.contract import RestartPolicy, command_for, start_worker
from gpujail.fixtures import drivers
from gpujail.fixtures import jail as jail_image
from gpujail.fixtures.drivers import DEFAULT_VERSION
from gpujail.reference_impl import core
from gpujail.spec import LOCK, last_error
from gpujail.world import history
from gpujail.world.failpoints import Barrier


def dress_as_reused(jail: Path) -> None:
    """What an earlier cluster leaves: markers, old 0-byte placeholders and the flag."""
    lib = jail / "usr/lib/x86_64-linux-gnu"
    (lib / "libcuda.so.550.54.15").write_bytes(core.MARKER)
    (lib / "libnvidia-ml.so.550.54.15").write_bytes(b"")
    (jail / core.FLAG).touch()


def ldconfig_node(scenario: Scenario, fleet, jail: Path, impl: str, done: threading.Event, log,
                      name: str = "ldconfig-node", ready: dict | None = None) -> None:
    """Run `ldconfig -r JAIL` again and again until `done` (every worker finished), and once more:
    from a node that sees none of the mounts (view blind: the lock winner of PR #2682) or from a GPU
    node of its own (view gpu: a node re-running ldconfig on the shared jail, PR #2621), holding the
    jail's ldconfig lock if asked. Its own node only: a node serves one request at a time, and the
    probes use the others: a ready GPU nemesis goes into `ready`, for the last probe round (its
    ready span needs evidence like any other). Two lock-holding nemeses (`nodes = 2`) hand the lock to each other with
    no gap: one always waits in flock while the other holds it."""
    cfg = scenario.ldconfig
    if cfg.get("view") == "gpu":
        w = start_worker(fleet, name, impl, version=cfg.get("version", DEFAULT_VERSION),
                         capabilities=scenario.capabilities,
                         policy=RestartPolicy(max_restarts=scenario.max_restarts, backoff=0.02))
        if not w.ready:   # its node is gone (e.g. legacy's own cold race): no ldconfig, so the window stays shut
            return
        node = w.node
        if ready is not None:
            ready[name] = w
    else:
        node = fleet.start(name, role="cpu-worker", version=None)
    lock = jail / core.LDCONFIG_LOCK
    argv = [jail_image.find_ldconfig(), "-r", str(jail)]
    if cfg.get("hold_lock"):   # the lock winner: holds the lock for its run (and `hold` seconds more)
        argv = ["flock", str(lock), "sh", "-c", f'"$0" "$@" && sleep {float(cfg.get("hold", 0))}', *argv]
    every = float(cfg.get("every", 0.05))
    while True:
        finished = done.is_set()
        r = node.run(argv)
        log("chaos.ldconfig", node=name, view=cfg.get("view"), code=r.code)   # its node: not a window of its own
        if finished:
            break
        time.sleep(every)


def wait_until_held(lock: Path, nemeses: list, timeout: float = 60.0) -> bool:
    """True once someone holds `lock` (flock, tried without waiting and let go at once), False if
    the nemesis ended or the time ran out first: the blind winner has the ldconfig lock before any
    worker starts, so the workers meet it busy."""
    deadline = time.monotonic() + timeout
    while any(t.is_alive() for t in nemeses) and time.monotonic() < deadline:
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:   # the nemesis's flock creates it
            time.sleep(0.005)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        time.sleep(0.005)
    return False


def populate_job(fleet, jail: Path, impl: str, name: str = "populate") -> None:
    """The populate-jail cleanup (REF-9) run once from a node of its own. It is a cluster job, not
    part of the worker contract: the bundled implementations bring their own (legacy's is the buggy
    "empty file" one, a mutant's may have a broken predicate); anything else is paired with the
    reference's."""
    job = impl if impl in ("reference", "legacy", "direct") or impl.startswith("mutant:") else "reference"
    node = fleet.start(name, role="cpu-worker", version=None)
    r = node.run(command_for(job, str(jail), name, "cpu-worker") + ["populate-cleanup"])
    node.kill()
    if r.code != 0:
        raise RuntimeError(f"populate-jail cleanup failed: {r.error_line}")


def lose_lock(jail: Path, fault: LockFault, holder: str, log) -> None:
    """The lock file taken from under its holder, who keeps running: removed (a cleanup job, a lost
    NFS lease whose file another node re-creates) or replaced by a new file (an image sync). The
    holder's flock stays on the old inode; whoever opens the path next locks another one."""
    path = jail / (fault.lock or LOCK)
    existed = path.exists()
    if fault.fault == "replace":
        fresh = path.with_name(path.name + ".chaos-new")
        fresh.write_bytes(b"")
        os.chmod(fresh, 0o644)
        os.rename(fresh, path)
    elif existed:
        path.unlink()
    log("chaos.lock_fault", fault=fault.fault, lock=fault.lock or LOCK, barrier=fault.barrier, holder=holder,
        existed=existed)


def swap_link(jail: Path, outside: Path, link: SwappedLink, who: str, log) -> str:
    """A symlink swapped in at `link.path` while starts are under way (after they checked the jail):
    what was there is moved out of the jail first (to `outside`/../swapped-aside), so the jail holds
    the link alone. Returns the jail-relative path planted (the nemesis's, not the workers')."""
    path = jail / link.path
    path.parent.mkdir(parents=True, exist_ok=True)
    moved = ""
    if path.exists() or path.is_symlink():
        aside = outside.parent / "swapped-aside" / link.path.replace("/", "_")
        aside.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, aside)
        moved = str(aside)
    os.symlink(link.target.replace("@OUTSIDE", str(outside)), path)
    log("chaos.link", path=link.path, target=link.target, barrier=link.barrier, arrived=who, moved=moved)
    return link.path


class _Seen:
    """One field of the history's events of one kind that pass `keep`, collected as the history
    grows: which workers had a start fail (a barrier that opens once every other worker gave up at
    least once), at which barriers a network fault began (a barrier that opens only then)."""

    def __init__(self, path: Path, kind: str, field: str, keep=lambda e: True):
        self.tail, self.kind, self.field, self.keep, self.seen = history.Tail(path), kind, field, keep, set()

    def __call__(self) -> set[str]:
        self.seen.update(e.get(self.field) for e in self.tail() if e.get("kind") == self.kind and self.keep(e))
        return self.seen


def keep_barriers(scenario: Scenario, run_dir: Path, threads: dict, nodes: dict, log, jail: Path | None = None,
                   planted: list[str] | None = None, upgrade=None, net_faults=()) -> None:
    """Release each barrier once every GPU worker arrived or finished (but those the harness starts
    only at its release; with `open = "others-failed"`, or had a start fail); kill who must die
    there, either when it arrives or at the release (when everyone else is ready); take the lock
    from under whoever arrives at a barrier with a lock fault, swap in the symlinks due there
    (recorded in `planted`), and have `upgrade(worker, host_upgrade)` upgrade the host of a worker
    that arrives where the scenario upgrades it; a barrier where the fleet injects a network fault
    (`net_faults`: jailfs.NetFault with a barrier) opens once that fault began."""
    all_gpu = [w for w, role, _ in scenario.workers if role == "gpu-worker"]
    pending = {name: Barrier(name, str(run_dir / "barriers")) for name in scenario.barriers}
    kills = {(k.worker, k.barrier): k.when for k in scenario.kills}
    lock_faults = {f.barrier: f for f in scenario.lock_faults}
    swaps = list(scenario.swapped_links)
    upgrades = list(scenario.host_upgrades)
    failed_starts = _Seen(run_dir / "history.jsonl", "worker.exit", "node", lambda e: e.get("code") not in (0, "0"))
    # a network fault placed at a barrier (jailfs.NetFault.barrier): once someone is held there, the
    # barrier opens when the fault has begun, at once. Only where the fleet injects it
    # (gpujail/backends/jailfs_fleet.py): elsewhere the barrier opens as any other, the window shut.
    net_barriers = {f.barrier for f in net_faults if f.barrier}
    faulted = _Seen(run_dir / "history.jsonl", "jailfs.fault", "barrier")

    def kill_due(name: str, arrived: set[str], when: str) -> bool:
        """Kill the arrived workers the scenario wants dead at this moment ("*": whoever arrives
        first, e.g. the lock holder). True if anyone was killed."""
        killed = False
        for w in sorted(arrived):
            who = next((who for who in (w, "*") if kills.get((who, name)) == when), None)
            if who is not None and w in nodes:
                del kills[(who, name)]
                log("chaos.kill", worker=w, barrier=name)
                nodes[w].kill()
                killed = True
        return killed

    def arrivals(name: str) -> set[str]:
        return pending[name].arrived()

    def upgrade_arrived(name: str, arrived: set[str]) -> None:
        for up in [u for u in upgrades if u.barrier == name and u.worker in arrived] if upgrade else []:
            upgrades.remove(up)
            upgrade(up.worker, up)   # before the release: the worker goes on on its new driver

    def release(name: str, arrived: set[str], **why) -> None:
        kill_due(name, arrived, "release")
        upgrade_arrived(name, arrived)   # who arrived since the last look (a stalled release) too
        pending.pop(name).release()
        log("chaos.release", barrier=name, arrived=sorted(arrived), **why)

    while pending:
        for name in list(pending):
            arrived = arrivals(name)
            killed_here = kill_due(name, arrived, "arrival")
            if arrived and name in lock_faults and jail is not None:
                lose_lock(jail, lock_faults.pop(name), sorted(arrived)[0], log)
            for link in [sl for sl in swaps if sl.barrier == name] if arrived and jail is not None else []:
                swaps.remove(link)
                path = swap_link(jail, run_dir / "outside", link, sorted(arrived)[0], log)
                if planted is not None:
                    planted.append(path)
            upgrade_arrived(name, arrived)
            if name in net_barriers and arrived:
                if name in faulted():
                    release(name, arrived)
                continue
            gpu = [w for w in all_gpu if scenario.start_after.get(w) != name]
            finished = {w for w in gpu if not threads[w].is_alive()}
            if scenario.barrier_opens.get(name) == "others-failed":
                finished |= failed_starts() & set(gpu)
            # A barrier that existed to kill someone at arrival opens right after the kill (the
            # others must not queue behind it); otherwise once every GPU worker arrived or finished.
            if killed_here or len(arrived | finished) >= len(gpu):
                release(name, arrived)
        # Everyone started and alive waits at some barrier (at different ones, or the workers meant
        # to start at a barrier wait for one that paused elsewhere first): nobody can move until a
        # barrier opens, so open the first in the scenario's order. This is how a scenario orders
        # its barriers (the fault table's `late` before `hold`: w0 fails while its neighbours are
        # still paused); a scenario whose workers meet at one barrier never gets here.
        paused = set().union(*(arrivals(name) for name in pending)) if pending else set()
        started = [w for w in all_gpu if scenario.start_after.get(w) not in pending and threads[w].is_alive()]
        if pending and all(w in paused for w in started):
            first = next(name for name in scenario.barriers if name in pending)
            if not (first in net_barriers and arrivals(first)):   # that one opens with its fault
                release(first, arrivals(first), stalled=True)
        time.sleep(0.002)


# What a driver package installs as files (device nodes and sockets are the node's own, not the package's).
PACKAGE_KINDS = ("binary", "library", "library32", "firmware")

# Run in the node's mount namespace (nsenter): the package's old files removed, the new ones written,
# each path as that namespace resolves it printed back (what its copy-on-write view will report).
_INSTALL = """
import json, os, shutil, sys
plan, done = json.loads(sys.argv[1]), []
for path in plan["remove"]:
    if os.path.lexists(path):
        os.unlink(path)
        done.append(os.path.realpath(path))
for src, path, mode in plan["write"]:
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent)
        done.append(os.path.realpath(parent))
    shutil.copyfile(src, path + ".dpkg-new")
    os.chmod(path + ".dpkg-new", mode)
    os.rename(path + ".dpkg-new", path)
    done.append(os.path.realpath(path))
print(json.dumps(done))
"""


class UpgradedHosts:
    """The fleet, once the harness upgraded hosts mid-run (`versions`: worker -> its driver now): a
    restarted worker's new node comes up on its host's driver as it is now, not as it was."""

    def __init__(self, fleet, versions: dict[str, str]):
        self._fleet, self._versions = fleet, versions

    def __getattr__(self, name: str):
        return getattr(self._fleet, name)

    def start(self, node_id: str, role: str = "gpu-worker", version: str | None = DEFAULT_VERSION, **options):
        return self._fleet.start(node_id, role=role, version=self._versions.get(node_id, version), **options)


def upgrade_host(node, worker: str, upgrade: HostUpgrade, old: str, layout: str, log) -> None:
    """The node's host driver upgraded from `old` to `upgrade.version` while its start runs, as a
    package upgrade does it (old files removed, new ones renamed into place), in the node's own view
    of the host: its copy-on-write overlays take the writes, the real host never changes. The paths
    changed are recorded in `chaos.upgrade`: the harness's, not the implementation's, when the
    node's view reports what its start wrote outside the jail (INV-3)."""
    tree = drivers.materialise(upgrade.version, layout=layout)
    new = [f for f in drivers.catalogue(upgrade.version, layout) if f.kind in PACKAGE_KINDS]
    gone = sorted({f.path for f in drivers.catalogue(old, layout) if f.kind in PACKAGE_KINDS} - {f.path for f in new})
    plan = {"remove": gone, "write": [(str(tree / drivers.tree_path(f)), f.path, f.mode & 0o7777) for f in new]}
    r = subprocess.run(["nsenter", "-t", str(node.pid1), "-m", sys.executable, "-S", "-c", _INSTALL, json.dumps(plan)],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"upgrading {worker}'s host driver to {upgrade.version} failed: "
                           f"{last_error(r.stderr, r.returncode)}")
    log("chaos.upgrade", worker=worker, version=upgrade.version, old=old, barrier=upgrade.barrier,
        paths=json.loads(r.stdout))
