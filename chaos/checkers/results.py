"""What a checker returns: an `InvariantResult` holding the `Violation`s it found.

How this works
--------------
A checker (chaos/checker.py has the protocol) judges one invariant and says PASS (`valid=True`),
FAIL (`valid=False`, with every violation found) or UNKNOWN (`valid="unknown"`: the run does not
hold the data to decide, or the checker itself failed; never a pass, and always with a reason in
`note`). A violation is data first, text second (as Elle's explanations are): the violating event,
the chain of earlier events that caused it (oldest first), and one line a person can act on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

UNKNOWN = "unknown"


class Inconclusive(Exception):
    """A chaos test that proved nothing: an invariant it may not leave UNKNOWN was left so, or a
    declared fault window never opened. Not a pass: the plugin reports it as `inconclusive` (the run
    fails) unless the expectations file lists the test under [inconclusive]."""
MAX_LISTED = 10                                   # violations listed by summary() beyond the first


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")



@dataclass
class Violation:
    invariant: str
    explanation: str
    event: dict | None = None                     # the violating event (None: found in final_state)
    chain: list[dict] = field(default_factory=list)   # earlier events that caused it, oldest first


@dataclass
class InvariantResult:
    invariant: str
    valid: bool | str                             # True, False or "unknown"
    note: str = ""                                # what was checked, or why it is unknown
    violations: list[Violation] = field(default_factory=list)

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL"}.get(self.valid, "UNKNOWN")


    @property
    def first(self) -> Violation | None:
        """The violation that happened first (those found only in final_state last)."""
        return min(self.violations, key=lambda v: (v.event is None, v.event["t"] if v.event else 0.0), default=None)
