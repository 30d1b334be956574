"""The fault table's cells as chaos cases (chaos/fault_table.py): every role a failing worker can
have, at every step, with its neighbours none, some or all ready (SPEC section 7, INV-1..INV-6).

A cell the implementation never reaches (its forcing faults did not all act: `direct` has no CLI
steps, a CLI-based one no `ref.before_mount`) is skipped as unreachable, with the faults that never
acted; a run that breaks an invariant fails whether or not its cell was reached.
"""
from __future__ import annotations

import pytest

from gpujail.chaos import fault_table, runner
from gpujail.chaos.checkers.cells import cell_id
from gpujail.chaos.test_scenarios import skip_if_unreached, verdict
from gpujail.options import seed_of

pytestmark = [pytest.mark.kernel, pytest.mark.req("INV-1", "INV-2", "INV-3", "INV-4", "INV-5", "INV-6")]


@pytest.mark.parametrize("role,step,neighbours", [pytest.param(*c, id=cell_id(*c)) for c in fault_table.cells()])
def test_fault_cell(role, step, neighbours, impl, fleet_class, artefacts_dir, request, tmp_path):
    sc = fault_table.case(role, step, neighbours)
    result = runner.run(sc, impl, tmp_path / "run", seed=seed_of(request.config), fleet_class=fleet_class)
    skip_if_unreached(result, request, impl, unreachable=cell_id(role, step, neighbours))
    verdict(result, request, artefacts_dir)
