"""Which heads matter for a task: activation patching on pairs of prompts.

A task (:class:`~interp.probes.task.TaskProbe`) is pairs of a clean and a corrupted prompt that
differ in one fact, and the answers a metric compares. :func:`patch_heads` patches each head's
output (``hook_z``) from one prompt of every pair into the other, per head (all positions) or per
head x position, in either direction (``denoise``: run corrupted, patch in clean; ``noise``: the
reverse), and says what fraction of the clean-corrupted gap each patch moves: exactly (the
ablation sweep's batched replay with the ``patch`` ablation kind, journaled) or by attribution
patching, EAP-IG and edge attribution's other methods (a few forwards and backwards on the one
gradient path that edge attribution reads too, :class:`~interp.patching.attribution.Passes`). The result is a :class:`PatchScores`;
:func:`agreement` compares an approximate ranking with the exact one. :func:`path_patch` (Wang et
al.'s exact path patching, sender x receiver) and :func:`faithfulness_curves` (the top ``n`` heads of
a ranking alone) sit beside it.

Each entry point ``foo`` has a model-free ``validate_foo`` (the checks it makes first, which a
command makes before it loads the model); every choice is a registry (:data:`METHODS`,
:data:`METRICS`, :data:`BY`, :data:`DIRECTIONS`, :data:`PATH_SITES`, :data:`FAITHFUL_TO`).

Modules: :mod:`~interp.patching.metrics` (:data:`METRICS`), :mod:`~interp.patching.core` (the run
set up, the result pooled: :data:`BY`), :mod:`~interp.patching.exact`,
:mod:`~interp.patching.attribution`, :mod:`~interp.patching.heads` (:func:`patch_heads`,
:data:`METHODS`), :mod:`~interp.patching.result` (:class:`PatchScores`).
"""

from interp.patching.core import BY, baselines, validate_setup
from interp.patching.faithfulness import (
    FAITHFUL_TO,
    FaithfulnessCurves,
    faithfulness_curves,
    validate_faithfulness_curves,
)
from interp.patching.heads import METHODS, agreement, patch_heads, validate_patch_heads
from interp.patching.metrics import METRICS, task_metric
from interp.patching.paths import PATH_SITES, PathScores, path_patch, validate_path_patch
from interp.patching.result import PatchScores
from interp.probes.task import DIRECTIONS

__all__ = [
    "BY",
    "DIRECTIONS",
    "FAITHFUL_TO",
    "FaithfulnessCurves",
    "METHODS",
    "METRICS",
    "PATH_SITES",
    "PatchScores",
    "PathScores",
    "agreement",
    "baselines",
    "faithfulness_curves",
    "patch_heads",
    "path_patch",
    "task_metric",
    "validate_faithfulness_curves",
    "validate_patch_heads",
    "validate_path_patch",
    "validate_setup",
]
