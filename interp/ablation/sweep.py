"""The exact single-head sweep: ablate every head alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from interp.ablation.metrics import Metric
from interp.ablation.modes import HeadAblation, head_labels
from interp.ablation.replay import REPLAYS, Sweeper
from interp.ablation.settings import checked
from interp.adapters import HookedModel
from interp.config import RunConfig, run_header
from interp.journal import Journal
from interp.models import describe
from interp.probes import TokenProbe
from interp.scores import NOISE_FLOOR_FRACTION, HeadScores, bootstrap_mean


def ablation_header(model: HookedModel, probe: TokenProbe, **extra: Any) -> dict[str, Any]:
    """:func:`interp.config.run_header` for an ablation result: the model, its shape and causality,
    the probe's facts (its batch and length where it records none), then ``extra``."""
    header = run_header(describe(model), probe if probe.meta else None)
    header["probe"] = dict(probe.meta) if probe.meta else {"batch": probe.batch, "seq_len": probe.seq_len}
    header.update(extra)
    return header


def scores_meta(
    model: HookedModel, probe: TokenProbe, metric: Metric, ablation: HeadAblation, **extra: Any
) -> dict[str, Any]:
    """The meta of an ablation result: the run header, the metric, its direction and the ablation
    kind, then ``extra``."""
    return ablation_header(
        model, probe, metric=metric.name, higher_is_better=metric.higher_is_better, ablation=ablation.kind, **extra
    )


def validate_exact_sweep(*, replay: str = "auto") -> None:
    """Refuse options :func:`exact_sweep` cannot run with, before any model is touched."""
    checked(REPLAYS, replay)


def exact_sweep(
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    ablation: str | HeadAblation = "zero",
    base: Any = None,
    replay: str = "auto",
    chunk: int | None = None,
    config: RunConfig | None = None,
    journal: Journal | None = None,
) -> HeadScores:
    """Ablate every head alone (on top of ``base``) and record the metric.

    Columns: ``metric_ablated`` (mean over sequences), ``delta`` (ablated - clean) and
    ``importance`` (the delta signed so that larger = the head matters more). Heads in ``base`` get
    NaN. ``replay`` is one of :data:`~interp.ablation.replay.REPLAYS`; ``config`` (its ``minibatch``,
    ``seed``, ``progress``, ``n_boot``, ``level``) sets the run (see :class:`~interp.ablation.replay.Sweeper`). On Ctrl-C the rows computed so far are returned, with
    ``meta["partial"] = True``. ``journal`` (an opened :class:`~interp.journal.Journal`): every
    head finished is recorded there, and a resumed run takes the heads already recorded from it.
    """
    validate_exact_sweep(replay=replay)
    sweeper = Sweeper(
        model,
        probe,
        metric,
        ablation=ablation,
        base=base,
        replay=replay,
        chunk=chunk,
        config=config,
        journal=journal,
    )
    return _single_head_scores(sweeper, "exact sweep")


def _single_head_scores(sweeper: Sweeper, desc: str) -> HeadScores:
    L, H = sweeper.info.n_layers, sweeper.info.n_heads
    layers = sweeper.info.attention_layers  # a layer without attention has no heads
    heads = [(l, h) for l in layers for h in range(H) if not bool(sweeper.base[l, h])]
    masks = torch.zeros(len(heads), L, H, dtype=torch.bool)
    for i, (l, h) in enumerate(heads):
        masks[i, l, h] = True
    values = sweeper.evaluate(masks, desc=desc)
    metric, clean = sweeper.metric, float(sweeper.unpatched.mean())
    ablated_grid = torch.full((L, H), float("nan"))
    for (l, h), v in zip(heads, values.mean(1)):
        ablated_grid[l, h] = v
    delta = ablated_grid - clean
    # bootstrap CIs of the importance over sequences, and the noise floor the figure greys cells under
    per_seq = torch.full((values.shape[1], L, H), float("nan"))
    for (l, h), v in zip(heads, values):
        per_seq[:, l, h] = metric.badness(v - sweeper.unpatched.float().cpu())
    cfg = sweeper.config
    _, imp_lo, imp_hi = bootstrap_mean(per_seq, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
    scores = HeadScores.from_grids(
        {
            "importance": metric.badness(delta),
            "importance_lo": imp_lo.float(),
            "importance_hi": imp_hi.float(),
            "metric_ablated": ablated_grid,
            "delta": delta,
        },
        scores_meta(
            sweeper.model,
            sweeper.probe,
            metric,
            sweeper.ablation,
            method="exact",
            clean_metric=clean,
            engine=sweeper.replay,  # the meta key results have always had; replay says the same
            replay=sweeper.replay,
            shortcuts=sweeper.shortcuts,
            base=head_labels(sweeper.base),
            noise_floor=NOISE_FLOOR_FRACTION * abs(clean),
            ci_level=cfg.level,
        ),
    )
    if sweeper.interrupted:
        done = set(head_labels(torch.isfinite(ablated_grid)))
        scores.table = scores.table[scores.table["label"].isin(done)].reset_index(drop=True)
        scores.meta.update(partial=True, heads_done=len(done), heads_total=len(heads))
    return scores


def loop_sweep(model: HookedModel, probe: TokenProbe, metric: Metric | Callable, **kwargs: Any) -> HeadScores:
    """:func:`exact_sweep` by the plain loop: one ``run_with_hooks`` per head (the reference)."""
    return exact_sweep(model, probe, metric, replay="loop", **kwargs)
