"""The kernel layer: the online-softmax reference and the one place that knows about Triton.

Both users of flash-style attention build on this module: the toy's flash path
(:mod:`interp.toy.flash`, output and log-sum-exp) and the stream engine's passes
(:mod:`interp.stream.blockwise` and :mod:`interp.stream.triton`, log-sum-exp and row maxima
without the values).

- :func:`online_softmax`: the reference in plain torch. Queries are cut into blocks; for each we
  walk the key blocks keeping a running max ``m`` and a running sum ``l`` of ``exp(s - m)`` (and,
  given values, an accumulator of ``exp(s - m) v``). When a key block raises the max, what was
  summed so far is rescaled by ``exp(old m - new m)``. At the end ``lse = m + log(l)`` and
  ``out = acc / l``. :func:`score_tile` is the one tile of scores every blockwise loop uses.
- the Triton guard: ``triton``/``tl`` are ``None`` and :data:`HAS_TRITON` is False when Triton is
  not installed (or hidden, as ``sys.modules["triton"] = None`` does); :func:`require_triton`
  raises the one install hint.
- the interpreter: with ``TRITON_INTERPRET=1`` set before triton is imported, kernels run on CPU
  tensors (slow; for tests at small sizes), see :func:`interpreting`.
- the launch policy: :func:`use_triton` says when the ``"auto"`` paths take a Triton kernel (CUDA
  tensors, Triton installed, a supported head size); :func:`check_launch` refuses a launch the
  kernels cannot run.

Layout: ``[batch, head, pos, d_head]`` as torch's ``scaled_dot_product_attention``; grouped K/V by
head index (query head ``h`` reads key head ``h // (head / kv_head)``), never copied.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is an optional extra
    triton = None
    tl = None

HAS_TRITON = triton is not None
D_HEAD_RANGE = (16, 128)  # head sizes the Triton kernels are written for
LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------------------------
# Triton: import guard, interpreter, launch policy


def require_triton(what: str) -> None:
    """Raise the one install hint when Triton is missing (``what`` names the caller)."""
    if not HAS_TRITON:
        raise ImportError(
            f"{what} needs Triton, which is not installed: pip install triton (the 'gpu' extra of interp)"
        )


def interpreting() -> bool:
    """Triton's interpreter runs kernels on CPU tensors; it must be chosen before triton is imported."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def supported_head(d_head: int) -> bool:
    lo, hi = D_HEAD_RANGE
    return lo <= d_head <= hi


def use_triton(q: Tensor) -> bool:
    """The ``"auto"`` launch policy: a Triton kernel for CUDA tensors of a supported head size."""
    return HAS_TRITON and q.is_cuda and supported_head(q.shape[-1])


def check_launch(q: Tensor, what: str) -> None:
    """Refuse a launch the kernels cannot run: no Triton, an unsupported head size, or CPU tensors
    outside the interpreter."""
    require_triton(what)
    if not supported_head(q.shape[-1]):
        raise ValueError(f"the Triton kernels support d_head {D_HEAD_RANGE[0]}..{D_HEAD_RANGE[1]}, got {q.shape[-1]}")
    if q.device.type == "cpu" and not interpreting():
        raise RuntimeError(
            "the Triton kernels run on CPU tensors only under Triton's interpreter: "
            "set TRITON_INTERPRET=1 in the environment before triton is imported"
        )


def block_d(d_head: int) -> int:
    """``d_head`` rounded up to the power of two a kernel tile spans (at least 16)."""
    return max(16, triton.next_power_of_2(d_head))


def dot_precision(dtype: torch.dtype) -> str | None:
    """``"ieee"`` keeps fp32 dots exact where ``tl.dot`` would use tf32."""
    return "ieee" if dtype == torch.float32 else None


# --------------------------------------------------------------------------------------------
# the online-softmax reference in torch


def grouped(q: Float[Tensor, "batch head pos d"], n_kv_heads: int) -> Float[Tensor, "batch kv group pos d"]:
    """``q`` as ``[batch, kv_head, group, pos, d]``: each group of query heads meets its key head (a view)."""
    return rearrange(q, "b (kv g) p d -> b kv g p d", kv=n_kv_heads)


def ungrouped(t: Tensor) -> Tensor:
    """Undo :func:`grouped` on any per-head tensor ``[batch, kv, group, ...]``."""
    return rearrange(t, "b kv g ... -> b (kv g) ...")


def causal_mask(q0: int, q1: int, k0: int, k1: int, device: torch.device) -> Tensor:
    """True where key position > query position, for the block ``[q0, q1) x [k0, k1)``."""
    q_pos = torch.arange(q0, q1, device=device)
    k_pos = torch.arange(k0, k1, device=device)
    return k_pos[None, :] > q_pos[:, None]


def score_tile(
    q_blk: Float[Tensor, "batch kv group bq d"],
    k_blk: Float[Tensor, "batch kv bk d"],
    q0: int,
    k0: int,
    causal: bool,
    scale: float,
) -> Float[Tensor, "batch kv group bq bk"]:
    """``q k^T * scale`` of a query block against a key block, ``-inf`` right of the causal diagonal."""
    s = torch.einsum("bhgqd,bhkd->bhgqk", q_blk, k_blk) * scale
    k1 = k0 + s.shape[-1]
    if causal and k1 > q0 + 1:  # the tile reaches right of the diagonal
        s = s.masked_fill(causal_mask(q0, q0 + s.shape[-2], k0, k1, s.device), -math.inf)
    return s


def key_end(q1: int, n_keys: int, causal: bool) -> int:
    """Where a query block ending at ``q1`` stops reading keys (causal: right of it all is masked)."""
    return min(q1, n_keys) if causal else n_keys


@dataclass
class OnlineSoftmax:
    """Per query row of each head: what an online-softmax pass knows at its end."""

    lse: Float[Tensor, "batch head q"]  # log sum_k exp(s_qk)
    max: Float[Tensor, "batch head q"]  # max_k s_qk
    max_rest: Float[Tensor, "batch head q"] | None = None  # max_{k >= 1} s_qk (-inf if only key 0); if asked
    out: Float[Tensor, "batch head q d_head"] | None = None  # sum_k softmax(s)_qk v_k, fp32; given values


def online_softmax(
    q: Float[Tensor, "batch head q_pos d_head"],
    k: Float[Tensor, "batch kv_head k_pos d_head"],
    v: Float[Tensor, "batch kv_head k_pos d_head"] | None = None,
    *,
    causal: bool,
    scale: float,
    block: int,
    rest: bool = False,
) -> OnlineSoftmax:
    """The flash forward in fp32 torch, one ``block x block`` tile of scores at a time.

    Always the log-sum-exp and row max; ``out`` when ``v`` is given; ``max_rest`` (the row max over
    keys ``>= 1``) when ``rest``. Memory beyond the inputs is ``O(pos x block)`` per head.
    """
    n_q, n_k = q.shape[2], k.shape[2]
    qg, k = grouped(q.float(), k.shape[1]), k.float()
    v = None if v is None else v.float()
    lse, mx = qg.new_empty(qg.shape[:-1]), qg.new_empty(qg.shape[:-1])
    mx_rest = qg.new_empty(qg.shape[:-1]) if rest else None
    out = torch.empty_like(qg) if v is not None else None
    for q0 in range(0, n_q, block):
        q1 = min(q0 + block, n_q)
        q_blk = qg[..., q0:q1, :]
        m = q_blk.new_full(q_blk.shape[:-1], -math.inf)  # running max of the scores, per row
        m_rest = m.clone()
        l = q_blk.new_zeros(q_blk.shape[:-1])  # running sum of exp(s - m)
        acc = torch.zeros_like(q_blk) if v is not None else None  # running sum of exp(s - m) v
        for k0 in range(0, key_end(q1, n_k, causal), block):
            k1 = min(k0 + block, n_k)
            s = score_tile(q_blk, k[:, :, k0:k1], q0, k0, causal, scale)
            tile_max = s.amax(-1)
            if rest and k0 > 0:
                m_rest = torch.maximum(m_rest, tile_max)
            elif rest and s.shape[-1] > 1:
                m_rest = torch.maximum(m_rest, s[..., 1:].amax(-1))
            m_new = torch.maximum(m, tile_max)  # finite from the first tile on: key 0 is seen
            alpha = torch.exp(m - m_new)  # rescales everything summed under the old max
            p = s.sub_(m_new[..., None]).exp_()  # in place: s is spent
            l = l * alpha + p.sum(-1)
            if acc is not None:
                acc = acc * alpha[..., None] + torch.einsum("bhgqk,bhkd->bhgqd", p, v[:, :, k0:k1])
            m = m_new
        lse[..., q0:q1] = m + torch.log(l)
        mx[..., q0:q1] = m
        if mx_rest is not None:
            mx_rest[..., q0:q1] = m_rest
        if out is not None:
            out[..., q0:q1, :] = acc / l[..., None]
    return OnlineSoftmax(
        lse=ungrouped(lse),
        max=ungrouped(mx),
        max_rest=None if mx_rest is None else ungrouped(mx_rest),
        out=None if out is None else ungrouped(out),
    )


__all__ = [
    "D_HEAD_RANGE",
    "HAS_TRITON",
    "LN2",
    "LOG2E",
    "OnlineSoftmax",
    "block_d",
    "causal_mask",
    "check_launch",
    "dot_precision",
    "grouped",
    "interpreting",
    "key_end",
    "online_softmax",
    "require_triton",
    "score_tile",
    "supported_head",
    "tl",
    "triton",
    "use_triton",
]
