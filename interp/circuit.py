"""``python -m interp.circuit``: which edges carry a task, and the circuit they make.

The command lives in :mod:`interp.cli.circuit`; this module is its ``python -m`` entry point (Ctrl-C
while torch loads: one line and exit 130, see :func:`interp.cli.import_interruptibly`).
"""

import sys

if __name__ == "__main__":
    from interp.cli import run_command

    sys.exit(run_command("interp.cli.circuit", "python -m interp.circuit"))

from interp.cli.circuit import cli  # noqa: E402  (the command, for code that imports it from here)

__all__ = ["cli"]
