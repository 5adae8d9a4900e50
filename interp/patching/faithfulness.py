"""Faithfulness curves: how much of the answer the top ``n`` heads of a ranking carry on their own.

For each ``n``, the clean prompt runs with the ``n`` highest-ranked heads left alone and every other
head's output (``hook_z``) replaced: by its output on the pair's corrupted prompt (``to="corrupted"``)
or by its mean output over the corrupted prompts, position by position (``to="mean"``, as circuit
evaluation's ``mean`` source reads a sender: the top ``n`` heads are the node circuit whose edges are
every edge but those out of the other heads). The metric, normalised so the
corrupted run is 0 and the clean run is 1 (pooled over pairs), is plotted against ``n``; the smallest
``n`` that reaches 0.8 and 0.9 of the clean metric is reported per ranking. Every point is one row of
the ablation sweep's batched replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch

from interp.ablation.metrics import Metric
from interp.ablation.modes import PatchAblation, PositionMeanAblation, head_mask
from interp.ablation.replay import Sweeper
from interp.adapters import HookedModel
from interp.config import RunConfig
from interp.errors import UsageError
from interp.patching.core import gap_meta, own_metric, pooled_ratio, setup, validate_setup
from interp.patching.metrics import refuse_raw
from interp.patching.result import PatchScores, warned
from interp.probes.task import TaskProbe
from interp.registry import Registry
from interp.results import Result

if TYPE_CHECKING:
    import plotly.graph_objects as go

TARGETS = (0.8, 0.9)
STEM = "faithfulness"
FAITHFUL_TO: Registry[str] = Registry("faithfulness replacement")  # what the heads outside the top n are patched to
FAITHFUL_TO.add("corrupted", "each pair's corrupted run", printed="its pair's corrupted run")
FAITHFUL_TO.add(
    "mean",
    "the mean over the corrupted prompts, position by position",
    printed="its mean over the corrupted prompts, position by position",
)


@dataclass(repr=False)
class FaithfulnessCurves(Result):
    """A row per (ranking, n): ``faithfulness`` (normalised metric, pooled over pairs, with its
    bootstrap CI over pairs in ``faithfulness_lo`` and ``faithfulness_hi``) and ``heads`` kept."""

    KIND = STEM
    what = "faithfulness curves"

    def smallest(self, fraction: float) -> dict[str, int | None]:
        """Per ranking, the smallest ``n`` whose faithfulness reaches ``fraction`` (None: never)."""
        out: dict[str, int | None] = {}
        for name, rows in self.table.groupby("ranking", sort=False):
            hit = rows[rows["faithfulness"] >= fraction]
            out[str(name)] = int(hit["n"].min()) if len(hit) else None
        return out

    def figure(self, title: str | None = None) -> go.Figure:
        import plotly.graph_objects as go

        fig = go.Figure()
        for name, rows in self.table.groupby("ranking", sort=False):
            y = rows["faithfulness"]
            band = (
                dict(
                    type="data",
                    symmetric=False,
                    array=rows["faithfulness_hi"] - y,
                    arrayminus=y - rows["faithfulness_lo"],
                )
                if "faithfulness_lo" in rows
                else None
            )
            fig.add_trace(go.Scatter(x=rows["n"], y=y, error_y=band, mode="lines+markers", name=str(name)))
        for target in TARGETS:
            fig.add_hline(y=target, line_dash="dot", annotation_text=f"{target:g}")
        fig.update_layout(
            title=warned(
                title
                or f"{self.meta.get('model', 'model')}: faithfulness of the top n heads ({self.meta.get('task')})",
                self.meta,
            ),
            xaxis_title="heads kept (n)",
            yaxis_title="normalised metric (corrupted 0, clean 1)",
        )
        return fig


def faithfulness_curves(
    model: HookedModel,
    task: TaskProbe,
    rankings: Mapping[str, PatchScores],
    *,
    to: str = "corrupted",
    metric: str | Metric | Callable | None = None,
    ns: list[int] | None = None,
    config: RunConfig | None = None,
) -> FaithfulnessCurves:
    """The faithfulness of the top ``n`` heads of each ranking (per-head results of
    :func:`~interp.patching.patch_heads`, any method, ranked by ``effect``), for ``n`` in ``ns``
    (default every ``n`` from 0 to the number of heads). See the module docstring."""
    validate_faithfulness_curves(to=to, metric=own_metric(task, metric), ns=ns)
    if not rankings:
        raise UsageError("give at least one ranking (a per-head result of patch_heads)", params="rankings")
    run = setup(model, task, metric=metric, direction="noise", by="head", config=config)
    info = run.info
    orders = {name: _order(name, scores, run.heads) for name, scores in rankings.items()}
    total = len(run.heads)
    ns = list(range(total + 1)) if ns is None else sorted({int(n) for n in ns})
    if any(n > total for n in ns):
        raise UsageError(f"ns= must lie in 0..{total} (the model's heads)", params="ns")
    if to == "corrupted":
        ablation = PatchAblation.fit(model, run.probe, minibatch=run.config.minibatch)
    else:
        ablation = PositionMeanAblation.fit(model, run.task.corrupted, minibatch=run.config.minibatch)
    sweeper = Sweeper(model, run.probe, run.metric, ablation=ablation, config=run.config)
    every = head_mask(info, run.heads, allow_empty=True)  # replaced: every head but an order's top n
    masks = torch.stack(
        [every & ~head_mask(info, order[:n], allow_empty=True) for order in orders.values() for n in ns]
    )
    values = sweeper.evaluate(
        masks,
        desc="faithfulness",
        scope=f"faithfulness-{to}",
        named=f"the faithfulness curves (the rest patched to {to})",
    )
    num = values - run.corrupted[None]  # [row, pair]: each pair's share of its own gap, pooled over pairs
    point, lo, hi = pooled_ratio(num.T, (run.clean - run.corrupted)[:, None].expand(-1, len(num)), run.config)
    rows = []
    for i, (name, order) in enumerate((name, order) for name, order in orders.items() for _ in ns):
        n = ns[i % len(ns)]
        kept = " ".join(f"{l}.{h}" for l, h in order[:n])
        rows.append(
            {
                "ranking": name,
                "n": n,
                "faithfulness": float(point[i]),
                "faithfulness_lo": float(lo[i]),
                "faithfulness_hi": float(hi[i]),
                "metric": float(values[i].mean()),
                "heads": kept,
            }
        )
    meta = {
        "model": info.name,
        "task": task.name,
        "n_pairs": task.n_pairs,
        "to": to,
        "metric": run.metric.name,
        "clean_metric": float(run.clean.mean()),
        "corrupted_metric": float(run.corrupted.mean()),
        **gap_meta(run),
        "replay": sweeper.replay,
    }
    curves = FaithfulnessCurves(pd.DataFrame(rows), meta)
    curves.meta["smallest_n"] = {f"{t:g}": curves.smallest(t) for t in TARGETS}
    return curves


def validate_faithfulness_curves(
    *, to: str = "corrupted", metric: str | Metric | Callable | None = None, ns: list[int] | None = None
) -> None:
    """What :func:`faithfulness_curves` refuses before any forward, without a model: ``to`` not one
    of :data:`FAITHFUL_TO`, a raw ``metric`` (a faithfulness curve is a fraction of the gap), a
    negative ``n`` in ``ns``, a metric name :func:`~interp.patching.core.setup` refuses."""
    if to not in FAITHFUL_TO:
        raise UsageError(
            f"to={to!r}: the other heads go to " + " or ".join(f"{n!r} ({FAITHFUL_TO.doc(n)})" for n in FAITHFUL_TO),
            params="to",
        )
    refuse_raw(metric, "a faithfulness curve")
    validate_setup(metric=metric)
    if ns is not None and any(int(n) < 0 for n in ns):
        raise UsageError("ns= must lie in 0..the number of the model's heads: no n is negative", params="ns")


def _order(name: str, scores: PatchScores, heads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The heads from most to least important by ``effect`` (ties: layer, then head)."""
    if scores.by != "head" or scores.meta.get("site", "z") != "z":
        raise UsageError(f"ranking {name!r} must be a per-head result of head outputs (by='head', site 'z')")
    t = scores.table.sort_values(["effect", "layer", "head"], ascending=[False, True, True], kind="mergesort")
    order = [(int(l), int(h)) for l, h in zip(t["layer"], t["head"])]
    if sorted(order) != sorted(heads):
        raise UsageError(f"ranking {name!r} does not rank this model's heads: run patch_heads on this model")
    return order
