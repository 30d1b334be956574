"""Run a cosmic-ray session's mutants on several copies of the tree at once (scripts/mutation-test --jobs N).

How this works: cosmic-ray mutates a module in place and runs the test command in the current
directory, so one tree runs one mutant at a time. Each TREE given here is a copy of the same tree;
a thread per tree takes the next work item and runs it in a child Python in that tree
(`cosmic_ray.mutating.mutate_and_test`: apply the mutation, run the test command with the
session's timeout, killing its process group when it runs out, restore the file), and this process
writes each result into the session as it comes, so an interrupted run resumes where it stopped.
(cosmic-ray's own parallel distributor, `http`, gives up on a request after aiohttp's 5 minutes and
records that as an abnormal outcome, which its report counts as a killed mutant.)

    mutation_jobs.py SESSION CONFIG pending TREE..           # every pending work item
    mutation_jobs.py SESSION CONFIG survivors[=JOB,..] TREE..  # the survivors (or those jobs) again

Exit 0 when every item got its result; 1 when interrupted, or when a child gave none (it stays pending).
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed

from cosmic_ray.config import load_config
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

# The child: one mutant in its tree (the current directory). A SIGTERM kills the test command's
# process group (cosmic-ray starts it in a session of its own, out of reach of the terminal's and
# this driver's signals) and then unwinds, which restores the mutated file.
CHILD = r"""
import json, os, signal, subprocess, sys
from pathlib import Path
from cosmic_ray.mutating import mutate_and_test
from cosmic_ray.work_item import MutationSpec
started = []
class Popen(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        started.append(self)
def stop(*_):
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    raise KeyboardInterrupt
subprocess.Popen = Popen   # (cosmic_ray.testing calls subprocess.Popen)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
item = json.load(sys.stdin)
specs = [MutationSpec(Path(m["module_path"]), m["operator"], m["occurrence"], tuple(m["start"]), tuple(m["end"]))
         for m in item["mutations"]]
r = mutate_and_test(specs, item["test_command"], item["timeout"])
out = {"worker_outcome": r.worker_outcome, "output": r.output, "test_outcome": r.test_outcome, "diff": r.diff}
sys.stdout.write("\n" + json.dumps(out))
"""


def run_in(tree, item, config, children):
    """One work item in one tree: its WorkResult, or the reason the child gave none (a crash, an
    interrupt: then the item stays pending, as an abnormal result would count as a killed mutant)."""
    request = {"mutations": [{"module_path": str(m.module_path), "operator": m.operator_name, "occurrence": m.occurrence,
                              "start": list(m.start_pos), "end": list(m.end_pos)} for m in item.mutations],
               "test_command": config.test_command, "timeout": config.timeout}
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD], cwd=tree, env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    children.add(proc)
    try:
        out, err = proc.communicate(json.dumps(request))
    finally:
        children.discard(proc)
    try:
        r = json.loads(out.rsplit("\n", 1)[-1])
    except ValueError:
        return f"no result (exit {proc.returncode}): {err.strip()[-2000:]}"
    return WorkResult(worker_outcome=WorkerOutcome(r["worker_outcome"]), output=r["output"], diff=r["diff"],
                      test_outcome=r["test_outcome"] and TestOutcome(r["test_outcome"]))


def main(session, config_path, what, *trees):
    config = load_config(config_path)
    with use_db(session, WorkDB.Mode.open) as db:
        if what == "pending":
            items = list(db.pending_work_items)
        else:
            jobs = set(what.partition("=")[2].split(",")) - {""}
            items = [i for i, r in db.completed_work_items if r.worker_outcome != WorkerOutcome.SKIPPED
                     and not r.is_killed and (not jobs or i.job_id in jobs)]
        free, children, stopping = queue.Queue(), set(), threading.Event()
        for tree in trees:
            free.put(os.path.abspath(tree))

        def one(item):
            if stopping.is_set():
                return item, None
            tree = free.get()
            try:
                return item, run_in(tree, item, config, children)
            finally:
                free.put(tree)

        signal.signal(signal.SIGTERM, interrupted)
        print(f"{len(items)} mutants on {len(trees)} trees", flush=True)
        done, left = 0, []
        with ThreadPoolExecutor(len(trees)) as pool:
            futures = [pool.submit(one, item) for item in items]
            try:
                for future in as_completed(futures):
                    item, result = future.result()
                    if result is None:
                        continue
                    if isinstance(result, str):
                        left.append(item.job_id)
                        print(f"{item.job_id}: {result}", flush=True)
                        continue
                    db.set_result(item.job_id, result)
                    done += 1
                    print(f"[{done}/{len(items)}] {item.job_id}: "
                          f"{'killed' if result.is_killed else 'survives'}"
                          f"{' (timeout)' if result.output == 'timeout' else ''}", flush=True)
            except KeyboardInterrupt:
                stopping.set()
                for proc in list(children):
                    proc.terminate()
                for future in futures:
                    future.cancel()
                print(f"interrupted after {done} of {len(items)}: the rest stays pending", file=sys.stderr)
                return 1
    if left:
        print(f"{len(left)} left pending, their child gave no result: {' '.join(left)}", file=sys.stderr)
    return 1 if left else 0


def interrupted(*_):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
