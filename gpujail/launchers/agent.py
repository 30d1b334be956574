"""The node agent: `gpujail node --run-dir DIR [--index I]`, one per node of the user's cluster.

(`python -m gpujail.launchers.agent` is the same agent without the command's imports, a second
less per agent: what the bundled launchers run.)

How this works
--------------
Started by a launcher (a local process, a Slurm task, a pod of an Indexed Job) with nothing but the
run directory, which the coordinator made on the shared file system. Its index is `--index`, else
`$SLURM_PROCID`, else `$JOB_COMPLETION_INDEX`, else 0. It:

1. reads `DIR/run.json`, writes `DIR/nodes/I/agent.json` (host, pid, boot id, Slurm job id): its hello;
2. answers the requests of `CHANNELS/I/` (gpujail/backends/file_channel.py's file transport; CHANNELS is
   run.json's `channels`, `DIR/nodes` unless the launcher chose a local tmpfs), each in a
   thread of its own, since a start may block for seconds while the next probe or kill must not:
   `clock` (its monotonic clock, for the coordinator's rendezvous), `start` (a worker node made
   exactly as the kernel backend makes it: a `kernel.Node`, i.e. `python -m gpujail.backends.node` in
   fresh mount and PID namespaces), `call` (a run, probe or mounts request forwarded to that node),
   `kill` (SIGKILL to the node's PID 1: the node and everything in it die);
3. records into its own history, `DIR/nodes/I/history.jsonl` (the node's events and those of every
   implementation and CLI it runs), on its own clock: the coordinator shifts it at the end;
4. ends when `DIR/stop` appears, or when the coordinator's heartbeat (`DIR/heartbeat`) has not
   changed for `ORPHANED` seconds of this machine's clock (the coordinator died): kills its nodes,
   writes `DIR/nodes/I/result.json` (starts, kills, errors) and exits 0.

The barrier files stay in `DIR/barriers/` (one directory, read by the coordinator's barrier keeper
as on one machine), named per node and pid as the failpoints make them.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from gpujail.backends import kernel
from gpujail.backends.file_channel import FileChannel
from gpujail.world import history

ORPHANED = 30.0   # seconds without a heartbeat after which an agent gives up its coordinator
STOP_LOOK = 0.2   # seconds between two looks for DIR/stop and the heartbeat


def index_from_env(given: int | None) -> int:
    if given is not None:
        return given
    for var in ("SLURM_PROCID", "JOB_COMPLETION_INDEX"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class Agent:
    def __init__(self, run_dir: Path, index: int):
        self.run_dir, self.index = run_dir, index
        self.dir = run_dir / "nodes" / str(index)
        self.history = str(self.dir / "history.jsonl")
        self.run = json.loads((run_dir / "run.json").read_text())
        self.nodes: dict[str, kernel.Node] = {}
        self.counts = {"starts": 0, "kills": 0, "errors": 0}
        self.lock = threading.Lock()
        self.beat = (None, time.monotonic())
        self.next_look = 0.0

    def stopped(self) -> bool:
        now = time.monotonic()
        if now < self.next_look:   # asked at every look at the inbox: the run directory is read 5 times a second
            return False
        self.next_look = now + STOP_LOOK
        if (self.run_dir / "stop").exists() or not (self.run_dir / "run.json").exists():
            return True
        try:
            beat = (self.run_dir / "heartbeat").read_text()
        except FileNotFoundError:
            beat = None
        if beat != self.beat[0]:
            self.beat = (beat, time.monotonic())
        return time.monotonic() - self.beat[1] > ORPHANED

    def handle(self, channel: FileChannel, seq: int, req: dict) -> None:
        try:
            reply = getattr(self, "op_" + req["op"])(req)
        except Exception as e:   # a bad request must not end the agent; the coordinator reads why
            with self.lock:
                self.counts["errors"] += 1
            reply = {"error": f"{type(e).__name__}: {e}"}
        channel.reply(seq, reply)

    def op_clock(self, req: dict) -> dict:
        return {"mono": time.monotonic()}

    def _local(self, env: dict) -> dict:
        """The run's environment, with this agent's own history file (its clock, its file)."""
        return {**env, history.ENV: self.history} if history.ENV in env else env

    def op_start(self, req: dict) -> dict:
        node = kernel.Node(req["node_id"], Path(req["jail"]), req["role"], req["version"], self._local(req["env"]),
                           req.get("options") or {})
        with self.lock:
            self.nodes[req["key"]] = node
            self.counts["starts"] += 1
        node.start()
        return {"host_pid": node.pid1}

    def op_call(self, req: dict) -> dict:
        node, request = self.nodes[req["key"]], dict(req["request"])
        if "env" in request:
            request["env"] = self._local(request["env"])
        try:
            return node.call(request.pop("op"), **request)
        except RuntimeError as e:
            return {"error": str(e), "dead": not node.alive}

    def op_kill(self, req: dict) -> dict:
        with self.lock:
            node = self.nodes.pop(req["key"], None)
            self.counts["kills"] += node is not None
        if node:
            node.kill()
        return {}

    def serve(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        kernel.start_factory()   # before the hello: the rendezvous waits for it, not the first start
        channel = FileChannel(os.path.join(self.run.get("channels") or str(self.run_dir / "nodes"), str(self.index)))
        hello = {"index": self.index, "host": socket.gethostname(), "pid": os.getpid(),
                 "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                 "slurm_job": os.environ.get("SLURM_JOB_ID"), "pod": os.environ.get("HOSTNAME")}
        tmp = self.dir / "agent.json.tmp"
        tmp.write_text(json.dumps(hello))
        tmp.rename(self.dir / "agent.json")
        threads = []
        try:
            for seq, req in channel.requests(self.stopped):
                t = threading.Thread(target=self.handle, args=(channel, seq, req), daemon=True)
                t.start()
                threads = [t for t in threads if t.is_alive()] + [t]
        finally:
            with self.lock:
                nodes, self.nodes = list(self.nodes.values()), {}
            for node in nodes:
                node.kill()
            for t in threads:
                t.join(timeout=10)
            (self.dir / "result.json").write_text(json.dumps({**hello, **self.counts}))
        return 0


def main(run_dir: str, index: int | None = None) -> int:
    if index is not None and index < 0:
        print(f"gpujail node: --index {index}: expected a non-negative integer", file=sys.stderr)
        return 2
    d = Path(run_dir)
    if not (d / "run.json").is_file():
        print(f"gpujail node: --run-dir {run_dir}: no run.json there (the coordinator writes it first)", file=sys.stderr)
        return 2
    return Agent(d, index_from_env(index)).serve()


if __name__ == "__main__":   # `python -m gpujail.launchers.agent`: `gpujail node` without the command's imports
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gpujail.launchers.agent", description="the node agent (gpujail node)")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--index", type=int, default=None)
    a = ap.parse_args()
    sys.exit(main(a.run_dir, a.index))
