"""``patch_heads``: every head (or head and position) patched alone, by the method asked for.

:data:`METHODS` registers the methods: ``exact`` (:mod:`interp.patching.exact`, the batched replay)
``attribution``, ``eap-ig`` and edge attribution's ``eap-ig-inputs``, ``eap-ig-activations`` and
``clean-corrupted`` (:mod:`interp.patching.attribution`, one or a few forwards and backwards). :func:`agreement`
says how well an approximate ranking agrees with the exact one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from interp.ablation.metrics import Metric
from interp.ablation.pruning import spearman
from interp.ablation.replay import REPLAYS
from interp.ablation.settings import checked
from interp.adapters import HookedModel
from interp.config import RunConfig
from interp.errors import UsageError
from interp.journal import Journal
from interp.patching.attribution import GRADIENT_METHODS, attribution_values
from interp.patching.core import result, setup, validate_setup
from interp.patching.exact import exact_values
from interp.patching.result import PatchScores
from interp.probes.task import DEFAULT_DIRECTION, TaskProbe
from interp.registry import Registry

METHODS: Registry[Callable[..., Any]] = Registry("patching method")
METHODS.add("exact", "every patch run: one row of a batched replay from the patched layer up", exact_values)
METHODS.add(
    "attribution",
    "attribution patching: (donor - own activation) . gradient, one forward and backward; signed, approximate",
    attribution_values,
    points="eap",
)
METHODS.add(
    "eap-ig",
    "EAP-IG at head granularity: the gradient averaged over steps with every head moved together between the two "
    "activations (default 5); signed, approximate",
    attribution_values,
    points="eap-ig",
    steps=True,
)
for _name in ("eap-ig-inputs", "eap-ig-activations", "clean-corrupted"):  # edge attribution's, read at the heads
    METHODS.add(
        _name,
        f"edge attribution's, read at the heads: {GRADIENT_METHODS.doc(_name)}; signed, approximate",
        attribution_values,
        points=_name,
        steps=GRADIENT_METHODS.info(_name, "steps"),
    )
STEPPED = METHODS.select(lambda e: e.info.get("steps", False))
EAP_IG_STEPS = 5


def validate_patch_heads(
    *,
    method: str = "exact",
    metric: str | Metric | Callable | None = None,
    direction: str = DEFAULT_DIRECTION,
    by: str = "head",
    replay: str | None = None,
    journal: Journal | None = None,
    site: str | None = "z",
    steps: int | None = None,
) -> None:
    """What :func:`patch_heads` refuses before any forward, without a model: an unknown name, a
    setting of the exact method (``replay``, ``journal``, a ``site`` other than ``z``) given to
    another method, ``steps`` given to a method other than ``eap-ig`` or not an integer >= 1.
    ``site=None`` is the default site, ``z``."""
    METHODS.check(method)
    if replay is not None:
        checked(REPLAYS, replay)
    validate_setup(metric=metric, direction=direction, by=by, site=site or "z")
    if method != "exact":
        given = [
            name
            for name, value in (("replay", replay), ("journal", journal), ("site", site))
            if value not in (None, "z")
        ]
        if given:
            gates = " gates the head outputs (site z) and" if "site" in given else ""
            raise UsageError(
                f"method={method}{gates} does not read {' or '.join(f'{n}=' for n in given)} (it applies to "
                f"method=exact): drop {'it' if len(given) == 1 else 'them'}",
                params=("method", *given),
            )
    if steps is not None and method not in STEPPED:
        stepped = ", ".join(STEPPED[:-1]) + f" or {STEPPED[-1]}"
        raise UsageError(
            f"method={method} does not read steps= (it applies to method={stepped}): drop it",
            params=("method", "steps"),
        )
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise UsageError(f"steps={steps!r}: the number of integration steps is an integer >= 1", params="steps")


def patch_heads(
    model: HookedModel,
    task: TaskProbe | str | Path,
    *,
    method: str = "exact",
    metric: str | Metric | Callable | None = None,
    direction: str = DEFAULT_DIRECTION,
    by: str = "head",
    n_pairs: int | None = None,
    replay: str | None = None,
    config: RunConfig | None = None,
    journal: Journal | None = None,
    site: str = "z",
    steps: int | None = None,
) -> PatchScores:
    """Patch every head's output (``hook_z``) from each pair's other prompt, alone, and score it.

    ``task``: a :class:`~interp.probes.task.TaskProbe`, a bundled task name (``repeat``, ``ioi``,
    ``greater-than``: ``n_pairs`` pairs, default 20, seeded by ``config.seed``) or a JSONL/CSV file
    (its first ``n_pairs`` pairs, default every pair).
    ``method``: ``exact`` (every patch run, on the ablation replay; ``replay`` and ``journal`` are its
    settings), ``attribution`` (the first-order estimate from one forward and
    backward), ``eap-ig`` (the gradient averaged over ``steps`` points between the donor's and the
    run's own head outputs, default 5), or edge attribution's ``eap-ig-inputs``, ``eap-ig-activations``
    (``steps`` points too) and ``clean-corrupted``, read at the heads (one gradient path and one
    definition of each method, :class:`interp.patching.attribution.Passes`). ``metric``: a name of :data:`interp.patching.METRICS` (default: the task's own), a
    :class:`~interp.ablation.Metric` or an :func:`interp.as_metric`. ``direction``: ``denoise`` (run
    corrupted, patch in clean) or ``noise`` (run clean, patch in corrupted). ``by``: ``head`` (every
    position at once) or ``position`` (each position alone; on a causal model positions after the
    read position cannot reach it and are 0, not run). ``site`` (exact only, :data:`SITES`): what is
    patched: the head outputs ``z`` (default), the queries ``q``, keys ``k``, values ``v`` (on GQA/MQA a
    key or value head is one unit, patched for every query head of its group; the table's
    ``query_heads`` says which) or the ``pattern`` (per position: a query's row).

    The table's ``effect`` is, for a normalised metric, the fraction of the clean-corrupted gap the
    patch moves: ``(patched - corrupted) / (clean - corrupted)`` denoising,
    ``(clean - patched) / (clean - corrupted)`` noising, pooled over pairs (sums over pairs, then the
    ratio), with a bootstrap CI over pairs; a head that carries the answer alone scores 1 both ways.
    For a raw metric it is the change ``patched - unpatched``. ``metric_patched`` is the raw metric,
    ``delta`` its change. :attr:`PatchScores.pairs` has the effect per pair.
    """
    validate_patch_heads(
        method=method, metric=metric, direction=direction, by=by, replay=replay, journal=journal, site=site, steps=steps
    )
    run = setup(
        model,
        task,
        metric=metric,
        direction=direction,
        by=by,
        n_pairs=n_pairs,
        config=config,
        site=site,
        measured=method == "exact",  # attribution reads the baselines off its own passes
    )
    if method == "exact":
        values, facts = exact_values(run, replay=replay or "auto", journal=journal)
    else:
        m = (steps or EAP_IG_STEPS) if method in STEPPED else 1
        values, facts = attribution_values(run, method=METHODS.info(method, "points"), steps=m)
    return result(run, values, method, **facts)


TIED = 1e-5  # |score| at most this fraction of the largest: no effect, a tie at zero in the rankings


def _rounded_to_zero(v: np.ndarray) -> np.ndarray:
    largest = float(np.nanmax(np.abs(v))) if v.size else 0.0
    return np.where(np.abs(v) <= TIED * largest, 0.0, v)


def agreement(
    exact: PatchScores, approx: PatchScores, *, k: int | None = None, score: str = "effect"
) -> dict[str, float]:
    """How well ``approx``'s ranking agrees with ``exact``'s over the same units: the Spearman
    correlation of ``score``, and the fraction of exact's top ``k`` (by ``|score|``) in approx's.
    ``k`` defaults to half the units, at most 10 (4 of the toy's 8 heads, 10 of GPT-2's 144); a ``k``
    that takes every unit is refused (its overlap is 1 whatever the rankings). Scores within
    :data:`TIED` of each side's largest |score| rank as ties at zero: they are float rounding (a
    unit that changes nothing reads 1e-9 here and -1e-9 on another CPU), and their order would move
    the correlation from one machine to the next."""
    keys = ["layer", "head", *(["position"] if "position" in exact.table else [])]
    both = exact.table.merge(approx.table, on=keys, suffixes=("_exact", "_approx"))
    a, b = (_rounded_to_zero(both[f"{score}_{side}"].to_numpy()) for side in ("exact", "approx"))
    if len(both) != len(exact.table) or len(both) != len(approx.table):
        raise UsageError("the two results patch different units: run both on the same task, by and model")
    n = len(both)
    k = max(1, min(10, n // 2)) if k is None else int(k)
    if not 1 <= k < n:
        raise UsageError(
            f"k={k}: the top-k overlap of {n} units needs 1 <= k < {n} (k={n} takes every unit, and the overlap "
            "is 1 whatever the rankings)"
        )
    top = lambda v: set(np.argsort(-np.abs(v), kind="stable")[:k].tolist())  # noqa: E731
    return {"spearman": float(spearman(a, b)), "top_k_overlap": len(top(a) & top(b)) / k, "k": k}
