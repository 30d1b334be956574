"""`gpujail expectations`: rewrite an expectations file from a run report (like `wpt update-expectations`).

    gpujail expectations reports/summary.json > expectations/mine.toml

Every test that failed (or was expected to fail and did) is listed under [tests] with the reason
from the report, every chaos test that proved nothing (inconclusive, or expected so) under
[inconclusive] with why; tests that passed are left out. A test the run's own file listed as
[intermittent] or [intermittent-inconclusive] stays there, whatever this run did (one run cannot
show that a test is no longer intermittent: wpt's update-expectations keeps them too). Review the
reasons before committing: an expectations file is a statement of what an implementation is known
to get wrong.
`python -m gpujail.conformance.expectations REPORT` is the same command.
"""
from __future__ import annotations

import argparse
import json
import sys

from gpujail.spec import EXIT


def render(report: dict) -> str:
    info = report["run_info"]
    failing: dict[str, str] = {}
    unproven: dict[str, str] = {}
    kept: dict[str, dict[str, str]] = {"intermittent": {}, "intermittent-inconclusive": {}}
    for rid, entry in report["requirements"].items():
        for t in entry["tests"]:
            listed = t.get("listed") or {}
            if listed.get("section") in kept:
                kept[listed["section"]].setdefault(t["test"], listed["why"].replace('"', "'"))
            elif t["status"] in ("failed", "expected-fail"):
                failing.setdefault(t["test"], f"{rid}: {t['reason']}".replace('"', "'"))
            elif t["status"] in ("inconclusive", "expected-inconclusive"):
                unproven.setdefault(t["test"], t["reason"].splitlines()[0].replace('"', "'") if t["reason"] else "?")
    lines = [f"# Expected failures of {info['implementation']!r} (contract {info['contract_version']}),",
             f"# generated from a run on the {info['backend']} backend; edit the reasons by hand.",
             f'implementation = "{info["implementation"]}"', "", "[tests]"]
    lines += [f'"{test}" = "{reason}"' for test, reason in sorted(failing.items())]
    for section, tests in [("inconclusive", unproven), *kept.items()]:
        if tests:
            lines += ["", f"[{section}]"] + [f'"{test}" = "{reason}"' for test, reason in sorted(tests.items())]
    return "\n".join(lines) + "\n"


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("report", help="a run's summary.json (gpujail run writes reports/summary.json)")


def load(path: str) -> str:
    """The expectations file for the report at `path`; ValueError, one line, when it is not one."""
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read report {path}: {e}") from None
    try:
        return render(report)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a gpujail summary.json (no {e} where a run report has one)") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpujail.conformance.expectations", description=__doc__.split("\n")[0])
    arguments(ap)
    args = ap.parse_args(argv)
    try:
        text = load(args.report)
    except ValueError as e:
        print(f"expectations: {e}", file=sys.stderr)
        return EXIT["bad-input"]
    sys.stdout.write(text)
    return EXIT["passed"]


if __name__ == "__main__":
    sys.exit(main())
