"""``python -m interp.sinks``: the command lives in :mod:`interp.cli.sinks`."""

import sys

from interp.cli import run_command

sys.exit(run_command("interp.cli.sinks", "python -m interp.sinks"))
