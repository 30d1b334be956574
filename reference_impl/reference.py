"""`reference`: the fixed procedure of SPEC section 4, REF-1..REF-11, in one sitting.

How this works
--------------
GPU worker: file set from `list` (REF-1) -> targets in the jail (REF-2) -> markers for the missing
ones under the cross-node lock (REF-3..5; none and no lock when warm) -> the jail's mounts made
private in this namespace (nothing of ours reaches another node through a shared host mount) ->
`configure` once (REF-6) -> verify the CLI's mounts by size (REF-7) -> this node's own library over each soname placeholder
(REF-12) -> NVML soname (REF-8) -> done flag (REF-10).
CPU worker / login node: the same privacy, then a dummy library over each placeholder once the flag
exists (REF-9).
The building blocks are in core.py; every jail path goes through openat2 beneath the jail (REF-11).
"""
from __future__ import annotations

import os

from gpujail.reference_impl import core
from gpujail.world import history
from gpujail.world.sysops import MS_NODEV, MS_NOSUID, MS_RDONLY


def gpu_worker(ctx: core.Ctx) -> None:
    pairs = core.plan(ctx, core.file_set(ctx))
    ctx, sonames = core.with_sonames(ctx, pairs)
    core.ensure_placeholders(ctx, pairs + sonames)
    core.isolate(ctx)
    before = core.jail_mounts(ctx)
    core.run_configure(ctx)
    mounted = core.verify(ctx, before, core.for_capabilities(ctx, pairs))
    mount_sonames(ctx, sonames, mounted)
    core.ensure_soname(ctx, mounted)
    core.mark_done(ctx)


def mount_sonames(ctx: core.Ctx, sonames: list[tuple[str, str]], mounted: list[str]) -> list[str]:
    """REF-12: bind this node's own library over each soname placeholder whose library the CLI
    mounted, read-only like the CLI's mounts, then check it shows real content by path (REF-7)."""
    done = set(mounted)
    out = []
    for host_path, rel in sonames:
        if f"{os.path.dirname(rel)}/{os.path.basename(host_path)}" not in done:
            continue   # a capability this start did not ask for
        if core.kept_soname_link(ctx, rel):   # a link to the library the CLI just mounted: check by path
            check_content(ctx, rel, host_path)
            out.append(rel)
            continue
        try:
            ctx.sys.bind_mount_beneath(host_path, ctx.jail, rel, MS_RDONLY | MS_NODEV | MS_NOSUID)
        except OSError as e:
            raise core.Fatal("verify-failed", f"cannot mount {host_path} over the soname {ctx.jail}/{rel}: "
                                         f"{e.strerror}") from None
        history.record("impl.mount", src=host_path, dst=rel)
        check_content(ctx, rel, host_path)
        out.append(rel)
    return out


def check_content(ctx: core.Ctx, rel: str, host_path: str) -> None:
    """REF-7 for a soname: real content by path (through the jail, following a kept link)."""
    st = core._stat_beneath(ctx, rel)
    if st is None or st.st_size <= core.REAL_CONTENT_MIN:
        raise core.Fatal("verify-failed", f"{ctx.jail}/{rel}: soname shows {st.st_size if st else 'nothing'} "
                                          f"bytes where {host_path} should be")


def cpu_worker(ctx: core.Ctx) -> None:
    core.isolate(ctx)
    core.dummy_mounts(ctx, core.dummy_library())


def populate_cleanup(ctx: core.Ctx) -> None:
    core.populate_cleanup(ctx)
