"""`python -m gpujail` is the `gpujail` command (gpujail/cli.py)."""
import sys

from gpujail.cli import main

sys.exit(main())
