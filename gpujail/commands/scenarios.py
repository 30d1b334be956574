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
    from gpujail.chaos import runner
    if args.random:
        sc = sc.randomised()
    safe = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in args.impl)[:40]
    plan = getattr(args, "schedule", "free")
    scheduled = "" if plan == "free" else "-" + "".join(c if c.isalnum() or c in "-_.+" else "_" for c in plan)
    out = Path(args.out or f"reports/reproduce/{sc.name}-{safe}-seed{args.seed}{scheduled}")
    term = terminal()
    print(f"gpujail reproduce: scenario {sc.name} ({sc.mode}, {len(sc.workers)} workers) against {args.impl}, "
          f"seed {args.seed}" + (f", schedule {plan}" if scheduled else ""), file=term)
    tmp = scratch("reproduce")
    watch = HistoryWatch(lambda: [tmp / "run" / "history.jsonl"])

    def line() -> str:
        watch.poll()
        return f"{len(watch.ready)}/{len(sc.workers)} workers ready, {watch.faults} faults injected"

    progress = Progress(line, term, 1.0 if term.isatty() else 5.0)
    progress.start()
    try:
        result = runner.run(sc, args.impl, tmp / "run", seed=args.seed, scheduled=plan,
                            **(launched(args, len(sc.workers)) or jailed(args, sc)))
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
    result.run_dir = out
    print(result.report(), file=term)
    if clocks:
        print(f"launcher {args.launcher}: {clocks}", file=term)
    failed, undecided = result.judge()
    if getattr(args, "shrink", False):
        shrink(args, sc, result, out, term)
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
    jail = f"(jail on {sc.jail_fs}) " if sc.jail_fs else ""
    return f"{sc.name:<20} {sc.mode:<13} {', '.join(roles):<16} {jail}{first}{opt_in}"


def scenarios(args) -> int:
    from gpujail.chaos.scenario import DIR, JAILFS_DIR, names
    sources = args.files or names() + names(JAILFS_DIR)
    bad = 0
    for source in sources:
        try:
            print(one_line(load_scenario(source)))
        except Stop as e:
            print(f"gpujail: {e}", file=sys.stderr)
            bad += 1
    if not args.files:
        print(f"\n{len(sources)} scenarios in {DIR} (those of a network jail's faults in {JAILFS_DIR.name}/); each "
              "runs as written and with seeded random timing (`gpujail reproduce NAME [--random] --seed N`)")
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


def jailed(args, sc) -> dict:
    """`runner.run`'s fleet_class for a jail on a network file system (--jail-fs, or the scenario's
    own `jail_fs`), which also injects the scenario's network faults, else nothing."""
    if args.jail_fs == "local" and not sc.net_faults:
        return {}
    from gpujail.backends import jailfs_fleet, kernel
    return {"fleet_class": jailfs_fleet.fleet_class(kernel.Fleet, args.jail_fs, sc.net_faults)}


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


# -- shrinking a failing pct schedule (issue 29, item 4) ------------------------------------------

def shrink(args, sc, result, out: Path, term) -> None:
    """Delta-debug a failing `--schedule pct` run: drop PCT change points and the first start's
    faults (the scenario's schedule for this seed, one `NAME=TERM` of one worker each) one at a
    time while the run still fails (same seed, same priorities: `pct:...,changes=`), until none
    can go (1-minimal). Prints the minimal schedule and the racing pair of its violation; keeps its
    files in OUT/shrunk/ and `shrunk.json`."""
    import dataclasses
    import json

    from gpujail.chaos import runner
    from gpujail.chaos.scenario import Fault
    if not result.judge()[0]:
        print("shrink: the run did not fail; nothing to shrink", file=term)
        return
    plan = json.loads((out / "schedule.json").read_text()) if (out / "schedule.json").exists() else {}
    if not str(plan.get("strategy", "")).startswith("pct"):
        print("shrink: needs --schedule pct (the change points are what it shrinks)", file=term)
        return
    k = plan["k"]
    faults = [("fault", w, entry) for w, spec in sorted(sc.schedule(args.seed).items()) for entry in spec.split(";")]
    parts = [("change", c) for c in plan["changes"]] + faults
    kept_faults = [f for f in sc.faults if f.start != 1 or f.failpoint.startswith("syscall.")]
    runs = 0

    def attempt(subset: list) -> "runner.ChaosRun | None":
        nonlocal runs
        runs += 1
        changes = [p[1] for p in subset if p[0] == "change"]
        chosen = [Fault(p[1], *p[2].split("=", 1)) for p in subset if p[0] == "fault"]
        trial = dataclasses.replace(sc, mode="deterministic", fail_rate=0.0, faults=[*chosen, *kept_faults])
        tmp = scratch("shrink")
        try:
            r = runner.run(trial, args.impl, tmp / "run", seed=args.seed,
                           scheduled=f"pct:k={k},changes={'+'.join(map(str, changes))}"
                           + (",syscalls" if str(plan["strategy"]).endswith("syscalls") else ""))
            print(f"shrink: try {runs}: {len(changes)} change points, {len(chosen)} faults: "
                  f"{'fails' if r.judge()[0] else 'passes'}", file=term)
            if r.judge()[0]:
                r.keep(out / "shrunk")
                return r
            return None
        finally:
            remove_tree(tmp)

    best, current = result, list(parts)
    changed = True
    while changed:
        changed = False
        for part in list(current):
            r = attempt([p for p in current if p != part])
            if r is not None:
                current.remove(part)
                best, changed = r, True
    changes = [p[1] for p in current if p[0] == "change"]
    left = [f"{p[1]} {p[2]}" for p in current if p[0] == "fault"]
    (out / "shrunk.json").write_text(json.dumps({"seed": args.seed, "k": k, "changes": changes, "faults": left,
                                                 "runs": runs}, indent=1))
    print(f"shrunk in {runs} runs to {len(changes)} of {len(plan['changes'])} change points "
          f"({'+'.join(map(str, changes)) or 'none'}) and {len(left)} of {len(faults)} faults"
          + (f": {'; '.join(left)}" if left else ""), file=term)
    pair = racing_pair(best)
    if pair:
        print(f"racing pair: {pair}", file=term)


def racing_pair(result) -> str | None:
    """The two steps whose order makes the headline violation, in words: a CLI cleanup's unlink of a
    placeholder another worker had mounted over before it was probed (the seed bug's shape), with
    the scheduler's steps of both when the run was scheduled. None when the chain is not of that
    shape. The finding is chaos/checkers/queries.py's, which the timeline picture marks too."""
    from gpujail.chaos.checkers.queries import racing_pair as find
    from gpujail.world import history
    events = history.load(str(result.history_path if (result.run_dir / "history.jsonl").exists()
                              else (result.kept / "history.jsonl")))
    pair = find(events, result.verdict)
    return pair.words() if pair else None
