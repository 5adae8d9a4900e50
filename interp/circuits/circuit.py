"""Circuits: subgraphs of edges, extracted from edge scores and evaluated exactly.

A :class:`Circuit` is a set of the graph's edges (a boolean per edge, in :meth:`Graph.table` order).
It is extracted from scores (:data:`HOWS`: the top ``n`` by absolute score, greedy from the logits down,
or a threshold, as EAP-IG's ``apply_topn``, ``apply_greedy`` and ``apply_threshold`` do), and then
pruned: an edge stays only where its sender is reached from the input and its receiver reaches the
logits along the circuit's own edges.

Evaluation is exact, EAP-IG's ``evaluate_graph``: the clean prompt runs, and every receiver reads each
sender outside the circuit at its value on the corrupted prompt (``source="patch"``), at that
value's position-wise mean over the pairs (``"mean"``), at zero (``"zero"``) or at its value on another
pair's clean prompt (``"resample"``, a seeded derangement of the pairs); edges in the circuit carry
what this run computes. Every size of a curve is one row of one batched replay (:class:`EdgeSweeper`).
Faithfulness is ``(M_circuit - M_corrupted) / (M_clean - M_corrupted)`` (a ratio of means over
pairs, with a bootstrap CI over pairs), ``M_corrupted`` being the empty circuit's metric (equal to
the corrupted run's when the source is the paired prompt). Over MIB's edge fractions
(:data:`MIB_FRACTIONS`, ``n = floor(fraction * edges)``) the curve's CPR is the area under it and its
CMD the area between it and 1 (trapezoids over the fractions, as MIB computes them).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.ablation.metrics import Metric
from interp.adapters import HookedModel
from interp.circuits.curve import FAITHFUL, FaithfulnessCurve, trapezoid, with_smallest_faithful
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.journal import Journal
from interp.names import INPUT, LOGITS, head_name, memory_name
from interp.patching.core import gap_meta, pooled_ratio, setup
from interp.patching.edge_patch import SOURCES, CodeUnits, EdgeSweeper
from interp.patching.edge_replay import SOURCE
from interp.patching.graph import Graph, Shape, graph_of
from interp.probes.task import TaskProbe
from interp.registry import Registry
from interp.results import EDGE_COLUMNS, SHOWN_ROWS, Result, plural
from interp.scores import with_interval

if TYPE_CHECKING:
    import plotly.graph_objects as go

MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
REFINE, REFINE_SIZES = 2, 8  # rounds narrowing down the smallest faithful size, and the sizes each evaluates

HOWS: Registry[str] = Registry("circuit extraction")
HOWS.add("top", "the n edges of largest absolute score, then pruned (EAP-IG's apply_topn)")
HOWS.add(
    "greedy",
    "from the logits down: each step adds the edge of largest absolute score into a node already in the circuit (EAP-IG's apply_greedy)",
)
HOWS.add(
    "threshold", "every edge whose absolute score is at least the threshold, then pruned (EAP-IG's apply_threshold)"
)


def _receiver_nodes(graph: Graph) -> list[list[str]]:
    """The node(s) each receiver belongs to: a head's input its head (a key/value head's: every
    query head it serves), an MLP's input the MLP, the logits themselves."""
    out = []
    for r in graph.receivers:
        if r.kind == "head":
            out.append([head_name(r.layer, q) for q in r.query_heads])
        else:
            out.append([r.name])
    return out


def prune(graph: Graph, keep: Bool[np.ndarray, " edge"]) -> Bool[np.ndarray, " edge"]:
    """``keep`` less every edge no input-to-logits path of kept edges crosses: its sender must be
    reached from the input, and a node its receiver feeds must reach the logits."""
    keep = np.asarray(keep, dtype=bool)
    idx = graph.edge_index().numpy()
    senders = [n.name for n in graph.senders]
    nodes = _receiver_nodes(graph)
    stage = np.array([graph.receivers[r].stage for _, r in idx])
    order = np.argsort(stage, kind="stable")
    reached = {INPUT}
    for e in order:
        if keep[e] and senders[idx[e, 0]] in reached:
            reached.update(nodes[idx[e, 1]])
    alive = {LOGITS}
    for e in order[::-1]:
        if keep[e] and any(n in alive for n in nodes[idx[e, 1]]):
            alive.add(senders[idx[e, 0]])
    out = keep.copy()
    for e in np.flatnonzero(keep):
        s, r = idx[e]
        out[e] = senders[s] in reached and senders[s] in alive and any(n in alive for n in nodes[r])
    return out


def select(
    graph: Graph,
    scores: Float[np.ndarray, " edge"],
    how: str = "top",
    *,
    n: int | None = None,
    threshold: float | None = None,
) -> Bool[np.ndarray, " edge"]:
    """The edges ``how`` extracts from ``scores`` (absolute values ranked; ties in table order), pruned."""
    HOWS.check(how)
    mag = _magnitudes(scores)
    if how == "threshold":
        if threshold is None:
            raise UsageError(
                "how=threshold needs threshold=: the least absolute score an edge keeps", params="threshold"
            )
        return prune(graph, mag >= threshold)
    if n is None or n < 0:
        raise UsageError(f"how={how} needs n=: how many edges (an integer >= 0)", params="n")
    if how == "top":
        return prune(graph, _top(mag, n))
    return prune(graph, _greedy(graph, mag, n))


def _magnitudes(scores: Float[np.ndarray, " unit"]) -> Float[np.ndarray, " unit"]:
    """Absolute scores, NaN (an unscored edge) at -1: below every score, so never kept over one."""
    return np.nan_to_num(np.abs(np.asarray(scores, dtype=np.float64)), nan=-1.0)


def _top(mag: Float[np.ndarray, " unit"], n: int) -> Bool[np.ndarray, " unit"]:
    """The ``n`` units of largest ``mag`` (ties in order)."""
    keep = np.zeros(len(mag), dtype=bool)
    keep[np.argsort(-mag, kind="stable")[: min(n, len(mag))]] = True
    return keep


def _greedy(graph: Graph, mag: np.ndarray, n: int) -> np.ndarray:
    """From the logits down: the edge of largest absolute score whose receiver's node is already in,
    its sender's node then in too, ``n`` times (or until none is left)."""
    idx = graph.edge_index().numpy()
    nodes = _receiver_nodes(graph)
    by_node: dict[str, list[int]] = {}
    for e, (_, r) in enumerate(idx):
        for node in nodes[r]:
            by_node.setdefault(node, []).append(e)
    keep = np.zeros(len(mag), dtype=bool)
    heap: list[tuple[float, int]] = []
    inside: set[str] = set()

    def enter(node: str) -> None:
        if node not in inside:
            inside.add(node)
            for e in by_node.get(node, []):
                heapq.heappush(heap, (-mag[e], e))

    enter(LOGITS)
    while heap and int(keep.sum()) < n:
        _, e = heapq.heappop(heap)
        if keep[e] or mag[e] < 0:
            continue
        keep[e] = True
        enter(graph.senders[idx[e, 0]].name)
    return keep


def sizes_of(n_edges: int, fractions: Sequence[float] = MIB_FRACTIONS) -> list[int]:
    """MIB's circuit sizes: ``floor(fraction * edges)`` for each fraction."""
    return [int(f * n_edges) for f in fractions]


@dataclass(repr=False)
class Circuit(Result):
    """A circuit: :meth:`Graph.table`'s rows with ``in_circuit`` (and the scores it was extracted from,
    where it was); ``meta`` holds the graph's shape (``shape``) so it reads back alone."""

    KIND = "circuit"
    what = "circuit"
    shown_by = "abs_score"
    fixed_columns = EDGE_COLUMNS

    def headline(self) -> str:
        """The class, the model, the circuit's size in the graph and its faithfulness (where evaluated)."""
        m = self.meta
        line = f"Circuit of {m.get('model', 'a model')}: {plural(self.n_edges, 'edge')} of {len(self.table):,}"
        if "faithfulness" in m:
            line += f", faithfulness {with_interval(m['faithfulness'], *m['faithfulness_ci'], '.3f')}"
        return line

    def shown_rows(self, n: int = SHOWN_ROWS) -> pd.DataFrame:
        """The circuit's own edges, largest ``|score|`` first."""
        inside = self.table[self.table["in_circuit"]]
        by = self.ranked_by()
        return (inside.sort_values(by, ascending=False, kind="mergesort") if by else inside).head(n)

    @classmethod
    def of(
        cls, graph: Graph, in_circuit: Bool[np.ndarray, " edge"], scores: np.ndarray | None = None, **meta: Any
    ) -> Circuit:
        table = graph.table()
        table["in_circuit"] = np.asarray(in_circuit, dtype=bool)
        if scores is not None:
            table["score"] = np.asarray(scores, dtype=np.float64)
            table["abs_score"] = np.abs(table["score"])
        info = {"shape": graph.shape.as_dict(), "n_edges": int(table.in_circuit.sum()), "graph_edges": len(table)}
        return cls(table, {**meta, **info})

    @classmethod
    def of_nodes(cls, graph: Graph, nodes: Sequence[str], scores: np.ndarray | None = None, **meta: Any) -> Circuit:
        """The node circuit of ``nodes`` (senders, in any spelling: ``input``, ``0.1``, ``mlp.0``):
        every edge out of them and no other, as EAP-IG's node-level circuits keep a node's outgoing
        edges (``apply_topn(level='node')``); ``scores``: its edges' scores, where it has them. Evaluated,
        every other sender is patched for all its readers: node patching of those senders."""
        named = [memory_name(n) for n in nodes]
        senders = {n.name for n in graph.senders}
        unknown = [n for n in named if n not in senders]
        if unknown:
            raise UsageError(
                f"nodes=: {unknown[0]!r} is not a sender of this graph ({graph.describe()}): name the input "
                f"({INPUT!r}), heads ('0.1') and MLPs ('mlp.0')",
                params="nodes",
            )
        keep = graph.table()["sender"].isin(named).to_numpy()
        return cls.of(graph, keep, scores, level="node", nodes=named, **meta)

    @property
    def graph(self) -> Graph:
        return Graph(Shape.of_dict(self.meta.get("shape")))

    @property
    def in_circuit(self) -> Bool[np.ndarray, " edge"]:
        return self.table["in_circuit"].to_numpy(dtype=bool)

    @property
    def n_edges(self) -> int:
        return int(self.in_circuit.sum())

    @property
    def edges(self) -> list[str]:
        return list(self.table.edge[self.in_circuit])

    @property
    def nodes(self) -> list[str]:
        """The nodes the circuit's edges touch, senders first in graph order, then the logits."""
        t = self.table[self.in_circuit]
        names = list(dict.fromkeys(t.sender))
        return names + [LOGITS] if (t.receiver == LOGITS).any() else names

    def evaluate(
        self,
        model: HookedModel,
        task: TaskProbe | str | Path,
        *,
        source: str = "patch",
        metric: str | Metric | Callable | None = None,
        n_pairs: int | None = None,
        config: RunConfig | None = None,
    ) -> FaithfulnessCurve:
        """This circuit's faithfulness on ``task`` (one point; see the module docstring)."""
        return evaluate_circuits(
            model,
            task,
            [self.in_circuit],
            source=source,
            metric=metric,
            n_pairs=n_pairs,
            config=config,
        )

    def faithfulness_curve(
        self,
        model: HookedModel,
        task: TaskProbe | str | Path,
        *,
        fractions: Sequence[float] = MIB_FRACTIONS,
        how: str = "top",
        source: str = "patch",
        metric: str | Metric | Callable | None = None,
        n_pairs: int | None = None,
        config: RunConfig | None = None,
    ) -> FaithfulnessCurve:
        """The faithfulness of the circuits ``how`` extracts from this circuit's scores at MIB's sizes."""
        if "score" not in self.table:
            raise UsageError(
                "this circuit holds no scores to extract circuits of other sizes from: "
                "use EdgeScores.faithfulness_curve"
            )
        return faithfulness_curve(
            model,
            task,
            self.table["score"].to_numpy(),
            fractions=fractions,
            how=how,
            source=source,
            metric=metric,
            n_pairs=n_pairs,
            config=config,
        )

    def to_json(self, d_model: int | None = None) -> dict[str, Any]:
        """EAP-IG's graph JSON of this circuit (``Graph.from_json`` reads it); its ``cfg`` holds
        ``d_model`` (the model's width), else the one the circuit was read with (``meta["d_model"]``)."""
        from interp.circuits.eapig import to_eapig

        scores = self.table["score"].to_numpy() if "score" in self.table else None
        return to_eapig(self.graph, self.in_circuit, scores, d_model=d_model or self.meta.get("d_model"))

    @classmethod
    def from_eapig(cls, data: dict[str, Any] | str | Path, graph: Graph | HookedModel) -> Circuit:
        """The circuit in EAP-IG's graph JSON (a dict as ``Graph.to_json`` writes it, or its file), on
        ``graph`` (or a model's): its ``in_graph`` edges, their scores; refused where the shapes differ."""
        from interp.circuits.eapig import from_eapig, read_eapig_json

        if not isinstance(data, dict):
            data = read_eapig_json(data)
        if not isinstance(graph, Graph):
            graph = graph_of(graph, "a circuit")
        in_graph, scores = from_eapig(data, graph)
        width = data["cfg"].get("d_model")
        meta = {"d_model": int(width)} if isinstance(width, int) and width > 0 else {}
        return cls.of(graph, in_graph, scores, read_from="EAP-IG graph JSON", **meta)

    def figure(self, title: str | None = None, edges: int | None = 60) -> go.Figure:
        """The circuit drawn as a graph (:func:`~interp.circuits.figure.graph_figure`): its ``edges``
        edges of largest ``|score|`` (all of it when it has no more, or with ``edges=None``), the
        title saying how many of its edges are drawn."""
        from interp.circuits.figure import graph_figure

        return graph_figure(self.table, self.meta, edges=edges, title=title)


BY = ("edge", "position")  # scores and circuits per edge, or per (edge, position) pair


def check_by(by: str) -> None:
    """Refuse a ``by`` that is neither ``edge`` nor ``position``."""
    if by not in BY:
        raise UsageError(
            f"by={by!r}: 'edge' (a score per edge, summed over positions) or 'position' (a score per edge and position)",
            params="by",
        )


def validate_circuit(
    *, how: str = "top", source: str = "patch", fractions: Sequence[float] = MIB_FRACTIONS, by: str = "edge"
) -> None:
    """What extraction and evaluation refuse before any forward, without a model."""
    HOWS.check(how)
    SOURCES.check(source)
    check_by(by)
    if by == "position" and how != "top":
        raise UsageError(
            f"how={how} grows or cuts whole edges; by='position' keeps the top (edge, position) pairs: how='top'",
            params=("how", "by"),
        )
    bad = [f for f in fractions if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1]
    if bad or not fractions:
        raise UsageError(
            f"fractions={list(fractions)}: each a share of the graph's edges in [0, 1]", params="fractions"
        )


def faithfulness_curve(
    model: HookedModel,
    task: TaskProbe | str | Path,
    scores: Float[np.ndarray, " edge"],
    *,
    fractions: Sequence[float] = MIB_FRACTIONS,
    how: str = "top",
    source: str = "patch",
    refine: bool = True,
    metric: str | Metric | Callable | None = None,
    n_pairs: int | None = None,
    by: str = "edge",
    config: RunConfig | None = None,
    journal: Journal | None = None,
) -> FaithfulnessCurve:
    """The circuits ``how`` extracts from ``scores`` (per edge, :meth:`Graph.table` order) at
    ``floor(fraction * edges)`` edges each, evaluated in one batched pass; CPR and CMD over the
    fractions. ``refine``: then the smallest faithful size is narrowed down in :data:`REFINE` rounds,
    each evaluating up to :data:`REFINE_SIZES` evenly spaced sizes in one pass between the two sizes
    around the first reaching :data:`FAITHFUL` (the MIB fractions', then the last round's), so it is
    found to within ``1 / (REFINE_SIZES + 1) ** REFINE`` of that first bracket (rows with ``mib``
    false; CPR and CMD read MIB's rows only). ``by="position"``: ``scores`` per edge and position
    (each edge's positions in turn, as ``edge_scores(by="position")`` gives them), the units counted
    and kept are (edge, position) pairs, the top ones by absolute score (``how="top"``; not pruned:
    a path is a matter of edges, not of positions); outside the circuit a receiver reads the
    sender at the source at that position only."""
    validate_circuit(how=how, source=source, fractions=fractions, by=by)
    missing = int(np.isnan(np.asarray(scores, dtype=np.float64)).sum())
    if missing:
        raise UsageError(
            f"{missing:,} of {len(scores):,} scores are NaN (exact scores of a subset of edges, or an interrupted "
            "run?): a circuit of a given size needs every edge scored; score all edges (edge_scores without edges=)",
            params="scores",
        )
    ev = _Evaluation(model, task, source, metric, n_pairs, config, journal, by == "position")
    if len(scores) != ev.units:
        per = f" at {ev.units:,} (edge, position) pairs" if ev.positions else ""
        raise UsageError(
            f"{len(scores)} scores for a graph of {ev.graph.n_edges:,} edges{per}: score this model's graph "
            f"(edge_scores{', by=position' if ev.positions else ''})"
        )
    sizes = sizes_of(ev.units, fractions)
    table = ev.rows([ev.select(scores, how, n) for n in sizes], sizes)
    table.insert(1, "fraction", list(fractions))
    table["mib"] = True
    for k in range(REFINE if refine else 0):
        reached = np.flatnonzero(table.faithfulness.to_numpy() >= FAITHFUL)
        if ev.sweeper.interrupted or not len(reached) or reached[0] == 0:
            break
        lo, hi = int(table["size"].iloc[reached[0] - 1]), int(table["size"].iloc[reached[0]])
        between = sorted(set(np.linspace(lo + 1, hi - 1, min(REFINE_SIZES, hi - lo - 1)).round().astype(int)))
        if not between:
            break
        extra = ev.rows([ev.select(scores, how, n) for n in between], between, scope=f"refine{k + 1}")
        extra.insert(1, "fraction", [n / ev.units for n in between])
        extra["mib"] = False
        table = pd.concat([table, extra]).sort_values(["size", "mib"], kind="stable").reset_index(drop=True)
    meta = ev.meta(how=how)
    mib = table[table.mib]
    if len(mib) > 1:
        f, x = mib.faithfulness.to_numpy(), mib.fraction.to_numpy(dtype=np.float64)
        meta["cpr"] = trapezoid(f, x)
        meta["cmd"] = trapezoid(np.abs(1 - f), x)
    return FaithfulnessCurve(table, with_smallest_faithful(table, meta))


def evaluate_circuits(
    model: HookedModel,
    task: TaskProbe | str | Path,
    circuits: Sequence[Bool[np.ndarray, " edge"]],
    *,
    source: str = "patch",
    metric: str | Metric | Callable | None = None,
    n_pairs: int | None = None,
    config: RunConfig | None = None,
    journal: Journal | None = None,
) -> FaithfulnessCurve:
    """Each circuit's metric and faithfulness (a row each, ``size`` its edge count), every circuit one
    row of one batched replay."""
    SOURCES.check(source)
    ev = _Evaluation(model, task, source, metric, n_pairs, config, journal)
    n = [int(np.asarray(c).sum()) for c in circuits]
    table = ev.rows(circuits, n)
    table.insert(1, "fraction", [k / ev.graph.n_edges for k in n])
    return FaithfulnessCurve(table, with_smallest_faithful(table, ev.meta()))


class _Evaluation:
    """One task's circuits evaluated on one sweeper: the clean prompts run, the source's senders
    read outside each circuit; the empty circuit measured once, as the faithfulness's zero."""

    def __init__(
        self,
        model: HookedModel,
        task: TaskProbe | str | Path,
        source: str,
        metric: str | Metric | Callable | None,
        n_pairs: int | None,
        config: RunConfig | None,
        journal: Journal | None,
        positions: bool = False,
    ):
        self.graph = graph_of(model, "circuit evaluation")
        self.run = setup(model, task, metric=metric, direction="noise", n_pairs=n_pairs, config=config)
        self.source, self.positions = source, positions  # positions: circuits of (edge, position) pairs
        self.units = self.graph.n_edges * (self.run.task.seq_len if positions else 1)
        self.sweeper = EdgeSweeper(self.run, self.graph, source=source, what="circuit evaluation", journal=journal)
        self.empty = self._values([np.zeros(self.units, dtype=bool)], "empty")[0]

    def select(self, scores: np.ndarray, how: str, n: int) -> Bool[np.ndarray, " unit"]:
        """The ``n`` units ``how`` keeps: edges, pruned (:func:`select`), or the top (edge, position) pairs."""
        return _top(_magnitudes(scores), n) if self.positions else select(self.graph, scores, how, n=n)

    def _values(self, circuits: Sequence[np.ndarray], scope: str) -> Tensor:
        idx = self.graph.edge_index()
        g = self.graph
        pos = (self.run.task.seq_len,) if self.positions else ()
        codes = torch.zeros(len(circuits), len(g.senders), len(g.receivers), *pos, dtype=torch.int8)
        for i, keep in enumerate(circuits):
            if self.positions:  # [edge, pos]: each edge's positions outside read the source there
                out = torch.as_tensor(~np.asarray(keep, dtype=bool).reshape(g.n_edges, -1))
                codes[i, idx[:, 0], idx[:, 1]] = torch.where(out, SOURCE, 0).to(torch.int8)
                continue
            out = idx[torch.as_tensor(~np.asarray(keep, dtype=bool))]
            codes[i, out[:, 0], out[:, 1]] = SOURCE
        return self.sweeper.evaluate(
            CodeUnits(g, codes), desc=f"evaluating circuits ({scope})", scope=f"circuits-{self.source}-{scope}"
        )

    def rows(self, circuits: Sequence[np.ndarray], sizes: Sequence[int], scope: str = "sizes") -> pd.DataFrame:
        values = self._values(circuits, scope)
        num = values - self.empty[None]
        den = (self.run.clean - self.empty).expand_as(num)
        point, lo, hi = pooled_ratio(num.T, den.T, self.run.config)
        return pd.DataFrame(
            {
                "size": list(sizes),
                "n_edges": [int(np.asarray(c).sum()) for c in circuits],
                "metric": values.mean(1).double().numpy(),
                "faithfulness": point.double().numpy(),
                "faithfulness_lo": lo.double().numpy(),
                "faithfulness_hi": hi.double().numpy(),
            }
        )

    def meta(self, **extra: Any) -> dict[str, Any]:
        run, cfg = self.run, self.run.config
        meta = run_header(
            run.info,
            run.probe,
            kind=FaithfulnessCurve.KIND,
            task=run.task.name,
            n_pairs=run.task.n_pairs,
            metric=run.metric.name,
            source=self.source,
            **extra,
            graph=self.graph.describe(),
            shape=self.graph.shape.as_dict(),
            graph_edges=self.graph.n_edges,
            **({"by": "position", "graph_units": self.units} if self.positions else {}),
            clean_metric=float(run.clean.mean()),
            corrupted_metric=float(run.corrupted.mean()),
            empty_metric=float(self.empty.mean()),
            **gap_meta(run),
            replay=self.sweeper.replay,
            ci_level=cfg.level,
            **cfg.as_dict(),
        )
        if self.sweeper.interrupted:
            meta["partial"] = True
        return meta
