"""`reference`: the fixed procedure of SPEC section 4, REF-1..REF-11, in one sitting.

How this works
--------------
GPU worker: file set from `list` (REF-1) -> targets in the jail (REF-2) -> markers for the missing
ones under the cross-node lock (REF-3..5; none and no lock when warm) -> `configure` once (REF-6)
-> verify the CLI's mounts by size (REF-7) -> this node's own library over each soname placeholder
(REF-12) -> NVML soname (REF-8) -> done flag (REF-10).
CPU worker / login node: dummy library over each placeholder once the flag exists (REF-9).
The building blocks are in core.py; every jail path goes through openat2 beneath the jail (REF-11).
"""
from __future__ import annotations

from gpujail.reference_impl import core


def gpu_worker(ctx: core.Ctx) -> None:
    pairs = core.plan(ctx, core.file_set(ctx))
    ctx, sonames = core.with_sonames(ctx, pairs)
    core.ensure_placeholders(ctx, pairs + sonames)
    before = core.jail_mounts(ctx)
    core.run_configure(ctx)
    mounted = core.verify(ctx, before)
    core.mount_sonames(ctx, sonames, mounted)
    core.ensure_soname(ctx, mounted)
    core.mark_done(ctx)


def cpu_worker(ctx: core.Ctx) -> None:
    core.dummy_mounts(ctx, core.dummy_library())


def populate_cleanup(ctx: core.Ctx) -> None:
    core.populate_cleanup(ctx)
