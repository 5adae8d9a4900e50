"""The task part: exact patching and direct logit attribution on a task's pairs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from interp.adapters import HookedModel, ModelInfo
from interp.config import RunConfig
from interp.errors import UsageError
from interp.parts.ablation import replayed, vocab
from interp.parts.base import Given, NotApplicable, PartResult, part
from interp.parts.shape import n_heads
from interp.progress import forward_work
from interp.results import plural


@dataclass(frozen=True)
class TaskSizes:
    """The task's pairs (``given.task``): ``pairs`` of ``tokens`` tokens each, as the pairs were drawn."""

    pairs: int = 0
    tokens: int = 0


def _task_work(info: ModelInfo, sizes: TaskSizes) -> tuple[str, float]:
    d, n = info.d_model, n_heads(info)
    work = forward_work(sizes.pairs * sizes.tokens, replayed(info) + 3 * info.n_layers, d)
    work += forward_work(sizes.pairs * n, 0, d, vocab(info))
    return f"the task part ({n} heads patched x {plural(sizes.pairs, 'pair')} of {sizes.tokens} tokens)", work


def _task_applies(info: ModelInfo, sizes: TaskSizes, given: Given) -> NotApplicable | None:
    return None if given.task is not None else NotApplicable("it runs on a task's pairs, and none is given")


@part(
    "task",
    "with a task, task= (command line: --task): each head patched exactly (denoising, the task's normalised "
    "metric) and direct logit attribution on its pairs",
    TaskSizes,
    work=_task_work,
    order=1,
    applicable=_task_applies,
    place=3,
)
def _task(model: HookedModel, sizes: TaskSizes, cfg: RunConfig, given: Given) -> PartResult:
    """Exact per-head patching (denoising, the task's own normalised metric) and direct logit
    attribution on the task's pairs: the columns ``patch_effect[_lo, _hi]`` and ``dla[_lo, _hi]``;
    how they were read goes to ``meta["task"]``. A model that direct logit attribution refuses keeps
    the patching, with a note."""
    from interp.patching import patch_heads
    from interp.roles import logit_attribution

    task = given.task
    journal = given.journals("atlas-patch", task.clean) if given.journals is not None else None
    patched = patch_heads(model, task, direction="denoise", config=cfg, journal=journal)
    if patched.meta.get("partial"):  # Ctrl-C: no result from part of a sweep (the journal keeps it)
        raise KeyboardInterrupt
    keep = {c: c.replace("effect", "patch_effect") for c in ("effect", "effect_lo", "effect_hi")}
    columns = patched.table[["layer", "head", *keep]].rename(columns=keep)
    m = patched.meta
    read = {"name": task.name, "n_pairs": task.n_pairs, "seq_len": task.seq_len, "read_position": task.read_position}
    facts = ("direction", "metric", "clean_metric", "corrupted_metric", "noise_floor", "task_meta")
    meta: dict[str, Any] = {"task": {**read, **{k: m[k] for k in facts}}}
    try:
        dla = logit_attribution(model, task, config=cfg)
    except UsageError as e:
        return PartResult(columns, notes=[f"task: direct logit attribution: left out: {e}"], meta=meta, result=patched)
    meta["task"].update(dla_direction=dla.meta["direction"], dla_max_error=dla.meta["max_error"])
    if dla.meta["softcap"]:
        meta["task"]["dla_softcap"] = dla.meta["softcap"]
    columns = columns.merge(dla.heads.table[["layer", "head", "dla", "dla_lo", "dla_hi"]], on=["layer", "head"])
    return PartResult(columns, meta=meta, result=patched)


__all__ = ["TaskSizes"]
