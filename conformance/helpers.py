"""Small helpers shared by the conformance tests: starting workers at once, judging them."""
from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pytest

from gpujail.backends.probes import CDI_MODE, cdi_mode, gpu_files, problems  # noqa: F401 (CDI_MODE: the suites import it from here)
from gpujail.contract import BUNDLED
from gpujail.fixtures import BIN
from gpujail.fixtures import jail as jail_image
from gpujail.spec import PLACEHOLDER_MAX
from gpujail.world.failpoints import Barrier

MARKER_MAX = PLACEHOLDER_MAX   # REF-5 / REF-9


def is_cdi_mode(impl: str) -> bool:
    """Whether `impl` takes its file set from a CDI spec (`nvidia-ctk cdi generate`) instead of
    `nvidia-container-cli list`: a bundled CDI-mode implementation (probes.CDI_MODE, SPEC section 9),
    or any one run with --cdi-spec."""
    return cdi_mode(impl)


def start_all(world, n: int, prefix: str = "w", **kw) -> list:
    """Start n workers at once (the nodes are separate processes; threads only wait on them)."""
    workers: dict[int, object] = {}
    errors: dict[int, BaseException] = {}

    def start(i: int) -> None:
        try:
            workers[i] = world.start(f"{prefix}{i}", **kw)
        except BaseException as e:   # raised in the test's thread below, not lost with this one
            errors[i] = e
    threads = [threading.Thread(target=start, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[min(errors)]
    return [workers[i] for i in range(n)]


def lost(worker, jail) -> list[str]:
    """What a GPU job on `worker` cannot use (empty when every driver file is intact)."""
    return problems(worker.node.probe(gpu_files(jail)))


def one_line_error(worker, req: str = "") -> str:
    """The failing start's stderr, which must be exactly one line."""
    r = worker.attempts[-1]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, (f"{req + ': ' if req else ''}worker {worker.node_id} (exit {r.code}) must explain its failure "
                             f"in exactly one stderr line, wrote {len(lines)}:\n{r.stderr}")
    return lines[0]


def not_ready(req: str, worker) -> str:
    """Why `worker` should have become ready and did not: its exit code and its last error line."""
    if not worker.attempts:
        return f"{req}: worker {worker.node_id} did not become ready: it was never started"
    r = worker.attempts[-1]
    return (f"{req}: worker {worker.node_id} did not become ready (exit {r.code} after {len(worker.attempts)} "
            f"attempt(s)): {r.error_line or 'no error output'}")


def became_ready(req: str, worker, because: str) -> str:
    """A start that must fail exited 0."""
    return f"{req}: worker {worker.node_id} became ready (exit 0) although {because}; it must fail with a non-zero exit"


def lost_files(req: str, worker, gone: list[str], jail) -> str:
    """What `lost` found for `worker`, with the jail's paths relative to the jail."""
    prefix = str(jail).rstrip("/") + "/"
    return f"{req}: worker {worker.node_id} lost " + "; ".join(g.removeprefix(prefix) for g in gone)


def soname_broken(req: str, worker, r: dict) -> str:
    """A probe of a soname (`load: True`) that did not give a loadable, real library."""
    loader = (r.get("loader") or r.get("error") or "?").split(": ", 1)[-1]
    return (f"{req}: worker {worker.node_id}: a GPU job cannot load {os.path.basename(r['path'])} by its soname: "
            f"{r.get('size')} bytes (a real library is over 1024), loader says: {loader}")


def changes(before: dict, after: dict, ignore=()) -> list[str]:
    """The differences between two jail snapshots, one `path: what happened` per entry."""
    def entry(v) -> str:
        mode, size, link = v
        if link is not None:
            return f"symlink to {link}"
        kind = "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else f"type {stat.S_IFMT(mode):o}"
        return f"{kind} {stat.S_IMODE(mode):04o}" + ("" if stat.S_ISDIR(mode) else f", {size} bytes")
    out = []
    for k in sorted((set(before) | set(after)) - set(ignore)):
        if k not in before:
            out.append(f"{k}: created ({entry(after[k])})")
        elif k not in after:
            out.append(f"{k}: removed (was {entry(before[k])})")
        elif before[k] != after[k]:
            out.append(f"{k}: {entry(before[k])} became {entry(after[k])}")
    return out


def stub_cli(tmp_path: Path, list_output: str | None = None, configure: str | None = None, list_exit: int = 0) -> dict:
    """An environment whose `nvidia-container-cli` is a wrapper around the fake: `list` (the whole
    file set: no option) prints `list_output` if given and exits `list_exit` (`list` with options,
    e.g. `--libraries` for the 64-bit section, is the fake's); `configure` runs the shell snippet
    `configure` if given (with "$@"), else the real configure. Returns the env overrides for
    `world.start(env=...)`."""
    real = BIN / "nvidia-container-cli"
    d = tmp_path / "stub-cli"
    d.mkdir(exist_ok=True)
    lines = ["#!/bin/sh"]
    if list_output is not None:
        (d / "list.txt").write_text(list_output)
        lines.append(f'[ "$*" = list ] && {{ cat "{d}/list.txt"; exit {list_exit}; }}')
    if configure is not None:
        lines.append(f'for a; do [ "$a" = configure ] && {{ {configure}\n}}; done')
    lines.append(f'exec "{real}" "$@"')
    (d / "nvidia-container-cli").write_text("\n".join(lines) + "\n")
    (d / "nvidia-container-cli").chmod(0o755)
    return {"PATH": f"{d}:{real.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def new_entries(before: dict, jail, req: str = "") -> dict:
    """What the jail gained since `before`; every entry it had (lock files aside) must be unchanged."""
    after = jail_image.snapshot(jail)
    assert all(after.get(k) == v for k, v in before.items() if not k.endswith(".lock")), \
        (f"{req + ': ' if req else ''}the start changed what the jail held before it: "
         + "; ".join(changes({k: v for k, v in before.items() if after.get(k) != v and not k.endswith(".lock")},
                             {k: v for k, v in after.items() if before.get(k, v) != v})))
    return {k: v for k, v in after.items() if k not in before}


def only_whole_markers(before: dict, jail, req: str = "REF-5") -> None:
    """REF-5: compared with `before`, the jail gained only directories, complete non-empty markers
    (< 64 bytes) and lock files: never a truncated or empty placeholder."""
    for rel, (mode, size, _link) in new_entries(before, jail, req).items():
        if stat.S_ISREG(mode) and not rel.endswith(".lock"):
            assert 0 < size < MARKER_MAX, (f"{req}: {rel}: {size} bytes: the jail may gain only complete markers "
                                           f"(1 to {MARKER_MAX - 1} bytes), never an empty or truncated placeholder")


def paused_at(world, impl, failpoint: str, req: str, where: str, node: str = "w", term: str = "1*pause({name})",
              also: tuple[str, ...] = ()):
    """Start worker `node` paused at the first hit of `failpoint` (a barrier named after it; `term`
    may say more, e.g. what the next hit does): the barrier, the thread that runs the start and the
    dict its Worker lands in (key `node`). `also`: more failpoints armed with the same term (an
    implementation that mounts itself hits `ref.before_mount` where others run the CLI's). An
    implementation that never got there: skipped when it is a command without that failpoint (a
    vendor's script may call gpujail-failpoint: CONTRACT.md), failed when it is a bundled one."""
    name = failpoint.split(".")[-1]
    barrier, result = Barrier(name, world.barriers), {}
    env = {"GPUJAIL_FAILPOINTS": ";".join(f"{fp}={term.format(name=name)}" for fp in (failpoint, *also))}
    t = threading.Thread(target=lambda: result.setdefault(node, world.start(node, env=env)))
    t.start()
    while barrier.arrivals() == 0 and t.is_alive():
        time.sleep(0.002)
    if barrier.arrivals() == 0:
        t.join()
        if impl not in BUNDLED and not impl.startswith("mutant:"):
            pytest.skip(f"{impl!r} has no {failpoint} failpoint to time this with (CONTRACT.md: gpujail-failpoint)")
        pytest.fail(f"{req}: worker {node} never reached the failpoint {failpoint} {where} (exit "
                    f"{result[node].attempts[-1].code})")
    return barrier, t, result


def host_layout(world, layout: str) -> dict:
    """`world.start` options for a GPU worker on a host of distribution `layout` (fixtures/drivers.py
    LAYOUTS: where its libraries are), or a skip where this backend's nodes do not take the option
    (the docker backend's image holds the Debian layout only)."""
    from gpujail.fixtures import drivers
    lib64 = drivers.LAYOUTS[layout][0]
    node = world.node(f"{layout}-check", layout=layout)
    if node.run(["test", "-f", f"{lib64}/libcuda.so.{drivers.DEFAULT_VERSION}"]).code != 0:
        pytest.skip(f"this backend cannot make a {layout} host: no {lib64}/libcuda.so.* on its nodes")
    return {"node_options": {"layout": layout}}


def mps_hosts(world) -> dict:
    """`world.start` options for a GPU worker whose host runs MPS (its pipe directory
    /tmp/nvidia-mps, fixtures/drivers.py), or a skip where this backend cannot make such a host:
    the docker backend, and the kernel backend in a user namespace, do not overlay it yet (there
    the driver tree's /tmp would be a read-only overlay hiding the run directory under TMPDIR)."""
    if os.getuid() != 0:
        pytest.skip("the kernel backend in a user namespace cannot make a host run MPS yet (/tmp is not copy-on-write there)")
    node = world.node("mps-check", mps=True)
    if node.run(["test", "-d", "/tmp/nvidia-mps"]).code != 0:
        pytest.skip("this backend cannot make a host run MPS: no /tmp/nvidia-mps on its nodes")
    return {"node_options": {"mps": True}}
