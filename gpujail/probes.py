"""What a GPU job on a worker would see: the files a ready worker must have, and what is wrong.

How this works
--------------
`gpu_files(jail, version, capabilities)` is the oracle: every regular driver file the CLI mounts for
those capabilities (the CLI's own capability lists in fixtures/fake_cli.py, the driver catalogue in
fixtures/drivers.py, destinations per SPEC CLI-3), as `{path, host, load}` requests for
`Node.probe`, which reads each through the jail path in the worker's namespace, compares the bytes
with the host file and, for 64-bit libraries, loads it with the real loader (`ctypes.CDLL`).
`problems(results)` turns probe results into one line per lost file (SPEC INV-1, INV-5).
"""
from __future__ import annotations

import os

from fixtures import drivers, fake_cli


def selected_capabilities(capabilities: str) -> set[str]:
    caps = {c.strip() for c in capabilities.split(",") if c.strip()}
    if "all" in caps:
        caps = set(fake_cli.CAPABILITIES) - {"compat32"}
    if "video" in caps:
        caps.add("compute")
    if "display" in caps:
        caps.add("graphics")
    return caps


def gpu_files(jail, version: str = drivers.DEFAULT_VERSION, capabilities: str = "compute,utility") -> list[dict]:
    caps = selected_capabilities(capabilities)
    libs = {name for c in caps for name in fake_cli.LIBRARIES.get(c, [])}
    bins = {name for c in caps for name in fake_cli.BINARIES.get(c, [])}
    jail = str(jail)
    out = []
    for f in drivers.catalogue(version):
        base = os.path.basename(f.path)
        if f.kind == "library" and base.split(".so")[0] in libs:
            out.append({"path": f"{jail}/usr/lib/x86_64-linux-gnu/{base}", "host": f.path, "load": True})
        elif f.kind == "library32" and "compat32" in caps and base.split(".so")[0] in libs:
            out.append({"path": f"{jail}/usr/lib/i386-linux-gnu/{base}", "host": f.path, "load": False})
        elif f.kind == "binary" and base in bins:
            out.append({"path": f"{jail}/usr/bin/{base}", "host": f.path, "load": False})
        elif f.kind == "firmware":
            out.append({"path": jail + f.path, "host": f.path, "load": False})
    return out


def problems(results: list[dict]) -> list[str]:
    """One line per file a GPU job could not use, saying what it saw."""
    out = []
    for r in results:
        if not r.get("attached", True):
            what = "mount detached"
        elif r.get("size") is None:
            what = f"missing ({r.get('error')})"
        elif r.get("same_bytes") is False:
            what = f"{r['size']} bytes that are not the host file's"
        elif r.get("loader", "ok") != "ok":
            what = "loader failed"
        else:
            continue
        loader = r.get("loader")
        out.append(f"{r['path']}: {what}" + (f"; loader says: {loader.split(': ', 1)[-1]}" if loader and loader != "ok" else ""))
    return out
