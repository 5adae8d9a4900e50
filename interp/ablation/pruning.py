"""Pruning curves: remove heads in increasing order of importance.

The orders (:data:`ORDERS`: gradient, exact, random) are registered once, each with the function
that ranks the heads; ``needs_gradient`` marks the orders a metric flat at the clean point cannot use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from interp.ablation.curves import CURVE_ATTRS, PruningCurves
from interp.ablation.gradient import gradient_importance
from interp.ablation.metrics import Metric, as_metric
from interp.ablation.modes import HeadAblation, as_ablation
from interp.ablation.replay import REPLAYS, Sweeper
from interp.ablation.settings import checked, replay_choice, run_config
from interp.ablation.sweep import ablation_header, exact_sweep
from interp.adapters import HookedModel
from interp.config import RunConfig
from interp.errors import AblationError
from interp.journal import Journal
from interp.models import describe
from interp.probes import TokenProbe
from interp.progress import tqdm
from interp.registry import Registry
from interp.scores import HeadScores


def spearman(a: Any, b: Any) -> float:
    """Spearman rank correlation (average ranks for ties), NaN pairs dropped."""
    frame = pd.DataFrame({"a": np.asarray(a, dtype=float).ravel(), "b": np.asarray(b, dtype=float).ravel()}).dropna()
    return float(frame["a"].rank().corr(frame["b"].rank()))


def _order_from(scores: HeadScores | Tensor | np.ndarray, alive: Tensor) -> list[tuple[int, int]]:
    """Alive heads from least to most important (ties: layer, then head)."""
    grid = torch.as_tensor(
        scores.grid("importance") if isinstance(scores, HeadScores) else np.asarray(scores), dtype=torch.float64
    )
    heads = [(float(grid[l, h]), l, h) for l, h in alive.nonzero().tolist()]
    heads.sort(key=lambda t: (math.inf if math.isnan(t[0]) else t[0], t[1], t[2]))
    return [(l, h) for _, l, h in heads]


ImportanceFn = Callable[..., "HeadScores | Tensor"]
ORDERS: Registry[ImportanceFn] = Registry("order")


@ORDERS.register("gradient", "Michel et al.'s gradient importance (one forward and backward)", needs_gradient=True)
def _gradient_order(
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric,
    abl: HeadAblation,
    base: Tensor,
    replay: str,
    config: RunConfig,
    journal: Journal | None = None,
) -> HeadScores:
    return gradient_importance(
        model, probe, metric, ablation=abl, base=base, minibatch=config.minibatch, progress=config.progress
    )


@ORDERS.register("exact", "the exact single-head sweep", needs_gradient=False)
def _exact_order(
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric,
    abl: HeadAblation,
    base: Tensor,
    replay: str,
    config: RunConfig,
    journal: Journal | None = None,
) -> HeadScores:
    scores = exact_sweep(
        model,
        probe,
        metric,
        ablation=abl,
        base=base,
        replay=replay,
        minibatch=config.minibatch,
        progress=config.progress,
        journal=journal,
    )
    if scores.meta.get("partial"):  # an order from a partial sweep is no order: stop the curve here
        raise KeyboardInterrupt
    return scores


@ORDERS.register("random", "a seeded random order (the baseline)", needs_gradient=False)
def _random_order(
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric,
    abl: HeadAblation,
    base: Tensor,
    replay: str,
    config: RunConfig,
    journal: Journal | None = None,
) -> Tensor:
    info = describe(model)
    return torch.rand(info.n_layers, info.n_heads, generator=torch.Generator().manual_seed(config.seed))


def _importance(
    order: str,
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric,
    abl: HeadAblation,
    base: Tensor,
    replay: str,
    config: RunConfig,
    journal: Journal | None = None,
) -> HeadScores | Tensor:
    return ORDERS.get(checked(ORDERS, order))(model, probe, metric, abl, base, replay, config, journal)


def pruning_curve(
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric | Callable,
    order: str | HeadScores | Tensor = "gradient",
    *,
    ablation: str | HeadAblation = "zero",
    step: float = 0.1,
    reestimate: bool = False,
    replay: str = "auto",
    label: str | None = None,
    config: RunConfig | None = None,
    minibatch: int | None = None,
    seed: int | None = None,
    progress: bool | None = None,
    engine: str | None = None,
    journal: Journal | None = None,
) -> pd.DataFrame:
    """Prune heads in increasing order of importance, ``step`` (a fraction of all heads) at a time.

    ``order`` is ``"gradient"``, ``"exact"``, ``"random"`` (seeded by ``seed``) or a table/grid of
    importances. With ``reestimate`` the importance is recomputed on the pruned model after every
    step (not for ``random`` or a given table). Returns a tidy frame, a row per step: ``order``,
    ``seed``, ``step``, ``n_pruned``, ``frac_pruned``, ``metric``, ``degradation`` (how much worse
    than unpruned, as a fraction), ``removed`` (the heads removed at that step). On Ctrl-C the steps
    done are returned, with ``frame.attrs["partial"] = True``. ``replay`` (one of
    :data:`~interp.ablation.replay.REPLAYS`; ``engine=`` is its deprecated spelling) is how the
    head sets are evaluated; ``config`` or the keywords ``minibatch``, ``seed``, ``progress`` set
    the run. ``journal`` (an opened :class:`~interp.journal.Journal`): every step evaluated (and
    every head of an exact order's sweep) is recorded there; a resumed run takes them from it.
    """
    metric = as_metric(metric)
    replay = checked(REPLAYS, replay_choice(replay, engine))
    config = run_config(config, minibatch=minibatch, seed=seed, progress=progress)
    seed = config.seed
    if not 0 < step <= 1:
        raise AblationError(f"step must be a fraction in (0, 1], got {step}")
    info = describe(model)
    L, H = info.n_layers, info.n_heads
    n_total = L * H
    per_step = max(1, round(step * n_total))
    if isinstance(order, str):
        checked(ORDERS, order)
    abl = as_ablation(ablation, model, probe, seed=seed, minibatch=config.minibatch)
    name = label or (order if isinstance(order, str) else "given")
    sweeper = Sweeper(model, probe, metric, ablation=abl, replay=replay, config=config, journal=journal)
    scope = f"pruning ({name}, seed {seed})"  # a resample ablation is fitted per seed
    clean = float(sweeper.clean.mean())
    rows: list[dict[str, Any]] = [
        dict(order=name, seed=seed, step=0, n_pruned=0, frac_pruned=0.0, metric=clean, degradation=0.0, removed="")
    ]
    static = not reestimate or not isinstance(order, str) or order == "random"
    pruned = torch.zeros(L, H, dtype=torch.bool)
    partial = False
    try:
        if static:
            scores = (
                _importance(order, model, probe, metric, abl, pruned, replay, config, journal)
                if isinstance(order, str)
                else order
            )
            ranked = _order_from(scores, ~pruned)
            masks, removed = [], []
            for k0 in range(0, n_total, per_step):
                k = min(k0 + per_step, n_total)
                mask = torch.zeros(L, H, dtype=torch.bool)
                for l, h in ranked[:k]:
                    mask[l, h] = True
                masks.append(mask)
                removed.append(ranked[k0:k])
            values = sweeper.evaluate(torch.stack(masks), desc=f"pruning ({name})", scope=scope).mean(1)
            partial = sweeper.interrupted
            for i, (mask, gone, v) in enumerate(zip(masks, removed, values.tolist())):
                if math.isnan(v):
                    break
                rows.append(_curve_row(name, seed, i + 1, mask, n_total, v, clean, metric, gone))
        else:
            for i in tqdm(
                range(math.ceil(n_total / per_step)),
                desc=f"pruning ({name}, re-estimated)",
                disable=not config.progress,
            ):
                scores = _importance(order, model, probe, metric, abl, pruned, replay, config, journal)
                gone = _order_from(scores, ~pruned)[:per_step]
                for l, h in gone:
                    pruned[l, h] = True
                v = float(sweeper.evaluate(pruned[None], scope=f"{scope}, re-estimated").mean())
                if sweeper.interrupted:
                    raise KeyboardInterrupt
                rows.append(_curve_row(name, seed, i + 1, pruned, n_total, v, clean, metric, gone))
    except KeyboardInterrupt:
        partial = True
    frame = pd.DataFrame(rows)
    frame.attrs.update(
        metric=metric.name, ablation=abl.kind, reestimate=reestimate and not static, clean_metric=clean, partial=partial
    )
    return frame


def _curve_row(
    name: str,
    seed: int,
    step: int,
    mask: Tensor,
    n_total: int,
    value: float,
    clean: float,
    metric: Metric,
    gone: Sequence[tuple[int, int]],
) -> dict[str, Any]:
    n = int(mask.sum())
    return dict(
        order=name,
        seed=seed,
        step=step,
        n_pruned=n,
        frac_pruned=n / n_total,
        metric=value,
        degradation=float(metric.degradation(value, clean)),
        removed=" ".join(f"{l}.{h}" for l, h in gone),
    )


def pruning_curves(
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    orders: Sequence[str] = ORDERS.names(),
    random_seeds: Sequence[int] = (0, 1, 2),
    importances: Mapping[str, HeadScores | Tensor] | None = None,
    **kwargs: Any,
) -> PruningCurves:
    """:func:`pruning_curve` for several orders (random once per seed), stacked into one result.

    ``kwargs`` go to :func:`pruning_curve` (``seed`` or ``config.seed`` is the seed of the
    non-random orders). ``importances``: the importance an order ranks by, where it is already
    computed (``{"exact": sweep}``, as the atlas has it): that order's curve ranks by it instead of
    computing it again (once, not re-estimated). ``.table`` holds the curves, a ``label`` per
    curve; ``.meta`` the run header with the metric, the ablation, ``reestimate``, ``clean_metric``
    and ``partial``.
    """
    importances = dict(importances or {})
    metric = as_metric(metric)
    orders = [checked(ORDERS, o) for o in ([orders] if isinstance(orders, str) else orders)]
    if kwargs.get("engine") is not None:  # warn once, here, not once per curve
        kwargs["replay"] = replay_choice(kwargs.get("replay", "auto"), kwargs.pop("engine"))
    base_seed = run_config(kwargs.get("config"), seed=kwargs.get("seed")).seed
    frames = []
    for order in orders:
        for seed in random_seeds if order == "random" else [base_seed]:
            kw = {**kwargs, "seed": seed}
            given = importances.get(order) if order != "random" else None
            frame = pruning_curve(model, probe, metric, order if given is None else given, label=order, **kw)
            frame["label"] = f"random (seed {seed})" if order == "random" else order
            frames.append(frame)
            if frame.attrs.get("partial"):
                break
        if frames and frames[-1].attrs.get("partial"):
            break
    if not frames:
        raise AblationError("give at least one pruning order")
    table = pd.concat(frames, ignore_index=True)
    table.attrs = dict(frames[0].attrs, partial=any(f.attrs.get("partial") for f in frames))
    meta = ablation_header(
        model,
        probe,
        metric=metric.name,
        higher_is_better=metric.higher_is_better,
        **{k: table.attrs[k] for k in CURVE_ATTRS if k != "metric"},
    )
    return PruningCurves(table, meta)
