"""``python -m interp.report``: the head atlas (see :mod:`interp.cli.report`)."""

import sys

from interp.cli.report import cli

sys.exit(cli())
