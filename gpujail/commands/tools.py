"""`gpujail killmatrix`, `expectations`, `check`, `explore`, `bench`: the project's other tools behind
the one front door, under the same exit codes (gpujail.spec.EXIT).

Each tool lives in the layer it belongs to and, but for explore, keeps its `python -m` form as an alias:

    killmatrix    gpujail.conformance.killmatrix   which tests kill which mutant of reference (or the template)
    expectations  gpujail.conformance.expectations an expectations file from a run's summary.json
    check         gpujail.chaos.checker            judge a saved history again, draw its timeline
    explore       (none)                           the model backend's search for a violation, or a replay
    bench         gpujail.benchmarks.run           every performance figure as one table

The killmatrix, expectations and bench modules give their arguments, their input check and their
run to both forms. The checker keeps its own `main(argv)`: its arguments are declared here again so
that a mistake is one line (exit 2) like every other subcommand's, its input is checked here (a file
that is not a history), and its exit codes are mapped onto EXIT. The exploration has one parser, here:
`explore` checks the arguments (an implementation the model does not run, a plan that is not one) and
hands them to chaos/explore.py `run` (its `python -m` twin had drifted from this one and is gone).
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from gpujail.benchmarks import run as benchmarks
from gpujail.commands import Stop, check_backend
from gpujail.conformance import expectations as expectations_file
from gpujail.conformance import killmatrix as matrix
from gpujail.spec import EXIT


def add_parsers(sub) -> None:
    km = sub.add_parser("killmatrix", help="which tests kill which mutant of reference, or with --template of the shell "
                        "template (reports/kill-matrix[-template].md, .json)",
                        description=matrix.__doc__.split("\n")[0].strip("`"))
    matrix.arguments(km)
    ex = sub.add_parser("expectations", help="an expectations file from a run's summary.json, on stdout",
                        description=expectations_file.__doc__.split("\n")[0].strip("`"))
    expectations_file.arguments(ex)

    ck = sub.add_parser("check", help="judge a saved chaos history again (SPEC INV-1..6), and draw it",
                        description="Judge a saved run against SPEC INV-1..6: exit 0 valid, 1 invalid, 4 undecided.")
    ck.add_argument("history", help="the run's history.jsonl (JSON lines)")
    ck.add_argument("final_state", nargs="?", help="the run's final_state.json (what the harness found at the end)")
    ck.add_argument("--timeline", metavar="OUT.html", help="also draw the run")

    xp = sub.add_parser("explore", help="search the model backend for a violation and shrink it, or replay a plan",
                        description="Hypothesis chooses interleavings and faults on the model backend "
                                    "(`find`: exit 1 when it breaks an invariant); `bounded` runs every schedule "
                                    "within a preemption bound; `replay` runs a printed plan again.")
    how = xp.add_subparsers(dest="how", metavar="find|bounded|replay", required=True)
    search = how.add_parser("find", help="search for a plan that breaks an invariant, shrink it, print its trace")
    every = how.add_parser("bounded", help="every schedule with at most C preemptions, without a fault and with each "
                           "single fault: a proof for that bound (exit 0), or the first failing plan (exit 1)")
    replay = how.add_parser("replay", help="run one plan (JSON, as `find` and `bounded` print it) and print its trace")
    for p in (search, every, replay):
        p.add_argument("impl", help="reference, legacy, direct or mutant:NAME")
        p.add_argument("--workers", type=int, default=2, help="workers in the simulation (default 2)")
        p.add_argument("--full-driver", action="store_true", help="every file of the driver, not the 3-file one")
        p.add_argument("--full", action="store_true", help="print every step, not only the ones that change something")
    search.add_argument("--seed", type=int, help="Hypothesis's seed (default: a random one)")
    search.add_argument("--max-examples", type=int, default=2000, help="plans to try at most (default 2000)")
    replay.add_argument("plan", help="the plan, as JSON")
    every.add_argument("--preemptions", type=int, default=1, metavar="C", help="the bound (default 1)")
    every.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: one per CPU)")

    bn = sub.add_parser("bench", help="every performance figure as one table (reports/benchmarks.json)",
                        description=benchmarks.__doc__.split("\n\n")[0])
    benchmarks.arguments(bn)


def bad_input(command: str, message: str) -> Stop:
    return Stop("bad-input", f"gpujail {command}: {message}")


def killmatrix(args) -> int:
    try:
        names, tests = matrix.check(args)
    except ValueError as e:
        raise bad_input("killmatrix", str(e)) from None
    check_backend("kernel")
    return matrix.run(args, names, tests, shlex.join(["gpujail", *args.argv]))


def expectations(args) -> int:
    try:
        text = expectations_file.load(args.report)
    except ValueError as e:
        raise bad_input("expectations", str(e)) from None
    sys.stdout.write(text)
    return EXIT["passed"]


def read_history(path: str) -> None:
    """A history is JSON lines, each an event with at least a time and a kind (gpujail/world/history.py)."""
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    event = json.loads(line)
                    if not isinstance(event, dict) or "kind" not in event or "t" not in event:
                        raise ValueError(f"line {n} is not an event (an object with 't' and 'kind')")
    except (OSError, UnicodeDecodeError) as e:
        raise bad_input("check", f"cannot read history {path}: {e}") from None
    except ValueError as e:
        raise bad_input("check", f"{path}: not a history: {e}") from None


def check(args) -> int:
    from gpujail.chaos import checker
    read_history(args.history)
    if args.final_state:
        try:
            if not isinstance(json.loads(Path(args.final_state).read_text()), dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            raise bad_input("check", f"final state {args.final_state}: {e}") from None
    if args.timeline and not Path(args.timeline).resolve().parent.is_dir():
        raise bad_input("check", f"--timeline {args.timeline}: no such directory {Path(args.timeline).parent}")
    code = checker.main([args.history, *([args.final_state] if args.final_state else []),
                         *(["--timeline", args.timeline] if args.timeline else [])])
    # The checker's own codes at this writing: 0 valid, 1 invalid, 2 undecided (which EXIT calls
    # inconclusive, 4: 2 is bad input here).
    return EXIT[{0: "passed", 1: "failed"}.get(code, "inconclusive")]


def explore(args) -> int:
    from gpujail.reference_impl.__main__ import IMPLEMENTATIONS
    from gpujail.reference_impl.mutants import MUTANTS
    command = f"explore {args.how}"
    mutant = args.impl.split(":", 1)[1] if args.impl.startswith("mutant:") else None
    if mutant is not None and mutant not in MUTANTS:
        raise bad_input(command, f"{args.impl!r}: unknown mutant; known: {', '.join(MUTANTS)}")
    if mutant is None and args.impl not in IMPLEMENTATIONS:
        raise bad_input(command, f"{args.impl!r}: the model backend runs {', '.join(IMPLEMENTATIONS)} or mutant:NAME "
                                 "(a command runs on the kernel and docker backends only)")
    if min(args.workers, getattr(args, "max_examples", 1), getattr(args, "jobs", 1)) < 1:
        raise bad_input(command, "--workers, --max-examples and --jobs must be at least 1")
    if getattr(args, "preemptions", 0) < 0:
        raise bad_input(command, "--preemptions must be 0 or more")
    from gpujail.chaos import explore as exploration
    if args.how == "replay":
        try:
            args.plan = exploration.parse_plan(args.plan)
        except (ValueError, AttributeError, TypeError) as e:   # TypeError, AttributeError: a field of the wrong type
            raise bad_input(command, f"the plan is not a JSON plan object: {e}") from None
    code = exploration.run(args)
    return EXIT[{0: "passed", 1: "failed"}[code]]


def bench(args) -> int:
    check_backend("kernel")
    return benchmarks.run(args)


COMMANDS = {"killmatrix": killmatrix, "expectations": expectations, "check": check, "explore": explore,
            "bench": bench}
