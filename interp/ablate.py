"""``python -m interp.ablate``: which heads matter for a metric, and how many can go.

The command lives in :mod:`interp.cli.ablate`; this module is its ``python -m`` entry point (Ctrl-C
while torch loads: one line and exit 130, see :func:`interp.cli.import_interruptibly`).
"""

import sys

if __name__ == "__main__":
    from interp.cli import run_command

    sys.exit(run_command("interp.cli.ablate", "python -m interp.ablate"))

from interp.cli.ablate import cli  # noqa: E402  (the command, for code that imports it from here)

__all__ = ["cli"]
