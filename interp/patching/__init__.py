"""Which heads matter for a task: activation patching on pairs of prompts.

A task (:class:`~interp.probes.task.TaskProbe`) is pairs of a clean and a corrupted prompt that
differ in one fact, and the answers a metric compares. :func:`patch_heads` patches each head's
output (``hook_z``) from one prompt of every pair into the other, per head (all positions) or per
head x position, in either direction (``denoise``: run corrupted, patch in clean; ``noise``: the
reverse), and says what fraction of the clean-corrupted gap each patch moves. It runs on the
ablation sweep's exact batched replay (:class:`~interp.ablation.replay.Sweeper` with the ``patch``
ablation kind), journaled; the result is a :class:`PatchScores`.

Modules: :mod:`~interp.patching.metrics` (:data:`METRICS`), :mod:`~interp.patching.exact`
(:func:`patch_heads`, :data:`BY`), :mod:`~interp.patching.result` (:class:`PatchScores`).
"""

from interp.patching.exact import BY, baselines, patch_heads
from interp.patching.metrics import METRICS, task_metric
from interp.patching.result import PatchScores

__all__ = ["BY", "METRICS", "PatchScores", "baselines", "patch_heads", "task_metric"]
