"""Tests for gpujail/world/history.py: the append-only event history shared by every process of a run."""
from __future__ import annotations

import json
import threading

from gpujail.world import history


def test_threads_switching_histories_lose_nothing(tmp_path):
    """The harness appends from many threads, and a process (a pytest-xdist worker) moves from one
    run's history to the next: threads switching paths at once must neither fail (EBADF from a
    descriptor closed under them) nor write into the wrong file."""
    paths = [str(tmp_path / f"h{i}.jsonl") for i in range(2)]
    errors = []

    def writer(n: int) -> None:
        try:
            for k in range(300):
                path = paths[(n + k) % 2]
                history.append(path, "cli.mkdir", node=f"w{n}", path=str((n + k) % 2))
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, path in enumerate(paths):
        events = [json.loads(line) for line in open(path)]
        assert len(events) == 8 * 150 and {e["path"] for e in events} == {str(i)}
