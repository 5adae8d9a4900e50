"""The stream engine's two passes as Triton kernels, for CUDA tensors.

The flash forward of :mod:`interp.toy.flash` keeps a running max and sum per query row; the stream
engine needs what that loop knows without the values: :func:`triton_row_stats` returns per row the
log-sum-exp, the largest score and the largest score over keys ``>= 1``. :func:`triton_column_sums`
is the second pass: one program per (key block, batch, query head) walks the query blocks that see
its keys and sums ``exp(s - lse)`` down each column, so every key's received mass comes out without
atomics. Both compute in base 2 (``exp2``), like the flash kernel, and run under Triton's
interpreter on CPU tensors when ``TRITON_INTERPRET=1`` was set before triton was imported (tests);
fp32 or fp16 inputs, d_head 16..128, grouped K/V by head index. The Triton guard, the interpreter
and the launch checks are :mod:`interp.kernels`'.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from interp.kernels import HAS_TRITON, LOG2E, block_d, check_launch, dot_precision, interpreting, tl, triton
from interp.stream.blockwise import RowStats

if HAS_TRITON:

    @triton.jit
    def _row_stats_kernel(
        Q, K, Lse, Max, MaxRest,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        n_heads, n, d_head, scale_log2,
        GROUP: tl.constexpr, CAUSAL: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        start_m = tl.program_id(0)
        batch = tl.program_id(1) // n_heads
        head = tl.program_id(1) % n_heads
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < d_head
        q = tl.load(
            Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
            mask=(offs_m[:, None] < n) & d_ok,
            other=0.0,
        )
        k_base = K + batch * stride_kb + (head // GROUP) * stride_kh + offs_d[None, :] * stride_kd
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max, base-2 units
        m_rest = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # ... over keys >= 1
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        hi = n
        if CAUSAL:
            hi = tl.minimum((start_m + 1) * BLOCK_M, n)
        for start_n in range(0, hi, BLOCK_N):
            keys = start_n + offs_n
            k = tl.load(k_base + keys[:, None] * stride_kn, mask=(keys[:, None] < n) & d_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
            visible = keys[None, :] < n
            if CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None])
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            l_i = l_i * tl.math.exp2(m_i - m_new) + tl.sum(tl.math.exp2(s - m_new[:, None]), 1)
            m_i = m_new
            m_rest = tl.maximum(m_rest, tl.max(tl.where(keys[None, :] >= 1, s, float("-inf")), 1))
        row = (batch * n_heads + head) * n + offs_m
        ok = offs_m < n
        tl.store(Lse + row, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=ok)
        tl.store(Max + row, m_i * 0.6931471805599453, mask=ok)
        tl.store(MaxRest + row, m_rest * 0.6931471805599453, mask=ok)

    @triton.jit
    def _column_sums_kernel(
        Q, K, Lse, Received,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        n_heads, n, d_head, scale_log2,
        GROUP: tl.constexpr, CAUSAL: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        start_n = tl.program_id(0) * BLOCK_N
        batch = tl.program_id(1) // n_heads
        head = tl.program_id(1) % n_heads
        keys = start_n + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < d_head
        k = tl.load(
            K
            + batch * stride_kb
            + (head // GROUP) * stride_kh
            + keys[:, None] * stride_kn
            + offs_d[None, :] * stride_kd,
            mask=(keys[:, None] < n) & d_ok,
            other=0.0,
        )
        q_base = Q + batch * stride_qb + head * stride_qh + offs_d[None, :] * stride_qd
        lse_base = Lse + (batch * n_heads + head) * n
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        lo = 0
        if CAUSAL:  # queries above this key block cannot see it
            lo = (start_n // BLOCK_M) * BLOCK_M
        for start_m in range(lo, n, BLOCK_M):
            rows = start_m + offs_m
            q = tl.load(q_base + rows[:, None] * stride_qn, mask=(rows[:, None] < n) & d_ok, other=0.0)
            lse2 = tl.load(lse_base + rows, mask=rows < n, other=0.0) * 1.4426950408889634
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
            visible = (rows[:, None] < n) & (keys[None, :] < n)
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None])
            p = tl.where(visible, tl.math.exp2(s - lse2[:, None]), 0.0)
            acc += tl.sum(p, 0)
        tl.store(Received + (batch * n_heads + head) * n + keys, acc, mask=keys < n)


def _launch_args(q: Tensor, k: Tensor, causal: bool) -> dict:
    check_launch(q, "the stream engine's Triton kernels")
    if q.ndim != 4 or k.ndim != 4 or q.shape[1] % k.shape[1] or q.shape[2] != k.shape[2]:
        raise ValueError(f"expected q [batch, head, pos, d] and k [batch, kv_head, pos, d]; got {q.shape}, {k.shape}")
    block = 16 if interpreting() else 64
    return dict(
        GROUP=q.shape[1] // k.shape[1],
        CAUSAL=causal,
        BLOCK_M=block,
        BLOCK_N=block,
        BLOCK_D=block_d(q.shape[-1]),
        DOT_PRECISION=dot_precision(q.dtype),
    )


def triton_row_stats(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    scale: float,
    causal: bool,
) -> RowStats:
    """:func:`interp.stream.blockwise.row_stats` as one Triton kernel launch."""
    meta = _launch_args(q, k, causal)
    k = k.to(q.dtype)
    B, H, T, d = q.shape
    lse, mx, rest = (torch.empty(B, H, T, device=q.device, dtype=torch.float32) for _ in range(3))
    grid = (triton.cdiv(T, meta["BLOCK_M"]), B * H)
    _row_stats_kernel[grid](q, k, lse, mx, rest, *q.stride(), *k.stride(), H, T, d, scale * LOG2E, **meta)
    return RowStats(lse=lse, max=mx, max_rest=rest)


def triton_column_sums(
    q: Float[Tensor, "batch head pos d_head"],
    k: Float[Tensor, "batch kv_head pos d_head"],
    lse: Float[Tensor, "batch head pos"],
    scale: float,
    causal: bool,
) -> Float[Tensor, "batch head k"]:
    """Every key's received mass ``sum_q exp(s_qk - lse_q)``, one program per key block and head."""
    meta = _launch_args(q, k, causal)
    k = k.to(q.dtype)
    B, H, T, d = q.shape
    received = torch.empty(B, H, T, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(T, meta["BLOCK_N"]), B * H)
    _column_sums_kernel[grid](
        q, k, lse.float().contiguous(), received, *q.stride(), *k.stride(), H, T, d, scale * LOG2E, **meta
    )
    return received
