"""The text summary of a sink report, as ``interp sinks`` prints it.

:func:`sink_summary` takes the report's data (its per-head scores, its tables and ``meta``), not the
report: :meth:`interp.sinks.report.SinkReport.summary` calls it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from interp.probes import TokenProbe
from interp.results import plural
from interp.scores import HeadScores, format_table
from interp.sinks.tables import MIN_OCCURRENCES


def sink_summary(
    heads: HeadScores,
    tables: Mapping[str, pd.DataFrame],
    meta: Mapping[str, Any],
    probe: TokenProbe,
    top: int = 10,
    elapsed: float | None = None,
) -> str:
    """The text ``interp sinks`` prints: the run, Sink^eps per layer, the top sink heads, sink roles
    and tokens, and the largest massive activations (``top`` rows each). ``tables``: the report's
    ``layers``, ``tokens``, ``massive`` and ``roles`` tables by name."""
    lines = _run_lines(meta, probe, elapsed)
    lines += _layer_lines(tables["layers"], meta)
    lines += _head_lines(heads, meta, top)
    lines += _token_lines(tables["tokens"], tables["roles"], meta, top)
    lines += _massive_lines(tables["massive"], tables["layers"], meta, top)
    return "\n".join(lines)


def _run_lines(m: Mapping[str, Any], probe: TokenProbe, elapsed: float | None) -> list[str]:
    """The model, the probe, the first token and its uniform mass, the engine, the model's Sink^eps."""
    scored = "" if elapsed is None else f"; scored in {elapsed:.2f}s"
    first, eps = m["first_token"], m["epsilon"]
    framing = probe.meta.get("framing", [])
    shape = "+".join(
        [f for f in framing if f != "[SEP]"]
        + [str(probe.body_end - probe.body_start)]
        + [f for f in framing if f == "[SEP]"]
    )
    what = "random tokens" if probe.meta.get("kind") == "random_tokens" else f"text from {probe.meta.get('source')}"
    sep = m["sep_position"] is not None
    return [
        f"{m['model']} ({'causal' if m['causal'] else 'encoder'}, {m['n_layers']} layers x {m['n_heads']} "
        f"heads); probe: {probe.batch} x ({shape}) tokens of {what}, seed {m['seed']}{scored}",
        f"first token = {first}"
        + (f"; [SEP] at position {m['sep_position']}" if sep else "")
        + f"; a uniform head gives the first token {m['uniform_first_mass']:.3f}",
        f"engine: {m['engine_reason']}",
        "",
        f"Sink_0^eps (eps = {eps}): {m['sink_rate']:.1%} of heads put more than {eps} on the first token"
        + (f"; {m['sep_sink_rate']:.1%} on [SEP]" if sep else ""),
    ]


def _layer_lines(layers: pd.DataFrame, m: Mapping[str, Any]) -> list[str]:
    sep = m["sep_position"] is not None
    cols = (
        ["layer", "sink_heads", "sink_share"]
        + (["sep_sink_heads", "sep_sink_share"] if sep else [])
        + ["resid_top1", "outlier_ratio_sink", "outlier_ratio_other", "n_massive"]
    )
    return [
        "per layer: Sink^eps; largest |residual| and outlier ratio max|x| / layer median |x| at sink positions vs elsewhere:",
        layers[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"),
        "",
    ]


def _head_lines(heads: HeadScores, m: Mapping[str, Any], top: int) -> list[str]:
    ranked = heads.rank("first_mass", top=top)
    score_cols = (
        ["first_mass"]
        + (["sep_mass"] if m["sep_position"] is not None else [])
        + ["confidence", "confidence_no_first", "value_norm_ratio", "first_mass_by_norm"]
    )
    return [
        f"top {plural(len(ranked), 'sink head')} by first-token ({m['first_token']}) mass "
        f"({m['ci_level']:.0%} bootstrap CI):",
        format_table(ranked, score_cols, ci=["first_mass"], n_sequences=heads.n_sequences),
        "",
    ]


def _token_lines(tokens: pd.DataFrame, roles: pd.DataFrame, m: Mapping[str, Any], top: int) -> list[str]:
    lines = []
    if len(roles):
        lines += [
            "attention drawn by role (x uniform): "
            + ", ".join(f"{r} {v:.2f}" for r, v in zip(roles["role"], roles["attention_ratio"]))
        ]
    often = tokens[tokens["occurrences"] >= MIN_OCCURRENCES]
    rare = len(tokens) - len(often)
    toks = often.head(top)
    if rare and not len(toks):
        lines += [
            f"no sink tokens ranked: none of the {rare} tokens occurs at least {MIN_OCCURRENCES} times (a token "
            "seen fewer times is never called a sink; more or longer sequences give more repeats)",
            "",
        ]
    elif len(toks):
        lines += [
            f"top {plural(len(toks), 'sink token')} (attention x uniform; a sink draws >= {m['sink_ratio']:g} x, "
            f"or a head dumps > {m['epsilon']} on it; tokens seen at least {MIN_OCCURRENCES} times"
            + (f", {rare} rarer left out" if rare else "")
            + "):",
            toks.assign(token=toks["token"].map(repr))[
                ["token", "role", "occurrences", "mean_position", "attention_ratio", "sink_head_share", "is_sink"]
            ].to_string(index=False, float_format=lambda v: f"{v:.2f}"),
            "",
        ]
    return lines


def _massive_lines(massive: pd.DataFrame, layers: pd.DataFrame, m: Mapping[str, Any], top: int) -> list[str]:
    mas = massive.head(top)
    limits = f"|x| > {m['abs_threshold']:g} and > {m['rel_threshold']:g} x the layer output's median |x|"
    if not len(mas):
        i = int(layers["resid_top1"].to_numpy().argmax())
        return [f"no massive activations ({limits}); largest |x| {layers['resid_top1'].iloc[i]:.3g} at layer {i}"]
    return [
        f"largest {len(mas)} of {m['n_massive']} massive activations ({limits}):",
        mas.assign(token=mas["token"].map(repr))[
            ["layer", "sequence", "position", "token", "dim", "value", "magnitude_ratio", "on_sink"]
        ].to_string(index=False, float_format=lambda v: f"{v:.1f}"),
    ]


__all__ = ["sink_summary"]
