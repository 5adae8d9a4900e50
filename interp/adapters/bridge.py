"""TransformerLens 4 bridges (and any other hooked model) as an :class:`~interp.adapters.base.Adapter`.

Every touch of TransformerLens's and Hugging Face's private state lives here:

- **kept patterns**: ``JointQKVAttentionBridge`` (GPT-2 and kin) stores each layer's
  ``[batch, head, T, T]`` pattern as ``attn._pattern``; left alone, every layer's pattern stays alive
  for the rest of the pass (and after it). Each run frees it as soon as the layer is done.
- **fused capture**: bridges reimplement attention in torch and always form the pattern. Inside
  :meth:`BridgeAdapter.capture_attention` each attention bridge instead runs the wrapped Hugging
  Face module (``original_component``), whose forward applies its own rotary embeddings and then
  calls the attention function its config (``_attn_implementation``) names. We register one with
  ``AttentionInterface``, ``"interp_stream"``: it gives the callback ``q`` and ``k`` exactly as the
  model attends with them (after rotary, grouped K/V not repeated) and computes the output with
  torch's fused ``scaled_dot_product_attention``. Its mask function is the SDPA one, which returns
  no mask for unpadded batches (a causal or full mask is then implied); an explicit mask (padding, a
  sliding window) would be ``[T, T]`` again and raises :class:`UsageError`.
- **eager attention**: :func:`use_eager_attention` switches an in-memory Hugging Face model to the
  eager implementation, so ``hook_pattern`` fires.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from interp.adapters.base import AttentionInputs, HookedAdapter, HookList, OnAttention
from interp.errors import UsageError
from interp.hooks import layer_of, resid_post_hook

IMPLEMENTATION = "interp_stream"


# --------------------------------------------------------------------------------------------
# kept patterns


def keeps_patterns(model: Any) -> bool:
    """Does the model hold each layer's pattern after its attention ran (TransformerLens 4 bridges)?"""
    blocks = getattr(model, "blocks", None)
    return bool(blocks) and any(hasattr(m, "_pattern") for m in blocks[0].modules())


def release_kept_pattern(model: Any, layer: int) -> None:
    """Drop the pattern a TransformerBridge attention module keeps after its forward."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or layer >= len(blocks):
        return
    for module in blocks[layer].modules():
        if isinstance(getattr(module, "_pattern", None), torch.Tensor):
            module._pattern = None


# --------------------------------------------------------------------------------------------
# eager attention for in-memory Hugging Face models


def use_eager_attention(hf_model: Any) -> None:
    """Switch ``hf_model`` to eager attention: fused SDPA kernels never form the pattern."""
    hf_model.config._attn_implementation = "eager"
    if hasattr(hf_model, "set_attn_implementation"):
        try:
            hf_model.set_attn_implementation("eager")
        except Exception:
            pass


# --------------------------------------------------------------------------------------------
# fused capture: our registered attention function


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
            "an explicit mask (padding, a sliding window, ...): use engine='pattern' (command line: --engine pattern)"
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


class BridgeAdapter(HookedAdapter):
    """A TransformerLens model: a ``TransformerBridge`` (capture works) or another hooked model."""

    def cleanup_hooks(self) -> HookList:
        if not keeps_patterns(self.model):
            return []

        def release(_: Tensor, hook: Any) -> None:  # free each layer's kept pattern once it is done
            release_kept_pattern(self.model, layer_of(hook))

        return [(resid_post_hook(layer), release) for layer in range(self.n_layers)]

    def release_patterns(self, layer: int) -> None:
        release_kept_pattern(self.model, layer)

    def after_run(self) -> None:
        if keeps_patterns(self.model):
            for layer in range(self.n_layers):
                release_kept_pattern(self.model, layer)

    @contextlib.contextmanager
    def capture_attention(self, on_attention: OnAttention) -> Iterator[HookList]:
        model = self.model
        attns = [getattr(block, "attn", None) for block in getattr(model, "blocks", [])]
        hf_model = getattr(model, "original_model", None)
        wrapped = [getattr(a, "original_component", None) for a in attns]
        if not attns or hf_model is None or any(w is None for w in wrapped):
            raise UsageError(
                f"the stream engine runs on TransformerLens bridges and the toy; {type(model).__name__} "
                "is neither (its attention modules wrap no Hugging Face module): use engine='pattern' (command line: --engine pattern)"
            )
        configs = {
            id(c): c
            for m in (hf_model, *wrapped)
            for sub in m.modules()
            if hasattr(c := getattr(sub, "config", None), "_attn_implementation")
        }
        if not configs:
            raise UsageError(
                f"{type(hf_model).__name__} has no attention implementation to switch: use engine='pattern' (command line: --engine pattern)"
            )
        layers = {id(sub): layer for layer, w in enumerate(wrapped) for sub in w.modules()}
        _register()
        saved = {key: c._attn_implementation for key, c in configs.items()}
        _ACTIVE.append((layers, on_attention))
        try:
            for c in configs.values():
                c._attn_implementation = IMPLEMENTATION
            for a in attns:  # an instance attribute, set past the bridge's attribute forwarding
                a.__dict__["forward"] = types.MethodType(_run_wrapped, a)
            yield []
        finally:
            for a in attns:
                a.__dict__.pop("forward", None)
            for key, c in configs.items():
                c._attn_implementation = saved[key]
            _ACTIVE.pop()


__all__ = ["IMPLEMENTATION", "BridgeAdapter", "keeps_patterns", "release_kept_pattern", "use_eager_attention"]
