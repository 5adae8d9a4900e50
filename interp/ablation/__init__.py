"""Head ablation: which heads matter for a metric, and how many can go.

A head is *ablated* at its output before ``W_O`` (``blocks.{l}.attn.hook_z``), in one of these ways:

- ``zero``: the output is set to 0 (Michel et al. 2019's head mask);
- ``mean``: set to the head's mean output over the probe (every sequence and position);
- ``resample``: set to the head's output on another sequence of the probe (a seeded derangement
  pairs each sequence with a donor; the donor's *clean* output is used);
- ``patch``: set to the head's output on the sequence's paired prompt (activation patching on a task
  probe, :mod:`interp.patching`; not a choice of the ablation commands).

A **metric** is a callable on ``(logits, tokens)`` returning one number per sequence; a
:class:`Metric` also says which positions it reads (so only those are unembedded), whether it reads
the logits or the final hidden state, and which direction is better. Built in: the language-model
loss on a text probe (:func:`lm_loss`), the in-context loss on the tokens of a repeated-token probe
that in-context copying can predict (:func:`incontext_loss`), the logit difference between two answer tokens (:func:`logit_diff`),
and for encoders the cosine similarity of the mean-pooled final hidden state to the unablated one
(:func:`pooled_cosine`).

On that footing:

- :func:`ablated` silences heads inside a ``with`` block (notebooks); :class:`Sweeper` evaluates the
  metric under many head sets at once (its :class:`HeadSets` language; edge codes are the other);
- :func:`exact_sweep` ablates every head alone. Its replay runs the clean pass once, caching the
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
:func:`ablated`), :mod:`~interp.ablation.metrics`, :mod:`~interp.ablation.replay` (the replay and :class:`Sweeper`,
the one executor), :mod:`~interp.ablation.head_sets` (the head sets' language), :mod:`~interp.ablation.calls`
(recorded block calls), :mod:`~interp.ablation.sweep` (exact sweeps),
:mod:`~interp.ablation.gradient`, :mod:`~interp.ablation.pruning` (computing curves),
:mod:`~interp.ablation.curves` (the :class:`PruningCurves` result), :mod:`~interp.ablation.gates`
and :mod:`~interp.ablation.settings` (names checked, run settings merged).

Names a user chooses are registered once (:mod:`interp.registry`): :data:`METHODS` (the four
analyses below, by name), :data:`METRICS`,
:data:`ABLATIONS`, :data:`ORDERS`, :data:`GATE_UNITS` (gradient importance's ``per=``) and
:data:`REPLAYS` (the sweep's ``replay=``: auto, fast or loop; "engine" means pattern/stream only).
Each public analysis has a model-free check of its options, ``validate_<name>(...)``, which it calls
first and a command line can call before loading a model. Run settings (seed, minibatch, progress, the bootstrap)
come as ``config=RunConfig(...)`` only. The replay's exact shortcuts are module surgery, so they live
with the model adapters (:mod:`interp.adapters.surgery`).
"""

from interp.ablation.curves import PruningCurves, heads_prunable
from interp.ablation.gates import GateSweep, largest_lambda_within, train_gates, validate_train_gates
from interp.ablation.gradient import GATE_UNITS, gradient_importance, validate_gradient_importance
from interp.ablation.head_sets import HeadSets
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
)
from interp.ablation.modes import (
    ABLATIONS,
    HeadAblation,
    MeanAblation,
    PatchAblation,
    ResampleAblation,
    WindowAblation,
    ZeroAblation,
    ablated,
    as_ablation,
    head_labels,
    head_mask,
)
from interp.ablation.pruning import (
    ORDERS,
    pruning_curve,
    pruning_curves,
    validate_pruning_curve,
    validate_pruning_curves,
)
from interp.ablation.replay import REPLAYS, Sweeper
from interp.ablation.sweep import exact_sweep, loop_sweep, validate_exact_sweep
from interp.errors import AblationError, MetricError
from interp.registry import Registry

# the analyses of which heads matter, by name (each its function)
METHODS: Registry = Registry("ablation method")
METHODS.add(
    "exact", "ablate every head alone (the fast replay) and rank heads by how much the metric worsens", exact_sweep
)
METHODS.add("gradient", "Michel et al.'s gradient importance, one forward and backward per batch", gradient_importance)
METHODS.add(
    "prune",
    "pruning curves in increasing order of importance, and how many heads can go within a tolerance",
    pruning_curves,
)
METHODS.add("gates", "Voita et al.'s Hard-Concrete gates for a sweep of lambda", train_gates)

__all__ = [
    "ABLATIONS",
    "GATE_UNITS",
    "METHODS",
    "METRICS",
    "ORDERS",
    "REPLAYS",
    "AblationError",
    "GateSweep",
    "HeadAblation",
    "HeadSets",
    "MeanAblation",
    "Metric",
    "MetricError",
    "PatchAblation",
    "PruningCurves",
    "ResampleAblation",
    "Sweeper",
    "WindowAblation",
    "ZeroAblation",
    "ablated",
    "as_ablation",
    "as_metric",
    "builtin_metric",
    "exact_sweep",
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
    "pruning_curve",
    "pruning_curves",
    "train_gates",
    "validate_exact_sweep",
    "validate_gradient_importance",
    "validate_pruning_curve",
    "validate_pruning_curves",
    "validate_train_gates",
]
