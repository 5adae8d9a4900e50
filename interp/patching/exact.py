"""Exact activation patching per head and per head x position, on the ablation sweep's replay.

Patching is an ablation whose replacement comes from the paired run
(:class:`~interp.ablation.modes.PatchAblation`): each sequence's head output is replaced by that
head's output on the other prompt of its pair. The :class:`~interp.ablation.replay.Sweeper` then
evaluates every patch as one row of a batched replay of the blocks from the patched layer up
(self-checked against plain hooked runs; the plain loop where that check fails), journaled.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp.ablation.metrics import Metric
from interp.ablation.replay import Sweeper, read_out
from interp.ablation.settings import run_config
from interp.ablation.sweep import ablation_header
from interp.adapters import HookedModel
from interp.config import RunConfig
from interp.errors import AblationError, UsageError
from interp.journal import Journal
from interp.models import describe
from interp.patching.metrics import task_metric
from interp.patching.result import PatchScores
from interp.probes.task import DIRECTIONS, TaskProbe, task_probe
from interp.registry import Registry
from interp.scores import NOISE_FLOOR_FRACTION, bootstrap_mean, bootstrap_ratio

BY: Registry[str] = Registry("patching granularity")
BY.add("head", "each head at every position at once: a layer x head grid")
BY.add("position", "each head at each position alone: a (layer, head) x position grid")

DIRECTION_HELP = {
    "denoise": "run the corrupted prompt, patch in the clean run's head output (what restores the answer)",
    "noise": "run the clean prompt, patch in the corrupted run's head output (what destroys it)",
}


def patch_heads(
    model: HookedModel,
    task: TaskProbe | str | Path,
    *,
    metric: str | Metric | Callable | None = None,
    direction: str = "denoise",
    by: str = "head",
    n_pairs: int = 20,
    replay: str = "auto",
    chunk: int | None = None,
    config: RunConfig | None = None,
    journal: Journal | None = None,
) -> PatchScores:
    """Patch every head's output (``hook_z``) from each pair's other prompt, alone, and score it.

    ``task``: a :class:`~interp.probes.task.TaskProbe`, a bundled task name (``repeat``, ``ioi``,
    ``greater-than``: ``n_pairs`` pairs, seeded by ``config.seed``) or a JSONL/CSV file.
    ``metric``: a name of :data:`interp.patching.METRICS` (default: the task's own), a
    :class:`~interp.ablation.Metric` or an :func:`interp.as_metric`. ``direction``: ``denoise`` (run
    corrupted, patch in clean) or ``noise`` (run clean, patch in corrupted). ``by``: ``head`` (every
    position at once) or ``position`` (each position alone; on a causal model positions after the
    read position cannot reach it and are 0, not run).

    The table's ``effect`` is, for a normalised metric, the fraction of the clean-corrupted gap the
    patch moves: ``(patched - corrupted) / (clean - corrupted)`` denoising,
    ``(clean - patched) / (clean - corrupted)`` noising, pooled over pairs (sums over pairs, then the
    ratio), with a bootstrap CI over pairs; a head that carries the answer alone scores 1 both ways.
    For a raw metric it is the change ``patched - unpatched``. ``metric_patched`` is the raw metric,
    ``delta`` its change. :attr:`PatchScores.pairs` has the effect per pair.
    """
    if direction not in DIRECTIONS:
        raise UsageError(f"unknown direction {direction!r}: choose from {list(DIRECTIONS)}")
    BY.check(by)
    config = run_config(config)
    if not isinstance(task, TaskProbe):
        task = task_probe(model, task, n_pairs=n_pairs, seed=config.seed)
    info = describe(model)
    task = task.to(info.device)
    metric, normalised = task_metric(task, metric)
    probe = task.run_probe(direction)
    clean, corrupted = baselines(model, task, metric, normalised=normalised, minibatch=config.minibatch)
    gap = float(clean.mean() - corrupted.mean())
    sweeper = Sweeper(
        model, probe, metric, ablation="patch", replay=replay, chunk=chunk, config=config, journal=journal
    )
    heads = [(l, h) for l in info.attention_layers for h in range(info.n_heads)]
    T = task.seq_len
    last = task.read_position if info.is_causal else T - 1
    positions = list(range(last + 1)) if by == "position" else [None]
    masks = _masks(heads, positions, info.n_layers, info.n_heads, T)
    values = sweeper.evaluate(masks, desc=f"patching heads ({direction}, by {by})", scope=f"patch-{direction}-{by}")
    # [unit, pair] -> what is pooled
    base = sweeper.clean.float().cpu()[None]
    if normalised:
        num = values - corrupted[None] if direction == "denoise" else clean[None] - values
        den = (clean - corrupted)[None].expand_as(num)
    else:
        num, den = values - base, torch.ones_like(values)
    cfg = sweeper.config
    if normalised:
        point, lo, hi = bootstrap_ratio(num.T, den.T, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
    else:
        point, lo, hi = bootstrap_mean(num.T, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
    columns = {
        "effect": point,
        "effect_lo": lo,
        "effect_hi": hi,
        "metric_patched": values.mean(1),
        "delta": (values - base).mean(1),
    }
    meta = ablation_header(
        model,
        probe,
        method="exact",
        kind=f"patch_{by}",
        task=task.name,
        task_meta=dict(task.meta),
        n_pairs=task.n_pairs,
        direction=direction,
        by=by,
        metric=metric.name,
        normalised=normalised,
        clean_metric=float(clean.mean()),
        corrupted_metric=float(corrupted.mean()),
        read_position=task.read_position,
        replay=sweeper.replay,
        shortcuts=sweeper.shortcuts,
        noise_floor=NOISE_FLOOR_FRACTION * (1.0 if normalised else abs(gap)),
        ci_level=cfg.level,
    )
    if by == "position" and last < T - 1:
        meta["not_run"] = f"positions {last + 1}..{T - 1}: after the read position, 0 on a causal model"
    if sweeper.interrupted:
        meta["partial"] = True
    pair_effect = num / den
    table, pairs = _tables(heads, positions, T, columns, pair_effect, _token_labels(model, probe.tokens[0]))
    return PatchScores(table, meta, pairs)


def baselines(
    model: HookedModel, task: TaskProbe, metric: Metric, *, normalised: bool = True, minibatch: int | None = None
) -> tuple[Float[Tensor, " pair"], Float[Tensor, " pair"]]:
    """The metric per pair on the clean and on the corrupted prompts (plain forwards). A normalised
    metric whose two means agree (the normalisation would divide by 0) is refused with both."""
    clean = _metric_of(model, task.clean, metric, minibatch)
    corrupted = _metric_of(model, task.corrupted, metric, minibatch)
    gap = float(clean.mean() - corrupted.mean())
    scale = max(float(clean.abs().mean()), float(corrupted.abs().mean()), 1e-12)
    if normalised and abs(gap) <= 1e-6 * scale:
        raise AblationError(
            f"the clean and corrupted prompts give the same {metric.name} (clean {float(clean.mean()):.6g}, "
            f"corrupted {float(corrupted.mean()):.6g}): the normalised effect is undefined; make the corrupted "
            "prompts change the answer, or use a raw metric (raw-logit-diff)"
        )
    return clean, corrupted


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


def _masks(
    heads: list[tuple[int, int]], positions: list[int | None], L: int, H: int, T: int
) -> Bool[Tensor, "n layer head *pos"]:
    """One mask per (head, position): per head ``[n, L, H]``, per position ``[n, L, H, T]``."""
    per_position = positions != [None]
    masks = torch.zeros(len(heads) * len(positions), L, H, *([T] if per_position else []), dtype=torch.bool)
    for i, (l, h) in enumerate(heads):
        for j, p in enumerate(positions):
            if per_position:
                masks[i * len(positions) + j, l, h, p] = True
            else:
                masks[i, l, h] = True
    return masks


def _token_labels(model: HookedModel, tokens: Tensor) -> list[str]:
    tokenizer = getattr(model, "tokenizer", None)
    ids = tokens.tolist()
    if tokenizer is None:
        return [str(t) for t in ids]
    return [str(t) for t in tokenizer.convert_ids_to_tokens(ids)]


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
