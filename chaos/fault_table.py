"""The fault space as a table, one chaos case per cell: who fails (its role then), at which step,
with the neighbours in which state.

How this works
--------------
A failure hurts someone only through the other workers' mounts, so what decides it is (SPEC
section 7, issue 30): the failing worker's role at that moment (chaos/checkers/cells.py: `creator`
of the placeholders, `warm` start, `restarting` after a failed start), the step it fails at (a CLI
failpoint, an implementation step, or SIGKILL), and whether the neighbours are `none`, `some` or
`all` ready. `cases()` builds one Scenario per cell, three GPU workers, w0 the one that fails:

* creator: a cold jail; w1 and w2 are started by the harness only once w0 has paused at barrier
  `creator`, placed after its placeholders (at its first mount);
* warm: the jail warmed first, everyone starts at once; restarting: as warm, but w0's first start
  fails at once (`cli.before_list`) and its restart carries the fault;
* the step: w0 fails at its 5th hit of a per-file step (`4*off->1*wait(late)->return(EIO)`) or its
  one hit of a once-per-run step (`1*wait(late)->return(EIO)`), only after barrier `late`; a kill
  is SIGKILL at the 5th `cli.after_mount`, once everyone else is ready or paused;
* the neighbours: `all` ready when `late` opens (they finished), `some` (w2 paused at barrier
  `hold` in its third mount, w1 ready) or `none` (both paused there, with live mounts). `hold` opens
  only after `late` (the barrier keeper opens the first of the scenario's barriers when everyone is
  paused), so w0 fails while they are still paused.

Each case declares the window `cell`: a run that did not exercise its cell is INCONCLUSIVE. A case
whose forcing faults did not all act (an implementation that never reaches that step: `direct` has
no CLI, and a CLI-based one never reaches `ref.before_mount`)
is *unreachable* for that implementation, reported as such: only a failure that happened can be
judged. The `waiter` role (took the lock after waiting for it) has no black-box point to hold a
worker inside flock, so it is counted where runs meet it (cells.exercised), not generated.
"""
from __future__ import annotations

from gpujail.chaos.checkers.cells import NEIGHBOURS, PREFIX, cell_id
from gpujail.chaos.scenario import Fault, Kill, Scenario

ROLES = ("creator", "warm", "restarting")
PER_FILE = ("cli.before_mount", "cli.after_mount", "cli.after_remount", "ref.before_mount")
# (cli.after_list is not one: `list`, which runs first, hits it too, before any placeholder exists.)
ONCE = ("cli.before_ldconfig", "cli.before_exit", "ref.before_verify")
STEPS = (*PER_FILE, *ONCE, "kill")
DIRECT = ("ref.before_mount",)   # `direct`'s own mounts: the neighbours pause there too


def cells() -> list[tuple[str, str, str]]:
    return [(role, step, n) for role in ROLES for step in STEPS for n in NEIGHBOURS]


def case(role: str, step: str, neighbours: str) -> Scenario:
    """The scenario that forces cell (role, step, neighbours); w0 fails, w1 and w2 are its neighbours."""
    mount = "ref.before_mount" if step in DIRECT else "cli.after_mount"   # where the neighbours pause
    chains: dict[str, list[str]] = {}
    if role == "creator":
        chains["ref.before_mount" if step in DIRECT else "cli.before_mount"] = ["1*pause(creator)"]   # its 1st mount
    if step == "kill":
        chains.setdefault(mount, []).extend(["4*off", "1*pause(late)"])
    else:
        chains.setdefault(step, []).extend(["4*off"] if step in PER_FILE else [])
        chains[step] += ["1*wait(late)", "return(EIO)"]
    start = 2 if role == "restarting" else 1
    faults = [Fault("w0", fp, "->".join(terms), start) for fp, terms in chains.items()]
    if role == "restarting":
        faults.append(Fault("w0", "cli.before_list", "return(EIO)"))
    paused = {"none": ["w1", "w2"], "some": ["w2"], "all": []}[neighbours]
    faults += [Fault(w, mount, "2*off->1*pause(hold)") for w in paused]
    return Scenario(
        name=f"{PREFIX}{cell_id(role, step, neighbours)}",
        description=f"w0 ({role}) fails at {step} while its neighbours are {neighbours} ready",
        gpu_workers=3, warm=role != "creator", max_restarts=2 + (role == "restarting"),
        barriers=(["creator"] if role == "creator" else []) + ["late"] + (["hold"] if paused else []), faults=faults,
        kills=[Kill("w0", "late", "release")] if step == "kill" else [],
        start_after={"w1": "creator", "w2": "creator"} if role == "creator" else {},
        windows=["cell"])
