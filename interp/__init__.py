"""interp: what does each attention head of a model do, and which heads matter?

The public surface, each a plain library call that the CLIs wrap:

- :func:`interp.models.load_model` -- a hooked model from an HF name, a local directory or ``"toy"``
- :func:`interp.probes.repeated_tokens` -- seeded repeated-random-token probes
- :func:`interp.heads.head_scores` -- previous-token / duplicate-token / induction / copying scores
- :class:`interp.scores.HeadScores` -- the tidy result table (grid view, ranking, save/load)
- :mod:`interp.plots` -- plotly heatmaps and curves
"""

__version__ = "0.1.0"
