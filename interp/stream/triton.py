"""The stream engine's two passes as Triton kernels, for CUDA tensors.

The flash forward of :mod:`interp.toy.flash` keeps a running max and sum per query row; the stream
engine needs what that loop knows without the values: :func:`triton_row_stats` returns per row the
log-sum-exp, the largest score and the largest score over keys ``>= 1``. Both read one layer's
:class:`~interp.adapters.AttentionInputs` whole: a sliding window (key tiles outside the band are
never loaded), logit softcapping, ALiBi slopes, learned sink logits (in the log-sum-exp) and a key
mask, each a compile-time flag, so plain attention runs the same code as before. :func:`triton_column_sums`
is the second pass: one program per (key block, batch, query head) walks the query blocks that see
its keys and sums ``exp(s - lse)`` down each column, so every key's received mass comes out without
atomics. :func:`triton_row_argmax` is the row pass of a retrieval score at chosen query rows: the
largest logit and its key, ties to the lowest key. The first two compute in base 2 (``exp2``), like
the flash kernel (the argmax in natural units, like the torch tiles); all run under Triton's
interpreter on CPU tensors when ``TRITON_INTERPRET=1`` was set before triton was imported (tests);
fp32 or fp16 inputs, d_head 16..128, grouped K/V by head index. The Triton guard, the interpreter
and the launch checks are :mod:`interp.kernels`'.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters.base import AttentionInputs
from interp.kernels import HAS_TRITON, block_d, check_launch, dot_precision, interpreting, tl, triton
from interp.stream.blockwise import RowStats

if HAS_TRITON:

    @triton.jit
    def _tanh(x):
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)  # saturates to +-1 without inf / inf

    @triton.jit
    def _logits2(
        q, k, rows, keys, batch, n, slope, softcap, window, KeyMask,
        CAUSAL: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_WINDOW: tl.constexpr, HAS_KEY_MASK: tl.constexpr, scale, DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        """The tile of ``interp.stream.blockwise.logits_tile``, in base-2 units, -inf where hidden."""
        s = _logits(
            q, k, rows, keys, batch, n, slope, softcap, window, KeyMask,
            CAUSAL, HAS_SOFTCAP, HAS_BIAS, HAS_WINDOW, HAS_KEY_MASK, scale, DOT_PRECISION,
        )  # fmt: skip
        return s * 1.4426950408889634

    @triton.jit
    def _logits(
        q, k, rows, keys, batch, n, slope, softcap, window, KeyMask,
        CAUSAL: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_WINDOW: tl.constexpr, HAS_KEY_MASK: tl.constexpr, scale, DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        """The tile of ``interp.stream.blockwise.logits_tile`` (natural units), -inf where hidden."""
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
        if HAS_SOFTCAP:
            s = _tanh(s / softcap) * softcap
        if HAS_BIAS:
            s = s + slope * (keys[None, :] - rows[:, None]).to(tl.float32)
        visible = keys[None, :] < n
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None])
        if HAS_WINDOW:
            visible = visible & (keys[None, :] > rows[:, None] - window)
        if HAS_KEY_MASK:
            km = tl.load(KeyMask + batch * n + keys, mask=keys < n, other=0)
            visible = visible & (km[None, :] != 0)
        return tl.where(visible, s, float("-inf"))

    @triton.jit
    def _row_stats_kernel(
        Q, K, Lse, Max, MaxRest, Slopes, Sink, KeyMask,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        n_heads, n, d_head, scale, softcap, window,
        GROUP: tl.constexpr, CAUSAL: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_WINDOW: tl.constexpr,
        HAS_SINK: tl.constexpr, HAS_KEY_MASK: tl.constexpr,
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
        slope = 0.0
        if HAS_BIAS:
            slope = tl.load(Slopes + head)
        k_base = K + batch * stride_kb + (head // GROUP) * stride_kh + offs_d[None, :] * stride_kd
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max, base-2 units
        m_rest = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # ... over keys >= 1
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        lo = 0
        if HAS_WINDOW:  # tiles left of the band are never read: O(T x window)
            lo = (tl.maximum(start_m * BLOCK_M - window + 1, 0) // BLOCK_N) * BLOCK_N
        hi = n
        if CAUSAL:
            hi = tl.minimum((start_m + 1) * BLOCK_M, n)
        for start_n in range(lo, hi, BLOCK_N):
            keys = start_n + offs_n
            k = tl.load(k_base + keys[:, None] * stride_kn, mask=(keys[:, None] < n) & d_ok, other=0.0)
            s = _logits2(
                q, k, offs_m, keys, batch, n, slope, softcap, window, KeyMask,
                CAUSAL, HAS_SOFTCAP, HAS_BIAS, HAS_WINDOW, HAS_KEY_MASK, scale, DOT_PRECISION,
            )  # fmt: skip
            m_new = tl.maximum(m_i, tl.max(s, 1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing seen keeps l = 0
            l_i = l_i * tl.math.exp2(m_i - shift) + tl.sum(tl.math.exp2(s - shift[:, None]), 1)
            m_i = m_new
            m_rest = tl.maximum(m_rest, tl.max(tl.where(keys[None, :] >= 1, s, float("-inf")), 1))
        lse2 = tl.where(l_i > 0, m_i + tl.math.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        if HAS_SINK:  # the sink logit joins the denominator
            sink2 = tl.load(Sink + head) * 1.4426950408889634
            top = tl.maximum(lse2, sink2)
            lse2 = top + tl.math.log2(tl.math.exp2(lse2 - top) + tl.math.exp2(sink2 - top))
        lse2 = tl.where(lse2 == float("-inf"), 0.0, lse2)  # sees nothing: every weight 0
        row = (batch * n_heads + head) * n + offs_m
        ok = offs_m < n
        tl.store(Lse + row, lse2 * 0.6931471805599453, mask=ok)
        tl.store(Max + row, m_i * 0.6931471805599453, mask=ok)
        tl.store(MaxRest + row, m_rest * 0.6931471805599453, mask=ok)

    @triton.jit
    def _row_argmax_kernel(
        Q, K, Best, Arg, Slopes, KeyMask,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        n_heads, n, d_head, q0, q1, scale, softcap, window,
        GROUP: tl.constexpr, CAUSAL: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_WINDOW: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):  # fmt: skip
        first = q0 + tl.program_id(0) * BLOCK_M  # this program's rows: first .. first + BLOCK_M (< q1)
        batch = tl.program_id(1) // n_heads
        head = tl.program_id(1) % n_heads
        offs_m = first + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d[None, :] < d_head
        q = tl.load(
            Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd,
            mask=(offs_m[:, None] < q1) & d_ok,
            other=0.0,
        )
        slope = 0.0
        if HAS_BIAS:
            slope = tl.load(Slopes + head)
        k_base = K + batch * stride_kb + (head // GROUP) * stride_kh + offs_d[None, :] * stride_kd
        best = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        arg = tl.zeros([BLOCK_M], dtype=tl.int32)
        lo = 0
        if HAS_WINDOW:  # tiles left of the band are never read
            lo = (tl.maximum(first - window + 1, 0) // BLOCK_N) * BLOCK_N
        hi = n
        if CAUSAL:
            hi = tl.minimum(tl.minimum(first + BLOCK_M, q1), n)
        for start_n in range(lo, hi, BLOCK_N):
            keys = start_n + offs_n
            k = tl.load(k_base + keys[:, None] * stride_kn, mask=(keys[:, None] < n) & d_ok, other=0.0)
            s = _logits(
                q, k, offs_m, keys, batch, n, slope, softcap, window, KeyMask,
                CAUSAL, HAS_SOFTCAP, HAS_BIAS, HAS_WINDOW, HAS_KEY_MASK, scale, DOT_PRECISION,
            )  # fmt: skip
            top = tl.max(s, 1)
            # the first maximal key of the tile: ties go to the lowest index
            at = tl.min(tl.where(s == top[:, None], keys[None, :], 2147483647), 1)
            better = top > best  # strictly: an equal maximum in a later tile keeps the earlier key
            best = tl.where(better, top, best)
            arg = tl.where(better, at, arg)
        out = (batch * n_heads + head) * (q1 - q0) + offs_m - q0
        ok = offs_m < q1
        tl.store(Best + out, best, mask=ok)
        tl.store(Arg + out, arg.to(tl.int64), mask=ok)

    @triton.jit
    def _column_sums_kernel(
        Q, K, Lse, Received, Slopes, KeyMask,
        stride_qb, stride_qh, stride_qn, stride_qd,
        stride_kb, stride_kh, stride_kn, stride_kd,
        n_heads, n, d_head, scale, softcap, window,
        GROUP: tl.constexpr, CAUSAL: tl.constexpr,
        HAS_SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_WINDOW: tl.constexpr,
        HAS_KEY_MASK: tl.constexpr,
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
        slope = 0.0
        if HAS_BIAS:
            slope = tl.load(Slopes + head)
        q_base = Q + batch * stride_qb + head * stride_qh + offs_d[None, :] * stride_qd
        lse_base = Lse + (batch * n_heads + head) * n
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        lo = 0
        if CAUSAL:  # queries above this key block cannot see it
            lo = (start_n // BLOCK_M) * BLOCK_M
        hi = n
        if HAS_WINDOW:  # queries past the band of this key block cannot see it
            hi = tl.minimum(start_n + BLOCK_N + window - 1, n)
        for start_m in range(lo, hi, BLOCK_M):
            rows = start_m + offs_m
            q = tl.load(q_base + rows[:, None] * stride_qn, mask=(rows[:, None] < n) & d_ok, other=0.0)
            lse2 = tl.load(lse_base + rows, mask=rows < n, other=0.0) * 1.4426950408889634
            s = _logits2(
                q, k, rows, keys, batch, n, slope, softcap, window, KeyMask,
                CAUSAL, HAS_SOFTCAP, HAS_BIAS, HAS_WINDOW, HAS_KEY_MASK, scale, DOT_PRECISION,
            )  # fmt: skip
            live = rows < n
            if HAS_KEY_MASK:  # padded queries give no mass
                live = live & (tl.load(KeyMask + batch * n + rows, mask=rows < n, other=0) != 0)
            p = tl.where(live[:, None], tl.math.exp2(s - lse2[:, None]), 0.0)
            acc += tl.sum(p, 0)
        tl.store(Received + (batch * n_heads + head) * n + keys, acc, mask=keys < n)


def _launch_args(a: AttentionInputs) -> tuple[dict, tuple]:
    """The kernels' feature flags and block sizes, and the feature operands (placeholders where off)."""
    q, k = a.q, a.k
    check_launch(q, "the stream engine's Triton kernels")
    if q.ndim != 4 or k.ndim != 4 or q.shape[1] % k.shape[1] or q.shape[2] != k.shape[2]:
        raise ValueError(f"expected q [batch, head, pos, d] and k [batch, kv_head, pos, d]; got {q.shape}, {k.shape}")
    block = 16 if interpreting() else 64
    dummy = torch.zeros(1, device=q.device, dtype=torch.float32)
    per_head = lambda t: dummy if t is None else t.detach().float().to(q.device).contiguous()  # noqa: E731
    key_mask = dummy if a.key_mask is None else a.key_mask.to(device=q.device, dtype=torch.int8).contiguous()
    meta = dict(
        GROUP=q.shape[1] // k.shape[1],
        CAUSAL=a.causal,
        HAS_SOFTCAP=a.softcap is not None,
        HAS_BIAS=a.bias_slopes is not None,
        HAS_WINDOW=a.window is not None,
        HAS_KEY_MASK=a.key_mask is not None,
        BLOCK_M=block,
        BLOCK_N=block,
        BLOCK_D=block_d(q.shape[-1]),
        DOT_PRECISION=dot_precision(q.dtype),
    )
    scalars = (float(a.scale), float(a.softcap or 1.0), int(a.window or 0))
    return meta, (per_head(a.bias_slopes), per_head(a.sink), key_mask, scalars)


def triton_row_stats(a: AttentionInputs) -> RowStats:
    """:func:`interp.stream.blockwise.attention_row_stats` (without values) as one Triton launch."""
    meta, (slopes, sink, key_mask, scalars) = _launch_args(a)
    q, k = a.q, a.k.to(a.q.dtype)
    B, H, T, d = q.shape
    lse, mx, rest = (torch.empty(B, H, T, device=q.device, dtype=torch.float32) for _ in range(3))
    grid = (triton.cdiv(T, meta["BLOCK_M"]), B * H)
    _row_stats_kernel[grid](
        q, k, lse, mx, rest, slopes, sink, key_mask, *q.stride(), *k.stride(), H, T, d, *scalars,
        HAS_SINK=a.sink is not None, **meta,
    )  # fmt: skip
    return RowStats(lse=lse, max=mx, max_rest=rest)


def triton_column_sums(a: AttentionInputs, lse: Float[Tensor, "batch head pos"]) -> Float[Tensor, "batch head k"]:
    """Every key's received mass ``sum_q exp(s_qk - lse_q)`` over unpadded queries, one program per
    key block and head (:func:`interp.stream.blockwise.attention_column_sums` without row totals)."""
    meta, (slopes, _, key_mask, scalars) = _launch_args(a)
    q, k = a.q, a.k.to(a.q.dtype)
    B, H, T, d = q.shape
    received = torch.empty(B, H, T, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(T, meta["BLOCK_N"]), B * H)
    _column_sums_kernel[grid](
        q, k, lse.float().contiguous(), received, slopes, key_mask, *q.stride(), *k.stride(), H, T, d, *scalars,
        **meta,
    )  # fmt: skip
    return received


def triton_row_argmax(
    a: AttentionInputs, q0: int, q1: int
) -> tuple[Float[Tensor, "batch head bq"], Int[Tensor, "batch head bq"]]:
    """:func:`interp.stream.blockwise.row_argmax` (without ``on_tile``) as one Triton launch: per
    query ``q0:q1`` of every head, ``(largest logit, its key)``, ties to the lowest key; key tiles
    outside the causal/window band are never read. A row that sees no key gets ``(-inf, 0)``."""
    meta, (slopes, _, key_mask, scalars) = _launch_args(a)
    q, k = a.q, a.k.to(a.q.dtype)
    B, H, T, d = q.shape
    if not 0 <= q0 <= q1 <= T:
        raise ValueError(f"query rows {q0}:{q1} are outside 0:{T}")
    best = torch.full((B, H, q1 - q0), float("-inf"), device=q.device, dtype=torch.float32)
    arg = torch.zeros(B, H, q1 - q0, device=q.device, dtype=torch.long)
    if q1 == q0:
        return best, arg
    scale, softcap, window = scalars
    grid = (triton.cdiv(q1 - q0, meta["BLOCK_M"]), B * H)
    _row_argmax_kernel[grid](
        q, k, best, arg, slopes, key_mask, *q.stride(), *k.stride(), H, T, d, q0, q1, scale, softcap, window,
        **meta,
    )  # fmt: skip
    return best, arg
