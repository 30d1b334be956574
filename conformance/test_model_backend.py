"""Conformance on the model backend (`--backend model`): the implementation under test runs in the
deterministic simulation (gpujail/model.py), where Hypothesis explores interleavings and faults that
the kernel backend reaches only by luck or barriers, and checks INV-1, INV-3 and INV-5 after every
step. Collected only with `--backend model`; the model runs the bundled Python implementations
(reference, legacy, direct, mutant:NAME) in-process, so a command string is skipped with that reason.

A failure prints the shrunk plan and its trace; `python -m gpujail.chaos.explore replay IMPL 'PLAN'` replays it.
"""
from __future__ import annotations

import os

import pytest
from gpujail.chaos import explore
from hypothesis import given, seed

from gpujail.backends.model import World
from gpujail.plugin import option
from gpujail.world.failpoints import REGISTRY

pytestmark = pytest.mark.model
EXAMPLES = int(os.environ.get("GPUJAIL_MODEL_EXAMPLES", "200"))
CLI_POINTS = [n for n in REGISTRY if n.startswith("cli.")]


@pytest.fixture
def model_impl(impl):
    if impl not in ("reference", "legacy", "direct") and not impl.startswith("mutant:"):
        pytest.skip(f"the model backend runs the bundled Python implementations in-process; {impl!r} is "
                    "a command: use the kernel or docker backend")
    return impl


@pytest.mark.req("INV-1", "INV-3", "INV-5", "REF-5", "REF-6", "REF-7")
def test_no_invariant_breaks_under_explored_schedules_and_faults(model_impl, request):
    """Two workers on the 3-file driver: any interleaving, a failpoint fault per worker (EIO or
    SIGKILL at its N-th hit), a crash of an implementation at any step."""
    @seed(int(option(request.config, "seed")))
    @explore.explore_settings(EXAMPLES)
    @given(plan=explore.plans(2))
    def run(plan):
        world = explore.simulate(model_impl, plan)
        assert not world.violations, explore.describe(model_impl, plan, world)
    run()


@pytest.mark.req("INV-1", "REF-5")
@pytest.mark.parametrize("hit", [1, 2, 3])
@pytest.mark.parametrize("point", CLI_POINTS)
def test_failing_cli_costs_a_ready_neighbour_nothing(model_impl, point, hit):
    """Worker 1 ready, then worker 2's CLI fails (EIO) at the `hit`-th hit of `point`: the seed's
    story, every place it can break, one after the other."""
    plan = {"schedule": [], "faults": {1: explore.fault(point, hit, "return(EIO)")}, "crashes": {}}
    world = explore.simulate(model_impl, plan)
    assert not world.violations, explore.describe(model_impl, plan, world)


@pytest.mark.req("REF-5")
@given(plan=explore.plans(4, faults=False))
@explore.explore_settings(max(EXAMPLES // 4, 10))
def test_cold_start_creates_each_marker_exactly_once(model_impl, plan):
    """Four workers, any interleaving: every missing file gets one marker, under the lock, by one
    worker (re-checked under it)."""
    world = explore.simulate(model_impl, plan, workers=4)
    markers = [s.detail for s in world.trace if s.op == "impl.marker"]
    assert markers and len(markers) == len(set(markers)), explore.describe(model_impl, plan, world)
    missing = max(int(s.detail.split("missing=")[1].split()[0]) for s in world.trace if s.op == "impl.placeholders")
    assert len(markers) == missing


@pytest.mark.req("REF-4", "INV-4")
def test_warm_start_takes_no_lock(model_impl):
    """The second worker starts on a jail the first one populated: no lock, nothing created."""
    world = explore.simulate(model_impl, {"schedule": [], "faults": {}, "crashes": {}})
    second = [s for s in world.trace if s.worker == "w2"]
    assert [s.exits for s in world.workers] == [[0], [0]]
    assert not [s for s in second if s.op in ("impl.lock.wait", "impl.marker", "create", "mkdir")], \
        world.report()


@pytest.mark.req("REF-1", "REF-2", "REF-7", "REF-10", "INV-5")
def test_full_driver_with_every_capability(model_impl):
    """Every file of the driver, all capabilities, three workers interleaved: all ready, all real."""
    world = World(model_impl, 3, driver=None, capabilities="all", schedule=[(0, 40), (1, 40), (2, 40)] * 20).run()
    assert [w.exits[-1] for w in world.workers] == [0, 0, 0], world.report()
    assert not world.violations, world.report()
