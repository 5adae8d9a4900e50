"""Which heads matter for a task: activation patching on pairs of prompts.

A task (:class:`~interp.probes.task.TaskProbe`) is pairs of a clean and a corrupted prompt that
differ in one fact, and the answers a metric compares. :func:`patch_heads` patches each head's
output (``hook_z``) from one prompt of every pair into the other, per head (all positions) or per
head x position, in either direction (``denoise``: run corrupted, patch in clean; ``noise``: the
reverse), and says what fraction of the clean-corrupted gap each patch moves: exactly (the
ablation sweep's batched replay with the ``patch`` ablation kind, journaled) or by attribution
patching and EAP-IG (a few forwards and backwards). The result is a :class:`PatchScores`;
:func:`agreement` compares an approximate ranking with the exact one. :func:`path_patch` (Wang et
al.'s exact path patching, sender x receiver) and :func:`faithfulness_curves` (the top ``n`` heads of
a ranking alone) sit beside it.

Modules: :mod:`~interp.patching.metrics` (:data:`METRICS`), :mod:`~interp.patching.core` (the run
set up, the result pooled: :data:`BY`), :mod:`~interp.patching.exact`,
:mod:`~interp.patching.attribution`, :mod:`~interp.patching.heads` (:func:`patch_heads`,
:data:`METHODS`), :mod:`~interp.patching.result` (:class:`PatchScores`).
"""

from interp.patching.core import BY, DIRECTION_HELP, baselines
from interp.patching.faithfulness import FaithfulnessCurves, faithfulness_curves
from interp.patching.heads import METHODS, agreement, patch_heads
from interp.patching.metrics import METRICS, task_metric
from interp.patching.paths import PathScores, path_patch
from interp.patching.result import PatchScores

__all__ = [
    "BY",
    "DIRECTION_HELP",
    "FaithfulnessCurves",
    "METHODS",
    "METRICS",
    "PatchScores",
    "PathScores",
    "agreement",
    "baselines",
    "faithfulness_curves",
    "patch_heads",
    "path_patch",
    "task_metric",
]
