"""The self-tests check every history event they cause against the schema (gpujail/world/events.py):
set before any test runs, so the harness, the nodes (kernel.Fleet passes it on) and the fake CLIs
and implementations they start all validate what they write."""
import os

from gpujail.world.history import VALIDATE_ENV

os.environ.setdefault(VALIDATE_ENV, "1")

# pytester's in-process runs (tests/test_requirements.py) drop from sys.modules what they imported,
# while the packages keep those modules as attributes: a later `from gpujail.reference_impl import
# core, direct` could then pair a fresh `core` with a `direct` bound to the dropped one, whose `Fatal`
# is another class. Importing the implementations first keeps one copy of each for the session.
import gpujail.reference_impl.direct  # noqa: E402,F401
import gpujail.reference_impl.legacy  # noqa: E402,F401
import gpujail.reference_impl.mutants  # noqa: E402,F401
