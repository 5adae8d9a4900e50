"""Retrieval heads (Wu et al. 2024), streaming heads (sink + recent window) and copy distance.

- :mod:`interp.retrieval.scores`: the definitions and both engines (:func:`retrieval_scores`,
  :func:`copy_distance_scores`, the counts behind them);
- :mod:`interp.retrieval.figures`: the retrieval heatmap and the copy-distance curves.

``python -m interp.retrieval`` (``interp retrieval``) is the command (:mod:`interp.cli.retrieval`).
"""

from interp.retrieval.scores import (
    DEFAULT_SINK,
    RETRIEVAL_THRESHOLD,
    ROLES,
    STREAMING_THRESHOLD,
    RetrievalCounts,
    classify,
    copy_distance_scores,
    copy_step_stats,
    default_window,
    needle_copy_loss,
    retrieval_counts,
    retrieval_scores,
    stream_window_share,
    validate_retrieval_scores,
    window_share,
)

__all__ = [
    "DEFAULT_SINK",
    "RETRIEVAL_THRESHOLD",
    "ROLES",
    "STREAMING_THRESHOLD",
    "RetrievalCounts",
    "classify",
    "copy_distance_scores",
    "copy_step_stats",
    "default_window",
    "needle_copy_loss",
    "retrieval_counts",
    "retrieval_scores",
    "stream_window_share",
    "validate_retrieval_scores",
    "window_share",
]
