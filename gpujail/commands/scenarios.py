"""`gpujail reproduce`, `gpujail scenarios`, `gpujail failpoints`: for someone reproducing a race.

`reproduce` runs one scenario (chaos/runner.py) in a temporary directory with a progress line, then
prints the checker's verdict and causal chain and keeps the history, the final state and the
timeline picture in `--out` (default `reports/reproduce/<scenario>-<impl>-seed<N>/`). gpujail/cli.py
has loaded the scenario and checked the implementation and the backend before. Exit codes: 0 valid,
1 a violation, 4 inconclusive (an invariant undecided, or a declared fault window never opened); with
--launcher, 3 when the cluster cannot run the agents (a pod that cannot be scheduled) and 5 when an
agent failed.
"""
from __future__ import annotations

import sys
from pathlib import Path

from gpujail.commands import Stop, load_scenario, remove_tree, scratch, terminal
from gpujail.commands.progress import HistoryWatch, Progress
from gpujail.spec import EXIT


def reproduce(args, sc) -> int:
    from gpujail.chaos import runner, timeline
    from gpujail.world import history
    if args.random:
        sc = sc.randomised()
    safe = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in args.impl)[:40]
    out = Path(args.out or f"reports/reproduce/{sc.name}-{safe}-seed{args.seed}")
    term = terminal()
    print(f"gpujail reproduce: scenario {sc.name} ({sc.mode}, {len(sc.workers)} workers) against {args.impl}, "
          f"seed {args.seed}", file=term)
    tmp = scratch("reproduce")
    watch = HistoryWatch(lambda: [tmp / "run" / "history.jsonl"])

    def line() -> str:
        watch.poll()
        return f"{len(watch.ready)}/{len(sc.workers)} workers ready, {watch.faults} faults injected"

    progress = Progress(line, term, 1.0 if term.isatty() else 5.0)
    progress.start()
    try:
        result = runner.run(sc, args.impl, tmp / "run", seed=args.seed, **launched(args, len(sc.workers)))
        result.keep(out)
        clocks = keep_clocks(args, tmp / "run", out)
    except KeyboardInterrupt:
        raise Stop("interrupted", "interrupted; the run's nodes were stopped") from None
    except RuntimeError as e:   # the scenario could not be set up (warming, populate cleanup), or its launcher failed
        from gpujail.launchers.coordinator import outcome
        raise Stop(outcome(e), f"scenario {sc.name}: {e}") from None
    finally:
        progress.stop()
        done = f"done in {progress.elapsed()}: {line()}"
        remove_tree(tmp)
    print(done, file=term)
    if result.timeline is None:   # the runner draws only invalid runs; a reproducer wants every picture
        result.timeline = timeline.render(history.load(str(out / "history.jsonl")), result.verdict, out / "timeline.html")
    result.run_dir = out
    print(result.report(), file=term)
    if clocks:
        print(f"launcher {args.launcher}: {clocks}", file=term)
    failed, undecided = result.judge()
    expected = [i for i, r in result.verdict.results.items() if r.status == "UNKNOWN" and i not in undecided]
    if expected:   # the scenario declares them: say so, since the verdict line says UNKNOWN
        print(f"{', '.join(expected)} UNKNOWN as the scenario expects "
              + ("(its faults are not transient: nobody has to become ready)" if not sc.transient_only
                 else "(the implementation does not record its lock activity)"), file=term)
    if undecided:
        print(f"inconclusive: {', '.join(undecided)} could not be decided, and the scenario does not expect that",
              file=term)
    unopened = result.unopened()
    if unopened and not failed:   # every invariant held, but the run never exercised its fault
        print("inconclusive: " + "; ".join(f"fault window {w} never opened ({result.windows[w][1]})" for w in unopened)
              + ": the run proved nothing about its fault", file=term)
    return EXIT["failed" if failed else "inconclusive" if undecided or unopened else "passed"]


def one_line(sc) -> str:
    gpu = sum(1 for _, role, _ in sc.workers if role == "gpu-worker")
    roles = [f"{n} {what}" for n, what in ((gpu, "GPU"), (sc.cpu_workers, "CPU"), (sc.login_nodes, "login"))
             if n]
    text = " ".join(sc.description.split())
    first = text.split(". ")[0].rstrip(".")
    opt_in = " (opt-in: -m scale)" if sc.scale else ""
    return f"{sc.name:<20} {sc.mode:<13} {', '.join(roles):<16} {first}{opt_in}"


def scenarios(args) -> int:
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


def failpoints(args) -> int:
    from gpujail.world import failpoints as registry
    width = max(map(len, registry.REGISTRY))
    for name, where in registry.REGISTRY.items():
        print(f"{name:<{width}}  {where}")
    doc = registry.__doc__
    print("\n" + doc[doc.index("`GPUJAIL_FAILPOINTS="):doc.index("Every hit")].rstrip())
    return EXIT["passed"]


def launched(args, workers: int) -> dict:
    """`runner.run`'s fleet_class for --launcher (nodes made by node agents), else nothing."""
    if not getattr(args, "launcher", ""):
        return {}
    from gpujail import launchers
    from gpujail.commands.run import k8s_names
    return {"fleet_class": launchers.fleet_class(args.launcher, agents=workers, nodes=args.nodes,
                                                 partition=args.partition, account=args.account,
                                                 **{name: getattr(args, name.replace("-", "_")) for name in k8s_names()})}


def keep_clocks(args, run_dir: Path, out: Path) -> str:
    """--launcher: keep the agents' clocks at the rendezvous (clocks.json) beside the history, and
    say them in one line (gpujail/launchers/coordinator.py); else ''."""
    if not getattr(args, "launcher", "") or not (run_dir / "clocks.json").exists():
        return ""
    import json
    import shutil

    from gpujail.launchers.coordinator import clock_line
    shutil.copy(run_dir / "clocks.json", out / "clocks.json")
    return clock_line(json.loads((out / "clocks.json").read_text()))
