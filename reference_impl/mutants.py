"""Mutants: small, realistic deviations from `reference`, each modelling a real-world mistake.

How this works
--------------
`python -m reference_impl mutant:NAME` applies one mutation to reference_impl.core (replacing one
function or constant) and then runs `reference`. A chaos or conformance test that guards against a
mistake must fail against the mutant that makes it; `expectations/mutant-NAME.toml` records which.
The catalogue is deliberately small here; each entry is one line of what goes wrong and why.
"""
from __future__ import annotations

import os

from gpujail import history

from . import core


def _zero_byte_markers():
    core.MARKER = b""


def _recreate_markers():
    """Under the lock, 'refresh' every placeholder (unlink + write) instead of re-checking."""
    original = core.create_markers

    def create_markers(ctx, todo):
        for _, rel in core.plan(ctx, [h for h, _ in todo]) + [(None, r) for _, r in todo]:
            try:
                ctx.sys.unlink_beneath(ctx.jail, rel)
                history.record("impl.mutant.unlink", path=rel)
            except OSError:
                pass
        return original(ctx, todo)
    core.create_markers = create_markers
    # ...and do it on every start, not only cold ones
    core.missing = lambda ctx, pairs: [(h, t) for h, t in pairs if not t.startswith(("dev/", "run/"))]


def _cleanup_on_failure():
    """On a failed configure, remove the placeholders 'to leave the jail clean'."""
    original = core.run_configure

    def run_configure(ctx):
        try:
            original(ctx)
        except core.Fatal:
            for rel in core.placeholders(ctx):
                try:
                    ctx.sys.unlink_beneath(ctx.jail, rel)
                    history.record("impl.mutant.unlink", path=rel)
                except OSError:
                    pass
            raise
    core.run_configure = run_configure


def _mkdir_lock():
    """A lock directory instead of flock: it outlives a killed holder (no K-4)."""
    class MkdirLock(core.JailLock):
        def __enter__(self):
            import time
            path = os.path.join(self.ctx.jail, self.rel + ".d")
            deadline = time.monotonic() + self.ctx.lock_timeout
            while True:
                try:
                    os.mkdir(path)
                    history.record("impl.lock.acquired", lock=self.rel, waited=0)
                    return self
                except FileExistsError:
                    if time.monotonic() > deadline:
                        raise core.Fatal("lock-timeout", f"lock {path} not acquired") from None
                    time.sleep(0.01)

        def __exit__(self, *exc):
            os.rmdir(os.path.join(self.ctx.jail, self.rel + ".d"))
    core.JailLock = MkdirLock


MUTANTS = {
    "zero-byte-placeholders": ("placeholders created empty, as the CLI does: its cleanup eats them", _zero_byte_markers),
    "recreate-markers": ("existing placeholders re-created (unlink + write) on every start", _recreate_markers),
    "cleanup-on-failure": ("placeholders removed after a failed configure", _cleanup_on_failure),
    "mkdir-lock": ("a lock directory instead of flock: a killed holder never releases it", _mkdir_lock),
}


def apply(name: str) -> None:
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(sorted(MUTANTS))}")
    MUTANTS[name][1]()
