"""`gpujail run`: the conformance and chaos suites in this process, for a runtime vendor and a CI gate.

How this works
--------------
gpujail/cli.py has checked the implementation, the backend and the expectations file (the same
checks as the pytest plugin's, so a mistake is one line there rather than one per test). `run()`
then runs pytest in this process with the plugin's options, its output going to
`reports/pytest.log`. While it runs, a line shows tests done, workers ready and faults injected
(counted from the run's histories under its temporary directory) and the time elapsed. At the end
it prints the summary of `reports/summary.json` per requirement and per invariant
(gpujail/report.py) and the report paths, and returns the outcome as a code of EXIT. The reports
are staged beside the last run's and replace them only when the run ends (`publish`); a run stopped
by Ctrl-C, SIGTERM or SIGHUP prints its summary as INTERRUPTED, keeps its reports in
reports/interrupted/ and exits 128 + the signal.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from gpujail.commands import interrupted_code, remove_tree, scratch, sweep, terminal
from gpujail.commands.progress import HistoryWatch, Progress, TestCounter
from gpujail.spec import EXIT


def suites() -> list[str]:
    """The two suites where this gpujail is installed (a checkout's folders, or site-packages)."""
    import gpujail.chaos as chaos
    import gpujail.conformance as conformance
    return [str(Path(conformance.__file__).resolve().parent), str(Path(chaos.__file__).resolve().parent)]


def pytest_outcome(code: int, interrupted: bool, report: dict | None) -> str:
    """pytest's exit code (and the summary) as one of EXIT's outcomes."""
    if report is not None and report.get("unavailable"):   # the launcher's cluster cannot run the agents
        return "backend"                                    # (the plugin stopped the session: not Ctrl-C)
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
    if counts.get("failed") or counts.get("unexpected-pass"):
        return "failed"
    if counts.get("inconclusive"):   # a chaos run proved nothing and the expectations do not list it
        return "inconclusive"
    if code == 1:
        return "failed"
    ran = sum(n for s, n in counts.items() if s not in ("skipped", "expected-inconclusive"))
    return "passed" if ran else "inconclusive"


def run(args, expectations: str, pytest_args: list[str]) -> int:
    from gpujail import report as reporting
    reports = Path(args.reports)
    reports.mkdir(parents=True, exist_ok=True)
    sweep(reports)
    # This run's reports are written beside the last run's and replace them only when it ends; an
    # interrupted run's go to reports/interrupted/.
    stage = reports / f".gpujail-run-{os.getpid()}-reports"
    stage.mkdir()
    names = {"html": "report.html", "json": "summary.json", "junit": "junit.xml", "log": "pytest.log"}
    paths = {k: stage / name for k, name in names.items()}
    out = terminal()
    print(f"gpujail run: {args.impl} on the {args.backend} backend"
          + (f", jail on {args.jail_fs}" if args.jail_fs != "local" else "")
          + (f", CDI spec {args.cdi_spec}" if getattr(args, "cdi_spec", "") else "")
          + (f", chaos runs scheduled {args.schedule}" if getattr(args, "schedule", "free") != "free" else "")
          + (f", nodes made by agents of the {args.launcher} launcher" if getattr(args, "launcher", "") else "")
          + (f", expectations {expectations}" if expectations else ", no expectations file"), file=out)
    basetemp = scratch("run")
    argv = [*(args.tests or suites()), "-p", "no:cacheprovider", "-n", args.jobs, "--basetemp", str(basetemp),
            "--impl", args.impl, "--backend", args.backend, "--seed", str(args.seed), "--workers", str(args.workers),
            "--start-timeout", str(args.start_timeout), "--cli", args.cli, "--jail-fs", args.jail_fs,
            *(["--cdi-spec", os.path.abspath(args.cdi_spec)] if getattr(args, "cdi_spec", "") else []),
            *(["--schedule", args.schedule] if getattr(args, "schedule", "free") != "free" else []),
            "--expectations", expectations, "--gpujail-report", str(paths["json"]), "--junitxml", str(paths["junit"]),
            *(["-m", args.m] if args.m else []), *(["-k", args.k] if args.k else []),
            *[a for name in ("launcher", "nodes", "partition", "account") if getattr(args, name, "")
              for a in (f"--{name}", getattr(args, name))],
            *[a for name in k8s_flags(args) for a in (f"--{name}", getattr(args, name.replace("-", "_")))],
            *pytest_args]
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
    if counter.stopped_early and code == pytest.ExitCode.INTERRUPTED:
        code = pytest.ExitCode.TESTS_FAILED   # `-x`: judged by what ran, as pytest itself does without xdist
    outcome = pytest_outcome(code, counter.interrupted, summary)
    if summary:
        print("\n" + reporting.text(summary), file=out)
    if outcome == "error" and progress:
        tail = paths["log"].read_text().splitlines()[-15:]
        print("\nthe end of the pytest log:\n" + "\n".join("  " + ln for ln in tail), file=out)
    final = publish(stage, reports, outcome == "interrupted", [*names.values(), reporting.CHAOS_DIR])
    exit_code = interrupted_code() if outcome == "interrupted" else EXIT[outcome]
    if outcome == "backend":   # one line on stderr, as when the backend is not there at all
        print(f"gpujail: {summary['unavailable']}", file=sys.stderr)
    print(f"\n{outcome.upper()} (exit {exit_code})", file=out)
    print("reports: " + "  ".join(str(final / n) for n in names.values() if (final / n).exists()), file=out)
    return exit_code


def k8s_names() -> list[str]:
    from gpujail.launchers.kubernetes import SETTINGS
    return [name for name, *_ in SETTINGS]


def k8s_flags(args) -> list[str]:
    """The --k8s-* flags given, passed on to the plugin with --launcher kubernetes."""
    return [name for name in k8s_names() if getattr(args, name.replace("-", "_"), "")]


def k8s_settings(args):
    """The --k8s-* flags, checked (`Stop` with one line when one is wrong)."""
    from gpujail.commands import Stop
    from gpujail.launchers import kubernetes
    try:
        return kubernetes.Settings.parse({name: getattr(args, name.replace("-", "_")) for name in k8s_names()})
    except kubernetes.BadSetting as e:
        raise Stop("bad-input", str(e)) from None


def render(args) -> int:
    """`gpujail run --launcher kubernetes --render DIR`: the Job each fleet of the run applies, written
    for review (`kubectl apply --dry-run=server -f DIR`), nothing applied. Its run directory is an
    example: each fleet has its own under --k8s-mount, and a Job of its own."""
    from gpujail import options
    from gpujail.commands import Stop
    from gpujail.launchers import kubernetes
    if args.launcher != "kubernetes":
        raise Stop("bad-input", f"--render {args.render}: only with --launcher kubernetes")
    settings = k8s_settings(args)
    try:
        if options.check_count(options.flag("workers", args.workers)) < 1:
            raise options.BadInput(f"--workers {args.workers}: expected at least 1 (one agent, one pod per worker)")
        job = kubernetes.render(settings, f"{settings.mount.rstrip('/')}/runs/example", int(args.workers))
        valid = kubernetes.validate(job)
        path = kubernetes.write(job, args.render)
    except (kubernetes.BadSetting, options.BadInput) as e:
        raise Stop("bad-input", str(e)) from None
    except OSError as e:
        raise Stop("bad-input", f"--render {args.render}: cannot write there: {e.strerror}") from None
    print(f"wrote {path}: an Indexed Job of {args.workers} agents, one pod per node, {valid}; not applied "
          f"(gpujail run --launcher kubernetes applies one per fleet and deletes it)", file=terminal())
    return EXIT["passed"]


def publish(stage: Path, reports: Path, interrupted: bool, names: list[str]) -> Path:
    """Move a run's staged reports into place: over the last run's in `reports/` when the run
    ended, into `reports/interrupted/` (the last run's left as they were) when it was stopped."""
    final = reports / "interrupted" if interrupted else reports
    if interrupted:
        remove_tree(final)
        stage.rename(final)
        return final
    for name in names:
        old = final / name
        if old.is_dir():
            remove_tree(old)
        elif old.exists():
            old.unlink()
        if (stage / name).exists():
            (stage / name).rename(old)
    remove_tree(stage)
    return final
