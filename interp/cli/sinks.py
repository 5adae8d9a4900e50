"""``python -m interp.sinks`` / ``interp sinks``: attention-sink heads, sink tokens and massive activations.

A thin layer over :func:`interp.sinks.sink_scores`: it prints :meth:`SinkReport.summary` and writes
the report (:meth:`SinkReport.save`) and its figures (:meth:`SinkReport.figures`) under ``--out``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from interp.adapters import HookedModel
from interp.cli import flags
from interp.cli.common import Unread, run_cli
from interp.errors import UsageError
from interp.plots import save_figure
from interp.probes import PROBES, random_tokens, text_probe
from interp.sinks import ABS_THRESHOLD, EPSILON, REL_THRESHOLD, SINK_RATIO, sink_scores, validate_sink_scores
from interp.texts import BYTES_NOTE, check_dataset

STEM = "sinks"


def build_parser(prog: str = "python -m interp.sinks") -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "Find attention-sink heads, the tokens they park attention on, and the massive "
        "residual activations behind them.",
    )
    p.set_defaults(batch=16)
    flags.choice(
        p, "--probe", PROBES, None, after=" (default: text with --dataset, else random)", only=("random", "text")
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="text probe source: a Hub data set NAME[:CONFIG] or a local .txt/.json/.csv file "
        f"(default: the bundled English text in data/text); {BYTES_NOTE}",
    )
    p.add_argument("--split", default="train", help="--dataset split")
    p.add_argument("--text-column", default="text", help="--dataset column holding the text")
    flags.add_encoding_flag(p, "--dataset file")
    p.add_argument("--seq-len", type=flags.positive_int, default=64, help="body tokens per sequence")
    p.add_argument(
        "--epsilon",
        type=flags.float_in(0, 1, low_open=True, high_open=True),
        default=EPSILON,
        help="Sink_k^eps threshold on a head's mass",
    )
    p.add_argument(
        "--sink-ratio",
        type=flags.float_in(0, low_open=True),
        default=SINK_RATIO,
        help="a token is a sink when it draws this many times a uniform head's attention",
    )
    p.add_argument(
        "--abs-threshold",
        type=flags.float_in(0, low_open=True),
        default=ABS_THRESHOLD,
        help="massive activation: |x| above this",
    )
    p.add_argument(
        "--rel-threshold",
        type=flags.float_in(0, low_open=True),
        default=REL_THRESHOLD,
        help="massive activation: |x| above this times the median |x| of the sequence's layer output",
    )
    flags.add_minibatch_flag(p, "sequences per forward pass (default: every sequence in one)")
    flags.add_engine_flag(p)
    return p


UNREAD = (
    Unread("--split", "it applies to --dataset", lambda args: args.dataset is None),
    Unread("--text-column", "it applies to --dataset", lambda args: args.dataset is None),
)


def check(args: argparse.Namespace) -> None:
    """Flags that do not go together, refused before the model loads."""
    if args.probe == "random" and args.dataset:
        raise UsageError("--dataset needs --probe text")
    check_dataset(args.dataset)
    validate_sink_scores(
        epsilon=args.epsilon,
        abs_threshold=args.abs_threshold,
        rel_threshold=args.rel_threshold,
        sink_ratio=args.sink_ratio,
    )


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    kind = args.probe or ("text" if args.dataset else "random")
    if kind == "text":
        probe = text_probe(
            model,
            batch=args.batch,
            seq_len=args.seq_len,
            seed=args.seed,
            dataset=args.dataset,
            split=args.split,
            text_column=args.text_column,
            encoding=args.encoding,
        )
    else:
        probe = random_tokens(model, batch=args.batch, seq_len=args.seq_len, seed=args.seed)
    t0 = time.perf_counter()
    report = sink_scores(
        model,
        probe,
        epsilon=args.epsilon,
        abs_threshold=args.abs_threshold,
        rel_threshold=args.rel_threshold,
        sink_ratio=args.sink_ratio,
        config=flags.run_config(args),
    )
    elapsed = time.perf_counter() - t0
    report.meta["model_spec"] = report.heads.meta["model_spec"] = args.model
    print(report.summary(probe, top=args.top, elapsed=elapsed))

    written = report.save(out, STEM)
    for suffix, fig in report.figures().items():
        written += save_figure(fig, out, f"{STEM}_{suffix}")
    return written


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.sinks") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check, unread=UNREAD)
