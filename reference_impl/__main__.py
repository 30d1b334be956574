"""`python -m gpujail.reference_impl NAME [ACTION]`: run a bundled implementation under the SPEC section 5
contract (GPUJAIL_JAIL, GPUJAIL_NODE, GPUJAIL_ROLE, NVIDIA_DRIVER_CAPABILITIES from the
environment). ACTION defaults to the role's start procedure; `populate-cleanup` runs the
populate-jail cleanup of a reused jail. Exit codes: reference_impl.core.EXIT."""
from __future__ import annotations

import sys

from gpujail.reference_impl import core, direct, legacy, reference

from gpujail.world import failpoints, history
from gpujail.world.sysops import RealSys

IMPLEMENTATIONS = {"reference": reference, "legacy": legacy, "direct": direct}
USAGE = "usage: python -m gpujail.reference_impl {reference|legacy|direct|mutant:NAME} [start|populate-cleanup]"


def main(argv: list[str]) -> int:
    if argv and argv[0].startswith("mutant:"):
        from gpujail.reference_impl import mutants
        try:
            mutants.apply(argv[0].split(":", 1)[1])
        except KeyError as e:
            print(f"reference_impl: {e.args[0]}", file=sys.stderr)
            return core.EXIT["bad-input"]
        argv = ["reference", *argv[1:]]
    if not argv or argv[0] not in IMPLEMENTATIONS or len(argv) > 2 or (argv[1:] or ["start"])[0] not in (
            "start", "populate-cleanup"):
        print(USAGE, file=sys.stderr)
        return core.EXIT["bad-input"]
    name, action = argv[0], (argv[1:] or ["start"])[0]
    try:
        ctx = core.Ctx.from_env(RealSys(), name)
    except ValueError:
        print(f"{name}: GPUJAIL_LOCK_TIMEOUT: not a number of seconds", file=sys.stderr)
        return core.EXIT["bad-input"]
    return execute(name, action, ctx)


def execute(name: str, action: str, ctx: core.Ctx) -> int:
    """Run one bundled implementation's `action` for `ctx`: exit code, one line on stderr on failure.
    The kernel and docker backends reach it through main(); the model backend calls it in-process."""
    impl = IMPLEMENTATIONS[name]
    ctx = core.prepare(ctx)
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
        return core.EXIT["bad-input"]
    except OSError as e:   # e.g. an injected fault: still one line, never a traceback
        history.record("impl.fatal", impl=name, failure="io-error", code=core.EXIT["io-error"], error=str(e))
        print(f"{name}: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return core.EXIT["io-error"]
    history.record("impl.ready", impl=name, role=ctx.role, action=action)
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
