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
computed in float32. The tiles are ``block x block`` per head (``block`` 512: 1 MiB per head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor

BLOCK = 512
GATHER_CHUNK = 1 << 16


@dataclass
class RowStats:
    """Per query row of each head: what the flash forward keeps."""

    lse: Float[Tensor, "batch head q"]  # log sum_k exp(s_qk)
    max: Float[Tensor, "batch head q"]  # max_k s_qk
    max_rest: Float[Tensor, "batch head q"]  # max_{k >= 1} s_qk (-inf when the row sees only key 0)


def _grouped(q: Float[Tensor, "batch head pos d"], k: Float[Tensor, "batch kv pos d"]) -> Tensor:
    """``q`` as ``[batch, kv_head, group, pos, d]``, so each group of query heads meets its key head."""
    return rearrange(q, "b (kv g) p d -> b kv g p d", kv=k.shape[1])


def _tile(
    qg: Float[Tensor, "batch kv group bq d"],
    k_blk: Float[Tensor, "batch kv bk d"],
    q0: int,
    k0: int,
    causal: bool,
) -> Float[Tensor, "batch kv group bq bk"]:
    """Scores of a query block against a key block (``q`` already scaled), -inf where masked."""
    s = torch.einsum("bvgqd,bvkd->bvgqk", qg, k_blk)
    if causal and k0 + s.shape[-1] - 1 > q0:  # the tile reaches right of the diagonal
        rows = torch.arange(q0, q0 + s.shape[-2], device=s.device)
        cols = torch.arange(k0, k0 + s.shape[-1], device=s.device)
        s = s.masked_fill(cols[None, :] > rows[:, None], -math.inf)
    return s


def _key_end(q1: int, n_keys: int, causal: bool) -> int:
    return min(q1, n_keys) if causal else n_keys


def row_stats(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    scale: float,
    causal: bool,
    block: int = BLOCK,
) -> RowStats:
    """Log-sum-exp, row max and row max over keys ``>= 1`` of every query row, by online softmax."""
    B, H, T, _ = q.shape
    qg, k = _grouped(q.float() * scale, k), k.float()
    lse, mx, rest = (torch.empty(B, H, T, device=q.device) for _ in range(3))
    for q0 in range(0, T, block):
        q1 = min(q0 + block, T)
        qb = qg[..., q0:q1, :]
        m = torch.full(qb.shape[:-1], -math.inf, device=q.device)
        m_rest = m.clone()
        total = torch.zeros_like(m)
        for k0 in range(0, _key_end(q1, k.shape[2], causal), block):
            s = _tile(qb, k[:, :, k0 : k0 + block], q0, k0, causal)
            tile_max = s.amax(-1)
            if k0 > 0:
                m_rest = torch.maximum(m_rest, tile_max)
            elif s.shape[-1] > 1:
                m_rest = torch.maximum(m_rest, s[..., 1:].amax(-1))
            m_new = torch.maximum(m, tile_max)  # finite from the first tile on: key 0 is seen
            total = total * torch.exp(m - m_new) + s.sub_(m_new[..., None]).exp_().sum(-1)  # s is spent
            m = m_new
        flat = lambda t: rearrange(t, "b v g q -> b (v g) q")  # noqa: E731
        lse[..., q0:q1] = flat(m + torch.log(total))
        mx[..., q0:q1] = flat(m)
        rest[..., q0:q1] = flat(m_rest)
    return RowStats(lse=lse, max=mx, max_rest=rest)


def column_sums(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    lse: Float[Tensor, "batch head pos"],
    scale: float,
    causal: bool,
    block: int = BLOCK,
) -> tuple[Float[Tensor, "batch head k"], Float[Tensor, "batch head q"]]:
    """``(sum_q A[q, k] per key, sum_k A[q, k] per row)`` from a blockwise pass over ``(q, k, lse)``."""
    B, H, T, _ = q.shape
    qg, k = _grouped(q.float() * scale, k), k.float()
    lse_g = rearrange(lse.float(), "b (v g) q -> b v g q", v=k.shape[1])
    received = torch.zeros(*qg.shape[:3], k.shape[2], device=q.device)
    rows = torch.zeros(*qg.shape[:3], T, device=q.device)
    for q0 in range(0, T, block):
        q1 = min(q0 + block, T)
        for k0 in range(0, _key_end(q1, k.shape[2], causal), block):
            s = _tile(qg[..., q0:q1, :], k[:, :, k0 : k0 + block], q0, k0, causal)
            p = s.sub_(lse_g[..., q0:q1, None]).exp_()  # in place: one tile of memory traffic less
            received[..., k0 : k0 + p.shape[-1]] += p.sum(-2)
            rows[..., q0:q1] += p.sum(-1)
    flat = lambda t: rearrange(t, "b v g n -> b (v g) n")  # noqa: E731
    return flat(received), flat(rows)


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
