"""The Sys wrappers some mutants (mutants.py) put between a start and the world: the same procedure
on a world that behaves as a plausible mistake would make it behave (markers renamed into place, jail
paths resolved on the host). Each wraps a real Sys (gpujail/world/sysops.py) or the model's, and
passes every other call through unchanged."""
from __future__ import annotations

import contextlib
import os
import time

from gpujail.world import history


class RenamingMarkers:
    """A Sys whose new markers are written to a temporary file beside the target and renamed into
    place, the atomic-write idiom, instead of created exclusively: rename(2) never fails with
    EEXIST, it replaces whatever is at the target (and detaches other nodes' mounts on it, K-1)."""

    def __init__(self, sysops):
        self._sys = sysops

    def __getattr__(self, name):
        return getattr(self._sys, name)

    def write_new_beneath(self, root, rel, data, mode):
        d, name = os.path.split(rel)
        tmp = f".{name}.tmp.{os.getpid()}"
        if not hasattr(self._sys, "_parent_beneath"):   # a Sys without rename (the model's): unlink + create
            with contextlib.suppress(FileNotFoundError):
                self._sys.unlink_beneath(root, rel)
            return self._sys.write_new_beneath(root, rel, data, mode)
        self._sys.write_new_beneath(root, os.path.join(d, tmp), data, mode)
        pfd, _ = self._sys._parent_beneath(root, rel)
        try:
            try:
                os.stat(name, dir_fd=pfd, follow_symlinks=False)
                replaced = True
            except FileNotFoundError:
                replaced = False
            began = time.monotonic()
            os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
            if replaced:   # the old inode is gone from the jail, as by an unlink
                history.record("impl.mutant.unlink", path=rel, began=began)
        finally:
            os.close(pfd)


class OnTheHost:
    """A Sys whose `*_beneath(root, rel, ...)` resolve root/rel on the host, as a plain join would:
    openat2(RESOLVE_IN_ROOT) from `/` is exactly the host's own resolution, symlinks followed out."""

    def __init__(self, sysops):
        self._sys = sysops

    def __getattr__(self, name):
        real = getattr(self._sys, name)
        if not name.endswith("_beneath") or name == "bind_mount_beneath":   # that one takes a source first
            return real
        return lambda root, rel, *rest: real("/", os.path.join(root, rel).lstrip("/"), *rest)
