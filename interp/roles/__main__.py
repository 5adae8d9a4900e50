"""``python -m interp.roles``: the command lives in :mod:`interp.cli.roles`."""

import sys

from interp.cli import run_command

sys.exit(run_command("interp.cli.roles", "python -m interp.roles"))
