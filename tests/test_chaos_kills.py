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

# The invariant each must fail, by scenario (the mutant is scenario.GUARDS's); it must be among the failed
# ones, not necessarily the headline (the earliest violation, which the schedule decides). Two scenarios
# accept either of two, by timing: host-upgraded-mid-start: ready on the CLI's word, over 0-byte files,
# w4's cleanup unlinks them under w1 when w1 is ready then (INV-1), or while w1 is still finishing its
# start, which then reports ready over them (INV-5). lock-lost: the resumed w0 renames over a marker
# that a neighbour mounted (INV-1), or that a neighbour had reported ready over but not yet been probed
# on, so its first probe finds the mount gone (INV-5: seen in CI, w3 ready at 0.845 s, the rename
# logged at 0.940 s, after it took effect at w3's probe at 0.924 s).
INVARIANT = {"cli-killed": "INV-", "worker-killed": "INV-", "lock-holder-killed": "INV-2", "failing-neighbour": "INV-1",
             "read-only-jail": "INV-2", "marker-torn": "INV-1", "lock-lost": ("INV-1", "INV-5"), "lock-holder-stopped": "INV-2",
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
    failed = [inv for inv, r in result.verdict.results.items() if r.valid is False]
    assert any(inv.startswith(invariant) for inv in failed), result.report()
    assert result.timeline and result.timeline.exists()
