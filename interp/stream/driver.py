"""The stream engine's driver: run a probe chunk by chunk with attention fused, calling back per layer,
and the two passes each callback may take, on Triton kernels or in torch.

An analysis (:mod:`interp.heads`, :mod:`interp.sinks.stats`) gives :func:`run_streamed` a function
of the chunk's sequence rows that returns its per-layer callback and any extra hooks; the callback
gets each layer's :class:`~interp.adapters.AttentionInputs` and reduces them with
:func:`row_pass`, :func:`column_pass` and :func:`~interp.stream.blockwise.gathered_weights`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp.adapters import AttentionInputs, HookedModel, adapter_for, describe
from interp.adapters.base import HookList
from interp.errors import NonFiniteAttentionError, UsageError
from interp.hooks import resid_post_hook
from interp.kernels import use_triton
from interp.stream.blockwise import (
    RowStats,
    attention_column_sums,
    attention_gathered,
    attention_row_stats,
    reused_row_stats,
)

OnLayer = Callable[[AttentionInputs], None]
OnChunk = Callable[[slice], tuple[OnLayer, HookList]]


def check_finite(rows: Tensor, layer: int, model_name: str) -> None:
    """Raise :class:`NonFiniteAttentionError` if ``rows`` (row sums or log-sum-exps of a layer's
    attention) hold NaN or inf: the model is unstable in its dtype on this input."""
    if not torch.isfinite(rows).all():
        raise NonFiniteAttentionError(
            f"layer {layer}: the attention pattern holds NaN or inf; the model is unstable "
            f"in {model_name}'s dtype on this input: try --dtype float32"
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


def query_rows(a: AttentionInputs) -> Tensor:
    """``[batch, 1, q]`` True at the query rows that carry statistics (not padding)."""
    B, _, T = a.q.shape[:3]
    if a.key_mask is None:
        return torch.ones(B, 1, T, dtype=torch.bool, device=a.q.device)
    return a.key_mask.to(a.q.device)[:, None, :].bool()


def run_streamed(
    model: HookedModel,
    tokens: Tensor,
    minibatch: int | None,
    progress: bool,
    desc: str,
    on_chunk: OnChunk,
) -> None:
    """Run ``tokens`` chunk by chunk with fused attention; ``on_chunk(rows)`` gives the callback and hooks.

    First :func:`interp.stream.guard.check_stream_conformance` checks on a short prefix that the engine
    reproduces the model's own attention (refusing before any work otherwise). The pass of each
    chunk stops after the last layer's residual output; a layer that never called back (an
    architecture whose attention bypasses the capture) is a :class:`UsageError`.
    """
    from interp.stream.guard import attention_layers, check_stream_conformance

    check_stream_conformance(model, tokens)  # before any work: refuses what it cannot reproduce
    adapter = adapter_for(model)
    L, B = describe(model).n_layers, tokens.shape[0]
    expected = set(attention_layers(model))
    step = minibatch or B
    bar = tqdm(total=L * len(range(0, B, step)), desc=desc, disable=not progress)
    for start in range(0, B, step):
        rows = slice(start, min(start + step, B))
        callback, hooks = on_chunk(rows)
        seen: set[int] = set()

        def on_attention(a: AttentionInputs) -> None:
            callback(a)
            seen.add(a.layer)
            bar.update()

        with adapter.capture_attention(on_attention) as capture_hooks:
            adapter.run_with_reducers(tokens[rows], [*capture_hooks, *hooks], stop_after=resid_post_hook(L - 1))
        if seen != expected:
            missing = sorted(expected - seen)
            raise UsageError(
                f"the stream engine saw no attention inputs for layer(s) {missing}: this architecture's "
                "attention does not call the registered attention function; use --engine pattern"
            )
    bar.close()


__all__ = ["OnChunk", "OnLayer", "check_finite", "column_pass", "gather_pass", "query_rows", "row_pass", "run_streamed"]
