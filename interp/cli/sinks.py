"""``python -m interp.sinks`` / ``interp sinks``: attention-sink heads, sink tokens and massive activations.

A thin layer over :func:`interp.sinks.sink_scores` and the sink figures."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from interp.cli.common import add_engine_flag, base_parser, float_in, format_table, positive_int, run_cli
from interp.errors import UsageError
from interp.models import ModelInfo, describe
from interp.plots import save_figure
from interp.probes import TokenProbe, random_tokens, text_probe
from interp.sinks import (
    ABS_THRESHOLD,
    EPSILON,
    REL_THRESHOLD,
    SINK_RATIO,
    SinkReport,
    first_mass_heatmap,
    residual_curves,
    sink_rate_bars,
    sink_scores,
)

STEM = "sinks"


def build_parser(prog: str = "python -m interp.sinks") -> argparse.ArgumentParser:
    p = base_parser(
        prog,
        "Find attention-sink heads, the tokens they park attention on, and the massive "
        "residual activations behind them.",
    )
    p.set_defaults(batch=16)
    p.add_argument(
        "--probe",
        choices=["random", "text"],
        default=None,
        help="random tokens (Gu et al.) or natural text (default: text with --dataset, else random)",
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="text probe source: a Hub data set NAME[:CONFIG] or a local .txt/.json/.csv file "
        "(default: the bundled English text in data/text)",
    )
    p.add_argument("--split", default="train", help="--dataset split")
    p.add_argument("--text-column", default="text", help="--dataset column holding the text")
    p.add_argument("--seq-len", type=positive_int, default=64, help="body tokens per sequence")
    p.add_argument(
        "--epsilon",
        type=float_in(0, 1, low_open=True, high_open=True),
        default=EPSILON,
        help="Sink_k^eps threshold on a head's mass",
    )
    p.add_argument(
        "--sink-ratio",
        type=float_in(0, low_open=True),
        default=SINK_RATIO,
        help="a token is a sink when it draws this many times a uniform head's attention",
    )
    p.add_argument(
        "--abs-threshold",
        type=float_in(0, low_open=True),
        default=ABS_THRESHOLD,
        help="massive activation: |x| above this",
    )
    p.add_argument(
        "--rel-threshold",
        type=float_in(0, low_open=True),
        default=REL_THRESHOLD,
        help="massive activation: |x| above this times its hidden state's median |x|",
    )
    p.add_argument("--minibatch", type=positive_int, default=None, help="sequences per forward pass")
    add_engine_flag(p)
    return p


def main(args: argparse.Namespace, model: Any, out: Path) -> list[Path]:
    kind = args.probe or ("text" if args.dataset else "random")
    if kind == "random" and args.dataset:
        raise UsageError("--dataset needs --probe text")
    if kind == "text":
        probe = text_probe(
            model,
            batch=args.batch,
            seq_len=args.seq_len,
            seed=args.seed,
            dataset=args.dataset,
            split=args.split,
            text_column=args.text_column,
        )
    else:
        probe = random_tokens(model, batch=args.batch, seq_len=args.seq_len, seed=args.seed)
    info = describe(model)
    t0 = time.perf_counter()
    report = sink_scores(
        model,
        probe,
        epsilon=args.epsilon,
        abs_threshold=args.abs_threshold,
        rel_threshold=args.rel_threshold,
        sink_ratio=args.sink_ratio,
        seed=args.seed,
        minibatch=args.minibatch,
        progress=not args.no_progress,
        engine=args.engine,
    )
    elapsed = time.perf_counter() - t0
    report.meta["model_spec"] = report.heads.meta["model_spec"] = args.model
    print(_summary(report, info, probe, args.top, elapsed))

    written = report.save(out, STEM)
    for suffix, fig in (
        ("heatmap", first_mass_heatmap(report)),
        ("layers", sink_rate_bars(report)),
        ("residual", residual_curves(report)),
    ):
        written += save_figure(fig, out, f"{STEM}_{suffix}")
    return written


def _summary(report: SinkReport, info: ModelInfo, probe: TokenProbe, top: int, elapsed: float) -> str:
    m = report.meta
    first, eps = m["first_token"], m["epsilon"]
    framing = probe.meta.get("framing", [])
    shape = "+".join(
        [f for f in framing if f != "[SEP]"]
        + [str(probe.body_end - probe.body_start)]
        + [f for f in framing if f == "[SEP]"]
    )
    what = "random tokens" if probe.meta.get("kind") == "random_tokens" else f"text from {probe.meta.get('source')}"
    sep = m["sep_position"] is not None
    lines = [
        f"{info.name} ({'causal' if info.is_causal else 'encoder'}, {info.n_layers} layers x {info.n_heads} "
        f"heads); probe: {probe.batch} x ({shape}) tokens of {what}, seed {m['seed']}; scored in {elapsed:.2f}s",
        f"first token = {first}"
        + (f"; [SEP] at position {m['sep_position']}" if sep else "")
        + f"; a uniform head gives the first token {m['uniform_first_mass']:.3f}",
        f"engine: {m['engine_reason']}",
        "",
        f"Sink_0^eps (eps = {eps}): {m['sink_rate']:.1%} of heads put more than {eps} on the first token"
        + (f"; {m['sep_sink_rate']:.1%} on [SEP]" if sep else ""),
        "per layer: Sink^eps; largest |residual| and outlier ratio max|x|/median|x| at sink positions vs elsewhere:",
    ]
    lay = report.layers
    cols = (
        ["layer", "sink_heads", "sink_share"]
        + (["sep_sink_heads", "sep_sink_share"] if sep else [])
        + ["resid_top1", "outlier_ratio_sink", "outlier_ratio_other", "n_massive"]
    )
    lines += [lay[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"), ""]

    ranked = report.heads.rank("first_mass", top=top)
    score_cols = (
        ["first_mass"]
        + (["sep_mass"] if sep else [])
        + ["confidence", "confidence_no_first", "value_norm_ratio", "first_mass_by_norm"]
    )
    lines += [
        f"top {len(ranked)} sink heads by first-token ({first}) mass ({m['ci_level']:.0%} bootstrap CI):",
        format_table(ranked, score_cols, ci=["first_mass"]),
        "",
    ]

    roles = report.roles()
    if len(roles):
        lines += [
            "attention drawn by role (x uniform): "
            + ", ".join(f"{r} {v:.2f}" for r, v in zip(roles["role"], roles["attention_ratio"]))
        ]
    toks = report.tokens.head(top)
    if len(toks):
        lines += [
            f"top {len(toks)} sink tokens (attention x uniform; a sink draws >= {m['sink_ratio']:g} x, "
            f"or a head dumps > {eps} on it):",
            toks.assign(token=toks["token"].map(repr))[
                ["token", "role", "occurrences", "mean_position", "attention_ratio", "sink_head_share", "is_sink"]
            ].to_string(index=False, float_format=lambda v: f"{v:.2f}"),
            "",
        ]

    mas = report.massive.head(top)
    limits = f"|x| > {m['abs_threshold']:g} and > {m['rel_threshold']:g} x the median of its hidden state"
    if len(mas):
        lines += [
            f"largest {len(mas)} of {m['n_massive']} massive activations ({limits}):",
            mas.assign(token=mas["token"].map(repr))[
                ["layer", "sequence", "position", "token", "dim", "value", "magnitude_ratio", "on_sink"]
            ].to_string(index=False, float_format=lambda v: f"{v:.1f}"),
        ]
    else:
        i = int(lay["resid_top1"].to_numpy().argmax())
        lines.append(f"no massive activations ({limits}); largest |x| {lay['resid_top1'].iloc[i]:.3g} at layer {i}")
    return "\n".join(lines)


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.sinks") -> int:
    return run_cli(build_parser(prog), main, argv, STEM)


if __name__ == "__main__":
    sys.exit(cli())
