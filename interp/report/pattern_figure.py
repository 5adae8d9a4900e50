""":func:`pattern_heatmap`: a few heads' attention patterns on one sequence, as one plotly figure.

A notebook's quick look (the atlas and ``interp patterns`` have the interactive viewers): rows are
queries, columns keys, both labelled with the tokens; keys a causal query may not see are left
blank (grey), so a masked zero never reads as "attends nowhere".
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from jaxtyping import Int
from plotly.subplots import make_subplots
from torch import Tensor

from interp.adapters import HookedModel
from interp.errors import UsageError
from interp.models import describe
from interp.parts.patterns import attention_patterns, token_labels
from interp.plots import MAX_WIDTH


def pattern_heatmap(
    model: HookedModel, tokens: Int[Tensor, " pos"], heads: Sequence[str], *, title: str | None = None
) -> go.Figure:
    """The attention patterns of ``heads`` (labels such as ``"0.3"``) on the one sequence ``tokens``."""
    info = describe(model)
    heads = [heads] if isinstance(heads, str) else list(heads)
    known = set(info.head_labels())
    bad = [h for h in heads if h not in known]
    if bad or not heads:
        raise UsageError(
            f"no head {', '.join(bad) or '(none given)'} in this model: heads are LAYER.HEAD, 0.0 to {info.head_labels()[-1]}"
        )
    patterns = attention_patterns(model, tokens.cpu()).numpy()
    ids = tokens.tolist()
    labels = [f"{i}:{w}" for i, w in enumerate(token_labels(model, ids))]  # positions keep repeated tokens apart
    n = len(ids)
    fig = make_subplots(rows=1, cols=len(heads), subplot_titles=[f"head {h}" for h in heads], horizontal_spacing=0.08)
    for i, head in enumerate(heads):
        layer, h = (int(x) for x in head.split("."))
        z = patterns[layer, h].copy()
        if info.is_causal:
            for q in range(n):
                z[q, q + 1 :] = float("nan")  # masked: not a zero the head chose
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=labels,
                y=labels,
                zmin=0,
                zmax=1,
                colorscale="Viridis",
                coloraxis="coloraxis",
                hovertemplate="query %{y}<br>key %{x}<br>weight %{z:.3f}<extra>" + head + "</extra>",
            ),
            row=1,
            col=i + 1,
        )
        fig.update_yaxes(
            autorange="reversed", row=1, col=i + 1, showticklabels=i == 0, title="query" if i == 0 else None
        )
        fig.update_xaxes(row=1, col=i + 1, title="key", tickangle=-90)
    side = max(260, min(520, 14 * n))
    fig.update_layout(
        title=title,
        template="plotly_white",
        coloraxis={"colorscale": "Viridis", "cmin": 0, "cmax": 1, "colorbar": {"title": "attention"}},
        plot_bgcolor="#dddddd",
        width=min(MAX_WIDTH, 140 + len(heads) * (side + 60)),
        height=side + 220,
    )
    return fig


__all__ = ["pattern_heatmap"]
