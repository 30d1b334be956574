"""The file transport between a coordinator and its node agents: requests and replies as files.

How this works
--------------
A node answers JSON requests over a pipe (the kernel backend), a unix socket (the docker backend),
or, for the launchers (gpujail/launchers/), as files in a directory of a run directory on a shared
file system, the one thing every node of a real cluster shares: the coordinator on one machine,
the `gpujail node` agents on the others (`FileChannel`).

The caller writes `in/SEQ.json`, the server answers `out/SEQ.json`; each file appears whole
(written beside, then renamed: a rename is atomic on local file systems and NFS alike). A waiting
side sleeps on inotify (`_Watch`), which wakes it at once for a file written on this machine; a
change another machine makes on a shared file system raises no event here, so it also looks again
every `FileChannel.IDLE` seconds (slower while its peer has shown itself to be on this machine).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import threading
import time

_libc = ctypes.CDLL(None, use_errno=True)


class _Watch:
    """Wakes a waiter when a file is renamed into `directory` by a process of this machine
    (inotify), else after the timeout: a change another machine makes on a shared file system
    raises no event here, so a waiter still looks at least every `FileChannel.IDLE` seconds."""

    IN_MOVED_TO, IN_NONBLOCK, IN_CLOEXEC = 0x80, 0o4000, 0o2000000

    def __init__(self, directory: str):
        self.fd = _libc.inotify_init1(self.IN_NONBLOCK | self.IN_CLOEXEC)
        if self.fd >= 0 and _libc.inotify_add_watch(self.fd, directory.encode(), self.IN_MOVED_TO) < 0:
            os.close(self.fd)
            self.fd = -1

    def wait(self, timeout: float) -> bool:
        """True when an event woke it (a file written on this machine), False at the timeout."""
        if self.fd < 0:
            time.sleep(timeout)
            return False
        if not select.select([self.fd], [], [], timeout)[0]:
            return False
        self.drain()
        return True

    def drain(self) -> None:
        """Forget the events so far (a reused watch: they were another waiter's)."""
        if self.fd >= 0:
            with contextlib.suppress(BlockingIOError):
                while os.read(self.fd, 65536):
                    pass

    def close(self) -> None:
        if self.fd >= 0:
            # libc's close, as libc's inotify_init1 made it: __del__ may run at any later collection,
            # also inside a test that patched `os` (pyfakefs: EBADF, an unraisable warning in CI 107)
            _libc.close(self.fd)
            self.fd = -1

    __del__ = close   # a channel's spare watches go with it: inotify instances are few (128 a user)


class FileChannel:
    """The file transport, beside the pipe and the unix socket: requests and replies as files in a
    directory of a run directory on a shared file system, the one thing every node of a real cluster
    shares (launchers: the coordinator on one machine, `gpujail node` agents on the others).

    The caller writes `in/SEQ.json`, the server answers `out/SEQ.json`; each file appears whole
    (written beside, then renamed: a rename is atomic on local file systems and NFS alike). A
    waiting side sleeps on inotify (`_Watch`), which wakes it at once for a file written on this
    machine. A shared file system has no notification that crosses machines, so it also looks
    every `IDLE` seconds, or every `LOCAL_IDLE` seconds while every file so far came with an
    event (its peer is on this machine: the local launcher's agents do not spin)."""

    IDLE = 0.02         # the longest wait between two looks, for a peer on another machine
    LOCAL_IDLE = 0.2    # the same while the peer has shown itself to be on this machine

    def __init__(self, directory: str):
        self.dir = directory
        for sub in ("in", "out"):
            os.makedirs(os.path.join(directory, sub), exist_ok=True)
        self._seq, self._lock = 0, threading.Lock()
        self.remote = False   # a file was found that no event announced: poll at IDLE from then on
        # Watches on out/ for waiters, kept for the next: closing an inotify instance waits for an
        # RCU grace period (milliseconds), which one a call made every call that slow.
        self._spare: list[_Watch] = []

    def _idle(self, watch: _Watch) -> float:
        return self.IDLE if self.remote or watch.fd < 0 else self.LOCAL_IDLE

    @staticmethod
    def _put(path: str, data: dict) -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.rename(path + ".tmp", path)

    # -- the caller's side
    def send(self, req: dict) -> int:
        with self._lock:
            self._seq += 1
            seq = self._seq
        self._put(os.path.join(self.dir, "in", f"{seq:08d}.json"), req)
        return seq

    def wait(self, seq: int, alive=lambda: None, timeout: float | None = None) -> dict:
        """The reply to request `seq`. `alive()` returns why the server is gone (then this raises
        RuntimeError) or None."""
        path = os.path.join(self.dir, "out", f"{seq:08d}.json")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            watch = self._spare.pop() if self._spare else _Watch(os.path.dirname(path))
        watch.drain()   # before the first look: no rename falls between
        woken = True
        try:
            while True:
                try:
                    with open(path) as f:
                        reply = json.load(f)
                    os.unlink(path)
                    self.remote |= not woken
                    return reply
                except FileNotFoundError:
                    pass
                gone = alive()
                if gone:
                    raise RuntimeError(gone)
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"no reply to request {seq} in {self.dir} within {timeout:g} s")
                woken = watch.wait(self._idle(watch))
        finally:
            with self._lock:
                self._spare.append(watch)

    def call(self, req: dict, alive=lambda: None, timeout: float | None = None) -> dict:
        return self.wait(self.send(req), alive, timeout)

    # -- the server's side
    def requests(self, stopped=lambda: False):
        """Yield (seq, request) in order as they arrive, until `stopped()`."""
        inbox = os.path.join(self.dir, "in")
        watch = _Watch(inbox)
        woken = True
        try:
            while not stopped():
                names = sorted(n for n in os.listdir(inbox) if n.endswith(".json"))
                self.remote |= bool(names) and not woken
                for name in names:
                    with open(os.path.join(inbox, name)) as f:
                        req = json.load(f)
                    os.unlink(os.path.join(inbox, name))
                    yield int(name[:-5]), req
                woken = True if names else watch.wait(self._idle(watch))
        finally:
            watch.close()

    def reply(self, seq: int, reply: dict) -> None:
        self._put(os.path.join(self.dir, "out", f"{seq:08d}.json"), reply)
