"""The figure of a QK attribution: query-side x key-side components, each side's pair totals on its
margin. It takes data (a grid of terms), not the result class."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    import plotly.graph_objects as go


def pair_heatmap(grid: pd.DataFrame, *, title: str, total: float | None = None) -> go.Figure:
    """A diverging heatmap of ``grid`` (query components as rows, key components as columns), with
    the key side's totals (each column summed) above it and the query side's (each row summed) on
    its right; ``total`` (the model's own value, when given) is named in the title."""
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from interp.plots.style import title_width

    queries, keys = [str(q) for q in grid.index], [str(k) for k in grid.columns]
    values = grid.to_numpy(dtype=float)  # NaN: a pair the table does not hold (a top= table)
    bound = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    size = _pixels(len(queries), len(keys))
    fig = make_subplots(
        rows=2,
        cols=2,
        column_widths=[size["heat_w"], MARGIN_BAR],
        row_heights=[MARGIN_BAR, size["heat_h"]],
        shared_xaxes="columns",
        shared_yaxes="rows",
        horizontal_spacing=GAP / size["plot_w"],
        vertical_spacing=GAP / size["plot_h"],
    )
    fig.add_trace(
        go.Heatmap(
            z=values,
            x=keys,
            y=queries,
            zmin=-bound,
            zmax=bound,
            colorscale="RdBu",
            reversescale=True,
            colorbar=dict(title="term", x=1.0, xanchor="left", xpad=20, y=0, yanchor="bottom", len=size["bar_len"]),
            hovertemplate="query %{y} x key %{x}: %{z:.4g}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.add_trace(go.Bar(x=keys, y=np.nansum(values, 0), name="key side", marker_color="#555"), row=1, col=1)
    fig.add_trace(
        go.Bar(y=queries, x=np.nansum(values, 1), orientation="h", name="query side", marker_color="#555"),
        row=2,
        col=2,
    )
    fig.update_yaxes(nticks=3, row=1, col=1)  # the margins' own scales: few labels, none on top of another
    fig.update_xaxes(nticks=3, row=2, col=2)
    # automargin: the axis titles stand clear of the names however long (the margins grow to fit)
    fig.update_xaxes(
        type="category", title_text="key side", tickangle=-90, automargin=True, title_standoff=12, row=2, col=1
    )
    fig.update_yaxes(
        type="category", title_text="query side", autorange="reversed", automargin=True, title_standoff=12, row=2, col=1
    )
    full = title if total is None else f"{title} (total {total:.4g})"
    fig.update_layout(
        title=full,
        showlegend=False,
        height=size["plot_h"] + MARGINS["t"] + MARGINS["b"],
        width=max(size["plot_w"] + MARGINS["l"] + MARGINS["r"], title_width(full, MARGINS["l"])),
        margin=MARGINS,
    )
    return fig


MARGIN_BAR = 110  # pixels of each side's bar of totals
GAP = 12  # pixels between the heatmap and its bars
MARGINS = dict(l=120, r=110, t=80, b=130)  # room for the component names, the colorbar and the title
MAX_WIDTH = 1240  # the page never scrolls sideways in a 1280-pixel window: many keys get narrower cells


def _pixels(n_queries: int, n_keys: int) -> dict[str, float]:
    """The heatmap's size in pixels: 40 a key up to what :data:`MAX_WIDTH` leaves, 26 a query up to
    30 of them, then 12 a query (labels stay readable; the page grows downwards)."""
    room = MAX_WIDTH - MARGINS["l"] - MARGINS["r"] - MARGIN_BAR - GAP
    heat_w = max(120, min(40 * n_keys, room))
    heat_h = max(120, 26 * n_queries if n_queries <= 30 else max(780, 12 * n_queries))
    plot_w, plot_h = heat_w + MARGIN_BAR + GAP, heat_h + MARGIN_BAR + GAP
    return dict(heat_w=heat_w, heat_h=heat_h, plot_w=plot_w, plot_h=plot_h, bar_len=heat_h / plot_h)


__all__ = ["pair_heatmap"]
