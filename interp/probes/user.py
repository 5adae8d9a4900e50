"""Probes from the user's own token ids and texts (:meth:`TokenProbe.from_tokens`, :meth:`TokenProbe.from_texts`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from interp.adapters import HookedModel, is_toy
from interp.errors import UsageError
from interp.models import describe
from interp.probes.draw import (
    check_fits,
    check_positive,
    drop_given_prefix,
    frame_tokens,
    framed_probe,
    ordinary_vocab,
)
from interp.probes.probe import TokenProbe, builds
from interp.texts import byte_ids


def text_ids(model: HookedModel, text: str) -> list[int]:
    """A text's token ids: the model's tokenizer's (no special tokens added), or, for a model without
    one (the toy), its UTF-8 bytes, byte ``b`` -> the ``(b mod n)``-th of the ``n`` ordinary ids
    (:func:`interp.texts.byte_ids`; one token a byte). Every text a user gives is read so."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return byte_ids(text.encode("utf-8"), ordinary_vocab(describe(model))).tolist()


def tokenization(model: HookedModel) -> str:
    """How :func:`text_ids` reads text on ``model``, as the probes record it in ``meta``."""
    if getattr(model, "tokenizer", None) is not None:
        return "tokenizer"
    return f"utf-8 bytes mod {len(ordinary_vocab(describe(model)))} ordinary ids"


FRAMED_HINT = "pass framed=True if the ids carry all of the model's framing"


@builds("from_tokens")
def probe_from_tokens(
    model: HookedModel,
    tokens: Any,
    *,
    framed: bool = False,
    attention_mask: Any = None,
    meta: dict[str, Any] | None = None,
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
    record = {"kind": "tokens", "batch": ids.shape[0], "seq_len": ids.shape[1], **(meta or {})}
    rows, side = _mask_rows(ids, attention_mask) if attention_mask is not None else (ids.tolist(), "right")
    if not framed:
        return _body_probe(model, rows, side, record, "sequence", FRAMED_HINT)
    if len({len(r) for r in rows}) > 1:
        return padded_probe(model, rows, side, framed=True, meta=record)
    ids = torch.tensor(rows, dtype=torch.long)  # every row whole: no padding at all
    prefix, suffix, names = frame_tokens(info)
    n_pre, n_suf = len(prefix), len(suffix)
    starts_framed = not prefix or bool((ids[:, :n_pre] == torch.tensor(prefix)).all())
    ends_framed = not suffix or bool((ids[:, ids.shape[1] - n_suf :] == torch.tensor(suffix)).all())
    if not starts_framed or not ends_framed or ids.shape[1] <= n_pre + n_suf:
        raise UsageError(
            f"framed=True, but the sequences are not framed as this model expects "
            f"({' ... '.join(names)}): pass framed=False to have the framing added"
        )
    return _framed_rows(info, ids[:, n_pre : ids.shape[1] - n_suf], record)


def _body_probe(
    model: HookedModel, rows: list[list[int]], padding: str, record: dict[str, Any], what: str, hint: str | None = None
) -> TokenProbe:
    """Rows of body ids framed for the model (a row that already starts with its BOS gets no second
    one: :func:`drop_given_prefix`), padded when their lengths differ."""
    rows = drop_given_prefix(describe(model), rows, what, hint)
    if len({len(r) for r in rows}) > 1:
        return padded_probe(model, rows, padding, meta=record)
    return _framed_rows(describe(model), torch.tensor(rows, dtype=torch.long), record)


def _framed_rows(info: Any, ids: Tensor, record: dict[str, Any]) -> TokenProbe:
    n = ids.shape[1]
    check_fits(info, n, str(n), lambda room: f"the longest body is {room}; pass shorter sequences")
    return framed_probe(info, ids, meta={**record, "batch": ids.shape[0], "seq_len": n})


@builds("from_texts")
def probe_from_texts(
    model: HookedModel, texts: str | Sequence[str], *, seq_len: int | None = None, padding: str = "right"
) -> TokenProbe:
    """:meth:`TokenProbe.from_texts`: each text read by :func:`text_ids` (the model's tokenizer; a
    model without one, the toy, reads each text as its UTF-8 bytes, one token a byte)."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise UsageError("texts must be a string or a non-empty list of strings")
    if padding not in PADDINGS:
        raise UsageError(f"padding must be 'right' or 'left', got {padding!r}")
    if seq_len is not None:
        check_positive(seq_len=seq_len)
    rows = [text_ids(model, t) for t in texts]
    lengths = [len(r) for r in rows]
    empty = [i for i, n in enumerate(lengths) if n == 0]
    if empty:
        raise UsageError(f"text {empty[0]} has no tokens: drop it, or give it some text")
    if seq_len is not None:
        rows = [r[:seq_len] for r in rows]
    record = {"kind": "texts", "tokenization": tokenization(model), "text_tokens": lengths}
    return _body_probe(model, rows, padding, record, "text")


PADDINGS = ("right", "left")


def pad_token_id(model: HookedModel) -> int | None:
    """The id padded positions hold: the tokenizer's pad token, or the config's; the toy (no
    tokenizer, no pad token, and never reads a padded position) pads with id 0."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        return getattr(tokenizer, "pad_token_id", None)
    pad = getattr(getattr(model, "cfg", None), "pad_token_id", None)
    if pad is None and is_toy(model):
        return 0
    return pad


def _no_pad_message(info: Any) -> str:
    return (
        f"texts of different lengths need padding, but {info.name} has no pad token: set one "
        "(model.tokenizer.pad_token = model.tokenizer.eos_token; any id works, padded positions are "
        "never read), or pass seq_len= no longer than the shortest text to cut every text to one length"
    )


def padded_probe(
    model: HookedModel, rows: list[list[int]], padding: str, *, framed: bool = False, meta: dict[str, Any]
) -> TokenProbe:
    """Frame each row of body ids (``framed=True``: check and keep its framing), pad the rows to one
    length on the side ``padding`` names, and carry the attention mask."""
    if padding not in PADDINGS:
        raise UsageError(f"padding must be 'right' or 'left', got {padding!r}")
    info = describe(model)
    pad = pad_token_id(model)
    if pad is None:
        raise UsageError(_no_pad_message(info))
    prefix, suffix, names = frame_tokens(info)
    framed_rows = []
    for i, row in enumerate(rows):
        if not row:
            raise UsageError(f"row {i} is all padding (no real token): drop it, or give it at least one token")
        if framed:
            n_pre, n_suf = len(prefix), len(suffix)
            ok = row[:n_pre] == prefix and (not n_suf or row[len(row) - n_suf :] == suffix) and len(row) > n_pre + n_suf
            if not ok:
                raise UsageError(
                    f"framed=True, but row {i}'s real tokens are not framed as this model expects "
                    f"({' ... '.join(names)}): pass framed=False to have the framing added"
                )
            framed_rows.append(list(row))
        else:
            framed_rows.append([*prefix, *row, *suffix])
    n_body = max(len(r) for r in framed_rows) - len(prefix) - len(suffix)
    check_fits(info, n_body, str(n_body), lambda room: f"the longest body is {room}; pass shorter texts or seq_len=")
    T = max(len(r) for r in framed_rows)
    tokens = torch.full((len(rows), T), int(pad), dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, r in enumerate(framed_rows):
        where = slice(0, len(r)) if padding == "right" else slice(T - len(r), T)
        tokens[i, where] = torch.tensor(r, dtype=torch.long)
        mask[i, where] = True
    record = {**meta, "padding": padding, "pad_token_id": int(pad), "lengths": [len(r) for r in framed_rows]}
    return TokenProbe(
        tokens=tokens.to(info.device),
        body_start=len(prefix),
        body_end=T - len(suffix),
        causal=info.is_causal,
        special_token_ids=info.special_token_ids,
        meta={"kind": record.get("kind"), "framing": names, **record},
        attention_mask=mask.to(info.device),
    )


def _mask_rows(ids: Tensor, attention_mask: Any) -> tuple[list[list[int]], str]:
    """Each row's real ids under ``attention_mask``, and the side the rows are padded on."""
    mask = torch.as_tensor(attention_mask)
    if tuple(mask.shape) != tuple(ids.shape):
        raise UsageError(
            f"attention_mask has shape {tuple(mask.shape)}, the tokens {tuple(ids.shape)}: give one mask per token"
        )
    if mask.dtype.is_floating_point and not bool(((mask == 0) | (mask == 1)).all()):
        raise UsageError("attention_mask must hold 0 (padding) and 1 (real token) only")
    mask = mask.bool().cpu()
    empty = (~mask.any(-1)).nonzero().squeeze(-1).tolist()
    if empty:
        raise UsageError(f"row {empty[0]} of the attention mask is all padding (no real token): drop it")
    T = mask.shape[1]
    first = mask.long().argmax(-1)
    length = mask.sum(-1)
    pos = torch.arange(T)
    block = (pos[None] >= first[:, None]) & (pos[None] < (first + length)[:, None])
    if not bool((block == mask).all()):
        bad = int((block != mask).any(-1).nonzero()[0])
        raise UsageError(f"row {bad} of the attention mask has padding between real tokens: pad each row on one side")
    right = bool((first == 0).all())
    left = bool((first + length == T).all())
    if not (right or left):
        raise UsageError(
            "the attention mask pads some rows on the left and others on the right: pad every row on one side"
        )
    rows = [ids[i, mask[i]].tolist() for i in range(ids.shape[0])]
    return rows, "right" if right else "left"
