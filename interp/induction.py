"""``python -m interp.induction``: score every head as previous-token, duplicate-token and induction head.

The command lives in :mod:`interp.cli.induction`; this module is its ``python -m`` entry point.
"""

import sys

from interp.cli.induction import cli

if __name__ == "__main__":
    sys.exit(cli())
