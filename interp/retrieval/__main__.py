"""``python -m interp.retrieval``: the command lives in :mod:`interp.cli.retrieval`."""

import sys

from interp.cli import run_command

sys.exit(run_command("interp.cli.retrieval", "python -m interp.retrieval"))
