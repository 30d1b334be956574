"""Tests for gpujail/world/history.py: the append-only event history shared by every process of a run."""
from __future__ import annotations

import json
import threading

import pytest

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


def test_a_record_still_being_written_is_left_for_the_next_read(tmp_path):
    """A run's threads read its history while it grows (jailfs_fleet's injector counts readies): a
    last line cut short by a writer in mid-write is not an error, and is read once it is whole. A
    whole line that is not JSON still is one (seen in CI: the injector's thread died on the cut line,
    the latency never began, and the scenario went INCONCLUSIVE)."""
    path = tmp_path / "history.jsonl"
    whole = '{"t": 1.0, "node": "w0", "kind": "worker.ready"}\n'
    path.write_text(whole + '{"t": 2.0, "node": "w1", "ki')
    assert [e["node"] for e in history.load(str(path))] == ["w0"]
    path.write_text(whole + '{"t": 2.0, "node": "w1", "kind": "worker.ready"}\n')
    assert [e["node"] for e in history.load(str(path))] == ["w0", "w1"]
    path.write_text(whole + "not json\n")
    with pytest.raises(json.JSONDecodeError):
        history.load(str(path))


def test_a_tail_reads_each_whole_record_once(tmp_path):
    """history.Tail (the barrier keeper's and the fault injector's reader): each call returns only
    what was appended since, and a record still being written waits for its newline."""
    path = tmp_path / "history.jsonl"
    tail = history.Tail(path)
    assert tail() == []   # no file yet
    with open(path, "w") as f:
        f.write('{"t": 1.0, "node": "w0", "kind": "worker.ready"}\n{"t": 2.0, "node": "w1", "ki')
        f.flush()
        assert [e["node"] for e in tail()] == ["w0"]
        f.write('nd": "worker.ready"}\n')
        f.flush()
        assert [e["node"] for e in tail()] == ["w1"]
        assert tail() == []
