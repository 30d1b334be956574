"""The chaos checker: a pure judge of one run's history (SPEC section 6), in the style of Jepsen.

How this works
--------------
A run only *records*: every process appends events to the history (gpujail/world/history.py, its
kinds and fields in gpujail/world/events.py) and the harness adds what it saw at the end
(`final_state`). `check(history, final_state)` reads both and returns a `Verdict`; it touches no
file, no clock and no kernel, so the same history always gives the same verdict, and a history
saved from a failing CI run can be judged again on a laptop (`python -m gpujail.chaos.checker`).

Checkers compose, as in Jepsen (jepsen/src/jepsen/checker.clj: `check-safe`, `compose`):

* a *checker* judges one invariant: `checker(run) -> InvariantResult` (the `Checker` protocol),
  where `run.events` is the history in time order and `run.final` the final state
  (chaos/checkers/queries.py has the shared queries). It says PASS, FAIL with every `Violation`
  found (the violating event, its causal chain, one line a person can act on) or UNKNOWN with a
  reason: the run does not hold the data to decide, which is never a pass;
* `check_safe` runs one checker: a checker that raises gives UNKNOWN *for its invariant only*,
  with the exception and where it was raised as the reason, and the other invariants are still
  judged; a result without a reason or a violation gets one;
* `compose(checkers)` runs them all and merges their results into one `Verdict`: FAIL if any
  invariant fails, else UNKNOWN if any is unknown, else PASS; its headline is the violation that
  happened first.

The built-in checkers, one per invariant, are in chaos/checkers/ (one module per family, each
opening with the rule it checks). `CHECKERS` is the registry `check` uses; add an invariant of
your own with `register`, e.g. in a conftest.py so that every chaos run is judged by it:

    from gpujail.chaos import checker

    @checker.register("MY-1", description="no worker restarts twice")
    def at_most_one_restart(run):
        restarts = run.of("worker.restart")
        ...
        return checker.InvariantResult("MY-1", True, f"{len(restarts)} restarts")

or pass a mapping for one call: `check(history, final, checkers={**checker.CHECKERS, "MY-1": fn})`.
"""
from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpujail.spec import EXIT, FLAG, INVARIANTS
from gpujail.spec import LOCK as PLACEHOLDER_LOCK

from .checkers import BUILTIN
from .checkers.content import check_content, ready_spans
from .checkers.convergence import check_convergence
from .checkers.hygiene import LIBRARY_DIRS, check_hygiene, touching
from .checkers.locks import check_warm_locks, impl_runs
from .checkers.queries import (
    Run,
    chain_of,
    describe,
    is_bad,
    loader_says,
    node_of,
    relative,
    removal_before,
    same_file,
    what_went_wrong,
)
from .checkers.residue import check_residue
from .checkers.results import MAX_LISTED, UNKNOWN, InvariantResult, Violation, plural

__all__ = [  # what the harness, the timeline, the report and the command use; the rest for tests and tools
    "CHECKERS", "DESCRIPTIONS", "FLAG", "LIBRARY_DIRS", "MAX_LISTED", "PLACEHOLDER_LOCK", "UNKNOWN", "Checker",
    "InvariantResult", "Run", "Verdict", "Violation", "chain_of", "check", "check_content", "check_convergence",
    "check_hygiene", "check_residue", "check_safe", "check_warm_locks", "compose", "describe", "impl_runs",
    "is_bad", "loader_says", "main", "node_of", "plural", "ready_spans", "register", "relative", "removal_before",
    "same_file", "touching", "unregister", "what_went_wrong"]


class Checker(Protocol):
    """Judges one invariant of a run: PASS, FAIL with violations, or UNKNOWN with a reason."""

    def __call__(self, run: Run) -> InvariantResult: ...


CHECKERS: dict[str, Checker] = dict(BUILTIN)      # the registry `check` uses by default
DESCRIPTIONS: dict[str, str] = dict(INVARIANTS)   # invariant -> short name, for the summary


def register(invariant: str, checker: Checker | None = None, *, description: str = ""):
    """Judge every later run by `checker` too (replacing any checker of that invariant). Usable as
    a decorator; `description` (default: the first line of the checker's docstring) names the
    invariant in summaries. Returns the checker."""
    def add(fn: Checker) -> Checker:
        if not callable(fn):
            raise TypeError(f"checker of {invariant} must be callable, got {fn!r}")
        CHECKERS[invariant] = fn
        doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
        DESCRIPTIONS[invariant] = description or DESCRIPTIONS.get(invariant) or (doc[0] if doc else "")
        return fn
    return add if checker is None else add(checker)


def unregister(invariant: str) -> None:
    """Stop judging `invariant` (a built-in one comes back with `register(inv, BUILTIN[inv])`)."""
    CHECKERS.pop(invariant, None)
    if invariant not in INVARIANTS:
        DESCRIPTIONS.pop(invariant, None)


# -- the verdict ---------------------------------------------------------------------------------

@dataclass
class Verdict:
    valid: bool | str
    results: dict[str, InvariantResult]
    invariant: str | None = None                  # the headline violation's invariant
    first_violation: dict | None = None
    chain: list[dict] = field(default_factory=list)
    explanation: str | None = None
    t0: float = 0.0                               # time of the history's first event
    jails: tuple[str, ...] = ()                   # jail roots seen (to print jail-relative paths)

    def violations(self) -> list[Violation]:
        """Every violation of every invariant, the earliest first (end-state ones last)."""
        out = [v for r in self.results.values() for v in r.violations]
        order = list(self.results)
        return sorted(out, key=lambda v: (v.event is None, v.event["t"] if v.event else 0.0,
                                          order.index(v.invariant) if v.invariant in order else len(order)))

    @property
    def reason(self) -> str | None:
        """Why the verdict is UNKNOWN (every undecided invariant and its reason); None otherwise."""
        if self.valid != UNKNOWN:
            return None
        return "; ".join(f"{inv}: {r.note}" for inv, r in self.results.items() if r.valid == UNKNOWN)

    def summary(self) -> str:
        head = {True: "VALID", False: "INVALID", UNKNOWN: "UNKNOWN"}[self.valid]
        lines = [f"verdict: {head}" + (f" ({self.invariant})" if self.invariant else "")]
        for inv, r in self.results.items():
            lines.append(f"  {inv} {DESCRIPTIONS.get(inv, ''):<24} {r.status:<8} {r.note}".rstrip())
        if self.explanation:
            lines += ["", self.explanation]
        if self.chain or self.first_violation:
            lines.append("causal chain:")
            for e in self.chain:
                lines.append("  " + describe(e, self.t0, self.jails))
            if self.first_violation:
                lines.append("  " + describe(self.first_violation, self.t0, self.jails) + "   <- violation")
        others = self.violations()[1:]
        if others:
            lines += ["", f"{len(others)} more violation(s):"]
            lines += [f"  {v.invariant}: {v.explanation}" for v in others[:MAX_LISTED]]
            if len(others) > MAX_LISTED:
                lines.append(f"  ... and {len(others) - MAX_LISTED} more")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready, for a run report."""
        return {"valid": self.valid, "invariant": self.invariant, "explanation": self.explanation, "reason": self.reason,
                "first_violation": self.first_violation, "chain": self.chain,
                "results": {k: {"status": r.status, "note": r.note,
                                "violations": [{"explanation": v.explanation, "event": v.event, "chain": v.chain}
                                               for v in r.violations]}
                            for k, r in self.results.items()}}


def check_safe(invariant: str, checker: Checker, run: Run) -> InvariantResult:
    """Run one checker. An exception, or something that is not a result, makes this invariant
    UNKNOWN with the reason; it never aborts the verdict. UNKNOWN always carries a reason."""
    try:
        result = checker(run)
    except Exception as e:   # noqa: BLE001 (the point: one broken checker must not hide the others)
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return InvariantResult(invariant, UNKNOWN, f"checker raised {type(e).__name__}: {e} "
                                                   f"(at {frame.filename}:{frame.lineno} in {frame.name})")
    if not isinstance(result, InvariantResult):
        return InvariantResult(invariant, UNKNOWN, f"checker returned {type(result).__name__}, not an InvariantResult")
    if result.valid not in (True, False, UNKNOWN):
        return InvariantResult(invariant, UNKNOWN, f"checker returned valid={result.valid!r} "
                                                   f"(expected True, False or {UNKNOWN!r})", result.violations)
    result.invariant = invariant
    if result.valid == UNKNOWN and not result.note:
        result.note = "the checker gave no reason"
    if result.valid is False and not result.violations:
        result.violations = [Violation(invariant, f"{invariant}: {result.note or 'violated (the checker named no event)'}")]
    return result


def compose(checkers: Mapping[str, Checker]) -> Callable[[Run], Verdict]:
    """One judge from many checkers: runs each (check_safe) and merges their results into a Verdict."""
    def judge(run: Run) -> Verdict:
        results = {inv: check_safe(inv, fn, run) for inv, fn in checkers.items()}
        statuses = [r.valid for r in results.values()]
        valid = False if False in statuses else UNKNOWN if UNKNOWN in statuses or not statuses else True
        verdict = Verdict(valid, results, t0=run.t0, jails=run.jails)
        found = verdict.violations()
        if found:
            first = found[0]
            verdict.invariant, verdict.first_violation = first.invariant, first.event
            verdict.chain, verdict.explanation = first.chain, first.explanation
        return verdict
    return judge


def check(history: list[dict], final_state: dict | None = None, checkers: Mapping[str, Checker] | None = None) -> Verdict:
    """Judge one run: its history (events, any order) and what the harness found at the end, by
    `checkers` (default: the registry, CHECKERS)."""
    return compose(CHECKERS if checkers is None else checkers)(Run(history, final_state))


# -- the replay command --------------------------------------------------------------------------

class BadInput(Exception):
    pass


def _load(path: str, strict: bool) -> list[dict]:
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise BadInput(f"cannot read the history {path}: {e.strerror}") from None
    events = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInput(f"{path}:{n}: not JSON ({e.msg}): {line.strip()[:80]}") from None
        if not isinstance(event, dict) or not isinstance(event.get("kind"), str) or not isinstance(event.get("t"), (int, float)):
            raise BadInput(f"{path}:{n}: not an event (expected an object with a string `kind` and a number `t`): "
                           f"{line.strip()[:80]}")
        events.append(event)
    if strict:
        from gpujail.world import events as schema
        problems = schema.validate_history(events)
        if problems:
            raise BadInput(f"{path}: {len(problems)} events do not match the schema (gpujail/world/events.py):\n  "
                           + "\n  ".join(problems[:MAX_LISTED]))
    return events


def main(argv: list[str] | None = None) -> int:
    """Judge a saved run and print the verdict. Exit codes (gpujail.spec.EXIT): 0 valid, 1 invalid,
    4 unknown (inconclusive), 2 bad input (unreadable history or final state, bad arguments)."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gpujail.chaos.checker", description=main.__doc__)
    ap.add_argument("history", help="the run's history (JSON lines)")
    ap.add_argument("final_state", nargs="?", help="what the harness found at the end (JSON)")
    ap.add_argument("--timeline", metavar="OUT.html", help="also draw the run")
    ap.add_argument("--strict", action="store_true", help="also check every event against the history schema")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:   # --help (0) or a usage error (argparse's 2 is our bad-input)
        return EXIT["passed"] if e.code == 0 else EXIT["bad-input"]
    try:
        history = _load(args.history, args.strict)
        final = None
        if args.final_state:
            try:
                with open(args.final_state) as f:
                    final = json.load(f)
            except OSError as e:
                raise BadInput(f"cannot read the final state {args.final_state}: {e.strerror}") from None
            except json.JSONDecodeError as e:
                raise BadInput(f"{args.final_state}: not JSON ({e.msg} at line {e.lineno})") from None
            if not isinstance(final, dict):
                raise BadInput(f"{args.final_state}: expected a JSON object, found {type(final).__name__}")
    except BadInput as e:
        print(f"checker: {e}", file=sys.stderr)
        return EXIT["bad-input"]
    verdict = check(history, final)
    print(verdict.summary())
    if args.timeline:
        from gpujail.chaos import timeline
        print(f"timeline: {timeline.render(history, verdict, args.timeline)}")
    return {True: EXIT["passed"], False: EXIT["failed"]}.get(verdict.valid, EXIT["inconclusive"])


if __name__ == "__main__":
    sys.exit(main())
