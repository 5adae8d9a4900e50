"""The exact single-head sweep: ablate every head alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from interp.ablation.engine import Sweeper
from interp.ablation.metrics import Metric
from interp.ablation.modes import HeadAblation, head_labels
from interp.models import describe
from interp.probes import TokenProbe
from interp.scores import HeadScores


def _probe_meta(probe: TokenProbe) -> dict[str, Any]:
    return dict(probe.meta) if probe.meta else {"batch": probe.batch, "seq_len": probe.seq_len}


def scores_meta(model: Any, probe: TokenProbe, metric: Metric, ablation: HeadAblation, **extra: Any) -> dict:
    info = describe(model)
    return {
        "model": info.name,
        "n_layers": info.n_layers,
        "n_heads": info.n_heads,
        "causal": info.is_causal,
        "probe": _probe_meta(probe),
        "metric": metric.name,
        "higher_is_better": metric.higher_is_better,
        "ablation": ablation.kind,
        **extra,
    }


def exact_sweep(
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    ablation: str | HeadAblation = "zero",
    base: Any = None,
    engine: str = "auto",
    minibatch: int | None = None,
    chunk: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> HeadScores:
    """Ablate every head alone (on top of ``base``) and record the metric.

    Columns: ``metric_ablated`` (mean over sequences), ``delta`` (ablated - clean) and
    ``importance`` (the delta signed so that larger = the head matters more). Heads in ``base`` get
    NaN. On Ctrl-C the rows computed so far are returned, with ``meta["partial"] = True``.
    """
    sweeper = Sweeper(
        model,
        probe,
        metric,
        ablation=ablation,
        base=base,
        engine=engine,
        minibatch=minibatch,
        chunk=chunk,
        seed=seed,
        progress=progress,
    )
    return _single_head_scores(sweeper, "exact sweep")


def _single_head_scores(sweeper: Sweeper, desc: str) -> HeadScores:
    L, H = sweeper.info.n_layers, sweeper.info.n_heads
    heads = [(l, h) for l in range(L) for h in range(H) if not bool(sweeper.base[l, h])]
    masks = torch.zeros(len(heads), L, H, dtype=torch.bool)
    for i, (l, h) in enumerate(heads):
        masks[i, l, h] = True
    values = sweeper.evaluate(masks, desc=desc)
    metric, clean = sweeper.metric, float(sweeper.clean.mean())
    ablated_grid = torch.full((L, H), float("nan"))
    for (l, h), v in zip(heads, values.mean(1)):
        ablated_grid[l, h] = v
    delta = ablated_grid - clean
    scores = HeadScores.from_grids(
        {"importance": metric.badness(delta), "metric_ablated": ablated_grid, "delta": delta},
        scores_meta(
            sweeper.model,
            sweeper.probe,
            metric,
            sweeper.ablation,
            method="exact",
            clean_metric=clean,
            engine=sweeper.engine,
            shortcuts=sweeper.shortcuts,
            base=head_labels(sweeper.base),
        ),
    )
    if sweeper.interrupted:
        done = set(head_labels(torch.isfinite(ablated_grid)))
        scores.table = scores.table[scores.table["label"].isin(done)].reset_index(drop=True)
        scores.meta.update(partial=True, heads_done=len(done), heads_total=len(heads))
    return scores


def loop_sweep(model: Any, probe: TokenProbe, metric: Metric | Callable, **kwargs: Any) -> HeadScores:
    """:func:`exact_sweep` by the plain loop: one ``run_with_hooks`` per head (the reference)."""
    return exact_sweep(model, probe, metric, engine="loop", **kwargs)
