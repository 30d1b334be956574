"""scripts/mutation_jobs.py, the parallel runner of scripts/mutation-test, on a real cosmic-ray session over a
toy module: every mutant gets the verdict the serial run gives, both trees work, a mutant that hangs
is stopped at the session's timeout and named, and every tree ends with its module unmutated."""

# (cosmic-ray is in the dev extra, which ./run-tests installs; imported in the test, so that a
# venv without it, as run-tests' unprivileged one, can still collect this file)

import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent.parent / "scripts" / "mutation_jobs.py"
TOY = "def inc(x):\n    return x + 1\n\n\ndef count():\n    n = 0\n    while n != 3:\n        n += 1\n    return n\n"
CHECK = "import toy; assert toy.inc(1) == 2; assert toy.count() == 3"
# The mutants this test reasons about (the rest are marked skipped, as --sample does: they would cost
# seconds each and say nothing more): `x << 1` is 2 at x = 1 too, the survivor; `x - 1` is killed;
# `n += 2` and `n += 0` never reach 3, stopped by the timeout.
KEEP = {("ReplaceBinaryOperator_Add_LShift", 2), ("ReplaceBinaryOperator_Add_Sub", 2), ("NumberReplacer", 8)}


def test_parallel_trees_give_the_serial_verdicts(tmp_path):
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome as Outcome
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    trees = [tmp_path / "tree", tmp_path / "tree-2"]
    for tree in trees:
        tree.mkdir()
        (tree / "toy.py").write_text(TOY)
    config = tmp_path / "cr.toml"
    config.write_text(f"""[cosmic-ray]
module-path = "toy.py"
timeout = 5.0
excluded-modules = []
test-command = "sh -c 'pwd >>{tmp_path}/ran && {sys.executable} -c \\"{CHECK}\\"'"
[cosmic-ray.distributor]
name = "local"
""")
    session = tmp_path / "s.sqlite"
    subprocess.run([Path(sys.executable).parent / "cosmic-ray", "init", config, session], cwd=trees[0], check=True)
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = list(db.pending_work_items)
        key = lambda item: (item.mutations[0].operator_name.removeprefix("core/"), item.mutations[0].start_pos[0])
        assert {key(i) for i in items} >= KEEP
        for item in items:
            if key(item) not in KEEP:
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))

    run = subprocess.run([sys.executable, str(RUNNER), str(session), str(config), "pending", *map(str, trees)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    with use_db(str(session), WorkDB.Mode.open) as db:
        assert not list(db.pending_work_items)
        results = [(key(item), r) for item, r in db.completed_work_items if r.worker_outcome != WorkerOutcome.SKIPPED]
    assert len(results) == 4, results
    assert [k for k, r in results if r.test_outcome == Outcome.SURVIVED] == [("ReplaceBinaryOperator_Add_LShift", 2)]
    assert [k for k, r in results if r.output == "timeout"] == [("NumberReplacer", 8)] * 2
    assert [k for k, r in results if r.test_outcome == Outcome.KILLED and r.output != "timeout"] == \
        [("ReplaceBinaryOperator_Add_Sub", 2)]
    assert "(timeout)" in run.stdout
    # both trees ran mutants (the test command notes its directory first)
    ran_in = (tmp_path / "ran").read_text().split()
    assert len(ran_in) == 4 and set(ran_in) == {str(t) for t in trees}, ran_in
    assert all((t / "toy.py").read_text() == TOY for t in trees)
