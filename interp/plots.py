"""Plotly figures of head tables: layer x head heatmaps, bar charts and curves.

Heatmaps never let a panel pick its own colours: every score belongs to a *family* with one fixed
scale shared by all its panels and drawn as a colour bar (attention masses 0..1; the copying score
-1..1, diverging around 0; ablation importance anchored at 0). Panels are sized by the model's
number of layers and heads and wrap into rows that fit a 1280-pixel window. On a panel with a noise
floor, grey means "inside the floor" and nothing else: its colour scale holds no grey (:func:`grey_free`).

Every figure is saved as interactive, self-contained HTML (plotly.js inlined, atomically), and as PNG too when a Chrome or Chromium is
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
MAX_WIDTH = 1200  # figures fit a 1280-pixel window with its scrollbar and a page's margins
MARK_THRESHOLD = 0.3  # the role rule's effect size: a mark needs the CI above the baseline and this much score
NEUTRAL = "#d5d9de"  # cells inside an importance's noise floor
GREY_CHROMA = 48  # a colour whose channels differ by less than this (of 255) reads as grey beside NEUTRAL
# RdBu_r without its white middle: a diverging scale on which no colour is grey, for panels where grey
# means "inside the noise floor" (the floor's cells are drawn in NEUTRAL, the rest never look like them)
DIVERGING = (
    (0.0, "#053061"),
    (0.25, "#2166ac"),
    (0.5, "#92c5de"),
    (0.5, "#f4a582"),
    (0.75, "#d6604d"),
    (1.0, "#67001f"),
)
# one template for every figure the toolkit draws: heatmaps, bars, curves, the sinks and gate plots;
# strings that look like numbers (head labels "0.1" and "0.10") stay strings, as plotly's own template has it
TEMPLATE = go.layout.Template(
    layout=dict(
        autotypenumbers="strict",
        font=dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=13, color="#1f2933"),
        title=dict(x=0.0, xanchor="left", font=dict(size=16)),
        paper_bgcolor="white",
        plot_bgcolor="white",
        colorway=["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"],
        xaxis=dict(showline=True, linecolor="#9aa5b1", gridcolor="#eef2f6", zeroline=False, ticks="outside"),
        yaxis=dict(showline=True, linecolor="#9aa5b1", gridcolor="#eef2f6", zeroline=False, ticks="outside"),
        legend=dict(bgcolor="rgba(255,255,255,0.8)"),
        hoverlabel=dict(font=dict(size=12)),
    )
)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x")


def styled(fig: go.Figure) -> go.Figure:
    """``fig`` on the toolkit's one :data:`TEMPLATE` (every figure builder ends here)."""
    fig.update_layout(template=TEMPLATE)
    return fig


def title_width(title: str | None, left: int = 70) -> int:
    """The width a figure needs so that its title is not cut off (plain text, about 8 px a character)."""
    import re

    if not title:
        return 0
    longest = max(len(re.sub(r"<[^>]+>", "", line)) for line in re.split(r"<br\s*/?>", title))
    return int(left + 8.5 * longest + 20)


@dataclass(frozen=True)
class Scale:
    """A colour scale shared by every panel of one score family.

    ``zmin``/``zmax`` of ``None`` follow the data; ``anchor`` pins one end at that value (or, when
    the data cross it, centres the ``diverging`` scale on it)."""

    title: str
    colorscale: str | tuple = "Viridis"
    zmin: float | None = None
    zmax: float | None = None
    zmid: float | None = None
    anchor: float | None = None
    diverging: str | tuple = "RdBu_r"

    def limits(self, values: np.ndarray) -> tuple[float, float, float | None, str | tuple]:
        """``(zmin, zmax, zmid, colorscale)`` for these values."""
        finite = values[np.isfinite(values)]
        lo = float(finite.min()) if finite.size else 0.0
        hi = float(finite.max()) if finite.size else 1.0
        if self.anchor is not None:
            a = self.anchor
            if lo < a < hi:  # both signs: diverging around the anchor
                r = max(hi - a, a - lo)
                return a - r, a + r, a, self.diverging
            lo, hi = (a, max(hi, a + 1e-12)) if lo >= a else (min(lo, a - 1e-12), a)
        zmin = lo if self.zmin is None else self.zmin
        zmax = hi if self.zmax is None else self.zmax
        if zmax <= zmin:
            zmax = zmin + 1e-12
        return zmin, zmax, self.zmid, self.colorscale


MASS = Scale("attention mass", zmin=0.0, zmax=1.0)
SIGNED = Scale("copying score", colorscale="RdBu_r", zmin=-1.0, zmax=1.0, zmid=0.0)
IMPORTANCE = Scale("importance", colorscale="Viridis", anchor=0.0, diverging=DIVERGING)
# a patching or path effect: the fraction of the clean-corrupted gap moved, -1..1 whatever the data
# (an effect of 1e-8 is pale, not saturated); no grey on it, for grey marks the noise floor
EFFECT = Scale("effect (fraction of the gap)", colorscale=DIVERGING, zmin=-1.0, zmax=1.0, zmid=0.0)
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


def _rgb(colour: str) -> tuple[float, float, float]:
    from plotly.colors import hex_to_rgb, unlabel_rgb

    return tuple(float(v) for v in (hex_to_rgb(colour) if colour.startswith("#") else unlabel_rgb(colour))[:3])


def colour_at(colorscale: str | Sequence, t: float) -> tuple[float, float, float]:
    """The RGB colour (0..255) that ``colorscale`` (a plotly name or ``[(position, colour), ...]``)
    gives at ``t`` in 0..1, interpolated linearly as plotly.js does; at a repeated position the
    upper colour wins."""
    from plotly.colors import get_colorscale

    stops = [
        (float(p), _rgb(c)) for p, c in (get_colorscale(colorscale) if isinstance(colorscale, str) else colorscale)
    ]
    t = min(1.0, max(0.0, float(t)))
    for (p0, c0), (p1, c1) in zip(stops, stops[1:]):
        if p0 <= t < p1 or (t == p1 == stops[-1][0]):
            w = (t - p0) / (p1 - p0)
            return tuple(a + w * (b - a) for a, b in zip(c0, c1))
    return stops[-1][1] if t >= stops[-1][0] else stops[0][1]


def grey_free(colorscale: str | Sequence, samples: int = 401) -> bool:
    """Whether no colour of ``colorscale`` reads as grey: its channels differ by at least
    :data:`GREY_CHROMA` everywhere (Viridis, Plasma and :data:`DIVERGING` do; Cividis, RdBu_r do not)."""
    return all(max(c) - min(c) >= GREY_CHROMA for c in (colour_at(colorscale, t) for t in np.linspace(0, 1, samples)))


def refuse_greys(scale: Scale, what: str) -> None:
    """Refuse ``scale`` for ``what`` (panels with a noise floor) when a colour of it reads as grey."""
    for cs in (scale.colorscale, scale.diverging if scale.anchor is not None else scale.colorscale):
        if not grey_free(cs):
            raise ValueError(
                f"the colour scale {cs if isinstance(cs, str) else 'given'} of {what} holds greys, and "
                "grey marks the cells inside the noise floor: choose one without (Viridis, Plasma, plots.DIVERGING)"
            )


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
    threshold: float = MARK_THRESHOLD,
    noise_floor: Mapping[str, float] | None = None,
    names: Mapping[str, str] | None = None,
) -> go.Figure:
    """One layer x head panel per score, one fixed colour scale (and colour bar) per score family.

    Hovering a cell shows the head, the value, its CI and the uniform baseline. ``baselines``
    (``{score: value}``, e.g. what a uniformly attending head scores; default: the scores' own
    ``meta["baselines"]``) are written under the panel titles, and a dot marks each head that meets
    the role rule: its CI lies wholly above its score's baseline *and* the score is at least
    ``threshold``. CIs over fewer than 5 sequences are flagged in the panel title. ``noise_floor``
    (``{score: floor}``; default: ``meta["noise_floor"]`` for ``importance``) greys every cell whose
    CI reaches 0 or whose size is at most the floor, and keeps the colour scale (which then must
    hold no grey: :func:`grey_free`) for the rest. ``names`` (``{score: panel title}``) overrides
    the panel titles; titles and notes wrap to their panel's width, and rows are spaced so that the
    axis titles clear the next row's panel titles. ``title`` defaults to the model and the kind of
    scores. ``scales`` overrides the family of a column; ``zmin``/``zmax``/``colorscale`` put every
    panel on one given scale, whose colour bar is titled ``value_name``.
    """
    if isinstance(columns, str):
        columns = [columns]
    columns = list(columns or scores.score_names)
    for c in columns:
        scores._check(c)
    baselines = dict(scores.meta.get("baselines") or {} if baselines is None else baselines)
    if noise_floor is None:
        floor = scores.meta.get("noise_floor")
        noise_floor = {"importance": float(floor)} if floor is not None else {}
    if title is None and scores.meta.get("model"):
        what = {"exact": "exact importance", "gradient": "gradient importance"}.get(
            scores.meta.get("method"), "head scores"
        )
        title = f"{short_name(scores.meta['model'])}: {what}"
    few = scores.n_sequences if scores.few_sequences else None
    if zmin is not None or zmax is not None or colorscale is not None:
        fixed = Scale(value_name, colorscale or "Viridis", zmin, zmax)
        family = {c: fixed for c in columns}
    else:
        family = {c: (scales or {}).get(c) or FAMILIES.get(c) or Scale(PRETTY.get(c, c)) for c in columns}
    groups: dict[Scale, list[str]] = {}
    for c in columns:
        groups.setdefault(family[c], []).append(c)

    for scale, cols in groups.items():
        if any(c in noise_floor for c in cols):
            refuse_greys(scale, ", ".join(cols))

    L, H = scores.n_layers, scores.n_heads
    pw, ph, cell = panel_size(L, H)
    gap_x, left, bottom, bar = 64, 70, 56, 110
    n_cols = max(1, min(len(columns), (max_width - left - bar * len(groups) + gap_x) // (pw + gap_x)))
    n_rows = math.ceil(len(columns) / n_cols)
    titles = [
        _panel_title(
            c,
            baselines,
            few if scores.has_ci(c) else None,
            noise_floor.get(c),
            (names or {}).get(c),
            pw + gap_x - 16,
            scores.has_ci(c),
        )
        for c in columns
    ]
    block = max(_title_height(t) for t in titles)
    top = block + (70 if title else 24)
    gap_y = AXIS_BELOW + block + 14  # the x ticks and axis title, then the next row's panel title
    plot_w, plot_h = n_cols * pw + (n_cols - 1) * gap_x, n_rows * ph + (n_rows - 1) * gap_y
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
        _add_panel(
            fig,
            scores,
            col,
            axis_of[family[col]],
            baselines.get(col),
            r + 1,
            c + 1,
            L,
            H,
            cell,
            digits,
            threshold,
            noise_floor.get(col),
        )
    for i, (scale, cols) in enumerate(groups.items()):
        values = np.concatenate([_outside_noise(scores, c, noise_floor.get(c)).ravel() for c in cols])
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
    height = top + plot_h + bottom
    fig.update_layout(
        title=dict(text=title, x=0.0, xanchor="left", xref="paper", y=1 - 16 / height, yanchor="top")
        if title
        else None,
        width=max(560 if title else 0, title_width(title, left), left + plot_w + bar * len(groups)),
        height=height,
        margin=dict(l=left, r=bar * len(groups), t=top, b=bottom),
        showlegend=False,
        plot_bgcolor="white",
    )
    return styled(fig)


def noise_mask(
    z: np.ndarray, floor: float | None, lo: np.ndarray | None = None, hi: np.ndarray | None = None
) -> np.ndarray:
    """Cells of ``z`` indistinguishable from 0: ``|value| <= floor``, or (with a floor) the CI
    ``[lo, hi]`` reaches 0; none without a floor."""
    if floor is None:
        return np.zeros(z.shape, dtype=bool)
    inside = np.abs(z) <= floor
    if lo is not None and hi is not None:
        inside |= (lo <= 0) & (hi >= 0)
    return inside & np.isfinite(z)


def inside_noise(scores: HeadScores, col: str, floor: float | None) -> np.ndarray:
    """``[layer, head]``: cells indistinguishable from 0: the CI reaches 0, or ``|value| <= floor``."""
    if scores.has_ci(col):
        return noise_mask(scores.grid(col), floor, scores.grid(f"{col}_lo"), scores.grid(f"{col}_hi"))
    return noise_mask(scores.grid(col), floor)


def noise_layer(noise: np.ndarray, x: Sequence, y: Sequence) -> go.Heatmap:
    """The neutral layer drawn under a coloured heatmap: :data:`NEUTRAL` on the cells inside the
    noise floor (``noise``), nothing elsewhere."""
    return go.Heatmap(
        z=np.where(noise, 0.0, np.nan),
        x=x,
        y=y,
        colorscale=[[0, NEUTRAL], [1, NEUTRAL]],
        showscale=False,
        hoverinfo="skip",
        xgap=1,
        ygap=1,
        name="noise",
    )


def cell_text(
    z: np.ndarray,
    lo: np.ndarray | None = None,
    hi: np.ndarray | None = None,
    noise: np.ndarray | None = None,
    baseline: float | None = None,
) -> np.ndarray:
    """Each cell's hover text: its value, its CI when there is one, the ``baseline`` when given, and
    whether it lies inside the noise floor (``noise``)."""
    if lo is None or hi is None:
        text = np.vectorize(lambda v: f"{v:.3g}")(z)
    else:
        text = np.vectorize(lambda v, a, b: f"{v:.3g} [{a:.3g}, {b:.3g}]")(z, lo, hi)
    if baseline is not None:
        text = np.char.add(text.astype(str), f"<br>uniform: {baseline:.3g}")
    if noise is not None and noise.any():
        text = np.where(noise, np.char.add(text.astype(str), "<br>inside the noise floor"), text)
    return text


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


def _outside_noise(scores: HeadScores, col: str, floor: float | None) -> np.ndarray:
    z = scores.grid(col)
    return np.where(inside_noise(scores, col, floor), np.nan, z)


NOTES = {"copying": "+1 copies the attended token, -1 suppresses it"}


TITLE_LINE = 21  # pixels per line of a panel title
AXIS_BELOW = 62  # pixels under a panel that its x tick labels and axis title take


def _title_height(text: str) -> int:
    """The height in pixels of a panel title from :func:`_panel_title` (plotly spaces every line of
    an annotation by its 16 px font, small type or not)."""
    return TITLE_LINE * (text.count("<br>") + 1)


def _wrap(text: str, width_px: int, px_per_char: float) -> list[str]:
    import textwrap

    return textwrap.wrap(text, max(12, int(width_px / px_per_char)), break_on_hyphens=False) or [text]


def _panel_title(
    col: str,
    baselines: Mapping[str, float],
    few: int | None = None,
    floor: float | None = None,
    name: str | None = None,
    width: int = 10_000,
    ci: bool = False,
) -> str:
    """The panel's title, then its note in small type, both wrapped to ``width`` pixels (one
    ``<br>`` per line after the first, so the line count can be read back)."""
    name = name or PRETTY.get(col, col)
    if col in baselines:
        note = f"uniform {baselines[col]:.3f}; dot: CI above it, score >= {MARK_THRESHOLD:g}"
    elif floor is not None:
        note = f"noise floor {floor:.3g}: grey cells lie inside it" + (" or their CI reaches 0" if ci else "")
    else:
        note = NOTES.get(col)
    lines = _wrap(name, width, 9.0)
    small = [f"<span style='font-size:11px'>{line}</span>" for line in (_wrap(note, width, 6.0) if note else [])]
    if few is not None:
        small.append(
            f"<span style='font-size:11px;color:#c0392b'>! CIs from {few} sequence{'s' if few != 1 else ''} (&lt; 5)</span>"
        )
    return "<br>".join(lines + small)


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
    threshold: float = MARK_THRESHOLD,
    floor: float | None = None,
) -> None:
    z = scores.grid(col)
    noise = inside_noise(scores, col, floor)
    name = PRETTY.get(col, col)
    lo, hi = (scores.grid(f"{col}_lo"), scores.grid(f"{col}_hi")) if scores.has_ci(col) else (None, None)
    text = cell_text(z, lo, hi, noise, baseline)
    label = np.vectorize(lambda l, h: f"{l}.{h}")(*np.meshgrid(np.arange(L), np.arange(H), indexing="ij"))
    if noise.any():  # the neutral layer under the coloured one: cells inside the noise floor
        fig.add_trace(noise_layer(noise, np.arange(H), np.arange(L)), row=row, col=cell_col)
    fig.add_trace(
        go.Heatmap(
            z=np.where(noise, np.nan, z),
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
        layer, head = np.nonzero((lo > baseline) & (z >= threshold))  # the role rule, not the CI alone
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
    tick = max(1, math.ceil(18 / cell))  # integer ticks only
    fig.update_xaxes(
        title_text="head", dtick=tick, range=[-0.5, H - 0.5], showgrid=False, zeroline=False, row=row, col=cell_col
    )
    fig.update_yaxes(
        title_text="layer", dtick=tick, range=[L - 0.5, -0.5], showgrid=False, zeroline=False, row=row, col=cell_col
    )


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


def save_figure(
    fig: go.Figure, out_dir: str | Path, stem: str, *, png: bool = True, overwrite: bool = False
) -> list[Path]:
    """Write ``<stem>.html`` (always) and ``<stem>.png`` (see :func:`save_png`); return the paths.

    The HTML is self-contained: plotly.js (about 4.8 MB) is inlined, so the file renders offline
    wherever it is moved or mailed. The figure is put on the toolkit's :data:`TEMPLATE`. Writing
    over an earlier ``<stem>.html`` refuses unless ``overwrite`` (a command replaces its own).
    """
    from interp.saving import claim

    html_path, png_path = claim(Path(out_dir), [f"{stem}.html", f"{stem}.png"], overwrite=overwrite)
    styled(fig)
    html = fig.to_html(include_plotlyjs=True, full_html=True, config={"displaylogo": False})
    written = [atomic_write(html_path, html)]
    image = save_png(fig, png_path) if png else None
    return written + ([image] if image else [])
