"""Every chaos scenario must fail against an implementation that has the bug it guards against.

`legacy` shows it for the scenarios listed as strict expected failures in expectations/legacy.toml
(./run-tests runs them). The scenarios legacy survives by construction (a killed CLI or worker does
no cleanup; legacy takes no lock) are shown here against the mutant that has their bug.
"""
from __future__ import annotations

import pytest

from gpujail.backends import kernel, shared_host
from gpujail.chaos import runner, scenario

pytestmark = pytest.mark.kernel

# The invariant each must fail, by scenario (the mutant is scenario.GUARDS's). host-upgraded-mid-start: ready
# on the CLI's word, over 0-byte files, w4's cleanup unlinks them under w1 when w1 is ready then (INV-1), or
# while w1 is still finishing its start, which then reports ready over them (INV-5).
INVARIANT = {"cli-killed": "INV-", "worker-killed": "INV-", "lock-holder-killed": "INV-2", "failing-neighbour": "INV-1",
             "read-only-jail": "INV-2", "marker-torn": "INV-1", "lock-lost": "INV-1", "lock-holder-stopped": "INV-2",
             "links-swapped": "INV-3", "mixed-capabilities": "INV-1", "host-upgraded-mid-start": ("INV-1", "INV-5"),
             "shared-propagation": "INV-1"}
KILLS = [(name, scenario.GUARDS[name], invariant) for name, invariant in INVARIANT.items()]


@pytest.mark.parametrize("name,impl,invariant", KILLS, ids=[f"{s}-vs-{m}" for s, m, _ in KILLS])
def test_scenario_kills_its_mutant(name, impl, invariant, tmp_path):
    if kernel.precondition():
        pytest.skip(kernel.precondition())
    sc = scenario.load(name)
    if sc.shared_propagation and shared_host.unavailable(kernel.Fleet):
        pytest.skip(shared_host.unavailable(kernel.Fleet))
    result = runner.run(sc, impl, tmp_path / "run")
    assert result.verdict.valid is False, f"{name} let {impl} through:\n{result.report()}"
    assert result.verdict.invariant.startswith(invariant), result.report()
    assert result.timeline and result.timeline.exists()
