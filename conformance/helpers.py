"""Small helpers shared by the conformance tests: starting workers at once, judging them."""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from gpujail.fixtures import BIN
from gpujail.fixtures import jail as jail_image

from gpujail.backends.probes import gpu_files, problems
from gpujail.spec import PLACEHOLDER_MAX

MARKER_MAX = PLACEHOLDER_MAX   # REF-5 / REF-9


def start_all(world, n: int, prefix: str = "w", **kw) -> list:
    """Start n workers at once (the nodes are separate processes; threads only wait on them)."""
    workers: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: workers.__setitem__(i, world.start(f"{prefix}{i}", **kw)))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [workers[i] for i in range(n)]


def lost(worker, jail) -> list[str]:
    """What a GPU job on `worker` cannot use (empty when every driver file is intact)."""
    return problems(worker.node.probe(gpu_files(jail)))


def one_line_error(worker) -> str:
    """The failing start's stderr, which must be exactly one line."""
    r = worker.attempts[-1]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got:\n{r.stderr}"
    return lines[0]


def stub_cli(tmp_path: Path, list_output: str | None = None, configure: str | None = None, list_exit: int = 0) -> dict:
    """An environment whose `nvidia-container-cli` is a wrapper around the fake: `list` prints
    `list_output` if given and exits `list_exit`; `configure` runs the shell snippet `configure` if
    given (with "$@"), else the real configure. Returns the env overrides for `world.start(env=...)`."""
    real = BIN / "nvidia-container-cli"
    d = tmp_path / "stub-cli"
    d.mkdir(exist_ok=True)
    lines = ["#!/bin/sh"]
    if list_output is not None:
        (d / "list.txt").write_text(list_output)
        lines.append(f'for a; do [ "$a" = list ] && {{ cat "{d}/list.txt"; exit {list_exit}; }}; done')
    if configure is not None:
        lines.append(f'for a; do [ "$a" = configure ] && {{ {configure}\n}}; done')
    lines.append(f'exec "{real}" "$@"')
    (d / "nvidia-container-cli").write_text("\n".join(lines) + "\n")
    (d / "nvidia-container-cli").chmod(0o755)
    return {"PATH": f"{d}:{real.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def new_entries(before: dict, jail) -> dict:
    after = jail_image.snapshot(jail)
    assert all(after.get(k) == v for k, v in before.items() if not k.endswith(".lock")), \
        [k for k, v in before.items() if after.get(k) != v]
    return {k: v for k, v in after.items() if k not in before}


def only_whole_markers(before: dict, jail) -> None:
    """REF-5: compared with `before`, the jail gained only directories, complete non-empty markers
    (< 64 bytes) and lock files: never a truncated or empty placeholder."""
    for rel, (mode, size, _link) in new_entries(before, jail).items():
        if stat.S_ISREG(mode) and not rel.endswith(".lock"):
            assert 0 < size < MARKER_MAX, f"{rel}: {size} bytes"
