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

Shapes follow torch's ``scaled_dot_product_attention``: ``q`` is ``[batch, head, pos, d_head]``,
``k`` is ``[batch, kv_head, pos, d_head]``; query head ``h`` reads key head ``h // (head / kv_head)``
(grouped-query attention by index, as ``repeat_interleave`` would lay it out). Everything is
computed in float32. The tiles are ``block x block`` per head (``block`` 512: 1 MiB per head). The
row pass is the online-softmax reference of :mod:`interp.kernels` without the values; the column
pass reuses its score tile.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters.base import AttentionInputs
from interp.kernels import OnlineSoftmax, grouped, key_end, online_softmax, score_tile, ungrouped

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
    """Log-sum-exp, row max and row max over keys ``>= 1`` of every query row, by online softmax."""
    return online_softmax(q, k, causal=causal, scale=scale, block=block, rest=True)


def column_sums(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    lse: Float[Tensor, "batch head pos"],
    scale: float,
    causal: bool,
    block: int = BLOCK,
) -> tuple[Float[Tensor, "batch head k"], Float[Tensor, "batch head q"]]:
    """``(sum_q A[q, k] per key, sum_k A[q, k] per row)`` from a blockwise pass over ``(q, k, lse)``."""
    T = q.shape[2]
    qg, k = grouped(q.float(), k.shape[1]), k.float()
    lse_g = grouped(lse.float()[..., None], k.shape[1])[..., 0]
    received = torch.zeros(*qg.shape[:3], k.shape[2], device=q.device)
    rows = torch.zeros(*qg.shape[:3], T, device=q.device)
    for q0 in range(0, T, block):
        q1 = min(q0 + block, T)
        for k0 in range(0, key_end(q1, k.shape[2], causal), block):
            s = score_tile(qg[..., q0:q1, :], k[:, :, k0 : k0 + block], q0, k0, causal, scale)
            p = s.sub_(lse_g[..., q0:q1, None]).exp_()  # in place: one tile of memory traffic less
            received[..., k0 : k0 + p.shape[-1]] += p.sum(-2)
            rows[..., q0:q1] += p.sum(-1)
    return ungrouped(received), ungrouped(rows)


def gathered_weights(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    lse: Float[Tensor, "batch head pos"],
    scale: float,
    pairs: Int[Tensor, "n 3"],
    chunk: int = GATHER_CHUNK,
) -> Float[Tensor, "n head"]:
    """``A[b, h, q, k]`` for every head at each ``(b, q, k)`` row of ``pairs``: gathered, ``O(d)`` each."""
    H, group = q.shape[1], q.shape[1] // k.shape[1]
    out = torch.empty(pairs.shape[0], H, device=q.device)
    kv_of_head = torch.arange(H, device=q.device) // group
    for start in range(0, pairs.shape[0], chunk):
        b, qi, ki = pairs[start : start + chunk].to(q.device).unbind(-1)
        qq = q[b, :, qi].float()  # [n, head, d]
        kk = k[b, :, ki].float()[:, kv_of_head]  # [n, head, d]
        s = (qq * kk).sum(-1) * scale
        out[start : start + chunk] = torch.exp(s - lse[b, :, qi])
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


__all__ = ["BLOCK", "RowStats", "column_sums", "gathered_weights", "logits_tile", "row_argmax", "row_stats"]
