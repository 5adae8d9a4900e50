"""What heads write and read: composition between heads and their OV circuit roles (weights only),
encoder-head and entropy scores (patterns), and direct logit attribution (one clean run).

- :mod:`interp.circuits.composition`: Q-, K- and V-composition of every pair of heads, with a
  random-matrix baseline and z-score;
- :mod:`interp.circuits.ov`: OV circuit roles from weights (copy suppression, successor heads), each
  registered in :data:`~interp.circuits.ov.OV_SCORES` with its chance level;
"""

from __future__ import annotations

from interp.circuits.composition import KINDS, Compositions, composition_scores
from interp.circuits.ov import OV_SCORES, ov_scores

__all__ = ["KINDS", "OV_SCORES", "Compositions", "composition_scores", "ov_scores"]
