"""The one home of model internals: what the analyses need from a hooked model, behind one interface.

- :mod:`interp.adapters.base`: :class:`HookedModel` (what ``model`` parameters are annotated with),
  the :class:`Adapter` protocol (describe, run with reducers, capture attention inputs on the fused
  path, a head's output hook, the replay's shortcuts) and the shared :class:`HookedAdapter`;
- :mod:`interp.adapters.info`: :class:`ModelInfo`, the few facts every analysis reads;
- :mod:`interp.adapters.toy`: :class:`ToyAdapter`, the bundled toy (its own flash path);
- :mod:`interp.adapters.bridge`: :class:`BridgeAdapter`, TransformerLens bridges; every touch of
  TransformerLens's or Hugging Face's private state lives there;
- :mod:`interp.adapters.surgery`: the replay's module surgery (reused attention, trimmed MLP, recorded and re-run blocks).

:func:`adapter_for` picks the adapter; :func:`describe` and :func:`run_with_reducers` are the two
calls nearly every analysis makes, spelled as functions of the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxtyping import Bool, Int
from torch import Tensor

from interp.adapters.base import Adapter, AttentionInputs, Hook, HookedAdapter, HookedModel, OnAttention
from interp.adapters.bridge import (
    BridgeAdapter,
    gated_attention_modules,
    keeps_patterns,
    output_gate_means,
    release_kept_pattern,
    use_eager_attention,
)
from interp.adapters.info import ModelInfo
from interp.adapters.toy import ToyAdapter, is_toy


def adapter_for(model: HookedModel) -> Adapter:
    """The adapter of ``model``: :class:`ToyAdapter` for the toy, :class:`BridgeAdapter` otherwise."""
    if isinstance(model, HookedAdapter):
        return model
    return ToyAdapter(model) if is_toy(model) else BridgeAdapter(model)


def describe(model: HookedModel) -> ModelInfo:
    """Read a model's shape, special tokens and causality (observed once, then remembered).

    The device is read afresh on every call, so the answer follows ``model.to(device)``.
    """
    return adapter_for(model).describe()


def run_with_reducers(
    model: HookedModel,
    tokens: Int[Tensor, "batch pos"],
    fwd_hooks: Sequence[tuple[str, Hook]],
    *,
    stop_after: str | None = None,
    grad: bool = False,
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
) -> Any:
    """``model.run_with_hooks(tokens, fwd_hooks)``, ending the pass right after ``stop_after`` fires.

    Analyses reduce activations *inside* the hook, so nothing of size ``pos x pos`` outlives its
    layer; when the last hook an analysis needs has fired, the pass stops by raising from a hook (the
    layers above and the unembedding never run). Patterns a bridge keeps are dropped as each layer
    ends. Returns the logits when the pass runs to the end, ``None`` when it was stopped early.
    ``attention_mask`` (a padded probe's, False at padding) masks padded keys and gives each token its
    position in its text alone.
    """
    return adapter_for(model).run_with_reducers(
        tokens, fwd_hooks, stop_after=stop_after, grad=grad, attention_mask=attention_mask
    )


__all__ = [
    "Adapter",
    "AttentionInputs",
    "BridgeAdapter",
    "Hook",
    "HookedAdapter",
    "HookedModel",
    "ModelInfo",
    "OnAttention",
    "ToyAdapter",
    "adapter_for",
    "describe",
    "gated_attention_modules",
    "is_toy",
    "keeps_patterns",
    "output_gate_means",
    "release_kept_pattern",
    "run_with_reducers",
    "use_eager_attention",
]
