"""What heads write and read: composition between heads and their OV circuit roles (weights only),
encoder-head and entropy scores (patterns), and direct logit attribution (one clean run).

- :mod:`interp.roles.composition`: Q-, K- and V-composition of every pair of heads, with a
  random-matrix baseline and z-score;
- :mod:`interp.roles.ov`: OV circuit roles from weights (copy suppression, successor heads), each
  registered in :data:`~interp.roles.ov.OV_SCORES` with its chance level;
- :mod:`interp.roles.encoder`: Clark et al.'s encoder-head scores (attention on [CLS], [SEP],
  punctuation, previous/own/next token), entropy, Voita et al.'s positional and rare-word heads,
  and a Jensen-Shannon map of heads;
- :mod:`interp.roles.logit`: direct logit attribution per head and per head x position, through
  the final norm with its scale frozen, the parts adding up to the model's logit difference;
- :mod:`interp.roles.qk`: QK attribution, each head's score split exactly into (query component,
  key component) pairs at a probe's targets, with CIs (:mod:`interp.roles.qk_parts` splits them);
- :mod:`interp.roles.card`: one head's card (scores, the tokens it writes and suppresses, its
  strongest compositions in and out, a pattern thumbnail) as plain data, for a page to show.
"""

from __future__ import annotations

from interp.roles.card import head_card
from interp.roles.composition import KINDS, Compositions, composition_scores
from interp.roles.encoder import ENCODER_SCORES, HeadMap, encoder_scores, head_map
from interp.roles.logit import LogitAttribution, logit_attribution
from interp.roles.ov import OV_SCORES, ov_scores
from interp.roles.qk import QKAttribution, qk_attribution

__all__ = [
    "ENCODER_SCORES",
    "KINDS",
    "OV_SCORES",
    "Compositions",
    "HeadMap",
    "LogitAttribution",
    "composition_scores",
    "encoder_scores",
    "head_card",
    "head_map",
    "logit_attribution",
    "ov_scores",
    "QKAttribution",
    "qk_attribution",
]
