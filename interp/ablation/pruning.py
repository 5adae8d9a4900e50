"""Pruning curves: remove heads in increasing order of importance."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from interp.ablation.engine import Sweeper
from interp.ablation.gradient import gradient_importance
from interp.ablation.metrics import Metric, as_metric
from interp.ablation.modes import HeadAblation
from interp.ablation.sweep import exact_sweep
from interp.errors import AblationError
from interp.models import describe
from interp.probes import TokenProbe
from interp.scores import HeadScores

ORDERS = ("gradient", "exact", "random")


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


def _importance(
    order: str,
    model: Any,
    probe: TokenProbe,
    metric: Metric,
    abl: HeadAblation,
    base: Tensor,
    engine: str,
    minibatch: int | None,
    seed: int,
) -> HeadScores | Tensor:
    info = describe(model)
    if order == "gradient":
        return gradient_importance(model, probe, metric, ablation=abl, base=base, minibatch=minibatch)
    if order == "exact":
        scores = exact_sweep(model, probe, metric, ablation=abl, base=base, engine=engine, minibatch=minibatch)
        if scores.meta.get("partial"):  # an order from a partial sweep is no order: stop the curve here
            raise KeyboardInterrupt
        return scores
    if order == "random":
        return torch.rand(info.n_layers, info.n_heads, generator=torch.Generator().manual_seed(seed))
    raise AblationError(f"unknown order {order!r}: choose from {list(ORDERS)}")


def pruning_curve(
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    order: str | HeadScores | Tensor = "gradient",
    *,
    ablation: str | HeadAblation = "zero",
    step: float = 0.1,
    reestimate: bool = False,
    engine: str = "auto",
    minibatch: int | None = None,
    seed: int = 0,
    label: str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Prune heads in increasing order of importance, ``step`` (a fraction of all heads) at a time.

    ``order`` is ``"gradient"``, ``"exact"``, ``"random"`` (seeded by ``seed``) or a table/grid of
    importances. With ``reestimate`` the importance is recomputed on the pruned model after every
    step (not for ``random`` or a given table). Returns a tidy frame, a row per step: ``order``,
    ``seed``, ``step``, ``n_pruned``, ``frac_pruned``, ``metric``, ``degradation`` (how much worse
    than unpruned, as a fraction), ``removed`` (the heads removed at that step). On Ctrl-C the steps
    done are returned, with ``frame.attrs["partial"] = True``.
    """
    metric = as_metric(metric)
    if not 0 < step <= 1:
        raise AblationError(f"step must be a fraction in (0, 1], got {step}")
    info = describe(model)
    L, H = info.n_layers, info.n_heads
    n_total = L * H
    per_step = max(1, round(step * n_total))
    abl = (
        ablation
        if isinstance(ablation, HeadAblation)
        else HeadAblation.fit(model, ablation, probe, seed=seed, minibatch=minibatch)
    )
    name = label or (order if isinstance(order, str) else "given")
    sweeper = Sweeper(model, probe, metric, ablation=abl, engine=engine, minibatch=minibatch)
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
                _importance(order, model, probe, metric, abl, pruned, engine, minibatch, seed)
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
            values = sweeper.evaluate(torch.stack(masks), desc=f"pruning ({name})").mean(1)
            partial = sweeper.interrupted
            for i, (mask, gone, v) in enumerate(zip(masks, removed, values.tolist())):
                if math.isnan(v):
                    break
                rows.append(_curve_row(name, seed, i + 1, mask, n_total, v, clean, metric, gone))
        else:
            for i in tqdm(
                range(math.ceil(n_total / per_step)), desc=f"pruning ({name}, re-estimated)", disable=not progress
            ):
                scores = _importance(order, model, probe, metric, abl, pruned, engine, minibatch, seed)
                gone = _order_from(scores, ~pruned)[:per_step]
                for l, h in gone:
                    pruned[l, h] = True
                v = float(sweeper.evaluate(pruned[None]).mean())
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
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    orders: Sequence[str] = ORDERS,
    random_seeds: Sequence[int] = (0, 1, 2),
    **kwargs: Any,
) -> pd.DataFrame:
    """:func:`pruning_curve` for several orders (random once per seed), stacked into one frame."""
    frames = []
    for order in orders:
        for seed in random_seeds if order == "random" else [kwargs.get("seed", 0)]:
            kw = {**kwargs, "seed": seed}
            frame = pruning_curve(model, probe, metric, order, **kw)
            frame["label"] = f"random (seed {seed})" if order == "random" else order
            frames.append(frame)
            if frame.attrs.get("partial"):
                break
        if frames and frames[-1].attrs.get("partial"):
            break
    out = pd.concat(frames, ignore_index=True)
    out.attrs = dict(frames[0].attrs, partial=any(f.attrs.get("partial") for f in frames))
    return out


def heads_prunable(curves: pd.DataFrame, tolerance: float = 0.1) -> pd.DataFrame:
    """Per curve: how many heads were pruned at the last step before the metric first degraded by more
    than ``tolerance`` (a fraction of the unpruned metric)."""
    if tolerance < 0:
        raise AblationError(f"tolerance must be >= 0, got {tolerance}")
    keys = ["label"] if "label" in curves else ["order", "seed"]
    rows = []
    for key, part in curves.sort_values("step", kind="mergesort").groupby(keys, sort=False):
        over = part["degradation"] > tolerance
        ok = part[~over.cumsum().astype(bool)]
        last = ok.iloc[-1] if len(ok) else part.iloc[0]
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                "n_prunable": int(last["n_pruned"]),
                "frac_prunable": float(last["frac_pruned"]),
                "tolerance": tolerance,
            }
        )
    return pd.DataFrame(rows)
