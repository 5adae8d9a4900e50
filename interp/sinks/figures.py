"""Sink figures: first-token mass heatmap, Sink^eps per layer, residual magnitudes by layer.

Each takes the data it draws (the per-head scores or the ``layers`` table of a sink report, and its
``meta``), not the report: :class:`~interp.sinks.report.SinkReport` calls them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from interp.plots import bars, curves, heatmap, short_name
from interp.scores import HeadScores


def first_mass_heatmap(heads: HeadScores, meta: Mapping[str, Any]) -> go.Figure:
    """Layer x head heatmap of first-token mass (and [SEP] mass for encoders), on a 0..1 scale."""
    first = meta["first_token"]
    cols = ["first_mass"] + (["sep_mass"] if "sep_mass" in heads.table else [])
    return heatmap(
        heads,
        cols,
        baselines={"first_mass": meta["uniform_first_mass"]},
        title=f"{short_name(meta['model'])}: attention mass on the first token ({first})"
        + (" and on [SEP]" if len(cols) > 1 else ""),
    )


def sink_rate_bars(layers: pd.DataFrame, meta: Mapping[str, Any]) -> go.Figure:
    """Sink_k^eps per layer (the ``layers`` table): the share of heads whose mass on the first token
    (and [SEP]) exceeds eps."""
    eps, first, rate = meta["epsilon"], meta["first_token"], float(meta["sink_rate"])
    fig = bars(
        layers,
        "layer",
        "sink_share",
        title=f"{short_name(meta['model'])}: Sink^eps per layer (eps = {eps}; model: {rate:.0%})",
        y_title=f"share of heads with mass > {eps}",
    )
    fig.data[0].name = f"first token ({first})"
    if "sep_sink_share" in layers:
        fig.add_trace(go.Bar(x=layers["layer"], y=layers["sep_sink_share"], name="[SEP]"))
        fig.update_layout(barmode="group", showlegend=True)
    fig.update_yaxes(range=[0, 1])
    fig.update_xaxes(dtick=1)
    return fig


def residual_curves(layers: pd.DataFrame, meta: Mapping[str, Any]) -> go.Figure:
    """The largest three residual magnitudes and the median, by layer (Sun et al.'s figure), log scale."""
    cols = ["resid_top1", "resid_top2", "resid_top3", "resid_median"]
    long = layers.melt(id_vars="layer", value_vars=cols, var_name="magnitude", value_name="value")
    long["magnitude"] = long["magnitude"].map(
        {"resid_top1": "top 1", "resid_top2": "top 2", "resid_top3": "top 3", "resid_median": "median"}
    )
    fig = curves(
        long,
        "layer",
        "value",
        "magnitude",
        log_y=True,
        y_title="|residual| (mean over sequences)",
        title=f"{short_name(meta['model'])}: largest residual-stream magnitudes by layer",
    )
    # the two thresholds a massive activation must pass (Sun et al. 2024): |x| above abs_threshold, and
    # above rel_threshold x the median |x| of the sequence's whole layer output (mean over sequences)
    absolute, relative = float(meta["abs_threshold"]), float(meta["rel_threshold"])
    fig.add_hline(
        y=absolute,
        line=dict(color="#c0392b", dash="dash", width=1.5),
        annotation_text=f"|x| = {absolute:g} (massive above)",
        annotation_position="top left",
    )
    fig.add_trace(
        go.Scatter(
            x=layers["layer"],
            y=relative * layers["resid_median"],
            mode="lines",
            name=f"{relative:g} x layer median",
            line=dict(color="#7f7f7f", dash="dot", width=1.5),
        )
    )
    return fig
