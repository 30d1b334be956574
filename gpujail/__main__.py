"""`python -m gpujail` is the `gpujail` command (gpujail/cli.py)."""
import sys

from .cli import main

sys.exit(main())
