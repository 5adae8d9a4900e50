"""``python -m interp.induction``: which heads are previous-token, duplicate-token and induction heads.

A thin layer over :func:`interp.heads.head_scores` and :meth:`HeadScores.figure`: it prints the
heads ranked by induction score and writes ``induction.csv``, ``induction.json``,
``induction.html`` (and ``induction.png`` when an exporter is available) under ``--out``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from interp.adapters import HookedModel
from interp.cli import flags
from interp.cli.common import run_cli
from interp.heads import ATTENTION_SCORES, head_scores, uniform_baselines
from interp.models import describe
from interp.plots import MARK_THRESHOLD, save_figure, short_name
from interp.probes import repeated_tokens
from interp.results import plural
from interp.scores import format_table

STEM = "induction"


def build_parser(prog: str = "python -m interp.induction") -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "Score every attention head as previous-token, duplicate-token and induction head "
        "on repeated random tokens, with bootstrap CIs.",
    )
    flags.add_block_flags(p, 50)
    flags.add_ci_flag(p, "confidence level of the bootstrap intervals")
    flags.add_engine_flag(p)
    return p


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    probe = repeated_tokens(model, batch=args.batch, block_len=args.seq_len, n_repeats=args.repeats, seed=args.seed)
    info = describe(model)
    t0 = time.perf_counter()
    scores = head_scores(model, probe, config=flags.run_config(args))
    elapsed = time.perf_counter() - t0
    scores.meta["model_spec"] = args.model

    kind = "causal" if info.is_causal else "encoder"
    print(
        f"{info.name} ({kind}, {info.n_layers} layers x {info.n_heads} heads); probe: "
        f"{args.batch} x ({'+'.join(probe.meta['framing'] + [f'{args.repeats}x{args.seq_len}'])}) tokens, "
        f"seed {args.seed}; scored in {elapsed:.2f}s"
    )
    print(f"engine: {scores.meta['engine_reason']}")
    if not probe.meta.get("distinct_in_block", True):
        print(
            f"note: the model has fewer ordinary tokens than the block's {args.seq_len}: tokens repeat "
            "inside a block, and every earlier occurrence counts as a target"
        )
    baselines = uniform_baselines(probe)
    scores.meta["baselines"] = {k: v for k, v in baselines.items() if k in ATTENTION_SCORES}
    print(
        "uniform-attention baselines: "
        + ", ".join(f"{name} {baselines[name]:.3f}" for name in ATTENTION_SCORES if name in baselines)
        + "\n"
    )
    ranked = scores.rank("induction", top=args.top)
    print(f"top {plural(len(ranked), 'head')} by induction score ({args.ci:.0%} bootstrap CI over sequences):")
    print(format_table(ranked, [*ATTENTION_SCORES, "copying"], ci=ATTENTION_SCORES, n_sequences=scores.n_sequences))
    for name in ATTENTION_SCORES:
        print(top_line(scores, name, baselines[name]))

    written = scores.save(out, STEM)
    fig = scores.figure(
        [*ATTENTION_SCORES, "copying"],
        title=f"{short_name(info.name)}: head scores on repeated random tokens",
        baselines=baselines,
    )
    written += save_figure(fig, out, STEM)
    return written


def top_line(scores: Any, name: str, baseline: float, threshold: float = MARK_THRESHOLD) -> str:
    """The line naming the top head of one score, or saying that none meets the role rule (its CI
    above the uniform baseline and the score at least ``threshold``): never a below-baseline "top"."""
    t = scores.table
    clears = (t[f"{name}_lo"] > baseline) & (t[name] >= threshold)
    if not clears.any():
        best = scores.rank(name, top=1).iloc[0]
        return (
            f"no {name} head: none has its CI above the uniform baseline ({baseline:.3f}) and a score of at "
            f"least {threshold:g} (highest: head {best['label']}, {best[name]:.3f})"
        )
    best = scores.rank(name)[clears.reindex(scores.rank(name).index)].iloc[0]
    return f"top {name} head: {best['label']} ({best[name]:.3f}; uniform {baseline:.3f})"


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.induction") -> int:
    return run_cli(build_parser(prog), main, argv, STEM)
