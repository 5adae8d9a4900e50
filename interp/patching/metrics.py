"""What a patched run is scored by: a number per pair from the logits at the task's position.

:data:`METRICS` registers the task metrics under their CLI names:

- ``logit-diff``: the answer's logit minus the wrong answer's (the means, when a pair has several),
  *normalised* so that the corrupted run is 0 and the clean run is 1 (Wang et al.'s convention);
- ``raw-logit-diff``: the same difference, not normalised;
- ``prob-diff``: the answers' total probability minus the wrong answers' (Hanna et al.'s
  greater-than metric), normalised like ``logit-diff``;

or any :func:`interp.as_metric` (it reads the logits at every position; normalised).
:func:`task_metric` builds one for a :class:`~interp.probes.task.TaskProbe`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.ablation.metrics import Metric, as_metric
from interp.ablation.settings import checked
from interp.errors import UsageError
from interp.probes.task import TaskProbe
from interp.registry import Registry


def _rows(ids: Int[Tensor, "pair k"], rows: Tensor | None, device: torch.device) -> Int[Tensor, "batch k"]:
    ids = ids.to(device)
    return ids if rows is None else ids[rows.to(device)]


def _gather(values: Float[Tensor, "batch vocab"], ids: Int[Tensor, "batch k"]) -> tuple[Tensor, Tensor]:
    """``values`` at ``ids`` (``-1`` pads: 0 there), and which entries are real."""
    real = ids >= 0
    picked = values.gather(-1, ids.clamp_min(0))
    return torch.where(real, picked, 0.0), real


def _logit_diff(answer: Tensor, wrong: Tensor) -> Callable:
    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        logits = out[:, 0].float()
        a, ra = _gather(logits, _rows(answer, rows, logits.device))
        w, rw = _gather(logits, _rows(wrong, rows, logits.device))
        return a.sum(-1) / ra.sum(-1) - w.sum(-1) / rw.sum(-1)

    return fn


def _prob_diff(answer: Tensor, wrong: Tensor) -> Callable:
    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        probs = out[:, 0].float().softmax(-1)
        a, _ = _gather(probs, _rows(answer, rows, probs.device))
        w, _ = _gather(probs, _rows(wrong, rows, probs.device))
        return a.sum(-1) - w.sum(-1)

    return fn


def logit_diff_metric(task: TaskProbe, *, name: str = "logit-diff") -> Metric:
    """The answer's logit minus the wrong answer's at the task's position (means over several)."""
    return Metric(name, _logit_diff(task.answer, task.wrong), positions=(task.read_position,), higher_is_better=True)


def prob_diff_metric(task: TaskProbe) -> Metric:
    """The answers' total probability minus the wrong answers' at the task's position."""
    return Metric(
        "prob-diff", _prob_diff(task.answer, task.wrong), positions=(task.read_position,), higher_is_better=True
    )


METRICS: Registry[Callable[[TaskProbe], Metric]] = Registry("patching metric")
METRICS.add(
    "logit-diff",
    "the answer's logit minus the wrong answer's, normalised: corrupted run 0, clean run 1",
    logit_diff_metric,
    normalised=True,
)
METRICS.add(
    "raw-logit-diff",
    "the answer's logit minus the wrong answer's, not normalised",
    lambda task: logit_diff_metric(task, name="raw-logit-diff"),
    normalised=False,
)
METRICS.add(
    "prob-diff",
    "the answers' total probability minus the wrong answers' (greater-than), normalised: corrupted 0, clean 1",
    prob_diff_metric,
    normalised=True,
)


def task_metric(task: TaskProbe, metric: str | Metric | Callable | None = None) -> tuple[Metric, bool]:
    """The metric for ``task`` (default: the task's own) and whether it is normalised. A
    :class:`Metric` or a function wrapped by :func:`interp.as_metric` is normalised."""
    if metric is None:
        metric = task.metric
    if isinstance(metric, str):
        name = checked(METRICS, metric)
        return METRICS.get(name)(task), bool(METRICS.info(name, "normalised"))
    return as_metric(metric), True


def refuse_raw(metric: str | Metric | Callable | None, what: str) -> None:
    """Refuse a metric named by a raw entry of :data:`METRICS` where ``what`` reports a fraction of the
    clean-corrupted gap (a :class:`Metric` or an :func:`interp.as_metric` is normalised, ``None`` is
    the task's own): a check without a model, made before any forward."""
    if isinstance(metric, str) and metric in METRICS and not METRICS.info(metric, "normalised"):
        normalised = " or ".join(METRICS.select(lambda e: e.info.get("normalised", False)))
        raise UsageError(
            f"{what} reports a fraction of the clean-corrupted gap, a normalised metric: metric={metric} is raw; "
            f"use {normalised}",
            params="metric",
        )
