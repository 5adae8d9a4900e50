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
``data/text/`` or a Hub data set), framed the same way; it has no repeat structure. Your own
prompts or token ids become a probe with :meth:`TokenProbe.from_texts` / :meth:`TokenProbe.from_tokens`
(also :func:`probe_from_texts` / :func:`probe_from_tokens`).

Modules, lowest first: ``probe`` (the :class:`TokenProbe` data and its masks), ``draw`` (the
model's framing, the built-in random draws), ``text`` and ``user`` (text data sets; your own texts
and ids).
"""

import warnings
from collections.abc import Callable
from typing import Any

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
from interp.probes.user import probe_from_texts, probe_from_tokens
from interp.registry import Registry
from interp.texts import BYTES_NOTE

# the probes a command chooses by name (its --probe), each the function that draws it
PROBES: Registry[Callable[..., TokenProbe]] = Registry("probe")
PROBES.add("random", "random tokens (Gu et al.)", random_tokens)
PROBES.add("repeated", "repeated random tokens", repeated_tokens)
PROBES.add("text", f"natural text ({BYTES_NOTE})", text_probe)

__all__ = [
    "PROBES",
    "TokenProbe",
    "draws_distinct",
    "frame_tokens",
    "framed_probe",
    "ordinary_vocab",
    "probe_from_texts",
    "probe_from_tokens",
    "random_tokens",
    "repeated_tokens",
    "text_probe",
]

# old spellings: ``texts_probe`` was one letter from ``text_probe`` (which reads a text data set)
_RENAMED = {"texts_probe": "probe_from_texts", "tokens_probe": "probe_from_tokens"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"interp.probes.{name} is renamed {new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module 'interp.probes' has no attribute {name!r}")
