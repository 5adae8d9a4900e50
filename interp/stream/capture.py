"""Hand each layer's post-rotary ``q``, ``k`` and ``v`` to a callback while the model's own attention
runs fused: the ``[T, T]`` pattern is formed neither by the model nor by us.

How a model is made to do that is its adapter's business
(:meth:`interp.adapters.Adapter.capture_attention`): the toy switches on its flash path and calls
back from its q/k/v hooks; a TransformerLens bridge runs each wrapped Hugging Face attention module
with an attention function of ours. Hooks outside the attention modules (``hook_resid_post`` and
the like) fire as usual.

Sliding windows, logit softcapping, learned sink logits and padded keys travel on
:class:`AttentionInputs`; the layers SDPA cannot compute run the banded online softmax of
:func:`interp.stream.blockwise.own_attention`. No ``[T, T]`` mask is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from interp.adapters import AttentionInputs, HookedModel, OnAttention, adapter_for, is_toy
from interp.adapters.base import HookList
from interp.stream.blockwise import own_attention


@contextmanager
def streamed_attention(model: HookedModel, on_attention: OnAttention) -> Iterator[HookList]:
    """Within the block, every attention layer of ``model`` calls ``on_attention`` and runs fused.

    Yields the forward hooks the caller must add to its run (the toy's q/k/v hooks; none on a
    bridge). Raises :class:`UsageError` for a model whose attention cannot be run this way.
    """
    with adapter_for(model).capture_attention(on_attention, attend=own_attention) as hooks:
        yield hooks


def check_streamable(model: HookedModel) -> None:
    """Raise :class:`UsageError` unless the stream engine can run ``model`` (no forward needed)."""
    adapter_for(model).check_capture()


__all__ = ["AttentionInputs", "OnAttention", "check_streamable", "is_toy", "streamed_attention"]
