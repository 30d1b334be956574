"""INV-6 no host residue: nothing of the run is left on the host (SPEC section 6).

How this works
--------------
`final_state["host_mounts"]`, `["processes"]` and `["temp_dirs"]` (what the harness found after
tearing the fleet down) must be empty; a key missing from final_state makes the invariant UNKNOWN.
"""
from __future__ import annotations

from .queries import Run
from .results import UNKNOWN, InvariantResult, Violation

RESIDUE = (("host_mounts", "mount", "mounts", "of the run left in the host namespace"),
           ("processes", "process", "processes", "left running"),
           ("temp_dirs", "temporary directory", "temporary directories", "left"))


def check_residue(run: Run) -> InvariantResult:
    out, counts, missing = [], [], []
    for key, one, many, where in RESIDUE:
        left = run.final.get(key)
        if left is None:
            missing.append(key)
        elif left:
            left = list(left)
            shown = ", ".join(str(x) for x in left[:5]) + (" ..." if len(left) > 5 else "")
            what = f"{len(left)} {one if len(left) == 1 else many} {where}"
            out.append(Violation("INV-6", f"host residue: {what}: {shown}"))
            counts.append(what)
    if out:
        return InvariantResult("INV-6", False, "; ".join(counts), out)
    if missing:
        return InvariantResult("INV-6", UNKNOWN, f"final_state has no {', '.join(missing)}")
    return InvariantResult("INV-6", True, "no mount, process or temporary directory left")

