"""Conformance tests that the shell template's kill matrix asked for (issue 30, item 5).

Two mistakes of reference_impl/template_mutants.py were killed only by the rule that a failing
start explains itself in one stderr line: the substance of each went unchecked, so a vendor who
made the same mistake silently (`|| true` instead of `|| echo warning`) would pass. These tests
check the substance:

- `status-lost-in-substitution`: configure's failure never reaches `set -e`. Harmless when the
  CLI's cleanup undid its mounts (verification then fails the start), not when it failed at a step
  whose failure undoes nothing (CLI-6: ldconfig) with every mount in place.
- `set-e-off-in-or-chain`: a failure to create the markers taken as a warning, and the CLI run
  anyway; it then creates the 0-byte placeholders the markers exist to prevent.
"""
from __future__ import annotations

import pytest

from gpujail.conformance.helpers import became_ready

pytestmark = pytest.mark.kernel


@pytest.mark.req("REF-6")
@pytest.mark.needs_cli("configure")
def test_cli_failing_after_its_mounts_is_still_fatal(world):
    """A configure that fails at its ldconfig step (CLI-6: that failure undoes nothing, so every
    mount is still in place and would pass verification) is still a failing CLI: the start must
    exit non-zero, not go on to report ready."""
    w = world.start("w", env={"GPUJAIL_FAILPOINTS": "cli.before_ldconfig=return(EIO)"})
    assert world.events("cli.start"), "REF-6: worker w never ran `nvidia-container-cli configure`"
    assert not w.ready, became_ready("REF-6", w, "`nvidia-container-cli configure` exited 1 (EIO at its ldconfig step)")


@pytest.mark.req("REF-5")
def test_no_configure_when_markers_cannot_be_written(world):
    """ENOSPC (a small tmpfs under this node's jail): a start that cannot write its markers must
    fail before it runs `configure`, which would create the missing targets as 0-byte placeholders
    (CLI-4), the files a failing CLI's cleanup later deletes from under other workers' mounts."""
    from gpujail.contract import command_for
    node = world.node("full", jail_tmpfs="80k")
    r = node.run(command_for(world.impl, str(world.jail), "full", "gpu-worker"))
    assert r.code != 0, "REF-5: worker full exited 0 on a full jail (ENOSPC: its markers cannot all be written)"
    assert (runs := world.events("cli.start")) == [], \
        (f"REF-5: worker full ran `nvidia-container-cli configure` {len(runs)} time(s) although its markers could not "
         f"be written (ENOSPC): the CLI then creates the missing targets as 0-byte placeholders")
