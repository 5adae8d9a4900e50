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

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp.errors import UsageError
from interp.models import ModelInfo, describe
from interp.texts import bytes_to_ids, text_rows, tokenize_rows


@dataclass
class TokenProbe:
    """A batch of token sequences plus where their body (non-framing tokens) lies."""

    tokens: Int[Tensor, "batch pos"]
    body_start: int  # first position after the framing prefix (BOS / [CLS])
    body_end: int  # one past the last body position (a trailing [SEP] sits at body_end)
    causal: bool
    special_token_ids: frozenset[int] = frozenset()
    block_len: int | None = None
    n_repeats: int | None = None
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def to(self, device: torch.device | str) -> TokenProbe:
        self.tokens = self.tokens.to(device)
        return self

    def select(self, rows: Sequence[int] | Tensor) -> TokenProbe:
        """The same probe restricted to the sequences ``rows`` (in that order)."""
        index = torch.as_tensor(list(rows) if not isinstance(rows, Tensor) else rows, dtype=torch.long)
        return replace(self, tokens=self.tokens[index.to(self.tokens.device)], meta=dict(self.meta))

    @classmethod
    def from_tokens(cls, model: Any, tokens: Any, *, framed: bool = False) -> TokenProbe:
        """Your own token ids as a probe: ``[batch, pos]``, or one ``[pos]`` sequence.

        The ids are the body, and the model's framing is added around them as for every built-in
        probe (a BOS for decoders that expect one, ``[CLS] ... [SEP]`` for encoders). Ids that
        already carry it (``model.to_tokens(text)`` prepends a BOS) take ``framed=True``: the framing
        is then checked, not added. Scores read the duplicate and induction targets from the ids.
        """
        return tokens_probe(model, tokens, framed=framed)

    @classmethod
    def from_texts(cls, model: Any, texts: str | Sequence[str], *, seq_len: int | None = None) -> TokenProbe:
        """Your own prompts as a probe: each text tokenized (no special tokens), framed for the model.

        Sequences in a batch share one length: every text is cut to ``seq_len`` tokens, by default
        the shortest text's length (with a warning when that cuts others). A model without a
        tokenizer (the toy) reads UTF-8 bytes mapped onto its ordinary vocabulary, as
        :func:`text_probe` does.
        """
        return texts_probe(model, texts, seq_len=seq_len)

    # ---- structural masks -------------------------------------------------------------------

    def _body(self) -> Bool[Tensor, " pos"]:
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        return (pos >= self.body_start) & (pos < self.body_end)

    def _ordinary(self) -> Bool[Tensor, "batch pos"]:
        ordinary = torch.ones_like(self.tokens, dtype=torch.bool)
        for t in self.special_token_ids:
            ordinary &= self.tokens != t
        return ordinary & self._body()

    def prev_query_mask(self) -> Bool[Tensor, "batch pos"]:
        """Queries that have a previous token: every body position (position 0 never)."""
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        return (self._body() & (pos >= 1)).expand(self.batch, -1)

    def duplicate_mask(self) -> Bool[Tensor, "batch q k"]:
        """``[b, q, k]`` is True when ``k != q`` holds the same ordinary token (``k < q`` if causal)."""
        ordinary = self._ordinary()
        same = self.tokens[:, :, None] == self.tokens[:, None, :]
        same &= ordinary[:, :, None] & ordinary[:, None, :]
        n = self.seq_len
        allowed = torch.ones(n, n, dtype=torch.bool, device=self.tokens.device)
        allowed = (
            torch.tril(allowed, diagonal=-1)
            if self.causal
            else allowed & ~torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        )
        return same & allowed

    def induction_mask(self) -> Bool[Tensor, "batch q k"]:
        """``[b, q, k]`` is True when ``k - 1`` is another occurrence of the token at ``q``.

        Equivalently the duplicate mask shifted one key to the right: the head should attend to
        the token that *followed* the earlier occurrence, which is what it will predict.
        """
        dup = self.duplicate_mask()
        target = torch.zeros_like(dup)
        target[:, :, 1:] = dup[:, :, :-1]
        target &= self._ordinary()[:, None, :]  # the target itself must be a body token
        return target

    # ---- the same targets as (batch, q, k) index rows: no [q, k] mask, for long probes ---------

    def duplicate_pairs(self) -> Int[Tensor, "n 3"]:
        """The True entries of :meth:`duplicate_mask` as ``(batch, q, k)`` rows, found by sorting.

        Memory is the number of pairs (``n_repeats - 1`` per repeated token on a probe drawn
        without replacement), never ``T x T``; exact when tokens repeat inside a block too.
        """
        ordinary = self._ordinary().cpu()
        tokens = self.tokens.cpu()
        out = [torch.zeros(0, 3, dtype=torch.long)]
        for b in range(self.batch):
            pos = ordinary[b].nonzero().squeeze(-1)
            order = torch.argsort(tokens[b, pos], stable=True)  # equal tokens: ascending positions
            pos, tok = pos[order], tokens[b, pos[order]]
            new = torch.ones_like(tok, dtype=torch.bool)
            new[1:] = tok[1:] != tok[:-1]
            starts = new.nonzero().squeeze(-1)
            lengths = torch.diff(starts, append=torch.tensor([len(tok)]))
            for r in lengths.unique().tolist():
                if r < 2:
                    continue
                members = pos[starts[lengths == r][:, None] + torch.arange(r)]  # [runs, r]
                q, k = members[:, :, None].expand(-1, r, r), members[:, None, :].expand(-1, r, r)
                keep = k < q if self.causal else k != q
                out.append(torch.stack([torch.full_like(q[keep], b), q[keep], k[keep]], -1))
        return torch.cat(out)

    def induction_pairs(self) -> Int[Tensor, "n 3"]:
        """The True entries of :meth:`induction_mask` as ``(batch, q, k)`` rows."""
        dup = self.duplicate_pairs()
        dup = dup[dup[:, 2] + 1 < self.seq_len]
        b, q, k = dup.unbind(-1)
        keep = self._ordinary().cpu()[b, k + 1]
        return torch.stack([b, q, k + 1], -1)[keep]

    def prev_pairs(self, every_query: bool = False) -> Int[Tensor, "n 3"]:
        """``(batch, q, q - 1)`` for the queries of :meth:`prev_query_mask` (every ``q >= 1`` if asked)."""
        q = torch.arange(1, self.seq_len)
        if not every_query:
            q = q[self.prev_query_mask()[0, 1:].cpu()]
        b = torch.arange(self.batch).repeat_interleave(len(q))
        q = q.repeat(self.batch)
        return torch.stack([b, q, q - 1], -1)

    def second_repeat_mask(self) -> Bool[Tensor, "batch pos"]:
        """Positions whose token already occurred earlier in the sequence (the in-context part)."""
        return self.duplicate_mask().any(-1) if self.causal else self._repeat_index() >= 1

    def _repeat_index(self) -> Int[Tensor, "batch pos"]:
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        if self.block_len is None:
            raise UsageError("this probe has no repeat structure")
        idx = torch.where(self._body(), (pos - self.body_start) // self.block_len, -1)
        return idx.expand(self.batch, -1)


def _check_positive(**kwargs: int) -> None:
    for name, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{name} must be an integer >= 1, got {value!r}")


def ordinary_vocab(info: ModelInfo, tokenizer: Any = None) -> Int[Tensor, " n"]:
    """Token ids a probe may draw: the model's vocabulary less its special tokens."""
    size = info.d_vocab
    if tokenizer is not None:
        size = min(size, len(tokenizer))
    keep = torch.ones(size, dtype=torch.bool)
    for t in info.special_token_ids:
        if 0 <= t < size:
            keep[t] = False
    return keep.nonzero().squeeze(-1)


def frame_tokens(info: ModelInfo) -> tuple[list[int], list[int], list[str]]:
    """The framing a probe body gets: ``(prefix ids, suffix ids, names)``.

    A BOS for decoders that expect one; ``[CLS] ... [SEP]`` for encoders; nothing otherwise.
    """
    if info.is_causal:
        return ([info.bos_token_id], [], ["BOS"]) if info.bos_token_id is not None else ([], [], [])
    prefix, suffix, names = [], [], []
    if info.cls_token_id is not None:
        prefix, names = [info.cls_token_id], ["[CLS]"]
    if info.sep_token_id is not None:
        suffix = [info.sep_token_id]
        names.append("[SEP]")
    return prefix, suffix, names


def repeated_tokens(
    model: Any,
    *,
    batch: int = 10,
    block_len: int = 50,
    n_repeats: int = 2,
    seed: int = 0,
) -> TokenProbe:
    """A seeded batch of ``n_repeats`` copies of ``block_len`` random tokens, framed for ``model``.

    Defaults follow ARENA (batch 10, 50 tokens repeated twice); Olsson et al. used 4 x 25.
    The same seed gives the same tokens on every device.
    """
    _check_positive(batch=batch, block_len=block_len, n_repeats=n_repeats)
    if n_repeats < 2:
        raise UsageError(f"n_repeats must be at least 2 (a block must repeat to be copied), got {n_repeats}")
    info = describe(model)
    _check_fits(
        info,
        block_len * n_repeats,
        f"{n_repeats} x {block_len}",
        lambda room: f"the longest block for {n_repeats} repeats is {room // n_repeats}; lower --seq-len or --repeats",
    )
    block = _draw_blocks(model, info, batch, block_len, seed)
    body = block.repeat(1, n_repeats)
    return framed_probe(
        info,
        body,
        seed=seed,
        block_len=block_len,
        n_repeats=n_repeats,
        meta={
            "kind": "repeated_tokens",
            "batch": batch,
            "block_len": block_len,
            "n_repeats": n_repeats,
            "seed": seed,
            "distinct_in_block": draws_distinct(model, block_len),
        },
    )


def tokens_probe(model: Any, tokens: Any, *, framed: bool = False, meta: dict[str, Any] | None = None) -> TokenProbe:
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
    _check_fits(info, n, str(n), lambda room: f"the longest body is {room}; pass shorter sequences")
    record = {"kind": "tokens", "batch": ids.shape[0], "seq_len": n, **(meta or {})}
    return framed_probe(info, ids, meta=record)


def texts_probe(model: Any, texts: str | Sequence[str], *, seq_len: int | None = None) -> TokenProbe:
    """:meth:`TokenProbe.from_texts`."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise UsageError("texts must be a string or a non-empty list of strings")
    if seq_len is not None:
        _check_positive(seq_len=seq_len)
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
    return tokens_probe(model, body, meta={"kind": "texts", "tokenization": how, "text_tokens": lengths})


def random_tokens(model: Any, *, batch: int = 16, seq_len: int = 64, seed: int = 0) -> TokenProbe:
    """Gu et al. (2024)'s sink probe: ``seq_len`` random ordinary tokens per sequence, framed.

    Tokens are drawn uniformly from the ordinary vocabulary, without replacement within a sequence
    when the vocabulary allows (so no token repeats); ``seq_len`` counts body tokens.
    """
    _check_positive(batch=batch, seq_len=seq_len)
    info = describe(model)
    _check_fits(info, seq_len, str(seq_len), lambda room: f"the longest body is {room}; lower --seq-len")
    body = _draw_blocks(model, info, batch, seq_len, seed)
    return framed_probe(
        info,
        body,
        seed=seed,
        meta={
            "kind": "random_tokens",
            "batch": batch,
            "seq_len": seq_len,
            "seed": seed,
            "distinct_in_block": draws_distinct(model, seq_len),
        },
    )


def _check_fits(info: ModelInfo, n_body: int, body: str, longest: Callable[[int], str]) -> None:
    """Raise when ``n_body`` tokens plus the framing exceed the context; ``longest(room)`` is the hint."""
    prefix, suffix, framing = frame_tokens(info)
    total = len(prefix) + n_body + len(suffix)
    if total > info.n_ctx:
        raise UsageError(
            f"probe of {total} tokens ({' + '.join(framing + [body])}) is longer than the model's "
            f"context of {info.n_ctx} tokens: {longest(info.n_ctx - len(prefix) - len(suffix))}"
        )


def draws_distinct(model: Any, n: int) -> bool:
    """Can ``n`` ordinary tokens be drawn without replacement? (A 16K-token block needs 16K of them;
    below that, tokens repeat inside a block and the target masks and pairs count those repeats too.)"""
    return len(ordinary_vocab(describe(model), getattr(model, "tokenizer", None))) >= n


def _draw_blocks(model: Any, info: ModelInfo, batch: int, n: int, seed: int) -> Int[Tensor, "batch n"]:
    """``batch`` seeded rows of ``n`` ordinary tokens, distinct within a row when the vocabulary allows."""
    vocab = ordinary_vocab(info, getattr(model, "tokenizer", None))
    if len(vocab) < 2:
        raise UsageError("the model's vocabulary has fewer than 2 ordinary tokens to draw from")
    gen = torch.Generator().manual_seed(seed)
    if len(vocab) >= n:
        picks = torch.stack([torch.randperm(len(vocab), generator=gen)[:n] for _ in range(batch)])
    else:  # tiny vocabularies: duplicates inside a block are unavoidable
        picks = torch.randint(len(vocab), (batch, n), generator=gen)
    return vocab[picks]


def framed_probe(info: ModelInfo, body: Int[Tensor, "batch n"], *, meta: dict[str, Any], **fields: Any) -> TokenProbe:
    """Wrap body tokens in the model's framing (:func:`frame_tokens`) as a :class:`TokenProbe`.

    ``meta`` gains ``"framing"`` (the framing's names); ``fields`` are further TokenProbe fields.
    """
    prefix, suffix, framing = frame_tokens(info)
    batch = body.shape[0]
    tokens = torch.cat(
        [
            torch.tensor(prefix, dtype=torch.long).expand(batch, -1),
            body.long().cpu(),
            torch.tensor(suffix, dtype=torch.long).expand(batch, -1),
        ],
        dim=1,
    ).to(info.device)
    return TokenProbe(
        tokens=tokens,
        body_start=len(prefix),
        body_end=len(prefix) + body.shape[1],
        causal=info.is_causal,
        special_token_ids=info.special_token_ids,
        meta={"kind": meta.get("kind"), "framing": framing, **meta},
        **fields,
    )


# --------------------------------------------------------------------------------------------
# natural-text probes

_MIN_TEXT_TOKENS = 50_000  # a Hub data set is tokenized up to max(this, 8 x batch x seq_len) tokens


def text_probe(
    model: Any,
    *,
    batch: int = 8,
    seq_len: int = 64,
    seed: int = 0,
    dataset: str | os.PathLike | None = None,
    split: str = "train",
    text_column: str = "text",
) -> TokenProbe:
    """``batch`` seeded windows of ``seq_len`` tokens of natural English text, framed for ``model``.

    The text is the bundled ``data/text/sentences.txt`` (self-written, see its README), read with
    ``datasets.load_dataset("text", ...)``; or ``dataset``: a local ``.txt``/``.json``/``.jsonl``/
    ``.csv`` file or folder, or a Hub data set name, optionally ``"name:config"``
    (``"wikitext:wikitext-2-raw-v1"``), of which ``split`` and ``text_column`` are used. A Hub data
    set that is neither cached nor reachable (or not cached while ``HF_HUB_OFFLINE`` is set) raises
    :class:`DatasetLoadError` (a ``ValueError``) at once, without network retries.

    Non-empty rows are joined with newlines into one stream and tokenized with the model's
    tokenizer (no special tokens added). A model without a tokenizer (the toy) gets the UTF-8 bytes
    of the text mapped deterministically onto its ordinary vocabulary: byte ``b`` becomes the
    ``(b mod n)``-th ordinary token id, ``n`` the number of ordinary ids. That keeps the text's
    statistics (frequent letters, spaces, newlines, full stops) though not its meaning.

    ``seq_len`` counts body tokens; the framing (BOS, or ``[CLS] ... [SEP]``) is added around each
    window as :func:`repeated_tokens` does. Window starts are drawn uniformly with a generator
    seeded by ``seed`` (windows may overlap). ``meta`` records ``kind="text"``, the ``source``, the
    tokenization and the window starts.
    """
    _check_positive(batch=batch, seq_len=seq_len)
    info = describe(model)
    _check_fits(info, seq_len, str(seq_len), lambda room: f"the longest window is {room}; lower --seq-len")
    rows, source = text_rows(dataset, split, text_column)
    tokenizer = getattr(model, "tokenizer", None)
    budget = max(_MIN_TEXT_TOKENS, 8 * batch * seq_len)
    if tokenizer is not None:
        stream, how = tokenize_rows(tokenizer, rows, budget), "tokenizer"
        bad = stream[(stream < 0) | (stream >= info.d_vocab)]
        if len(bad):
            raise UsageError(
                f"the tokenizer produced id {int(bad[0])}, outside the model's vocabulary "
                f"of {info.d_vocab}: model and tokenizer do not match"
            )
    else:
        vocab = ordinary_vocab(info)
        stream, how = bytes_to_ids(rows, vocab, budget), f"utf-8 bytes mod {len(vocab)} ordinary ids"
    if len(stream) < seq_len:
        raise UsageError(
            f"the text from {source} has only {len(stream)} tokens, fewer than "
            f"--seq-len {seq_len}: lower --seq-len or use a larger --dataset"
        )
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(stream) - seq_len + 1, (batch,), generator=gen)
    body = stream[starts[:, None] + torch.arange(seq_len)]
    return framed_probe(
        info,
        body,
        seed=seed,
        meta={
            "kind": "text",
            "source": source,
            "split": split,
            "text_column": text_column,
            "tokenization": how,
            "batch": batch,
            "seq_len": seq_len,
            "seed": seed,
            "stream_tokens": len(stream),
            "starts": starts.tolist(),
        },
    )
