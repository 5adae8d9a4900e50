"""A circuit faithfulness curve: faithfulness against the circuit's share of the graph's edges, MIB's
CPR and CMD over its fractions, and the smallest circuit reaching :data:`FAITHFUL`
(:func:`~interp.circuits.circuit.faithfulness_curve` computes it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from interp.results import SHOWN_ROWS, Result, plural

if TYPE_CHECKING:
    import plotly.graph_objects as go

FAITHFUL = 0.8  # the faithfulness a summary names the smallest circuit reaching


class Chosen(Protocol):
    """What the curve's figure reads of a chosen circuit (a :class:`~interp.circuits.Circuit`)."""

    meta: dict[str, Any]

    @property
    def n_edges(self) -> int: ...


@dataclass(repr=False)
class FaithfulnessCurve(Result):
    """A row per circuit: its ``size`` asked for, ``fraction`` of the graph's edges, ``n_edges`` kept
    after pruning (by position: of the graph's (edge, position) pairs, the pairs kept, none pruned),
    ``metric`` (mean over pairs) and ``faithfulness`` with its bootstrap CI over pairs.
    ``meta``: ``cpr``, ``cmd`` (over MIB's fractions, where the curve has them), the clean and
    corrupted metrics and the smallest circuit reaching :data:`FAITHFUL`."""

    KIND = "circuit_faithfulness"
    what = "circuit faithfulness"
    shown_by = None

    def headline(self) -> str:
        """The class, the model, then :meth:`summary`: CPR and CMD, the smallest faithful circuit."""
        return f"FaithfulnessCurve of {self.meta.get('model', 'a model')}: " + "; ".join(self.summary())

    def shown_rows(self, n: int = SHOWN_ROWS) -> pd.DataFrame:
        """The sizes that keep edges (the smallest sizes prune to none), one row per circuit kept."""
        kept = self.table[self.table["n_edges"] > 0].drop_duplicates("n_edges")
        return kept.head(n)

    def figure(self, title: str | None = None, chosen: Chosen | None = None) -> go.Figure:
        """Faithfulness against the share of the graph's edges, with its CI, on a log axis; the level
        :data:`FAITHFUL` and the smallest circuit reaching it marked, and ``chosen`` (a circuit with its
        faithfulness in its meta, as the command's) where given."""
        import plotly.graph_objects as go

        from interp.plots.style import styled

        t = self.table[self.table.fraction > 0]  # a log axis: the empty circuit is the curve's zero
        m = self.meta
        units = _units(m)[1] + "s"
        fig = go.Figure(
            go.Scatter(
                x=t.fraction,
                y=t.faithfulness,
                mode="lines+markers",
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": t.faithfulness_hi - t.faithfulness,
                    "arrayminus": t.faithfulness - t.faithfulness_lo,
                },
                customdata=np.stack([t.n_edges, t.metric], axis=1),
                hovertemplate=f"%{{x:.3%}} of {units} (%{{customdata[0]}} kept): faithfulness %{{y:.3f}}, "
                "metric %{customdata[1]:.3g}<extra></extra>",
                name="circuit",
            )
        )
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
        fig.add_hline(y=0.0, line_dash="dot", line_color="grey")
        fig.add_hline(
            y=FAITHFUL,
            line_dash="dash",
            line_color="#2ca02c",
            annotation_text=f"faithfulness {FAITHFUL}",
            annotation_position="top left",
        )
        for trace in _marks(m, chosen):
            fig.add_trace(trace)
        cpr = f", CPR {m['cpr']:.3f}, CMD {m['cmd']:.3f}" if "cpr" in m else ""
        fig.update_layout(
            title=title
            or f"{m.get('model', 'model')}: circuit faithfulness ({m.get('how', 'given')}, {m.get('source', 'patch')}){cpr}",
            xaxis={"title": f"share of the graph's {units}", "type": "log", "tickformat": ".1%"},
            yaxis={"title": "faithfulness"},
            width=900,
            height=560,
            legend={"orientation": "h", "x": 0, "y": -0.22, "yanchor": "top"},
        )
        return styled(fig)

    def summary(self) -> list[str]:
        """The lines a command prints: the curve's area figures and the smallest faithful circuit."""
        m, lines = self.meta, []
        if "cpr" in m:
            lines.append(f"CPR {m['cpr']:.3f} (area under the curve), CMD {m['cmd']:.3f} (area between it and 1)")
        reach = m.get("smallest_faithful")
        if reach is None:
            lines.append(f"no circuit of these sizes reaches faithfulness {FAITHFUL}")
        else:
            (total, unit), n = _units(m), reach["n_edges"]
            share = n / total if total else reach["fraction"]
            # pairs are kept as ranked (none is pruned); edges are pruned to input-to-logits paths
            of = f"of the graph's {total:,}" if m.get("by") == "position" else "of the graph, after pruning"
            lines.append(
                f"smallest circuit reaching faithfulness {FAITHFUL}: {n:,} {unit}s ({share:.2%} {of}), "
                f"faithfulness {reach['faithfulness']:.3f}"
            )
        return lines


def _marks(meta: Mapping[str, Any], chosen: Chosen | None) -> list[go.Scatter]:
    """The curve figure's marked circuits: the smallest reaching :data:`FAITHFUL`, and ``chosen``
    (with its CI) where it has a faithfulness, each at its share of the graph's edges."""
    import plotly.graph_objects as go

    (E, unit), marks = _units(meta), []
    reach = meta.get("smallest_faithful")
    if reach is not None:
        x = reach["n_edges"] / E if E else reach["fraction"]
        name = f"smallest reaching {FAITHFUL}: {plural(reach['n_edges'], unit)}"
        star = {"symbol": "star", "size": 16, "color": "#2ca02c"}
        marks.append(go.Scatter(x=[x], y=[reach["faithfulness"]], mode="markers", marker=star, name=name))
    if chosen is not None and "faithfulness" in chosen.meta and E and chosen.n_edges:
        f, (lo, hi) = chosen.meta["faithfulness"], chosen.meta["faithfulness_ci"]
        name = f"chosen: {plural(chosen.n_edges, 'edge')}, faithfulness {f:.3f} [{lo:.3f}, {hi:.3f}]"
        bar = {"type": "data", "symmetric": False, "array": [hi - f], "arrayminus": [f - lo]}
        diamond = {"symbol": "diamond-open", "size": 14, "color": "#d62728", "line": {"width": 2}}
        marks.append(go.Scatter(x=[chosen.n_edges / E], y=[f], mode="markers", marker=diamond, error_y=bar, name=name))
    return marks


def _units(meta: Mapping[str, Any]) -> tuple[int | None, str]:
    """What the curve's circuits are made of, and how many the graph has: edges, or (edge, position)
    pairs for scores by position."""
    if meta.get("by") == "position":
        return meta.get("graph_units"), "(edge, position) pair"
    return meta.get("graph_edges"), "edge"


def with_smallest_faithful(table: pd.DataFrame, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with the smallest circuit of ``table`` reaching :data:`FAITHFUL` (``smallest_faithful``)."""
    faithful = table[table.faithfulness >= FAITHFUL]
    if len(faithful):
        row = faithful.sort_values("n_edges", kind="stable").iloc[0]
        meta["smallest_faithful"] = {
            "size": int(row["size"]),
            "n_edges": int(row["n_edges"]),
            "fraction": float(row["fraction"]),
            "faithfulness": float(row["faithfulness"]),
        }
    return meta


def trapezoid(y: np.ndarray, x: np.ndarray) -> float:
    """The area under ``y`` over ``x`` by trapezoids (MIB's rule)."""
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))
