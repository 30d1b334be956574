"""Chaos on the model backend (`--backend model`): the implementation under test runs in the
deterministic simulation (gpujail/backends/model), where Hypothesis explores interleavings and
faults that the kernel backend reaches only by luck or barriers. The model writes the history the
kernel backend writes, with a probe round of every ready worker when it reports ready and after every
step that removed something; the chaos checker judges it (every invariant, INV-1 to INV-6), as it
judges the kernel's runs (chaos/explore.py `simulate`). Collected only with `--backend model`; the
model runs the bundled Python implementations (reference, legacy, direct, mutant:NAME) in-process,
so a command string is skipped with that reason.

Shared slots: none outside the simulation (each example builds its own model world). A failure
prints the shrunk plan, the verdict and the trace; `gpujail explore replay IMPL
'PLAN'` replays it.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import given, seed

from gpujail.chaos import explore
from gpujail.options import seed_of
from gpujail.reference_impl import in_process
from gpujail.world import history
from gpujail.world.failpoints import REGISTRY

pytestmark = pytest.mark.model
EXAMPLES = int(os.environ.get("GPUJAIL_MODEL_EXAMPLES", "200"))
CLI_POINTS = [n for n in REGISTRY if n.startswith("cli.")]


@pytest.fixture
def model_impl(impl):
    if in_process(impl) is None:
        pytest.skip(f"the model backend runs the bundled Python implementations in-process; {impl!r} is "
                    "a command: use the kernel or docker backend")
    return impl


@pytest.fixture
def test_seed(request) -> int:
    """--seed (flag, GPUJAIL_TEST_SEED or ini, validated once: gpujail/options.py), as for the kernel
    backend's random schedules."""
    return seed_of(request.config)


@pytest.mark.req("INV-1", "INV-3", "INV-5", "REF-5", "REF-6", "REF-7")
def test_no_invariant_breaks_under_explored_schedules_and_faults(model_impl, test_seed):
    """Two workers on the 3-file driver: any interleaving, a failpoint fault per worker (EIO or
    SIGKILL at its N-th hit), a crash of an implementation at any step."""
    @seed(test_seed)
    @explore.explore_settings(EXAMPLES)
    @given(plan=explore.plans(2))
    def run(plan):
        outcome = explore.simulate(model_impl, plan)
        assert not outcome.violations, explore.describe(outcome)
    run()


@pytest.mark.req("INV-1", "REF-5")
@pytest.mark.parametrize("hit", [1, 2, 3])
@pytest.mark.parametrize("point", CLI_POINTS)
def test_failing_cli_costs_a_ready_neighbour_nothing(model_impl, point, hit):
    """Worker 1 ready, then worker 2's CLI fails (EIO) at the `hit`-th hit of `point`: the seed's
    story, every place it can break, one after the other."""
    plan = {"schedule": [], "faults": {1: explore.fault(point, hit, "return(EIO)")}, "crashes": {}}
    outcome = explore.simulate(model_impl, plan)
    assert not outcome.violations, explore.describe(outcome)
    # An armed failpoint that never fired tested nothing: say so rather than pass (the CLI never
    # reaches `point` a `hit`-th time on this path, e.g. symlinks the neighbour's CLI already made).
    if not [e for e in history.select(outcome.world.history, "failpoint", name=point) if e["action"] == "return"]:
        pytest.skip(f"not reached: worker 2's CLI never hit {point} {hit} time(s) under {model_impl!r}")


@pytest.mark.req("REF-5")
@given(plan=explore.plans(4, faults=False))
@explore.explore_settings(max(EXAMPLES // 4, 10))
def test_cold_start_creates_each_marker_exactly_once(model_impl, plan):
    """Four workers, any interleaving: every missing file gets one marker, under the lock, by one
    worker (re-checked under it)."""
    outcome = explore.simulate(model_impl, plan, workers=4)
    events = outcome.world.history
    markers = [e["path"] for e in history.select(events, "impl.marker")]
    assert markers and len(markers) == len(set(markers)), explore.describe(outcome)
    assert len(markers) == max(e["missing"] for e in history.select(events, "impl.placeholders"))


@pytest.mark.req("REF-4", "INV-4")
def test_warm_start_takes_no_lock(model_impl):
    """The second worker starts on a jail the first one populated: no lock, nothing created."""
    outcome = explore.simulate(model_impl, explore.EMPTY)
    world = outcome.world
    second = [s for s in world.trace if s.worker == "w2"]
    assert [w.exits for w in world.workers] == [[0], [0]]
    assert not [s for s in second if s.op in ("impl.lock.wait", "impl.marker", "create", "mkdir")], world.report()
    assert outcome.verdict.results["INV-4"].valid is True, outcome.verdict.summary()


@pytest.mark.req("REF-1", "REF-2", "REF-7", "REF-10", "INV-5")
def test_full_driver_with_every_capability(model_impl):
    """Every file of the driver, all capabilities, three workers interleaved: all ready, all real."""
    plan = dict(explore.EMPTY, schedule=[(0, 40), (1, 40), (2, 40)] * 20)
    outcome = explore.simulate(model_impl, plan, workers=3, driver=None, capabilities="all")
    assert [w.exits[-1] for w in outcome.world.workers] == [0, 0, 0], outcome.report()
    assert not outcome.violations, explore.describe(outcome)
