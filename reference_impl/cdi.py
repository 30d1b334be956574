"""The CDI path (SPEC section 9): `cdi-naive` applies a CDI spec as a runtime does; `cdi` is the
fixed procedure of section 4 on the CDI file set.

How this works
--------------
Both take the spec from `nvidia-ctk cdi generate --format=json` at run time (REF-1's role: the
driver's file set, upgrades included), and inject the device `all` with the common edits: each
mount's `hostPath` at its `containerPath` in the jail, not flattened.

`cdi-naive` (NAIVE) is what runc does with that spec in the container's mount namespace: the root
bound on itself (runc's prepareRoot: pivot_root needs a mount point, and update-ldcache pivots),
then per mount, by depth, a missing target created inside the root (a 0-byte file mode 0755 for a
file, MkdirAll for a directory; CDI-2: never removed), bound with the spec's options, then every
createContainer hook in order with the OCI state on stdin (CDI-3 create-symlinks, CDI-4
update-ldcache, which rewrite shared jail files on every start). No verification: a runtime trusts.

`cdi` (FIXED) runs the procedure `direct` runs, on the spec's file set: targets checked inside the
jail (REF-2, REF-11), markers for the missing ones and each soname under the cross-node lock
(REF-3..5, none and no lock when warm), its own read-only bind mounts (direct.mount_directly), REF-7
verification, its own library over each soname (REF-12) instead of `create-symlinks` over shared
files (beside the spec's library and, when the spec's directory is not the jail's library directory,
in that one too, where a job's loader finds it: `linker_sonames`), ldconfig only when the NVML soname
is stale and under its lock (REF-8) instead of `update-ldcache` on every start, the done flag
(REF-10). It mounts every file the spec names: a CDI spec has no capabilities.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess

from gpujail.reference_impl import core, direct, reference
from gpujail.world import failpoints, history
from gpujail.world.sysops import MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REC

CTK = "nvidia-ctk"
# OCI mount options that runc turns into remount flags (rbind/bind make the bind itself; rprivate is
# each node's propagation already).
OPTION_FLAGS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
HARNESS_ENV = ("GPUJAIL_", "PYTHONDONTWRITEBYTECODE")   # plumbing only: histories, failpoints, no .pyc


def generate(ctx: core.Ctx) -> dict:
    """The spec, as `nvidia-ctk cdi generate` writes it now (REF-1: a failing generate is fatal)."""
    code, out, err = ctx.sys.run([CTK, "cdi", "generate", "--format=json"])
    if code != 0:
        raise core.Fatal("bad-input", f"`{CTK} cdi generate` failed (exit {code}): {core.last_error(err, code)}")
    try:
        return json.loads(out)
    except ValueError as e:
        raise core.Fatal("bad-input", f"`{CTK} cdi generate` printed no JSON spec: {e}") from None


def edits(spec: dict, device: str = "all") -> dict:
    """The container edits a runtime applies for `vendor/class=device`: the common ones, then the device's."""
    chosen = [d for d in spec.get("devices", []) if d.get("name") == device]
    if not chosen:
        raise core.Fatal("bad-input", f"the CDI spec has no device {device!r} (kind {spec.get('kind')})")
    out: dict = {}
    for part in (spec.get("containerEdits") or {}, chosen[0].get("containerEdits") or {}):
        for key, values in part.items():
            out.setdefault(key, []).extend(values)
    return out


def by_depth(mounts: list[dict]) -> list[dict]:
    """CDI's Apply sorts mounts by the number of path components, so parents mount first."""
    return sorted(mounts, key=lambda m: len([p for p in m["containerPath"].split("/") if p]))


def file_set(ctx: core.Ctx, applied: dict) -> list[tuple[str, str]]:
    """(host path, jail-relative target) of every mount and device node, each checked to stay inside
    the jail (REF-2, REF-11; core.all_inside)."""
    pairs = [(m["hostPath"], m["containerPath"].lstrip("/")) for m in by_depth(applied.get("mounts", []))]
    pairs += [(n.get("hostPath") or n["path"], n["path"].lstrip("/")) for n in applied.get("deviceNodes", [])]
    core.all_inside(ctx, pairs)
    return list(dict.fromkeys(pairs))


# -- cdi-naive: a runtime applying the spec ---------------------------------------------------------

def bind_root(ctx: core.Ctx) -> None:
    """runc's prepareRoot: the mount holding the root made private (so nothing propagates, and
    pivot_root's check passes), then the root bound on itself, recursively: update-ldcache pivots
    into it, and pivot_root needs a mount point whose parent is not shared."""
    try:
        ctx.sys.make_private(ctx.jail, below=False)   # runc's rootfsParentMountPrivate
    except OSError as e:
        raise core.Fatal("cli-failed", f"cannot make the mount holding {ctx.jail} private: {e.strerror}") from None
    ctx.sys.mount(ctx.jail, ctx.jail, None, MS_BIND | MS_REC)


def create_target(ctx: core.Ctx, host_path: str, rel: str) -> None:
    """CDI-2, runc's createIfNotExists: a missing target becomes an empty file (mode 0755, parents
    MkdirAll 0755) or, for a directory source, a directory. Nothing here is ever removed."""
    if core._stat_beneath(ctx, rel) is not None:
        return
    failpoints.hit("cdi.before_target", path=rel)
    is_dir = stat.S_ISDIR(ctx.sys.stat(host_path).st_mode)
    core.make_parents(ctx, rel + "/" if is_dir else rel)
    if not is_dir:
        try:
            ctx.sys.touch_beneath(ctx.jail, rel, 0o755)
        except OSError as e:
            raise core.Fatal("jail-write-failed", f"cannot create mount target {ctx.jail}/{rel}: {e.strerror}") from None
    history.record("impl.cdi.target", path=rel, what="dir" if is_dir else "file")


def apply_mount(ctx: core.Ctx, mount: dict) -> None:
    rel = mount["containerPath"].lstrip("/")
    create_target(ctx, mount["hostPath"], rel)
    flags = 0
    for option in mount.get("options", []):
        flags |= OPTION_FLAGS.get(option, 0)
    try:
        ctx.sys.bind_mount_beneath(mount["hostPath"], ctx.jail, rel, flags)
    except OSError as e:
        raise core.Fatal("cli-failed", f"mount {mount['hostPath']} at {ctx.jail}/{rel}: {e.strerror}") from None
    history.record("impl.mount", src=mount["hostPath"], dst=rel)


def run_hooks(ctx: core.Ctx, hooks: list[dict]) -> None:
    """Every createContainer hook in order, as an OCI runtime runs it: argv and env from the spec
    (plus the harness's plumbing), the container state on stdin; a failing hook fails the start."""
    state = json.dumps({"ociVersion": "1.2.0", "id": f"gpujail-{ctx.node}", "status": "creating",
                        "pid": os.getpid(), "bundle": "/run", "root": ctx.jail})
    for hook in [h for h in hooks if h.get("hookName") == "createContainer"]:
        failpoints.hit("cdi.before_hook", path=" ".join(hook.get("args", [])[:2]))
        env = dict(e.split("=", 1) for e in hook.get("env", []) if "=" in e)
        env.update({k: v for k, v in os.environ.items() if k.startswith(HARNESS_ENV)})
        argv = hook.get("args") or [hook["path"]]
        p = subprocess.run(argv, executable=hook["path"], input=state, env=env, capture_output=True, text=True)
        history.record("impl.cdi.hook", argv=argv, code=p.returncode)
        if p.returncode != 0:
            # the hook's error lines (a re-exec'd child logs its own before the parent's `exit status 1`)
            # and ldconfig's own complaints, which carry no logrus level
            said = [ln for ln in p.stderr.splitlines() if ln.strip() and ("level=error" in ln or "level=fatal" in ln
                                                                           or not ln.startswith("time="))]
            raise core.Fatal("cli-failed", f"createContainer hook `{' '.join(argv[:2])}` failed: "
                                           + (" / ".join(said) or f"exit code {p.returncode}"))


class NAIVE:
    """`cdi-naive`: the spec applied as a runtime applies it."""

    @staticmethod
    def gpu_worker(ctx: core.Ctx) -> None:
        applied = edits(generate(ctx))
        file_set(ctx, applied)   # REF-11: a jail whose links lead out is refused, as for every bundled one
        bind_root(ctx)
        for mount in by_depth(applied.get("mounts", [])):
            apply_mount(ctx, mount)
        run_hooks(ctx, applied.get("hooks", []))
        core.mark_done(ctx)

    cpu_worker = staticmethod(reference.cpu_worker)
    populate_cleanup = staticmethod(reference.populate_cleanup)


# -- cdi: the fixed procedure on the CDI file set ----------------------------------------------------

def linker_sonames(ctx: core.Ctx, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """REF-12 where a job's loader looks: a spec keeps each library's host directory (CDI-1), e.g.
    RHEL's usr/lib64, which a Debian jail's linker neither searches by default nor lists in its
    ld.so.conf (the runtime's update-ldcache adds a conf file for it on every start, CDI-4). So each
    such library's soname also gets a placeholder, with this node's library bound over it, in the
    jail's own library directory (where the CLI would mount it, core.target: CLI-3), which the loader
    searches: found by path, no linker configuration written. Its soname's own library is the
    spec's file (`ctx.sonames`), so a link there to another one is stale, as for every soname."""
    debian, spec = core.is_debian(ctx), dict(pairs)
    moved = [(h, core.target(h, debian)) for h, t in pairs
             if core.is_library(h) and os.path.dirname(core.target(h, debian)) != os.path.dirname(t)]
    out = [p for p in core.soname_pairs(ctx, moved) if p[1] not in ctx.sonames]
    ctx.sonames.update({rel: spec[host] for host, rel in out})
    return out


class FIXED:
    """`cdi`: `direct`'s procedure with the spec as the file set."""

    @staticmethod
    def gpu_worker(ctx: core.Ctx) -> None:
        pairs = file_set(ctx, edits(generate(ctx)))
        ctx, sonames = core.with_sonames(ctx, pairs)
        sonames += linker_sonames(ctx, pairs)   # REF-12 in the jail's library directory too
        core.ensure_placeholders(ctx, pairs + sonames)   # REF-3..5, each soname a placeholder (REF-12)
        core.isolate(ctx)
        before = core.jail_mounts(ctx)
        kept = [(h, t) for h, t in sonames if core.kept_soname_link(ctx, t)]
        wanted = pairs + [p for p in sonames if p not in kept]
        direct.mount_directly(ctx, wanted)
        mounted = core.verify(ctx, before, wanted)
        for host_path, rel in kept:
            reference.check_content(ctx, rel, host_path)
        core.ensure_soname(ctx, mounted)   # REF-8: ldconfig only when stale, under its lock
        core.mark_done(ctx)

    cpu_worker = staticmethod(reference.cpu_worker)
    populate_cleanup = staticmethod(reference.populate_cleanup)
