"""The model backend (gpujail/backends/model) and its exploration (chaos/explore.py): the kernel rules
it models, determinism, the history it writes for the chaos checker, and that Hypothesis finds and
shrinks the seed bug in `legacy` and in mutants, and nothing in `reference` and `direct`. No
privileges needed."""
from __future__ import annotations

import errno
import stat

import pytest

from gpujail.backends.model import JAIL, ModelFS, ModelWorld, loader_view
from gpujail.chaos import explore
from gpujail.reference_impl import in_process
from gpujail.world import history

LIB = "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
EMPTY = explore.EMPTY


def tiny_fs() -> ModelFS:
    fs = ModelFS()
    fs.add("/host/lib.so", stat.S_IFREG | 0o644, b"\x7fELF" + b"x" * 2044)
    fs.add("/shared/placeholder", stat.S_IFREG | 0o644)
    fs.seal_host()
    return fs


def test_k1_unlink_of_a_mount_point_is_ebusy_here_and_detaches_it_elsewhere():
    """SPEC K-1, the rule the seed bug rests on."""
    fs = tiny_fs()
    a, b = ModelWorld.sandbox(fs, 2)
    a.bind_mount("/host/lib.so", "/shared/placeholder")
    assert a.stat("/shared/placeholder").st_size == 2048 and b.stat("/shared/placeholder").st_size == 0
    with pytest.raises(OSError) as e:
        a.unlink("/shared/placeholder")
    assert e.value.errno == errno.EBUSY
    b.unlink("/shared/placeholder")
    assert [m.mountpoint for m in a.mounts()] == []
    with pytest.raises(FileNotFoundError):
        a.stat("/shared/placeholder")
    assert fs.detached == [("ns1", "/shared/placeholder", "ns2")]


def test_writes_outside_the_jail_are_recorded_and_read_only_mounts_refuse_them():
    fs = tiny_fs()
    (a,) = ModelWorld.sandbox(fs, 1)
    a.bind_mount("/host/lib.so", "/shared/placeholder")
    a.remount("/shared/placeholder")
    with pytest.raises(OSError) as e:
        a.chmod("/shared/placeholder", 0o600)
    assert e.value.errno == errno.EROFS
    a.chmod("/host/lib.so", 0o600)
    assert fs.outside_changes == ["/host/lib.so"]


@pytest.mark.parametrize("size, says", [(0, "file too short"), (26, "file too short"), (4096, "another file")])
def test_loader_view_of_a_placeholder(size, says):
    """SPEC K-3 as the model reports it: what a loader says about what a path resolves to."""
    fs = ModelFS()
    node = fs.add("/f", stat.S_IFREG | 0o644, b"x" * size)
    assert says in loader_view(node)
    assert "No such file" in loader_view(None)


def test_a_plan_replays_exactly():
    plan = {"schedule": [(1, 7), (0, 30), (1, 100)], "faults": {0: explore.fault("cli.after_mount", 2, "kill")},
            "crashes": {}}
    one, two = (explore.simulate("reference", plan) for _ in range(2))
    assert [(s.worker, s.op, s.detail, s.error) for s in one.world.trace] == \
        [(s.worker, s.op, s.detail, s.error) for s in two.world.trace]
    assert one.world.history == two.world.history
    assert one.world.order == two.world.order and not one.violations


def test_schedule_runs_interleave_workers():
    world = explore.simulate("reference", {"schedule": [(0, 3), (1, 3), (0, 3)], "faults": {}, "crashes": {}}).world
    assert world.order[:9] == [0, 0, 0, 1, 1, 1, 0, 0, 0]
    assert [w.exits for w in world.workers] == [[0], [0]]


def test_fault_free_runs_of_every_bundled_implementation_end_ready_and_clean():
    for impl in ("reference", "legacy", "direct"):
        outcome = explore.simulate(impl, EMPTY, workers=3)
        assert [w.exits for w in outcome.world.workers] == [[0]] * 3, (impl, outcome.report())
        assert outcome.verdict.valid is True, explore.describe(outcome)


def test_the_full_driver_runs_too():
    outcome = explore.simulate("reference", EMPTY, driver=None, capabilities="all")
    assert [w.exits for w in outcome.world.workers] == [[0], [0]], outcome.report()
    assert len(outcome.world.files) > 30 and outcome.verdict.valid is True, explore.describe(outcome)


def test_a_killed_lock_holder_releases_its_lock():
    """K-4: the crash of a worker inside the lock (after its lock step) does not wedge the others."""
    outcome = explore.simulate("reference", {"schedule": [(0, 62)], "faults": {}, "crashes": {0: 63}})
    world = outcome.world
    assert any(s.op == "died" for s in world.trace)
    assert [w.exits[-1] for w in world.workers] == [0, 0], world.report()
    assert not outcome.violations


def test_a_lock_held_forever_times_out_in_virtual_time():
    """REF-5's bounded wait: when nobody who could release the lock can run, the waiter times out."""
    from gpujail.backends.model import Proc, Worker
    from gpujail.spec import LOCK
    world = ModelWorld(in_process("reference"), 1, restarts=0)
    lock = world.fs.add(f"{JAIL}/{LOCK}", stat.S_IFREG | 0o644)
    world.fds[99] = (lock, Proc(Worker(world, 9, "stuck-holder"), ""))
    world.locks[lock.ino] = 99
    world.run()
    assert world.workers[0].exits == [3], world.report()
    assert any(s.op == "impl.lock.timeout" for s in world.trace)


def test_legacy_seed_bug_is_found_and_shrunk():
    """Issue 6: for legacy, Hypothesis finds the seed bug and shrinks it to a short plan."""
    plan, exploration = explore.find_violation("legacy", seed=0, max_examples=2000, database=None)
    assert plan is not None, f"{exploration.examples} examples, nothing found"
    assert explore.size(plan) <= 12
    outcome = explore.simulate("legacy", plan)
    assert outcome.violations[0].invariant in ("INV-1", "INV-5")
    assert [e["kind"] for e in outcome.verdict.chain][-1] == "cli.cleanup.unlink"   # the checker's causal chain
    report = outcome.report()
    assert "cli.cleanup.unlink" in report and "VIOLATION" in report


@pytest.mark.parametrize("impl", ["reference", "direct"])
def test_the_fixed_procedures_survive_exploration(impl):
    plan, exploration = explore.find_violation(impl, seed=0, max_examples=150, database=None)
    assert plan is None, explore.describe(explore.simulate(impl, plan))
    assert exploration.examples >= 100 and len(exploration.interleavings) > 20


@pytest.mark.parametrize("mutant", ["zero-byte-placeholders", "recreate-markers", "cleanup-on-failure"])
def test_exploration_finds_each_mutant(mutant):
    plan, _ = explore.find_violation(f"mutant:{mutant}", seed=0, max_examples=1000, database=None)
    assert plan is not None


def test_reference_changes_nothing_outside_the_jail():
    world = explore.simulate("reference", EMPTY).world
    assert world.fs.outside_changes == [] and world.final_state()["outside_changes"] == []
    assert world.fs.lookup(world.workers[0].ns, f"{JAIL}/{LIB}") is world.fs.lookup(world.workers[0].ns, f"/{LIB}")


def test_jail_hygiene_is_judged_by_the_checkers_rules():
    """INV-3's jail half at the end of a run: a 76-byte 'marker' is no placeholder (REF-9)."""
    outcome = explore.simulate("mutant:big-markers", EMPTY)
    assert [v.invariant for v in outcome.violations] == ["INV-3"] * len(outcome.violations) and outcome.violations
    assert "appeared" in outcome.violations[0].explanation
    assert not explore.simulate("reference", EMPTY).violations


def test_direct_undo_survives_its_own_mount_detached_by_a_populate_cleanup():
    """`direct` mounting while another node's populate-jail cleanup (REF-9) removes the markers:
    its first mount is detached under it (K-1) and the next bind finds no target. The undo must not
    trip over the mount that is already gone: one `cli-failed`, no mount left behind."""
    from gpujail.backends.model import SMALL_DRIVER, ModelSys, build
    from gpujail.fixtures.drivers import DEFAULT_VERSION
    from gpujail.reference_impl import core, direct
    fs = build(DEFAULT_VERSION, SMALL_DRIVER)
    worker, cleanup = ModelWorld.sandbox(fs, 2)
    pairs = [(p, core.target(p)) for p in fs.driver if not p.startswith("/dev/")]
    for _, rel in pairs:
        worker.write_new_beneath(JAIL, rel, core.MARKER, 0o644)

    class CleanedUnderIt(ModelSys):
        binds = 0

        def bind_mount_beneath(self, source, root, rel, flags):
            CleanedUnderIt.binds += 1
            if CleanedUnderIt.binds == 2:   # between its first and second mount
                for _, placeholder in pairs:
                    cleanup.unlink_beneath(JAIL, placeholder)
            return super().bind_mount_beneath(source, root, rel, flags)

    ctx = core.Ctx(CleanedUnderIt(worker.world, worker.proc), JAIL, "n1")
    with pytest.raises(core.Fatal) as e:
        direct.mount_directly(ctx, pairs)
    assert e.value.kind == "cli-failed" and fs.detached
    assert [m for m in worker.mounts() if m.mountpoint.startswith(JAIL + "/usr")] == []


def test_the_model_writes_the_kernel_backends_history():
    """One history for every backend: the workers' lives, the implementation's and the CLI's events,
    probes of ready workers (at readiness and after each removal), judged by the checker."""
    outcome = explore.simulate("legacy", {"schedule": [], "faults": {1: explore.fault("cli.before_mount", 2,
                                                                                        "return(EIO)")}, "crashes": {}})
    events = outcome.world.history
    kinds = {e["kind"] for e in events}
    assert {"chaos.begin", "chaos.fault", "worker.start", "worker.ready", "worker.exit", "worker.restart", "impl.begin",
            "cli.start", "cli.fail", "cli.cleanup.unlink", "failpoint", "probe", "chaos.end"} <= kinds
    assert all({"t", "node", "pid", "kind"} <= set(e) for e in events)
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    unlink = history.select(events, "cli.cleanup.unlink")[0]
    after = [e for e in events if e["t"] > unlink["t"] and e["kind"] == "probe"]
    assert after and after[0]["node"] == "w1"   # the next probe of the ready neighbour sees the loss
    assert outcome.verdict.results["INV-1"].valid is False
