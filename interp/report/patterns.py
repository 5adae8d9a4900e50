"""Attention patterns of every head on one short sequence, for the atlas's pattern viewer."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters import HookedModel, run_with_reducers
from interp.hooks import layer_of, pattern_hook
from interp.models import describe


def attention_patterns(model: HookedModel, tokens: Int[Tensor, " pos"]) -> Float[Tensor, "layer head q k"]:
    """Every head's attention pattern on one sequence; only ``hook_pattern`` is captured and the
    pass stops after the last layer's pattern."""
    info = describe(model)
    if tokens.ndim != 1:
        raise ValueError(f"expected one sequence of token ids, got shape {tuple(tokens.shape)}")
    n = tokens.shape[0]
    out = torch.zeros(info.n_layers, info.n_heads, n, n)

    def grab(pattern: Float[Tensor, "batch head q k"], hook: Any) -> None:
        out[layer_of(hook)] = pattern[0].detach().float().cpu()

    last = pattern_hook(info.n_layers - 1)
    run_with_reducers(
        model,
        tokens[None].to(info.device),
        [(pattern_hook(l), grab) for l in range(info.n_layers)],
        stop_after=last,
    )
    return out
