"""The stream engine's driver: run a probe chunk by chunk with attention fused, calling back per layer,
and the two passes each callback may take, on Triton kernels or in torch.

An analysis (:mod:`interp.heads`, :mod:`interp.sinks.stats`) gives :func:`run_streamed` a function
of the chunk's sequence rows that returns its per-layer callback and any extra hooks; the callback
gets each layer's :class:`~interp.adapters.AttentionInputs` and reduces them with
:func:`row_pass`, :func:`column_pass` and :func:`~interp.stream.blockwise.gathered_weights`.
"""

from __future__ import annotations

from collections.abc import Callable

from jaxtyping import Bool
from torch import Tensor

from interp.adapters import AttentionInputs, HookedModel, adapter_for, describe
from interp.adapters.base import HookList
from interp.errors import UsageError
from interp.hooks import resid_post_hook
from interp.progress import tqdm
from interp.stream.blockwise import own_attention
from interp.stream.guard import check_stream_conformance
from interp.stream.passes import check_finite, column_pass, gather_pass, query_rows, row_pass

OnLayer = Callable[[AttentionInputs], None]
OnChunk = Callable[[slice], tuple[OnLayer, HookList]]


def run_streamed(
    model: HookedModel,
    tokens: Tensor,
    minibatch: int | None,
    progress: bool,
    desc: str,
    on_chunk: OnChunk,
    *,
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
) -> None:
    """Run ``tokens`` chunk by chunk with fused attention; ``on_chunk(rows)`` gives the callback and hooks.

    First :func:`interp.stream.guard.check_stream_conformance` checks on a short prefix that the engine
    reproduces the model's own attention (refusing before any work otherwise). The pass of each
    chunk stops after the last layer's residual output; a layer that never called back (an
    architecture whose attention bypasses the capture) is a :class:`UsageError`.

    ``attention_mask`` (a padded probe's, False at padding) goes with each chunk into the model run:
    padded keys are masked, each token gets its position in its text alone, and the callbacks'
    :class:`~interp.adapters.AttentionInputs` carry the chunk's mask as ``key_mask`` (``None`` for a
    chunk without padding). Padded query rows still get statistics (``lse`` 0 and ``max`` ``-inf``
    where they see no key): the analyses leave them out (:func:`query_rows`).
    """
    check_stream_conformance(model, tokens, attention_mask=attention_mask)  # before any work
    adapter = adapter_for(model)
    info = describe(model)
    L, B, expected = info.n_layers, tokens.shape[0], set(info.attention_layers)
    step = minibatch or B
    n_chunks = len(range(0, B, step))
    sizes = f"{B} sequences of {tokens.shape[1]} tokens, {n_chunks} chunk(s) x {L} layers, attention streamed"
    bar = tqdm(total=L * n_chunks, desc=desc, disable=not progress, sizes=sizes)
    for start in range(0, B, step):
        rows = slice(start, min(start + step, B))
        callback, hooks = on_chunk(rows)
        seen: set[int] = set()

        def on_attention(a: AttentionInputs) -> None:
            callback(a)
            seen.add(a.layer)
            bar.update()

        with adapter.capture_attention(on_attention, attend=own_attention) as capture_hooks:
            mask = None if attention_mask is None else attention_mask[rows]
            adapter.run_with_reducers(
                tokens[rows], [*capture_hooks, *hooks], stop_after=resid_post_hook(L - 1), attention_mask=mask
            )
        if seen != expected:
            missing = sorted(expected - seen)
            raise UsageError(
                f"the stream engine saw no attention inputs for layer(s) {missing}: this architecture's "
                "attention does not call the registered attention function; use engine='pattern'",
                params="engine",
            )
    bar.close()


__all__ = ["OnChunk", "OnLayer", "check_finite", "column_pass", "gather_pass", "query_rows", "row_pass", "run_streamed"]
