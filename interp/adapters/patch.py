"""Exact shortcuts of the ablation replay, each a context manager around a replay (for any model
whose blocks expose ``attn`` and ``mlp``; :meth:`interp.adapters.Adapter.reuse_attention` and
:meth:`~interp.adapters.Adapter.trim_mlp` reach them by layer).

- :func:`reused_attention`: the replay for heads of layer ``l`` starts at block ``l``, whose input is
  the clean pass's. Its attention output is then the clean one plus the ablated heads' change,
  ``sum_h (r_h - z_h) W_O[h]`` (attention output is linear in ``hook_z``): the block's attention
  module returns that instead of recomputing queries, keys, values and patterns.
- :func:`trimmed_mlp`: the last block's MLP sees only the positions the metric reads (an MLP is
  positionwise); elsewhere its output is 0, and those positions of the final residual are never read.

Both are exact up to rounding for the usual pre-norm and parallel blocks; the engine's self-check
(replays under ablation against plain hooked runs) decides whether a model may use them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from einops import einsum
from jaxtyping import Bool, Float
from torch import Tensor


def head_outputs(
    z: Float[Tensor, "batch pos head d_head"], r: Tensor, W_O: Float[Tensor, "head d_head d_model"]
) -> Float[Tensor, "batch pos head d_model"]:
    """Each head's change of the attention output when its ``z`` is replaced by ``r``."""
    return einsum((r - z).to(W_O.dtype), W_O, "b p h d, h d m -> b p h m")


@contextmanager
def reused_attention(
    attn: torch.nn.Module,
    clean: Float[Tensor, "batch pos d_model"],
    n_outputs: int | None,
    per_head: Float[Tensor, "batch pos head d_model"],
    ablate: Bool[Tensor, "rep head"],
) -> Iterator[None]:
    """Inside the block ``attn`` returns ``clean + sum_h ablate[r, h] per_head[..., h, :]`` for each of
    ``rep`` batched copies, without computing anything (``n_outputs``: the length of the tuple the
    module returns, its first item the output; ``None`` when it returns a tensor)."""
    delta = einsum(ablate.to(per_head.dtype), per_head, "r h, b p h m -> r b p m")
    new = (clean[None] + delta.to(clean.dtype)).flatten(0, 1)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return new if n_outputs is None else (new, *([None] * (n_outputs - 1)))

    # set on the instance itself: module wrappers (the TransformerBridge's) forward attribute writes
    # to the module they wrap
    object.__setattr__(attn, "forward", forward)
    try:
        yield
    finally:
        object.__delattr__(attn, "forward")


@contextmanager
def trimmed_mlp(mlp: torch.nn.Module, keep: Tensor, T: int) -> Iterator[None]:
    """Inside the block ``mlp`` runs on positions ``keep`` only; its output elsewhere is 0."""

    def pre(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        x = args[0]
        return (x[:, keep.to(x.device)], *args[1:]), kwargs

    def post(module: Any, args: tuple, out: Tensor) -> Tensor:
        full = out.new_zeros(out.shape[0], T, *out.shape[2:])
        full[:, keep.to(out.device)] = out
        return full

    handles = [mlp.register_forward_pre_hook(pre, with_kwargs=True), mlp.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


__all__ = ["head_outputs", "reused_attention", "trimmed_mlp"]
