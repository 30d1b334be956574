"""The coordinator: a `Fleet` whose nodes live in node agents started by a launcher, reached through the run directory.

How this works
--------------
`Fleet` and `AgentNode` have the backends' interface (gpujail/backends/interface.py), so the
chaos runner, the contract and the suites drive agents on other machines unchanged. Entering the
fleet (`with fleet_class.recording(jail, DIR, seed) as fleet`):

1. writes `DIR/run.json` (jail, seed, launcher, agent count, the shared environment: history,
   barriers, where the request files go) and starts `agents` agents through the launcher; each
   answers the requests of `CHANNELS/I/` (`DIR/nodes/I/`, or a local tmpfs: launchers/local.py);
2. rendezvous: `ROUNDS` clock requests per agent, each bracketed by this machine's monotonic clock
   (t0 before writing, t1 after reading the reply). The agent's clock reads `mono` in between, so
   its offset is `mono - (t0 + t1) / 2` within +-(t1 - t0) / 2; the round with the shortest round
   trip is kept (NTP's rule). An agent on this machine's boot (same boot id) whose reading fell
   inside the round trip shares CLOCK_MONOTONIC: its offset is applied as exactly 0 (the measured
   one is only the measurement's error); any other agent's (another host, a time namespace) is
   applied as measured;
3. `start(node_id)` gives each worker id an agent (round robin, a restart on the same agent: the
   same cluster node) and asks it for a fresh node; `call` forwards a node request (run, probe,
   mounts); `kill` asks the agent to SIGKILL the node's PID 1;
4. while the run goes, every MERGE_EVERY seconds, what each agent added to its history
   (`DIR/nodes/I/history.jsonl`, its own clock) is shifted by its offset onto this machine's clock
   and appended to the run's history: the same checker reads it at the end, and meanwhile the
   progress line of `gpujail run` and `gpujail reproduce` counts the faults in it as they act;
5. leaving: `DIR/stop`, the launcher waits for the agents (then forces them), and the rest of their
   histories is copied. `DIR/clocks.json` keeps every agent's host, offset and uncertainty;
   `clock_summary()` says it in one line.

A launcher's failure reaches the command's exit code: `outcome(exception)` (a pod the cluster cannot
schedule is 'backend', exit 3; an agent that failed 'error', exit 5).

A heartbeat file (`DIR/heartbeat`, a counter rewritten every second) lets an agent whose coordinator
died end by itself (agent.py).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from gpujail import launchers
from gpujail.backends.base import BaseFleet, BaseNode
from gpujail.backends.file_channel import FileChannel
from gpujail.fixtures.drivers import DEFAULT_VERSION
from gpujail.spec import DEFAULT_WORKERS, EXIT
from gpujail.world import history

ROUNDS = 8                 # clock requests per agent at the rendezvous
HELLO_TIMEOUT = 120.0      # seconds for an agent to appear (a Slurm allocation, a pod pulling its image)
MERGE_EVERY = 1.0          # seconds between two copies of the agents' histories into the run's


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def launch_failure(exc: BaseException | None) -> BaseException | None:
    """The exception a launcher raised with an `outcome` (kubernetes.LaunchFailed: 'backend' when
    the cluster cannot run the agents, 'bad-input' for a setting), found through the exceptions it
    was raised from (the chaos runner's `worker W could not be started`), or None."""
    while exc is not None:
        if getattr(exc, "outcome", None) in EXIT:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def outcome(exc: BaseException) -> str:
    """The key of gpujail.spec.EXIT that an exception from a run through a launcher stands for: its
    launcher's outcome (`launch_failure`), else 'error'."""
    failure = launch_failure(exc)
    return failure.outcome if failure is not None else "error"


def clock_line(clocks: list[dict]) -> str:
    """The agents' clocks (clocks.json) in one line: hosts, offsets, the worst uncertainty."""
    clocks = [c for c in clocks if c]
    if not clocks:
        return "clocks: no agent met"
    hosts = {c["host"] for c in clocks}
    same = sum(c["same_clock"] for c in clocks)
    worst = max(c["uncertainty"] for c in clocks)
    largest = max(abs(c["offset"]) for c in clocks)
    return (f"clocks: {len(clocks)} agents on {len(hosts)} host(s), {same} on this machine's clock (offset 0); "
            f"largest offset applied {largest * 1e3:.3f} ms, uncertainty at rendezvous at most {worst * 1e3:.3f} ms")


class RemoteAgent:
    """The coordinator's handle on agent `index`: its channel, and where it stands."""

    def __init__(self, fleet: Fleet, index: int, channels: Path):
        self.index, self.fleet = index, fleet
        self.dir = fleet.run_dir / "nodes" / str(index)
        self.channel = FileChannel(str(channels / str(index)))
        self.hello: dict = {}
        self.clock: dict = {}
        self.copied = 0   # bytes of its history already copied into the run's

    def new_lines(self) -> bytes:
        """What the agent recorded since the last call (whole lines: it may be writing one), on this
        machine's clock. Only once it has met the coordinator: before, its offset is not known."""
        if not self.clock:
            return b""
        try:
            with open(self.dir / "history.jsonl", "rb") as f:
                f.seek(self.copied)
                data = f.read()
        except FileNotFoundError:
            return b""
        data = data[:data.rfind(b"\n") + 1]
        self.copied += len(data)
        if not self.clock["offset"]:   # this machine's clock (the local launcher's agents): as written
            return data
        events = [json.loads(line) for line in data.splitlines() if line.strip()]
        for e in events:
            for key in ("t", "began"):   # every time an event carries (a probe's `began` too)
                if key in e:
                    e[key] -= self.clock["offset"]
        return b"".join((json.dumps(e, separators=(",", ":")) + "\n").encode() for e in events)

    def gone(self) -> str | None:
        # The launcher's line says which agent or pod ended (not always this one), or that all did:
        # it is the message as it stands, with no prefix of ours.
        return self.fleet.launcher.gone()

    def call(self, req: dict, timeout: float | None = None) -> dict:
        return self.channel.call(req, self.gone, timeout)

    def wait_hello(self, deadline: float) -> None:
        while not (self.dir / "agent.json").exists():
            if why := self.gone():
                raise RuntimeError(why)
            if time.monotonic() > deadline:
                late = f"agent {self.index} did not start within {HELLO_TIMEOUT:g} s"
                if waiting := self.fleet.launcher.pending():   # still in the cluster's queue
                    raise launchers.LaunchFailed("backend", f"{late}: {waiting}")
                raise RuntimeError(late)
            time.sleep(0.01)
        self.hello = json.loads((self.dir / "agent.json").read_text())

    def meet(self) -> None:
        """Measure the agent's clock offset (module docstring, step 2)."""
        best = None
        for _ in range(ROUNDS):
            t0 = time.monotonic()
            r = self.call({"op": "clock"}, timeout=30)
            t1 = time.monotonic()
            if best is None or t1 - t0 < best[1] - best[0]:
                best = (t0, t1, r["mono"])
        t0, t1, mono = best
        measured, uncertainty = mono - (t0 + t1) / 2, (t1 - t0) / 2
        # One boot, one CLOCK_MONOTONIC, unless the agent sits in a time namespace of its own (then
        # the reading falls outside the round trip): the measured offset is then only noise.
        same = self.hello.get("boot_id") == boot_id() and abs(measured) <= uncertainty
        self.clock = {"index": self.index, "host": self.hello.get("host"), "same_clock": same,
                      "measured_offset": measured, "uncertainty": uncertainty, "offset": 0.0 if same else measured}


class AgentNode(BaseNode):
    """A node held by an agent: the nodes' requests (base.BaseNode), sent as files."""
    agent: RemoteAgent
    key: str
    up: bool = False

    def start(self) -> AgentNode:
        r = self.agent.call({"op": "start", "key": self.key, "node_id": self.node_id, "jail": str(self.jail),
                             "role": self.role, "version": self.version, "env": self.env, "options": self.options})
        if "error" in r:
            raise RuntimeError(f"node {self.node_id}: {r['error']}")
        self.pid1, self.up = r["host_pid"], True
        return self

    def call(self, op: str, **args) -> dict:
        if not self.up:
            raise RuntimeError(f"node {self.node_id} is not running")
        reply = self.agent.call({"op": "call", "key": self.key, "request": {"op": op, **args}})
        if "error" in reply:
            self.up = not reply.get("dead")
            raise RuntimeError(f"node {self.node_id}: {op}: {reply['error']}")
        return reply

    @property
    def alive(self) -> bool:
        return self.up

    def kill(self) -> None:
        if self.up:
            self.up = False
            try:
                self.agent.call({"op": "kill", "key": self.key})
            except RuntimeError:   # the agent is gone, and its nodes with it (PDEATHSIG)
                pass


class Fleet(BaseFleet):
    """Nodes in agents started by `launcher` (set by `launchers.fleet_class`)."""
    no_shared_host = "nodes made by a launcher's agents are on their own hosts: none is a peer of the harness's holder"
    launcher_name = "local"
    launcher: launchers.Launcher
    launcher_options: dict = {}
    run_dir: Path | None = None

    @classmethod
    def recording(cls, jail, run_dir: Path, seed=0) -> Fleet:
        fleet = super().recording(jail, run_dir, seed)
        fleet.run_dir = Path(run_dir)
        return fleet

    def __enter__(self) -> Fleet:
        self._scratch = None
        if self.run_dir is None:   # an unrecorded fleet still needs a directory for its files
            self._scratch = self.run_dir = Path(tempfile.mkdtemp(prefix="gpujail-agents-"))
        self.agents: list[RemoteAgent] = []
        self._assigned: dict[str, int] = {}
        self._keys = 0
        self._lock, self._copying = threading.Lock(), threading.Lock()
        self._beating = threading.Event()
        options = dict(self.launcher_options)
        count = int(options.pop("agents", None) or os.environ.get("GPUJAIL_WORKERS") or DEFAULT_WORKERS)
        (self.run_dir / "nodes").mkdir(parents=True, exist_ok=True)
        for stale in ("stop", "clocks.json"):
            (self.run_dir / stale).unlink(missing_ok=True)
        self.launcher = launchers.get(self.launcher_name, **options)
        channels = self.launcher.channels(self.run_dir)
        (self.run_dir / "run.json").write_text(json.dumps({
            "launcher": self.launcher_name, "agents": count, "jail": str(self.jail), "seed": self.env.get("GPUJAIL_SEED"),
            "env": self.env, "channels": str(channels),
            "coordinator": {"host": os.uname().nodename, "boot_id": boot_id()}}, indent=1))
        self._beat()
        threading.Thread(target=self._heartbeat, daemon=True, name="gpujail-heartbeat").start()
        threading.Thread(target=self._copy_histories, daemon=True, name="gpujail-histories").start()
        try:
            self.launcher.start(self.run_dir, count)
            self.agents = [RemoteAgent(self, i, channels) for i in range(count)]
            deadline = time.monotonic() + HELLO_TIMEOUT
            for a in self.agents:   # every agent up first: one still starting would slow the others' round trips
                a.wait_hello(deadline)
            for a in self.agents:
                a.meet()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _beat(self, n: int = 0) -> None:
        tmp = self.run_dir / "heartbeat.tmp"
        tmp.write_text(str(n))
        tmp.rename(self.run_dir / "heartbeat")

    def _heartbeat(self) -> None:
        n = 0
        while not self._beating.wait(1.0):
            n += 1
            self._beat(n)

    def start(self, node_id: str, role: str = "gpu-worker", version: str | None = DEFAULT_VERSION,
              **options) -> AgentNode:
        with self._lock:
            index = self._assigned.setdefault(node_id, len(self._assigned) % len(self.agents))
            self._keys += 1
            key = f"{node_id}.{self._keys}"
        node = AgentNode(node_id, self.jail, role, version, {**self.env, "GPUJAIL_NODE": node_id}, options)
        node.agent, node.key = self.agents[index], key
        self.nodes.append(node)
        return node.start()

    def history(self) -> list[dict]:
        """The run's history so far: this machine's events and the agents', on this machine's clock."""
        self._merge()
        return history.load(self.env.get(history.ENV, ""))

    def _merge(self) -> None:
        """Append what the agents recorded since the last merge to the run's history (module
        docstring, step 4). An unrecorded fleet's agents record nothing."""
        hist = self.env.get(history.ENV)
        if not hist:
            return
        with self._copying:   # the copying thread, `history()` and the end: each line copied once
            lines = b"".join(a.new_lines() for a in self.agents)
            if lines:
                with open(hist, "ab") as f:
                    f.write(lines)

    def _copy_histories(self) -> None:
        while not self._beating.wait(MERGE_EVERY):
            self._merge()

    def clock_summary(self) -> str:
        return clock_line([a.clock for a in self.agents])

    def leftovers(self) -> list[str]:
        return self.launcher.leftovers() if hasattr(self, "launcher") else []

    def __exit__(self, *exc) -> None:
        try:
            (self.run_dir / "stop").touch()   # agents kill their nodes and end
            if hasattr(self, "launcher"):
                self.launcher.stop()
        finally:
            self._beating.set()
            for n in self.nodes:
                n.up = False
            self._merge()
            (self.run_dir / "clocks.json").write_text(json.dumps([a.clock for a in self.agents], indent=1))
            if self._scratch:
                shutil.rmtree(self._scratch, ignore_errors=True)
