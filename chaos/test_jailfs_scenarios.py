"""Faults only a network jail has (SPEC section 7, chaos/scenarios/jailfs/): each scenario pins its
file system (`jail_fs`) and lists its network faults (`net_faults`: a brick killed and restarted,
latency on the FUSE path, a node's client lost under a live worker), which the fleet injects
(gpujail/backends/jailfs.py `fleet_class`) and records as `jailfs.fault` / `jailfs.clear`.

The verdict is the chaos checker's, as for every scenario; the windows (chaos/checkers/network.py)
say whether the fault hit what it was aimed at, else the run is INCONCLUSIVE. Where this host cannot
provide the file system the test skips with the reason.
"""
from __future__ import annotations

import pytest

from gpujail.backends import jailfs, jailfs_fleet, kernel
from gpujail.chaos import runner, scenario
from gpujail.chaos.test_scenarios import verdict
from gpujail.options import option, seed_of

pytestmark = [pytest.mark.kernel, pytest.mark.req("INV-1", "INV-2", "INV-3", "INV-5", "INV-6")]


@pytest.mark.parametrize("name", scenario.names(scenario.JAILFS_DIR))
def test_network_fault(name, impl, artefacts_dir, request, tmp_path, workers):
    sc = scenario.load(scenario.JAILFS_DIR / f"{name}.toml").with_workers(workers)
    kind = sc.jail_fs or option(request.config, "jail-fs")
    reason = jailfs.unavailable(kind)
    if reason:
        pytest.skip(reason)
    result = runner.run(sc, impl, tmp_path / "run", seed=seed_of(request.config),
                        fleet_class=jailfs_fleet.fleet_class(kernel.Fleet, kind, sc.net_faults))
    verdict(result, request, artefacts_dir, more=k2_reading)


def k2_reading(result) -> str:
    """The first lost file's K-2 reading (chaos/checkers/network.py), when revalidation played a part."""
    import json

    from gpujail.chaos import checker
    from gpujail.chaos.checkers import network
    from gpujail.world import history
    lost = result.verdict.results.get("INV-1")
    if lost is None or not lost.violations:
        return ""
    run = checker.Run(history.load(str(result.history_path)),
                      json.loads((result.run_dir / "final_state.json").read_text()))
    lines = network.explain(run, lost.violations[0])
    return "".join(f"\n  K-2: {line}" for line in lines)
