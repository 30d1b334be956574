"""Bundled implementations: `reference` (the fixed procedure), `legacy` (the bug, on demand),
`direct` (mount without the CLI, seed 003), the mutants of `reference` (mutants.py) and
`example.sh` (the shell template for vendors)."""
from __future__ import annotations


def in_process(name: str):
    """Bundled implementation `name` (reference, legacy, direct, mutant:NAME) as a callable
    `entry(sys, env) -> exit code` that runs one worker start in this process, on the given Sys with
    the given contract environment: what the model backend runs. None for anything else (a
    command, e.g. example-shell or a vendor's script, runs only as a process). KeyError: an
    unknown mutant."""
    from gpujail.reference_impl.__main__ import implementation, start
    if name.startswith("mutant:"):
        implementation(name)   # an unknown mutant fails here, once, not in every start

        def entry(sysops, env) -> int:
            return start(implementation(name), sysops, env)   # a fresh mutant per start
        return entry
    found = implementation(name)
    if found is None:
        return None
    return lambda sysops, env: start(found, sysops, env)
