"""``interp patterns`` / ``python -m interp.patterns``: every head's attention on your own text.

A thin layer over :func:`interp.report.patterns_view.view_patterns`: it prints a summary (the
heads that put the most attention on one other token) and writes ``patterns.html`` under ``--out``:
one self-contained page (no network, no plotly) with a thumbnail per head.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from interp.adapters import HookedModel
from interp.cli.common import base_parser, positive_int, run_cli
from interp.errors import UsageError
from interp.texts import BYTES_NOTE

STEM = "patterns"


def build_parser(prog: str = "python -m interp.patterns") -> argparse.ArgumentParser:
    p = base_parser(prog, "Write every head's attention pattern on your own text as one self-contained HTML page.")
    p.add_argument(
        "--text", action="append", default=None, help=f"a text to look at (repeat the flag for several); {BYTES_NOTE}"
    )
    p.add_argument(
        "--text-file",
        default=None,
        help=f"a UTF-8 file whose paragraphs (blank-line separated) are texts; {BYTES_NOTE}",
    )
    p.add_argument("--heads", default=None, help="comma-separated heads LAYER.HEAD (default: every head)")
    p.add_argument("--window", type=positive_int, default=64, help="positions shown at once; longer texts are windowed")
    return p


def _texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.text or [])
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise UsageError(f"--text-file {path} does not exist: pass a UTF-8 text file")
        texts += [t.strip() for t in path.read_text(encoding="utf-8").split("\n\n") if t.strip()]
    if not texts:
        raise UsageError("no text given: pass --text 'some text' or --text-file FILE")
    return texts


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    from interp.report.patterns_view import view_patterns

    heads = [h for h in args.heads.split(",") if h.strip()] if args.heads else None
    page = view_patterns(model, _texts(args), heads, window=args.window)
    print(page.summary())
    # a short ranked summary: the heads whose strongest single key draws the most attention on text 1
    w = np.asarray(page.texts[0]["patterns"])  # [head, q, k]
    peak = w.max(-1)[:, 1:].mean(-1) if w.shape[1] > 1 else w.max(-1).mean(-1)
    order = np.argsort(-peak, kind="stable")[: args.top]
    print(f"\nheads by mean largest single weight on text 1 (1.0: every query looks at one token; top {len(order)}):")
    for i in order:
        print(f"  {page.heads[i]:>6}  {peak[i]:.3f}")
    return [page.save(out, STEM)]


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.patterns") -> int:
    return run_cli(build_parser(prog), main, argv, STEM)


if __name__ == "__main__":
    sys.exit(cli())
