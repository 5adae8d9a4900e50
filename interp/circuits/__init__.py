"""What heads write and read: composition between heads and their OV circuit roles (weights only),
encoder-head and entropy scores (patterns), and direct logit attribution (one clean run).

- :mod:`interp.circuits.composition`: Q-, K- and V-composition of every pair of heads, with a
  random-matrix baseline and z-score;
"""

from __future__ import annotations

from interp.circuits.composition import KINDS, Compositions, composition_scores

__all__ = ["KINDS", "Compositions", "composition_scores"]
