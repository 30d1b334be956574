"""A simulated worker node: one process holding a private mount namespace (kernel backend).

How this works
--------------
`python -m gpujail.backends.node CONFIG_JSON` is started by the harness (`gpujail/backends/kernel.py`) with pipes on
stdin/stdout, or forked with them by the harness's node factory (`--factory`, warm.py), which has
made the imports and bytecode (`prepare`) once for all its nodes. It:

1. unshares a mount namespace and a PID namespace (plus a user namespace when not root, SPEC K-5),
   makes every mount private, and forks: the child is PID 1 of the new PID namespace, so when it
   dies the kernel kills every process of the node (implementation, fake CLIs), and when the last
   process goes the mount namespace and all its mounts go too. Both processes ask to be SIGKILLed
   when their parent dies, so a dead harness leaves nothing behind (SPEC INV-6);
2. builds the node's view of the host, in this namespace only: the host seen copy-on-write (cow.py:
   a start's writes outside the jail are recorded, never done), with the cached driver tree as a
   lower layer of `/usr` (driver files at their real host paths), a fresh tmpfs `/dev` holding the usual devices
   (bind mounts of the host's) plus NVIDIA device nodes, a tmpfs `/run` holding the persistenced
   socket (a real AF_UNIX socket), and the node-local `/dev` and `/run` bind-mounted over
   `JAIL/dev` and `JAIL/run` (that is how a real jail sees node-local objects, SPEC REF-3);
3. answers JSON-line requests: `run` an implementation (exit code, output up to a cap, duration,
   what it changed outside the jail; at its deadline or exit, every process it started is killed),
   `probe` files through the jail with the real loader (and sonames through the jail's linker
   cache: `probe_lookup`), `mounts`, `exit`. The warm paths (warm.py) keep interpreters out of a
   start: a bundled implementation (`python -S -m gpujail.reference_impl ...`) is forked from this
   node, not exec'd, and while a start runs this process serves its CLI runs, forking the fake
   `nvidia-container-cli` for each bash client, in the loop that also reads the start's output and
   waits for its end (`_wait`); anything else, a vendor's command above all, is exec'd as given.
   Before step 1 the node writes the bytecode the starts read (`write_bytecode`): they may not.

The host's own `/usr`, `/dev`, `/run` are never written: every change is a mount in this namespace.

In the docker backend (gpujail/docker_backend.py) the same agent is PID 1 of a container, its
entrypoint: step 1 is the container itself, the driver files are bind-mounted by the engine (no
overlay), the harness talks to it over a unix socket named by `listen` in the config instead of
pipes, and the container's command (the implementation under test, after the config argument) is
run first, with the container's environment and working directory, as if it were a `run` request.

For the launchers (gpujail/launchers/) a third transport, `FileChannel`: requests and replies as
files in a run directory on a shared file system, between the coordinator on one machine and the
node agents (`gpujail node`) on the others, which hold nodes like this one.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from gpujail.backends import cow, warm
from gpujail.backends.probes import result_path, unanswered
from gpujail.world import history
from gpujail.world.sysops import MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC, RealSys

MS_MOVE = 8192

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
PR_SET_PDEATHSIG = 1
HOST_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_libc = ctypes.CDLL(None, use_errno=True)
sysops = RealSys()


def _die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"unshare: {os.strerror(e)}")


def enter_namespaces(pid1: bool = False) -> None:
    """Private mount + PID namespace (+ user namespace when unprivileged). Forks: returns in PID 1.
    `pid1`: this process already is the PID 1 of a new PID namespace (fork_node): the mount
    namespace only."""
    uid, gid = os.getuid(), os.getgid()
    if pid1:
        _unshare(CLONE_NEWNS)
        sysops.mount(None, "/", None, MS_REC | MS_PRIVATE)
        _die_with_parent()
        return
    flags = CLONE_NEWNS | CLONE_NEWPID
    if uid != 0:
        flags |= CLONE_NEWUSER
    _unshare(flags)
    if uid != 0:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    sysops.mount(None, "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid:  # the outer process only relays the exit status of PID 1
        _die_with_parent()
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    _die_with_parent()


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


def enter_mount_ns(path: str) -> None:
    """Start from another mount namespace than the harness's: one holding this node's own client of
    a network jail (gpujail/backends/jailfs.py), so the copy this node makes sees the jail through it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNS) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {path}: {os.strerror(e)}")
    finally:
        os.close(fd)
    os.chdir("/")


def build_view(cfg: dict) -> None:
    """The node's view of the host and of the jail, in this mount namespace only."""
    global host_view
    tree, jail = cfg.get("driver_tree"), cfg["jail"]
    lowers = {os.path.realpath("/" + top): os.path.join(tree, top) for top in sorted(os.listdir(tree))} if tree else {}
    sysops.mount("tmpfs", "/run", "tmpfs", 0, "mode=0755")
    if cfg.get("cow", True):
        # The host copy-on-write (cow.py): what a start writes outside the jail is seen, never done.
        history_file, barriers = cfg["env"].get("GPUJAIL_HISTORY"), cfg["env"].get("GPUJAIL_BARRIERS")
        shared = [jail, *([os.path.dirname(history_file)] if history_file else []), *([barriers] if barriers else [])]
        host_view = cow.cover(shared, lowers)
        lowers = {p: lower for p, lower in lowers.items() if p not in {point for point, *_ in host_view.layers}}
    for target, lower in lowers.items():   # driver files at their host paths, read-only
        sysops.mount("overlay", target, "overlay", 0, f"lowerdir={lower}:{target}")
    _node_dev(cfg)
    if cfg.get("jail_tmpfs"):
        # A small file system under the jail (this node only), holding a copy of the jail: for
        # ENOSPC scenarios. Staged through /run because the tmpfs hides what it is mounted on.
        stage = "/run/.jail-copy"
        shutil.copytree(jail, stage, symlinks=True)
        sysops.mount("tmpfs", jail, "tmpfs", 0, f"size={cfg['jail_tmpfs']},mode=0755")
        shutil.copytree(stage, jail, symlinks=True, dirs_exist_ok=True)
        shutil.rmtree(stage)
    if cfg.get("jail_readonly"):
        sysops.mount(jail, jail, None, MS_BIND | MS_REC)
        sysops.remount(jail, MS_RDONLY)
    for path in [cfg["socket"]] if isinstance(cfg.get("socket"), str) else cfg.get("socket") or []:   # list: --cdi-spec
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)   # a real socket inode; nobody needs to listen for a bind mount of it
        s.close()
        os.chmod(path, 0o777)
    for d in ("dev", "run"):
        # A hostile jail may have replaced dev/ or run/ with a symlink: mount on the real directory
        # only (O_NOFOLLOW on the last component), never follow it out of the jail.
        fd = os.open(os.path.join(jail, d), os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
        try:
            sysops.mount(f"/{d}", f"/proc/self/fd/{fd}", None, MS_BIND | MS_REC)
        finally:
            os.close(fd)
    _jail_proc(jail)


def _jail_proc(jail: str) -> None:
    """The worker's own procfs on JAIL/proc, as the operator's workers have: a standalone CLI (no
    `--pid`) finds its parent's owner and mount namespace at ROOTFS/proc/<ppid> (SPEC CLI-5,
    nvc_container.c). Mounted by this process, PID 1 of the node's PID namespace, so it shows that
    namespace: a parent outside the node is ppid 0, which no proc shows. A jail whose proc/ is not a
    directory (a hostile symlink, none at all) gets none, like a real node's: the CLI fails then."""
    try:
        fd = os.open(os.path.join(jail, "proc"), os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
    except OSError:
        return
    try:
        sysops.mount("proc", f"/proc/self/fd/{fd}", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    finally:
        os.close(fd)


def _node_dev(cfg: dict) -> None:
    """A tmpfs /dev with the host's everyday devices (bind mounts) and this node's NVIDIA nodes.

    Built in a staging tmpfs under /run while the host's /dev is still visible, then moved over /dev
    (fds opened before unshare belong to the old namespace and cannot be bind sources)."""
    stage = "/run/.node-dev"
    os.mkdir(stage)
    sysops.mount("tmpfs", stage, "tmpfs", 0, "mode=0755")
    for name in HOST_DEVICES:
        open(f"{stage}/{name}", "w").close()
        sysops.bind_mount(f"/dev/{name}", f"{stage}/{name}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{stage}/{name}")
    os.mkdir(f"{stage}/shm", 0o1777)
    os.chmod(f"{stage}/shm", 0o1777)
    for path, major, minor in cfg.get("devices", []):
        local = stage + path[len("/dev"):]
        os.makedirs(os.path.dirname(local), exist_ok=True)   # /dev/nvidia-caps/... (--cdi-spec)
        if cfg["privileged"]:
            os.mknod(local, 0o020666, os.makedev(major, minor))
            os.chmod(local, 0o666)
        else:  # no mknod in a user namespace: a bind mount of /dev/null stands in for the node
            open(local, "w").close()
            sysops.bind_mount("/dev/null", local)
    sysops.mount(stage, "/dev", None, MS_MOVE)
    os.rmdir(stage)


# -- requests -----------------------------------------------------------------------------------

NODE_LOCAL = ("/dev", "/run")   # the node's own tmpfs trees, compared before and after each start
host_view: cow.HostView | None = None   # set by build_view; None in a container (the engine's layers)
cli_server: warm.CliServer | None = None   # set by main when warm starts are on (warm.py, 3)
OUTPUT_CAP = 256 * 1024   # bytes kept of each output stream (the tail): a chatty script cannot grow the harness


class _Tail:
    """One output pipe of a start, read as the data comes by op_run's loop (so a writer never blocks
    on a full pipe), keeping only the last OUTPUT_CAP bytes and counting what it dropped."""

    def __init__(self, pipe):
        self.pipe, self.data, self.dropped, self.open = pipe, bytearray(), 0, True
        os.set_blocking(pipe.fileno(), False)

    def fileno(self) -> int:
        return self.pipe.fileno()

    def read(self) -> None:
        """What the pipe holds now (closed at end of file)."""
        while self.open:
            try:
                chunk = os.read(self.pipe.fileno(), 65536)
            except BlockingIOError:
                return
            self._keep(chunk)

    def _keep(self, chunk: bytes) -> None:
        if not chunk:
            self.open = False
            return
        self.data += chunk
        if len(self.data) > OUTPUT_CAP:
            self.dropped += len(self.data) - OUTPUT_CAP
            del self.data[:len(self.data) - OUTPUT_CAP]

    def text(self) -> str:
        """The rest, to the end of file (every writer is dead by now: _end_strays), and the tail."""
        os.set_blocking(self.pipe.fileno(), True)
        while self.open:
            self._keep(os.read(self.pipe.fileno(), 65536))
        self.pipe.close()
        head = f"[gpujail: {self.dropped} earlier bytes of this output dropped]\n" if self.dropped else ""
        return head + self.data.decode(errors="replace")


def _wait(p, tails: list[_Tail], timeout: float | None, serving: warm.CliServer | None) -> int | str:
    """Until the start `p` exits (its exit code) or reaches its deadline ("timeout"), reading its
    output and serving its CLI runs meanwhile: all in this one thread, which forks the fakes."""
    pidfd = p.pidfd if isinstance(p, warm.Forked) else os.pidfd_open(p.pid)
    deadline = None if timeout is None else time.monotonic() + timeout
    if serving:
        serving.begin([pidfd, *(t.fileno() for t in tails)])
    try:
        while True:
            watched = [pidfd, *(t for t in tails if t.open), *(serving.fds() if serving else [])]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = select.select(watched, [], [], left)[0]
            if not ready and deadline is not None and time.monotonic() >= deadline:
                return "timeout"
            for r in ready:
                if isinstance(r, _Tail):
                    r.read()
                elif r != pidfd:
                    serving.handle(r)
            if pidfd in ready:
                return p.wait()
    finally:
        if not isinstance(p, warm.Forked):
            os.close(pidfd)


def _end_strays(p: subprocess.Popen) -> None:
    """Nothing a start runs may outlive it: a daemon it `setsid`'d would hold its output pipes open
    (and the node) forever. As PID 1 of the node's PID namespace, kill(-1) reaches exactly the
    node's processes, this agent excepted; then reap them (orphans are reparented to PID 1)."""
    if os.getpid() != 1:   # not in a node of our own (a self-test calling op_run): the start's group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    p.wait()
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def op_run(req: dict) -> dict:
    env, timeout = req["env"], req.get("timeout")
    start = time.monotonic()
    history.record("impl.start", argv=req["argv"])
    local = cow.snapshot(*NODE_LOCAL)
    serving = cli_server if cli_server and os.getpid() == 1 else None   # (warm.py, 3)
    if serving:
        env = {**env, warm.CLI_SERVER_ENV: serving.address}
    module = warm.warm_module(req["argv"], env, req["cwd"])
    module = module if module and warm.warmed_up(module) else None
    try:
        if module:
            p = warm.fork_start(module, req["argv"], env, req["cwd"])
        else:
            p = subprocess.Popen(req["argv"], cwd=req["cwd"], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        history.record("impl.exit", code=127, error=str(e))
        return {"code": 127, "stdout": "", "stderr": f"{req['argv'][0]}: {e.strerror}\n", "duration": 0.0}
    out, err = _Tail(p.stdout), _Tail(p.stderr)
    code = _wait(p, [out, err], timeout, serving)
    _end_strays(p)
    if serving:
        serving.end()
    duration = time.monotonic() - start
    stdout, stderr = out.text(), err.text()
    if code == "timeout":
        stderr += f"timeout after {timeout:g} s: the start and everything it started were killed\n"
    # The node-local /dev and /run are the worker's own (a container's): what a start adds there is
    # its scratch space, but deleting or changing what the node had (its device nodes, the
    # persistenced socket) counts, for a start that reports ready. A failed start's node is replaced
    # (a restarted container gets fresh ones), and a failing CLI's own cleanup deletes the device
    # nodes and sockets it mounted over (CLI-6), which is not the start's doing.
    node_local = [c for c in cow.compare(local, cow.snapshot(*NODE_LOCAL)) if c["change"] != "created"]
    outside = (host_view.changes() if host_view else []) + (node_local if code == 0 else [])
    if outside:
        history.record("impl.outside", changes=outside)
    history.record("impl.exit", code=code, duration=duration, stderr=stderr[-2000:])
    return {"code": code, "stdout": stdout, "stderr": stderr, "duration": duration, "outside": outside}


def probe_one(jail_path: str, host_path: str | None, load: bool, mountpoints: set[str]) -> dict:
    """What a GPU job on this node would see at `jail_path` (runs in a forked child)."""
    res: dict = {"path": jail_path, "attached": os.path.realpath(jail_path) in mountpoints}
    try:
        data = open(jail_path, "rb").read()
        res["size"] = len(data)
        if host_path:
            res["same_bytes"] = data == open(host_path, "rb").read()
    except OSError as e:
        res["error"] = f"{e.strerror}"
        res["size"] = None
    if load:
        try:
            lib = ctypes.CDLL(jail_path)
            res["loader"] = "ok"
            try:   # which driver it is (REF-12): the fixtures' libraries export their version
                res["driver"] = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, "gpujail_driver_version"))).decode()
            except ValueError:
                pass
        except OSError as e:
            res["loader"] = str(e)
    return res


# The loader's default directories (Debian multiarch), searched when the cache has no entry.
LOADER_DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib")
RTLD_DI_LINKMAP = 2
_cache_listing: dict[str, list[str]] = {}   # filled in a probe's child only: one `ldconfig -p` per round


def probe_lookup(req: dict, mountpoints: set[str]) -> dict:
    """What a GPU job that asks the loader for `lookup` (a soname) gets through the jail's linker
    cache (runs in the probe's child). `via: "ldconfig"`: the entry the real ldconfig prints from
    JAIL/etc/ld.so.cache (`ldconfig -p -C`), else the default directory the loader falls back to,
    probed as a file. `via: "dlopen"`: a real dlopen by soname in a grandchild chrooted into the
    jail. glibc maps its cache for each dlopen and unmaps it after, so the chrooted child reads the
    jail's cache, not one inherited from this process (tests/test_lookup_probes.py shows it with an
    entry only the jail's cache has). The result is named `JAIL/ld.so.cache(SONAME)` or
    `JAIL/dlopen(SONAME)` and says which file the lookup gave (`resolved`)."""
    jail, soname, host = req["root"], req["lookup"], req.get("host")
    if req["via"] == "ldconfig":
        cache = f"{jail}/etc/ld.so.cache"
        if cache not in _cache_listing:
            try:
                out = subprocess.run([req["ldconfig"], "-p", "-C", cache], capture_output=True, text=True).stdout
            except OSError:   # no ldconfig here: every lookup is the loader's fallback
                out = ""
            _cache_listing[cache] = [ln.strip() for ln in out.splitlines() if " => " in ln and "x86-64" in ln]
        entries = [ln.split(" => ", 1)[1] for ln in _cache_listing[cache] if ln.split(" ", 1)[0] == soname]
        fallback = next((f"{d}/{soname}" for d in LOADER_DEFAULT_DIRS if os.path.lexists(f"{jail}{d}/{soname}")),
                        f"{LOADER_DEFAULT_DIRS[0]}/{soname}")
        resolved = entries[0] if entries else fallback
        res = probe_one(jail + resolved, host, True, mountpoints)
        res.update(path=result_path(req), lookup=soname,
                   resolved=("cache: " if entries else "not in the cache, default directory: ") + resolved)
        return res
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # chroot is for good: a grandchild per lookup, which never returns
        try:
            os.close(r)
            os.write(w, json.dumps({**_dlopen_in_jail(jail, soname, host, mountpoints),
                                    "path": result_path(req), "lookup": soname}).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return json.loads(out) if out else {**unanswered([req], "the chrooted lookup died")[0], "lookup": soname}


def _dlopen_in_jail(jail: str, soname: str, host: str | None, mountpoints: set[str]) -> dict:
    """In a process of its own: chroot into the jail, dlopen `soname`, and probe the file the
    loader picked (dlinfo's link map names it), comparing its bytes with the host file's."""
    res: dict = {"size": None, "attached": False}   # until a lookup finds a file
    try:
        want = open(host, "rb").read() if host else None
        try:   # RTLD_NOLOAD succeeds only if loaded: then the soname would be answered without a lookup
            ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            loaded = True
        except OSError:
            loaded = False
        if loaded:
            raise OSError(f"{soname} is already loaded in the probing process: no lookup would happen")
        os.chroot(jail)
        os.chdir("/")
        lib = ctypes.CDLL(soname)
        link_map = ctypes.c_void_p()
        _libc.dlinfo(ctypes.c_void_p(lib._handle), RTLD_DI_LINKMAP, ctypes.byref(link_map))
        l_name = ctypes.cast(link_map.value + ctypes.sizeof(ctypes.c_void_p), ctypes.POINTER(ctypes.c_char_p))[0]
        resolved = l_name.decode()
        inside = {m[len(jail):] for m in mountpoints if m.startswith(jail + "/")}
        res = probe_one(resolved, None, True, inside)   # the handle the soname gave: its bytes, its driver
        res["resolved"] = resolved
        if want is not None and res.get("size") is not None:
            res["same_bytes"] = open(resolved, "rb").read() == want
    except OSError as e:
        res["loader"] = str(e)
        res["error"] = e.strerror or str(e)
    return res


PROBE_TIMEOUT = 30.0   # one probe process's deadline: a library whose constructor hangs must not stall the run


def op_probe(req: dict) -> dict:
    """One result per requested file, in request order (SPEC section 6: a probe round covers every
    file). A process of its own probes them (the loader caches what it loaded, by dev/inode); a file
    it dies or hangs on (a library whose constructor crashes: a job loading it dies the same way) is
    reported as not cleared, with the reason, and a fresh process probes the files after it."""
    files = req["files"]
    mountpoints = {m.mountpoint for m in sysops.mounts()}
    # The dlopen lookups first, while the process has loaded nothing: a library already loaded
    # answers a dlopen of its soname at once, with no lookup at all.
    order = sorted(range(len(files)), key=lambda i: files[i].get("via") != "dlopen")
    results: dict[int, dict] = {}
    while len(results) < len(files):
        todo = [i for i in order if i not in results]
        died = _probe_in_child(files, todo, mountpoints, results)
        if died:   # it died on the first file it did not answer
            culprit = next(i for i in todo if i not in results)
            results[culprit] = unanswered([files[culprit]], f"{died} while probing this file")[0]
    answer = [results[i] for i in range(len(files))]
    history.record("probe", results=answer, asked=[result_path(f) for f in files])   # what it was asked, too
    return {"results": answer}


def _probe_in_child(files: list[dict], todo: list[int], mountpoints: set[str], results: dict[int, dict]) -> str | None:
    """Probe files[i] for i in `todo`, in that order, in a forked child that sends one result per
    line as it goes (into `results`). None when it answered them all, else how it died."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1   # an exception in here is a death too, never a silent end
        try:
            os.close(r)
            for i in todo:
                f = files[i]
                res = probe_lookup(f, mountpoints) if "lookup" in f else probe_one(
                    f["path"], f.get("host"), f.get("load", False), mountpoints)
                os.write(w, (json.dumps([i, res]) + "\n").encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    deadline, buf, timed_out = time.monotonic() + PROBE_TIMEOUT, b"", False
    with os.fdopen(r, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(f.fileno(), 1 << 16)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                i, res = json.loads(line)
                results[i] = res
    _, status = os.waitpid(pid, 0)
    if all(i in results for i in todo):
        return None
    if timed_out:
        return f"the probe timed out after {PROBE_TIMEOUT:g} s"
    if os.WIFSIGNALED(status):
        return f"the probe process was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"the probe process exited with code {os.waitstatus_to_exitcode(status)}"


def op_mounts(req: dict) -> dict:
    under = req.get("under", "/")
    return {"mounts": [m._asdict() for m in sysops.mounts() if m.mountpoint.startswith(under)]}


OPS = {"run": op_run, "probe": op_probe, "mounts": op_mounts}


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
            os.close(self.fd)
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
    it forks its first node (warm.py, 1), else by each node."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    write_bytecode()
    if warm.enabled():
        for module in warm.WARM_MODULES:
            warm.warmed_up(module)
        from gpujail.fixtures import fake_cli  # noqa: F401  (the CLI server's children run it)


_entered: bool | OSError | None = None   # set by `enter` in the factory's child: done, or why not
HOST_UID = os.getuid()   # the uid that started the node, before a user namespace made it 0


def fork_node(cfg: dict) -> int:
    """The factory's fork of a node (warm.py, 1): 0 in the child, its pid in the factory. As root
    the child is born PID 1 of a new PID namespace, so no outer process stays behind to wait for it:
    unshare(CLONE_NEWPID) names the namespace of the children to come, and setns back to the
    factory's own makes the next one possible (a second unshare would fail with EINVAL).
    Unprivileged, the child makes a user namespace first, the PID namespace in it, and waits as
    their outer process (enter_namespaces)."""
    if HOST_UID != 0 or cfg.get("listen"):
        return os.fork()
    global _own_pid_ns
    if _own_pid_ns is None:
        _own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    _unshare(CLONE_NEWPID)
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0 and _libc.setns(_own_pid_ns, CLONE_NEWPID) != 0:   # the factory, also when fork failed
            e = ctypes.get_errno()
            raise OSError(e, f"setns back to the factory's PID namespace: {os.strerror(e)}")
    return pid


_own_pid_ns: int | None = None   # the factory's PID namespace, to return to after each fork_node


def enter(cfg: dict) -> None:
    """Into the node's namespaces (step 1), in the child of fork_node: returns in PID 1."""
    global _entered
    try:
        if cfg.get("mount_ns"):
            enter_mount_ns(cfg["mount_ns"])
        enter_namespaces(pid1=os.getpid() == 1)
        _entered = True
    except OSError as e:   # said by main, on the node's stdout, as before
        _entered = e


def main() -> None:
    global cli_server
    cfg = json.loads(sys.argv[1])
    command, command_env = sys.argv[2:], dict(os.environ)   # docker: the container's command and environment
    os.environ.update(cfg.get("env", {}))
    container = bool(cfg.get("listen"))
    if container:
        inp, out = accept_harness(cfg["listen"])
    else:
        inp, out = sys.stdin, sys.stdout
        _die_with_parent()
    # A worker's usual umask whatever the harness's: the CLI creates placeholders with
    # `mode & ~umask` and skips them by exact mode (CLI-4), so warm starts must not depend on it.
    os.umask(0o022)
    cfg["privileged"] = HOST_UID == 0
    # A container's writes land in its own writable layer, never on the host: no overlays of ours
    # (they would also hide the files the engine bound in at their host paths).
    cfg.setdefault("cow", not container)
    try:
        if container:
            sysops.mount(None, "/", None, MS_REC | MS_PRIVATE)
        elif _entered is not None:   # by the factory, before this process became the node (enter)
            if isinstance(_entered, OSError):
                raise _entered
        else:
            prepare()
            enter(cfg)
        sys.dont_write_bytecode = True   # from here on a .pyc written would be a write outside the jail
        build_view(cfg)
        if warm.enabled():
            cli_server = warm.CliServer()
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
        out.write(json.dumps(op_run({"argv": command, "env": command_env, "cwd": os.getcwd(),
                                     "timeout": cfg.get("timeout") or None})) + "\n")
        out.flush()
    serve(inp, out)


def run_node() -> None:
    try:
        main()
    except BrokenPipeError:
        sys.exit(errno.EPIPE)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--factory"]:   # warm.Factory: this process forks the nodes
        _die_with_parent()
        warm.factory_main(int(sys.argv[2]), prepare, fork_node, lambda cfg: enter(cfg) if not cfg.get("listen") else None,
                          run_node)
    else:
        run_node()
