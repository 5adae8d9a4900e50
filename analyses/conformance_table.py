"""The conformance table: architecture family x engine, each cell "exact (max error)" or "refused: why".

Runs the same checks as ``tests/test_conformance.py`` (:mod:`tests.conformance`): one tiny random
model per family, built offline from its ``transformers`` config, every interp engine compared with
a reference computed from the Hugging Face model alone (its eager ``output_attentions`` weights; a
pre-hook zeroing or gating one head's slice of the attention output projection's input). Prints the
Markdown table with the versions of ``transformers``, TransformerLens and torch it was made with;
``--out FILE`` also writes it (atomically).

    python analyses/conformance_table.py [--out conformance.md] [--families gpt2 llama ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import PackageNotFoundError, version

import torch
from _common import ROOT  # noqa: F401  (puts the repository root on sys.path)

from interp._io import atomic_write
from tests.conformance import CHECKS, FAMILIES, TOL, Outcome, check_family

COLUMNS = {
    "patterns": "hook_pattern",
    "scores_pattern": "head scores (pattern)",
    "scores_stream": "head scores (stream)",
    "sinks_pattern": "sinks (pattern)",
    "sinks_stream": "sinks (stream)",
    "exact_sweep": "exact sweep",
    "gradient": "gradient",
}


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def cell(outcome: Outcome) -> str:
    """One table cell: exact (max error), refused: the first line, or what went wrong."""
    if outcome.status == "exact":
        return f"exact ({outcome.error:.1e})"
    if outcome.status == "refused":
        after = "" if outcome.work == 0 else f" (after {outcome.work} block calls)"
        reason = outcome.message.split(": ", 1)[-1].replace("|", "/")
        return f"refused{after}: {reason}"
    if outcome.status == "mismatch":
        return f"**mismatch ({outcome.error:.1e})**"
    return f"**error: {outcome.message.replace('|', '/')}**"


def table(families: list[str], *, block_len: int = 10) -> str:
    """The Markdown table for ``families``, with the versions it was made with."""
    header = ["family", *(COLUMNS[c] for c in CHECKS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in families:
        report = check_family(name, block_len=block_len)
        notes = FAMILIES[name].notes
        label = f"{name} ({notes.split(',')[0].split(';')[0].split(' (')[0]})" if notes else name
        lines.append("| " + " | ".join([label, *(cell(report.outcomes[c]) for c in CHECKS)]) + " |")
        print(f"  {name}: done", file=sys.stderr, flush=True)
    made = (
        f"Made with transformers {_version('transformers')}, TransformerLens {_version('transformer-lens')}, "
        f"torch {_version('torch')}; tolerance {TOL:g}; tiny random models (d_model 64, 4 heads of 16, "
        f"2 layers, gemma3 6), probe of 2 sequences x {2 * block_len} repeated tokens; "
        "`python analyses/conformance_table.py`."
    )
    return "\n".join(lines) + "\n\n" + made + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the Markdown table to this file (atomically)")
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--block-len", type=int, default=10, help="tokens per repeated block of the probe")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # tiny models: one thread is fastest
    start = time.perf_counter()
    text = table(args.families, block_len=args.block_len)
    print(text)
    if args.out:
        atomic_write(args.out, text)
        print(f"wrote {args.out}")
    print(f"{len(args.families)} families in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
