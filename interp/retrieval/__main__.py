"""``python -m interp.retrieval``: the command lives in :mod:`interp.cli.retrieval`."""

import sys

from interp.cli.retrieval import cli

sys.exit(cli())
