"""``python -m interp.roles``: what each head writes and reads (composition, OV roles, encoder heads,
direct logit attribution).

The command lives in :mod:`interp.cli.roles`; this module is its ``python -m`` entry point (Ctrl-C
while torch loads: one line and exit 130, see :func:`interp.cli.import_interruptibly`).
"""

import sys

if __name__ == "__main__":
    from interp.cli import run_command

    sys.exit(run_command("interp.cli.roles", "python -m interp.roles"))

from interp.cli.roles import cli  # noqa: E402  (the command, for code that imports it from here)

__all__ = ["cli"]
