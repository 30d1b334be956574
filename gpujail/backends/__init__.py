"""The backends a suite can run on, and the one question asked of each: can you run here?

`unavailable(name)` returns None when backend `name` works on this host, else one line saying why
(no namespaces, no Docker Engine, not built). It asks the backend's own module for its
`precondition()`, so the reason is the module's; a backend whose module is not part of this build
says so.
"""
from __future__ import annotations

import importlib

MODULES = {"kernel": "gpujail.backends.kernel", "model": "gpujail.backends.model", "docker": "gpujail.backends.docker_backend"}
NAMES = tuple(MODULES)


def unavailable(name: str) -> str | None:
    if name not in MODULES:
        return f"unknown backend {name!r}, expected one of {', '.join(NAMES)}"
    try:
        module = importlib.import_module(MODULES[name])
    except ModuleNotFoundError as e:
        if e.name == MODULES[name]:
            return f"backend {name!r} is not available in this build"
        return f"backend {name!r} needs the Python package {e.name!r}, which is not installed"
    return module.precondition()
