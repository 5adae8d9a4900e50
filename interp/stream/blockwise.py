"""Online-softmax passes over one layer's ``q`` and ``k`` that never hold more than a tile of scores.

A head's attention weight is ``A[q, k] = exp(s_qk - lse_q)`` with ``s_qk = scale * q . k`` and
``lse_q`` the log-sum-exp of row ``q``. So every statistic we report is a sum of exponentials of
scores, and three passes cover them all, each in memory linear in ``T``:

- :func:`row_stats`: the flash forward without the values: per row the log-sum-exp, the largest
  score (``max_k A[q, k] = exp(m_q - lse_q)``, Voita's confidence) and the largest score over keys
  ``k >= 1`` (the confidence without the first position).
- :func:`column_sums`: one more blockwise pass over ``(q, k, lse)``: every key's received mass
  ``sum_q A[q, k]`` (Gu's ``alpha_k`` before dividing by ``n_k``) and every row's sum (which must
  be 1: the check that the log-sum-exp is right).
- :func:`gathered_weights`: ``A[q, k]`` at known ``(batch, q, k)`` targets, ``O(d)`` per target.

The passes over :class:`~interp.adapters.AttentionInputs` (``attention_row_stats``,
``attention_column_sums``, ``attention_gathered``, ``attention_output``/``own_attention``) apply its
whole contract through :func:`logits_tile` (windows, softcap, ALiBi, padded keys; the sink logit in
the log-sum-exp) and read only the key tiles inside each query block's :func:`key_range`: a window
costs ``O(T x window)``. ``row_stats``/``column_sums``/``gathered_weights`` are their plain-attention
spellings on bare tensors.

Shapes follow torch's ``scaled_dot_product_attention``: ``q`` is ``[batch, head, pos, d_head]``,
``k`` is ``[batch, kv_head, pos, d_head]``; query head ``h`` reads key head ``h // (head / kv_head)``
(grouped-query attention by index, as ``repeat_interleave`` would lay it out). Everything is
computed in float32. The tiles are ``block x block`` per head (``block`` 512: 1 MiB per head). The
row pass is the online-softmax reference of :mod:`interp.kernels` without the values; the column
pass reuses its score tile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters.base import AttentionInputs
from interp.kernels import OnlineSoftmax, key_end

BLOCK = 512
GATHER_CHUNK = 1 << 16

RowStats = OnlineSoftmax  # lse, max, max_rest per query row (out is None: no values are read)


def row_stats(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    scale: float,
    causal: bool,
    block: int = BLOCK,
) -> RowStats:
    """Log-sum-exp, row max and row max over keys ``>= 1`` of every query row of plain attention."""
    return attention_row_stats(_plain(q, k, scale, causal), block)


def column_sums(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    lse: Float[Tensor, "batch head pos"],
    scale: float,
    causal: bool,
    block: int = BLOCK,
) -> tuple[Float[Tensor, "batch head k"], Float[Tensor, "batch head q"]]:
    """:func:`attention_column_sums` of plain attention."""
    return attention_column_sums(_plain(q, k, scale, causal), lse, block)


def gathered_weights(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    lse: Float[Tensor, "batch head pos"],
    scale: float,
    pairs: Int[Tensor, "n 3"],
    chunk: int = GATHER_CHUNK,
) -> Float[Tensor, "n head"]:
    """:func:`attention_gathered` of plain non-causal attention (the pairs are trusted to be visible)."""
    return attention_gathered(_plain(q, k, scale, False), lse, pairs, chunk)


def _plain(q: Tensor, k: Tensor, scale: float, causal: bool) -> AttentionInputs:
    return AttentionInputs(0, q, k, k, float(scale), causal)


# --------------------------------------------------------------------------------------------
# the passes over AttentionInputs: every feature of the contract, windows skip tiles


def key_range(a: AttentionInputs, q0: int, q1: int) -> tuple[int, int]:
    """Keys ``[lo, hi)`` that some query of ``q0:q1`` may see: causal stops at the diagonal, a window
    starts ``window - 1`` keys before the block. Tiles outside it are never formed: ``O(T x window)``."""
    T = a.k.shape[2]
    hi = min(q1, T) if a.causal else T
    lo = max(0, q0 - a.window + 1) if a.window is not None else 0
    return lo, hi


def _finite_or(x: Tensor, fill: float) -> Tensor:
    return torch.where(torch.isfinite(x), x, torch.full_like(x, fill))


def _sink(a: AttentionInputs) -> Tensor | None:
    return None if a.sink is None else a.sink.detach().float().to(a.q.device)[None, :, None]


def attention_row_stats(a: AttentionInputs, block: int = BLOCK, values: bool = False) -> RowStats:
    """Per query row: the log-sum-exp (the sink logit in it), the largest logit and the largest logit
    over keys ``>= 1``; with ``values``, the attention output (float32), as the model computes it.

    One online softmax over :func:`logits_tile` tiles inside each block's :func:`key_range`. A row
    that sees no key and has no sink (a left-padded query) gets ``lse = 0``, ``max = -inf``: every
    weight of it is 0, and so is its output.
    """
    B, H, T = a.q.shape[:3]
    dev = a.q.device
    lse = torch.empty(B, H, T, device=dev)
    mx, mx_rest = torch.empty_like(lse), torch.empty_like(lse)
    out = torch.empty(B, H, T, a.v.shape[-1], device=dev) if values else None
    kv_of_head = torch.arange(H, device=dev) // (H // a.k.shape[1])
    sink = _sink(a)
    for q0 in range(0, T, block):
        q1 = min(q0 + block, T)
        m = torch.full((B, H, q1 - q0), -math.inf, device=dev)  # running max logit per row
        m_rest = m.clone()
        l = torch.zeros_like(m)  # running sum of exp(s - m)
        acc = torch.zeros(B, H, q1 - q0, a.v.shape[-1], device=dev) if values else None
        lo, hi = key_range(a, q0, q1)
        for k0 in range(lo, hi, block):
            k1 = min(k0 + block, hi)
            s = logits_tile(a, q0, q1, k0, k1)
            tile_max = s.amax(-1)
            if k0 > 0:
                m_rest = torch.maximum(m_rest, tile_max)
            elif k1 - k0 > 1:
                m_rest = torch.maximum(m_rest, s[..., 1:].amax(-1))
            m_new = torch.maximum(m, tile_max)
            shift = _finite_or(m_new, 0.0)  # a row with nothing seen yet stays at l = 0
            alpha = torch.exp(m - shift)
            p = s.sub_(shift[..., None]).exp_()
            l = l * alpha + p.sum(-1)
            if acc is not None:
                v = a.v[:, :, k0:k1].float()[:, kv_of_head]
                acc = acc * alpha[..., None] + torch.einsum("bhqk,bhkd->bhqd", p, v)
            m = m_new
        keys = m + torch.log(l)
        total = keys if sink is None else torch.logaddexp(keys, sink.expand_as(keys))
        total = total.masked_fill(total == -math.inf, 0.0)  # sees nothing: every weight exp(-inf - 0) = 0
        lse[..., q0:q1], mx[..., q0:q1], mx_rest[..., q0:q1] = total, m, m_rest
        if out is not None:
            out[..., q0:q1, :] = acc * _finite_or(torch.exp(_finite_or(m, 0.0) - total), 0.0)[..., None]
    return RowStats(lse=lse, max=mx, max_rest=mx_rest, out=out)


_REUSE: list[tuple[AttentionInputs, RowStats]] = []  # row statistics the output pass already made


@contextmanager
def reusing_row_stats(a: AttentionInputs, stats: RowStats) -> Iterator[None]:
    """Within the block, the row pass of exactly ``a`` (the same object) returns ``stats`` (the
    capture's output pass made them: the layer's row statistics come for free)."""
    _REUSE.append((a, RowStats(lse=stats.lse, max=stats.max, max_rest=stats.max_rest)))
    try:
        yield
    finally:
        _REUSE.pop()


def reused_row_stats(a: AttentionInputs) -> RowStats | None:
    """The row statistics :func:`reusing_row_stats` holds for ``a``, if any."""
    return next((r for held, r in reversed(_REUSE) if held is a), None)


def own_attention(
    own: AttentionInputs, seen: AttentionInputs, on_attention: Callable[[AttentionInputs], None]
) -> Float[Tensor, "batch head pos d_v"]:
    """The model's attention output where SDPA cannot compute it (the adapters' ``attend``): one
    online-softmax pass with values over ``own``; the callback then gets ``seen`` (the same inputs,
    detached) and its row pass reuses this pass's statistics instead of a second pass."""
    stats = attention_row_stats(own, values=True)
    with reusing_row_stats(seen, stats):
        on_attention(seen)
    return stats.out


def attention_output(a: AttentionInputs, block: int = BLOCK) -> Float[Tensor, "batch head pos d_v"]:
    """The layer's attention output ``sum_k A[q, k] v_k`` (float32) by the online softmax: exact for
    every feature SDPA lacks (softcap, sink, window, key mask), in memory linear in ``T``."""
    return attention_row_stats(a, block, values=True).out


def attention_column_sums(
    a: AttentionInputs, lse: Float[Tensor, "batch head q"], block: int = BLOCK
) -> tuple[Float[Tensor, "batch head k"], Float[Tensor, "batch head q"]]:
    """``(sum_q A[q, k] per key, row totals)``, blockwise over ``(q, k, lse)`` inside the band. A row's
    total counts the sink's share too, so it is 1 for every query that sees a key; padded query rows
    (``key_mask`` False) give nothing and total 0."""
    B, H, T = a.q.shape[:3]
    lse = lse.float().to(a.q.device)
    safe = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, math.inf))  # no key: weights 0
    received = torch.zeros(B, H, a.k.shape[2], device=a.q.device)
    rows = torch.zeros(B, H, T, device=a.q.device)
    if a.key_mask is not None:  # padded queries give no mass: their rows are not the text's
        safe = safe.masked_fill(~a.key_mask.to(a.q.device)[:, None, :].bool(), math.inf)
    for q0 in range(0, T, block):
        q1 = min(q0 + block, T)
        lo, hi = key_range(a, q0, q1)
        for k0 in range(lo, hi, block):
            k1 = min(k0 + block, hi)
            p = logits_tile(a, q0, q1, k0, k1).sub_(safe[..., q0:q1, None]).exp_()
            received[..., k0:k1] += p.sum(-2)
            rows[..., q0:q1] += p.sum(-1)
    sink = _sink(a)
    if sink is not None:
        rows += torch.exp(sink - safe)
    return received, rows


def logits_at(a: AttentionInputs, b: Tensor, qi: Tensor, ki: Tensor) -> Float[Tensor, "n head"]:
    """The logits of :func:`logits_tile` at single ``(batch, q, k)`` entries, every head: ``O(d)`` each."""
    H = a.q.shape[1]
    kv_of_head = torch.arange(H, device=a.q.device) // (H // a.k.shape[1])
    s = (a.q[b, :, qi].float() * a.k[b, :, ki].float()[:, kv_of_head]).sum(-1) * a.scale
    if a.softcap is not None:
        s = torch.tanh(s / a.softcap) * a.softcap
    if a.bias_slopes is not None:
        s = s + a.bias_slopes.float().to(s.device)[None, :] * (ki - qi).float()[:, None]
    masked = torch.zeros_like(qi, dtype=torch.bool)
    if a.causal:
        masked |= ki > qi
    if a.window is not None:
        masked |= ki <= qi - a.window
    if a.key_mask is not None:
        masked |= ~a.key_mask.to(s.device)[b, ki]
    return s.masked_fill(masked[:, None], -math.inf)


def attention_gathered(
    a: AttentionInputs, lse: Float[Tensor, "batch head q"], pairs: Int[Tensor, "n 3"], chunk: int = GATHER_CHUNK
) -> Float[Tensor, "n head"]:
    """``A[b, h, q, k]`` for every head at each ``(b, q, k)`` row of ``pairs`` (0 where the key is hidden)."""
    out = torch.empty(pairs.shape[0], a.q.shape[1], device=a.q.device)
    lse = lse.float().to(a.q.device)
    for start in range(0, pairs.shape[0], chunk):
        b, qi, ki = pairs[start : start + chunk].to(a.q.device).unbind(-1)
        out[start : start + chunk] = torch.exp(logits_at(a, b, qi, ki) - lse[b, :, qi])
    return out


def logits_tile(
    a: AttentionInputs,
    q0: int,
    q1: int,
    k0: int,
    k1: int,
) -> Float[Tensor, "batch head bq bk"]:
    """The logits of queries ``q0:q1`` against keys ``k0:k1`` of every head, exactly as the model forms
    them before its softmax (see :class:`~interp.adapters.AttentionInputs` for the order): scale,
    softcap, ALiBi bias, and ``-inf`` at causal, windowed and padded keys. Float32.

    The reference for every pass: a pass that skips tiles (a window's band) or fuses the steps must
    equal this tile by tile. The sink logit is not a key and is not in the tile.
    """
    H, n_kv = a.q.shape[1], a.k.shape[1]
    kv_of_head = torch.arange(H, device=a.q.device) // (H // n_kv)
    q = a.q[:, :, q0:q1].float()
    k = a.k[:, :, k0:k1].float()[:, kv_of_head]
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * a.scale
    if a.softcap is not None:
        s = torch.tanh(s / a.softcap) * a.softcap
    qi = torch.arange(q0, q1, device=s.device)[:, None]
    ki = torch.arange(k0, k1, device=s.device)[None, :]
    if a.bias_slopes is not None:
        s = s + a.bias_slopes.float().to(s.device)[:, None, None] * (ki - qi).float()
    cut_causal = a.causal and k1 - 1 > q0  # some key right of some query's diagonal
    cut_window = a.window is not None and k0 <= q1 - 1 - a.window  # some key left of some band
    if cut_causal or cut_window:  # tiles wholly inside need no mask
        masked = torch.zeros(q1 - q0, k1 - k0, dtype=torch.bool, device=s.device)
        if a.causal:
            masked |= ki > qi
        if a.window is not None:
            masked |= ki <= qi - a.window
        s = s.masked_fill(masked, -math.inf)
    if a.key_mask is not None:
        s = s.masked_fill(~a.key_mask[:, None, None, k0:k1].to(s.device), -math.inf)
    return s


def row_argmax(
    a: AttentionInputs,
    q0: int,
    q1: int,
    *,
    block: int = BLOCK,
    on_tile: Callable[[int, Tensor], None] | None = None,
) -> tuple[Float[Tensor, "batch head bq"], Int[Tensor, "batch head bq"]]:
    """``(largest logit, its key)`` of queries ``q0:q1`` of every head, over key tiles of
    :func:`logits_tile`: a running ``(max, argmax)`` with ties to the lowest key (as ``torch.argmax``
    of the pattern). Tiles wholly masked by causality or the window are skipped. ``on_tile(k0, s)``
    sees each tile (``[batch, head, q1 - q0, bk]``), e.g. to read the logits at known targets.
    Memory: one ``(q1 - q0) x block`` tile per head.
    """
    T = a.k.shape[2]
    best = a.q.new_full((a.q.shape[0], a.q.shape[1], q1 - q0), -math.inf, dtype=torch.float32)
    arg = torch.zeros(best.shape, dtype=torch.long, device=best.device)
    first = 0 if a.window is None else max(0, q0 - a.window + 1) // block * block
    for k0 in range(first, key_end(q1, T, a.causal), block):
        s = logits_tile(a, q0, q1, k0, min(k0 + block, T))
        if on_tile is not None:
            on_tile(k0, s)
        top = s.argmax(-1)  # the first of equal maxima: the lowest key of the tile
        value = s.gather(-1, top[..., None])[..., 0]
        better = value > best  # strictly: an equal maximum in a later tile keeps the earlier key
        best = torch.where(better, value, best)
        arg = torch.where(better, top + k0, arg)
    return best, arg


__all__ = [
    "BLOCK",
    "RowStats",
    "attention_column_sums",
    "attention_gathered",
    "attention_output",
    "attention_row_stats",
    "column_sums",
    "gathered_weights",
    "key_range",
    "logits_at",
    "logits_tile",
    "own_attention",
    "reused_row_stats",
    "reusing_row_stats",
    "row_argmax",
    "row_stats",
]
