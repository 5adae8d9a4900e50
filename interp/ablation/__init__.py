"""Head ablation: which heads matter for a metric, and how many can go.

A head is *ablated* at its output before ``W_O`` (``blocks.{l}.attn.hook_z``), in one of three ways:

- ``zero``: the output is set to 0 (Michel et al. 2019's head mask);
- ``mean``: set to the head's mean output over the probe (every sequence and position);
- ``resample``: set to the head's output on another sequence of the probe (a seeded derangement
  pairs each sequence with a donor; the donor's *clean* output is used).

A **metric** is a callable on ``(logits, tokens)`` returning one number per sequence; a
:class:`Metric` also says which positions it reads (so only those are unembedded), whether it reads
the logits or the final hidden state, and which direction is better. Built in: the language-model
loss on a text probe (:func:`lm_loss`), the in-context loss on the tokens of a repeated-token probe
that in-context copying can predict (:func:`incontext_loss`), the logit difference between two answer tokens (:func:`logit_diff`),
and for encoders the cosine similarity of the mean-pooled final hidden state to the unablated one
(:func:`pooled_cosine`).

On that footing:

- :func:`ablated` silences heads inside a ``with`` block (notebooks); :class:`Sweeper` evaluates the
  metric under many head sets at once;
- :func:`exact_sweep` ablates every head alone. Its engine runs the clean pass once, caching the
  residual stream entering every block and how each block was called, and then, for the heads of
  layer ``l``, replays only blocks ``l .. L-1``, several ablations batched along the batch axis,
  unembedding only the positions the metric reads. Where replaying a model's blocks, clean and
  under ablation, does not reproduce plain hooked runs (checked once per sweep) it falls back to a
  plain ``run_with_hooks`` loop;
- :func:`gradient_importance` is Michel et al.'s ``I_h = E_x |A_h(x)^T dL(x)/dA_h(x)|``, the
  absolute value taken per sequence (per token on request), from one forward and backward per
  batch; metrics with no gradient at the clean point are refused;
- :func:`pruning_curve` removes heads in increasing order of importance (10 % of the heads a step by
  default), optionally re-estimating the importance after each step; :func:`heads_prunable` reads off
  how many heads can go before the metric degrades by a given fraction;
- :func:`train_gates` trains Voita et al. 2019's input-independent Hard-Concrete gates with an L0
  penalty over a sweep of ``lambda`` on the frozen model and binarises them.

Importance is always signed so that *larger means the head matters more*: for a loss, the increase
on ablation; for a higher-is-better metric, the decrease.

The package, one concern a module: :mod:`~interp.ablation.modes` (head sets, ablation modes,
:func:`ablated`), :mod:`~interp.ablation.metrics`, :mod:`~interp.ablation.engine` (the replay engine,
:class:`Sweeper`), :mod:`~interp.ablation.calls` (recorded block calls),
:mod:`~interp.ablation.shortcuts` (the engine's exact shortcuts), :mod:`~interp.ablation.sweep` (exact sweeps), :mod:`~interp.ablation.gradient`,
:mod:`~interp.ablation.pruning` and :mod:`~interp.ablation.gates`.
"""

from interp.ablation.engine import ENGINES, CleanBatch, Sweeper
from interp.ablation.gates import (
    GATE_STRETCH,
    GATE_TEMPERATURE,
    GateSweep,
    gate_open_probability,
    gate_sample,
    gate_value,
    largest_lambda_within,
    train_gates,
)
from interp.ablation.gradient import frozen, gradient_importance
from interp.ablation.metrics import (
    METRICS,
    Metric,
    as_metric,
    builtin_metric,
    incontext_logit_diff,
    incontext_loss,
    lm_loss,
    logit_diff,
    pooled_cosine,
    predictable_mask,
)
from interp.ablation.modes import ABLATIONS, HeadAblation, ablated, derangement, head_labels, head_mask
from interp.ablation.pruning import ORDERS, heads_prunable, pruning_curve, pruning_curves, spearman
from interp.ablation.sweep import exact_sweep, loop_sweep
from interp.errors import AblationError, MetricError

__all__ = [
    "ABLATIONS",
    "ENGINES",
    "GATE_STRETCH",
    "GATE_TEMPERATURE",
    "METRICS",
    "ORDERS",
    "AblationError",
    "CleanBatch",
    "GateSweep",
    "HeadAblation",
    "Metric",
    "MetricError",
    "Sweeper",
    "ablated",
    "as_metric",
    "builtin_metric",
    "derangement",
    "exact_sweep",
    "frozen",
    "gate_open_probability",
    "gate_sample",
    "gate_value",
    "gradient_importance",
    "head_labels",
    "head_mask",
    "heads_prunable",
    "incontext_logit_diff",
    "incontext_loss",
    "largest_lambda_within",
    "lm_loss",
    "logit_diff",
    "loop_sweep",
    "pooled_cosine",
    "predictable_mask",
    "pruning_curve",
    "pruning_curves",
    "spearman",
    "train_gates",
]
