"""The flash path: attention without ever storing the n x n pattern.

Two forward implementations of the same algorithm, and one backward they share:

* `blockwise_attention` -- the online softmax in plain torch (`interp.kernels.online_softmax`, the
  one reference the stream engine's row pass shares), written to be read. Queries are cut
  into blocks; for each query block we walk over the key blocks keeping a running max `m`, a
  running sum `l` and an output accumulator `acc`. When a new key block raises the max, what we
  have summed so far was scaled by exp(-old max) and must be rescaled by exp(old max - new max).
  At the end `out = acc / l` and the log-sum-exp of each query row is `m + log(l)`.
* `triton_attention` -- the same loop as a Triton kernel, one program per (query block, batch,
  query head). On CUDA tensors it is compiled; with TRITON_INTERPRET=1 in the environment before
  triton is imported, it runs on CPU tensors under Triton's interpreter (slow, for tests at small
  sizes), with a pinned block config instead of autotuning.

Backward (both): recompute in torch from the saved log-sum-exp, blockwise. With the row's
log-sum-exp `lse`, each probability block is exactly `exp(q k^T * scale - lse)`, so we never need
the pattern from the forward pass, and memory stays O(n * block) besides the gradients. We chose
this over a Triton backward kernel: it is one readable function that serves both forwards, and
the attention backward is not where this package spends its time.

Layout everywhere in this module is the one `torch.nn.functional.scaled_dot_product_attention`
uses: `[batch, head, pos, d_head]`. Grouped-query attention (n_kv_heads < n_heads) maps query
head `h` to key/value head `h // (n_heads // n_kv_heads)` -- the same grouping as SDPA's
`enable_gqa` -- by indexing, never by copying keys and values per query head. Causal attention
requires as many queries as keys (no KV-cache offset).

Triton is optional (`pip install -e .[gpu]`): without it this module imports fine and
`triton_attention` raises. The import guard, the interpreter and the launch policy live in
`interp.kernels`.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from interp.kernels import (
    HAS_TRITON,
    LOG2E,
    block_d,
    check_launch,
    dot_precision,
    interpreting,
    online_softmax,
    score_tile,
    tl,
    triton,
    use_triton,
)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[int, int]:
    """Validate [batch, head, pos, d_head] inputs; return (n_kv_heads, group size)."""
    if q.ndim != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"expected q, k, v as [batch, head, pos, d_head]; got {q.shape=}, {k.shape=}, {v.shape=}")
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError("causal attention here needs as many queries as keys")
    return n_kv_heads, n_heads // n_kv_heads


# ---------------------------------------------------------------------------------------------
# (a) blockwise online softmax in torch
# ---------------------------------------------------------------------------------------------


def _blockwise_forward(
    q: Float[Tensor, "batch head q_pos d_head"],
    k: Float[Tensor, "batch kv_head k_pos d_head"],
    v: Float[Tensor, "batch kv_head k_pos d_head"],
    causal: bool,
    scale: float,
    block_size: int,
) -> tuple[Float[Tensor, "batch head q_pos d_head"], Float[Tensor, "batch head q_pos"]]:
    """The online softmax of :func:`interp.kernels.online_softmax`, with the values: (out fp32, lse)."""
    _check_shapes(q, k, v, causal)
    result = online_softmax(q, k, v, causal=causal, scale=scale, block=block_size)
    return result.out, result.lse


def _blockwise_backward(
    q: Float[Tensor, "batch head q_pos d_head"],
    k: Float[Tensor, "batch kv_head k_pos d_head"],
    v: Float[Tensor, "batch kv_head k_pos d_head"],
    out: Float[Tensor, "batch head q_pos d_head"],
    lse: Float[Tensor, "batch head q_pos"],
    d_out: Float[Tensor, "batch head q_pos d_head"],
    causal: bool,
    scale: float,
    block_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of softmax(q k^T * scale) v, recomputing each probability block from `lse`.

    With P the probabilities, dP = dO V^T and, per row, D = sum(dO * O) = sum(P * dP):
        dV = P^T dO,   dS = P * (dP - D),   dQ = dS K * scale,   dK = dS^T Q * scale.
    A key/value head's gradient sums over all the query heads of its group.
    """
    n_kv_heads, group = _check_shapes(q, k, v, causal)
    n_q, n_k = q.shape[2], k.shape[2]
    split = lambda t: rearrange(t, "b (kv g) ... -> b kv g ...", g=group).float()  # noqa: E731
    q_, out_, d_out_, lse_ = split(q), split(out), split(d_out), split(lse)
    k_, v_ = k.float(), v.float()
    D = (d_out_ * out_).sum(dim=-1)
    dq = torch.zeros_like(q_)
    dk = torch.zeros_like(k_)
    dv = torch.zeros_like(v_)

    for k0 in range(0, n_k, block_size):
        k1 = min(k0 + block_size, n_k)
        k_blk, v_blk = k_[:, :, k0:k1], v_[:, :, k0:k1]
        q_start = k0 if causal else 0  # causal: earlier queries see none of this key block
        for q0 in range(q_start, n_q, block_size):
            q1 = min(q0 + block_size, n_q)
            q_blk, do_blk = q_[..., q0:q1, :], d_out_[..., q0:q1, :]
            s = score_tile(q_blk, k_blk, q0, k0, causal, scale)
            p = torch.exp(s - lse_[..., q0:q1, None])
            dv[:, :, k0:k1] += torch.einsum("bhgqk,bhgqd->bhkd", p, do_blk)
            dp = torch.einsum("bhgqd,bhkd->bhgqk", do_blk, v_blk)
            ds = p * (dp - D[..., q0:q1, None])
            dq[..., q0:q1, :] += torch.einsum("bhgqk,bhkd->bhgqd", ds, k_blk) * scale
            dk[:, :, k0:k1] += torch.einsum("bhgqk,bhgqd->bhkd", ds, q_blk) * scale

    dq = rearrange(dq, "b kv g n d -> b (kv g) n d")
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _FlashFunction(torch.autograd.Function):
    """Forward by `forward_impl` (blockwise torch or Triton); backward recomputes from lse."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, block_size, forward_impl):
        out, lse = forward_impl(q, k, v, causal, scale)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.block_size = causal, scale, block_size
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _blockwise_backward(q, k, v, out, lse, d_out, ctx.causal, ctx.scale, ctx.block_size)
        return dq, dk, dv, None, None, None, None


def blockwise_attention(
    q: Float[Tensor, "batch head q_pos d_head"],
    k: Float[Tensor, "batch kv_head k_pos d_head"],
    v: Float[Tensor, "batch kv_head k_pos d_head"],
    causal: bool = False,
    scale: float | None = None,
    block_size: int = 64,
) -> tuple[Float[Tensor, "batch head q_pos d_head"], Float[Tensor, "batch head q_pos"]]:
    """Attention by online softmax over key blocks; returns (output, log-sum-exp per query row).

    Computes in fp32 and returns the output in the input dtype; the log-sum-exp is fp32.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    forward = partial(_blockwise_forward, block_size=block_size)
    return _FlashFunction.apply(q, k, v, causal, scale, block_size, forward)


# ---------------------------------------------------------------------------------------------
# (b) the Triton kernel
# ---------------------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def _flash_fwd_kernel(
        Q, K, V, Out, Lse,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        stride_vb, stride_vh, stride_vn, stride_vd,
        stride_ob, stride_oh, stride_on, stride_od,
        n_heads, n_q, n_k, d_head, scale_log2,
        GROUP: tl.constexpr,  # query heads per key/value head
        CAUSAL: tl.constexpr,
        BLOCK_M: tl.constexpr,  # queries per program
        BLOCK_N: tl.constexpr,  # keys per loop step
        BLOCK_D: tl.constexpr,  # d_head rounded up to a power of two
        DOT_PRECISION: tl.constexpr,  # "ieee" keeps fp32 exact where tl.dot would use tf32
    ):  # fmt: skip
        start_m = tl.program_id(0)
        batch = tl.program_id(1) // n_heads
        head = tl.program_id(1) % n_heads
        kv_head = head // GROUP  # GQA: the key/value head is found by index, never copied

        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < d_head

        q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & d_ok, other=0.0)
        k_base = K + batch * stride_kb + kv_head * stride_kh + offs_d[None, :] * stride_kd
        v_base = V + batch * stride_vb + kv_head * stride_vh + offs_d[None, :] * stride_vd

        # The online softmax, in base 2 (exp2 is the fast instruction): s2 = q.k * scale * log2(e).
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of 2^(s2 - m_i)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running sum of 2^(s2 - m_i) v

        hi = n_k
        if CAUSAL:  # key blocks right of the diagonal are fully masked: skip them
            hi = tl.minimum((start_m + 1) * BLOCK_M, n_k)
        for start_n in range(0, hi, BLOCK_N):
            keys = start_n + offs_n
            kv_ok = (keys[:, None] < n_k) & d_ok
            k = tl.load(k_base + keys[:, None] * stride_kn, mask=kv_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
            visible = keys[None, :] < n_k
            if CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.math.exp2(m_i - m_new)  # rescales what was summed under the old max
            p = tl.math.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + keys[:, None] * stride_vn, mask=kv_ok, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new

        out = acc / l_i[:, None]
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # back to natural log: * ln(2)
        o_ptrs = Out + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < n_q) & d_ok)
        tl.store(Lse + (batch * n_heads + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def _block_config(d_head: int, dtype: torch.dtype, interpret: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): pinned, no autotuning.

    The interpreter runs one program at a time in numpy, so small blocks keep tests quick. On a
    GPU, fp16 128 x 64 tiles are the usual sweet spot (64 x 64 past d_head 64, to fit shared
    memory); fp32 tiles take twice the bytes, so they get fewer pipeline stages.
    """
    if interpret:
        return 16, 16, 1, 1
    if dtype == torch.float32:
        return (64, 64, 4, 2) if d_head <= 64 else (64, 32, 4, 2)
    return (128, 64, 8, 3) if d_head <= 64 else (64, 64, 4, 3)


def _triton_forward(q, k, v, causal, scale, block_size):
    check_launch(q, "triton_attention")
    n_kv_heads, group = _check_shapes(q, k, v, causal)
    b, n_heads, n_q, d_head = q.shape
    if q.dtype not in (torch.float16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"the Triton kernel takes fp16 or fp32 q, k, v of one dtype, got {q.dtype}")
    interpret = interpreting()
    block_m, block_n, num_warps, num_stages = _block_config(d_head, q.dtype, interpret)
    if block_size is not None and interpret:
        block_m = block_n = block_size
    out = torch.empty_like(q)
    lse = torch.empty((b, n_heads, n_q), device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(n_q, block_m), b * n_heads)
    _flash_fwd_kernel[grid](
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        n_heads, n_q, k.shape[2], d_head, scale * LOG2E,
        GROUP=group, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=block_d(d_head), DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out, lse


def triton_attention(
    q: Float[Tensor, "batch head q_pos d_head"],
    k: Float[Tensor, "batch kv_head k_pos d_head"],
    v: Float[Tensor, "batch kv_head k_pos d_head"],
    causal: bool = False,
    scale: float | None = None,
    block_size: int | None = None,
) -> tuple[Float[Tensor, "batch head q_pos d_head"], Float[Tensor, "batch head q_pos"]]:
    """Attention by our Triton kernel; returns (output, log-sum-exp per query row, fp32).

    CUDA tensors run the compiled kernel; CPU tensors run it under Triton's interpreter, which
    needs TRITON_INTERPRET=1 set before triton is imported (set `block_size` to pin the
    interpreter's tile, default 16). fp16 or fp32, d_head 16..128, causal or not,
    GQA by head index. The backward recomputes blockwise in torch from the saved log-sum-exp
    (`block_size` there defaults to 64).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    forward = partial(_triton_forward, block_size=block_size)
    return _FlashFunction.apply(q, k, v, causal, scale, block_size or 64, forward)


def flash_attention(
    q: Float[Tensor, "batch head q_pos d_head"],
    k: Float[Tensor, "batch kv_head k_pos d_head"],
    v: Float[Tensor, "batch kv_head k_pos d_head"],
    causal: bool = False,
    scale: float | None = None,
    impl: str = "auto",
) -> tuple[Float[Tensor, "batch head q_pos d_head"], Float[Tensor, "batch head q_pos"]]:
    """The flash path as the toy model calls it: (output, log-sum-exp).

    impl: "triton", "blockwise", or "auto" = Triton where :func:`interp.kernels.use_triton` says
    (CUDA tensors, Triton installed, d_head 16..128), else the blockwise torch version. "sdpa" hands the work to torch's fused kernel instead (no
    pattern stored either; the fastest choice on CPU, used to train the toy) and returns no
    log-sum-exp (None).
    """
    if impl == "auto":
        impl = "triton" if use_triton(q) else "blockwise"
    if impl == "triton":
        return triton_attention(q, k, v, causal, scale)
    if impl == "blockwise":
        return blockwise_attention(q, k, v, causal, scale)
    if impl == "sdpa":
        group = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=group), None
    raise ValueError(f"unknown flash impl {impl!r}: use 'auto', 'triton', 'blockwise' or 'sdpa'")
