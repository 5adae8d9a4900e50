"""The parts that ablate heads: the exact sweep, gradient importance and the pruning curves, on the
head scores' repeated probe."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from interp.adapters import HookedModel, ModelInfo
from interp.config import RunConfig
from interp.errors import UsageError
from interp.parts.attention import ScoreSizes
from interp.parts.base import Given, PartResult, part
from interp.parts.shape import info_of, n_heads
from interp.progress import forward_work

ORDERS = ("gradient", "exact")  # the pruning orders read from the ablation parts, beside "random"


@dataclass(frozen=True)
class AblationSizes(ScoreSizes):
    """The ablation parts run on the head scores' probe (its sizes), ablating heads by ``ablation``."""

    ablation: str = "mean"


@dataclass(frozen=True)
class PruningSizes(AblationSizes):
    """The pruning curves: one per order of ``orders`` (``gradient``, ``exact``: the importances those
    parts computed), and one random order."""

    orders: tuple[str, ...] = ORDERS


def _validate_ablation(sizes: AblationSizes) -> None:
    from interp.ablation.modes import unpaired_ablations

    if sizes.ablation not in unpaired_ablations():
        raise UsageError(
            f"unknown ablation {sizes.ablation!r}: choose from {', '.join(unpaired_ablations())}", params="ablation"
        )


def _setup(model: HookedModel, sizes: AblationSizes, cfg: RunConfig) -> tuple[Any, Any, dict, dict]:
    """The probe, the metric (decoders: the loss on the repeated half; encoders, with no next token: the
    pooled output's cosine to the clean one), the common keywords and the meta every ablation part adds."""
    from interp.ablation import builtin_metric

    probe = sizes.probe(model, info_of(model), cfg.seed)
    metric = builtin_metric("incontext" if probe.causal else "pooled-cos", probe)
    common = dict(ablation=sizes.ablation, config=RunConfig(seed=cfg.seed, progress=cfg.progress))
    return probe, metric, common, {"metric": metric.name, "ablation": sizes.ablation}


def replayed(info: ModelInfo) -> int:
    return sum(info.n_heads * (info.n_layers - l) for l in info.attention_layers)


def vocab(info: ModelInfo) -> int:
    return info.d_vocab if info.is_causal else 0


def _exact_work(info: ModelInfo, sizes: AblationSizes) -> tuple[str, float]:
    tokens, probe = sizes.tokens(info)
    d = info.d_model
    work = forward_work(tokens, replayed(info), d) + forward_work(tokens * n_heads(info), 0, d, vocab(info))
    return f"the exact sweep ({n_heads(info)} heads x {probe})", work


@part(
    "exact",
    "the exact single-head ablation sweep",
    AblationSizes,
    work=_exact_work,
    order=3,
    validate=_validate_ablation,
    atlas="exact",
    place=2,
)
def _exact(model: HookedModel, sizes: AblationSizes, cfg: RunConfig, given: Given) -> PartResult:
    from interp.ablation import exact_sweep

    probe, metric, common, meta = _setup(model, sizes, cfg)
    journal = given.journals("atlas-exact", probe.tokens) if given.journals is not None else None
    sweep = exact_sweep(model, probe, metric, journal=journal, **common)
    if sweep.meta.get("partial"):  # Ctrl-C: no result from part of a sweep (the journal keeps it)
        raise KeyboardInterrupt
    columns = sweep.table[["layer", "head", "importance"]].rename(columns={"importance": "exact_importance"})
    return PartResult(columns, meta={**meta, "clean_metric": sweep.meta.get("clean_metric")}, result=sweep)


def _gradient_work(info: ModelInfo, sizes: AblationSizes) -> tuple[str, float]:
    tokens, probe = sizes.tokens(info)
    return f"gradient importance ({probe})", 3 * forward_work(tokens, info.n_layers, info.d_model, vocab(info))


@part(
    "gradient",
    "Michel et al.'s gradient importance",
    AblationSizes,
    work=_gradient_work,
    order=4,
    validate=_validate_ablation,
    atlas="gradient",
    place=2,
)
def _gradient(model: HookedModel, sizes: AblationSizes, cfg: RunConfig, given: Given) -> PartResult:
    from interp.ablation import gradient_importance

    probe, metric, common, meta = _setup(model, sizes, cfg)
    got = gradient_importance(model, probe, metric, **common)
    columns = got.table[["layer", "head", "importance"]].rename(columns={"importance": "gradient_importance"})
    return PartResult(columns, meta=meta, result=got)


def _steps(info: ModelInfo) -> int:
    L, H = info.n_layers, info.n_heads
    return math.ceil(L * H / max(1, round(0.1 * L * H)))


def _pruning_work(info: ModelInfo, sizes: PruningSizes) -> tuple[str, float]:
    tokens, probe = sizes.tokens(info)
    curves, steps = 1 + len(sizes.orders), _steps(info)
    work = curves * steps * forward_work(tokens, info.n_layers, info.d_model, vocab(info))
    return f"the pruning curves ({curves} orders x {steps} steps x {probe})", work


def _validate_pruning(sizes: PruningSizes) -> None:
    _validate_ablation(sizes)
    bad = [o for o in sizes.orders if o not in ORDERS]
    if bad:
        raise UsageError(f"pruning orders are read from {' and '.join(ORDERS)}, not {', '.join(bad)}", params="orders")


@part(
    "pruning",
    "pruning curves (gradient, exact and random orders)",
    PruningSizes,
    work=_pruning_work,
    order=5,
    validate=_validate_pruning,
    atlas="pruning",
)
def _pruning(model: HookedModel, sizes: PruningSizes, cfg: RunConfig, given: Given) -> PartResult:
    from interp.ablation import pruning_curves

    probe, metric, common, meta = _setup(model, sizes, cfg)
    journal = given.journals("atlas-pruning", probe.tokens) if given.journals is not None else None
    # the orders rank by the importances the parts before have just computed (a partial sweep is no order)
    done = {o: given.result(o) for o in sizes.orders}
    importances = {k: v for k, v in done.items() if v is not None and not v.meta.get("partial")}
    orders = [*sizes.orders, "random"]
    curves = pruning_curves(
        model,
        probe,
        metric,
        orders=orders,
        random_seeds=(cfg.seed,),
        importances=importances,
        journal=journal,
        **common,
    )
    if curves.partial:
        raise KeyboardInterrupt
    return PartResult(meta=meta, result=curves.table)


__all__ = ["ORDERS", "AblationSizes", "PruningSizes"]
