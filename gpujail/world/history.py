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

What an event may hold is fixed by gpujail/world/events.py (every kind, its fields and meaning).
With `GPUJAIL_VALIDATE_HISTORY=1` (the self-tests set it), `record` and `append` check each event
against that schema and, after writing it, raise `events.EventError` naming the kind, the field and
the emitting source line; without it (production runs) nothing is checked and events.py is not
even imported.
"""
from __future__ import annotations

import _thread  # the lock without `threading`'s import cost (every worker start imports this module)
import json
import os
import sys
import time

ENV = "GPUJAIL_HISTORY"
VALIDATE_ENV = "GPUJAIL_VALIDATE_HISTORY"   # events.VALIDATE_ENV, without importing events.py
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
    error = _invalid(kind, fields) if os.environ.get(VALIDATE_ENV) else None
    if sink is not None:
        sink(kind, fields)
    else:
        _write(os.environ.get(ENV), kind, fields)
    if error:
        raise error


def append(path: str | None, kind: str, /, **fields) -> None:
    """Append an event to the history at `path` (the harness names its run's file explicitly)."""
    error = _invalid(kind, {k: v for k, v in fields.items() if k != "node"}) if path and os.environ.get(VALIDATE_ENV) else None
    _write(path, kind, fields)
    if error:
        raise error


def _write(path: str | None, kind: str, fields: dict) -> None:
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


def reopen() -> None:
    """After a fork whose child closed the descriptors it inherited (gpujail/backends/cli_server.py): the
    next record opens the file again rather than write to a number that is no longer its."""
    global _fd, _path
    _fd = _path = None


def _invalid(kind: str, fields: dict) -> Exception | None:
    """What is wrong with an event (naming the first caller outside this module), or None. The
    writer still writes a bad event before raising: a process whose error is swallowed (a worker
    restarted after its CLI died of it) leaves it in the history, where `events.validate_history`
    finds it."""
    from gpujail.world import events
    try:
        events.validate(kind, fields)
    except events.EventError as e:
        return events.EventError(e.kind, e.field, e.problem, _emitter())
    return None


def _emitter() -> str:
    """`path:line in function` of the code that emitted the event (and of its caller, when the
    emitter is a small local helper such as the harness's `log`)."""
    frame, places = sys._getframe(1), []
    while frame is not None and len(places) < 2:
        if frame.f_code.co_filename != __file__:
            places.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
            if frame.f_code.co_name not in ("log", "<lambda>"):
                break
        frame = frame.f_back
    return ", called from ".join(places)


def select(events: list[dict], kind: str, **match) -> list[dict]:
    """The events of `kind` whose fields equal `match`."""
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def load(path: str) -> list[dict]:
    """All events of a history file, in time order. A run's own threads read its history while it
    grows (the network-fault injector counts readies), so the last line may be a record still being
    written: a last line that does not parse is left for the next read; any other is an error."""
    try:
        with open(path) as f:
            lines = [line for line in f if line.strip()]
    except FileNotFoundError:
        return []
    events = [json.loads(line) for line in lines[:-1]]
    if lines:
        try:
            events.append(json.loads(lines[-1]))
        except json.JSONDecodeError:
            if lines[-1].endswith("\n"):   # a whole line that is not JSON: not a write in progress
                raise
    return sorted(events, key=lambda e: e["t"])


class Tail:
    """A history read as it grows, by a thread of its run (a barrier keeper, a fault injector): each
    call returns the events appended since the last, in file order, whole lines only (a writer may
    be half-way through one); a file not there yet has no events."""

    def __init__(self, path: str | os.PathLike | None):
        self.path, self.offset = path, 0

    def __call__(self) -> list[dict]:
        if not self.path:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]
