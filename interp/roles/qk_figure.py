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
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    queries, keys = [str(q) for q in grid.index], [str(k) for k in grid.columns]
    values = grid.to_numpy(dtype=float)
    bound = float(abs(values).max()) if values.size else 1.0
    fig = make_subplots(
        rows=2,
        cols=2,
        column_widths=[0.82, 0.18],
        row_heights=[0.18, 0.82],
        shared_xaxes="columns",
        shared_yaxes="rows",
        horizontal_spacing=0.02,
        vertical_spacing=0.02,
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
            colorbar=dict(title="term", x=1.02),
            hovertemplate="query %{y} x key %{x}: %{z:.4g}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.add_trace(go.Bar(x=keys, y=values.sum(0), name="key side", marker_color="#555"), row=1, col=1)
    fig.add_trace(
        go.Bar(y=queries, x=values.sum(1), orientation="h", name="query side", marker_color="#555"), row=2, col=2
    )
    fig.update_xaxes(type="category", title_text="key side", row=2, col=1)
    fig.update_yaxes(type="category", title_text="query side", autorange="reversed", row=2, col=1)
    full = title if total is None else f"{title} (total {total:.4g})"
    fig.update_layout(title=full, showlegend=False, height=160 + 26 * len(queries), width=260 + 40 * len(keys))
    return fig


__all__ = ["pair_heatmap"]
