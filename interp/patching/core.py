"""What every way of patching shares: the run set up from a task, the baselines, and the result.

:func:`setup` turns a task (a :class:`~interp.probes.task.TaskProbe`, a bundled task's name or a
file) into a :class:`Setup`: the metric, the probe the patched runs read (with each sequence's
donor), the clean and corrupted baselines (refused when they agree), and the units to patch (heads,
or heads x positions). A method computes the patched metric per unit and pair; :func:`result` pools
it over pairs into a :class:`~interp.patching.result.PatchScores`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp import memory
from interp.ablation.metrics import Metric
from interp.ablation.modes import SITES, refuse_site
from interp.ablation.replay import read_out
from interp.ablation.settings import checked
from interp.ablation.sweep import ablation_header
from interp.adapters import HookedModel, run_with_reducers
from interp.config import RunConfig
from interp.errors import AblationError
from interp.hooks import k_hook
from interp.models import ModelInfo, describe
from interp.patching.metrics import METRICS, task_metric
from interp.patching.result import PatchScores
from interp.probes.task import DEFAULT_DIRECTION, PairedProbe, TaskProbe, check_direction, task_probe
from interp.registry import Registry
from interp.results import plural
from interp.scores import NOISE_FLOOR_FRACTION, bootstrap_mean, bootstrap_ratio
from interp.texts import token_label

FEWER_PAIRS = "use fewer pairs (n_pairs=)"
BY: Registry[str] = Registry("patching granularity")
BY.add("head", "each head at every position at once: a layer x head grid")
BY.add("position", "each head at each position alone: a (layer, head) x position grid")


@dataclass
class Setup:
    """One patching run, before any patch: what every method reads."""

    model: HookedModel
    info: ModelInfo
    task: TaskProbe
    metric: Metric
    normalised: bool
    direction: str
    by: str
    probe: PairedProbe  # the prompts the patched runs read, each with its donor
    clean: Float[Tensor, " pair"] | None  # None until a method that measures them itself has run
    corrupted: Float[Tensor, " pair"] | None
    config: RunConfig
    heads: list[tuple[int, int]]  # the units: (layer, head), or (layer, key/value head) for k and v
    positions: list[int | None]  # [None]: every position at once
    site: str = "z"
    group: int = 1  # query heads per unit: a key/value head's group on GQA/MQA, else 1

    @property
    def unpatched(self) -> Float[Tensor, " pair"]:
        """The metric of the runs patched into (corrupted denoising, clean noising)."""
        return self.corrupted if self.direction == "denoise" else self.clean

    @property
    def gap(self) -> float:
        return float(self.clean.mean() - self.corrupted.mean())


def validate_setup(
    *,
    metric: str | Metric | Callable | None = None,
    direction: str = DEFAULT_DIRECTION,
    by: str = "head",
    site: str = "z",
) -> None:
    """What :func:`setup` checks before any forward, without a model: the names chosen (a metric
    named by a string among :data:`~interp.patching.METRICS`, a direction of :data:`~interp.probes.task.DIRECTIONS`, a
    granularity of :data:`BY`, a site of :data:`~interp.ablation.modes.SITES`)."""
    check_direction(direction)
    BY.check(by)
    SITES.check(site)
    if isinstance(metric, str):
        checked(METRICS, metric)


def own_metric(task: TaskProbe | str | Path, metric: str | Metric | Callable | None) -> str | Metric | Callable | None:
    """The metric a run on ``task`` reads, for a check before any forward: ``metric``, else a
    :class:`~interp.probes.task.TaskProbe`'s own (a task still to be built: ``None``, its own)."""
    return task.metric if metric is None and isinstance(task, TaskProbe) else metric


def setup(
    model: HookedModel,
    task: TaskProbe | str | Path,
    *,
    metric: str | Metric | Callable | None = None,
    direction: str = DEFAULT_DIRECTION,
    by: str = "head",
    n_pairs: int | None = None,
    config: RunConfig | None = None,
    site: str = "z",
    measured: bool = True,
) -> Setup:
    """The run: names checked, the task built, its metric and baselines (refused when they agree).
    ``measured=False`` leaves the baselines (``clean``, ``corrupted``) to the method, which reads them
    off passes it runs anyway (attribution: the donor forward and its own points' passes)."""
    validate_setup(metric=metric, direction=direction, by=by, site=site)
    config = RunConfig.of(config)
    if not isinstance(task, TaskProbe):
        task = task_probe(model, task, n_pairs=n_pairs, seed=config.seed)
    info = describe(model)
    task = task.to(info.device)
    metric_, normalised = task_metric(task, metric)
    if metric_.needs_clean:  # before the baselines: they compare with the clean prompts too
        metric_ = against_clean(model, task, metric_, config.minibatch)
    clean, corrupted = (
        baselines(model, task, metric_, normalised=normalised, minibatch=config.minibatch) if measured else (None, None)
    )
    refuse_site(model, site, task.clean[:1])
    n_units = _kv_heads(model, task, info) if site in ("k", "v") else info.n_heads
    heads = [(l, h) for l in info.attention_layers for h in range(n_units)]
    last = task.read_position if info.is_causal else task.seq_len - 1
    positions: list[int | None] = list(range(last + 1)) if by == "position" else [None]
    probe = task.run_probe(direction)
    return Setup(
        model,
        info,
        task,
        metric_,
        normalised,
        direction,
        by,
        probe,
        clean,
        corrupted,
        config,
        heads,
        positions,
        site,
        info.n_heads // n_units,
    )


def _kv_heads(model: HookedModel, task: TaskProbe, info: ModelInfo) -> int:
    """How many key/value heads the model has (fewer than query heads on GQA/MQA): read off ``hook_k``."""
    seen: list[int] = []
    first = info.attention_layers[0]

    def grab(k: Tensor, hook: Any) -> None:
        seen.append(k.shape[2])

    with torch.no_grad():  # a forward of one prompt, stopped at the first layer's keys
        run_with_reducers(model, task.clean[:1], [(k_hook(first), grab)], stop_after=k_hook(first))
    n = seen[0]
    if n < 1 or info.n_heads % n:
        raise AblationError(f"the model has {info.n_heads} query heads and {n} key heads: not a grouping")
    return n


def result(run: Setup, values: Float[Tensor, "unit pair"], method: str, **extra: Any) -> PatchScores:
    """Pool the patched metric per unit (head, or head and position, in :func:`units` order) and pair
    into the result: ``effect`` with its bootstrap CI over pairs, the raw metric and its change."""
    base = run.unpatched[None]
    if run.normalised:
        num, den = gap_moved(run, values)
    else:
        num, den = values - base, torch.ones_like(values)
    cfg = run.config
    if run.normalised:
        point, lo, hi = pooled_ratio(num.T, den.T, cfg)
    else:
        point, lo, hi = bootstrap_mean(num.T, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
    columns = {
        "effect": point,
        "effect_lo": lo,
        "effect_hi": hi,
        "metric_patched": values.mean(1),
        "delta": (values - base).mean(1),
    }
    task, T = run.task, run.task.seq_len
    kind = "_".join(
        [
            "patch",
            *([method.replace("-", "_")] if method != "exact" else []),
            *([run.site] if run.site != "z" else []),
            run.by,
        ]
    )
    meta = ablation_header(
        run.model,
        run.probe,
        method=method,
        kind=kind,
        site=run.site,
        query_heads_per_unit=run.group,
        task=task.name,
        task_meta=dict(task.meta),
        n_pairs=task.n_pairs,
        direction=run.direction,
        by=run.by,
        metric=run.metric.name,
        normalised=run.normalised,
        clean_metric=float(run.clean.mean()),
        corrupted_metric=float(run.corrupted.mean()),
        read_position=task.read_position,
        noise_floor=NOISE_FLOOR_FRACTION * (1.0 if run.normalised else abs(run.gap)),
        ci_level=cfg.level,
        **gap_meta(run),
        **extra,
    )
    last = run.positions[-1]
    if last is not None and last < T - 1:
        meta["not_run"] = f"positions {last + 1}..{T - 1}: after the read position, 0 on a causal model"
    table, pairs = _tables(
        run.heads, run.positions, T, columns, num / den, _token_labels(run.model, run.probe.tokens[0])
    )
    if run.site in ("k", "v"):  # a unit is a key/value head: which query heads read it
        shared = [" ".join(map(str, range(h * run.group, (h + 1) * run.group))) for h in table["head"]]
        table.insert(3, "query_heads", shared)
    return PatchScores(table, meta, pairs)


def gap_moved(run: Setup, values: Float[Tensor, "... pair"]) -> tuple[Tensor, Tensor]:
    """The normalised effect of each patched ``values`` per pair (its last axis), as a numerator and
    denominator: the part of the clean-corrupted gap it moves (toward clean denoising, away from it
    noising), and the gap."""
    num = values - run.corrupted if run.direction == "denoise" else run.clean - values
    return num, (run.clean - run.corrupted).expand_as(num)


def pooled_ratio(
    num: Float[Tensor, "pair unit"], den: Float[Tensor, "pair unit"], config: RunConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """``sum(num) / sum(den)`` over pairs with its bootstrap CI (:func:`interp.scores.bootstrap_ratio`).
    Each pair's denominator is its own gap, of either sign: a pair whose clean run scores below its
    corrupted one (while the pooled gap is positive, or the other way round) is resampled like every
    other pair."""
    return bootstrap_ratio(num, den, n_boot=config.n_boot, level=config.level, seed=config.seed)


def baselines(
    model: HookedModel, task: TaskProbe, metric: Metric, *, normalised: bool = True, minibatch: int | None = None
) -> tuple[Float[Tensor, " pair"], Float[Tensor, " pair"]]:
    """The metric per pair on the clean and on the corrupted prompts (plain forwards). A normalised
    metric whose two means agree (the normalisation would divide by 0) is refused with both."""
    _check_forwards(model, task, metric, minibatch, "the baseline pass")
    clean = _metric_of(model, task.clean, metric, minibatch)
    corrupted = _metric_of(model, task.corrupted, metric, minibatch)
    refuse_equal(clean, corrupted, metric, normalised)
    return clean, corrupted


def against_clean(model: HookedModel, task: TaskProbe, metric: Metric, minibatch: int | None = None) -> Metric:
    """``metric`` (one that compares with a reference, :attr:`~interp.ablation.Metric.needs_clean`)
    bound to each pair's clean prompt: in patching its ``clean`` argument is the read-out of the
    clean prompt of the pair (``rows``), in either direction and in every pass (the baselines, the
    replay, attribution's passes, path patching's frozen runs), whatever the pass hands it.
    The clean prompts' read-outs come from one plain forward of them, made here."""
    _check_forwards(model, task, metric, minibatch, "the clean prompts' reference pass")
    L, n = describe(model).n_layers, task.n_pairs
    step = minibatch or n
    with torch.no_grad():
        reference = torch.cat([read_out(model, task.clean[s : s + step], metric, [], L) for s in range(0, n, step)])

    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        pairs = torch.arange(out.shape[0]) if rows is None else rows
        return metric.fn(out, tokens, reference[pairs.to(reference.device)].to(out.device), rows)

    return dataclasses.replace(metric, fn=fn)


def _check_forwards(model: HookedModel, task: TaskProbe, metric: Metric, minibatch: int | None, what: str) -> None:
    """Refuse, before any forward, plain forwards of the task's prompts that would not fit in memory."""
    info = describe(model)
    estimate = memory.forward_memory(model, info, task.n_pairs, task.seq_len, metric, what)
    memory.check(estimate, minibatch or task.n_pairs, info.device, fewer=FEWER_PAIRS)


def gap_meta(run: Setup) -> dict[str, Any]:
    """The clean-corrupted gap of ``run``'s metric with its bootstrap CI over pairs (``gap``,
    ``gap_lo``, ``gap_hi``) and, for a normalised metric whose gap's interval holds 0, ``gap_warning``:
    the one line a reader must see before any effect (they are fractions of that gap)."""
    cfg = run.config
    point, lo, hi = bootstrap_mean(
        (run.clean - run.corrupted)[:, None], n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed
    )
    out: dict[str, Any] = {"gap": float(point[0]), "gap_lo": float(lo[0]), "gap_hi": float(hi[0])}
    if run.normalised and out["gap_lo"] <= 0 <= out["gap_hi"]:
        n = len(run.clean)
        out["gap_warning"] = (
            f"! the clean-corrupted gap of {run.metric.name}, {out['gap']:.3g} [{out['gap_lo']:.3g}, "
            f"{out['gap_hi']:.3g}], has a {cfg.level:.0%} interval over the {plural(n, 'pair')} that "
            "holds 0: the normalised effects (fractions of that gap) are not meaningful; use more pairs, or "
            "corrupted prompts that change the answer"
        )
    return out


def refuse_equal(clean: Tensor, corrupted: Tensor, metric: Metric | str, normalised: bool) -> None:
    """Refuse a normalised metric (or one named so) whose clean and corrupted means agree, naming both."""
    name = metric if isinstance(metric, str) else metric.name
    gap = float(clean.mean() - corrupted.mean())
    scale = max(float(clean.abs().mean()), float(corrupted.abs().mean()), 1e-12)
    if normalised and abs(gap) <= 1e-6 * scale:
        raise AblationError(
            f"the clean and corrupted prompts give the same {name} (clean {float(clean.mean()):.6g}, "
            f"corrupted {float(corrupted.mean()):.6g}): the normalised effect is undefined; make the corrupted "
            "prompts change the answer, or use a raw metric (raw-logit-diff)"
        )


def _metric_of(model: HookedModel, tokens: Tensor, metric: Metric, minibatch: int | None) -> Float[Tensor, " batch"]:
    """``metric`` per sequence on a plain forward of ``tokens``."""
    L = describe(model).n_layers
    step = minibatch or tokens.shape[0]
    out = []
    with torch.no_grad():
        for s in range(0, tokens.shape[0], step):
            rows = torch.arange(s, min(s + step, tokens.shape[0]))
            batch = tokens[rows.to(tokens.device)]
            read = read_out(model, batch, metric, [], L)
            out.append(metric(read, batch, read, rows).cpu())
    return torch.cat(out).float()


def masks_of(
    heads: list[tuple[int, int]], positions: list[int | None], L: int, H: int, T: int, group: int = 1
) -> Bool[Tensor, "n layer head *pos"]:
    """One mask per (unit, position): per head ``[n, L, H]``, per position ``[n, L, H, T]``; a unit
    covers ``group`` query heads (a key/value head's group)."""
    per_position = positions != [None]
    masks = torch.zeros(len(heads) * len(positions), L, H, *([T] if per_position else []), dtype=torch.bool)
    for i, (l, h) in enumerate(heads):
        cols = slice(h * group, (h + 1) * group)
        for j, p in enumerate(positions):
            if per_position:
                masks[i * len(positions) + j, l, cols, p] = True
            else:
                masks[i, l, cols] = True
    return masks


def _token_labels(model: HookedModel, tokens: Tensor) -> list[str]:
    tokenizer = getattr(model, "tokenizer", None)
    ids = tokens.tolist()
    if tokenizer is None:
        return [str(t) for t in ids]
    return [token_label(tokenizer, t) for t in ids]


def _tables(
    heads: list[tuple[int, int]],
    positions: list[int | None],
    T: int,
    columns: dict[str, Tensor],
    pair_effect: Tensor,
    tokens: list[str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The result's table (a row per head, or per head and position: later positions 0) and the
    effect per pair (long: a row per pair and unit)."""
    rows, pair_rows = [], []
    per_position = positions != [None]
    all_positions = list(range(T)) if per_position else [None]
    k = 0
    for l, h in heads:
        for p in all_positions:
            row: dict[str, Any] = {"layer": l, "head": h, "label": f"{l}.{h}"}
            if per_position:
                row.update(position=p, token=tokens[p])
            if p is None or p in positions:
                row.update({name: float(col[k]) for name, col in columns.items()})
                for pair, e in enumerate(pair_effect[k].tolist()):
                    pair_rows.append({"pair": pair, **{c: row[c] for c in ("layer", "head", "label")}, "effect": e})
                    if per_position:
                        pair_rows[-1]["position"] = p
                k += 1
            else:
                row.update({name: 0.0 for name in columns})
            rows.append(row)
    return pd.DataFrame(rows), pd.DataFrame(pair_rows)
