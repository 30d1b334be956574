"""`python -m reference_impl NAME [ACTION]`: run a bundled implementation under the SPEC section 5
contract (GPUJAIL_JAIL, GPUJAIL_NODE, GPUJAIL_ROLE, NVIDIA_DRIVER_CAPABILITIES from the
environment). ACTION defaults to the role's start procedure; `populate-cleanup` runs the
populate-jail cleanup of a reused jail. Exit codes: reference_impl.core.EXIT."""
from __future__ import annotations

import sys

from gpujail import failpoints, history
from gpujail.sysops import RealSys

from . import core, direct, legacy, reference

IMPLEMENTATIONS = {"reference": reference, "legacy": legacy, "direct": direct}
USAGE = "usage: python -m reference_impl {reference|legacy|direct|mutant:NAME} [start|populate-cleanup]"


def main(argv: list[str]) -> int:
    if argv and argv[0].startswith("mutant:"):
        from . import mutants
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
    impl, action = IMPLEMENTATIONS[argv[0]], (argv[1:] or ["start"])[0]
    try:
        ctx = core.Ctx.from_env(RealSys(), argv[0])
        if action == "populate-cleanup":
            step = impl.populate_cleanup
        elif ctx.role == "gpu-worker":
            step = impl.gpu_worker
        elif ctx.role in ("cpu-worker", "login"):
            step = impl.cpu_worker
        else:
            raise core.Fatal("bad-input", f"GPUJAIL_ROLE: unknown role {ctx.role!r} "
                                          "(expected gpu-worker, cpu-worker or login)")
        history.record("impl.begin", impl=argv[0], role=ctx.role, action=action)
        step(ctx)
    except core.Fatal as e:
        history.record("impl.fatal", impl=argv[0], failure=e.kind, code=e.code, message=str(e))
        print(f"{argv[0]}: {e}", file=sys.stderr)
        return e.code
    except failpoints.FailpointSpecError as e:
        print(f"{argv[0]}: {e}", file=sys.stderr)
        return core.EXIT["bad-input"]
    except OSError as e:   # e.g. an injected fault: still one line, never a traceback
        history.record("impl.fatal", impl=argv[0], failure="io-error", code=core.EXIT["io-error"], message=str(e))
        print(f"{argv[0]}: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return core.EXIT["io-error"]
    history.record("impl.ready", impl=argv[0], role=ctx.role, action=action)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
