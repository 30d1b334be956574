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

KILLS = [
    ("cli-killed", "mutant:cleanup-on-failure", "INV-"),        # its failure path removes placeholders
    ("worker-killed", "mutant:recreate-markers", "INV-"),       # a restart re-creates placeholders
    ("lock-holder-killed", "mutant:mkdir-lock", "INV-2"),       # a lock that outlives its holder
    ("failing-neighbour", "mutant:zero-byte-placeholders", "INV-1"),
    ("read-only-jail", "mutant:recreate-markers", "INV-2"),     # writes on every start
    ("marker-torn", "mutant:zero-byte-counts-present", "INV-1"),   # the torn marker left 0 bytes, then unlinked
    ("lock-lost", "mutant:atomic-rename-markers", "INV-1"),        # the resumed holder renames over a live marker
    ("lock-holder-stopped", "mutant:unbounded-lock-wait", "INV-2"),  # waiters hang behind the stopped holder
    ("links-swapped", "mutant:jail-checked-once", "INV-3"),        # checked at the start, followed after the swap
    ("mixed-capabilities", "mutant:markers-for-default-capabilities", "INV-1"),   # graphics libraries left to the CLI
    # ready on the CLI's word, over 0-byte files: w4's cleanup unlinks them under w1 when w1 is ready then
    # (INV-1), or while w1 is still finishing its start, which then reports ready over them (INV-5)
    ("host-upgraded-mid-start", "mutant:exit-code-only", ("INV-1", "INV-5")),
    ("shared-propagation", "mutant:propagation-kept", "INV-1"),     # w1's mounts reach w0 through the shared host mount
]


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
