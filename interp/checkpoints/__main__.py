"""``python -m interp.checkpoints``: the command lives in :mod:`interp.cli.checkpoints`."""

import sys

from interp.cli import run_command

sys.exit(run_command("interp.cli.checkpoints", "python -m interp.checkpoints"))
