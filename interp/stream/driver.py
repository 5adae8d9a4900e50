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

from interp.adapters import AttentionInputs, HookedModel, adapter_for, describe
from interp.adapters.base import HookList
from interp.errors import NonFiniteAttentionError, UsageError
from interp.hooks import resid_post_hook
from interp.kernels import use_triton
from interp.progress import tqdm
from interp.stream.blockwise import RowStats, column_sums, row_stats

OnLayer = Callable[[AttentionInputs], None]
OnChunk = Callable[[slice], tuple[OnLayer, HookList]]


def check_finite(rows: Tensor, layer: int, model_name: str) -> None:
    """Raise :class:`NonFiniteAttentionError` if ``rows`` (row sums or log-sum-exps of a layer's
    attention) hold NaN or inf: the model is unstable in its dtype on this input."""
    if not torch.isfinite(rows).all():
        raise NonFiniteAttentionError(
            f"layer {layer}: the attention pattern holds NaN or inf; the model is unstable "
            f"in {model_name}'s dtype on this input: load it in float32 (command line: --dtype float32)"
        )


def row_pass(a: AttentionInputs) -> RowStats:
    """Log-sum-exp and row maxima: the Triton kernel where :func:`interp.kernels.use_triton` says, else torch."""
    if use_triton(a.q):
        from interp.stream.triton import triton_row_stats

        return triton_row_stats(a.q, a.k, a.scale, a.causal)
    return row_stats(a.q, a.k, a.scale, a.causal)


def column_pass(a: AttentionInputs, lse: Float[Tensor, "batch head q"]) -> tuple[Float[Tensor, "batch head k"], float]:
    """``(received mass per key, max |row sum - 1|)``. The Triton pass has no row sums; there the
    check is on their mean (the total received mass over ``T``)."""
    if use_triton(a.q):
        from interp.stream.triton import triton_column_sums

        received = triton_column_sums(a.q, a.k, lse, a.scale, a.causal)
        return received, float((received.sum(-1) / a.q.shape[2] - 1).abs().max())
    received, rows = column_sums(a.q, a.k, lse, a.scale, a.causal)
    return received, float((rows - 1).abs().max())


def run_streamed(
    model: HookedModel,
    tokens: Tensor,
    minibatch: int | None,
    progress: bool,
    desc: str,
    on_chunk: OnChunk,
) -> None:
    """Run ``tokens`` chunk by chunk with fused attention; ``on_chunk(rows)`` gives the callback and hooks.

    The pass of each chunk stops after the last layer's residual output; a layer that never called
    back (an architecture whose attention bypasses the capture) is a :class:`UsageError`.
    """
    adapter = adapter_for(model)
    L, B = describe(model).n_layers, tokens.shape[0]
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
        if seen != set(range(L)):
            missing = sorted(set(range(L)) - seen)
            raise UsageError(
                f"the stream engine saw no attention inputs for layer(s) {missing}: this architecture's "
                "attention does not call the registered attention function; use engine='pattern' (command line: --engine pattern)"
            )
    bar.close()


__all__ = ["OnChunk", "OnLayer", "check_finite", "column_pass", "row_pass", "run_streamed"]
