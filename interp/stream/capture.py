"""Hand each layer's post-rotary ``q``, ``k`` and ``v`` to a callback while the model's own attention
runs fused: the ``[T, T]`` pattern is formed neither by the model nor by us.

- **TransformerLens bridges** reimplement attention in torch and always form the pattern (their
  ``hook_pattern`` fires whether or not anyone listens). Inside :func:`streamed_attention` each
  attention bridge instead runs the wrapped Hugging Face module, whose forward applies its own
  rotary embeddings and then calls the attention function its config names. We register one,
  ``"interp_stream"``: it gives the callback ``q`` and ``k`` exactly as the model attends with them
  (after rotary, grouped K/V not repeated) and computes the output with torch's fused
  ``scaled_dot_product_attention``. Its mask function is the SDPA one, which returns no mask at
  all for unpadded batches (a causal or full mask is then implied). Hooks outside the attention
  modules (``hook_resid_post`` and the like) fire as usual; hooks inside them do not.
- **The toy** runs attention on its flash path whenever nobody hooks the pattern (switched on
  inside the block if the model was built without it); its ``hook_q``, ``hook_k`` and ``hook_v``
  fire before it (the toy has learned positions, no rotary), so the callback runs from the
  ``hook_v`` hook, with ``q`` and ``k`` caught just before.

Only plain causal or full attention is supported: an explicit mask (padding, a sliding window)
would be ``[T, T]`` again, and raises :class:`UsageError`.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from interp.errors import UsageError
from interp.hooks import k_hook, layer_of, q_hook, v_hook

IMPLEMENTATION = "interp_stream"


@dataclass
class AttentionInputs:
    """One layer's attention inputs as the model attends with them."""

    layer: int
    q: Float[Tensor, "batch head pos d_head"]
    k: Float[Tensor, "batch kv_head pos d_head"]  # after rotary, grouped heads not repeated
    v: Float[Tensor, "batch kv_head pos d_head"]
    scale: float
    causal: bool


OnAttention = Callable[[AttentionInputs], None]


def is_toy(model: Any) -> bool:
    from interp.toy.model import ToyTransformer

    return isinstance(model, ToyTransformer)


@contextlib.contextmanager
def streamed_attention(model: Any, on_attention: OnAttention) -> Iterator[list[tuple[str, Any]]]:
    """Within the block, every attention layer of ``model`` calls ``on_attention`` and runs fused.

    Yields the forward hooks the caller must add to its run (the toy's q/k/v hooks; none on a
    bridge). Raises :class:`UsageError` for a model whose attention cannot be run this way.
    """
    if is_toy(model):
        attns = [block.attn for block in model.blocks]
        saved = [a.use_flash for a in attns]
        try:
            for a in attns:  # a toy built with use_flash=False would form the pattern itself
                a.use_flash = True
            yield _toy_hooks(model, on_attention)
        finally:
            for a, flag in zip(attns, saved):
                a.use_flash = flag
        return
    with _bridge_fused(model, on_attention):
        yield []


# --------------------------------------------------------------------------------------------
# the toy: hooks, since its flash path never forms the pattern


def _toy_hooks(model: Any, on_attention: OnAttention) -> list[tuple[str, Any]]:
    caught: dict[str, Tensor] = {}
    to_sdpa = lambda t: rearrange(t.detach(), "b p h d -> b h p d")  # noqa: E731

    def grab(t: Tensor, hook: Any) -> None:
        caught[hook.name.rsplit("_", 1)[-1]] = t

    def fire(v: Tensor, hook: Any) -> None:
        layer = layer_of(hook)
        attn = model.blocks[layer].attn
        on_attention(
            AttentionInputs(
                layer, to_sdpa(caught.pop("q")), to_sdpa(caught.pop("k")), to_sdpa(v), float(attn.scale), attn.causal
            )
        )

    hooks: list[tuple[str, Any]] = []
    for layer in range(len(model.blocks)):
        hooks += [(q_hook(layer), grab), (k_hook(layer), grab), (v_hook(layer), fire)]
    return hooks


# --------------------------------------------------------------------------------------------
# TransformerLens bridges: run the wrapped HF attention with our registered attention function


_ACTIVE: list[tuple[dict[int, int], OnAttention]] = []  # (id(hf module) -> layer, callback), innermost last


def _capture_forward(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """The attention function registered as ``"interp_stream"``: report q, k, v, then run SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layers, on_attention = _ACTIVE[-1]
    if attention_mask is not None:
        raise UsageError(
            "the stream engine handles plain causal or full attention, but this model attends through "
            "an explicit mask (padding, a sliding window, ...): use --engine pattern"
        )
    causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
    scale = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
    on_attention(AttentionInputs(layers[id(module)], query.detach(), key.detach(), value.detach(), scale, causal))
    out, _ = sdpa_attention_forward(module, query, key, value, None, scaling=scaling, dropout=dropout, **kwargs)
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, _capture_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def _run_wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
    """An attention bridge's forward replaced by its wrapped HF module's own."""
    return self.original_component(*args, **kwargs)


@contextlib.contextmanager
def _bridge_fused(model: Any, on_attention: OnAttention) -> Iterator[None]:
    attns = [getattr(block, "attn", None) for block in getattr(model, "blocks", [])]
    hf_model = getattr(model, "original_model", None)
    wrapped = [getattr(a, "original_component", None) for a in attns]
    if not attns or hf_model is None or any(w is None for w in wrapped):
        raise UsageError(
            f"the stream engine runs on TransformerLens bridges and the toy; {type(model).__name__} "
            "is neither (its attention modules wrap no Hugging Face module): use --engine pattern"
        )
    modules = [hf_model, *wrapped]
    configs = {
        id(c): c
        for m in modules
        for sub in m.modules()
        if hasattr(c := getattr(sub, "config", None), "_attn_implementation")
    }
    if not configs:
        raise UsageError(f"{type(hf_model).__name__} has no attention implementation to switch: use --engine pattern")
    layers = {id(sub): layer for layer, w in enumerate(wrapped) for sub in w.modules()}
    _register()
    saved = {key: c._attn_implementation for key, c in configs.items()}
    _ACTIVE.append((layers, on_attention))
    try:
        for c in configs.values():
            c._attn_implementation = IMPLEMENTATION
        for a in attns:  # an instance attribute, set past the bridge's attribute forwarding
            a.__dict__["forward"] = types.MethodType(_run_wrapped, a)
        yield
    finally:
        for a in attns:
            a.__dict__.pop("forward", None)
        for key, c in configs.items():
            c._attn_implementation = saved[key]
        _ACTIVE.pop()


def check_streamable(model: Any) -> None:
    """Raise :class:`UsageError` unless the stream engine can run ``model`` (no forward needed)."""
    if is_toy(model):
        return
    with _bridge_fused(model, lambda _: None):
        pass


__all__ = ["AttentionInputs", "OnAttention", "check_streamable", "is_toy", "streamed_attention"]
