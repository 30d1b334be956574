"""Mutants: small, realistic deviations from `reference`, each modelling a real-world mistake.

How this works
--------------
`python -m gpujail.reference_impl mutant:NAME` (or `in_process("mutant:NAME")` on the model backend)
starts `reference` with one mutation. `build(NAME)` makes a *private copy* of reference_impl/core.py
for that one start, applies the mutation to the copy (replacing one function, class or constant,
usually by a wrapper around the original, or changing the start's context through the copy's
`prepare`, the seam for a different Sys or lock timeout) and returns reference's steps bound to
the copy. Nothing shared is changed: the real modules stay as they are, so mutants can run side by
side in one process (the model's simulated workers) and nobody has to restore anything. Each
entry of `MUTANTS` is (the mistake in one line, the function that applies it to a copy).

The suite is only as strong as the mistakes it catches: `python -m gpujail.conformance.killmatrix`
runs the conformance and chaos suites against every mutant and lists which tests kill it; a mutant
no test kills is a hole in the suite.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
import types
from pathlib import Path
from unittest import mock

from gpujail.reference_impl import core as shared_core
from gpujail.reference_impl import legacy, mutant_sys, reference
from gpujail.spec import LOCK
from gpujail.world import history


def _wrap(core, name: str, wrapper) -> None:
    """Replace core.NAME by wrapper(original core.NAME), in the copy `core`."""
    setattr(core, name, wrapper(getattr(core, name)))


def _on_ctx(core, change) -> None:
    """The start's Ctx goes through change(ctx) first (the copy's prepare, the context seam)."""
    prepare = core.prepare
    core.prepare = lambda ctx: change(prepare(ctx))


def _unlink_placeholders(ctx, rels) -> None:
    for rel in rels:
        with contextlib.suppress(OSError):
            began = time.monotonic()
            ctx.sys.unlink_beneath(ctx.jail, rel)
            history.record("impl.mutant.unlink", path=rel, began=began)


# -- markers ----------------------------------------------------------------------------------

def _zero_byte_markers(core):
    core.MARKER = b""


def _big_markers(core):
    core.MARKER = b"nvidia placeholder: nvidia-container-cli bind-mounts the driver file here\n"


def _zero_byte_counts_present(core):
    """REF-3 before its amendment: an old 0-byte placeholder counts as present, so an upgraded
    jail keeps the placeholders a failing CLI's cleanup unlinks."""
    core.is_old_placeholder = lambda st: False


def _atomic_rename_markers(core):
    """REF-5 by the atomic-write idiom: each marker written to a temporary file and renamed into
    place 'so that a kill never leaves a torn one'. Under a lock that serialises, the re-check makes
    it harmless; when the lock did not (a lost lease, a removed lock file, node-local locks), the
    rename replaces a marker another node created meanwhile, and every mount on it."""
    _on_ctx(core, lambda ctx: dataclasses.replace(ctx, sys=mutant_sys.RenamingMarkers(ctx.sys)))


def _markers_for_default_capabilities(core):
    """Markers only for what the usual job (compute,utility) mounts, whatever this start asks for: a
    script written on compute nodes. A job asking for graphics gets the CLI's 0-byte placeholders."""
    def usual_only(ensure):
        def markers(ctx, pairs):
            usual = set(core.for_capabilities(dataclasses.replace(ctx, capabilities="compute,utility"), pairs))
            return ensure(ctx, [p for p in pairs if p in usual or p[1] in ctx.sonames])   # REF-12's links kept
        return markers
    _wrap(core, "ensure_placeholders", usual_only)


def _host_mode_not_copied(core):
    # Only create_markers uses stat.S_IMODE: every marker gets 0644 whatever the host file's mode.
    fixed = {**{k: getattr(core.stat, k) for k in dir(core.stat) if k.startswith("S_")}, "S_IMODE": lambda mode: 0o644}
    core.stat = types.SimpleNamespace(**fixed)


def _recreate_markers(core):
    """Under the lock, 'refresh' every placeholder (unlink + write) instead of re-checking."""
    def recreating(create_markers):
        def create(ctx, todo):
            _unlink_placeholders(ctx, [rel for _, rel in todo])
            return create_markers(ctx, todo)
        return create
    _wrap(core, "create_markers", recreating)
    # ...and do it on every start, not only cold ones
    core.missing = lambda ctx, pairs: [(h, t) for h, t in pairs if not t.startswith(("dev/", "run/"))]


# -- the lock ---------------------------------------------------------------------------------

def _no_lock(core):
    core.JailLock = lambda ctx, rel=LOCK: contextlib.nullcontext()


def _no_recheck(core):
    def unchecked(create_markers):
        def create(ctx, todo):
            # The re-check under the lock looks, but is told every target it saw missing still is.
            targets, stat_beneath = {rel for _, rel in todo}, core._stat_beneath
            blind = lambda c, rel: None if rel in targets else stat_beneath(c, rel)
            with mock.patch.object(core, "_stat_beneath", blind):
                return create_markers(ctx, todo)
        return create
    _wrap(core, "create_markers", unchecked)


def _node_local_lock(core):
    class NodeLocalLock(core.JailLock):
        def __init__(self, ctx, rel=LOCK):
            super().__init__(dataclasses.replace(ctx, jail="/run"), os.path.basename(rel))
    core.JailLock = NodeLocalLock


def _mkdir_lock(core):
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


def _unbounded_lock_wait(core):
    _on_ctx(core, lambda ctx: dataclasses.replace(ctx, lock_timeout=None))


# -- the CLI and verification -----------------------------------------------------------------

def _retry_in_process(core):
    def retrying(run_configure):
        def run(ctx):
            for attempt in range(3):
                try:
                    return run_configure(ctx)
                except core.Fatal:
                    if attempt == 2:
                        raise
        return run
    _wrap(core, "run_configure", retrying)


def _cleanup_on_failure(core):
    """On a failed configure, remove the placeholders 'to leave the jail clean'."""
    def cleaning(run_configure):
        def run(ctx):
            try:
                run_configure(ctx)
            except core.Fatal:
                _unlink_placeholders(ctx, core.placeholders(ctx))
                raise
        return run
    _wrap(core, "run_configure", cleaning)


def _undo_own_markers(core):
    """Upstream #377's idea done by the implementation: on a failed configure, remove the markers
    *this start* created, 'to leave the jail as we found it'. Only the lock winner creates markers,
    so only a creator that fails after its neighbours mounted over them hurts anyone."""
    created: list[str] = []   # a mutant is built fresh for each start

    def remembering(create_markers):
        def create(ctx, todo):
            created.extend(rel for _, rel in todo if core.needs_marker(ctx, rel))
            return create_markers(ctx, todo)
        return create

    def undoing(run_configure):
        def run(ctx):
            try:
                run_configure(ctx)
            except core.Fatal:
                _unlink_placeholders(ctx, created)
                raise
        return run
    _wrap(core, "create_markers", remembering)
    _wrap(core, "run_configure", undoing)


def _compat_mount(core):
    """REF-6: configure run without --cuda-compat-mode=disabled (the CLI's default, `mount`): with
    a CUDA image in the jail the CLI also mounts its compat libraries over 0-byte placeholders."""
    def default_compat_mode(run_configure):
        def run(ctx):
            real = ctx.sys.run
            drop = lambda argv, **kw: real([a for a in argv if a != "--cuda-compat-mode=disabled"], **kw)
            with mock.patch.object(ctx.sys, "run", drop):
                return run_configure(ctx)
        return run
    _wrap(core, "run_configure", default_compat_mode)


def _soname_links(core):
    """REF-12 dropped: sonames are the jail's shared ldconfig links (REF-8 only), so on a fleet with
    two driver versions the last node to run ldconfig points every node's soname at its version."""
    core.soname_pairs = lambda ctx, pairs: []


def _jail_as_given(core):
    """REF-7 before the symlinked-jail fix: the jail path taken as given (abspath), not resolved, and
    compared with mountinfo's resolved mount points: behind a symlink, no mount is ever found."""
    def as_given(ctx):
        given = os.path.abspath(os.environ.get("GPUJAIL_JAIL") or os.getcwd())
        return dataclasses.replace(ctx, jail=given)
    _on_ctx(core, as_given)


def _relink_sonames(core):
    """REF-12 before its amendment: every soname link is replaced by our marker and mount, also one
    that already leads to our own driver library, which a worker still on the older procedure (its
    sonames the shared ldconfig links) loads through."""
    core.stale_soname_link = lambda ctx, rel: rel in ctx.sonames and core._is_link(ctx, rel)


def _ldconfig_winner_only(core):
    """The operator's procedure before PR #2682: sonames are the shared ldconfig links (no REF-12),
    and a worker that finds the ldconfig lock busy skips its soname, trusting the winner, which may
    be a node that sees none of the mounts (REF-8's re-check dropped)."""
    _soname_links(core)

    def winner_only(ensure_soname):
        def ensure(ctx, mounted):
            try:
                with core.JailLock(dataclasses.replace(ctx, lock_timeout=0.001), core.LDCONFIG_LOCK):
                    pass
            except core.Fatal:
                return   # "someone else is running ldconfig"
            return ensure_soname(ctx, mounted)
        return ensure
    _wrap(core, "ensure_soname", winner_only)


def _cli_parent_elsewhere(core):
    """REF-6: the CLI run through a helper with a mount namespace of its own that `nsenter`s back
    into the worker's to exec it (a vendor's wrapper, or a helper daemon): the CLI starts in the
    worker's namespace, but a standalone CLI mounts in its *parent's* (CLI-5), the helper's, and
    those mounts die with the helper. With a CLI that mounted where it was started, this worked."""
    def through_helper(run_configure):
        def run(ctx):
            real = ctx.sys.run
            hop = ["unshare", "--mount", "--fork", "nsenter", f"--mount={ctx.jail}/proc/{os.getpid()}/ns/mnt", "--"]
            with mock.patch.object(ctx.sys, "run", lambda argv, **kw: real([*hop, *argv], **kw)):
                return run_configure(ctx)
        return run
    _wrap(core, "run_configure", through_helper)


def _verify_existence(core):
    _wrap(core, "verify", lambda verify: lambda ctx, before, *expected: verify(ctx, before, *expected, min_size=-1))


def _exit_code_only(core):
    core.verify = lambda ctx, before, *expected: []


def _no_verify(core):
    def ignoring(run_configure):
        def run(ctx):
            with contextlib.suppress(core.Fatal):
                run_configure(ctx)
        return run
    _wrap(core, "run_configure", ignoring)
    core.verify = lambda ctx, before, *expected: []


def _no_soname_check(core):
    core.ensure_soname = lambda ctx, mounted: None


def _soname_no_repair(core):
    def without_ldconfig(ensure_soname):
        def ensure(ctx, mounted):
            run = ctx.sys.run
            skip = lambda argv, **kw: (0, "", "") if argv[0] == "ldconfig" else run(argv, **kw)
            with mock.patch.object(ctx.sys, "run", skip):
                ensure_soname(ctx, mounted)
        return ensure
    _wrap(core, "ensure_soname", without_ldconfig)


def _soname_head_only(core):
    """Sonames read from each library's first 64 KiB, as a quick ELF probe does: a real library's
    dynamic section lies megabytes in, so on a real host no soname is found and none mounted."""
    def head_only(ctx, pairs):
        class Head:
            def __getattr__(self, name):
                return getattr(ctx.sys, name)

            def read_image(self, path):
                return bytes(ctx.sys.read_image(path)[:65536])
        return soname_pairs(dataclasses.replace(ctx, sys=Head()), pairs)
    soname_pairs = core.soname_pairs
    core.soname_pairs = head_only


def _placement_by_dirname(core):
    """REF-2 before its amendment: a library is 32-bit when its host directory's name says so
    (`i386`, `lib32`, or plain `/usr/lib`): right on Debian, wrong for Arch's 64-bit /usr/lib."""
    def by_name(ctx, host_path):
        d = os.path.dirname(host_path)
        return "i386" in d or d.endswith(("/lib32", "/usr/lib"))
    core.elf32 = by_name


# -- the placeholder predicate (REF-9) ----------------------------------------------------------

def _predicate_so_star(core):
    core.PLACEHOLDER_NAME = "*.so*"


def _predicate_no_size(core):
    core.PLACEHOLDER_MAX = float("inf")


def _predicate_follows_symlinks(core):
    core._lstat_in_jail = core._stat_beneath


# -- the jail's symlinks (REF-11) ---------------------------------------------------------------


def _escapes_jail(core):
    core.stays_inside = lambda ctx, root, rel, real_dirs: None
    _on_ctx(core, lambda ctx: dataclasses.replace(ctx, sys=mutant_sys.OnTheHost(ctx.sys)))


def _jail_checked_once(core):
    """REF-11 by a check at the start: every target's realpath is checked to stay inside the jail
    (stays_inside, kept), then paths are joined and resolved on the host as a shell script's `cd`
    and `>` would: a symlink swapped into the jail after the check leads the writes out of it."""
    _on_ctx(core, lambda ctx: dataclasses.replace(ctx, sys=mutant_sys.OnTheHost(ctx.sys)))


def _legacy(core):
    return legacy   # legacy's steps instead of reference's


def _propagation_kept(core):
    """The host's mount propagation kept: the jail's mounts never made private before mounting, as
    every procedure written for a host whose mounts are private is. On a shared host mount each
    bind mount reaches every other node and the host."""
    core.isolate = lambda ctx: None


MUTANTS = {
    "zero-byte-placeholders": ("placeholders created empty, as the CLI does: its cleanup eats them", _zero_byte_markers),
    "big-markers": ("a chatty marker of 64 bytes or more: no longer a placeholder by REF-9's size bound", _big_markers),
    "zero-byte-counts-present": ("an old 0-byte placeholder (upgraded jail) counts as present: never made a marker",
                                 _zero_byte_counts_present),
    "atomic-rename-markers": ("markers written to a temporary file and renamed into place: where the lock did not "
                              "serialise, the rename replaces another node's marker and the mounts on it",
                              _atomic_rename_markers),
    "markers-for-default-capabilities": ("markers only for what compute,utility mounts: a worker asking for "
                                         "graphics or compat32 gets the CLI's 0-byte placeholders",
                                         _markers_for_default_capabilities),
    "host-mode-not-copied": ("markers created 0644 instead of the host file's mode: the CLI then re-creates them",
                             _host_mode_not_copied),
    "recreate-markers": ("existing placeholders re-created (unlink + write) on every start", _recreate_markers),
    "no-lock": ("markers created without the cross-node lock", _no_lock),
    "no-recheck": ("under the lock, creates what it saw missing before taking it (no re-check)", _no_recheck),
    "node-local-lock": ("the lock file on node-local /run instead of the shared jail: it serialises nobody",
                        _node_local_lock),
    "mkdir-lock": ("a lock directory instead of flock: a killed holder never releases it", _mkdir_lock),
    "unbounded-lock-wait": ("waits for the lock forever (GPUJAIL_LOCK_TIMEOUT ignored)", _unbounded_lock_wait),
    "retry-in-process": ("a failing configure retried in-process (3 tries) instead of failing the start",
                         _retry_in_process),
    "cleanup-on-failure": ("placeholders removed after a failed configure", _cleanup_on_failure),
    "undo-own-markers": ("the markers this start created removed after a failed configure (upstream #377, by the "
                         "implementation)", _undo_own_markers),
    "compat-mount": ("configure run with the default --cuda-compat-mode=mount: a CUDA image's compat libraries "
                     "get 0-byte placeholders", _compat_mount),
    "soname-links": ("sonames left to the jail's shared ldconfig links: a node on another driver version flips them",
                     _soname_links),
    "ldconfig-winner-only": ("shared soname links, and a busy ldconfig lock taken as 'the winner does it': "
                             "a blind winner leaves no soname", _ldconfig_winner_only),
    "cli-parent-elsewhere": ("the CLI exec'd by a helper in another mount namespace: a standalone CLI mounts in its "
                             "parent's, which dies with the helper", _cli_parent_elsewhere),
    "verify-existence": ("mounts verified by existence instead of size: a marker passes", _verify_existence),
    "exit-code-only": ("configure's exit code 0 taken as proof: its mounts never looked at", _exit_code_only),
    "no-verify": ("fire and forget: configure's exit code ignored and nothing verified", _no_verify),
    "no-soname-check": ("libnvidia-ml.so.1 never checked (a stale linker cache goes unnoticed)", _no_soname_check),
    "soname-head-only": ("sonames read from each library's first 64 KiB: none found in a real library",
                         _soname_head_only),
    "soname-no-repair": ("libnvidia-ml.so.1 checked but never repaired with ldconfig", _soname_no_repair),
    "predicate-so-star": ("placeholder predicate matches *.so*: eats the ncurses linker script", _predicate_so_star),
    "predicate-no-size": ("placeholder predicate without the size bound: real libraries match", _predicate_no_size),
    "predicate-follows-symlinks": ("placeholder predicate stats through symlinks: links to small files match",
                                   _predicate_follows_symlinks),
    "placement-by-dirname": ("32-bit libraries told by their host directory's name, not their ELF class: on Arch "
                             "(64-bit /usr/lib) the markers land in the 32-bit directory", _placement_by_dirname),
    "jail-as-given": ("the jail path taken as given, not resolved: behind a symlink none of its mounts is found",
                      _jail_as_given),
    "relink-sonames": ("soname links replaced by markers even where they lead to our own library: a worker still on "
                       "the procedure before REF-12 loses its sonames", _relink_sonames),
    "jail-checked-once": ("the jail's symlinks checked once at the start, then paths joined and followed on the host: "
                          "a link swapped in after the check leads writes out of the jail", _jail_checked_once),
    "propagation-kept": ("the jail's mounts left as the host shares them: on a shared host mount every bind mount "
                         "reaches the other nodes and stays in the host's namespace", _propagation_kept),
    "escapes-jail": ("jail paths joined and resolved on the host: a jail symlink leads writes out", _escapes_jail),
    "legacy": ("the procedure before the fix: no markers, no lock, existence check, 'empty file' predicate", _legacy),
}


def build(name: str) -> types.SimpleNamespace:
    """Reference's steps (or those a mutation names instead) bound to a private copy of core.py with
    mutant `name` applied, and that copy's `prepare`: one start's implementation."""
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r}; known: {', '.join(sorted(MUTANTS))}")
    core = _private_core()
    steps = MUTANTS[name][1](core) or reference
    return types.SimpleNamespace(prepare=core.prepare, **{
        step: _bound(getattr(steps, step), core) for step in ("gpu_worker", "cpu_worker", "populate_cleanup")})


@functools.cache
def _core_code() -> types.CodeType:
    """core.py compiled once: a mutant is built per start (the model builds one per simulation),
    and importing a copy through the import system would compile it again each time (and under
    pytest, whose assertion rewriting covers the plugin's package, rewrite it too: 45 ms a copy)."""
    return compile(Path(shared_core.__file__).read_text(), shared_core.__file__, "exec")


def _private_core() -> types.ModuleType:
    """A fresh copy of core.py (not in sys.modules). Its failures are the shared core's `Fatal` and
    its context the shared `Ctx`, so the runner and the other modules see the ones they know."""
    copy = types.ModuleType(shared_core.__name__, shared_core.__doc__)
    copy.__file__, copy.__package__, copy.__spec__ = shared_core.__file__, shared_core.__package__, shared_core.__spec__
    exec(_core_code(), copy.__dict__)
    copy.Fatal, copy.Ctx = shared_core.Fatal, shared_core.Ctx
    return copy


def _bound(step, core) -> types.FunctionType:
    """`step` (a function of reference.py, legacy.py or direct.py) seeing `core` as its core module."""
    return types.FunctionType(step.__code__, {**step.__globals__, "core": core}, step.__name__,
                              step.__defaults__, step.__closure__)
