"""Figures of named rows and columns, bars and curves, on the toolkit's template."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp.plots.style import (
    DASHES,
    MAX_WIDTH,
    SYMBOLS,
    Scale,
    cell_text,
    noise_layer,
    noise_mask,
    refuse_greys,
    styled,
    title_width,
)


def labelled_heatmap(
    z: np.ndarray,
    x: Sequence[str],
    y: Sequence[str],
    scale: Scale,
    *,
    lo: np.ndarray | None = None,
    hi: np.ndarray | None = None,
    floor: float | None = None,
    title: str | None = None,
    x_title: str,
    y_title: str,
    x_name: str,
    y_name: str,
) -> go.Figure:
    """A heatmap whose rows and columns are named (heads ``"0.10"``, receivers, tokens): both axes
    categorical, so that no label is read as a number (``"0.1"`` and ``"0.10"`` are two ticks) and
    every tick is a label. Coloured on ``scale``, with the cells inside the noise floor ``floor``
    (``|value| <= floor`` or the CI ``[lo, hi]`` reaching 0) drawn :data:`NEUTRAL`; the hover names
    the row and column (``y_name``, ``x_name``) and gives the value with its CI."""
    if floor is not None:
        refuse_greys(scale, scale.title)
    noise = noise_mask(z, floor, lo, hi)
    text = cell_text(z, lo, hi, noise)
    zmin, zmax, zmid, colorscale = scale.limits(np.where(noise, np.nan, z))
    fig = go.Figure([noise_layer(noise, x, y)] if noise.any() else [])
    fig.add_trace(
        go.Heatmap(
            z=np.where(noise, np.nan, z),
            x=list(x),
            y=list(y),
            text=text,
            zmin=zmin,
            zmax=zmax,
            zmid=zmid,
            colorscale=colorscale,
            colorbar={"title": {"text": scale.title, "side": "right"}},
            hovertemplate=f"{y_name} %{{y}}<br>{x_name} %{{x}}<br>%{{text}}<extra></extra>",
            xgap=1,
            ygap=1,
        )
    )
    note = f"noise floor {floor:.3g}: grey cells lie inside it or their CI reaches 0" if floor is not None else None
    fig.update_layout(
        title=title if note is None else f"{title or ''}<br><span style='font-size:11px'>{note}</span>",
        xaxis_title=x_title,
        yaxis_title=y_title,
        width=int(min(MAX_WIDTH, max(560, title_width(title), 240 + 22 * len(x)))),
        height=int(max(360, 200 + 18 * len(y))),
        plot_bgcolor="white",
    )
    fig.update_xaxes(type="category", showgrid=False, zeroline=False)
    fig.update_yaxes(type="category", autorange="reversed", showgrid=False, zeroline=False)
    return styled(fig)


def _integer_axis(values: pd.Series | np.ndarray) -> dict | None:
    """Axis settings for integer data (layers, heads kept): whole-number ticks only, never 0.5."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    if v.empty or not np.allclose(v, np.round(v)):
        return None
    span = float(v.max() - v.min())
    return dict(tickmode="linear", tick0=float(v.min()), dtick=max(1, math.ceil(span / 12)), tickformat="d")


def bars(frame: pd.DataFrame, x: str, y: str, *, title: str | None = None, y_title: str | None = None) -> go.Figure:
    """A plain bar chart of one column against another (e.g. Sink_k^eps per layer)."""
    fig = go.Figure(go.Bar(x=frame[x], y=frame[y], hovertemplate=f"{x} %{{x}}<br>{y}: %{{y:.3f}}<extra></extra>"))
    width = int(min(MAX_WIDTH, max(560, title_width(title), 160 + 28 * len(frame))))
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y_title or y, height=420, width=width)
    ints = _integer_axis(frame[x])
    if ints:
        fig.update_xaxes(**ints)
    return styled(fig)


def curves(
    frame: pd.DataFrame,
    x: str,
    y: str,
    group: str | None = None,
    *,
    title: str | None = None,
    x_title: str | None = None,
    y_title: str | None = None,
    log_y: bool = False,
    band: tuple[float, float, str] | None = None,
) -> go.Figure:
    """Lines of ``y`` against ``x``, one per value of ``group`` (e.g. pruning curves by order).

    Each line has its own dash and marker, so one that runs on top of another stays visible.
    ``band=(y0, y1, label)`` shades a horizontal band (e.g. a tolerance around the unpruned metric).
    """
    fig = go.Figure()
    groups = [(None, frame)] if group is None else list(frame.groupby(group, sort=False))
    for i, (name, part) in enumerate(groups):
        fig.add_trace(
            go.Scatter(
                x=part[x],
                y=part[y],
                mode="lines+markers",
                name=None if name is None else str(name),
                line=dict(dash=DASHES[i % len(DASHES)], width=2.5 if i == 0 else 2),
                marker=dict(symbol=SYMBOLS[i % len(SYMBOLS)], size=8 if i == 0 else 6),
            )
        )
    if band is not None:
        y0, y1, label = band
        fig.add_hrect(
            y0=min(y0, y1),
            y1=max(y0, y1),
            fillcolor="#2ca02c",
            opacity=0.12,
            line_width=0,
            layer="below",
            annotation_text=label,
            annotation_position="top left",
        )
    fig.update_layout(
        title=title,
        xaxis_title=x_title or x,
        yaxis_title=y_title or y,
        height=460,
        width=max(760, title_width(title)),
    )
    ints = _integer_axis(frame[x])
    if ints:
        fig.update_xaxes(**ints)
    if log_y:
        fig.update_yaxes(type="log")
    return styled(fig)
