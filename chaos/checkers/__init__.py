"""The built-in checkers, one per invariant of SPEC section 6 (chaos/checker.py composes them).

How this works
--------------
A checker is a function `checker(run) -> InvariantResult` (the protocol `chaos.checker.Checker`):
`run` is the history in time order with the harness's `final_state` (`queries.Run`), the result is
PASS, FAIL with its violations, or UNKNOWN with a reason (`results`). Checkers are pure: no file, no
clock, no kernel. One module per invariant family:

    queries.py      the run indexed by node and kind; paths, probe results, causal chains, `describe`
    results.py      Violation, InvariantResult, UNKNOWN
    content.py      INV-1 no lost content, INV-5 honest readiness (one pass over the ready spans)
    convergence.py  INV-2 convergence
    hygiene.py      INV-3 jail hygiene
    locks.py        INV-4 no lock on warm starts
    residue.py      INV-6 no host residue
"""
from __future__ import annotations

from .content import honest_readiness, lost_content
from .convergence import check_convergence
from .hygiene import check_hygiene
from .locks import check_warm_locks
from .residue import check_residue

BUILTIN = {"INV-1": lost_content, "INV-2": check_convergence, "INV-3": check_hygiene,
           "INV-4": check_warm_locks, "INV-5": honest_readiness, "INV-6": check_residue}
