"""A node's `probe` request: what a GPU job on this node would see at each file (node.py, step 3).

How this works
--------------
`op_probe(req)` answers one result per requested file, in request order (SPEC section 6: a probe
round covers every file), probing through the jail in this node's namespace. The harness builds
the requests (probes.py: `gpu_files`, `soname_files`, `lookup_files`) and reads the results.

* A file (`probe_one`): its size, whether its bytes are the host file's, whether it is a mount
  point (attached), and for a library whether the real loader loads it (`ctypes.CDLL`) and which
  driver it is (REF-12).
* A soname lookup (`probe_lookup`): what a job asking the loader for a soname gets through the
  jail's linker cache, by the real `ldconfig -p -C` on JAIL/etc/ld.so.cache or by a real dlopen
  in a grandchild chrooted into the jail (`_dlopen_in_jail`).

The probing runs in a forked child (`_probe_in_child`), never in the node: the loader caches what
it loaded, by dev/inode, and a library whose constructor crashes or hangs would take the prober
with it. A child that dies or outlives PROBE_TIMEOUT on a file leaves that file reported as not
cleared, with the reason (probes.unanswered), and a fresh child probes the files after it.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import select
import signal
import subprocess
import time

from gpujail.backends.probes import result_path, unanswered
from gpujail.world import history
from gpujail.world.sysops import RealSys

_libc = ctypes.CDLL(None, use_errno=True)
sysops = RealSys()


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
    reported as not cleared, with the reason, and a fresh process probes the files after it. Its
    event carries when the round `began` (the history's clock) beside when it ended (`t`): what it
    saw is evidence only about what happened before it began (chaos/checkers/queries.probe_began)."""
    began = time.monotonic()
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
    history.record("probe", results=answer, asked=[result_path(f) for f in files], began=began)   # asked: what it was asked, too
    return {"results": answer}


def _probe_in_child(files: list[dict], todo: list[int], mountpoints: set[str], results: dict[int, dict]) -> str | None:
    """Probe files[i] for i in `todo`, in that order, in a forked child that sends one result per
    line as it goes (into `results`). None when it answered them all, else how it died."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1   # an exception in here is a death too, never a silent end
        try:
            # A library that kills this child is a result the parent reports, not a crash of the
            # node's: no faulthandler dump (pytest's, inherited) on the shared stderr
            faulthandler.disable()
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
