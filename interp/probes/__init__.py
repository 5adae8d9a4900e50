"""Token probes: seeded repeated-random-token batches that know where their structure lies.

A repeated-token probe is ``[frame] b_1 ... b_n  b_1 ... b_n  ...  [frame]``: a block of ``n``
random tokens drawn from the model's ordinary vocabulary (special tokens excluded), repeated
``n_repeats`` times, framed as the model expects (a BOS for decoders that want one, [CLS] ... [SEP]
for encoders). Within a block tokens are drawn without replacement when the vocabulary allows, so
the only duplicates are the planted repeats and every score has a clean known answer.

The probe knows, for every query position ``q``:

- its previous token ``q - 1``;
- its *duplicates*: other positions holding the same token (earlier ones only, for causal models);
- its *induction targets*: positions ``k`` right after an earlier occurrence of the current token
  (``tokens[k - 1] == tokens[q]``, ``k - 1 < q``); for encoders any other occurrence counts.

These are returned as boolean masks that analyses reduce attention patterns against.

A *text probe* (:func:`text_probe`) is seeded windows of natural English text (the bundled
``data/text/`` or a Hub data set), framed the same way; it has no repeat structure.
"""

from interp.probes.draw import (
    draws_distinct,
    frame_tokens,
    framed_probe,
    ordinary_vocab,
    random_tokens,
    repeated_tokens,
)
from interp.probes.probe import TokenProbe
from interp.probes.text import text_probe
from interp.probes.user import texts_probe, tokens_probe

__all__ = [
    "TokenProbe",
    "draws_distinct",
    "frame_tokens",
    "framed_probe",
    "ordinary_vocab",
    "random_tokens",
    "repeated_tokens",
    "text_probe",
    "texts_probe",
    "tokens_probe",
]
