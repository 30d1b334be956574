"""A model run: the host and jail it starts from, the workers' lives, and the history it writes.

How this works
--------------
`build` makes the tree: the host's driver files (fixtures/drivers.py's bytes; all of them, or only
the 3-file `SMALL_DRIVER` that shows the bug) and the jail image of fixtures/jail.py, read once
from a real one. `ModelWorld` then runs `workers` simulated workers on it. Each worker starts the
implementation it was given, `entry(sys, env) -> exit code`, with a `ModelSys` for sys and the
contract environment of SPEC section 5 for env, and restarts it up to `restarts` times, each attempt
in a fresh namespace (a restarted container). Faults (failpoint terms) and crashes (a SIGKILL
before the N-th step) act on the first attempt only: they are transient, as in the chaos suite.

The model only *records*. It writes the history the kernel backend writes (gpujail/world/history.py:
`chaos.begin`, `chaos.fault`, `worker.start`/`ready`/`exit`, the implementation's `impl.*`, the fake
CLI's `cli.*`, `failpoint`, `probe`, `chaos.end`), with virtual time (one millisecond per step or
event) and `final_state()` as the chaos runner gives it. Whoever runs a ModelWorld judges it with the
chaos checker (chaos/explore.py does). The model's probes are finer than the kernel's: a probe
round of every ready worker when it reports ready (INV-5) and after every step that removed something
(only a removal can take a file from a worker that is already ready, INV-1), the last one included.
"""
from __future__ import annotations

import io
import os
import stat as st
import sys
import threading
from collections.abc import Callable, Mapping

from gpujail.fixtures import drivers
from gpujail.world import failpoints, history

from ..probes import gpu_files
from .fs import JAIL, LOADER_MIN, S_IFDIR, Inode, ModelFS, Namespace, loader_view
from .sched import Killed, Proc, Simulation, Step, Worker
from .sys import ModelSys, Routed, local

# The smallest driver that shows the bug: two libraries (one with a soname to repair) and a device.
SMALL_DRIVER = ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}", "/usr/lib/x86_64-linux-gnu/libcuda.so.{v}",
                "/dev/nvidiactl")
INTERESTING = {"exit", "died", "failpoint", "cli.fail", "impl.fatal", "cli.cleanup.unlink", "impl.lock.acquired",
               "impl.lock.timeout", "impl.marker", "impl.mutant.unlink", "worker.ready", "chaos.kill"}

Entry = Callable[[object, Mapping[str, str]], int]   # (a Sys, the contract environment) -> exit code


# -- the world's contents -------------------------------------------------------------------------

_CONTENT: dict[tuple[str, str], bytes] = {}
_IMAGE: dict | None = None
_FILES: dict[tuple[str, str], list[dict]] = {}


def build(version: str, driver: tuple[str, ...] | None, detach: str = "unlink") -> ModelFS:
    """The host (driver files of `version`; all of them, or only the paths in `driver`) and the jail,
    on a filesystem whose remote removals detach at the unlink (K-1) or at the next lookup (K-2)."""
    fs = ModelFS(detach)
    wanted = None if driver is None else {p.format(v=version) for p in driver}
    for f in drivers.catalogue(version):
        if wanted is not None and f.path not in wanted:
            continue
        fs.driver.append(f.path)
        if not f.on_disk:
            fs.devices.append((f.path, f.mode))
            continue
        if (f.path, version) not in _CONTENT:
            _CONTENT[f.path, version] = drivers.content(f, version)
        fs.add(f.path, f.mode, _CONTENT[f.path, version])
    for d in ("/dev", "/run", "/usr/bin", "/usr/lib/x86_64-linux-gnu", "/lib/firmware/nvidia"):
        fs.add(d, S_IFDIR | 0o755)
    for rel, (mode, data, target) in _jail_image().items():
        fs.add(f"{JAIL}/{rel}", mode, data, target)
    fs.seal_host()
    return fs


def _jail_image() -> dict[str, tuple[int, bytes, str | None]]:
    global _IMAGE
    if _IMAGE is None:
        import tempfile

        from gpujail.fixtures.jail import make_jail
        with tempfile.TemporaryDirectory(prefix="gpujail-model-") as tmp:
            root = make_jail(os.path.join(tmp, "jail"))
            image = {}
            for dirpath, dirnames, filenames in os.walk(root):
                for name in sorted(dirnames) + sorted(filenames):
                    p = os.path.join(dirpath, name)
                    s = os.lstat(p)
                    rel = os.path.relpath(p, root)
                    if st.S_ISLNK(s.st_mode):
                        image[rel] = (s.st_mode, b"", os.readlink(p))
                    elif st.S_ISDIR(s.st_mode):
                        image[rel] = (s.st_mode, b"", None)
                    else:
                        with open(p, "rb") as f:
                            image[rel] = (s.st_mode, f.read(), None)
            _IMAGE = dict(sorted(image.items()))
    return _IMAGE


# -- a run ------------------------------------------------------------------------------------

class ModelWorld(Simulation):
    """One simulation: the tree, the workers and their implementation, the history it records."""

    def __init__(self, entry: Entry, workers: int = 2, driver: tuple[str, ...] | None = SMALL_DRIVER,
                 version: str = drivers.DEFAULT_VERSION, capabilities: str = "compute,utility",
                 faults: dict[int, str] | None = None, crashes: dict[int, int] | None = None,
                 schedule=(), restarts: int = 1, max_steps: int = 20000, impl: str = "model",
                 detach: str = "unlink"):
        super().__init__(schedule, max_steps)
        self.fs = build(version, driver, detach)
        self.entry, self.impl, self.capabilities, self.restarts = entry, impl, capabilities, restarts
        self.jail_before = self.fs.snapshot()
        self.workers = [Worker(self, i, f"w{i + 1}", (faults or {}).get(i, ""), (crashes or {}).get(i))
                        for i in range(workers)]
        self.history: list[dict] = []
        self.tick = -1   # chaos.begin at t=0: the checker's times (since the first event) are the trace's steps
        self.error: BaseException | None = None
        # What a GPU job on a ready worker reads (the probe requests of the kernel backend).
        if (version, capabilities) not in _FILES:
            _FILES[version, capabilities] = gpu_files(JAIL, version, capabilities)
        self.files = [f for f in _FILES[version, capabilities] if f["host"] in self.fs.driver]

    @classmethod
    def sandbox(cls, fs: ModelFS, namespaces: int = 2) -> list[ModelSys]:
        """One ModelSys per fresh namespace on `fs`, called directly (no threads, no schedule): what
        the fidelity tests compare with the kernel, op by op."""
        world = cls.__new__(cls)
        Simulation.__init__(world, free=True)
        world.fs = fs
        out = []
        for i in range(namespaces):
            w = Worker(world, i, f"ns{i + 1}", state="runnable")
            w.ns = Namespace(w.name)
            fs.namespaces.append(w.ns)
            out.append(ModelSys(world, Proc(w, "")))
        return out

    def run(self) -> ModelWorld:
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Routed("stdout", streams[0]), Routed("stderr", streams[1])
        try:
            self.record("chaos.begin", "host", scenario="model", impl=self.impl,
                        schedule={w.name: w.spec for w in self.workers if w.spec})
            for w in self.workers:
                if w.spec:
                    name, _, term = w.spec.partition("=")
                    self.record("chaos.fault", "host", worker=w.name, failpoint=name, term=term)
            threads = [threading.Thread(target=self._worker_main, args=(w,), daemon=True) for w in self.workers]
            for t in threads:
                t.start()
            for w in self.workers:
                w.state = "runnable"
            self._switch(None, self.scheduler.pick(self.workers, None))
            self.done.acquire()
            for t in threads:
                t.join()
        finally:
            sys.stdout, sys.stderr = streams
        if self.error is not None:
            raise self.error
        if self.dirty:   # the last step removed something: what do the ready workers see now?
            self.settle()
        else:            # a last round, as the kernel runner's: every open ready span is judged at its end
            self.probe_ready()
        self.record("chaos.end", "host")
        return self

    def final_state(self) -> dict:
        """What the chaos runner gives the checker at the end (no host: no residue to look for)."""
        return {"jail": JAIL, "transient_only": True, "max_restarts": self.restarts,
                "jail_before": self.jail_before, "jail_after": self.fs.snapshot(),
                "outside_changes": list(self.fs.outside_changes), "host_mounts": [], "processes": [], "temp_dirs": []}

    # -- a worker's life ---------------------------------------------------------------------------
    def _worker_main(self, w: Worker) -> None:
        w.sem.acquire()
        history.set_sink(lambda kind, fields: self.record(kind, w.name, **fields))
        try:
            for attempt in range(self.restarts + 1):
                w.attempt = attempt
                if attempt:
                    self.record("worker.restart", w.name, attempt=attempt)
                self.record("worker.start", w.name, impl=self.impl, attempt=attempt)
                code, error = self._attempt(w, attempt)
                w.exits.append(code)
                self.trace_event(w, "exit", str(code))
                if code == 0:
                    w.state = "ready"
                    self.record("worker.ready", w.name, attempt=attempt)
                    self.probe(w)   # INV-5: what it has when it says so
                    break
                self.record("worker.exit", w.name, code="killed" if code == -9 else code, error=error)
                self.fs.namespaces.remove(w.ns)   # the container is gone, and its mounts with it
        except Killed:
            pass
        except BaseException as e:   # a bug in the model or the code under test: stop, report
            self.error = self.error or e
            self.stopping = True
        finally:
            history.set_sink(None)
            failpoints.set_process(None)
            if w.state != "ready":
                w.state = "done"
            self.pass_baton(w)

    def _attempt(self, w: Worker, attempt: int) -> tuple[int, str]:
        """One start of the implementation in a fresh namespace: (exit code, last stderr line)."""
        w.ns = self.fs.namespace(w.name if attempt == 0 else f"{w.name}.{attempt}")
        w.proc = Proc(w, w.spec if attempt == 0 else "")
        local.stdout, local.stderr = io.StringIO(), io.StringIO()
        failpoints.set_process(w.proc)
        env = {"GPUJAIL_JAIL": JAIL, "GPUJAIL_NODE": w.name, "GPUJAIL_ROLE": "gpu-worker",
               "NVIDIA_DRIVER_CAPABILITIES": self.capabilities, "GPUJAIL_LOCK_TIMEOUT": "120"}
        try:
            code = self.entry(ModelSys(self, w.proc), env)
        except Killed:
            if self.stopping:
                raise
            self.record("chaos.kill", "host", worker=w.name, action="crash")
            self.release(w.proc)
            code = -9
        finally:
            failpoints.set_process(None)
        lines = local.stderr.getvalue().strip().splitlines()
        return code, lines[-1] if lines else ""

    # -- the history -------------------------------------------------------------------------------
    def record(self, kind: str, node: str, **fields) -> None:
        """Append an event to the history (and to the trace a person reads) at the next tick."""
        proc = failpoints.current()
        self.tick += 1
        fields.pop("began", None)   # the real clock; a simulated system call is atomic at its tick
        self.history.append({"t": self.tick / 1000, "node": node, "pid": proc.pid if isinstance(proc, Proc) else 0,
                             "kind": kind, **fields})
        if kind == "probe":
            bad = [f"{r['path']}: " + ("not attached, " if not r["attached"] else "")
                   + (r.get("error") or "not the host file") for r in fields["results"]
                   if not r["attached"] or r.get("same_bytes") is not True]
            self.trace.append(Step(self.tick, node, kind, (f"{len(fields['results'])} files, "
                                                           + (f"bad: {bad[0]}" if bad else "all intact"),)))
        elif kind != "failpoint" or fields.get("action") != "off":   # armed but passed: noise
            detail = " ".join(f"{k}={v}" for k, v in fields.items() if k != "argv")
            self.trace.append(Step(self.tick, node, kind, (detail,)))

    def settle(self) -> None:
        """After a removal: probe every ready worker (see the top of this file)."""
        super().settle()
        self.probe_ready()

    def probe_ready(self) -> None:
        for w in self.workers:
            if w.state == "ready":
                self.probe(w)

    def probe(self, w: Worker) -> None:
        """What a GPU job on `w` sees at each of its files, as gpujail/backends/node_probes.py's probe says it."""
        results = []
        for f in self.files:
            try:
                walk = self.fs.walk(w.ns, f["path"])
            except OSError:
                walk = None
            node = walk.node if walk else None
            attached = walk is not None and walk.parent is not None and w.ns.top((walk.parent.ino, walk.name)) is not None
            r: dict = {"path": f["path"], "attached": attached}
            if node is None or node.children is not None:
                r["size"], r["error"] = None, "No such file or directory" if node is None else "Is a directory"
            else:
                host = self.fs.lookup(w.ns, f["host"])
                r["size"], r["same_bytes"] = len(node.data), host is not None and (node is host or node.data == host.data)
            if f.get("load"):
                r["loader"] = "ok" if _loads(node) else f"{f['path']}: {loader_view(node)}"
            results.append(r)
        self.record("probe", w.name, results=results, asked=[f["path"] for f in self.files])

    # -- reporting ---------------------------------------------------------------------------------
    def report(self, full: bool = False) -> str:
        """The trace a person reads: every step that changed something, every fault, exit and
        readiness (or, with full, every step)."""
        lines = []
        for s in self.trace:
            if full or s.effect or s.op in INTERESTING or (s.op == "probe" and "bad:" in s.detail):
                lines.append(f"{s.seq:5}  {s.worker:<4} {s.op:<18} {s.detail}{'  -> ' + s.error if s.error else ''}")
        return "\n".join(lines)


def _loads(node: Inode | None) -> bool:
    """Would the loader map it? Any regular file the size of an ELF header or more (K-3)."""
    return node is not None and node.children is None and st.S_ISREG(node.mode) and len(node.data) >= LOADER_MIN
