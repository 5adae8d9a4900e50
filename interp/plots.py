"""Plotly figures of head tables: layer x head heatmaps, bar charts and curves.

Every figure is saved as self-contained interactive HTML (atomically), and as PNG too when a static
exporter (kaleido with a usable browser) is available; :func:`save_figure` says which it wrote.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp._io import atomic_write
from interp.scores import HeadScores

_PNG_OK: bool | None = None  # learnt on first use: is a static exporter available?

PRETTY = {
    "prev_token": "previous-token",
    "duplicate": "duplicate-token",
    "induction": "induction",
    "copying": "copying",
    "first_mass": "first-token mass",
    "sep_mass": "[SEP] mass",
}


def heatmap(
    scores: HeadScores,
    columns: Sequence[str] | None = None,
    *,
    title: str | None = None,
    zmin: float | None = None,
    zmax: float | None = None,
    colorscale: str = "Viridis",
) -> go.Figure:
    """One layer x head panel per score; hovering a cell shows the head, value and CI."""
    columns = list(columns or scores.score_names)
    fig = make_subplots(
        rows=1,
        cols=len(columns),
        subplot_titles=[PRETTY.get(c, c) for c in columns],
        horizontal_spacing=0.08 if len(columns) > 1 else 0.0,
    )
    heads = np.arange(scores.n_heads)
    layers = np.arange(scores.n_layers)
    for i, col in enumerate(columns, start=1):
        z = scores.grid(col)
        if scores.has_ci(col):
            lo, hi = scores.grid(f"{col}_lo"), scores.grid(f"{col}_hi")
            text = np.vectorize(lambda v, a, b: f"{v:.3f} [{a:.3f}, {b:.3f}]")(z, lo, hi)
        else:
            text = np.vectorize(lambda v: f"{v:.3f}")(z)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=heads,
                y=layers,
                text=text,
                zmin=zmin,
                zmax=zmax,
                colorscale=colorscale,
                showscale=(i == len(columns)),
                hovertemplate=f"head %{{y}}.%{{x}}<br>{PRETTY.get(col, col)}: %{{text}}<extra></extra>",
            ),
            row=1,
            col=i,
        )
        fig.update_xaxes(title_text="head", row=1, col=i, dtick=max(1, scores.n_heads // 12))
        fig.update_yaxes(
            title_text="layer" if i == 1 else None,
            row=1,
            col=i,
            autorange="reversed",
            dtick=max(1, scores.n_layers // 12),
        )
    fig.update_layout(title=title, height=320 + 18 * scores.n_layers, width=max(480, 380 * len(columns)))
    return fig


def bars(frame: pd.DataFrame, x: str, y: str, *, title: str | None = None, y_title: str | None = None) -> go.Figure:
    """A plain bar chart of one column against another (e.g. Sink_k^eps per layer)."""
    fig = go.Figure(go.Bar(x=frame[x], y=frame[y], hovertemplate=f"{x} %{{x}}<br>{y}: %{{y:.3f}}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y_title or y, height=420, width=640)
    return fig


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
) -> go.Figure:
    """Lines of ``y`` against ``x``, one per value of ``group`` (e.g. pruning curves by order)."""
    fig = go.Figure()
    groups = [(None, frame)] if group is None else list(frame.groupby(group, sort=False))
    for name, part in groups:
        fig.add_trace(go.Scatter(x=part[x], y=part[y], mode="lines+markers", name=None if name is None else str(name)))
    fig.update_layout(title=title, xaxis_title=x_title or x, yaxis_title=y_title or y, height=460, width=720)
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def save_figure(fig: go.Figure, out_dir: str | Path, stem: str, *, png: bool = True) -> list[Path]:
    """Write ``<stem>.html`` (always) and ``<stem>.png`` (when an exporter works); return the paths."""
    global _PNG_OK
    out_dir = Path(out_dir)
    js = out_dir / "plotly.min.js"  # shared by every figure in the folder: offline and small
    if not js.exists():
        from plotly.offline import get_plotlyjs

        atomic_write(js, get_plotlyjs())
    html = fig.to_html(include_plotlyjs="plotly.min.js", full_html=True)
    written = [atomic_write(out_dir / f"{stem}.html", html)]
    if png and _PNG_OK is not False:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                data = fig.to_image(format="png")
            written.append(atomic_write(out_dir / f"{stem}.png", data))
            _PNG_OK = True
        except Exception:  # no kaleido, or kaleido without a browser: HTML only
            _PNG_OK = False
    return written
