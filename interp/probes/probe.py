"""TokenProbe: token sequences that know where their structure lies (framing, previous tokens,
duplicates, induction targets), as masks and as target pairs.

This module is the probes' leaf: it knows tensors, not models. The constructors that need a model
(:meth:`TokenProbe.from_tokens`, :meth:`TokenProbe.from_texts`) are declared here, so that editors
and users find them on the class, and implemented above it in :mod:`interp.probes.user`, which
registers them with :func:`builds`; importing :mod:`interp.probes` (which any import of this module
does first) loads it. Imports therefore only run down: ``user -> draw -> probe``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp.adapters import HookedModel
from interp.errors import UsageError

# the model-aware constructors, registered by the module that implements them (interp.probes.user)
_BUILDERS: dict[str, Callable[..., TokenProbe]] = {}


def builds(name: str) -> Callable[[Callable[..., TokenProbe]], Callable[..., TokenProbe]]:
    """Register the implementation of ``TokenProbe.<name>`` (a decorator, used by :mod:`interp.probes.user`)."""

    def register(fn: Callable[..., TokenProbe]) -> Callable[..., TokenProbe]:
        _BUILDERS[name] = fn
        return fn

    return register


def _built_by(name: str) -> Callable[..., TokenProbe]:
    if name not in _BUILDERS:  # only when this module was loaded without its package, which Python never does
        raise RuntimeError(f"TokenProbe.{name} is implemented in interp.probes.user: import interp.probes")
    return _BUILDERS[name]


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
    # True at real tokens, False at padding; None for unpadded probes (every position real). Padded
    # rows hold one block of real tokens, framed as the model expects, then (right) or before it
    # (left) the pad token; ``body_start`` counts from a row's first real token, and ``body_end`` is
    # the longest row's (see :meth:`body_mask` for each row's body).
    attention_mask: Bool[Tensor, "batch pos"] | None = None

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    @property
    def padded(self) -> bool:
        return self.attention_mask is not None

    def to(self, device: torch.device | str) -> TokenProbe:
        self.tokens = self.tokens.to(device)
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask.to(device)
        return self

    def select(self, rows: Sequence[int] | Tensor) -> TokenProbe:
        """The same probe restricted to the sequences ``rows`` (in that order)."""
        index = torch.as_tensor(list(rows) if not isinstance(rows, Tensor) else rows, dtype=torch.long)
        mask = self.attention_mask
        mask = None if mask is None else mask[index.to(mask.device)]
        return replace(
            self, tokens=self.tokens[index.to(self.tokens.device)], attention_mask=mask, meta=dict(self.meta)
        )

    # ---- padding ----------------------------------------------------------------------------

    def real_mask(self) -> Bool[Tensor, "batch pos"]:
        """True at real tokens: the attention mask, or every position of an unpadded probe."""
        if self.attention_mask is None:
            return torch.ones_like(self.tokens, dtype=torch.bool)
        return self.attention_mask.to(self.tokens.device)

    def lengths(self) -> Int[Tensor, " batch"]:
        """Each row's number of real tokens (framing included)."""
        return self.real_mask().sum(-1)

    def real_index(self) -> Int[Tensor, "batch pos"]:
        """Each position's index among its row's real tokens (its position in the text alone); -1 at
        left padding, the row's length and beyond at right padding."""
        return self.real_mask().long().cumsum(-1) - 1

    def position_ids(self) -> Int[Tensor, "batch pos"] | None:
        """The positions the model must give each token so that a text sees what it sees alone
        (``cumsum(mask) - 1``, 0 at left padding); None for an unpadded probe (the default arange)."""
        if self.attention_mask is None:
            return None
        return self.real_index().clamp_min(0)

    def offsets(self) -> Int[Tensor, " batch"]:
        """Where each row's first real token sits (its left padding)."""
        return (~self.real_mask()).long().cumprod(-1).sum(-1)

    def right_padded(self) -> TokenProbe:
        """The same texts with every row's real tokens moved to the left (right padding): position
        ``p`` of each row is then its text's position ``p``. Unpadded and right-padded probes are
        returned as they are."""
        if self.attention_mask is None or not bool(self.offsets().any()):
            return self
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        index = (pos[None] + self.offsets()[:, None]).clamp_max(self.seq_len - 1)
        mask = pos[None] < self.lengths()[:, None]
        pad = int(self.meta.get("pad_token_id", 0))
        tokens = torch.where(mask, self.tokens.gather(1, index), pad)
        return replace(self, tokens=tokens, attention_mask=mask, meta=dict(self.meta))

    def body_mask(self) -> Bool[Tensor, "batch pos"]:
        """Each row's body: real tokens past its framing prefix and before its framing suffix."""
        if self.attention_mask is None:
            return self._body().expand(self.batch, -1)
        n_suffix = self.seq_len - self.body_end
        r = self.real_index()
        return self.real_mask() & (r >= self.body_start) & (r < self.lengths()[:, None] - n_suffix)

    @classmethod
    def from_tokens(
        cls, model: HookedModel, tokens: Any, *, framed: bool = False, attention_mask: Any = None
    ) -> TokenProbe:
        """Your own token ids as a probe: ``[batch, pos]``, or one ``[pos]`` sequence.

        The ids are the body, and the model's framing is added around them as for every built-in
        probe (a BOS for decoders that expect one, ``[CLS] ... [SEP]`` for encoders). Ids that
        already carry it (``model.to_tokens(text)`` prepends a BOS) take ``framed=True``: the framing
        is then checked, not added. Scores read the duplicate and induction targets from the ids.

        ``attention_mask`` (``[batch, pos]``, 1 at real tokens) marks padded ids: each row's real ids
        must be one block, all rows padded on the same side; the probe is then padded the same way
        (framing around each row's real ids) and every analysis reads real positions only.
        """
        return _built_by("from_tokens")(model, tokens, framed=framed, attention_mask=attention_mask)

    @classmethod
    def from_texts(
        cls, model: HookedModel, texts: str | Sequence[str], *, seq_len: int | None = None, padding: str = "right"
    ) -> TokenProbe:
        """Your own prompts as a probe: each text tokenized (no special tokens), framed for the model.

        Texts of different lengths are padded with the model's pad token to the longest one, on the
        side ``padding`` names (``"right"`` or ``"left"``), and the probe carries an attention mask:
        every analysis then reads each text's real positions only, and gives each text what it gives
        alone (left-padded texts get positions counted from their first real token). ``seq_len``
        cuts longer texts to that many tokens. A model without a tokenizer (the toy) reads UTF-8
        bytes mapped onto its ordinary vocabulary, as :func:`text_probe` does.
        """
        return _built_by("from_texts")(model, texts, seq_len=seq_len, padding=padding)

    # ---- structural masks -------------------------------------------------------------------

    def _body(self) -> Bool[Tensor, " pos"]:
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        return (pos >= self.body_start) & (pos < self.body_end)

    def _ordinary(self) -> Bool[Tensor, "batch pos"]:
        ordinary = torch.ones_like(self.tokens, dtype=torch.bool)
        for t in self.special_token_ids:
            ordinary &= self.tokens != t
        return ordinary & self.body_mask()

    def prev_query_mask(self) -> Bool[Tensor, "batch pos"]:
        """Queries that have a previous token: every body position (a row's first real token never)."""
        if self.attention_mask is None:
            pos = torch.arange(self.seq_len, device=self.tokens.device)
            return (self._body() & (pos >= 1)).expand(self.batch, -1)
        return self.body_mask() & (self.real_index() >= 1)

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
        if self.attention_mask is not None:  # rows differ: each row's own queries
            queries = self.prev_query_mask() if not every_query else self.real_mask() & (self.real_index() >= 1)
            b, q = queries.cpu().nonzero().unbind(-1)
            return torch.stack([b, q, q - 1], -1)
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
