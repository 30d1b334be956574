"""The recorded history of a run: one JSON object a line, appended by every process.

How this works
--------------
Every process of a run (harness, node agents, implementations, fake CLIs) appends events to the one
file named by `GPUJAIL_HISTORY`. Each record is a single `write(2)` on an `O_APPEND` descriptor, so
parallel writers never interleave a record (the kernel positions and writes an append atomically on
local file systems). Timestamps are `CLOCK_MONOTONIC`, which is one clock for all processes of a
machine, so records from different workers order correctly. Without `GPUJAIL_HISTORY`, recording is a
no-op: the fake CLI and `reference` run unchanged outside the harness. The model backend runs
simulated processes as threads and gives each thread a `sink` instead (`set_sink`).
"""
from __future__ import annotations

import _thread  # the lock without `threading`'s import cost (every worker start imports this module)
import json
import os
import time

ENV = "GPUJAIL_HISTORY"
_fd: int | None = None
_path: str | None = None
_lock = _thread.allocate_lock()
_local = _thread._local()


def set_sink(sink) -> None:
    """Send this thread's events to `sink(kind, fields)` instead of a file (None: back to the file)."""
    _local.sink = sink


def record(kind: str, /, **fields) -> None:
    """Append an event to this process's history (GPUJAIL_HISTORY), if it has one."""
    sink = getattr(_local, "sink", None)
    if sink is not None:
        sink(kind, fields)
        return
    append(os.environ.get(ENV), kind, **fields)


def append(path: str | None, kind: str, /, **fields) -> None:
    """Append an event to the history at `path` (the harness names its run's file explicitly)."""
    global _fd, _path
    if not path:
        return
    event = {"t": time.monotonic(), "node": fields.pop("node", None) or os.environ.get("GPUJAIL_NODE", "host"),
             "pid": os.getpid(), "kind": kind}
    event.update(fields)
    record = (json.dumps(event, separators=(",", ":"), default=str) + "\n").encode()
    # The harness appends from many threads; when a new run's path replaces the last one, they must
    # not close the descriptor under each other (EBADF, or a write into a reused descriptor).
    with _lock:
        if _fd is None or _path != path:
            if _fd is not None:
                os.close(_fd)
            _fd, _path = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644), path
        os.write(_fd, record)


def select(events: list[dict], kind: str, **match) -> list[dict]:
    """The events of `kind` whose fields equal `match`."""
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def load(path: str) -> list[dict]:
    """All events of a history file, in time order."""
    try:
        with open(path) as f:
            events = [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
    return sorted(events, key=lambda e: e["t"])
