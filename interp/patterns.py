"""``python -m interp.patterns``: every head's attention on your own text, as one self-contained page.

The command lives in :mod:`interp.cli.patterns`; this module is its ``python -m`` entry point (Ctrl-C
while torch loads: one line and exit 130, see :func:`interp.cli.import_interruptibly`).
"""

import sys

if __name__ == "__main__":
    from interp.cli import run_command

    sys.exit(run_command("interp.cli.patterns", "python -m interp.patterns"))

from interp.cli.patterns import cli  # noqa: E402  (the command, for code that imports it from here)

__all__ = ["cli"]
