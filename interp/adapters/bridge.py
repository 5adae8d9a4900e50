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
  torch's fused ``scaled_dot_product_attention`` where the attention is plain, else with the
  blockwise online softmax of :mod:`interp.stream.blockwise` (sliding windows, logit softcapping,
  learned sink logits, padded keys: what SDPA cannot do). Its mask function never builds a
  ``[T, T]`` mask: it hands the 2D padding mask to the capture as the key mask; the window, softcap
  and sink logits come from the keyword arguments of each attention call (``sliding_window``,
  ``softcap``, ``s_aux``). Attention classes that do not call the interface (Bloom's ALiBi, Falcon)
  are refused by the stream engine's guard before any work (:mod:`interp.stream.guard`).
- **eager attention**: :func:`use_eager_attention` switches an in-memory Hugging Face model to the
  eager implementation, so ``hook_pattern`` fires.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from interp.adapters.base import Attend, AttentionInputs, HookedAdapter, HookList, OnAttention
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


@dataclass
class _Capture:
    """One active capture: the layer of each wrapped HF module, the callback, and the padding mask the
    mask function was handed on this forward (``None``: no padding)."""

    layers: dict[int, int]
    on_attention: OnAttention
    attend: Attend | None = None
    key_mask: Tensor | None = None


_ACTIVE: list[_Capture] = []  # innermost last


def _stream_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: Tensor | None = None,
    **kwargs: Any,
) -> None:
    """The mask function registered as ``"interp_stream"``: it never builds a ``[T, T]`` mask. The 2D
    padding mask (if any) goes to the capture as the key mask; causality comes from the attention
    module, windows from the ``sliding_window`` argument of each call."""
    if _ACTIVE:
        keep = None
        if attention_mask is not None and attention_mask.ndim == 2 and not bool(attention_mask.bool().all()):
            keep = attention_mask.bool()[:, kv_offset : kv_offset + kv_length]
        _ACTIVE[-1].key_mask = keep
    return None


def _sink_logits(module: Any, kwargs: dict[str, Any]) -> Tensor | None:
    """Learned sink logits, one per head: GPT-OSS passes them as ``s_aux``."""
    sink = kwargs.get("s_aux")
    return None if sink is None else sink.detach()


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
    """The attention function registered as ``"interp_stream"``: report q, k, v with the layer's
    window, softcap, sink logits and key mask, then compute the output: torch's fused SDPA for plain
    attention, else :func:`interp.stream.blockwise.attention_output` (SDPA has no window, softcap
    or sink; that pass applies them all in memory linear in ``T``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    capture = _ACTIVE[-1]
    if attention_mask is not None:
        raise UsageError(
            f"the stream engine got a prepared attention mask of shape {tuple(attention_mask.shape)} "
            "(a [T, T] mask); pass a 2D padding mask instead, or use engine='pattern'",
            params="engine",
        )
    window, softcap = kwargs.pop("sliding_window", None), kwargs.pop("softcap", None)
    sink = _sink_logits(module, kwargs)
    kwargs.pop("s_aux", None)
    causal = bool(getattr(module, "is_causal", True)) and query.shape[2] > 1
    scale = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
    features = dict(
        window=None if window is None or int(window) >= key.shape[2] else int(window),  # wider: hides nothing
        softcap=None if not softcap else float(softcap),
        sink=sink,
        key_mask=capture.key_mask,
    )
    layer = capture.layers[id(module)]
    seen = AttentionInputs(layer, query.detach(), key.detach(), value.detach(), scale, causal, **features)
    if seen.plain:
        capture.on_attention(seen)
        out, _ = sdpa_attention_forward(module, query, key, value, None, scaling=scaling, dropout=dropout, **kwargs)
        return out, None
    if capture.attend is None:
        raise UsageError(
            "this layer's attention (a window, logit softcapping, sink logits or padded keys) needs the "
            "stream engine's own attention pass: run it through interp.stream, or use engine='pattern'",
            params="engine",
        )
    own = AttentionInputs(layer, query, key, value, scale, causal, **features)
    out = capture.attend(own, seen, capture.on_attention)
    return out.transpose(1, 2).to(query.dtype).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _capture_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, _stream_mask)


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

    def padding_inputs(self, tokens: Tensor, attention_mask: Tensor) -> tuple[dict[str, Any], HookList]:
        """The mask and each token's position in its text alone, for the wrapped model's forward;
        position ids are left out for models whose forward cannot take them (TransformerLens's own
        test, e.g. fixed-signature remote code, or mRoPE models that derive their own)."""
        kwargs, hooks = super().padding_inputs(tokens, attention_mask)
        accepts = getattr(self.model, "_accepts_derived_position_ids", None)
        if accepts is not None and not accepts():
            kwargs.pop("position_ids")
        return kwargs, hooks

    def after_run(self) -> None:
        if keeps_patterns(self.model):
            for layer in range(self.n_layers):
                release_kept_pattern(self.model, layer)

    def _attention_modules(self) -> tuple[list[Any], dict[int, Any], dict[int, int]]:
        """The bridge's attention components, the configs whose attention implementation is switched
        and ``{id(module): layer}`` for every module inside a layer's wrapped attention: read once per
        model (a replay calls :meth:`capture_attention` hundreds of times) and again if its attention
        components are replaced."""
        model = self.model
        blocks = getattr(model, "blocks", [])
        index = [l for l in self.describe().attention_layers] if blocks else []  # linear-attention layers have none
        attns = [blocks[l].attn for l in index]
        cached = model.__dict__.get(_MODULES)
        if cached is not None and len(cached[0]) == len(attns) and all(a is b for a, b in zip(cached[0], attns)):
            return cached
        hf_model = getattr(model, "original_model", None)
        wrapped = [getattr(a, "original_component", None) for a in attns]
        if not attns or hf_model is None or any(w is None for w in wrapped):
            raise UsageError(
                f"the stream engine runs on TransformerLens bridges and the toy; {type(model).__name__} "
                "is neither (its attention modules wrap no Hugging Face module): use engine='pattern'",
                params="engine",
            )
        configs = {
            id(c): c
            for m in (hf_model, *wrapped)
            for sub in m.modules()
            if hasattr(c := getattr(sub, "config", None), "_attn_implementation")
        }
        if not configs:
            raise UsageError(
                f"{type(hf_model).__name__} has no attention implementation to switch: use engine='pattern'",
                params="engine",
            )
        layers = {id(sub): layer for layer, w in zip(index, wrapped) for sub in w.modules()}
        model.__dict__[_MODULES] = (attns, configs, layers)  # past nn.Module's registration: it dies with the model
        return attns, configs, layers

    @contextlib.contextmanager
    def capture_attention(self, on_attention: OnAttention, attend: Attend | None = None) -> Iterator[HookList]:
        attns, configs, layers = self._attention_modules()
        _register()
        saved = {key: c._attn_implementation for key, c in configs.items()}
        _ACTIVE.append(_Capture(layers, on_attention, attend))
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


_MODULES = "_interp_attention_modules"  # where a bridge keeps what capture_attention reads from it

__all__ = ["IMPLEMENTATION", "BridgeAdapter", "keeps_patterns", "release_kept_pattern", "use_eager_attention"]


# --------------------------------------------------------------------------------------------
# output gates (gated attention: Qwen3-Next)


def gated_attention_modules(model: Any) -> dict[int, Any]:
    """``{layer: HF attention module}`` for attention with a sigmoid output gate per head: its
    ``q_proj`` writes query and gate interleaved per head (``[..., head, 2 * head_dim]``), and
    ``attn_output * sigmoid(gate)`` is applied after the attention call, before ``o_proj``."""
    hf = getattr(model, "original_model", model)
    found: dict[int, Any] = {}
    for module in hf.modules():
        q_proj, layer = getattr(module, "q_proj", None), getattr(module, "layer_idx", None)
        config, head_dim = getattr(module, "config", None), getattr(module, "head_dim", None)
        heads = getattr(config, "num_attention_heads", None)
        if layer is None or head_dim is None or heads is None or not hasattr(q_proj, "out_features"):
            continue
        if getattr(config, "model_type", "").startswith("qwen3_next") and q_proj.out_features == 2 * heads * head_dim:
            found[int(layer)] = module
    return found


@contextlib.contextmanager
def output_gate_means(model: Any, record: Any) -> Iterator[bool]:
    """Within the block, every forward of a gated attention layer calls ``record(layer, mean)`` with
    ``mean`` ``[batch, head]``: ``sigmoid(gate)`` averaged over positions and the head's channels,
    read from a forward hook on the module's ``q_proj`` (the gate is what the head's output is
    multiplied by). Yields whether the model has such layers."""
    from einops import rearrange

    modules = gated_attention_modules(model)
    handles = []
    for layer, module in modules.items():

        def hook(_: Any, args: Any, out: Tensor, layer: int = layer, d: int = module.head_dim) -> None:
            gate = rearrange(out.detach().float(), "b p (h dd) -> b p h dd", dd=2 * d)[..., d:]
            record(layer, torch.sigmoid(gate).mean((1, 3)))

        handles.append(module.q_proj.register_forward_hook(hook))
    try:
        yield bool(modules)
    finally:
        for h in handles:
            h.remove()
