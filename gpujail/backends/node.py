"""A simulated worker node: one process holding a private mount namespace (kernel backend).

How this works
--------------
`python -m gpujail.backends.node CONFIG_JSON` is started by the harness (`gpujail/backends/kernel.py`) with pipes on
stdin/stdout, or forked with them by the harness's node factory (`--factory`, node_factory.py), which has
made the imports and bytecode (`prepare`) once for all its nodes. This module is the node's entry
point and its request loop; each step's work is a module of its own:

1. enters its namespaces (namespaces.py): a private mount namespace and a PID namespace (plus a user
   namespace when not root, SPEC K-5) of which it is PID 1, so when it dies the kernel kills every
   process of the node (implementation, fake CLIs), and when the last process goes the mount
   namespace and all its mounts go too. Both processes ask to be SIGKILLed when their parent dies,
   so a dead harness leaves nothing behind (SPEC INV-6);
2. builds the node's view of the host, in this namespace only (node_view.py): the host seen
   copy-on-write (cow.py: a start's writes outside the jail are recorded, never done), with the
   cached driver tree as a lower layer of `/usr` (driver files at their real host paths), a fresh
   tmpfs `/dev` holding the usual devices (bind mounts of the host's) plus NVIDIA device nodes, a
   tmpfs `/run` holding the persistenced socket (a real AF_UNIX socket), and the node-local `/dev`
   and `/run` bind-mounted over `JAIL/dev` and `JAIL/run` (that is how a real jail sees node-local
   objects, SPEC REF-3);
3. answers JSON-line requests (`serve`): `run` an implementation (node_starts.py: exit code, output
   up to a cap, duration, what it changed outside the jail; at its deadline or exit, every process
   it started is killed), `probe` files through the jail with the real loader (node_probes.py, and
   sonames through the jail's linker cache), `mounts`, `exit`. The warm paths (warm.py) keep
   interpreters out of a start: a bundled implementation (`python -S -m gpujail.reference_impl
   ...`) is forked from this node, not exec'd, and while a start runs this process serves its CLI
   runs, forking the fake `nvidia-container-cli` for each bash client; anything else, a vendor's
   command above all, is exec'd as given.
   Before step 1 the node writes the bytecode the starts read (`write_bytecode`): they may not.

The host's own `/usr`, `/dev`, `/run` are never written: every change is a mount in this namespace.

In the docker backend (gpujail/docker_backend.py) the same agent is PID 1 of a container, its
entrypoint: step 1 is the container itself, the driver files are bind-mounted by the engine (no
overlay), the harness talks to it over a unix socket named by `listen` in the config instead of
pipes (`accept_harness`), and the container's command (the implementation under test, after the
config argument) is run first, with the container's environment and working directory, as if it
were a `run` request.

For the launchers (gpujail/launchers/) a third transport, file_channel.py's `FileChannel`: requests
and replies as files in a run directory on a shared file system, between the coordinator on one
machine and the node agents (`gpujail node`) on the others, which hold nodes like this one.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sys

from gpujail.backends import cli_server, namespaces, node_factory, node_probes, node_starts, node_view, warm
from gpujail.world import history
from gpujail.world.sysops import MS_PRIVATE, MS_REC, RealSys

sysops = RealSys()


# Every worker start runs the bundled code (this node, an implementation, each fake CLI run) in
# processes that must not write outside the jail (PYTHONDONTWRITEBYTECODE in the contract's
# environment: a .pyc is an outside write), so without bytecode on disk each of them compiles every
# module it imports again: most of a fake CLI start (benchmarks: `cli-startup`).
BYTECODE_PACKAGES = ("gpujail", "gpujail.world", "gpujail.backends", "gpujail.fixtures", "gpujail.reference_impl")


def _without_bytecode(dirs: list[str]) -> list[str]:
    """The modules in `dirs` whose bytecode is missing or older than their source."""
    tag, stale = sys.implementation.cache_tag, []
    for d in dirs:
        for entry in os.scandir(d):
            if entry.name.endswith(".py") and entry.is_file():
                try:
                    pyc = os.stat(os.path.join(d, "__pycache__", f"{entry.name[:-3]}.{tag}.pyc"))
                    if pyc.st_mtime >= entry.stat().st_mtime:
                        continue
                except FileNotFoundError:
                    pass
                stale.append(entry.path)
    return stale


def write_bytecode() -> None:
    """Write the bytecode of the packages a start runs where it is missing or older than its source,
    as `pip install` does at install time and a checkout's first import would without
    PYTHONDONTWRITEBYTECODE. Done by the node before it enters its namespaces (a host process, like
    the harness), under a lock so that 16 nodes starting at once compile once; a read-only install
    is left as it is. One stat per file when all is written (the usual case)."""
    import importlib.util
    dirs = [os.path.dirname(importlib.util.find_spec(name).origin) for name in BYTECODE_PACKAGES]
    if not _without_bytecode(dirs):
        return
    import fcntl
    import py_compile
    with open(importlib.util.find_spec("gpujail").origin, "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # on the package's __init__.py, read-only: no lock file to leave
        for path in _without_bytecode(dirs):   # again: another node may have written them meanwhile
            try:
                py_compile.compile(path, doraise=True)
            except py_compile.PyCompileError:
                continue   # a broken module fails where it is imported, as before
            except OSError:
                return     # a read-only install: not each file again


# -- requests -----------------------------------------------------------------------------------

def op_mounts(req: dict) -> dict:
    under = req.get("under", "/")
    return {"mounts": [m._asdict() for m in sysops.mounts() if m.mountpoint.startswith(under)]}


OPS = {"run": node_starts.op_run, "probe": node_probes.op_probe, "mounts": op_mounts}


def serve(inp, out) -> None:
    for line in inp:
        req = json.loads(line)
        if req["op"] == "exit":
            break
        try:
            reply = OPS[req["op"]](req)
        except Exception as e:  # a broken request must not kill the node silently
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def accept_harness(path: str, timeout: float = 120.0):
    """Docker backend: this process is PID 1 of a container, which already is a private mount and
    PID namespace that the engine removes when PID 1 exits. The harness connects to a unix socket
    in a directory bind-mounted from the host; when the harness goes away the connection closes,
    `serve` returns, and the container ends with everything in it (SPEC INV-6)."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(timeout)
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        sys.exit("node: nobody connected to the harness socket")
    finally:
        srv.close()
        os.unlink(path)
    conn.settimeout(None)
    return conn.makefile("r"), conn.makefile("w")


_prepared = False


def prepare() -> None:
    """What every node of this process runs, imported and compiled once: by the node factory before
    it forks its first node (node_factory.py), else by each node."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    write_bytecode()
    if warm.enabled():
        for module in warm.WARM_MODULES:
            warm.warmed_up(module)
        from gpujail.fixtures import fake_cli  # noqa: F401  (the CLI server's children run it)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    command, command_env = sys.argv[2:], dict(os.environ)   # docker: the container's command and environment
    os.environ.update(cfg.get("env", {}))
    container = bool(cfg.get("listen"))
    if container:
        inp, out = accept_harness(cfg["listen"])
    else:
        inp, out = sys.stdin, sys.stdout
        namespaces.die_with_parent()
    # A worker's usual umask whatever the harness's: the CLI creates placeholders with
    # `mode & ~umask` and skips them by exact mode (CLI-4), so warm starts must not depend on it.
    os.umask(0o022)
    cfg["privileged"] = namespaces.HOST_UID == 0
    # A container's writes land in its own writable layer, never on the host: no overlays of ours
    # (they would also hide the files the engine bound in at their host paths).
    cfg.setdefault("cow", not container)
    try:
        if container:
            sysops.mount(None, "/", None, MS_REC | MS_PRIVATE)
        elif namespaces.entered is not None:   # by the factory, before this process became the node (enter)
            if isinstance(namespaces.entered, OSError):
                raise namespaces.entered
        else:
            prepare()
            namespaces.enter(cfg)
        sys.dont_write_bytecode = True   # from here on a .pyc written would be a write outside the jail
        node_view.build_view(cfg)
        if warm.enabled():
            node_starts.cli_server = cli_server.CliServer()
    except OSError as e:
        out.write(json.dumps({"error": f"node setup failed: {e}"}) + "\n")
        out.flush()
        sys.exit(3)
    history.record("node.up")   # the envelope carries the pid
    # /proc is still the host's procfs, so /proc/self names our pid as the host sees it: the
    # harness kills PID 1 by it, which takes down every process of the node at once. (In a
    # container it is the container's own pid; the engine kills containers.)
    out.write(json.dumps({"ready": True, "uid": os.getuid(), "host_pid": int(os.readlink("/proc/self"))}) + "\n")
    out.flush()
    if command:   # the container's command (the implementation), in the jail, as its first request
        out.write(json.dumps(node_starts.op_run({"argv": command, "env": command_env, "cwd": os.getcwd(),
                                                 "timeout": cfg.get("timeout") or None})) + "\n")
        out.flush()
    serve(inp, out)


def run_node() -> None:
    try:
        main()
    except BrokenPipeError:
        sys.exit(errno.EPIPE)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--factory"]:   # node_factory.Factory: this process forks the nodes
        namespaces.die_with_parent()
        node_factory.factory_main(int(sys.argv[2]), prepare, namespaces.fork_node,
                          lambda cfg: namespaces.enter(cfg) if not cfg.get("listen") else None, run_node)
    else:
        run_node()
