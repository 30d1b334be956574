"""The self-tests check every history event they cause against the schema (gpujail/world/events.py):
set before any test runs, so the harness, the nodes (kernel.Fleet passes it on) and the fake CLIs
and implementations they start all validate what they write."""
import os

from gpujail.world.history import VALIDATE_ENV

os.environ.setdefault(VALIDATE_ENV, "1")
