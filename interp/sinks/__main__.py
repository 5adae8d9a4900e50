"""``python -m interp.sinks``: the command lives in :mod:`interp.cli.sinks`."""

import sys

from interp.cli.sinks import cli

sys.exit(cli())
