"""A fleet whose nodes see the jail on a jail file system, with the scenario's network faults.

How this works
--------------
`fleet_class(kernel.Fleet, kind, faults)` is the Fleet the suites use for `--jail-fs KIND` and for
a scenario's `net_faults`: a subclass whose `recording(...)` provides the file system (jailfs.py
`provide`) around the fleet's life, starts each node from its own client's mount namespace, and
runs one nemesis per fault (`NetFault`, an interface.ThreadNemesis), which waits for its trigger (N workers ready,
and, for a fault placed at a step, a worker paused at its barrier), injects the fault (kill the
brick, add latency, lose a node's client), records `jailfs.fault` in the history (the barrier's
keeper opens it then), holds it (at a barrier: until the held starts ended, then `hold`), clears
it and records `jailfs.clear`. While a fault keeps the jail unreachable, or its clients are still
reconnecting, a node cannot be set up: it is set up again once they are back, as an orchestrator
retries a container it could not create. What of the file system outlived the fleet
joins the fleet's `leftovers()` (INV-6).
"""
from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

from gpujail.backends.fs_processes import CALL_TIMEOUT, CLIENT_GONE
from gpujail.backends.interface import ThreadNemesis
from gpujail.backends.jailfs import MOUNT_FAILED, NetFault, provide
from gpujail.world.failpoints import BARRIERS_ENV, Barrier

# The suites' nodes revalidate at every lookup: a file another node removed is then detached at the
# victim's very next probe (K-2 still: at its lookup, not at the unlink). With GlusterFS's default
# 1 s cache, a loss in a run's last second would show only after the run, when nobody looks.
CHAOS_CACHE_TIMEOUT = 0.0
# After a fault clears, the clients take a moment to reconnect (GlusterFS: about a second): a node
# set up meanwhile fails as during the fault and is retried, up to this long (a bound, not a wait).
RECONNECT = 30.0


def fleet_class(base, kind: str, faults: tuple[NetFault, ...] | list[NetFault] = ()):
    """`base` (kernel.Fleet) whose fleets see the jail on `kind`: `recording(jail, run_dir, seed)`
    provides the file system around the fleet's life (see the module's doc), and `faults` are
    injected from a thread while it runs, each recorded as `jailfs.fault` and `jailfs.clear`."""
    if kind == "local" and not faults:
        return base

    class OnJailFS(base):
        jail_fs = kind
        net_faults = tuple(faults)   # injected here (the barrier keeper opens a fault's barrier once it began)
        no_shared_host = f"a jail on {kind} is each node's own client mount: no node's copy is a peer of another's"

        def __enter__(self):
            self._fs_cm = provide(kind, self.env_run_dir(), self.jail, cache_timeout=CHAOS_CACHE_TIMEOUT)
            self.jailfs = self._fs_cm.__enter__()
            self._stop, self._faulty = threading.Event(), threading.Event()
            self._cleared = float("-inf")   # when the last fault cleared (time.monotonic())
            # one nemesis per fault (interface.ThreadNemesis): an injector never dies in silence, raised at __exit__
            self._nemesis = [ThreadNemesis(f"the {f.fault} fault's injector", functools.partial(self._inject, f),
                                           daemon=True) for f in faults]
            for n in self._nemesis:
                n.start()
            return super().__enter__()

        def start(self, node_id: str, *args, **kw):
            """A node is started through its client; while a fault keeps the jail unreachable, or
            the clients are reconnecting after it, the node cannot be set up (its new client cannot
            mount the jail, its /dev and /run cannot be bound into it), and it is set up again once
            they are back, as an orchestrator retries a container it could not create (CI 88: a new
            client's mount during gluster-brick-restart's outage ended the test in an error)."""
            while True:
                try:
                    return super().start(node_id, *args, **kw)
                except RuntimeError as e:
                    reconnecting = time.monotonic() - self._cleared < RECONNECT
                    if not any(o in str(e) for o in (*CLIENT_GONE, MOUNT_FAILED)) or not (self._faulty.is_set() or reconnecting):
                        raise
                    self.nodes = [n for n in self.nodes if n.alive]
                    while self._faulty.is_set() and not self._stop.is_set():
                        self._stop.wait(0.05)
                    self._stop.wait(0.5)   # the clients reconnect (GlusterFS: about a second)

        def env_run_dir(self) -> Path:
            from gpujail.world import history
            hist = self.env.get(history.ENV)
            return Path(hist).parent if hist else self.jail.parent

        def _inject(self, f: NetFault) -> None:
            from gpujail.world import history
            hist = self.env.get(history.ENV)
            log = lambda k, **kw: history.append(hist, k, node="host", **kw)   # noqa: E731
            kind, n = ("worker.ready", f.after_ready) if f.after_ready else ("worker.start", 1)
            tail, seen = history.Tail(hist), 0   # the history as it grows: read once, not again every 20 ms
            held: set[str] = set()   # the workers paused at the fault's barrier
            while not self._stop.is_set():   # until n such events, and someone held at the barrier if any
                seen += sum(1 for e in tail() if e.get("kind") == kind)
                if f.barrier:
                    held = Barrier(f.barrier, self.env[BARRIERS_ENV]).arrived()
                if seen >= n and (held or not f.barrier):
                    break
                self._stop.wait(0.02)
            if self._stop.wait(f.delay) or self._stop.is_set():
                return
            fs = self.jailfs
            self._faulty.set()
            try:
                began = time.monotonic()   # the fault acts from here on, before its event is written
                if f.fault == "kill-brick":
                    pids = fs.kill_brick()
                elif f.fault == "latency":
                    fs.set_latency(f.ms)
                    pids = []
                else:
                    pids = fs.lose_client(f.worker)
                log("jailfs.fault", fault=f.fault, worker=f.worker, pids=pids, began=began, barrier=f.barrier,
                    held=sorted(held))
                while held and not self._stop.is_set():   # released now: each held start meets the fault
                    held -= {e.get("node") for e in tail() if e.get("kind") == "worker.exit"}
                    self._stop.wait(0.02)
                self._stop.wait(f.hold)
                if f.fault == "kill-brick":
                    fs.restart_brick()
                elif f.fault == "latency":
                    fs.set_latency(0)
                log("jailfs.clear", fault=f.fault, worker=f.worker)
            finally:
                self._cleared = time.monotonic()
                self._faulty.clear()

        def leftovers(self) -> list[str]:
            return super().leftovers() + self._fs_left

        def __exit__(self, *exc):
            self._stop.set()
            try:
                super().__exit__(*exc)
            finally:
                for n in self._nemesis:
                    n.stop(timeout=CALL_TIMEOUT)
                fs = self.jailfs
                self._fs_cm.__exit__(*exc)
                self._fs_left = fs.leftovers()
            failed = [f"{n.name} failed: {n.error!r}" for n in self._nemesis if n.error is not None]
            if failed and exc[0] is None:   # a run whose faults were never injected proves nothing
                raise RuntimeError("; ".join(failed))

        _fs_left: list[str] = []

    OnJailFS.__name__ = f"{base.__name__}On{kind.title().replace('-', '')}"
    return OnJailFS
