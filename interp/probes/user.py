"""Probes from the user's own token ids and texts (:meth:`TokenProbe.from_tokens`, :meth:`TokenProbe.from_texts`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from interp.errors import UsageError
from interp.models import describe
from interp.probes.draw import check_fits, check_positive, frame_tokens, framed_probe, ordinary_vocab
from interp.probes.probe import TokenProbe, builds


@builds("from_tokens")
def probe_from_tokens(
    model: Any, tokens: Any, *, framed: bool = False, meta: dict[str, Any] | None = None
) -> TokenProbe:
    """:meth:`TokenProbe.from_tokens`; ``meta`` adds to the probe's record."""
    info = describe(model)
    ids = torch.as_tensor(tokens)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise UsageError(f"tokens must be integer token ids, got dtype {ids.dtype}")
    ids = ids.long().cpu()
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.numel() == 0:
        raise UsageError(f"tokens must be [batch, pos] (or [pos]) token ids, got shape {tuple(ids.shape)}")
    bad = ids[(ids < 0) | (ids >= info.d_vocab)]
    if len(bad):
        raise UsageError(f"token id {int(bad[0])} is outside the model's vocabulary of {info.d_vocab}")
    prefix, suffix, names = frame_tokens(info)
    starts_framed = (
        bool(prefix) and ids.shape[1] > len(prefix) and bool((ids[:, : len(prefix)] == torch.tensor(prefix)).all())
    )
    if framed:
        n_pre, n_suf = len(prefix), len(suffix)
        ends_framed = not suffix or bool((ids[:, ids.shape[1] - n_suf :] == torch.tensor(suffix)).all())
        if (prefix and not starts_framed) or not ends_framed or ids.shape[1] <= n_pre + n_suf:
            raise UsageError(
                f"framed=True, but the sequences are not framed as this model expects "
                f"({' ... '.join(names)}): pass framed=False to have the framing added"
            )
        ids = ids[:, n_pre : ids.shape[1] - n_suf]
    elif starts_framed:
        warnings.warn(
            f"every sequence already starts with the model's {names[0]}; it is added again: pass "
            "framed=True if the ids carry the framing",
            stacklevel=3,
        )
    n = ids.shape[1]
    check_fits(info, n, str(n), lambda room: f"the longest body is {room}; pass shorter sequences")
    record = {"kind": "tokens", "batch": ids.shape[0], "seq_len": n, **(meta or {})}
    return framed_probe(info, ids, meta=record)


@builds("from_texts")
def probe_from_texts(model: Any, texts: str | Sequence[str], *, seq_len: int | None = None) -> TokenProbe:
    """:meth:`TokenProbe.from_texts`."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise UsageError("texts must be a string or a non-empty list of strings")
    if seq_len is not None:
        check_positive(seq_len=seq_len)
    info = describe(model)
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        rows = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        how = "tokenizer"
    else:
        vocab = ordinary_vocab(info)
        rows = [vocab[torch.tensor(list(t.encode("utf-8")), dtype=torch.long) % len(vocab)].tolist() for t in texts]
        how = f"utf-8 bytes mod {len(vocab)} ordinary ids"
    lengths = [len(r) for r in rows]
    n = seq_len or min(lengths)
    short = [i for i, length in enumerate(lengths) if length < max(n, 1)]
    if short:
        i = short[0]
        raise UsageError(
            f"text {i} has {lengths[i]} tokens, fewer than seq_len={n}: pass longer texts or a smaller seq_len"
        )
    if seq_len is None and max(lengths) > n:
        warnings.warn(
            f"the texts have {n} to {max(lengths)} tokens; each is cut to the shortest ({n}): "
            "pass seq_len= to choose the length",
            stacklevel=3,
        )
    body = torch.tensor([r[:n] for r in rows], dtype=torch.long)
    return probe_from_tokens(model, body, meta={"kind": "texts", "tokenization": how, "text_tokens": lengths})
