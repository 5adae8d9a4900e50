"""Needle-in-a-haystack and copy-distance probes: teacher-forced copies with exact target pairs.

**Needle probe** (:func:`needle_probe`). Each sequence is ``[BOS] haystack-with-needles copies``:

- the *haystack* is ``h`` ordinary tokens: seeded random draws, the bundled text
  (``haystack="text"``, read through :mod:`interp.texts` as :func:`~interp.probes.text_probe`
  does), or ids you pass (a 1-D stream, from which each row takes a seeded window of ``h`` ids);
- one *needle* per depth: a span of ``needle_len = k`` distinct tokens inserted before haystack
  token ``round(depth * h)`` (depth 0: the needle opens the body, depth 1: it closes the haystack;
  needles at one depth follow each other in the order given);
- at the very end, a *copy* of every needle, in the order of ``depths``, read teacher-forced.

``seq_len`` counts body tokens, so ``h = seq_len - 2 * n_needles * k``.

**Exactness.** Needle tokens are distinct from each other (within a row) and occur nowhere else in
the haystack, so every copied token has exactly one earlier occurrence, its needle token. With a
random haystack the needle tokens are drawn first and the haystack from the rest of the ordinary
vocabulary; with a given haystack the needle tokens are the row's rarest tokens (absent ones first,
ties broken by the seed) and any haystack occurrence of them is replaced by a seeded draw of the
row's other haystack tokens (``meta["replaced"]`` counts these). Both need ``n_needles * k + 1``
ordinary tokens; a smaller vocabulary is refused rather than given ambiguous targets.

**Retrieval pairs** (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
Factuality", teacher-forced). Wu et al. count, while the model generates the needle's copy, the
steps at which a head's most-attended key is the needle token being generated. Teacher-forced,
the step that generates copy token ``j`` is the query at position ``p = c + j - 1`` (its next token
is copy token ``j``), and its target key is ``n + j``, where needle ``i`` sits at ``n`` and its copy
at ``c``. Steps ``j = 1 .. k - 1`` are scored: at ``j = 0`` the query holds the token before the
copy, which does not say which needle comes next (Wu et al. prompt with a question; here the
needle's first token is the cue). So ``tokens[b, key] == tokens[b, query + 1]`` for every pair,
and a needle gives ``k - 1`` pairs, each tagged with its needle id (for a bootstrap over needles).

**Copy-induction pairs** (prefix matching on the same copies): the query at ``c + j`` holds needle
token ``j``, whose earlier occurrence is ``n + j``; its target is the key right after it,
``n + j + 1`` (``j = 0 .. k - 1``). For ``j < k - 1`` this is the same (query, key) as the retrieval
pair of step ``j + 1``: an induction head *is* a copier. The analyses differ in what they read
there: induction takes the attention mass on the key, retrieval asks whether the key is the row's
argmax.

**Copy-distance probe** (:func:`copy_distance_probe`). ``batch`` sequences per distance ``d``, all
``seq_len`` long: a needle of ``span`` tokens whose copy closes the body, ``d`` tokens after it, so
every copied token's earlier occurrence sits exactly ``d`` positions before it. The retrieval and
copy-induction pairs are as above and are grouped by :meth:`NeedleProbe.needle_distance`.

All targets are kept as ``(batch, query, key)`` rows (a few per needle), never as ``T x T`` masks.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from interp.adapters import HookedModel
from interp.errors import UsageError
from interp.models import ModelInfo, describe
from interp.probes import TokenProbe
from interp.probes.draw import check_fits, check_positive, frame_tokens, framed_probe, ordinary_vocab
from interp.registry import Registry
from interp.texts import BYTES_NOTE

DEFAULT_SEQ_LEN = 1024

# the haystacks a name chooses (``haystack=``; token ids of your own are the other choice)
HAYSTACKS: Registry[str] = Registry("haystack")
HAYSTACKS.add("random", "seeded random draws")
HAYSTACKS.add("text", f"the bundled English text ({BYTES_NOTE})")


@dataclass
class NeedleProbe(TokenProbe):
    """A :class:`TokenProbe` whose sequences hold needles and their teacher-forced copies.

    Needle ``m`` sits in row ``needle_row[m]`` at token positions ``needle_pos[m] + 0 .. k - 1``
    and its copy at ``copy_pos[m] + 0 .. k - 1`` (``k = needle_len``; positions count the framing).
    """

    needle_row: Int[Tensor, " needle"] | None = None
    needle_pos: Int[Tensor, " needle"] | None = None
    copy_pos: Int[Tensor, " needle"] | None = None
    needle_len: int = 0

    @property
    def n_needles(self) -> int:
        return len(self.needle_row)

    def needle_distance(self) -> Int[Tensor, " needle"]:
        """How far back each needle's copy finds it: ``copy_pos - needle_pos``."""
        return self.copy_pos - self.needle_pos

    def retrieval_pairs(self) -> Int[Tensor, "n 3"]:
        """``(batch, query, key)``: the query generating copy token ``j`` and needle token ``j``
        (``j = 1 .. k - 1`` per needle, needle by needle; see the module docstring)."""
        j = torch.arange(1, self.needle_len)
        return self._pairs(self.copy_pos[:, None] + j - 1, self.needle_pos[:, None] + j)

    def retrieval_needles(self) -> Int[Tensor, " n"]:
        """The needle id of each row of :meth:`retrieval_pairs`."""
        return torch.arange(self.n_needles).repeat_interleave(self.needle_len - 1)

    def copy_induction_pairs(self) -> Int[Tensor, "n 3"]:
        """``(batch, query, key)``: copy token ``j`` and the key right after needle token ``j``
        (``j = 0 .. k - 1`` per needle)."""
        j = torch.arange(self.needle_len)
        return self._pairs(self.copy_pos[:, None] + j, self.needle_pos[:, None] + j + 1)

    def copy_induction_needles(self) -> Int[Tensor, " n"]:
        """The needle id of each row of :meth:`copy_induction_pairs`."""
        return torch.arange(self.n_needles).repeat_interleave(self.needle_len)

    def _pairs(self, query: Tensor, key: Tensor) -> Int[Tensor, "n 3"]:
        row = self.needle_row[:, None].expand_as(query)
        return torch.stack([row, query, key], dim=-1).reshape(-1, 3).long()

    def select(self, rows: Sequence[int] | Tensor) -> NeedleProbe:
        """The probe restricted to sequences ``rows`` (in that order); needles follow their rows."""
        rows = [int(r) for r in (rows.tolist() if isinstance(rows, Tensor) else rows)]
        keep = [(new, m) for new, old in enumerate(rows) for m in (self.needle_row == old).nonzero().flatten().tolist()]
        index = torch.tensor([m for _, m in keep], dtype=torch.long)
        return replace(
            self,
            tokens=self.tokens[torch.tensor(rows, dtype=torch.long, device=self.tokens.device)],
            meta=dict(self.meta),
            needle_row=torch.tensor([new for new, _ in keep], dtype=torch.long),
            needle_pos=self.needle_pos[index],
            copy_pos=self.copy_pos[index],
        )


# ---------------------------------------------------------------------------------------------
# the probes


def needle_probe(
    model: HookedModel,
    *,
    seq_len: int | None = None,
    depths: Sequence[float] = (0.1, 0.5, 0.9),
    needle_len: int = 8,
    batch: int = 4,
    seed: int = 0,
    haystack: str | Sequence[int] | Tensor | None = None,
) -> NeedleProbe:
    """``batch`` seeded needle-in-a-haystack sequences of ``seq_len`` body tokens, framed for ``model``.

    One needle of ``needle_len`` tokens per entry of ``depths`` (each in [0, 1]); the copies of all
    needles close each sequence. ``seq_len`` defaults to ``min(1024, the model's room)``.
    ``haystack``: ``None`` or ``"random"`` (seeded random ordinary tokens), ``"text"`` (the bundled
    text; the names are :data:`HAYSTACKS`) or your own 1-D token ids. See the module docstring for the layout and the exact definitions.
    """
    info = _decoder_info(model)
    seq_len = _default_len(info, seq_len)
    check_positive(seq_len=seq_len, batch=batch, needle_len=needle_len)
    _check_needle_len(needle_len)
    depths = [float(_check_depth(d)) for d in depths]
    if not depths:
        raise UsageError("give at least one depth (a needle per depth)")
    n, k = len(depths), needle_len
    check_fits(info, seq_len, str(seq_len), lambda room: f"the longest seq_len is {room}")
    hay_len = seq_len - 2 * n * k
    if hay_len < k:
        raise UsageError(
            f"needle of {k} tokens is longer than the haystack of {max(hay_len, 0)} tokens "
            f"(seq_len {seq_len} - {n} needle(s) x {k} tokens x 2 for needle and copy): "
            "raise seq_len or lower needle_len"
        )
    offsets = [round(d * hay_len) for d in depths]
    order = sorted(range(n), key=lambda i: (offsets[i], i))
    needle_body = [0] * n
    for rank, i in enumerate(order):
        needle_body[i] = offsets[i] + rank * k
    copy_body = [seq_len - n * k + i * k for i in range(n)]
    layout = [list(zip(needle_body, copy_body))] * batch
    probe = _assemble(model, info, layout, seq_len, k, seed, haystack)
    probe.meta.update(
        kind="needle",
        seq_len=seq_len,
        depths=depths,
        needle_len=k,
        n_needles=n,
        batch=batch,
        seed=seed,
        needle_positions=[int(p) + probe.body_start for p in needle_body],
        copy_positions=[int(p) + probe.body_start for p in copy_body],
    )
    return probe


def default_distances(room: int, span: int) -> list[int]:
    """The copy distances a probe of ``room`` body tokens holds with ``span``-token needles: the powers
    of 4 from 16 to 65536 that fit with room for the needle and its copy, else the one that fits."""
    return [4**i for i in range(2, 9) if 4**i + 2 * span <= room] or [max(span, room - 2 * span)]


def copy_distance_probe(
    model: HookedModel,
    distances: Sequence[int] | None = None,
    *,
    span: int = 8,
    batch: int = 2,
    seq_len: int | None = None,
    seed: int = 0,
    haystack: str | Sequence[int] | Tensor | None = None,
) -> NeedleProbe:
    """``batch`` sequences per distance, each holding a ``span``-token needle copied exactly
    ``distance`` tokens later, the copy closing the body.

    ``distances`` defaults to the powers of 4 from 16 that fit the model's context (16, 64, 256,
    ... 65536). ``seq_len`` (body tokens, the same for every row) defaults to
    ``max(distances) + 2 * span``, and must be at least ``max(distances) + span``.
    """
    info = _decoder_info(model)
    check_positive(span=span, batch=batch)
    _check_needle_len(span, what="span")
    prefix, suffix, _ = frame_tokens(info)
    room = info.n_ctx - len(prefix) - len(suffix)
    if distances is None:
        distances = default_distances(room, span)
    distances = [int(d) for d in distances]
    if not distances:
        raise UsageError("give at least one distance")
    for d in distances:
        if d < span:
            raise UsageError(f"distance {d} is shorter than the span of {span}: a needle would overlap its copy")
    seq_len = max(distances) + 2 * span if seq_len is None else seq_len
    check_positive(seq_len=seq_len)
    if seq_len < max(distances) + span:
        raise UsageError(f"seq_len {seq_len} cannot hold distance {max(distances)} plus a span of {span}")
    check_fits(
        info, seq_len, str(seq_len), lambda room: f"the longest distance that fits is {room - 2 * span}; lower it"
    )
    copy = seq_len - span
    layout = [[(copy - d, copy)] for d in distances for _ in range(batch)]
    probe = _assemble(model, info, layout, seq_len, span, seed, haystack)
    probe.meta.update(
        kind="copy_distance",
        seq_len=seq_len,
        distances=distances,
        span=span,
        needle_len=span,
        batch=batch,
        seed=seed,
    )
    return probe


# ---------------------------------------------------------------------------------------------
# building blocks


def _decoder_info(model: HookedModel) -> ModelInfo:
    info = describe(model)
    if not info.is_causal:
        raise UsageError(
            f"needle probes read a copy teacher-forced, which needs a causal (decoder) model; {info.name} is an encoder"
        )
    return info


def _default_len(info: ModelInfo, seq_len: int | None) -> int:
    if seq_len is not None:
        return seq_len
    prefix, suffix, _ = frame_tokens(info)
    return min(DEFAULT_SEQ_LEN, info.n_ctx - len(prefix) - len(suffix))


def _check_needle_len(k: int, what: str = "needle_len") -> None:
    if k < 2:
        raise UsageError(
            f"{what} must be at least 2 (a copy step is scored when the token before it is a needle token), got {k}"
        )


def _check_depth(d: Any) -> float:
    if isinstance(d, bool) or not isinstance(d, numbers.Real) or not 0.0 <= float(d) <= 1.0 or math.isnan(float(d)):
        raise UsageError(f"depth must be within [0, 1] (0: the needle opens the haystack, 1: it closes it), got {d!r}")
    return float(d)


def _assemble(
    model: HookedModel,
    info: ModelInfo,
    layout: list[list[tuple[int, int]]],
    seq_len: int,
    k: int,
    seed: int,
    haystack: str | Sequence[int] | Tensor | None,
) -> NeedleProbe:
    """Rows of ``seq_len`` body tokens: needles at ``layout[b] = [(needle, copy), ...]`` (body
    positions), their copies, and haystack tokens everywhere else; framed as a :class:`NeedleProbe`."""
    vocab = ordinary_vocab(info, getattr(model, "tokenizer", None))
    n = len(layout[0])
    if len(vocab) < n * k + 1:
        raise UsageError(
            f"the model has {len(vocab)} ordinary tokens, too few for {n} needle(s) of {k} distinct "
            "tokens that occur nowhere else: lower needle_len or the number of needles"
        )
    batch = len(layout)
    hay_len = seq_len - 2 * n * k
    gen = torch.Generator().manual_seed(seed)
    stream, source = _haystack_stream(model, info, vocab, haystack, batch * hay_len)
    body = torch.empty(batch, seq_len, dtype=torch.long)
    replaced = 0
    for b, spans in enumerate(layout):
        if stream is None:  # random: needle tokens first, the haystack from the rest
            perm = vocab[torch.randperm(len(vocab), generator=gen)]
            needles, rest = perm[: n * k], perm[n * k :]
            hay = rest[torch.randint(len(rest), (hay_len,), generator=gen)]
        else:
            if len(stream) < hay_len:
                raise UsageError(
                    f"the haystack from {source} has {len(stream)} tokens, fewer than the {hay_len} "
                    "a row needs: lower seq_len or pass a longer haystack"
                )
            start = int(torch.randint(len(stream) - hay_len + 1, (1,), generator=gen))
            hay = stream[start : start + hay_len].clone()
            needles, hits = _rarest(hay, vocab, n * k, info.d_vocab, gen)
            if hits.any():  # exactness: needle tokens occur only as needles
                others = hay[~hits]
                pool = others if len(others) else vocab[~torch.isin(vocab, needles)]
                hay[hits] = pool[torch.randint(len(pool), (int(hits.sum()),), generator=gen)]
                replaced += int(hits.sum())
        filled = torch.zeros(seq_len, dtype=torch.bool)
        for i, (at, copy) in enumerate(spans):
            span = needles[i * k : (i + 1) * k]
            body[b, at : at + k] = span
            body[b, copy : copy + k] = span
            filled[at : at + k] = filled[copy : copy + k] = True
        body[b, ~filled] = hay
    needle_body = torch.tensor([[at for at, _ in spans] for spans in layout]).flatten()
    copy_body = torch.tensor([[copy for _, copy in spans] for spans in layout]).flatten()
    probe = framed_probe(info, body, seed=seed, meta={"kind": "needle", "haystack": source, "replaced": replaced})
    return NeedleProbe(
        **{f: getattr(probe, f) for f in TokenProbe.__dataclass_fields__},
        needle_row=torch.arange(batch).repeat_interleave(n),
        needle_pos=needle_body + probe.body_start,
        copy_pos=copy_body + probe.body_start,
        needle_len=k,
    )


def _rarest(
    hay: Tensor, vocab: Tensor, count: int, d_vocab: int, gen: torch.Generator
) -> tuple[Int[Tensor, " count"], Tensor]:
    """The ``count`` ordinary tokens rarest in ``hay`` (seeded ties), and where ``hay`` holds them."""
    freq = torch.bincount(hay, minlength=d_vocab)[vocab].double()
    jitter = torch.rand(len(vocab), generator=gen, dtype=torch.float64)  # in [0, 1): breaks ties only
    needles = vocab[torch.argsort(freq + jitter)[:count]]
    needles = needles[torch.randperm(count, generator=gen)]
    return needles, torch.isin(hay, needles)


def _haystack_stream(
    model: HookedModel, info: ModelInfo, vocab: Tensor, haystack: Any, budget: int
) -> tuple[Tensor | None, str]:
    """``(ids, source)``: the haystack's 1-D token stream, or ``None`` for random draws."""
    if haystack is None or (isinstance(haystack, str) and haystack == "random"):
        return None, "random"
    if isinstance(haystack, (str, os.PathLike)):
        if str(haystack) != "text":
            raise UsageError(f"haystack must be None, 'random', 'text' or token ids, got {haystack!r}")
        from interp.texts import bytes_to_ids, text_rows, tokenize_rows

        rows, source = text_rows(None, "train", "text")
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is not None:
            return tokenize_rows(tokenizer, rows, budget), source
        return bytes_to_ids(rows, vocab, budget), source
    ids = torch.as_tensor(haystack, dtype=torch.long).cpu()
    if ids.ndim != 1:
        raise UsageError(f"haystack ids must be one 1-D stream, got shape {tuple(ids.shape)}")
    bad = ids[~torch.isin(ids, vocab)]
    if len(bad):
        raise UsageError(f"haystack id {int(bad[0])} is not an ordinary token of the model (special or out of range)")
    return ids, "ids"


__all__ = ["NeedleProbe", "copy_distance_probe", "default_distances", "needle_probe"]
