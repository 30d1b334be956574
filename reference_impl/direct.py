"""`direct` (seed 003): the same file set and markers as `reference`, then the runtime bind-mounts
every file itself, read-only with the CLI's flags, with no `configure` (fewer processes, no inherited
CLI cleanup). Verified as REF-7; on failure it unmounts its own mounts and deletes nothing.
"""
from __future__ import annotations

import os

from gpujail.reference_impl import core, reference
from gpujail.world import failpoints, history
from gpujail.world.sysops import MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY


def gpu_worker(ctx: core.Ctx) -> None:
    pairs = core.plan(ctx, core.file_set(ctx))
    ctx, sonames = core.with_sonames(ctx, pairs)
    core.ensure_placeholders(ctx, pairs + sonames)   # REF-12: each soname a placeholder too
    core.isolate(ctx)
    before = core.jail_mounts(ctx)
    kept = [(h, t) for h, t in sonames if core.kept_soname_link(ctx, t)]   # REF-12: links to our own library
    wanted = core.for_capabilities(ctx, pairs + [p for p in sonames if p not in kept])
    mount_directly(ctx, wanted)
    mounted = core.verify(ctx, before, wanted)
    for host_path, rel in core.for_capabilities(ctx, kept):
        reference.check_content(ctx, rel, host_path)
    core.ensure_soname(ctx, mounted)
    core.mark_done(ctx)


REMOUNT = {"dev": MS_RDONLY | MS_NOSUID | MS_NOEXEC, "run": MS_NODEV | MS_NOSUID | MS_NOEXEC}


def mount_directly(ctx: core.Ctx, pairs: list[tuple[str, str]]) -> None:
    """Bind each host file over its target, read-only with the CLI's flags. On failure undo our own
    mounts only and delete nothing: a marker may already carry another worker's mount."""
    done: list[str] = []
    try:
        for host_path, rel in pairs:
            failpoints.hit("ref.before_mount", path=rel)
            flags = REMOUNT.get(rel.split("/", 1)[0], MS_RDONLY | MS_NODEV | MS_NOSUID)
            ctx.sys.bind_mount_beneath(host_path, ctx.jail, rel, flags)
            done.append(rel)
            history.record("impl.mount", src=host_path, dst=rel)
    except OSError as e:
        for rel in reversed(done):
            try:
                ctx.sys.umount(os.path.join(ctx.jail, rel))
            except OSError:
                pass
        raise core.Fatal("cli-failed", f"bind mount of {e.filename or '?'} failed: {e.strerror}") from None


cpu_worker = reference.cpu_worker
populate_cleanup = reference.populate_cleanup
