"""``python -m interp.report``: the head atlas (see :mod:`interp.cli.report`)."""

import sys

from interp.cli import run_command

sys.exit(run_command("interp.cli.report", "python -m interp.report"))
