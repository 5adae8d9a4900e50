"""A circuit drawn as a graph: the chosen edges of an edge-score table between the nodes they join.

The layout reads as the residual stream runs: from the ``input`` at the bottom to the ``logits`` at
the top, one row per layer. A layer's row holds its heads in order (head ``h`` at ``x = h`` in every
layer, so columns line up), and its MLP a little above them, centred, for it reads what its heads
wrote; in a parallel block (GPT-J, NeoX) the MLP reads what its heads read, so it sits on their row,
after them. A head is one node: its ``<q>``, ``<k>`` and ``<v>`` receivers are that node, and an
edge into one of them ends just under it, left for ``q``, centre for ``k``, right for ``v``, and
with its own dash (solid, dashed, dotted; the legend says which). On GQA/MQA a key/value receiver
``{l}.kv{j}`` is its own small node, placed between the query heads it serves and a little below
them. Only nodes an edge drawn touches are drawn, and the ``input`` and ``logits`` always. An edge
that skips rows bows sideways, so that it does not run through the nodes between its ends.

An edge's colour and width give its score: a diverging scale centred on 0 and symmetric (red
positive, blue negative, no grey or white middle, :data:`~interp.plots.DIVERGING`), its limits the
largest ``|score|`` drawn, a colour bar in the metric's units; the width grows with ``|score|``.
Hovering an edge names it and gives its score, CI and stability; hovering a node names it and
counts its edges in the circuit.

Every trace says what it is in its ``meta`` (``{"edge": name, "site": ...}`` for an edge,
``{"nodes": kind}`` for a kind of node), so that tests and pages can read the figure back.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float

from interp.names import INPUT, LOGITS, parse
from interp.plots.style import DIVERGING, MAX_WIDTH, Scale, colour_at, refuse_greys, short_name, styled, title_width

DEFAULT_EDGES = 60
# an edge into a head's input ends under the node: q to the left, k below, v to the right, each with its dash
SITE_OFFSET = {"q": -0.2, "k": 0.0, "v": 0.2}
LEGEND_SITE = {"q": "queries", "k": "keys", "v": "values"}
SITE_DASH = {"q": "solid", "k": "dash", "v": "dot", "mlp": "solid", "logits": "solid"}
SITE_NAME = {
    "q": "into a head's queries <q>",
    "k": "into a head's keys <k>",
    "v": "into a head's values <v>",
    "mlp": "into an MLP",
    "logits": "into the logits",
}
MLP_RISE = 0.45  # an MLP sits this far above its layer's heads (rows are 1 apart)
KV_DROP = 0.22  # a key/value head sits this far below its query heads
END_DROP = 0.09  # an edge ends this far under its receiver's node, so that its arrival shows
WIDTH_MIN, WIDTH_MAX = 1.0, 7.0  # line widths in px, from a score of 0 to the largest |score|
CURVE_POINTS = 17  # points along an edge: its line's bend, and where hovering finds it
# margins in px: the row names; the colour bar and the legend under it; the title; the head axis
LEFT, RIGHT, TOP, BOTTOM = 80, 190, 80, 60
LEGEND_PX = 19  # a legend entry's height
NODE_COLOUR, NODE_FILL = "#3e4c59", "#f5f7fa"
NODE_STYLE = {  # kind -> (legend name, marker symbol, size)
    "input": ("input, logits", "diamond", 16),
    "head": ("attention head", "circle", 13),
    "kv": ("key/value head", "triangle-up", 11),
    "mlp": ("MLP", "square", 13),
}


@dataclass(frozen=True)
class _Node:
    """A drawn node: its name (a head's, never one of its receivers'), kind, layer and place."""

    name: str
    kind: str
    layer: int
    x: float
    y: float
    detail: str


def graph_figure(
    table: pd.DataFrame, meta: Mapping[str, Any], *, edges: int | None = DEFAULT_EDGES, title: str | None = None
) -> go.Figure:
    """The circuit of ``table`` drawn as a graph: an edge-score table (``EdgeScores.table``:
    :meth:`Graph.table`'s columns and ``score``; at least ``edge``, ``sender``, ``receiver`` and
    ``score``), with ``score_lo``/``score_hi`` and ``stability`` shown where present.

    The circuit is the rows whose ``in_circuit`` is true when the table has that column, else every
    row; of it the ``edges`` largest by ``|score|`` are drawn (ties in table order; ``None``: all of
    it), so that a circuit of hundreds of edges still reads, its title saying how many are drawn.
    ``meta`` is the run's (the model, the
    metric, the direction, ``n_edges``, ``ci_level``; ``parallel`` or its graph's description says
    whether an MLP reads its own layer's heads). ``title`` defaults to the model, the circuit's
    size (n of N edges) and the metric and direction. See the module docstring for the layout."""
    if "score" not in table.columns:
        raise ValueError(f"graph_figure draws edge scores: the table has no 'score' column ({list(table.columns)})")
    if "site" not in table.columns:  # a hand-made table: the site is in the receiver's name
        table = table.assign(site=[_site(str(r)) for r in table["receiver"]])
    circuit = _circuit(table)
    chosen = _strongest(circuit, edges)
    layout = _Layout.of(table, meta)
    score = chosen["score"].to_numpy(dtype=float)
    finite = np.abs(score[np.isfinite(score)])
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    # symmetric about 0 whatever the data, so that a colour's side is the score's sign
    scale = Scale(
        f"edge score<br>({meta.get('metric') or 'metric'})", colorscale=DIVERGING, zmin=-top, zmax=top, zmid=0.0
    )
    refuse_greys(scale, "edge scores")  # no grey or white middle: a pale edge still says its sign
    cmin, cmax, cmid, colorscale = scale.limits(score)

    fig = go.Figure()
    nodes = {n: layout.node(n) for n in (INPUT, LOGITS)}
    ends: dict[str, list[str]] = {}  # node -> the sites of the chosen edges that touch it ("out": it sends)
    order = np.argsort(np.nan_to_num(np.abs(score)), kind="stable")  # the strongest drawn last, on top
    mids: list[tuple[float, float, float]] = []
    for i in order:
        row = chosen.iloc[int(i)]
        sender, receiver = layout.node(str(row["sender"])), layout.node(str(row["receiver"]))
        nodes.update({sender.name: sender, receiver.name: receiver})
        ends.setdefault(sender.name, []).append("out")
        ends.setdefault(receiver.name, []).append(str(row["site"]))
        x, y = _edge_path(sender, receiver, str(row["site"]))
        s = float(row["score"])
        strength = abs(s) / top if np.isfinite(s) else 0.0
        colour = _colour(s, top)
        label = _edge_label(row, meta)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                line=dict(
                    color=colour,
                    width=WIDTH_MIN + (WIDTH_MAX - WIDTH_MIN) * strength,
                    dash=SITE_DASH.get(row["site"], "solid"),
                ),
                hovertext=[label] * len(x),
                hovertemplate="%{hovertext}<extra></extra>",
                hoverlabel=dict(bgcolor=colour),
                name=str(row["edge"]),
                showlegend=False,
                meta={"edge": str(row["edge"]), "site": str(row["site"]), "score": s, "colour": colour},
            )
        )
        mids.append((float(x[len(x) // 2]), float(y[len(y) // 2]), s))
    if mids:  # the colour bar's trace: an unseen point at the middle of every edge, coloured by its score
        mx, my, ms = zip(*mids)
        fig.add_trace(
            go.Scatter(
                x=mx,
                y=my,
                mode="markers",
                marker=dict(size=6, color=ms, coloraxis="coloraxis", opacity=0.0, line=dict(width=0)),
                hoverinfo="skip",
                showlegend=False,
                meta={"scale": "edge score"},
            )
        )
    for site in sorted({str(s) for s in chosen["site"]} & {"q", "k", "v"}, key="qkv".index):
        fig.add_trace(  # the legend of the dashes: which input of a head an edge goes into
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                line=dict(color=NODE_COLOUR, width=2, dash=SITE_DASH[site]),
                name=f"into &lt;{site}&gt; ({LEGEND_SITE[site]})",
                meta={"legend": site},
            )
        )
    _add_nodes(fig, layout, nodes, ends)
    sizes = (len(circuit), len(chosen), len(table))  # the table holds every edge of the graph
    plot_h = _frame(fig, layout, _title(meta, *sizes, "in_circuit" in table.columns) if title is None else title)
    fig.update_layout(
        coloraxis=dict(
            colorscale=[list(stop) for stop in colorscale],
            cmin=cmin,
            cmax=cmax,
            cmid=cmid,
            colorbar=dict(
                title=dict(text=scale.title, side="top"),
                ticklabelposition="outside bottom",  # the top label clear of the title
                thickness=14,
                x=1.02,
                xanchor="left",
                y=1.0,
                yanchor="top",
                lenmode="pixels",
                len=max(120, plot_h - _legend_px(fig) - 24),
            ),
        )
    )
    return styled(fig)


def _circuit(table: pd.DataFrame) -> pd.DataFrame:
    """The rows in the circuit: ``in_circuit`` where the table says, else every row."""
    if "in_circuit" in table.columns:
        return table[table["in_circuit"].astype(bool).to_numpy()].reset_index(drop=True)
    return table


def _strongest(table: pd.DataFrame, edges: int | None) -> pd.DataFrame:
    """The ``edges`` rows of largest ``|score|`` (ties in table order; NaN last); all with ``None``."""
    if edges is None:
        return table
    if isinstance(edges, bool) or not isinstance(edges, int) or edges < 1:
        raise ValueError(f"edges={edges!r}: an integer >= 1, the number of edges to draw, or None for all")
    if len(table) <= edges:
        return table
    size = np.abs(table["score"].to_numpy(dtype=float))
    order = np.argsort(-np.nan_to_num(size, nan=-1.0), kind="stable")
    return table.iloc[order[:edges]].reset_index(drop=True)


def _site(receiver: str) -> str:
    """The site a receiver reads at, from its name: ``q``/``k``/``v``, ``mlp`` or ``logits``."""
    part = parse(receiver)
    if part is None:
        return receiver
    return part.site or ("mlp" if part.kind == "mlp" else receiver)


def _colour(score: float, top: float) -> str:
    """The colour of ``score`` on the scale from ``-top`` to ``top`` (0 at its middle)."""
    if not np.isfinite(score):
        return NODE_COLOUR
    r, g, b = colour_at(DIVERGING, 0.5 + 0.5 * max(-1.0, min(1.0, score / top)))
    return f"rgb({round(r)}, {round(g)}, {round(b)})"


def _edge_label(row: pd.Series, meta: Mapping[str, Any]) -> str:
    """An edge's hover: its name, where it goes, its score with the CI, its stability."""
    site = SITE_NAME.get(str(row["site"]), str(row["site"]))
    lines = [f"<b>{html.escape(str(row['edge']))}</b>", html.escape(site)]
    score = f"score {float(row['score']):.4g}"
    if "score_lo" in row.index and "score_hi" in row.index:
        level = meta.get("ci_level") or meta.get("level")
        ci = f"{float(level):.0%} CI" if level else "CI"
        score += f" [{float(row['score_lo']):.4g}, {float(row['score_hi']):.4g}] ({ci})"
    lines.append(score + (f" {html.escape(str(meta['metric']))}" if meta.get("metric") else ""))
    if "stability" in row.index and pd.notna(row["stability"]):
        top = f" (share of resamples in the top {meta['stability_top']})" if meta.get("stability_top") else ""
        lines.append(f"stability {float(row['stability']):.2f}{top}")
    qh = str(row.get("query_heads", "") or "")
    if getattr(parse(str(row["receiver"])), "kind", "") == "kv" and qh:
        lines.append(f"key/value head of query heads {qh}")
    return "<br>".join(lines)


class _Layout:
    """Where every node of the graph sits: rows by layer, columns by head (see the module docstring)."""

    def __init__(
        self,
        n_layers: int,
        n_heads: int,
        *,
        parallel: bool,
        has_mlp: bool,
        groups: Mapping[tuple[int, int], tuple[int, ...]],
    ):
        self.n_layers, self.n_heads, self.parallel, self.has_mlp = n_layers, n_heads, parallel, has_mlp
        self.groups = groups  # (layer, key/value head) -> the query heads it serves

    @classmethod
    def of(cls, table: pd.DataFrame, meta: Mapping[str, Any]) -> _Layout:
        """The layout of ``table``'s graph: layers and heads from ``meta`` or else from the node names,
        key/value heads' query heads from ``query_heads``, parallel blocks from ``meta``."""
        parts = [parse(n) for n in pd.unique(pd.concat([table["sender"], table["receiver"]]).astype(str))]
        parts = [p for p in parts if p is not None and p.kind in ("head", "kv", "mlp")]
        layers = [int(meta.get("n_layers") or 0) - 1, *(p.layer for p in parts)]
        heads = [int(meta.get("n_heads") or 0) - 1, *(p.index for p in parts if p.kind == "head")]
        if "receiver_layer" in table.columns:
            layers.append(int(table["receiver_layer"].max()) - 1)  # the logits' layer is n_layers
        groups: dict[tuple[int, int], tuple[int, ...]] = {}
        kv = [(parse(str(r)), qh) for r, qh in zip(table["receiver"], table.get("query_heads", [""] * len(table)))]
        kv = [(p, qh) for p, qh in kv if p is not None and p.kind == "kv"]
        n_kv = 1 + max((p.index for p, _ in kv), default=-1)
        for p, qh in kv:
            served = tuple(int(h) for h in str(qh or "").split())
            heads.extend(served)
            groups[(p.layer, p.index)] = served
        H = max(heads) + 1
        for key, served in list(groups.items()):  # a table without query_heads: the even split
            if not served:
                g = max(1, H // max(n_kv, 1))
                groups[key] = tuple(range(key[1] * g, (key[1] + 1) * g))
        has_mlp = any(p.kind == "mlp" for p in parts)
        return cls(max(layers) + 1, max(H, 1), parallel=_parallel(meta), has_mlp=has_mlp, groups=groups)

    @property
    def columns(self) -> int:
        """How many node columns a row needs (a parallel block's MLP takes one after the heads)."""
        return self.n_heads + (1 if self.parallel and self.has_mlp else 0)

    @property
    def centre(self) -> float:
        return (self.n_heads - 1) / 2

    def row(self, layer: int) -> float:
        """The y of a layer's heads (the input's row is 0, the logits' ``n_layers + 1``)."""
        return layer + 1.0

    def node(self, name: str) -> _Node:
        """The node an edge's end belongs to (a head's receiver: the head; a key/value head's: its own)."""
        part = parse(name)
        kind, l, j = (part.kind, part.layer, part.index) if part is not None else ("", 0, 0)
        if kind == INPUT:
            return _Node(INPUT, "input", -1, self.centre, 0.0, "the embeddings, the stream entering layer 0")
        if kind == LOGITS:
            return _Node(LOGITS, "input", self.n_layers, self.centre, self.row(self.n_layers), "the final residual")
        if kind == "head":
            return _Node(part.node, "head", l, float(j), self.row(l), f"head {j} of layer {l}")
        if kind == "kv":
            served = self.groups.get((l, j), (j,))
            detail = f"key/value head {j} of layer {l}, read by query heads {' '.join(map(str, served))}"
            return _Node(part.node, "kv", l, float(np.mean(served)), self.row(l) - KV_DROP, detail)
        if kind == "mlp":
            if self.parallel:
                return _Node(part.node, "mlp", l, float(self.n_heads), self.row(l), f"layer {l}'s MLP (parallel block)")
            return _Node(part.node, "mlp", l, self.centre, self.row(l) + MLP_RISE, f"layer {l}'s MLP")
        raise ValueError(f"{name!r} is not a node of the graph (input, {{l}}.{{h}}, {{l}}.kv{{j}}, mlp.{{l}}, logits)")


def _parallel(meta: Mapping[str, Any]) -> bool:
    """Whether an MLP reads what its own layer's heads read (a parallel block): ``meta["parallel"]``,
    else the graph's description in ``meta["graph"]`` (:meth:`Graph.describe` says "parallel
    blocks"); without either, an MLP reads after its heads."""
    if meta.get("parallel") is not None:
        return bool(meta["parallel"])
    return "parallel blocks" in str(meta.get("graph", ""))


def _edge_path(
    sender: _Node, receiver: _Node, site: str
) -> tuple[Float[np.ndarray, " point"], Float[np.ndarray, " point"]]:
    """The points of the line from ``sender`` up to just under ``receiver`` (offset by ``site``): a
    quadratic curve that bows sideways as far as the edge skips rows, so that it passes beside, not
    through, the nodes between its ends."""
    x0, y0 = sender.x, sender.y
    x1 = receiver.x + (SITE_OFFSET.get(site, 0.0) if receiver.kind in ("head", "kv") else 0.0)
    y1 = receiver.y - END_DROP
    skipped = max(0.0, (y1 - y0) - 1.0)
    side = 1.0 if x1 >= x0 else -1.0
    bend = side * min(0.25 * skipped, 1.2) if skipped > 0 else 0.0
    t = np.linspace(0.0, 1.0, CURVE_POINTS)
    cx, cy = (x0 + x1) / 2 + bend, (y0 + y1) / 2
    x = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t**2 * x1
    y = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t**2 * y1
    return x, y


def _add_nodes(fig: go.Figure, layout: _Layout, nodes: Mapping[str, _Node], ends: Mapping[str, list[str]]) -> None:
    """One marker trace per kind of node: the nodes the edges touch (``ends``), and the input and logits."""
    labels = layout.columns <= 16  # names beside the markers while they fit
    for kind, (legend, symbol, size) in NODE_STYLE.items():
        drawn = [node for node in nodes.values() if node.kind == kind]
        if not drawn:
            continue
        hover = [
            f"<b>{html.escape(n.name)}</b><br>{html.escape(n.detail)}<br>{_count(ends.get(n.name, []))}" for n in drawn
        ]
        fig.add_trace(
            go.Scatter(
                x=[n.x for n in drawn],
                y=[n.y for n in drawn],
                mode="markers+text" if labels else "markers",
                text=[_short(n.name) for n in drawn],
                textposition="middle right",
                textfont=dict(size=11, color=NODE_COLOUR),
                marker=dict(symbol=symbol, size=size, color=NODE_FILL, line=dict(color=NODE_COLOUR, width=1.6)),
                customdata=[n.name for n in drawn],
                hovertext=hover,
                hovertemplate="%{hovertext}<extra></extra>",
                name=legend,
                cliponaxis=False,
                meta={"nodes": kind},
            )
        )


def _short(name: str) -> str:
    """A node's label beside its marker: ``a1.h3`` as it is, ``a1.kv0`` as ``kv0``."""
    return name.split(".", 1)[1] if ".kv" in name else name


def _count(sites: list[str]) -> str:
    """A node's edges in the circuit: how many, in and out, and into which of its inputs."""
    out = sites.count("out")
    into = [s for s in sites if s != "out"]
    by_site = ", ".join(f"{s} {into.count(s)}" for s in ("q", "k", "v") if s in into)
    parts = [f"{len(into)} in" + (f" ({by_site})" if by_site else ""), f"{out} out"]
    return f"{len(sites)} in-circuit edge{'s' if len(sites) != 1 else ''}: " + ", ".join(parts)


def _title(meta: Mapping[str, Any], size: int, drawn: int, total: int, marked: bool) -> str:
    """The model, the circuit's size (and how much of it is drawn), the metric and the direction,
    and the gap's warning if any."""
    model = short_name(meta.get("model") or "model")
    if not marked:
        head = f"the {drawn:,} of {total:,} edges of largest |score|"
    else:
        head = f"circuit of {size:,} of {total:,} edges"
        if drawn < size:
            head += f", its {drawn:,} of largest |score| drawn"
    what = " · ".join(f"{k} {meta[k]}" for k in ("metric", "direction", "method") if meta.get(k))
    title = f"{model}: {head}" + (f"<br><sup>{html.escape(what)}</sup>" if what else "")
    warning = meta.get("gap_warning")
    return title + (f"<br><sup>{html.escape(str(warning))}</sup>" if warning else "")


def _frame(fig: go.Figure, layout: _Layout, title: str | None) -> int:
    """Axes (head columns, layer rows), size within :data:`MAX_WIDTH`; the plot's height in px."""
    L, cols = layout.n_layers, layout.columns
    col_px = max(34, min(110, (MAX_WIDTH - LEFT - RIGHT) // max(cols, 1)))
    width = int(min(MAX_WIDTH, max(640, title_width(title, LEFT), LEFT + RIGHT + col_px * (cols + 1))))
    row_px = max(48, min(140, 1500 // (L + 2)))
    plot_h = row_px * (L + 2)
    top = TOP + (22 * title.count("<br>") if title else -40)  # a line per line of the title
    height = int(top + BOTTOM + plot_h)
    rows = [0.0, *[layout.row(l) for l in range(L)], layout.row(L)]
    names = ["input", *[f"layer {l}" for l in range(L)], "logits"]
    fig.update_xaxes(
        range=[-0.9, cols - 0.1],
        tickmode="array",
        tickvals=list(range(layout.n_heads)),
        ticktext=[str(h) for h in range(layout.n_heads)],
        title_text="head",
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(
        range=[-0.6, L + 1.5],
        tickmode="array",
        tickvals=rows,
        ticktext=names,
        showgrid=True,
        zeroline=False,
        showline=False,
    )
    fig.update_layout(
        title=dict(text=title, x=0.0, xanchor="left", y=1 - 12 / height, yanchor="top") if title else None,
        width=width,
        height=height,
        margin=dict(l=LEFT, r=RIGHT, t=top, b=BOTTOM),
        legend=dict(x=1.02, xanchor="left", y=0.0, yanchor="bottom", font=dict(size=11), tracegroupgap=0),
        hovermode="closest",
        plot_bgcolor="white",
    )
    return plot_h


def _legend_px(fig: go.Figure) -> int:
    """The height the legend takes: an entry per trace shown in it, and its padding."""
    return 12 + LEGEND_PX * sum(1 for t in fig.data if t.showlegend is not False)


__all__ = ["graph_figure"]
