"""`direct` (seed 003): the same file set and markers as `reference`, then the runtime bind-mounts
every file itself, read-only with the CLI's flags, with no `configure` (fewer processes, no inherited
CLI cleanup). Verified as REF-7; on failure it unmounts its own mounts and deletes nothing.
"""
from __future__ import annotations

from gpujail.reference_impl import core, reference


def gpu_worker(ctx: core.Ctx) -> None:
    pairs = core.plan(ctx, core.file_set(ctx))
    ctx, sonames = core.with_sonames(ctx, pairs)
    core.ensure_placeholders(ctx, pairs + sonames)   # REF-12: each soname a placeholder too
    before = core.jail_mounts(ctx)
    core.mount_directly(ctx, core.for_capabilities(ctx, pairs + sonames))
    mounted = core.verify(ctx, before)
    core.ensure_soname(ctx, mounted)
    core.mark_done(ctx)


cpu_worker = reference.cpu_worker
populate_cleanup = reference.populate_cleanup
