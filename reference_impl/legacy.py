"""`legacy`: the procedure before the fix (SPEC section 4, last paragraph), to reproduce the bug.

No file set, no markers, no lock: the CLI creates 0-byte placeholders itself, racing the other
workers, and its failure cleanup unlinks them from under their mounts. Verification is by
existence only, and the placeholder predicate is "empty file".
"""
from __future__ import annotations

from gpujail.reference_impl import core


def gpu_worker(ctx: core.Ctx) -> None:
    before = core.jail_mounts(ctx)
    core.run_configure(ctx)
    core.verify(ctx, before, min_size=-1)   # existence only: a 0-byte placeholder passes
    core.mark_done(ctx)


def cpu_worker(ctx: core.Ctx) -> None:
    core.dummy_mounts(ctx, core.dummy_library(), predicate=core.is_empty_file)


def populate_cleanup(ctx: core.Ctx) -> None:
    core.populate_cleanup(ctx, predicate=core.is_empty_file)
