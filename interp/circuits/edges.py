"""Edge attribution: a score for every edge of the graph (:mod:`interp.patching.graph`) from a few
forwards and backwards, EAP-IG's definitions.

An edge's score is the first-order estimate of patching that edge alone, the sender's output
changed to its donor value as only that receiver reads it:

    score = sum over positions of (donor output - own output) . dM / d(receiver input)

``own`` is the run's prompt of each pair (the corrupted one denoising, the clean one noising, the
task's ``direction``), ``donor`` its paired prompt; EAP-IG runs the clean prompt with the corrupted
one as donor, our ``direction="noise"``. The gradient is taken at one or more points, averaged
(:data:`METHODS`), at the points EAP-IG takes: ``eap`` the own run; ``eap-ig-inputs`` the input
embeddings at ``donor + (k / m) (own - donor)``, ``k = 0 .. m - 1``; ``eap-ig-activations`` each
node layer in turn (the input, a layer's heads, a layer's MLP) alone at ``k / m``, ``k = 1 .. m``
(``(1 + 2 L) m`` passes); ``clean-corrupted`` the own run and the donor run.
The score is in the metric's own units, the mean over pairs, with a bootstrap CI over pairs and the
edge's stability (the share of the bootstrap resamples in which it is among the ``top`` edges by
absolute score).

The passes and the contraction are :mod:`~interp.circuits.passes`'s (memory O(T): the gradients are
read at the receivers' own inputs, no pattern formed where the attention runs fused).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp import memory
from interp.ablation.metrics import Metric
from interp.adapters import HookedModel
from interp.circuits.circuit import check_by
from interp.circuits.passes import METHODS, GradientPasses, edge_memory, fused_attention
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.journal import Journal
from interp.names import memory_name
from interp.patching.core import FEWER_PAIRS, Setup, gap_meta, own_metric, setup, validate_setup
from interp.patching.edge_patch import EdgeSweeper, EdgeUnits
from interp.patching.graph import Graph, Shape, graph_of
from interp.probes.task import DEFAULT_DIRECTION, TaskProbe
from interp.results import EDGE_COLUMNS, Result
from interp.scores import bootstrap_mean

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from interp.circuits.circuit import Circuit
    from interp.circuits.curve import FaithfulnessCurve

STEM = "edge_scores"
DEFAULT_TOP = 20  # the stability's top-n
IG_STEPS = 5  # EAP-IG's usual m


class EdgeScores(Result):
    """A row per edge (:meth:`Graph.table`'s columns, then ``score`` with ``score_lo``/``score_hi``,
    its bootstrap CI over pairs, and ``stability``); ``meta`` starts with the run header."""

    KIND = STEM
    what = "edge scores"
    shown_by = "abs_score"
    fixed_columns = EDGE_COLUMNS  # the edge, its signed score and CI, its stability (ranked by |score|)

    def top(self, n: int = DEFAULT_TOP) -> pd.DataFrame:
        """The ``n`` edges of largest absolute score, largest first (ties in table order)."""
        order = np.argsort(-self.table["score"].abs().to_numpy(), kind="stable")
        return self.table.iloc[order[:n]].reset_index(drop=True)

    @property
    def graph(self) -> Graph:
        """The graph these edges belong to (read from ``meta["shape"]``)."""
        return Graph(Shape.of_dict(self.meta.get("shape")))

    def circuit(self, n: int | None = None, *, how: str = "top", threshold: float | None = None) -> Circuit:
        """The circuit ``how`` extracts from these scores (:data:`~interp.circuits.circuit.HOWS`):
        the top ``n`` edges by absolute score, ``n`` edges greedily from the logits down, or every edge
        whose absolute score reaches ``threshold``; pruned to the edges on input-to-logits paths."""
        from interp.circuits.circuit import Circuit, select

        self._per_edge("a circuit")
        scores = self.table["score"].to_numpy()
        keep = select(self.graph, scores, how, n=n, threshold=threshold)
        asked = {
            "how": how,
            **({"n": n} if n is not None else {}),
            **({"threshold": threshold} if threshold is not None else {}),
        }
        meta = self._provenance()
        circuit = Circuit.of(self.graph, keep, scores, **meta, **asked)
        at = circuit.table.columns.get_loc("score") + 1
        for n, column in enumerate(c for c in ("score_lo", "score_hi", "stability") if c in self.table):
            circuit.table.insert(at + n, column, self.table[column].to_numpy())  # its CSV, hover and repr show them
        return circuit

    @property
    def by(self) -> str:
        """``edge`` (a row per edge) or ``position`` (a row per edge and position)."""
        return self.meta.get("by", "edge")

    def _per_edge(self, what: str) -> None:
        """Refuse ``what``, which takes a score per edge, on scores per edge and position."""
        if self.by == "position":
            raise UsageError(
                f"{what} takes a score per edge; these scores are per edge and position (by='position'): "
                "score with by='edge' (each edge's sum over positions)"
            )

    def _provenance(self) -> dict[str, Any]:
        """What a circuit extracted from these scores carries of their meta: model, task, method, direction, metric."""
        return {k: self.meta[k] for k in ("model", "task", "method", "direction", "metric") if k in self.meta}

    def node_scores(self) -> pd.DataFrame:
        """A row per sender (``node``, ``layer``, ``score``, ``abs_score``; graph order): the sum of its
        edges' scores, EAP-IG's node score (``level='node'``). A sender's output reaches every receiver
        above it through the residual stream, so the gradient at that output is the sum of theirs: a
        head's node score is :func:`~interp.patching.patch_heads`' attribution of it (tested). NaN where
        an edge of the sender is unscored."""
        g = self.table.groupby("sender", sort=False)
        return pd.DataFrame(
            {
                "node": list(g.groups),
                "layer": g["sender_layer"].first().to_numpy(),
                "score": g["score"].apply(lambda s: s.sum(skipna=False)).to_numpy(),
            }
        ).assign(abs_score=lambda t: t["score"].abs())

    def node_circuit(self, n: int) -> Circuit:
        """The node circuit of the ``n`` senders of largest absolute :meth:`node_scores` (ties in graph
        order; EAP-IG's ``apply_topn(n, level='node')``): every edge out of them
        (:meth:`~interp.circuits.Circuit.of_nodes`)."""
        from interp.circuits.circuit import Circuit

        self._per_edge("a node circuit")
        nodes = self.node_scores()
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= len(nodes):
            raise UsageError(f"n={n!r}: a number of nodes from 0 to {len(nodes)} (the graph's senders)", params="n")
        if nodes["score"].isna().any():
            raise UsageError(
                "some nodes have unscored edges (exact scores of a subset of edges?): a node's score sums all its "
                "edges; score all edges (edge_scores without edges=)",
                params="n",
            )
        top = nodes["node"].to_numpy()[np.argsort(-nodes["abs_score"].to_numpy(), kind="stable")[:n]]
        meta = self._provenance()
        return Circuit.of_nodes(self.graph, list(top), self.table["score"].to_numpy(), how="top", n=n, **meta)

    def faithfulness_curve(
        self,
        model: HookedModel,
        task: TaskProbe | str | Path,
        *,
        how: str = "top",
        source: str = "patch",
        config: RunConfig | None = None,
        **options: Any,
    ) -> FaithfulnessCurve:
        """The faithfulness of the circuits extracted from these scores at MIB's sizes
        (:func:`~interp.circuits.circuit.faithfulness_curve`; ``options``: its ``fractions``,
        ``refine``, ``metric``, ``n_pairs``, ``journal``); scores by position make circuits of
        (edge, position) pairs."""
        from interp.circuits.circuit import faithfulness_curve

        scores = self.table["score"].to_numpy()
        return faithfulness_curve(model, task, scores, how=how, source=source, by=self.by, config=config, **options)

    def figure(self, title: str | None = None, edges: int = 60) -> go.Figure:
        """The ``edges`` edges of largest absolute score, drawn as a graph (:func:`~interp.circuits.figure.graph_figure`)."""
        from interp.circuits.figure import graph_figure

        self._per_edge("the graph figure")
        return graph_figure(self.table, self.meta, edges=edges, title=title)


def validate_edge_scores(
    *,
    method: str = "eap",
    steps: int | None = None,
    metric: str | Metric | Callable | None = None,
    direction: str = DEFAULT_DIRECTION,
    top: int = DEFAULT_TOP,
    by: str = "edge",
) -> None:
    """What :func:`edge_scores` refuses before any forward, without a model: an unknown name,
    ``steps`` given to a method without steps or not an integer >= 1, a ``top`` that is not >= 1,
    ``by`` neither ``edge`` nor ``position``, or ``position`` with ``method="exact"``."""
    METHODS.check(method)
    check_by(by)
    if by == "position" and method == "exact":
        attribution = ", ".join(m for m in METHODS if m != "exact")
        raise UsageError(
            f"method=exact patches each edge at every position at once; by='position' takes an attribution method "
            f"({attribution})",
            params=("method", "by"),
        )
    validate_setup(metric=metric, direction=direction)
    if steps is not None and not METHODS.info(method, "steps"):
        stepped = " or ".join(METHODS.select(lambda e: e.info.get("steps", False)))
        raise UsageError(
            f"method={method} does not read steps= (it applies to method={stepped}): drop it",
            params=("method", "steps"),
        )
    for name, value in (("steps", steps), ("top", top)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"{name}={value!r}: an integer >= 1", params=name)


def edge_scores(
    model: HookedModel,
    task: TaskProbe | str | Path,
    *,
    method: str = "eap",
    steps: int | None = None,
    metric: str | Metric | Callable | None = None,
    direction: str = DEFAULT_DIRECTION,
    n_pairs: int | None = None,
    top: int = DEFAULT_TOP,
    edges: Sequence[str] | None = None,
    by: str = "edge",
    config: RunConfig | None = None,
    journal: Journal | None = None,
) -> EdgeScores:
    """Every edge of ``model``'s graph scored on ``task`` by ``method`` (see the module docstring).

    ``task``, ``metric``, ``direction`` and ``n_pairs`` as for :func:`interp.patch_heads`; ``steps``:
    the points of an ``eap-ig-*`` method (default 5); ``top``: the n of each edge's stability.
    ``edges``: with ``method="exact"``, the edges to patch (by name, e.g. an attribution's top rows'
    ``edge``; default every edge), the others left NaN; ``journal``: exact's record, for a resumed run.
    ``by="position"``: a row per edge and position (``position``, auto-circuit's position-specific
    edges: the receiver at that position reading the sender's output there), the terms whose sum over
    positions is the edge's score; its stability ranks (edge, position) rows, and its
    :meth:`EdgeScores.faithfulness_curve` evaluates circuits of (edge, position) pairs.
    ``config``: its ``minibatch`` (pairs per pass), ``n_boot``, ``level`` and ``seed``. A model the
    graph cannot describe is refused before any forward, and so is a run that would not fit in memory
    (the estimate said)."""
    validate_edge_scores(
        method=method, steps=steps, metric=own_metric(task, metric), direction=direction, top=top, by=by
    )
    if edges is not None and method != "exact":
        raise UsageError(
            f"method={method} scores every edge at once; edges= picks the edges of method=exact", params="edges"
        )
    graph = graph_of(model)
    if method == "exact":
        return _exact(model, task, graph, metric, direction, n_pairs, top, edges, config, journal)
    run = setup(model, task, metric=metric, direction=direction, n_pairs=n_pairs, config=config, measured=False)
    m = (steps or IG_STEPS) if METHODS.info(method, "steps") else 1
    step = run.config.minibatch or run.task.n_pairs
    fused = fused_attention(run.model, run.config, run.probe.tokens[:1, :8], graph)
    positions = by == "position"
    memory.check(edge_memory(run, graph, m, fused, positions), step, run.info.device, fewer=FEWER_PAIRS)
    passes = GradientPasses(run, graph, method, m, fused, positions)
    per_pair, own, donor = passes.all_pairs(step)
    run.clean, run.corrupted = (donor, own) if run.direction == "denoise" else (own, donor)
    attention = "fused (no pattern formed)" if passes.fused else "the model's own"
    facts = {"by": "position"} if positions else {}
    return _result(run, graph, per_pair, method, m, top, passes.passes(), attention=attention, **facts)


def _exact(
    model: HookedModel,
    task: TaskProbe | str | Path,
    graph: Graph,
    metric: str | Metric | Callable | None,
    direction: str,
    n_pairs: int | None,
    top: int,
    edges: Sequence[str] | None,
    config: RunConfig | None,
    journal: Journal | None,
) -> EdgeScores:
    """Exact edge patching: each edge alone, its receiver reading the sender's output on the donor
    prompt, on the one intervention replay; the score per pair is the patched metric minus the own."""
    table = graph.table()
    names = list(table.edge)
    picked = list(range(len(names))) if edges is None else _picked(names, edges)
    run = setup(model, task, metric=metric, direction=direction, n_pairs=n_pairs, config=config)
    sweeper = EdgeSweeper(run, graph, what="exact edge patching", journal=journal)
    pairs = graph.edge_index()
    units = EdgeUnits(graph, [tuple(pairs[i].tolist()) for i in picked])
    scope = f"edges-exact-{run.direction}"
    values = sweeper.evaluate(
        units, desc=f"exact edge patching ({run.direction})", scope=scope, named="exact edge patching"
    )
    per_pair = torch.full((run.task.n_pairs, len(names)), float("nan"), dtype=torch.float64)
    per_pair[:, picked] = (values - sweeper.unpatched[None]).T.double()
    facts = {"replay": sweeper.replay, "patched_edges": len(picked)}
    if sweeper.interrupted:
        facts["partial"] = True
    return _result(run, graph, per_pair, "exact", 1, top, 1, **facts)


def _picked(names: list[str], edges: Sequence[str]) -> list[int]:
    """The indices of the named edges (refusing a name the graph lacks, with the nearest one)."""
    where = {n: i for i, n in enumerate(names)}
    edges = [memory_name(e) for e in edges]  # EAP-IG's spelling, or the files', names the same edges
    unknown = [e for e in edges if e not in where]
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UsageError(
            f"edges=: {unknown[0]!r} is not an edge of this model's graph{hint}; edges are named sender->receiver, "
            "as the table's edge column names them",
            params="edges",
        )
    return sorted({where[e] for e in edges})


def _result(
    run: Setup, graph: Graph, per_pair: Tensor, method: str, steps: int, top: int, passes: int, **facts: Any
) -> EdgeScores:
    cfg = run.config
    point, lo, hi = bootstrap_mean(per_pair, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
    table = graph.table()
    if facts.get("by") == "position":  # each edge's positions in turn
        T = run.task.seq_len
        table = table.loc[table.index.repeat(T)].reset_index(drop=True)
        table.insert(1, "position", np.tile(np.arange(T), graph.n_edges))
    columns = {"score": point, "score_lo": lo, "score_hi": hi, "abs_score": point.abs()}
    columns["stability"] = stability(per_pair, top, n_boot=cfg.n_boot, seed=cfg.seed)
    for name, col in columns.items():
        table[name] = col.double().numpy()  # float64, as the table reads back
    meta = run_header(
        run.info,
        run.probe,
        kind="edge_scores",
        method=method,
        **({"steps": steps} if METHODS.info(method, "steps") else {}),
        task=run.task.name,
        n_pairs=run.task.n_pairs,
        direction=run.direction,
        metric=run.metric.name,
        units="the metric's own (raw) units: the estimated change of the metric per pair, mean over pairs",
        clean_metric=float(run.clean.mean()),
        corrupted_metric=float(run.corrupted.mean()),
        **gap_meta(run),
        graph=graph.describe(),
        shape=graph.shape.as_dict(),
        n_edges=graph.n_edges,
        **({"backwards_per_minibatch": passes} if method != "exact" else {}),
        **facts,
        stability_top=top,
        ci_level=cfg.level,
        **cfg.as_dict(),
    )
    return EdgeScores(table, meta)


def stability(
    per_pair: Float[Tensor, "pair edge"], top: int, *, n_boot: int = 1000, seed: int = 0
) -> Float[Tensor, " edge"]:
    """The share of ``n_boot`` bootstrap resamples of the pairs in which each edge's mean score is
    among the ``top`` largest in absolute value. Each resample's means are its draw counts times the
    pairs' scores. No resample's |mean| of an edge exceeds the edge's largest |score| over the pairs,
    so once the means of the edges with the largest such bounds give each resample's ``top``-th
    largest |mean|, only the edges whose bound reaches the least of those can be among any resample's
    top, and only their means are formed (every edge's where a score is NaN)."""
    n, E = per_pair.shape
    k = min(top, E)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(n, (n_boot, n), generator=gen)
    draws = torch.zeros(n_boot, n, dtype=torch.float64).scatter_add_(1, idx, torch.ones(idx.shape, dtype=torch.float64))
    values = per_pair.double()
    every = torch.arange(E)
    keep = every
    if E > k and not bool(values.isnan().any()):
        bound = values.abs().amax(0)
        first = bound.topk(min(E, max(4 * k, 1024))).indices
        least = _top_means(draws, values, first, n, k)[0][:, -1].min()
        keep = every[bound * (1 + 1e-9) >= least]  # in edge order, as the whole table; the slack: rounding
    hits = torch.bincount(_top_means(draws, values, keep, n, k)[1].flatten(), minlength=E).double()
    return (hits / n_boot).float()


def _top_means(
    draws: Tensor, values: Float[Tensor, "pair edge"], edges: Tensor, n: int, k: int
) -> tuple[Float[Tensor, "resample k"], Tensor]:
    """Each resample's ``k`` largest |mean| among ``edges`` and the edges they belong to, from a
    block of edges at a time (every resample's means of a block held under 64 MiB)."""
    block = max(k, (1 << 26) // (8 * draws.shape[0]))
    best, where = torch.zeros(len(draws), 0, dtype=torch.float64), torch.zeros(len(draws), 0, dtype=torch.long)
    for s in range(0, len(edges), block):
        cols = edges[s : s + block]
        means = (draws @ values[:, cols] / n).abs()  # [resample, edges of the block]
        top_v, top_i = means.topk(min(k, len(cols)), dim=1)
        best, chosen = torch.cat([best, top_v], 1).topk(min(k, best.shape[1] + top_v.shape[1]), dim=1)
        where = torch.cat([where, cols[top_i]], 1).gather(1, chosen)
    return best, where
