"""``python -m interp.induction``: score every head as previous-token, duplicate-token and induction head.

The command lives in :mod:`interp.cli.induction`; this module is its ``python -m`` entry point (Ctrl-C
while torch loads: one line and exit 130, see :func:`interp.cli.import_interruptibly`).
"""

import sys

if __name__ == "__main__":
    from interp.cli import run_command

    sys.exit(run_command("interp.cli.induction", "python -m interp.induction"))

from interp.cli.induction import cli  # noqa: E402  (the command, for code that imports it from here)

__all__ = ["cli"]
