"""What `gpujail run` and `gpujail reproduce` show while they run: a status line of tests done,
workers ready and faults injected (counted from the run's histories as they grow) and the time
elapsed."""
from __future__ import annotations

import json
import threading
import time

import pytest


class HistoryWatch:
    """Counts, as they are appended, the workers that became ready and the faults that acted
    (failpoints that fired with an action other than `off`, and the harness's kills) in the
    histories that `paths()` lists. Reads only what was added since the last poll."""

    def __init__(self, paths):
        self.paths, self.offsets = paths, {}
        self.ready: set[tuple[str, str]] = set()
        self.faults = 0

    def poll(self) -> None:
        for path in self.paths():
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            complete = data[:data.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                if b'"kind":"worker.ready"' in line and b'"node":"prewarm"' not in line:   # the warm jail's maker
                    self.ready.add((str(path), json.loads(line).get("node")))                # is no worker
                elif (b'"kind":"chaos.kill"' in line or b'"kind":"cli.syscall_fault"' in line
                      or (b'"kind":"failpoint"' in line and b'"action":"off"' not in line)):
                    self.faults += 1


class Progress(threading.Thread):
    """A status line every `every` seconds (rewritten in place on a terminal) until `stop()`."""

    def __init__(self, line, out, every: float):
        super().__init__(daemon=True)
        self.line, self.out, self.every = line, out, every
        self.started, self.done = time.monotonic(), threading.Event()
        self.tty = out.isatty()

    def elapsed(self) -> str:
        s = int(time.monotonic() - self.started)
        return f"{s // 60}:{s % 60:02d}"

    def run(self) -> None:
        while not self.done.wait(self.every):
            text = f"[{self.elapsed()}] {self.line()}"
            self.out.write(f"\r{text}\x1b[K" if self.tty else text + "\n")
            self.out.flush()

    def stop(self) -> None:
        self.done.set()
        self.join()
        if self.tty:
            self.out.write("\r\x1b[K")
            self.out.flush()


class TestCounter:
    """A pytest plugin counting tests done and failed (in the xdist controller: every worker's)."""

    def __init__(self):
        self.total, self.done, self.failed, self.interrupted, self.stopped_early = None, 0, 0, False, False

    def pytest_collection_finish(self, session):
        if session.items:
            self.total = len(session.items)

    def pytest_keyboard_interrupt(self, excinfo):
        # pytest and xdist stop a session for `-x`/`--maxfail` by raising their own `Interrupted`, a
        # KeyboardInterrupt: a run that failed and stopped early, not Ctrl-C (issue 28).
        if type(excinfo.value).__name__ == "Interrupted":
            self.stopped_early = True
        else:
            self.interrupted = True

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.total = len(ids)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.done += 1
            self.failed += report.failed
