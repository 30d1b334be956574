"""`python -m gpujail.reference_impl NAME [ACTION]`: run a bundled implementation under the SPEC section 5
contract (GPUJAIL_JAIL, GPUJAIL_NODE, GPUJAIL_ROLE, NVIDIA_DRIVER_CAPABILITIES from the
environment). ACTION defaults to the role's start procedure; `populate-cleanup` runs the
populate-jail cleanup of a reused jail. Exit codes: gpujail.spec.IMPL_EXIT.

The same start runs in-process on the model backend: `in_process(NAME)` (gpujail.reference_impl)
gives it as `entry(sys, env) -> exit code`, with the model's Sys and the worker's contract
environment instead of this process's.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping

from gpujail.reference_impl import cdi, core, direct, legacy, reference
from gpujail.spec import IMPL_EXIT
from gpujail.world import failpoints, history
from gpujail.world.sysops import RealSys

IMPLEMENTATIONS = {"reference": reference, "legacy": legacy, "direct": direct, "cdi-naive": cdi.NAIVE, "cdi": cdi.FIXED}
USAGE = "usage: python -m gpujail.reference_impl {reference|legacy|direct|cdi-naive|cdi|mutant:NAME} [start|populate-cleanup]"


def implementation(name: str):
    """The steps (gpu_worker, cpu_worker, populate_cleanup) of bundled implementation `name`, and
    the name its events carry; None if `name` is not one. A mutant is built fresh for each start
    (reference_impl/mutants.py): nothing shared is changed. KeyError: an unknown mutant."""
    if name.startswith("mutant:"):
        from gpujail.reference_impl import mutants  # not on a plain start's path (start-up cost)
        return mutants.build(name.split(":", 1)[1]), "reference"
    return (IMPLEMENTATIONS[name], name) if name in IMPLEMENTATIONS else None


def main(argv: list[str]) -> int:
    try:
        found = implementation(argv[0]) if argv else None
    except KeyError as e:
        print(f"reference_impl: {e.args[0]}", file=sys.stderr)
        return IMPL_EXIT["bad-input"]
    if found is None or len(argv) > 2 or (argv[1:] or ["start"])[0] not in ("start", "populate-cleanup"):
        print(USAGE, file=sys.stderr)
        return IMPL_EXIT["bad-input"]
    return start(found, RealSys(), None, (argv[1:] or ["start"])[0])


def start(found, sysops, environ: Mapping[str, str] | None, action: str = "start") -> int:
    """One start of an implementation (as `implementation` found it) on `sysops`, with the contract
    environment `environ` (None: this process's)."""
    impl, name = found
    try:
        ctx = core.Ctx.from_env(sysops, name, environ)
    except ValueError:
        print(f"{name}: GPUJAIL_LOCK_TIMEOUT: not a finite number of seconds", file=sys.stderr)
        return IMPL_EXIT["bad-input"]
    return execute(impl, name, action, ctx)


def execute(impl, name: str, action: str, ctx: core.Ctx) -> int:
    """Run one implementation's `action` for `ctx`: exit code, one line on stderr on failure."""
    ctx = getattr(impl, "prepare", core.prepare)(ctx)
    try:
        if action == "populate-cleanup":
            step = impl.populate_cleanup
        elif ctx.role == "gpu-worker":
            step = impl.gpu_worker
        elif ctx.role in ("cpu-worker", "login"):
            step = impl.cpu_worker
        else:
            raise core.Fatal("bad-input", f"GPUJAIL_ROLE: unknown role {ctx.role!r} "
                                          "(expected gpu-worker, cpu-worker or login)")
        history.record("impl.begin", impl=name, role=ctx.role, action=action)
        step(ctx)
    except core.Fatal as e:
        history.record("impl.fatal", impl=name, failure=e.kind, code=e.code, error=str(e))
        print(f"{name}: {e}", file=sys.stderr)
        return e.code
    except failpoints.FailpointSpecError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return IMPL_EXIT["bad-input"]
    except OSError as e:   # e.g. an injected fault: still one line, never a traceback
        history.record("impl.fatal", impl=name, failure="io-error", code=IMPL_EXIT["io-error"], error=str(e))
        print(f"{name}: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return IMPL_EXIT["io-error"]
    history.record("impl.ready", impl=name, role=ctx.role, action=action)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
