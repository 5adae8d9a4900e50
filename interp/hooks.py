"""Run a hooked model with only the hooks an analysis needs, and stop as soon as it has them.

Analyses reduce activations *inside* the hook (a pattern becomes a few numbers per head as it is
produced), so nothing of size ``pos x pos`` outlives its layer. When the last hook an analysis needs
has fired, :func:`run_with_reducers` stops the forward pass by raising from a hook: the layers above
and the unembedding are never run. On TransformerLens bridges, which keep each layer's pattern on
its attention module, the kept pattern is dropped as soon as its layer is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

Hook = Callable[[Tensor, Any], Any]


# --------------------------------------------------------------------------------------------
# hook names: TransformerLens's, on the bridge and on the toy alike


def pattern_hook(layer: int) -> str:
    """``[batch, head, q_pos, k_pos]`` attention weights."""
    return f"blocks.{layer}.attn.hook_pattern"


def z_hook(layer: int) -> str:
    """``[batch, pos, head, d_head]`` each head's output before W_O."""
    return f"blocks.{layer}.attn.hook_z"


def v_hook(layer: int) -> str:
    """``[batch, pos, head, d_head]`` value vectors (K/V heads on grouped-query models)."""
    return f"blocks.{layer}.attn.hook_v"


def q_hook(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_q"


def k_hook(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_k"


def resid_post_hook(layer: int) -> str:
    """``[batch, pos, d_model]`` the residual stream after block ``layer``."""
    return f"blocks.{layer}.hook_resid_post"


def layer_of(hook: Any) -> int:
    """The block index of a hook point or hook name (``blocks.3.attn.hook_z`` -> 3)."""
    name = hook if isinstance(hook, str) else hook.name
    return int(name.split(".")[1])


def keeps_patterns(model: Any) -> bool:
    """Does the model hold each layer's pattern after its attention ran (TransformerLens 4 bridges)?"""
    blocks = getattr(model, "blocks", None)
    return bool(blocks) and any(hasattr(m, "_pattern") for m in blocks[0].modules())


def release_kept_pattern(model: Any, layer: int) -> None:
    """Drop the pattern a TransformerBridge attention module keeps after its forward.

    TransformerLens 4's ``JointQKVAttentionBridge`` (GPT-2 and kin) stores each layer's
    ``[batch, head, T, T]`` pattern as ``attn._pattern``: left alone, every layer's pattern stays
    alive for the rest of the pass (and after it), ``n_layers x`` the memory of one.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None or layer >= len(blocks):
        return
    for module in blocks[layer].modules():
        if isinstance(getattr(module, "_pattern", None), torch.Tensor):
            module._pattern = None


class _StopForward(Exception):
    """Raised from a hook to end a forward pass that has given all it was asked for."""


def run_with_reducers(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    fwd_hooks: Sequence[tuple[str, Hook]],
    *,
    stop_after: str | None = None,
    grad: bool = False,
) -> Any:
    """``model.run_with_hooks(tokens, fwd_hooks)``, ending the pass right after ``stop_after`` fires.

    Returns the logits when the pass runs to the end, ``None`` when it was stopped early.
    """
    hooks = list(fwd_hooks)
    n_layers = len(getattr(model, "blocks", []))
    keeps = keeps_patterns(model)
    if keeps:  # free each layer's kept pattern as soon as the layer is done

        def release(_: Tensor, hook: Any) -> None:
            release_kept_pattern(model, layer_of(hook))

        hooks += [(resid_post_hook(layer), release) for layer in range(n_layers)]
    if stop_after is not None:

        def stop(_: Tensor, hook: Any) -> None:
            raise _StopForward

        hooks.append((stop_after, stop))  # registered last: fires after the reducers on that point
    with torch.set_grad_enabled(grad):
        try:
            return model.run_with_hooks(tokens, fwd_hooks=hooks)
        except _StopForward:
            return None
        finally:
            if keeps:
                for layer in range(n_layers):
                    release_kept_pattern(model, layer)
