"""`gpujail killmatrix`: which tests kill which mutant of `reference`.

How this works
--------------
The suite is only as strong as the mistakes it catches. For `reference` (the baseline) and then
each mutant (`mutant:NAME`, catalogue in reference_impl/mutants.py), one pytest session runs the
selected tests (default: the conformance and chaos suites) with `--impl` and `--gpujail-report`
into a temporary directory; the sessions run one after another, each with `-n WORKERS`. A test
*kills* a mutant when it passed against the baseline and failed against the mutant (a test that
does not pass against the baseline cannot kill anything and is reported as such). A mutant no test
kills is a *survivor*: a hole in the suite, to be closed with a new test citing the SPEC requirement.

With `--template` the same is done for the shell template vendors copy: the baseline is
`example-shell` and each mutant is a vendor's mistake in reference_impl/example.sh
(reference_impl/template_mutants.py), written to the scratch directory and run as
`--impl "sh DIR/NAME.sh"`. An edit that no longer applies to the current template is bad input
(exit 2) naming the mutant, before any session runs.

The test paths (`--tests`, default `conformance chaos`) are the suites' own: each session runs in
the folder that holds conformance/ and chaos/ (a checkout, or the installed gpujail package), so
`conformance/test_worker_start.py::test_x` names the same test either way; a path found only from
the current directory (your own test file) is taken from there.

Writes `OUT/kill-matrix.md` (for people) and `OUT/kill-matrix.json` (everything, per test), with
`--template` `OUT/kill-matrix-template.md` and `.json`. Exit
codes are the `gpujail` command's (gpujail.spec.EXIT): 0 when every mutant is killed, 1 when any
survives (or a session timed out), 2 bad input, 3 no kernel backend here, 5 when the baseline
session itself broke (the end of its log is printed).

    gpujail killmatrix                                  # every mutant, conformance + chaos
    gpujail killmatrix --quick                          # chaos without its random-timing runs
    gpujail killmatrix --mutants no-lock,big-markers --tests conformance
    gpujail killmatrix --template                       # the shell template's mutants

`python -m gpujail.conformance.killmatrix` is the same command.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpujail.spec import EXIT

BASELINE = "reference"
TEMPLATE_BASELINE = "example-shell"
# The folder holding the suites (conformance/ and chaos/): this package's parent, a checkout's
# root or site-packages/gpujail. Sessions run there, so test paths read the same either way.
SUITES_HOME = Path(__file__).resolve().parent.parent
RANK = {"passed": 0, "passed-intermittent": 0, "expected-fail": 1, "skipped": 1, "unexpected-pass": 2, "failed": 2}


def run_suite(impl: str, tests: list[str], extra: list[str], workers: int, timeout: float, scratch: Path,
              label: str | None = None) -> dict:
    """One pytest session against `impl`: {"statuses": {test: status}, "exit": code, "seconds": s}.
    A session over `timeout` is killed with its process group (nodes die with their harness).
    Its report and log are SCRATCH/LABEL.json and .log (default label: the implementation's name)."""
    label = label or impl.replace(":", "-")
    report = scratch / f"{label}.json"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), *tests, *extra,
            "--impl", impl, f"--gpujail-report={report}", "-o", "addopts="]
    start = time.monotonic()
    with open(scratch / f"{label}.log", "w") as log:
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=SUITES_HOME)
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            code = "timeout"
    statuses: dict[str, str] = {}
    if report.exists():
        for entry in json.loads(report.read_text())["requirements"].values():
            for t in entry["tests"]:   # a test citing several requirements appears under each
                old = statuses.get(t["test"])
                if old is None or RANK.get(t["status"], 2) > RANK.get(old, 2):
                    statuses[t["test"]] = t["status"]
    return {"statuses": statuses, "exit": code, "seconds": round(time.monotonic() - start, 1)}


def matrix(baseline: dict, runs: dict[str, dict], catalogue: dict[str, str], baseline_impl: str = BASELINE) -> dict:
    """The kill matrix as data: per mutant its killers, per test what it kills."""
    usable = sorted(t for t, s in baseline["statuses"].items() if RANK.get(s) == 0)
    mutants = {}
    for name, run in runs.items():
        killers = [t for t in usable if run["statuses"].get(t) == "failed"]
        mutants[name] = {"mistake": catalogue[name], "killed_by": killers, "exit": run["exit"],
                         "seconds": run["seconds"], "survived": not killers or run["exit"] == "timeout"}
    return {"baseline": {"implementation": baseline_impl, "exit": baseline["exit"], "seconds": baseline["seconds"],
                         "not_passing": {t: s for t, s in sorted(baseline["statuses"].items()) if RANK.get(s) != 0}},
            "tests": {t: [m for m, r in mutants.items() if t in r["killed_by"]] for t in usable},
            "mutants": mutants}


def short(test: str) -> str:
    return test.split("::")[-1]


def markdown(data: dict, command: str) -> str:
    mutants, tests = data["mutants"], data["tests"]
    survivors = [m for m, r in mutants.items() if r["survived"]]
    base = data["baseline"]["implementation"]
    lines = ["# Kill matrix" + (" of the shell template" if base == TEMPLATE_BASELINE else ""), "", f"`{command}`", "",
             f"{len(mutants) - len(survivors)} of {len(mutants)} mutants killed; {len(tests)} tests passing against "
             f"`{base}`, {sum(1 for k in tests.values() if k)} of them kill at least one mutant.", ""]
    if survivors:
        lines += [f"**Survivors (holes in the suite): {', '.join(survivors)}**", ""]
    lines += ["| mutant | the mistake | killed by | tests that kill it |", "|---|---|---|---|"]
    for name, r in mutants.items():
        shown = ", ".join(f"`{short(t)}`" for t in r["killed_by"][:6])
        more = f" and {len(r['killed_by']) - 6} more" if len(r["killed_by"]) > 6 else ""
        verdict = (f"{len(r['killed_by'])}" if not r["survived"] else "**timed out**" if r["exit"] == "timeout"
                   else "**survives**" + (f" (pytest exit {r['exit']})" if r["exit"] not in (0, 1) else ""))
        lines.append(f"| `{name}` | {r['mistake']} | {verdict} | {shown}{more} |")
    lines += ["", "| test | mutants it kills |", "|---|---|"]
    for t, killed in sorted(tests.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"| `{t}` | {len(killed)}: {', '.join(killed) if killed else '-'} |")
    if data["baseline"]["not_passing"]:
        lines += ["", f"Not passing against `{base}` (so they kill nothing here): " +
                  ", ".join(f"`{t}` ({s})" for t, s in data["baseline"]["not_passing"].items())]
    return "\n".join(lines) + "\n"


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--mutants", default="", help="comma-separated mutant names (default: all)")
    ap.add_argument("--template", action="store_true",
                    help="the shell template's mutants (reference_impl/template_mutants.py) against example-shell")
    ap.add_argument("--tests", default="conformance chaos",
                    help="pytest paths or node ids, space-separated, relative to the suites' folder (default: both suites)")
    ap.add_argument("--quick", action="store_true", help="leave out chaos's random-timing runs (-k 'not seed')")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per session (default 2; 0: one process)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per session (default 1800)")
    ap.add_argument("--out", default="reports", help="directory for kill-matrix.md and .json (default reports)")


def check(args) -> tuple[list[str], list[str]]:
    """The mutants and the test paths to run; ValueError, one line, for bad input (a template
    mutant whose edit no longer applies to example.sh included)."""
    template = getattr(args, "template", False)
    known = catalogue(template)
    names = [m for m in args.mutants.split(",") if m] or list(known)
    unknown = [m for m in names if m not in known]
    if unknown:
        raise ValueError(f"--mutants: unknown {'template ' if template else ''}mutant(s) {', '.join(unknown)}; "
                         f"known: {', '.join(known)}")
    if template:
        from gpujail.reference_impl import template_mutants
        for name in names:
            template_mutants.script(name)   # TemplateEditError is a ValueError: one line, exit 2
    if args.workers < 0 or args.timeout <= 0:
        raise ValueError("--workers must be 0 or more and --timeout more than 0 seconds")
    tests = []
    for spec in args.tests.split():
        path, _, node = spec.partition("::")
        if (SUITES_HOME / path).exists():   # the suites' own (an absolute path stays itself)
            pass
        elif Path(path).exists():           # from where the command runs: your own test file
            spec = str(Path(path).resolve()) + (f"::{node}" if node else "")
        else:
            raise ValueError(f"--tests: no such test path {path!r} in {SUITES_HOME} or here")
        tests.append(spec)
    if not tests:
        raise ValueError("--tests: no test paths given")
    return names, tests


def catalogue(template: bool) -> dict[str, tuple]:
    """The mutants, {name: (the mistake, ...)}: reference's, or the shell template's."""
    if template:
        from gpujail.reference_impl.template_mutants import MUTANTS
    else:
        from gpujail.reference_impl.mutants import MUTANTS
    return MUTANTS


def mutant_impls(template: bool, names: list[str], scratch: Path) -> dict[str, str]:
    """{name: the --impl string} for each mutant: `mutant:NAME`, or for the template the command
    that runs its script, written into SCRATCH/mutants (readable by every worker)."""
    if not template:
        return {name: f"mutant:{name}" for name in names}
    from gpujail.reference_impl import template_mutants
    (scratch / "mutants").mkdir()
    scratch.chmod(0o755)
    return {name: shlex.join(["sh", str(path)])
            for name, path in template_mutants.write(names, scratch / "mutants").items()}


def run(args, names: list[str], tests: list[str], command: str) -> int:
    """Run the baseline and every mutant, write the reports; an EXIT code."""
    template = getattr(args, "template", False)
    base = TEMPLATE_BASELINE if template else BASELINE
    extra = ["-k", "not seed"] if args.quick else []
    with tempfile.TemporaryDirectory(prefix="gpujail-killmatrix-") as scratch:
        impls = mutant_impls(template, names, Path(scratch))
        baseline = run_suite(base, tests, extra, args.workers, args.timeout, Path(scratch))
        if baseline["exit"] not in (0, 1):   # collection error, usage error, nothing collected, timeout
            log = (Path(scratch) / f"{base}.log").read_text().splitlines()[-10:]
            print(f"killmatrix: the baseline session against {base} ended with pytest exit {baseline['exit']}; "
                  "the end of its log:\n" + "\n".join("  " + ln for ln in log), file=sys.stderr)
            return EXIT["error"]
        print(f"baseline {base}: {sum(1 for s in baseline['statuses'].values() if RANK.get(s) == 0)} tests pass "
              f"({baseline['seconds']}s)", flush=True)
        runs = {}
        for name in names:
            runs[name] = run_suite(impls[name], tests, extra, args.workers, args.timeout, Path(scratch),
                                   label=f"mutant-{name}")
            killed = sum(1 for s in runs[name]["statuses"].values() if s == "failed")
            print(f"mutant:{name}: {killed} failing tests ({runs[name]['seconds']}s)", flush=True)
    data = matrix(baseline, runs, {n: catalogue(template)[n][0] for n in names}, base)
    data["command"] = command.strip()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "kill-matrix-template" if template else "kill-matrix"   # the two matrices side by side
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out / f"{stem}.md").write_text(markdown(data, data["command"]))
    survivors = [m for m, r in data["mutants"].items() if r["survived"]]
    print(f"{len(names) - len(survivors)} of {len(names)} mutants killed" +
          (f"; survivors: {', '.join(survivors)}" if survivors else "") + f"; see {out / (stem + '.md')}")
    return EXIT["failed"] if survivors else EXIT["passed"]


def main(argv: list[str] | None = None) -> int:
    """`python -m gpujail.conformance.killmatrix`, the alias of `gpujail killmatrix`."""
    from gpujail.backends import kernel
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m gpujail.conformance.killmatrix", description=__doc__.split("\n")[0])
    arguments(ap)
    args = ap.parse_args(argv)
    try:
        names, tests = check(args)
    except ValueError as e:
        print(f"killmatrix: {e}", file=sys.stderr)
        return EXIT["bad-input"]
    reason = kernel.precondition()
    if reason:
        print(f"killmatrix: {reason}", file=sys.stderr)
        return EXIT["backend"]
    return run(args, names, tests, shlex.join(["python", "-m", "gpujail.conformance.killmatrix", *argv]))


if __name__ == "__main__":
    sys.exit(main())
