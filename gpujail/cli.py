"""The `gpujail` command: the one front door to the suites, for a runtime vendor, a CI gate and
someone reproducing a race, and to the project's tools.

How this works
--------------
    gpujail run [--impl NAME|COMMAND] [--backend B] [--expectations FILE] [--cdi-spec FILE] [TEST ...] [-- PYTEST-ARGS]
    gpujail reproduce SCENARIO [--impl NAME|COMMAND] [--seed N] [--random] [--out DIR] [--cdi-spec FILE] [--schedule S]
                      [--start-timeout S] [--cli VARIANT] [--jail-fs KIND]
    gpujail scenarios [FILE ...]
    gpujail failpoints
    gpujail killmatrix [--template] [--mutants A,B] [--tests PATHS] [--quick]
    gpujail expectations SUMMARY.json
    gpujail check HISTORY.jsonl [FINAL_STATE.json] [--timeline OUT.html]
    gpujail explore find|bounded|replay IMPL ...
    gpujail bench [--quick] [--only FIGURE ...]
    gpujail qualify PATH [--timeout SECONDS]      (on two nodes sharing PATH)
    gpujail node --run-dir DIR [--index I]       (the node agent a launcher starts: --launcher)

This module parses the command line and checks the input a subcommand depends on (the
implementation, the backend, the expectations file: the same checks as the pytest plugin's, so a
mistake is one line here rather than one per test); the work is done in gpujail/commands/ (`run`
in run.py, `reproduce`, `scenarios` and `failpoints` in scenarios.py, the tools in tools.py). The
expectations file of a bundled implementation (`expectations/<name>.toml`) is used unless another
is given. The `python -m` forms of the tools (`python -m gpujail.conformance.killmatrix`, ...) are
aliases.

Exit codes (`EXIT`, gpujail/spec.py), for a CI gate: 0 passed (every test passed or failed as its
expectations say; `reproduce`, `check`: the run is valid; `killmatrix`: every mutant killed;
`explore find`: nothing found), 1 failed (a test failed, an expected failure passed, an invariant
was violated, a mutant survived), 2 bad input (one line on stderr), 3 backend not available here, 4
inconclusive (no test ran, everything skipped, or an invariant could not be decided), 5 harness
error, 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from gpujail import options, spec
from gpujail.commands import (
    Stop,
    check_backend,
    interrupted_code,
    load_scenario,
    qualify,
    scenarios,
    silence_outputs,
    tools,
)
from gpujail.commands import node as agent
from gpujail.commands import run as running
from gpujail.plugin import stop_on_signals
from gpujail.spec import EXIT

# -- input checks (gpujail/options.py, the plugin's too, turned into one line and an exit code) -----

def require_impl(impl: str) -> None:
    try:
        options.check_impl(options.flag("impl", impl))
    except options.BadInput as e:
        raise Stop("bad-input", str(e)) from None


def expectations_for(impl: str, given: str | None) -> str:
    """The expectations file to use: the one given ('' for none), else a bundled implementation's own."""
    from gpujail import expectations
    from gpujail.contract import BUNDLED
    if given is None:
        own = Path(expectations.__file__).parent / f"{impl}.toml"
        given = str(own) if impl in BUNDLED and own.exists() else ""
    try:
        options.load_expectations(options.flag("expectations", given))
    except options.BadInput as e:
        raise Stop("bad-input", str(e)) from None
    return given


def check_jail_fs(kind: str, backend: str) -> None:
    """--jail-fs: a known kind on a backend that can mount it (exit 2), that this host can provide (exit 3)."""
    from gpujail.backends import jailfs
    try:
        options.check_jail_fs(options.flag("jail-fs", kind), options.flag("backend", backend))
    except options.BadInput as e:
        raise Stop("bad-input", str(e)) from None
    reason = jailfs.unavailable(kind)
    if reason:
        raise Stop("backend", f"--jail-fs {kind}: {reason}")
def check_launcher(args) -> None:
    """--launcher (with --nodes): a known name, and usable from here (exit 3 when not: no Slurm)."""
    from gpujail import launchers
    if not args.launcher:
        return
    if args.launcher == "kubernetes":   # bad input before asking for a cluster
        running.k8s_settings(args)
    try:
        options.check_launcher(options.flag("launcher", args.launcher))
        if args.nodes:
            options.check_count(options.flag("nodes", args.nodes))
    except options.BadInput as e:
        raise Stop("bad-input", str(e)) from None
    reason = launchers.unavailable(args.launcher)
    if reason:
        raise Stop("backend", f"--launcher {args.launcher}: {reason}")


LAUNCHER_FLAGS = ("launcher", "nodes", "partition", "account", *running.k8s_names())


def add_options(p, names, env: dict, more: dict | None = None) -> None:
    """`names`' flags, generated from the option table (gpujail/options.py): the same help, metavar and
    choices as the plugin's, and the environment's value as the default, as the plugin takes it. A bad
    value is one line naming the flag either way: from argparse for --cli's choices and --seed's number
    (`reproduce` schedules with it directly), from the table's validators, when the command runs, for
    the rest."""
    from gpujail.options import BY_NAME
    for name in names:
        o = BY_NAME[name]
        p.add_argument(f"--{name}", default=env[name], metavar=o.metavar, choices=o.choices,
                       type=int if name == "seed" else None, help=o.help + (more or {}).get(name, ""))


# -- the subcommands that need these checks --------------------------------------------------

def cmd_run(args, pytest_args: list[str]) -> int:
    if args.render:   # the manifests only: no suite runs, no cluster is asked
        return running.render(args)
    require_impl(args.impl)
    check_backend(args.backend)
    check_jail_fs(args.jail_fs, args.backend)
    check_launcher(args)
    try:
        options.check_workers(options.flag("workers", args.workers))
        options.check_seconds(options.flag("start-timeout", args.start_timeout))
        options.real_cli(options.flag("cli", args.cli))
        options.check_cdi_spec(options.flag("cdi-spec", args.cdi_spec), options.flag("backend", args.backend),
                               options.flag("launcher", args.launcher or ""))
        args.schedule = options.check_schedule(options.flag("schedule", args.schedule),
                                               options.flag("backend", args.backend),
                                               options.flag("launcher", args.launcher or ""))
    except options.CliUnavailable as e:   # a host without the real CLI cannot run that backend
        raise Stop("backend", str(e)) from None
    except options.BadInput as e:
        raise Stop("bad-input", str(e)) from None
    return running.run(args, expectations_for(args.impl, args.expectations), pytest_args)


def cmd_reproduce(args) -> int:
    try:
        sc = load_scenario(args.scenario).with_workers(options.check_workers(options.flag("workers", args.workers)))
        args.schedule = options.check_schedule(options.flag("schedule", args.schedule),
                                               options.flag("backend", "kernel"),
                                               options.flag("launcher", args.launcher or ""))
    except options.BadInput as e:
        raise Stop("bad-input", str(e)) from None
    require_impl(args.impl)
    # the jail's file system: the scenario's own (a network fault's scenario pins it), else --jail-fs
    args.jail_fs = sc.jail_fs or args.jail_fs
    if args.launcher and args.jail_fs != "local":
        raise Stop("bad-input", f"scenario {sc.name}: a jail on {args.jail_fs} is mounted by this host's own nodes, "
                                f"not by --launcher {args.launcher}'s agents")
    check_backend("kernel")   # the chaos runner's backend
    check_launcher(args)
    check_jail_fs(args.jail_fs, "kernel")
    given = {name: options.flag(name, getattr(args, name.replace("-", "_"))) for name in ("start-timeout", "cli", "cdi-spec")}
    try:
        run = options.settings({**given, "backend": options.flag("backend", "kernel"),
                                "launcher": options.flag("launcher", args.launcher or "")})
    except options.CliUnavailable as e:
        raise Stop("backend", str(e)) from None
    except options.BadInput as e:
        raise Stop("bad-input", str(e)) from None
    spec.use(run)   # for the runner's nodes and probes, in this process
    return scenarios.reproduce(args, sc)


# -- the command line --------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Stop("bad-input", f"{self.prog}: {message} (see {self.prog} --help)")


def parser() -> Parser:
    from gpujail.options import OPTIONS
    # The plugin's environment variables are the defaults here too (GPUJAIL_IMPL, ...).
    env = {name: os.environ.get(var, default) for name, var, default, _ in OPTIONS}
    top = Parser(prog="gpujail", description=__doc__.split("\n\n")[0],
                 epilog="exit codes: " + ", ".join(f"{c} {o}" for o, c in EXIT.items()))
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run the conformance and chaos suites against an implementation",
                         description="Run the conformance and chaos suites; arguments after `--` go to pytest.")
    run.add_argument("tests", nargs="*", help="test paths or node ids (default: both suites)")
    add_options(run, ("impl", "backend", "expectations", "seed", "workers", "start-timeout", "jail-fs", "cli",
                      "cdi-spec", "schedule"), env,
                more={"expectations": "; default: expectations/<impl>.toml for a bundled one, '' for none"})
    run.set_defaults(expectations=env["expectations"] or None)
    run.add_argument("--reports", default="reports", help="directory for the reports (default: reports)")
    run.add_argument("-n", "--jobs", default="auto", help="pytest-xdist processes (default: auto)")
    run.add_argument("-m", help="pytest marker expression, e.g. scale for the 128-worker run")
    run.add_argument("-k", help="pytest keyword expression")
    run.add_argument("-v", "--verbose", action="store_true", help="show pytest's output instead of a progress line")
    add_options(run, LAUNCHER_FLAGS, env)
    run.add_argument("--render", metavar="DIR", help="--launcher kubernetes: write the Job to DIR/job.json, apply nothing")

    rep = sub.add_parser("reproduce", help="run one chaos scenario and show its verdict, chain and timeline")
    rep.add_argument("scenario", help="a name from `gpujail scenarios`, or a scenario TOML file")
    add_options(rep, ("impl", "seed", "workers", "cdi-spec", "start-timeout", "cli", "schedule", "jail-fs"), env,
                more={"seed": " (a failing test prints it)",
                      "schedule": "; the same seed and schedule replay the same decisions"})
    rep.add_argument("--random", action="store_true", help="add the seeded random timing (the '-random-seed+N' tests)")
    rep.add_argument("--out", help="where to keep history, final state and timeline")
    rep.add_argument("--shrink", action="store_true",
                     help="with --schedule pct, when the run fails: drop change points and faults while it still "
                          "fails, print the minimal schedule and the racing pair (docs/scheduler.md)")
    add_options(rep, LAUNCHER_FLAGS, env)

    sc = sub.add_parser("scenarios", help="list the chaos scenarios, one line each (or check scenario files)")
    sc.add_argument("files", nargs="*", help="scenario TOML files to check and describe instead")
    sub.add_parser("failpoints", help="list the failpoints and the GPUJAIL_FAILPOINTS term syntax")
    tools.add_parsers(sub)
    qualify.add_parser(sub)
    agent.add_parser(sub)
    return top


COMMANDS = {"reproduce": cmd_reproduce, "scenarios": scenarios.scenarios, "failpoints": scenarios.failpoints,
            **tools.COMMANDS, "qualify": qualify.qualify, "node": agent.node}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    stop_on_signals()
    try:
        args = parser().parse_args(argv)
        args.argv = argv
        if pytest_args and args.command != "run":
            raise Stop("bad-input", f"gpujail {args.command}: no pytest arguments expected after '--'")
        if args.command == "run":
            return cmd_run(args, pytest_args)
        return COMMANDS[args.command](args)
    except Stop as e:
        print(f"gpujail: {e}" if not str(e).startswith("gpujail") else str(e), file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("gpujail: interrupted", file=sys.stderr)
        return interrupted_code()
    except BrokenPipeError:   # the reader went away (`gpujail ... | head`): stop quietly, like a shell tool
        silence_outputs()
        return 128 + 13   # as if killed by SIGPIPE
    except Exception:      # a bug here, not a failed run: a CI gate must not read it as exit 1
        traceback.print_exc()
        print(f"gpujail: internal error (exit {EXIT['error']}); the traceback above is for a bug report", file=sys.stderr)
        return EXIT["error"]


if __name__ == "__main__":
    sys.exit(main())
