"""Built-in probes: the model's framing, seeded repeated and random token blocks."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from interp import memory
from interp.adapters import HookedModel
from interp.errors import UsageError
from interp.models import ModelInfo, describe
from interp.probes.probe import TokenProbe


def check_positive(**kwargs: int) -> None:
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


def drop_given_prefix(
    info: ModelInfo, rows: Sequence[Sequence[int]], what: str = "sequence", hint: str | None = None
) -> list[list[int]]:
    """The body ids of rows that are about to be framed: a row that already starts with the model's
    prefix (its BOS, or ``[CLS]``) loses it, so that framing adds it once, not twice; a warning says
    how many rows did (and ``hint``, what else the caller can pass). Every place that frames ids or
    texts it did not frame itself calls this."""
    prefix, _, names = frame_tokens(info)
    n = len(prefix)
    given = [bool(prefix) and len(r) > n and list(r[:n]) == prefix for r in rows]
    k = sum(given)
    if k:
        who = f"every {what} already starts" if k == len(rows) else f"{k} of {len(rows)} {what}s already start"
        warnings.warn(
            f"{who} with the model's {names[0]}: it is not added again" + (f"; {hint}" if hint else ""), stacklevel=3
        )
    return [list(r[n:]) if g else list(r) for r, g in zip(rows, given)]


def repeated_tokens(
    model: HookedModel,
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
    check_positive(batch=batch, block_len=block_len, n_repeats=n_repeats)
    if n_repeats < 2:
        raise UsageError(f"n_repeats must be at least 2 (a block must repeat to be copied), got {n_repeats}")
    info = describe(model)
    check_fits(
        info,
        block_len * n_repeats,
        f"{n_repeats} x {block_len}",
        lambda room: (
            f"the longest block for {n_repeats} repeats is {room // n_repeats}; pass block_len={room // n_repeats} "
            f"or less{' (or lower n_repeats=)' if n_repeats > 2 else ''}"  # 2 is the fewest: none to lower
        ),
        params=("block_len", "n_repeats"),
    )
    block = draw_blocks(model, info, batch, block_len, seed)
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


def random_tokens(model: HookedModel, *, batch: int = 16, seq_len: int = 64, seed: int = 0) -> TokenProbe:
    """Gu et al. (2024)'s sink probe: ``seq_len`` random ordinary tokens per sequence, framed.

    Tokens are drawn uniformly from the ordinary vocabulary, without replacement within a sequence
    when the vocabulary allows (so no token repeats); ``seq_len`` counts body tokens.
    """
    check_positive(batch=batch, seq_len=seq_len)
    info = describe(model)
    check_fits(
        info,
        seq_len,
        str(seq_len),
        lambda room: f"the longest body is {room}; pass seq_len={room} or less",
        params="seq_len",
    )
    body = draw_blocks(model, info, batch, seq_len, seed)
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


def check_fits(
    info: ModelInfo, n_body: int, body: str, longest: Callable[[int], str], params: Sequence[str] = ()
) -> None:
    """Raise when ``n_body`` tokens plus the framing exceed the context; ``longest(room)`` is the hint,
    ``params`` the parameters it names."""
    prefix, suffix, framing = frame_tokens(info)
    total = len(prefix) + n_body + len(suffix)
    if total > info.n_ctx:
        raise UsageError(
            f"probe of {total} tokens ({' + '.join(framing + [body])}) is longer than the model's "
            f"context of {info.n_ctx} tokens: {longest(info.n_ctx - len(prefix) - len(suffix))}",
            params=params,
        )


def draws_distinct(model: HookedModel, n: int) -> bool:
    """Can ``n`` ordinary tokens be drawn without replacement? (A 16K-token block needs 16K of them;
    below that, tokens repeat inside a block and the target masks and pairs count those repeats too.)"""
    return len(ordinary_vocab(describe(model), getattr(model, "tokenizer", None))) >= n


def draw_blocks(model: HookedModel, info: ModelInfo, batch: int, n: int, seed: int) -> Int[Tensor, "batch n"]:
    """``batch`` seeded rows of ``n`` ordinary tokens, distinct within a row when the vocabulary allows."""
    vocab = ordinary_vocab(info, getattr(model, "tokenizer", None))
    if len(vocab) < 2:
        raise UsageError("the model's vocabulary has fewer than 2 ordinary tokens to draw from")
    need, room = 2 * batch * n * 8, memory.free_bytes("cpu")  # the rows and the picks they are gathered from
    if room is not None and need > room:
        raise UsageError(
            f"{batch} sequences of {n} random tokens need about {memory.gib(need)} to draw, but the cpu has "
            f"{memory.gib(room)} free: pass a smaller batch=",
            params="batch",
        )
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
