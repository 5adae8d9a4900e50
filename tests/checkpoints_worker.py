"""``python -m interp.checkpoints`` as written, stopped for a ``kill -9``; tests/test_checkpoints.py starts it.

``python -m tests.checkpoints_worker JOURNAL FLAGS...`` runs the command's own entry point with
``FLAGS``; when the second revision's scoring starts (the first one is journaled by then), it
prints ``blocked with N revision(s) journaled`` and waits for the parent to ``kill -9`` it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from interp.checkpoints import sweep
from interp.cli import checkpoints


def main(journal: str, argv: list[str]) -> int:
    path = Path(journal)
    real = sweep._score_revision
    calls = [0]

    def blocking(*args):
        calls[0] += 1
        if calls[0] == 2:
            units = max(0, len(path.read_bytes().splitlines()) - 1) if path.exists() else 0
            print(f"blocked with {units} revision(s) journaled", flush=True)
            time.sleep(600)
        return real(*args)

    sweep._score_revision = blocking
    return checkpoints.cli(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
