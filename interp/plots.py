"""Plotly figures of head tables: layer x head heatmaps, bar charts and curves.

Heatmaps never let a panel pick its own colours: every score belongs to a *family* with one fixed
scale shared by all its panels and drawn as a colour bar (attention masses 0..1; the copying score
-1..1, diverging around 0; ablation importance anchored at 0). Panels are sized by the model's
number of layers and heads and wrap into rows that fit a 1400-pixel window.

Every figure is saved as interactive HTML (atomically), and as PNG too when a Chrome or Chromium is
available (:mod:`interp.browser`); when none is, :func:`save_figure` says so once, in one line.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp._io import atomic_write, writing
from interp.browser import NO_BROWSER, figure_png, find_browser

if TYPE_CHECKING:  # plots draw result objects; the result objects call plots (HeadScores.figure)
    from interp.scores import HeadScores

PRETTY = {
    "prev_token": "previous-token",
    "current": "current-token",
    "duplicate": "duplicate-token",
    "induction": "induction",
    "copying": "copying",
    "first_mass": "first-token mass",
    "sep_mass": "[SEP] mass",
    "importance": "importance",
    "metric_ablated": "metric when ablated",
}
MAX_WIDTH = 1380  # figures fit a 1400-pixel window


@dataclass(frozen=True)
class Scale:
    """A colour scale shared by every panel of one score family.

    ``zmin``/``zmax`` of ``None`` follow the data; ``anchor`` pins one end at that value (or, when
    the data cross it, centres a diverging scale on it)."""

    title: str
    colorscale: str = "Viridis"
    zmin: float | None = None
    zmax: float | None = None
    zmid: float | None = None
    anchor: float | None = None

    def limits(self, values: np.ndarray) -> tuple[float, float, float | None, str]:
        """``(zmin, zmax, zmid, colorscale)`` for these values."""
        finite = values[np.isfinite(values)]
        lo = float(finite.min()) if finite.size else 0.0
        hi = float(finite.max()) if finite.size else 1.0
        if self.anchor is not None:
            a = self.anchor
            if lo < a < hi:  # both signs: diverging around the anchor
                r = max(hi - a, a - lo)
                return a - r, a + r, a, "RdBu_r"
            lo, hi = (a, max(hi, a + 1e-12)) if lo >= a else (min(lo, a - 1e-12), a)
        zmin = lo if self.zmin is None else self.zmin
        zmax = hi if self.zmax is None else self.zmax
        if zmax <= zmin:
            zmax = zmin + 1e-12
        return zmin, zmax, self.zmid, self.colorscale


MASS = Scale("attention mass", zmin=0.0, zmax=1.0)
SIGNED = Scale("copying score", colorscale="RdBu_r", zmin=-1.0, zmax=1.0, zmid=0.0)
IMPORTANCE = Scale("importance", colorscale="Viridis", anchor=0.0)
FAMILIES: dict[str, Scale] = {
    "prev_token": MASS,
    "current": MASS,
    "duplicate": MASS,
    "induction": MASS,
    "first_mass": MASS,
    "sep_mass": MASS,
    "copying": SIGNED,
    "importance": IMPORTANCE,
}


def short_name(name: str) -> str:
    """A model's name for titles: a local path shortened to its last folder; Hub names as they are."""
    text = str(name).rstrip("/\\")
    if text.startswith(("/", "./", "../", "~")) or text.count("/") >= 2 or "\\" in text:
        return Path(text.replace("\\", "/")).name or text
    return text


def panel_size(n_layers: int, n_heads: int) -> tuple[int, int, int]:
    """``(width, height, cell)`` in pixels of one layer x head panel: cells shrink as models grow."""
    cell = int(min(56, max(12, 420 // max(n_layers, n_heads, 1))))
    return max(160, cell * n_heads), max(150, cell * n_layers), cell


def heatmap(
    scores: HeadScores,
    columns: Sequence[str] | None = None,
    *,
    title: str | None = None,
    baselines: Mapping[str, float] | None = None,
    scales: Mapping[str, Scale] | None = None,
    zmin: float | None = None,
    zmax: float | None = None,
    colorscale: str | None = None,
    value_name: str = "value",
    max_width: int = MAX_WIDTH,
) -> go.Figure:
    """One layer x head panel per score, one fixed colour scale (and colour bar) per score family.

    Hovering a cell shows the head, the value, its CI and the uniform baseline. ``baselines``
    (``{score: value}``, e.g. what a uniformly attending head scores) are written under the panel
    titles, and a dot marks each head whose CI lies wholly above its score's baseline. ``scales``
    overrides the family of a column; ``zmin``/``zmax``/``colorscale`` put every panel on one
    given scale, whose colour bar is titled ``value_name``.
    """
    columns = [columns] if isinstance(columns, str) else list(columns or scores.score_names)  # "induction": one
    baselines = dict(baselines or {})
    if zmin is not None or zmax is not None or colorscale is not None:
        fixed = Scale(value_name, colorscale or "Viridis", zmin, zmax)
        family = {c: fixed for c in columns}
    else:
        family = {c: (scales or {}).get(c) or FAMILIES.get(c) or Scale(PRETTY.get(c, c)) for c in columns}
    groups: dict[Scale, list[str]] = {}
    for c in columns:
        groups.setdefault(family[c], []).append(c)

    L, H = scores.n_layers, scores.n_heads
    pw, ph, cell = panel_size(L, H)
    gap_x, gap_y, left, top, bottom, bar = 64, 96, 70, 110 if title else 60, 56, 110
    n_cols = max(1, min(len(columns), (max_width - left - bar * len(groups) + gap_x) // (pw + gap_x)))
    n_rows = math.ceil(len(columns) / n_cols)
    plot_w, plot_h = n_cols * pw + (n_cols - 1) * gap_x, n_rows * ph + (n_rows - 1) * gap_y
    titles = [_panel_title(c, baselines) for c in columns]
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        subplot_titles=titles,
        horizontal_spacing=gap_x / plot_w if n_cols > 1 else 0.0,
        vertical_spacing=gap_y / plot_h if n_rows > 1 else 0.0,
    )
    axis_of = {scale: f"coloraxis{'' if i == 0 else i + 1}" for i, scale in enumerate(groups)}
    for i, col in enumerate(columns):
        r, c = divmod(i, n_cols)
        fixed = family[col].zmin is not None and family[col].zmax is not None  # 0..1-like: two decimals read best
        digits = ".2f" if fixed else ".3g"
        _add_panel(fig, scores, col, axis_of[family[col]], baselines.get(col), r + 1, c + 1, L, H, cell, digits)
    for i, (scale, cols) in enumerate(groups.items()):
        values = np.concatenate([scores.grid(c).ravel() for c in cols])
        lo, hi, mid, cs = scale.limits(values)
        fig.layout[axis_of[scale]] = dict(
            colorscale=cs,
            cmin=lo,
            cmax=hi,
            cmid=mid,
            colorbar=dict(
                title=dict(text=scale.title, side="right"),
                x=1.0 + (16 + i * bar) / plot_w,
                xanchor="left",
                y=1.0,
                yanchor="top",
                len=min(1.0, max(ph, 150) / plot_h),
                thickness=14,
            ),
        )
    fig.update_layout(
        title=dict(text=title, x=0.0, xanchor="left", xref="paper") if title else None,
        width=max(560 if title else 0, left + plot_w + bar * len(groups)),
        height=top + plot_h + bottom,
        margin=dict(l=left, r=bar * len(groups), t=top, b=bottom),
        showlegend=False,
        plot_bgcolor="white",
    )
    return fig


NOTES = {"copying": "+1 copies the attended token, -1 suppresses it"}


def _panel_title(col: str, baselines: Mapping[str, float]) -> str:
    name = PRETTY.get(col, col)
    note = f"uniform {baselines[col]:.3f}; dot: CI above it" if col in baselines else NOTES.get(col)
    return f"{name}<br><span style='font-size:11px'>{note}</span>" if note else name


def _add_panel(
    fig: go.Figure,
    scores: HeadScores,
    col: str,
    coloraxis: str,
    baseline: float | None,
    row: int,
    cell_col: int,
    L: int,
    H: int,
    cell: int,
    digits: str,
) -> None:
    z = scores.grid(col)
    name = PRETTY.get(col, col)
    if scores.has_ci(col):
        lo, hi = scores.grid(f"{col}_lo"), scores.grid(f"{col}_hi")
        text = np.vectorize(lambda v, a, b: f"{v:.3g} [{a:.3g}, {b:.3g}]")(z, lo, hi)
    else:
        lo = hi = None
        text = np.vectorize(lambda v: f"{v:.3g}")(z)
    if baseline is not None:
        text = np.char.add(text.astype(str), f"<br>uniform: {baseline:.3g}")
    label = np.vectorize(lambda l, h: f"{l}.{h}")(*np.meshgrid(np.arange(L), np.arange(H), indexing="ij"))
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=np.arange(H),
            y=np.arange(L),
            text=text,
            customdata=label,
            coloraxis=coloraxis,
            texttemplate=f"%{{z:{digits}}}" if cell >= 40 else None,
            textfont=dict(size=11),
            hovertemplate=f"head %{{customdata}}<br>{name}: %{{text}}<extra></extra>",
            xgap=1,
            ygap=1,
        ),
        row=row,
        col=cell_col,
    )
    if baseline is not None and lo is not None:
        layer, head = np.nonzero(lo > baseline)
        if len(layer):
            fig.add_trace(
                go.Scatter(  # in the cell's corner, clear of its value
                    x=head + 0.34,
                    y=layer - 0.3,
                    mode="markers",
                    marker=dict(size=max(3, min(7, cell // 6)), color="white", line=dict(color="black", width=1)),
                    hoverinfo="skip",
                ),
                row=row,
                col=cell_col,
            )
    tick = max(1, math.ceil(18 / cell))
    fig.update_xaxes(
        title_text="head", dtick=tick, range=[-0.5, H - 0.5], showgrid=False, zeroline=False, row=row, col=cell_col
    )
    fig.update_yaxes(
        title_text="layer", dtick=tick, range=[L - 0.5, -0.5], showgrid=False, zeroline=False, row=row, col=cell_col
    )


def bars(frame: pd.DataFrame, x: str, y: str, *, title: str | None = None, y_title: str | None = None) -> go.Figure:
    """A plain bar chart of one column against another (e.g. Sink_k^eps per layer)."""
    fig = go.Figure(go.Bar(x=frame[x], y=frame[y], hovertemplate=f"{x} %{{x}}<br>{y}: %{{y:.3f}}<extra></extra>"))
    width = int(min(MAX_WIDTH, max(560, 160 + 28 * len(frame))))
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y_title or y, height=420, width=width)
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
    fig.update_layout(title=title, xaxis_title=x_title or x, yaxis_title=y_title or y, height=460, width=760)
    if log_y:
        fig.update_yaxes(type="log")
    return fig


_PNG_NOTE: list[str] = []  # why PNGs are not written, said once per process


def save_png(fig: go.Figure, path: str | Path) -> Path | None:
    """Write ``fig`` as a PNG at ``path`` through a Chrome/Chromium found here; ``None`` when none is.

    The first failure (no browser, or the export failing) is said once, in one line on stderr, and
    later calls skip the attempt. ``INTERP_PNG=0`` in the environment turns PNG export off (the
    tests do, to stay fast).
    """
    if (
        _PNG_NOTE or os.environ.get("INTERP_PNG", "1") == "0" or not writing()
    ):  # not on the other ranks of a torchrun run
        return None
    browser = find_browser()
    try:
        if browser is None:
            raise RuntimeError(NO_BROWSER)
        return atomic_write(Path(path), figure_png(fig, browser))
    except RuntimeError as e:
        _PNG_NOTE.append(str(e))
        print(f"PNG export skipped: {' '.join(str(e).split())}", file=sys.stderr)
        return None


def save_figure(fig: go.Figure, out_dir: str | Path, stem: str, *, png: bool = True) -> list[Path]:
    """Write ``<stem>.html`` (always) and ``<stem>.png`` (see :func:`save_png`); return the paths.

    The HTML loads ``plotly.min.js`` from the same folder (written once): offline and small.
    """
    out_dir = Path(out_dir)
    js = out_dir / "plotly.min.js"
    if not js.exists():
        from plotly.offline import get_plotlyjs

        atomic_write(js, get_plotlyjs())
    html = fig.to_html(include_plotlyjs="plotly.min.js", full_html=True)
    written = [atomic_write(out_dir / f"{stem}.html", html)]
    image = save_png(fig, out_dir / f"{stem}.png") if png else None
    return written + ([image] if image else [])
