"""The layer x head heatmap: one panel per score, one fixed colour scale per score family.

It draws data: a tidy per-head table (``layer``, ``head``, a column per score, ``<score>_lo`` and
``<score>_hi`` for a CI) and its meta (:class:`PerHead`); a result object with a ``.table`` and a
``.meta`` (a :class:`~interp.scores.HeadScores`) is read as those. Panels are sized by the model's
number of layers and heads and wrap into rows that fit a 1280-pixel window.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from interp.plots.style import (
    FAMILIES,
    MARK_THRESHOLD,
    MAX_WIDTH,
    PRETTY,
    Scale,
    cell_text,
    noise_layer,
    noise_mask,
    panel_size,
    refuse_greys,
    short_name,
    styled,
    title_width,
)
from interp.results import check_score, few_ci_sequences, has_ci, head_grid, score_columns

NOTES = {"copying": "+1 copies the attended token, -1 suppresses it"}
TITLE_LINE = 21  # pixels per line of a panel title
AXIS_BELOW = 62  # pixels under a panel that its x tick labels and axis title take
GAP_X, LEFT, BOTTOM, BAR = 64, 70, 56, 110  # pixels between panels, left of them, under them, per colour bar


@dataclass(frozen=True)
class PerHead:
    """What a layer x head figure reads: a tidy per-head table and the meta of its run."""

    table: pd.DataFrame
    meta: Mapping[str, Any]

    @classmethod
    def of(cls, scores: Any, meta: Mapping[str, Any] | None = None) -> PerHead:
        """``scores`` as data: a per-head DataFrame (with ``meta``), or a result's ``.table`` and
        ``.meta`` (``meta`` given: in its place)."""
        if isinstance(scores, pd.DataFrame):
            return cls(scores, meta or {})
        return cls(scores.table, scores.meta if meta is None else meta)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.table["layer"].max()) + 1, int(self.table["head"].max()) + 1

    def grid(self, col: str) -> np.ndarray:
        return head_grid(self.table, col, *self.shape)

    def bounds(self, col: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The ``[layer, head]`` CI bounds of ``col`` (``None, None`` without a CI)."""
        return (self.grid(f"{col}_lo"), self.grid(f"{col}_hi")) if has_ci(self.table, col) else (None, None)


def inside_noise(scores: Any, col: str, floor: float | None) -> np.ndarray:
    """``[layer, head]``: cells indistinguishable from 0: the CI reaches 0, or ``|value| <= floor``
    (``scores``: a per-head table, or a result holding one)."""
    data = PerHead.of(scores)
    return noise_mask(data.grid(col), floor, *data.bounds(col))


def heatmap(
    scores: Any,
    columns: Sequence[str] | str | None = None,
    *,
    meta: Mapping[str, Any] | None = None,
    title: str | None = None,
    baselines: Mapping[str, float] | None = None,
    scales: Mapping[str, Scale] | None = None,
    scale: Scale | None = None,
    threshold: float = MARK_THRESHOLD,
    noise_floor: Mapping[str, float] | None = None,
    names: Mapping[str, str] | None = None,
) -> go.Figure:
    """One layer x head panel per score, one fixed colour scale (and colour bar) per score family.

    ``scores``: a tidy per-head table (and its ``meta``), or a result holding one (a
    :class:`~interp.scores.HeadScores`: its table and meta). Hovering a cell shows the head, the
    value, its CI and the uniform baseline. ``baselines`` (``{score: value}``, e.g. what a uniformly
    attending head scores; default: ``meta["baselines"]``) are written under the panel titles, and
    a dot marks each head that meets the role rule: its CI lies wholly above its score's baseline
    *and* the score is at least ``threshold``. CIs over fewer than 5 sequences are flagged in the
    panel title. ``noise_floor`` (``{score: floor}``; default: ``meta["noise_floor"]`` for
    ``importance``) greys every cell whose CI reaches 0 or whose size is at most the floor, and
    keeps the colour scale (which then must hold no grey: :func:`grey_free`) for the rest. ``names``
    (``{score: panel title}``) overrides the panel titles; titles and notes wrap to their panel's
    width, and rows are spaced so that the axis titles clear the next row's panel titles. ``title``
    defaults to the model and the kind of scores. ``scales`` overrides the family of a column;
    ``scale`` puts every panel on that one scale.
    """
    data = PerHead.of(scores, meta)
    columns = [columns] if isinstance(columns, str) else list(columns or score_columns(data.table))
    for c in columns:
        check_score(data.table, c)
    baselines = dict(data.meta.get("baselines") or {} if baselines is None else baselines)
    if noise_floor is None:
        floor = data.meta.get("noise_floor")
        noise_floor = {"importance": float(floor)} if floor is not None else {}
    title = _default_title(data.meta) if title is None else title
    family = {c: scale or (scales or {}).get(c) or FAMILIES.get(c) or Scale(PRETTY.get(c, c)) for c in columns}
    groups: dict[Scale, list[str]] = {}
    for c in columns:
        groups.setdefault(family[c], []).append(c)
    for group, cols in groups.items():
        if any(c in noise_floor for c in cols):
            refuse_greys(group, ", ".join(cols))

    few = few_ci_sequences(data.table, data.meta)
    L, H = data.shape
    pw, ph, cell = panel_size(L, H)
    n_cols = max(1, min(len(columns), (MAX_WIDTH - LEFT - BAR * len(groups) + GAP_X) // (pw + GAP_X)))
    n_rows = math.ceil(len(columns) / n_cols)
    titles = [
        _title_of(data, c, baselines, few, noise_floor.get(c), (names or {}).get(c), pw + GAP_X - 16) for c in columns
    ]
    block = max(_title_height(t) for t in titles)
    gap_y = AXIS_BELOW + block + 14  # the x ticks and axis title, then the next row's panel title
    plot_w, plot_h = n_cols * pw + (n_cols - 1) * GAP_X, n_rows * ph + (n_rows - 1) * gap_y
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        subplot_titles=titles,
        horizontal_spacing=GAP_X / plot_w if n_cols > 1 else 0.0,
        vertical_spacing=gap_y / plot_h if n_rows > 1 else 0.0,
    )
    axis_of = {group: f"coloraxis{'' if i == 0 else i + 1}" for i, group in enumerate(groups)}
    for i, col in enumerate(columns):
        r, c = divmod(i, n_cols)
        fixed = family[col].zmin is not None and family[col].zmax is not None  # 0..1-like: two decimals read best
        at = dict(row=r + 1, column=c + 1, coloraxis=axis_of[family[col]], cell=cell, digits=".2f" if fixed else ".3g")
        _add_panel(fig, data, col, baselines.get(col), threshold, noise_floor.get(col), **at)
    for i, (group, cols) in enumerate(groups.items()):
        values = np.concatenate([_outside_noise(data, c, noise_floor.get(c)).ravel() for c in cols])
        fig.layout[axis_of[group]] = _colour_axis(group, values, x=1.0 + (16 + i * BAR) / plot_w, len_=ph / plot_h)
    _frame(fig, title, plot_w, plot_h, len(groups), top=block + (70 if title else 24))
    return styled(fig)


def _default_title(meta: Mapping[str, Any]) -> str | None:
    """The model and the kind of scores (exact or gradient importance, else head scores)."""
    if not meta.get("model"):
        return None
    what = {"exact": "exact importance", "gradient": "gradient importance"}.get(meta.get("method"), "head scores")
    return f"{short_name(meta['model'])}: {what}"


def _colour_axis(scale: Scale, values: np.ndarray, *, x: float, len_: float) -> dict[str, Any]:
    """One family's colour axis: its limits for ``values`` and its colour bar at ``x``."""
    lo, hi, mid, cs = scale.limits(values)
    bar = dict(
        title=dict(text=scale.title, side="right"),
        x=x,
        xanchor="left",
        y=1.0,
        yanchor="top",
        len=min(1.0, len_),
        thickness=14,
    )
    return dict(colorscale=cs, cmin=lo, cmax=hi, cmid=mid, colorbar=bar)


def _frame(fig: go.Figure, title: str | None, plot_w: int, plot_h: int, bars: int, *, top: int) -> None:
    """The figure's title, size and margins around its panels (``bars``: how many colour bars)."""
    height = top + plot_h + BOTTOM
    fig.update_layout(
        title=dict(text=title, x=0.0, xanchor="left", xref="paper", y=1 - 16 / height, yanchor="top")
        if title
        else None,
        width=max(560 if title else 0, title_width(title, LEFT), LEFT + plot_w + BAR * bars),
        height=height,
        margin=dict(l=LEFT, r=BAR * bars, t=top, b=BOTTOM),
        showlegend=False,
        plot_bgcolor="white",
    )


def _outside_noise(data: PerHead, col: str, floor: float | None) -> np.ndarray:
    z = data.grid(col)
    return np.where(inside_noise(data, col, floor), np.nan, z)


def _title_of(
    data: PerHead,
    col: str,
    baselines: Mapping[str, float],
    few: int | None,
    floor: float | None,
    name: str | None,
    width: int,
) -> str:
    """:func:`_panel_title` of ``col``, its CIs flagged when they rest on ``few`` sequences."""
    ci = has_ci(data.table, col)
    return _panel_title(col, baselines, few if ci else None, floor, name, width, ci)


def _title_height(text: str) -> int:
    """The height in pixels of a panel title from :func:`_panel_title` (plotly spaces every line of
    an annotation by its 16 px font, small type or not)."""
    return TITLE_LINE * (text.count("<br>") + 1)


def _wrap(text: str, width_px: int, px_per_char: float) -> list[str]:
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
    data: PerHead,
    col: str,
    baseline: float | None,
    threshold: float,
    floor: float | None,
    *,
    row: int,
    column: int,
    coloraxis: str,
    cell: int,
    digits: str,
) -> None:
    """One score's panel at (``row``, ``column``): the noise layer, the coloured cells with their
    hover text, the role rule's dots and the integer axes."""
    cell_col = column
    L, H = data.shape
    z = data.grid(col)
    noise = inside_noise(data, col, floor)
    name = PRETTY.get(col, col)
    lo, hi = data.bounds(col)
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
