"""Figures of the retrieval analysis: the layer x head heatmap and the copy-distance curves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from interp.adapters import HookedModel
from interp.scores import HeadScores


def layer_windows(model: HookedModel) -> list[int | None]:
    """Each layer's sliding window (keys ``q - window < k <= q``), or None for full attention.

    Read from the Hugging Face config behind a bridge (``sliding_window`` with ``layer_types`` when
    it names the windowed layers, Mistral-style on every layer otherwise); the toy has no window.
    """
    n_layers = len(getattr(model, "blocks", []))
    hf = getattr(model, "original_model", None)
    config = getattr(hf, "config", None)
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return [None] * n_layers
    types = getattr(config, "layer_types", None)
    if types:
        return [int(window) if "sliding" in str(t) else None for t in types][:n_layers]
    return [int(window)] * n_layers


def retrieval_figure(scores: HeadScores, title: str | None = None) -> Any:
    """Heatmaps of ``retrieval``, ``retrieval_mass`` and ``streaming``, one panel each."""
    return scores.figure(["retrieval", "retrieval_mass", "streaming"], title=title)


def copy_distance_figure(
    table: pd.DataFrame,
    *,
    windows: Sequence[int | None] | None = None,
    heads: Sequence[tuple[int, int]] | None = None,
    title: str | None = None,
) -> Any:
    """Induction mass and retrieval score against copy distance (log scale), one curve per head.

    ``table`` is :func:`~interp.retrieval.copy_distance_scores`'s. The dashed black line is the
    induction mass of a uniform head; a layer with a sliding window (``windows[layer]``) gets a
    dotted vertical line at its window, past which its heads cannot see the earlier copy.
    ``heads`` limits the curves (default: every head).
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("induction mass", "retrieval score"), shared_xaxes=True)
    chosen = set(heads) if heads is not None else None
    for (layer, head), rows in table.groupby(["layer", "head"], sort=True):
        if chosen is not None and (layer, head) not in chosen:
            continue
        for col, name in ((1, "induction"), (2, "retrieval")):
            fig.add_trace(
                go.Scatter(
                    x=rows["distance"],
                    y=rows[name],
                    mode="lines+markers",
                    name=f"{layer}.{head}",
                    legendgroup=f"{layer}.{head}",
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    uniform = table.drop_duplicates("distance").sort_values("distance")
    fig.add_trace(
        go.Scatter(
            x=uniform["distance"],
            y=uniform["uniform"],
            mode="lines",
            name="uniform",
            line={"dash": "dash", "color": "black"},
        ),
        row=1,
        col=1,
    )
    for layer, w in sorted({(l, w) for l, w in enumerate(windows or []) if w}, key=lambda x: x[1]):
        for col in (1, 2):
            fig.add_vline(x=w, line={"dash": "dot", "color": "grey"}, row=1, col=col)
        fig.add_annotation(x=w, y=1.0, yref="paper", xref="x", text=f"window L{layer}", showarrow=False)
    fig.update_xaxes(type="log", title_text="distance to the earlier copy (tokens)")
    fig.update_layout(title=title or "copy distance", yaxis={"range": [-0.02, 1.02]}, yaxis2={"range": [-0.02, 1.02]})
    return fig


__all__ = ["copy_distance_figure", "layer_windows", "retrieval_figure"]
