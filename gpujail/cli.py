"""The `gpujail` command: the suites for a runtime vendor and a CI gate, one scenario for someone
reproducing a race.

How this works
--------------
    gpujail run [--impl NAME|COMMAND] [--backend B] [--expectations FILE] [TEST ...] [-- PYTEST-ARGS]
    gpujail reproduce SCENARIO [--impl NAME|COMMAND] [--seed N] [--random] [--out DIR]
    gpujail scenarios [FILE ...]
    gpujail failpoints

`run` checks its input first (the implementation, the backend, the expectations file: the same
checks as the pytest plugin's, so a mistake is one line here rather than one per test), then runs
pytest in this process with the plugin's options, its output going to `reports/pytest.log`. While
it runs, a line shows tests done, workers ready and faults injected (counted from the run's
histories under its temporary directory) and the time elapsed. At the end it prints the summary of
`reports/summary.json` per requirement and per invariant (conformance/report.py) and the report
paths. The expectations file of a bundled implementation (`expectations/<name>.toml`) is used
unless another is given.

`reproduce` runs one scenario (chaos/runner.py) in a temporary directory with a progress line, then
prints the checker's verdict and causal chain and keeps the history, the final state and the
timeline picture in `--out` (default `reports/reproduce/<scenario>-<impl>-seed<N>/`).

Exit codes (`EXIT`), for a CI gate: 0 passed (every test passed or failed as its expectations say;
`reproduce`: the run is valid), 1 failed (a test failed, an expected failure passed, an invariant
was violated), 2 bad input (one line on stderr), 3 backend not available here, 4 inconclusive (no
test ran, everything skipped, or an invariant could not be decided), 5 harness error, 130
interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gpujail.spec import EXIT


class Stop(Exception):
    """One line for the user and the exit code that goes with it."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.code = EXIT[outcome]


# -- input checks (the plugin's own, turned into one line and an exit code) ----------------------

def check_impl(impl: str) -> None:
    from gpujail.plugin import check_impl as plugin_check
    try:
        plugin_check(impl)
    except pytest.UsageError as e:
        raise Stop("bad-input", str(e)) from None


def check_backend(name: str) -> None:
    from gpujail import backends
    if name not in backends.NAMES:
        raise Stop("bad-input", f"--backend {name!r}: expected one of {', '.join(backends.NAMES)}")
    reason = backends.unavailable(name)
    if reason:
        raise Stop("backend", f"--backend {name}: {reason}")


def expectations_for(impl: str, given: str | None) -> str:
    """The expectations file to use: the one given ('' for none), else a bundled implementation's own."""
    from gpujail import expectations
    from gpujail.contract import BUNDLED
    from gpujail.plugin import load_expectations
    if given is None:
        own = Path(expectations.__file__).parent / f"{impl}.toml"
        given = str(own) if impl in BUNDLED and own.exists() else ""
    try:
        load_expectations(given)
    except pytest.UsageError as e:
        raise Stop("bad-input", str(e)) from None
    return given


def load_scenario(source: str):
    from gpujail.chaos.scenario import ScenarioError, load
    try:
        return load(source)
    except ScenarioError as e:
        raise Stop("bad-input", str(e)) from None


# -- progress ----------------------------------------------------------------------------------

class HistoryWatch:
    """Counts, as they are appended, the workers that became ready and the faults that acted
    (failpoints that fired with an action other than `off`, and the harness's kills) in the
    histories that `paths()` lists. Reads only what was added since the last poll."""

    def __init__(self, paths):
        self.paths, self.offsets = paths, {}
        self.ready: set[tuple[str, str]] = set()
        self.faults = 0

    def poll(self) -> None:
        for path in self.paths():
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            complete = data[:data.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                if b'"kind":"worker.ready"' in line:
                    self.ready.add((str(path), json.loads(line).get("node")))
                elif b'"kind":"chaos.kill"' in line or (b'"kind":"failpoint"' in line and b'"action":"off"' not in line):
                    self.faults += 1


class Progress(threading.Thread):
    """A status line every `every` seconds (rewritten in place on a terminal) until `stop()`."""

    def __init__(self, line, out, every: float):
        super().__init__(daemon=True)
        self.line, self.out, self.every = line, out, every
        self.started, self.done = time.monotonic(), threading.Event()
        self.tty = out.isatty()

    def elapsed(self) -> str:
        s = int(time.monotonic() - self.started)
        return f"{s // 60}:{s % 60:02d}"

    def run(self) -> None:
        while not self.done.wait(self.every):
            text = f"[{self.elapsed()}] {self.line()}"
            self.out.write(f"\r{text}\x1b[K" if self.tty else text + "\n")
            self.out.flush()

    def stop(self) -> None:
        self.done.set()
        self.join()
        if self.tty:
            self.out.write("\r\x1b[K")
            self.out.flush()


class TestCounter:
    """A pytest plugin counting tests done and failed (in the xdist controller: every worker's)."""

    def __init__(self):
        self.total, self.done, self.failed, self.interrupted = None, 0, 0, False

    def pytest_collection_finish(self, session):
        if session.items:
            self.total = len(session.items)

    def pytest_keyboard_interrupt(self, excinfo):
        self.interrupted = True

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.total = len(ids)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.done += 1
            self.failed += report.failed


_terminal = None


def terminal():
    """The real standard output, even while pytest captures file descriptor 1 or we redirect sys.stdout."""
    global _terminal
    if _terminal is None:
        _terminal = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    return _terminal


def remove_tree(path: Path) -> None:
    """Remove a run's temporary tree, making a directory a test left read-only writable again (its
    parent only: rmtree does not follow symlinks, so nothing outside the tree is touched)."""
    def writable(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o755)
        func(p)
    try:
        shutil.rmtree(path, **({"onexc": writable} if sys.version_info >= (3, 12) else {"onerror": writable}))
    except OSError as e:
        print(f"gpujail: could not remove the temporary directory {path}: {e}", file=sys.stderr)


# -- run ---------------------------------------------------------------------------------------

def suites() -> list[str]:
    import gpujail.chaos as chaos
    import gpujail.conformance as conformance
    return [str(Path(conformance.__file__).parent), str(Path(chaos.__file__).parent)]


def pytest_outcome(code: int, interrupted: bool, report: dict | None) -> str:
    """pytest's exit code (and the summary) as one of EXIT's outcomes."""
    if interrupted:
        return "interrupted"
    if code == 4:          # usage error (pytest printed the line)
        return "bad-input"
    if code == 5:          # no test collected
        return "inconclusive"
    if code in (2, 3) or report is None:   # collection error, internal error
        return "error"
    from gpujail.report import totals
    counts = totals(report)
    if code == 1 or counts.get("failed") or counts.get("unexpected-pass"):
        return "failed"
    ran = sum(n for s, n in counts.items() if s != "skipped")
    return "passed" if ran else "inconclusive"


def cmd_run(args, pytest_args: list[str]) -> int:
    from gpujail import report as reporting
    check_impl(args.impl)
    check_backend(args.backend)
    expectations = expectations_for(args.impl, args.expectations)
    reports = Path(args.reports)
    reports.mkdir(parents=True, exist_ok=True)
    paths = {"html": reports / "report.html", "json": reports / "summary.json", "junit": reports / "junit.xml",
             "log": reports / "pytest.log"}
    for stale in list(paths.values()) + [reports / reporting.CHAOS_DIR]:
        if stale.is_dir():
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    out = terminal()
    print(f"gpujail run: {args.impl} on the {args.backend} backend"
          + (f", expectations {expectations}" if expectations else ", no expectations file"), file=out)
    basetemp = Path(tempfile.mkdtemp(prefix="gpujail-run-"))
    argv = [*(args.tests or suites()), "-p", "no:cacheprovider", "-n", args.jobs, "--basetemp", str(basetemp),
            "--impl", args.impl, "--backend", args.backend, "--seed", str(args.seed), "--workers", str(args.workers),
            "--expectations", expectations, "--gpujail-report", str(paths["json"]), "--junitxml", str(paths["junit"]),
            *(["-m", args.m] if args.m else []), *(["-k", args.k] if args.k else []), *pytest_args]
    counter = TestCounter()
    watch = HistoryWatch(lambda: [*basetemp.glob("*/*/run/history.jsonl"), *basetemp.glob("*/run/history.jsonl")])

    def line() -> str:
        watch.poll()
        total = f"/{counter.total}" if counter.total is not None else ""
        failed = f" ({counter.failed} failed)" if counter.failed else ""
        return (f"{counter.done}{total} tests done{failed}, {len(watch.ready)} workers ready, "
                f"{watch.faults} faults injected")

    progress = None if args.verbose else Progress(line, out, 2.0 if out.isatty() else 15.0)
    log = open(paths["log"], "w", buffering=1)
    saved = sys.stdout
    try:
        if progress:
            sys.stdout = log
            progress.start()
        code = int(pytest.main(argv, plugins=[counter]))
    except KeyboardInterrupt:
        code, counter.interrupted = 2, True
    finally:
        sys.stdout = saved
        if progress:
            progress.stop()
            print(f"done in {progress.elapsed()}: {line()}", file=out)
        log.close()
        remove_tree(basetemp)   # what the tests left (jails, histories); failing chaos runs' are in reports/
    summary = json.loads(paths["json"].read_text()) if paths["json"].exists() else None
    outcome = pytest_outcome(code, counter.interrupted, summary)
    if summary:
        print("\n" + reporting.text(summary), file=out)
    if outcome == "error" and progress:
        tail = paths["log"].read_text().splitlines()[-15:]
        print("\nthe end of the pytest log:\n" + "\n".join("  " + ln for ln in tail), file=out)
    print(f"\n{outcome.upper()} (exit {EXIT[outcome]})", file=out)
    print("reports: " + "  ".join(str(p) for p in paths.values() if p.exists()), file=out)
    return EXIT[outcome]


# -- reproduce ---------------------------------------------------------------------------------

def cmd_reproduce(args) -> int:
    from gpujail.chaos import runner, timeline
    from gpujail.world import history
    sc = load_scenario(args.scenario)
    check_impl(args.impl)
    check_backend("kernel")   # the chaos runner's backend
    if args.random:
        sc = sc.randomised()
    safe = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in args.impl)[:40]
    out = Path(args.out or f"reports/reproduce/{sc.name}-{safe}-seed{args.seed}")
    term = terminal()
    print(f"gpujail reproduce: scenario {sc.name} ({sc.mode}, {len(sc.workers)} workers) against {args.impl}, "
          f"seed {args.seed}", file=term)
    tmp = Path(tempfile.mkdtemp(prefix="gpujail-reproduce-"))
    watch = HistoryWatch(lambda: [tmp / "run" / "history.jsonl"])

    def line() -> str:
        watch.poll()
        return f"{len(watch.ready)}/{len(sc.workers)} workers ready, {watch.faults} faults injected"

    progress = Progress(line, term, 1.0 if term.isatty() else 5.0)
    progress.start()
    try:
        result = runner.run(sc, args.impl, tmp / "run", seed=args.seed)
        result.keep(out)
    except KeyboardInterrupt:
        raise Stop("interrupted", "interrupted; the run's nodes were stopped") from None
    except RuntimeError as e:   # the scenario could not be set up (warming, populate cleanup)
        raise Stop("error", f"scenario {sc.name}: {e}") from None
    finally:
        progress.stop()
        done = f"done in {progress.elapsed()}: {line()}"
        remove_tree(tmp)
    print(done, file=term)
    if result.timeline is None:   # the runner draws only invalid runs; a reproducer wants every picture
        result.timeline = timeline.render(history.load(str(out / "history.jsonl")), result.verdict, out / "timeline.html")
    result.run_dir = out
    print(result.report(), file=term)
    failed, undecided = result.judge()
    return EXIT["failed" if failed else "inconclusive" if undecided else "passed"]


# -- scenarios, failpoints ---------------------------------------------------------------------

def one_line(sc) -> str:
    roles = [f"{n} {what}" for n, what in ((sc.gpu_workers, "GPU"), (sc.cpu_workers, "CPU"), (sc.login_nodes, "login"))
             if n]
    text = " ".join(sc.description.split())
    first = text.split(". ")[0].rstrip(".")
    opt_in = " (opt-in: -m scale)" if sc.scale else ""
    return f"{sc.name:<20} {sc.mode:<13} {', '.join(roles):<16} {first}{opt_in}"


def cmd_scenarios(args) -> int:
    from gpujail.chaos.scenario import DIR, names
    sources = args.files or names()
    bad = 0
    for source in sources:
        try:
            print(one_line(load_scenario(source)))
        except Stop as e:
            print(f"gpujail: {e}", file=sys.stderr)
            bad += 1
    if not args.files:
        print(f"\n{len(sources)} scenarios in {DIR}; each runs as written and with seeded random timing "
              "(`gpujail reproduce NAME [--random] --seed N`)")
    return EXIT["bad-input"] if bad else EXIT["passed"]


def cmd_failpoints(args) -> int:
    from gpujail.world import failpoints
    width = max(map(len, failpoints.REGISTRY))
    for name, where in failpoints.REGISTRY.items():
        print(f"{name:<{width}}  {where}")
    doc = failpoints.__doc__
    print("\n" + doc[doc.index("`GPUJAIL_FAILPOINTS="):doc.index("Every hit")].rstrip())
    return EXIT["passed"]


# -- the command line --------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Stop("bad-input", f"{self.prog}: {message} (see {self.prog} --help)")


def parser() -> Parser:
    from gpujail.plugin import OPTIONS
    help_of = {name: help_ for name, _, _, help_ in OPTIONS}
    # The plugin's environment variables are the defaults here too (GPUJAIL_IMPL, ...).
    env = {name: os.environ.get(var, default) for name, var, default, _ in OPTIONS}
    top = Parser(prog="gpujail", description=__doc__.split("\n\n")[0],
                 epilog="exit codes: " + ", ".join(f"{c} {o}" for o, c in EXIT.items()))
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run the conformance and chaos suites against an implementation",
                         description="Run the conformance and chaos suites; arguments after `--` go to pytest.")
    run.add_argument("tests", nargs="*", help="test paths or node ids (default: both suites)")
    run.add_argument("--impl", default=env["impl"], help=help_of["impl"])
    run.add_argument("--backend", default=env["backend"], help=help_of["backend"])
    run.add_argument("--expectations", default=env["expectations"] or None,
                     help=help_of["expectations"] + "; default: expectations/<impl>.toml for a bundled one, '' for none")
    run.add_argument("--seed", type=int, default=env["seed"], help=help_of["seed"])
    run.add_argument("--workers", type=int, default=env["workers"], help=help_of["workers"])
    run.add_argument("--reports", default="reports", help="directory for the reports (default: reports)")
    run.add_argument("-n", "--jobs", default="auto", help="pytest-xdist processes (default: auto)")
    run.add_argument("-m", help="pytest marker expression, e.g. scale for the 128-worker run")
    run.add_argument("-k", help="pytest keyword expression")
    run.add_argument("-v", "--verbose", action="store_true", help="show pytest's output instead of a progress line")

    rep = sub.add_parser("reproduce", help="run one chaos scenario and show its verdict, chain and timeline")
    rep.add_argument("scenario", help="a name from `gpujail scenarios`, or a scenario TOML file")
    rep.add_argument("--impl", default="reference", help=help_of["impl"])
    rep.add_argument("--seed", type=int, default=0, help="the schedule's seed (a failing test prints it)")
    rep.add_argument("--random", action="store_true", help="add the seeded random timing (the '-random-seed+N' tests)")
    rep.add_argument("--out", help="where to keep history, final state and timeline")

    sc = sub.add_parser("scenarios", help="list the chaos scenarios, one line each (or check scenario files)")
    sc.add_argument("files", nargs="*", help="scenario TOML files to check and describe instead")
    sub.add_parser("failpoints", help="list the failpoints and the GPUJAIL_FAILPOINTS term syntax")
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    try:
        args = parser().parse_args(argv)
        if pytest_args and args.command != "run":
            raise Stop("bad-input", f"gpujail {args.command}: no pytest arguments expected after '--'")
        if args.command == "run":
            return cmd_run(args, pytest_args)
        return {"reproduce": cmd_reproduce, "scenarios": cmd_scenarios, "failpoints": cmd_failpoints}[args.command](args)
    except Stop as e:
        print(f"gpujail: {e}" if not str(e).startswith("gpujail") else str(e), file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("gpujail: interrupted", file=sys.stderr)
        return EXIT["interrupted"]
    except BrokenPipeError:   # the reader went away (`gpujail ... | head`): stop quietly, like a shell tool
        devnull = os.open(os.devnull, os.O_WRONLY)
        for f in (sys.stdout, _terminal):
            if f is not None:
                os.dup2(devnull, f.fileno())
        return 128 + 13   # as if killed by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
