"""Benchmark: what the journal (``--resume``) costs an exact sweep, at the CLI's default probe.

``python -m interp.ablate --method exact`` (10 sequences of BOS + 50 random tokens repeated twice,
101 tokens; zero ablation; fast replay), run in this process through the command's own entry point,
alternately with the journal and without it (the command built without ``--resume``/``--fresh``,
so ``run_cli`` opens no journal), one torch thread. Printed:

- the median wall time of the whole command (model load, probe, clean pass, sweep, writing the
  files) with and without the journal, and their ratio minus one: the journal's cost;
- the time spent in the journal's own work, timed directly inside the journaled runs (hashing the
  model and the probe for the fingerprint, opening the file, every append, deleting it at the
  end), as a share of the journaled run: the same cost without the run-to-run noise.

    OMP_NUM_THREADS=1 python analyses/bench_journal.py                # the bundled toy model
    OMP_NUM_THREADS=1 python analyses/bench_journal.py --gpt2-small   # a random GPT-2 small (minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import _common  # noqa: F401  (the repository on the import path)
import torch

from interp import journal as journal_module
from interp.cli import ablate
from tests.helpers import GPT2_SMALL, gpt2_model, word_tokenizer

JOURNAL_WORK = [
    (journal_module, "model_identity"),
    (journal_module, "tokens_hash"),
    (journal_module.Journal, "open"),
    (journal_module.Journal, "extend"),
    (journal_module.Journal, "finish"),
]


@contextlib.contextmanager
def timed(spent: list[float]):
    """Add the time spent inside the journal's own functions to ``spent[0]``."""
    patches = []
    for owner, name in JOURNAL_WORK:
        real = getattr(owner, name)

        def wrapper(*args, _real=real, **kwargs):
            t0 = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0

        patches.append(mock.patch.object(owner, name, wrapper))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        yield


def run(model: str, out: Path, journaled: bool, spent: list[float]) -> float:
    argv = ["--model", model, "--method", "exact", "--device", "cpu", "--no-progress", "--out", str(out)]
    quiet = contextlib.redirect_stdout(io.StringIO())
    without = mock.patch.object(ablate, "add_resume_flags", lambda parser: None)
    with quiet, timed(spent) if journaled else without:
        t0 = time.perf_counter()
        code = ablate.cli(argv)
        elapsed = time.perf_counter() - t0
    assert code == 0, code
    assert not (out / ".journal").exists()  # a finished run leaves no journal
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpt2-small", action="store_true", help="a random-weight GPT-2 small instead of the toy")
    parser.add_argument("--repeats", type=int, default=3, help="runs with and without the journal (median)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = "toy"
        if args.gpt2_small:
            model = str(Path(tmp) / "gpt2-small")
            cfg = dict(GPT2_SMALL)
            vocab = cfg.pop("vocab")
            gpt2_model(vocab=vocab, **cfg).save_pretrained(model)
            word_tokenizer(vocab).save_pretrained(model)
        run(model, Path(tmp) / "warm", False, [0.0])  # imports, caches: not timed
        times: dict[bool, list[float]] = {True: [], False: []}
        shares = []
        for i in range(args.repeats):
            for journaled in (True, False):
                spent = [0.0]
                t = run(model, Path(tmp) / f"out{i}{int(journaled)}", journaled, spent)
                times[journaled].append(t)
                if journaled:
                    shares.append(spent[0] / t)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"model: {model if not args.gpt2_small else 'random GPT-2 small (12 x 12 heads, d_model 768)'}")
    print("probe: 10 x 101 tokens (the CLI default), exact sweep, zero ablation, 1 thread")
    print(f"runs: {args.repeats} with the journal, {args.repeats} without, alternated")
    print(f"whole command, median: {on:.3f} s with the journal, {off:.3f} s without")
    print(f"journal cost (with / without - 1): {on / off - 1:+.2%}")
    print(f"journal's own work inside the journaled runs: median {statistics.median(shares):.3%} of the run")


if __name__ == "__main__":
    main()
