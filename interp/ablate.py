"""``python -m interp.ablate``: which heads matter for a metric, and how many can go.

The command lives in :mod:`interp.cli.ablate`; this module is its ``python -m`` entry point.
"""

import sys

from interp.cli.ablate import cli

if __name__ == "__main__":
    sys.exit(cli())
