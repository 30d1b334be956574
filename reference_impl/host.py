"""What one worker start stands on outside the jail's files, shared by every bundled implementation
through core.py.

How this works
--------------
core.py is the procedure on the jail's files: markers under the lock, verification, sonames, REF-9's
placeholders. This module holds what that procedure stands on: the start's context from the contract's
environment (`Ctx`) and how a start fails (`Fatal`, one exit code per kind); what it learns from the
host (where the CLI will mount each file, REF-2; each library's ELF class and soname, REF-2 and
REF-12); what it asks of the kernel (this namespace's mounts made private, the mounts under the jail;
the cross-node lock, REF-5) and of the CLI (`configure`, REF-6, and the entries it mounts for the
capabilities asked for).

core.py imports every name it uses from here, and the implementations call them as `core.NAME`: a
mutant (mutants.py) that replaces one in its private copy of core.py replaces it for the whole
start. Nothing here calls back into core.py, which is what keeps that true.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpujail.spec import CAPABILITIES, IMPL_EXIT, LOCK, last_error
from gpujail.world import failpoints, history
from gpujail.world.sysops import LockTimeout

LIB64, LIB32 = "usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu"


class Fatal(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.code = kind, IMPL_EXIT[kind]   # one code per kind: an orchestrator tells them apart


@dataclass
class Ctx:
    """What one worker start knows: SPEC section 5's contract, plus the interface to the world."""
    sys: object
    jail: str
    node: str = "?"
    role: str = "gpu-worker"
    capabilities: str = "compute,utility"
    cli: str = "nvidia-container-cli"
    lock_timeout: float = 120.0
    name: str = "reference"
    sonames: Mapping[str, str] = field(default_factory=dict)   # REF-12: soname target -> our library's target
    elf32: set[str] = field(default_factory=set)   # REF-2: the host libraries of the file set that are 32-bit

    @classmethod
    def from_env(cls, sysops, name: str, environ=None) -> Ctx:
        """From the contract's environment (`environ`, default this process's: the model backend
        passes each simulated worker's own)."""
        env = os.environ if environ is None else environ
        # REF-7: resolved once, here. Clusters name shared filesystems through symlinks (/scratch ->
        # /lustre/scratch), and mountinfo lists the mount points by their resolved paths.
        jail = sysops.realpath(os.path.abspath(env.get("GPUJAIL_JAIL") or os.getcwd()))
        timeout = float(env.get("GPUJAIL_LOCK_TIMEOUT", "120"))
        if not 0 <= timeout < float("inf"):   # inf waits forever, nan compares false to everything
            raise ValueError(timeout)
        return cls(sysops, jail, env.get("GPUJAIL_NODE", "?"), env.get("GPUJAIL_ROLE", "gpu-worker"),
                   env.get("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"), lock_timeout=timeout, name=name)

    def cli_flags(self) -> list[str]:
        """NVIDIA_DRIVER_CAPABILITIES (e.g. "compute,utility" or "all") as configure flags."""
        caps = [c.strip() for c in self.capabilities.split(",") if c.strip()]
        if "all" in caps:
            caps = [c for c in CAPABILITIES if c != "compat32"]
        unknown = [c for c in caps if c not in CAPABILITIES]
        if unknown:
            raise Fatal("bad-input", f"NVIDIA_DRIVER_CAPABILITIES: unknown capability {unknown[0]!r}")
        return [f"--{c}" for c in caps]


# -- REF-2: where the CLI will mount each file -------------------------------------------------

def is_library(host_path: str) -> bool:
    base = os.path.basename(host_path)
    return base.startswith("lib") and ".so" in base


def target(host_path: str, debian: bool = True, elf32: bool = False) -> str:
    """The jail-relative path the CLI mounts `host_path` at (SPEC CLI-3): libraries flattened into
    the jail's 64-bit or, for a 32-bit one (`elf32`), 32-bit library directory, binaries into
    usr/bin, everything else at its own path."""
    d, base = os.path.split(host_path)
    if is_library(host_path):
        if elf32:
            return f"{LIB32 if debian else 'usr/lib'}/{base}"
        return f"{LIB64 if debian else 'usr/lib64'}/{base}"
    if d.endswith("/bin") or d.endswith("/sbin"):
        return f"usr/bin/{base}"
    return host_path.lstrip("/")


def elf32(ctx: Ctx, host_path: str) -> bool:
    """REF-2: whether a library of the file set is 32-bit. The CLI knows it from `list`'s sections
    (the ELF class the host's linker cache records), so do we, from the file's ELF header: never
    from its directory's name (`/usr/lib` is 64-bit on Arch, 32-bit on RHEL)."""
    from gpujail.fixtures.elf import ELFCLASS32, elf_class  # the one ELF parser of the project
    try:
        return elf_class(ctx.sys.read_image(host_path)) == ELFCLASS32
    except OSError as e:
        raise Fatal("bad-input", f"`{ctx.cli} list` printed {host_path}, which cannot be read: {e.strerror}") from None


# -- REF-12: each library's soname, from the host file ---------------------------------------

def soname_pairs(ctx: Ctx, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """REF-12: (host library, jail-relative soname target) for every listed library whose soname
    (DT_SONAME, read from the host file) differs from its file name, e.g.
    (/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15, usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1).

    Why: the jail's soname links and etc/ld.so.cache are shared by every node, so a link can point
    at one driver version only, and whoever runs ldconfig last picks it (the operator's #184: 535
    and 550 nodes). Instead each soname becomes a placeholder too (a marker, under the lock), and
    every node bind-mounts its *own* library over it in its own namespace. ldconfig never turns a
    regular file into a link ("is not a symbolic link"), so no later ldconfig, on any node, can
    flip it; and the soname is found by path even when a blind ldconfig dropped it from the cache."""
    from gpujail.fixtures.elf import read_soname  # the one ELF parser of the project
    out = []
    for host_path, rel in pairs:
        base = os.path.basename(rel)
        if not (base.startswith("lib") and ".so." in base):
            continue
        try:
            soname = read_soname(ctx.sys.read_image(host_path))
        except OSError as e:
            raise Fatal("bad-input", f"listed host library {host_path}: {e.strerror}") from None
        if soname and soname != base and "/" not in soname:
            out.append((host_path, f"{os.path.dirname(rel)}/{soname}"))
    return out


# -- REF-5: the cross-node lock ---------------------------------------------------------------

class JailLock:
    """An exclusive flock on a lock file in the shared jail, with a bounded wait (K-4, REF-5)."""

    def __init__(self, ctx: Ctx, rel: str = LOCK):
        self.ctx, self.rel, self.fd = ctx, rel, None

    def __enter__(self) -> JailLock:
        ctx = self.ctx
        try:
            self.fd = ctx.sys.open_lock_beneath(ctx.jail, self.rel)
        except OSError as e:
            raise Fatal("jail-write-failed", f"cannot open lock {ctx.jail}/{self.rel}: {e.strerror}") from None
        history.record("impl.lock.wait", lock=self.rel)
        try:
            waited = ctx.sys.lock(self.fd, ctx.lock_timeout)
        except LockTimeout:
            ctx.sys.close(self.fd)
            history.record("impl.lock.timeout", lock=self.rel, timeout=ctx.lock_timeout)
            raise Fatal("lock-timeout", f"lock {ctx.jail}/{self.rel} not acquired within "
                                        f"{ctx.lock_timeout:g}s: another worker holds it") from None
        history.record("impl.lock.acquired", lock=self.rel, waited=waited)
        return self

    def __exit__(self, *exc) -> None:
        self.ctx.sys.unlock(self.fd)
        history.record("impl.lock.released", lock=self.rel)


# -- this namespace's mounts ------------------------------------------------------------------

def isolate(ctx: Ctx) -> None:
    """Make the jail's mount, and every mount under it, private in this namespace before mounting
    anything. On a host whose jail mount is shared (systemd makes `/` shared; a Kubernetes
    Bidirectional volume is rshared) a worker's namespace is a peer of the host's and of every
    other worker's: each bind mount of this start would land in all of them (a node on another
    driver version then sees ours on top of its own), each cleanup unmount would detach their copies,
    and the mounts would stay in the host's namespace after the worker is gone. Not a write to the
    jail: a warm start does it too (REF-4)."""
    try:
        ctx.sys.make_private(ctx.jail)
    except OSError as e:
        raise Fatal("unsafe-jail", f"cannot make the mounts of the jail {ctx.jail} private in this namespace "
                                   f"(they would reach other nodes): {e.strerror}") from None


def jail_mounts(ctx: Ctx) -> dict[int, object]:
    """This namespace's mounts under the jail, by mount id (a mount stacked on an old one is new)."""
    prefix = ctx.jail.rstrip("/") + "/"
    return {m.mount_id: m for m in ctx.sys.mounts() if m.mountpoint.startswith(prefix)}


# -- REF-6: the CLI ---------------------------------------------------------------------------

def run_configure(ctx: Ctx) -> None:
    failpoints.hit("ref.before_configure")
    argv = [ctx.cli, "--user", "--no-pivot", "configure", "--no-cgroups", "--cuda-compat-mode=disabled",
            "--ldconfig=/usr/bin/true", "--device=all", *ctx.cli_flags(), ctx.jail]
    code, _, err = ctx.sys.run(argv)
    if code != 0:
        raise Fatal("cli-failed", f"`{ctx.cli} configure` failed (exit {code}): {last_error(err, code)}")


def for_capabilities(ctx: Ctx, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The entries `configure` mounts for the caller's capabilities (libnvidia-container's rules, as
    the fake CLI has them: fixtures/nvc_info.py): what REF-7 expects mounted, what `direct` mounts."""
    from gpujail.fixtures import nvc_info
    caps = nvc_info.capabilities({f.lstrip("-") for f in ctx.cli_flags()})
    return [(h, t) for h, t in pairs if nvc_info.selected(h, caps, h in ctx.elf32)]
