"""Rewrite an expectations file from a run report (like `wpt update-expectations`).

    python -m gpujail.conformance.expectations reports/summary.json > expectations/legacy.toml

Every test that failed (or was expected to fail and did) is listed under [tests] with the reason
from the report; tests that passed are left out. Review the reasons before committing: an
expectations file is a statement of what an implementation is known to get wrong.
"""
from __future__ import annotations

import json
import sys


def render(report: dict) -> str:
    info = report["run_info"]
    failing: dict[str, str] = {}
    for rid, entry in report["requirements"].items():
        for t in entry["tests"]:
            if t["status"] in ("failed", "expected-fail"):
                failing.setdefault(t["test"], f"{rid}: {t['reason']}".replace('"', "'"))
    lines = [f"# Expected failures of {info['implementation']!r} (contract {info['contract_version']}),",
             f"# generated from a run on the {info['backend']} backend; edit the reasons by hand.",
             f'implementation = "{info["implementation"]}"', "", "[tests]"]
    lines += [f'"{test}" = "{reason}"' for test, reason in sorted(failing.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        report = json.loads(open(argv[0]).read())
    except (OSError, ValueError) as e:
        print(f"expectations: cannot read report {argv[0]}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
