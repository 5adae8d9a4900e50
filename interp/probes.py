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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp.models import ModelInfo, describe


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

    def to(self, device: torch.device | str) -> "TokenProbe":
        self.tokens = self.tokens.to(device)
        return self

    # ---- structural masks -------------------------------------------------------------------

    def _body(self) -> Bool[Tensor, "pos"]:
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
        allowed = torch.tril(allowed, diagonal=-1) if self.causal else allowed & ~torch.eye(
            n, dtype=torch.bool, device=self.tokens.device)
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

    def second_repeat_mask(self) -> Bool[Tensor, "batch pos"]:
        """Positions whose token already occurred earlier in the sequence (the in-context part)."""
        return self.duplicate_mask().any(-1) if self.causal else self._repeat_index() >= 1

    def _repeat_index(self) -> Int[Tensor, "batch pos"]:
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        if self.block_len is None:
            raise ValueError("this probe has no repeat structure")
        idx = torch.where(self._body(), (pos - self.body_start) // self.block_len, -1)
        return idx.expand(self.batch, -1)


def _check_positive(**kwargs: int) -> None:
    for name, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def ordinary_vocab(info: ModelInfo, tokenizer: Any = None) -> Int[Tensor, "n"]:
    """Token ids a probe may draw: the model's vocabulary less its special tokens."""
    size = info.d_vocab
    if tokenizer is not None:
        size = min(size, len(tokenizer))
    keep = torch.ones(size, dtype=torch.bool)
    for t in info.special_token_ids:
        if 0 <= t < size:
            keep[t] = False
    return keep.nonzero().squeeze(-1)


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
        raise ValueError(f"n_repeats must be at least 2 (a block must repeat to be copied), got {n_repeats}")
    info = describe(model)
    prefix: list[int] = []
    suffix: list[int] = []
    framing = []
    if info.is_causal:
        if info.bos_token_id is not None:
            prefix, framing = [info.bos_token_id], ["BOS"]
    else:
        if info.cls_token_id is not None:
            prefix, framing = [info.cls_token_id], ["[CLS]"]
        if info.sep_token_id is not None:
            suffix = [info.sep_token_id]
            framing.append("[SEP]")
    total = len(prefix) + block_len * n_repeats + len(suffix)
    if total > info.n_ctx:
        room = (info.n_ctx - len(prefix) - len(suffix)) // n_repeats
        raise ValueError(
            f"probe of {total} tokens ({' + '.join(framing + [f'{n_repeats} x {block_len}'])}) is longer "
            f"than the model's context of {info.n_ctx} tokens: the longest block for {n_repeats} "
            f"repeats is {room}; lower --seq-len or --repeats"
        )
    vocab = ordinary_vocab(info, getattr(model, "tokenizer", None))
    if len(vocab) < 2:
        raise ValueError("the model's vocabulary has fewer than 2 ordinary tokens to draw from")
    gen = torch.Generator().manual_seed(seed)
    if len(vocab) >= block_len:
        picks = torch.stack([torch.randperm(len(vocab), generator=gen)[:block_len] for _ in range(batch)])
    else:  # tiny vocabularies: duplicates inside a block are unavoidable
        picks = torch.randint(len(vocab), (batch, block_len), generator=gen)
    block = vocab[picks]
    body = block.repeat(1, n_repeats)
    tokens = torch.cat(
        [torch.tensor(prefix, dtype=torch.long).expand(batch, -1), body,
         torch.tensor(suffix, dtype=torch.long).expand(batch, -1)],
        dim=1,
    ).to(info.device)
    return TokenProbe(
        tokens=tokens,
        body_start=len(prefix),
        body_end=len(prefix) + block_len * n_repeats,
        causal=info.is_causal,
        special_token_ids=info.special_token_ids,
        block_len=block_len,
        n_repeats=n_repeats,
        seed=seed,
        meta={"kind": "repeated_tokens", "framing": framing, "batch": batch, "block_len": block_len,
              "n_repeats": n_repeats, "seed": seed},
    )
