"""What a GPU job on a worker would see: the files a ready worker must have, and what is wrong.

How this works
--------------
`gpu_files(jail, version, capabilities)` is the oracle: every regular driver file the CLI mounts for
those capabilities (the CLI's own capability lists in gpujail/nvc_info.py, the driver catalogue in
fixtures/drivers.py, destinations per SPEC CLI-3), as `{path, host, load}` requests for
`Node.probe`, which reads each through the jail path in the worker's namespace, compares the bytes
with the host file and, for 64-bit libraries, loads it with the real loader (`ctypes.CDLL`).
`soname_files` adds each library's soname (REF-12: the node's own driver), `lookup_files` the same
sonames looked up as a job's loader does, through the jail's linker cache (Node.probe: the real
`ldconfig -p -C` and a chrooted `dlopen`), and `compat_files` the
CUDA image's compat libraries a worker's CLI mounted (REF-6, CLI-3: what `list` never names).
`problems(results)` turns probe results into one line per lost file (SPEC INV-1, INV-5).

With a vendor's CDI spec (`--cdi-spec`, fixtures/cdi_spec.py), a node serving the vendor's driver
must see what that spec mounts instead: `gpu_files` is each regular file of its mounts that
configure would mount for `capabilities` (the same selection as for the fixture driver, so a CLI-based
neighbour is judged on what it mounts; the CDI-1 test checks every file the spec names), at its
`containerPath` (a CDI spec flattens nothing, SPEC CDI-1); `soname_files` each such library's soname
beside it. `cdi_spec.for_node` says which nodes serve the vendor's driver. A node whose implementation
is CDI-mode (`cdi`, decided by the caller with `cdi_mode`: `cdi`, `cdi-naive`, the run's own under
--cdi-spec) on the fixture driver is asked the same way for the spec the fake `nvidia-ctk cdi
generate` writes on it (cdi_spec.generated), every file of it: a spec has no capabilities.

A probe round answers every file it was asked about (SPEC section 6, "What a PASS means"): a file
the round could not clear (its probe process crashed or timed out on it, or the node did not
answer) gets a result from `unanswered`, with `error` starting with `NO_RESULT` and saying why,
which the checker reads as a violation, never as clean.
"""
from __future__ import annotations

import os

from gpujail.fixtures import cdi_spec, drivers, nvc_info
from gpujail.fixtures.jail import find_ldconfig

NO_RESULT = "no result: "   # the `error` of a file a probe round could not clear


def result_path(req: dict) -> str:
    """The name a probe result gives request `req`: its jail path, or for a soname lookup
    `JAIL/ld.so.cache(SONAME)` / `JAIL/dlopen(SONAME)` (what it looked through)."""
    if "lookup" not in req:
        return req["path"]
    return f"{req['root']}/{'ld.so.cache' if req['via'] == 'ldconfig' else 'dlopen'}({req['lookup']})"


def unanswered(requests: list[dict], why: str) -> list[dict]:
    """A result for each request the probe could not clear, saying why (never a clean one)."""
    return [{"path": result_path(f), "attached": False, "size": None, "error": NO_RESULT + why} for f in requests]


# The bundled CDI-mode implementations (SPEC section 9). Any other implementation (a vendor's command)
# is CDI-mode when the run brings a CDI spec (`--cdi-spec FILE`, fixtures/cdi_spec.py).
CDI_MODE = ("cdi", "cdi-naive")


def cdi_mode(impl: str, run_impl: str | None = None) -> bool:
    """Whether a node running `impl` in a run of `run_impl` mounts a CDI spec's files (SPEC section 9)
    rather than the CLI's: a bundled CDI-mode implementation, or the run's own under --cdi-spec (a
    neighbour the scenario gives another implementation, `legacy` say, is not one)."""
    return impl in CDI_MODE or (impl == (run_impl or impl) and cdi_spec.active() is not None)


def spec_files(version: str, layout: str, caps: set[str], cdi: bool) -> list | None:
    """The driver files (drivers.DriverFile, `target` its containerPath) a node mounts from a CDI
    spec, or None when it mounts the CLI's (CLI-3): on a node serving a vendor's spec (--cdi-spec)
    its files for `caps` (configure's selection, so a CLI-based neighbour is judged on what it
    mounts); else, for a CDI-mode implementation (`cdi`), every file of the spec the fake
    `nvidia-ctk cdi generate` writes on that node (cdi_spec.generated: the 64-bit libraries only,
    each at its host path, CDI-1; a spec has no capabilities)."""
    vendor = cdi_spec.for_node(version, layout)
    if vendor is not None:
        return [f for f in vendor.files if nvc_info.selected(f.path, caps)]
    return list(cdi_spec.generated(version, layout).files) if cdi else None


def gpu_files(jail, version: str = drivers.DEFAULT_VERSION, capabilities: str = "compute,utility",
              layout: str = "debian", cdi: bool = False) -> list[dict]:
    """Probe requests for every regular driver file configure mounts for `capabilities` on a host of
    distribution `layout` (fixtures/drivers.py LAYOUTS); with a CDI spec (`spec_files`; `cdi`: the
    node runs a CDI-mode implementation), each regular file of the spec at its containerPath."""
    jail = str(jail)
    caps = nvc_info.capabilities(capabilities)
    spec = spec_files(version, layout, caps, cdi)
    if spec is not None:   # a CDI spec's files, where the spec mounts them
        return [{"path": jail + f.target, "host": f.path, "load": f.kind == "library"} for f in spec
                if f.mode & 0o170000 == drivers.S_IFREG]
    out = []
    for f in drivers.catalogue(version, layout):
        if not f.on_disk or not nvc_info.selected(f.path, caps, f.kind == "library32"):
            continue
        base = os.path.basename(f.path)
        where = {"library": f"/usr/lib/x86_64-linux-gnu/{base}", "library32": f"/usr/lib/i386-linux-gnu/{base}",
                 "binary": f"/usr/bin/{base}"}.get(f.kind, f.path)
        out.append({"path": jail + where, "host": f.path, "load": f.kind == "library"})
    return out


def soname_files(jail, version: str = drivers.DEFAULT_VERSION, capabilities: str = "compute,utility",
                 layout: str = "debian", cdi: bool = False) -> list[dict]:
    """REF-12: probe requests for the soname of every 64-bit driver library configure mounts for
    `capabilities` (`libnvidia-ml.so.1`, `libcuda.so.1`, ...), each compared with *this node's own*
    host library and loaded (the probe then names the driver it got: `driver`); with a CDI spec
    (`spec_files`), those of the spec's libraries."""
    caps = nvc_info.capabilities(capabilities)
    spec = spec_files(version, layout, caps, cdi)
    if spec is not None:   # a CDI spec: each library's soname in its own containerPath directory
        return [{"path": f"{jail}{os.path.dirname(f.target)}/{f.soname}", "host": f.path, "load": True, "soname": True}
                for f in spec if f.kind == "library" and f.soname != os.path.basename(f.target)]
    return [{"path": f"{jail}/usr/lib/x86_64-linux-gnu/{f.soname}", "host": f.path, "load": True, "soname": True}
            for f in drivers.catalogue(version, layout)
            if f.kind == "library" and nvc_info.selected(f.path, caps) and f.soname != os.path.basename(f.path)]


def lookup_files(jail, version: str = drivers.DEFAULT_VERSION, capabilities: str = "compute,utility",
                 layout: str = "debian", cdi: bool = False) -> list[dict]:
    """Issue 17 (the operator's PR #2621 and #2682): each soname of `soname_files` looked up
    through the jail's `etc/ld.so.cache`, twice: as the real ldconfig prints the cache, and by a
    real dlopen by soname with the jail as root. Each must give this node's own host library."""
    ldconfig = find_ldconfig()
    return [{"lookup": os.path.basename(f["path"]), "via": via, "root": str(jail), "host": f["host"],
             "ldconfig": ldconfig} for f in soname_files(jail, version, capabilities, layout, cdi)
            for via in ("ldconfig", "dlopen")]


def compat_files(jail, node: str, events: list[dict]) -> list[dict]:
    """REF-6, CLI-3: probe requests for the CUDA forward-compatibility libraries `node`'s CLI mounted
    in its last start (configure without `--cuda-compat-mode=disabled`), read from the run's
    history. The worker verified them like its driver files (REF-7), so a job may rely on them. Only
    the versioned files: the compat directory's soname links land on the jail's sonames, which a
    REF-12 implementation covers with the node's own driver."""
    compat = f"{jail}/usr/local/cuda/compat/"
    mine = [e for e in events if e.get("node") == node]
    last = max((e["t"] for e in mine if e["kind"] in ("worker.start", "worker.restart")), default=0.0)
    return [{"path": e["dst"], "host": e["src"], "load": True} for e in mine
            if e["kind"] == "cli.mount" and e["t"] >= last and e.get("src", "").startswith(compat)
            and not os.path.islink(e["src"])]


def problems(results: list[dict]) -> list[str]:
    """One line per file a GPU job could not use, saying what it saw."""
    out = []
    for r in results:
        if not r.get("attached", True):
            what = "mount detached"
        elif r.get("size") is None:
            what = f"missing ({r.get('error')})"
        elif r.get("same_bytes") is False:
            what = f"{r['size']} bytes that are not the host file's" + (
                f" (driver {r['driver']}: another node's version)" if r.get("driver") else "")
        elif r.get("loader", "ok") != "ok":
            what = "loader failed"
        else:
            continue
        loader = r.get("loader")
        out.append(f"{r['path']}: {what}" + (f"; loader says: {loader.split(': ', 1)[-1]}" if loader and loader != "ok" else ""))
    return out
