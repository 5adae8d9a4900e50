"""The stream engine's passes over one layer's :class:`~interp.adapters.AttentionInputs`, on Triton
kernels or in torch: :func:`row_pass`, :func:`column_pass`, :func:`gather_pass`, :func:`argmax_pass`
(and the checks on what they return). :mod:`interp.stream.driver` runs the model; :mod:`interp.stream.guard` checks it.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters import AttentionInputs
from interp.errors import NonFiniteAttentionError
from interp.kernels import use_triton
from interp.stream.blockwise import (
    RowStats,
    attention_column_sums,
    attention_gathered,
    attention_row_stats,
    reused_row_stats,
    row_argmax,
)


def check_finite(rows: Tensor, layer: int, model_name: str) -> None:
    """Raise :class:`NonFiniteAttentionError` if ``rows`` (row sums or log-sum-exps of a layer's
    attention) hold NaN or inf: the model is unstable in its dtype on this input."""
    if not torch.isfinite(rows).all():
        raise NonFiniteAttentionError(
            f"layer {layer}: the attention pattern holds NaN or inf; the model is unstable "
            f"in {model_name}'s dtype on this input: load it with dtype='float32'",
            params="dtype",
        )


def row_pass(a: AttentionInputs) -> RowStats:
    """Log-sum-exp (sink included) and row maxima: the Triton kernel where
    :func:`interp.kernels.use_triton` says, else torch. Windows, softcap, ALiBi, sinks and key masks
    are applied on both. Where the capture's own output pass already made them, they are reused."""
    reused = reused_row_stats(a)
    if reused is not None:
        return reused
    if use_triton(a.q):
        from interp.stream.triton import triton_row_stats

        return triton_row_stats(a)
    return attention_row_stats(a)


def column_pass(a: AttentionInputs, lse: Float[Tensor, "batch head q"]) -> tuple[Float[Tensor, "batch head k"], float]:
    """``(received mass per key, max |row total - 1|)`` over the query rows that see a key (a row's
    total counts the sink's share). The Triton pass has no row sums; there the check is on the mean
    row total (the total received mass plus the sink's share over the rows)."""
    live = query_rows(a)
    if use_triton(a.q):
        from interp.stream.triton import triton_column_sums

        received = triton_column_sums(a, lse)
        total = received.sum(-1)
        if a.sink is not None:
            sink = a.sink.float().to(lse.device)[None, :, None]
            total = total + torch.where(live, torch.exp(sink - lse), 0.0).sum(-1)
        n = live.sum(-1).clamp_min(1)
        return received, float((total / n - 1).abs().max())
    received, rows = attention_column_sums(a, lse)
    return received, float(torch.where(live, rows - 1, 0.0).abs().max())


def gather_pass(a: AttentionInputs, lse: Float[Tensor, "batch head q"], pairs: Tensor) -> Float[Tensor, "n head"]:
    """``A[b, h, q, k]`` at each ``(b, q, k)`` of ``pairs``, every head (``O(d)`` each, in torch)."""
    return attention_gathered(a, lse, pairs)


def argmax_pass(
    a: AttentionInputs, q0: int, q1: int
) -> tuple[Float[Tensor, "batch head bq"], Int[Tensor, "batch head bq"]]:
    """``(largest logit, its key)`` of queries ``q0:q1`` of every head, ties to the lowest key: the
    Triton kernel where :func:`interp.kernels.use_triton` says, else
    :func:`~interp.stream.blockwise.row_argmax`. Both skip key tiles outside the causal/window band."""
    if use_triton(a.q):
        from interp.stream.triton import triton_row_argmax

        return triton_row_argmax(a, q0, q1)
    return row_argmax(a, q0, q1)


def query_rows(a: AttentionInputs) -> Tensor:
    """``[batch, 1, q]`` True at the query rows that carry statistics (not padding)."""
    B, _, T = a.q.shape[:3]
    if a.key_mask is None:
        return torch.ones(B, 1, T, dtype=torch.bool, device=a.q.device)
    return a.key_mask.to(a.q.device)[:, None, :].bool()


__all__ = ["argmax_pass", "check_finite", "column_pass", "gather_pass", "query_rows", "row_pass"]
