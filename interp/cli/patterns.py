"""``interp patterns`` / ``python -m interp.patterns``: every head's attention on your own text.

A thin layer over :func:`interp.report.patterns_view.view_patterns`: it prints a summary (the
heads that put the most attention on one other token) and writes ``patterns.html`` under ``--out``:
one self-contained page (no network, no plotly) with a thumbnail per head. A page holds at most
``--max-texts`` texts, ``--max-windows`` windows of each and ``--max-heads`` heads; the summary says
what was left out. ``--text-file`` is read in ``--encoding`` (utf-8 unless given).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from interp.adapters import HookedModel
from interp.cli.common import Unread, run_cli
from interp.cli.flags import add_encoding_flag, base_parser, positive_int
from interp.errors import UsageError
from interp.report.patterns_view import MAX_HEADS, MAX_TEXTS, MAX_WINDOWS
from interp.texts import BYTES_NOTE, decode_file

STEM = "patterns"


def build_parser(prog: str = "python -m interp.patterns") -> argparse.ArgumentParser:
    p = base_parser(prog, "Write every head's attention pattern on your own text as one self-contained HTML page.")
    p.add_argument(
        "--text", action="append", default=None, help=f"a text to look at (repeat the flag for several); {BYTES_NOTE}"
    )
    p.add_argument(
        "--text-file",
        default=None,
        help=f"a text file (see --encoding) whose paragraphs (blank-line separated) are texts; {BYTES_NOTE}",
    )
    add_encoding_flag(p, "--text-file")
    p.add_argument("--heads", default=None, help="comma-separated heads LAYER.HEAD (default: every head)")
    p.add_argument("--window", type=positive_int, default=64, help="positions shown at once; longer texts are windowed")
    p.add_argument(
        "--max-texts",
        type=positive_int,
        default=MAX_TEXTS,
        help="texts the page holds (the first ones; the rest are left out)",
    )
    p.add_argument(
        "--max-windows",
        type=positive_int,
        default=MAX_WINDOWS,
        help="windows of each text the page holds (a longer text is cut after them)",
    )
    p.add_argument("--max-heads", type=positive_int, default=MAX_HEADS, help="heads the page holds (the first chosen)")
    return p


def _texts(args: argparse.Namespace) -> list[str]:
    texts = list(args.text or [])
    if args.text_file:
        path = Path(args.text_file)
        if not path.is_file():
            raise UsageError(f"--text-file {path} does not exist: pass a text file")
        found = [t.strip() for t in decode_file(path, args.encoding).split("\n\n") if t.strip()]
        if not found:
            raise UsageError(
                f"{path} is empty: put some text in it (paragraphs separated by blank lines), or pass another --text-file"
            )
        texts += found
    if not texts:
        raise UsageError("no text given: pass --text 'some text' or --text-file FILE")
    return texts


UNREAD = (
    Unread("--batch", "it shows the texts given, up to --max-texts"),
    Unread("--seed", "nothing in it is drawn at random"),
)


def check(args: argparse.Namespace) -> None:
    """Before the model loads: the texts are read (a missing or empty file is refused here)."""
    args.texts = _texts(args)


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    from interp.report.patterns_view import view_patterns

    heads = [h for h in args.heads.split(",") if h.strip()] if args.heads else None
    page = view_patterns(
        model,
        args.texts,
        heads,
        window=args.window,
        max_texts=args.max_texts,
        max_windows=args.max_windows,
        max_heads=args.max_heads,
        progress=args.progress,
    )
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
    return run_cli(build_parser(prog), main, argv, STEM, check=check, unread=UNREAD)
