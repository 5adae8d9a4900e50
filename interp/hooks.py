"""Hook names: TransformerLens's, on the bridge and on the toy alike, and :func:`layer_of`.

Running a model with reducers (stopping early, freeing kept patterns) is the model adapters' job:
:func:`interp.adapters.run_with_reducers`, also importable from here under its old name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor

if TYPE_CHECKING:
    from interp.adapters import run_with_reducers
    from interp.adapters.bridge import keeps_patterns, release_kept_pattern

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


# --------------------------------------------------------------------------------------------
# the runner lives with the model adapters; these names stay importable from here


_MOVED = {  # name -> where it lives now
    "run_with_reducers": "interp.adapters",
    "keeps_patterns": "interp.adapters.bridge",
    "release_kept_pattern": "interp.adapters.bridge",
}


def __getattr__(name: str) -> Any:
    """``interp.hooks.run_with_reducers`` and kin, resolved on first use from :mod:`interp.adapters`
    (which imports the hook names above, so this module cannot import it back at load time)."""
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Hook",
    "k_hook",
    "keeps_patterns",
    "layer_of",
    "pattern_hook",
    "q_hook",
    "release_kept_pattern",
    "resid_post_hook",
    "run_with_reducers",
    "v_hook",
    "z_hook",
]
