"""Hook names: TransformerLens's, on the bridge and on the toy alike, and :func:`layer_of`.

Running a model with reducers (stopping early, freeing kept patterns) is the model adapters' job:
:func:`interp.adapters.run_with_reducers`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def qkv_hook(layer: int, site: str) -> str:
    """``[batch, pos, head, d_head]`` queries, keys or values of layer ``layer`` by site letter
    (``"q"``, ``"k"``, ``"v"``; keys and values per K/V head on grouped-query models)."""
    return f"blocks.{layer}.attn.hook_{site}"


def v_hook(layer: int) -> str:
    """``[batch, pos, head, d_head]`` value vectors (K/V heads on grouped-query models)."""
    return qkv_hook(layer, "v")


def q_hook(layer: int) -> str:
    return qkv_hook(layer, "q")


def k_hook(layer: int) -> str:
    return qkv_hook(layer, "k")


def resid_pre_hook(layer: int) -> str:
    """``[batch, pos, d_model]`` the residual stream entering block ``layer`` (block 0's: the embedding)."""
    return f"blocks.{layer}.hook_resid_pre"


def resid_mid_hook(layer: int) -> str:
    """``[batch, pos, d_model]`` the residual between block ``layer``'s attention and its MLP (absent
    where the two read the same input: a parallel block)."""
    return f"blocks.{layer}.hook_resid_mid"


def attn_out_hook(layer: int) -> str:
    """``[batch, pos, d_model]`` what block ``layer``'s attention adds."""
    return f"blocks.{layer}.hook_attn_out"


def mlp_in_hook(layer: int) -> str:
    """``[batch, pos, d_model]`` block ``layer``'s MLP input, after its norm."""
    return f"blocks.{layer}.mlp.hook_in"


def mlp_out_hook(layer: int) -> str:
    """``[batch, pos, d_model]`` what block ``layer``'s MLP adds."""
    return f"blocks.{layer}.hook_mlp_out"


def resid_post_hook(layer: int) -> str:
    """``[batch, pos, d_model]`` the residual stream after block ``layer``."""
    return f"blocks.{layer}.hook_resid_post"


POS_EMBED_HOOK = "hook_pos_embed"  # ``[batch, pos, d_model]`` a learned positional embedding's rows


def layer_of(hook: Any) -> int:
    """The block index of a hook point or hook name (``blocks.3.attn.hook_z`` -> 3)."""
    name = hook if isinstance(hook, str) else hook.name
    return int(name.split(".")[1])


__all__ = [
    "POS_EMBED_HOOK",
    "Hook",
    "attn_out_hook",
    "mlp_in_hook",
    "mlp_out_hook",
    "qkv_hook",
    "resid_mid_hook",
    "resid_pre_hook",
    "k_hook",
    "layer_of",
    "pattern_hook",
    "q_hook",
    "resid_post_hook",
    "v_hook",
    "z_hook",
]
