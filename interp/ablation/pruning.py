"""Pruning curves: remove heads in increasing order of importance.

The orders (:data:`ORDERS`: gradient, exact, random) are registered once, each with the function
that ranks the heads; ``needs_gradient`` marks the orders a metric flat at the clean point cannot use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
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
from interp.ablation.settings import checked
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


# an order ranks the heads of a sweeper's model, with the ``base`` heads ablated; ``replay`` as the caller asked
ImportanceFn = Callable[[Sweeper, Tensor, str], "HeadScores | Tensor"]
ORDERS: Registry[ImportanceFn] = Registry("order")


@ORDERS.register("gradient", "Michel et al.'s gradient importance (one forward and backward)", needs_gradient=True)
def _gradient_order(sweeper: Sweeper, base: Tensor, replay: str) -> HeadScores:
    s = sweeper
    return gradient_importance(s.model, s.probe, s.metric, ablation=s.ablation, base=base, config=s.config)


@ORDERS.register("exact", "the exact single-head sweep", needs_gradient=False)
def _exact_order(sweeper: Sweeper, base: Tensor, replay: str) -> HeadScores:
    s = sweeper
    scores = exact_sweep(
        s.model, s.probe, s.metric, ablation=s.ablation, base=base, replay=replay, config=s.config, journal=s.journal
    )
    if scores.meta.get("partial"):  # an order from a partial sweep is no order: stop the curve here
        raise KeyboardInterrupt
    return scores


@ORDERS.register("random", "a seeded random order (the baseline)", needs_gradient=False)
def _random_order(sweeper: Sweeper, base: Tensor, replay: str) -> Tensor:
    info = sweeper.info
    return torch.rand(info.n_layers, info.n_heads, generator=torch.Generator().manual_seed(sweeper.config.seed))


def validate_pruning_curve(
    *, order: str | HeadScores | Tensor = "gradient", step: float = 0.1, replay: str = "auto"
) -> None:
    """Refuse options :func:`pruning_curve` cannot run with, before any model is touched."""
    checked(REPLAYS, replay)
    if not 0 < step <= 1:
        raise AblationError(f"step must be a fraction in (0, 1], got step={step}", params="step")
    if isinstance(order, str):
        checked(ORDERS, order)


def validate_pruning_curves(
    *, orders: Sequence[str] | str = ORDERS.names(), step: float = 0.1, replay: str = "auto"
) -> None:
    """Refuse options :func:`pruning_curves` cannot run with, before any model is touched."""
    if not _order_names(orders):
        raise AblationError("give at least one pruning order (orders=)", params="orders")
    validate_pruning_curve(step=step, replay=replay)


def _order_names(orders: Sequence[str] | str) -> list[str]:
    """``orders`` (one name or several), each a registered order."""
    return [checked(ORDERS, o) for o in ([orders] if isinstance(orders, str) else orders)]


@dataclass(frozen=True)
class _Pruning:
    """One pruning curve: its sweeper (the model, probe, metric, ablation, run settings, journal),
    the order it ranks heads by, its name, and how many heads go per step."""

    sweeper: Sweeper
    order: str | HeadScores | Tensor
    name: str
    per_step: int
    replay: str  # as the caller asked (an exact order's own sweep takes it)

    @property
    def clean(self) -> float:
        return float(self.sweeper.unpatched.mean())

    @property
    def scope(self) -> str:
        return f"pruning ({self.name}, seed {self.sweeper.config.seed})"  # a resample ablation is fitted per seed

    def importance(self, pruned: Tensor) -> HeadScores | Tensor:
        """The order's importance with the ``pruned`` heads ablated (a given table as it is)."""
        if not isinstance(self.order, str):
            return self.order
        return ORDERS.get(checked(ORDERS, self.order))(self.sweeper, pruned, self.replay)

    def row(self, step: int, mask: Tensor, value: float, gone: Sequence[tuple[int, int]]) -> dict[str, Any]:
        s = self.sweeper
        n_total = s.info.n_layers * s.info.n_heads
        return _curve_row(self.name, s.config.seed, step, mask, n_total, value, self.clean, s.metric, gone)

    def ranked_once(self, rows: list[dict[str, Any]]) -> bool:
        """Rank once, evaluate every step's head set in one sweep; append a row per step evaluated.
        Whether a Ctrl-C stopped the sweep."""
        s = self.sweeper
        L, H = s.info.n_layers, s.info.n_heads
        ranked = _order_from(self.importance(torch.zeros(L, H, dtype=torch.bool)), torch.ones(L, H, dtype=torch.bool))
        masks, removed = [], []
        for k0 in range(0, L * H, self.per_step):
            k = min(k0 + self.per_step, L * H)
            mask = torch.zeros(L, H, dtype=torch.bool)
            for l, h in ranked[:k]:
                mask[l, h] = True
            masks.append(mask)
            removed.append(ranked[k0:k])
        values = s.evaluate(torch.stack(masks), desc=f"pruning ({self.name})", scope=self.scope).mean(1)
        for i, (mask, gone, v) in enumerate(zip(masks, removed, values.tolist())):
            if math.isnan(v):
                break
            rows.append(self.row(i + 1, mask, v, gone))
        return s.interrupted

    def reestimated(self, rows: list[dict[str, Any]]) -> None:
        """Re-rank the heads left after every step; append a row per step (a Ctrl-C raises
        :class:`KeyboardInterrupt` with the rows so far appended)."""
        s = self.sweeper
        L, H = s.info.n_layers, s.info.n_heads
        pruned = torch.zeros(L, H, dtype=torch.bool)
        steps = range(math.ceil(L * H / self.per_step))
        for i in tqdm(steps, desc=f"pruning ({self.name}, re-estimated)", disable=not s.config.progress):
            gone = _order_from(self.importance(pruned), ~pruned)[: self.per_step]
            for l, h in gone:
                pruned[l, h] = True
            v = float(s.evaluate(pruned[None], scope=f"{self.scope}, re-estimated").mean())
            if s.interrupted:
                raise KeyboardInterrupt
            rows.append(self.row(i + 1, pruned, v, gone))


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
    journal: Journal | None = None,
) -> pd.DataFrame:
    """Prune heads in increasing order of importance, ``step`` (a fraction of all heads) at a time.

    ``order`` is ``"gradient"``, ``"exact"``, ``"random"`` (seeded by ``config.seed``) or a
    table/grid of importances. With ``reestimate`` the importance is recomputed on the pruned model
    after every step (not for ``random`` or a given table). Returns a tidy frame, a row per step:
    ``order``, ``seed``, ``step``, ``n_pruned``, ``frac_pruned``, ``metric``, ``degradation`` (how
    much worse than unpruned, as a fraction), ``removed`` (the heads removed at that step). On Ctrl-C
    the steps done are returned, with ``frame.attrs["partial"] = True``. ``replay`` (one of
    :data:`~interp.ablation.replay.REPLAYS`) is how the head sets are evaluated; ``config`` (its
    ``minibatch``, ``seed``, ``progress``) sets the run. ``journal`` (an opened
    :class:`~interp.journal.Journal`): every step evaluated (and every head of an exact order's
    sweep) is recorded there; a resumed run takes them from it.
    """
    validate_pruning_curve(order=order, step=step, replay=replay)
    metric = as_metric(metric)
    config = RunConfig.of(config)
    info = describe(model)
    per_step = max(1, round(step * info.n_layers * info.n_heads))
    abl = as_ablation(ablation, model, probe, seed=config.seed, minibatch=config.minibatch)
    name = label or (order if isinstance(order, str) else "given")
    sweeper = Sweeper(model, probe, metric, ablation=abl, replay=replay, config=config, journal=journal)
    curve = _Pruning(sweeper, order, name, per_step, replay)
    clean = curve.clean
    rows: list[dict[str, Any]] = [
        dict(
            order=name, seed=config.seed, step=0, n_pruned=0, frac_pruned=0.0, metric=clean, degradation=0.0, removed=""
        )
    ]
    static = not reestimate or not isinstance(order, str) or order == "random"
    partial = False
    try:
        if static:
            partial = curve.ranked_once(rows)
        else:
            curve.reestimated(rows)
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

    ``kwargs`` go to :func:`pruning_curve` (``config.seed`` is the seed of the non-random orders;
    each random order runs with its own seed of ``random_seeds``). ``importances``: the importance an order ranks by, where it is already
    computed (``{"exact": sweep}``, as the atlas has it): that order's curve ranks by it instead of
    computing it again (once, not re-estimated). ``.table`` holds the curves, a ``label`` per
    curve; ``.meta`` the run header with the metric, the ablation, ``reestimate``, ``clean_metric``
    and ``partial``.
    """
    validate_pruning_curves(orders=orders, step=kwargs.get("step", 0.1), replay=kwargs.get("replay", "auto"))
    importances = dict(importances or {})
    metric = as_metric(metric)
    config = RunConfig.of(kwargs.pop("config", None))
    frames = []
    for order in _order_names(orders):
        for seed in random_seeds if order == "random" else [config.seed]:
            given = importances.get(order) if order != "random" else None
            frame = pruning_curve(
                model,
                probe,
                metric,
                order if given is None else given,
                label=order,
                config=replace(config, seed=seed),
                **kwargs,
            )
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
