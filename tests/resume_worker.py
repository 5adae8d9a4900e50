"""``python -m interp.ablate`` as written, with one fault injected; tests/test_resume.py starts it.

``python -m tests.resume_worker FAULT JOURNAL ABLATE-FLAGS...`` runs the command's own entry point
with ``ABLATE-FLAGS``; ``JOURNAL`` is the journal file the run keeps (``<out>/.journal/exact.jsonl``).

- ``block``: when the sweep's second batched forward starts (the first one's heads are journaled
  by then), print ``blocked`` and wait, for the parent to ``kill -9`` this process;
- ``kill-rank-1``: under ``torchrun``, on the group's first attempt only
  (``TORCHELASTIC_RESTART_COUNT`` 0), rank 1 waits as its second round starts until rank 0 has
  journaled the first round's units, leaves ``JOURNAL.killed`` and kills itself with SIGKILL.

At the end each rank leaves ``JOURNAL.forwards<rank>``: the batched forwards it evaluated.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from interp.ablation import Sweeper
from interp.cli import ablate


def _units(journal: Path) -> int:
    return max(0, len(journal.read_bytes().splitlines()) - 1) if journal.exists() else 0


def main(fault: str, journal: str, argv: list[str]) -> int:
    path = Path(journal)
    real = Sweeper._evaluate_group
    calls = [0]
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    armed = fault == "block" or (fault == "kill-rank-1" and os.environ.get("RANK") == "1" and first_attempt)

    def faulty(self, *args):
        calls[0] += 1
        if armed and calls[0] == 2:
            deadline = time.monotonic() + 120
            while _units(path) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            if fault == "block":
                print(f"blocked with {_units(path)} unit(s) journaled", flush=True)
                time.sleep(600)
            Path(f"{journal}.killed").write_text(str(_units(path)))
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *args)

    Sweeper._evaluate_group = faulty
    code = ablate.cli(argv)
    Path(f"{journal}.forwards{os.environ.get('RANK', '0')}").write_text(str(calls[0]))  # the last attempt's
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
