"""Attention patterns of every head on one short sequence, and the tokens' labels, for the viewers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters import HookedModel, run_with_reducers
from interp.hooks import layer_of, pattern_hook
from interp.models import describe
from interp.texts import shown_text, token_label


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


def token_labels(model: HookedModel, ids: Sequence[int], probe: Any = None) -> list[str]:
    """A readable label per position, :func:`interp.texts.token_label` (the token's text, a leading
    space as ``␣``, a partial character as its bytes). Without a tokenizer: :func:`interp.sinks.token_texts`."""
    from interp.sinks import token_texts

    ids = [int(i) for i in ids]
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        names = token_texts(model, probe, sorted(set(ids))) if probe is not None else {i: f"<{i}>" for i in ids}
        return [shown_text(names[i]) for i in ids]
    return [token_label(tokenizer, i) for i in ids]
