"""Heads over training: every head score and the in-context learning score at each checkpoint.

    import interp
    sweep = interp.checkpoint_scores("runs/step*")                       # checkpoint folders
    sweep = interp.checkpoint_scores(model="EleutherAI/pythia-70m",      # Hugging Face revisions
                                     revisions="0:143000:10000")
    sweep.table          # a row per (revision, layer, head): every score with its CI
    sweep.revisions      # a row per revision: step, weights fingerprint, duplicate_of, icl score
    sweep.handoffs()     # where a role's top head changes; sweep.phase_change(): the window
    sweep.figure()       # scores against step, with the in-context score on the same axis
    sweep.save_page(".")  # checkpoints_atlas.html: the figure, roles over time, every head per revision

``python -m interp.checkpoints`` / ``interp checkpoints`` runs it from the command line; its
``--model toy-training`` trains the toy from scratch and sweeps its checkpoints (offline).

Modules: :mod:`~interp.checkpoints.sources` (revisions), :mod:`~interp.checkpoints.sweep` (the
journaled loop), :mod:`~interp.checkpoints.icl` (Olsson's in-context score),
:mod:`~interp.checkpoints.roles` (roles over time, the phase change),
:mod:`~interp.checkpoints.result` (:class:`CheckpointScores`), :mod:`~interp.checkpoints.page` (the
page over revisions, ``sweep.save_page(dir)``), :mod:`~interp.checkpoints.hub` (disk checks and
eviction), :mod:`~interp.checkpoints.toy` (the toy trained with checkpoints).
"""

from __future__ import annotations

from interp.checkpoints.icl import ICL_DATA, ICLScore, icl_positions, icl_score
from interp.checkpoints.result import CheckpointScores
from interp.checkpoints.sources import Revision, hub_revisions, local_revisions, parse_revisions
from interp.checkpoints.sweep import IclSizes, SweepOut, checkpoint_scores, sweep_sizes, weights_fingerprint
from interp.checkpoints.toy import ToyTraining, train_checkpoints

__all__ = [
    "ICL_DATA",
    "CheckpointScores",
    "ICLScore",
    "IclSizes",
    "Revision",
    "SweepOut",
    "ToyTraining",
    "checkpoint_scores",
    "hub_revisions",
    "icl_positions",
    "icl_score",
    "local_revisions",
    "parse_revisions",
    "sweep_sizes",
    "train_checkpoints",
    "weights_fingerprint",
]
