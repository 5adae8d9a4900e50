"""What the ablation replay does to a model's modules: record and re-run its blocks, read logits from
the final residual, and two exact shortcuts (each a context manager around a replay, for any model
whose blocks expose ``attn`` and ``mlp``). The adapters' methods (:meth:`~interp.adapters.Adapter.run_blocks`,
:meth:`~interp.adapters.Adapter.unembed`, :meth:`~interp.adapters.Adapter.reuse_attention`, ...)
reach them; nothing outside :mod:`interp.adapters` calls a block or an unembedding itself.

- :func:`recorded_blocks` / :func:`run_blocks`: each block's input and call, recorded by a
  forward pre-hook; blocks ``l, l + 1, ...`` run again on a residual.
- :func:`logits_from_resid`: the model's own head on the final residual: the final norm and the
  unembedding, after a masked-LM head's dense + activation (BERT, RoBERTa: the Hugging Face head
  module runs itself) and before a final logit softcap (Gemma 2: ``cap * tanh(logits / cap)``).

- :func:`reused_attention`: the replay for heads of layer ``l`` starts at block ``l``, whose input is
  the clean pass's. Its attention output is then the clean one plus the ablated heads' change,
  ``sum_h (r_h - z_h) W_O[h]`` (attention output is linear in ``hook_z``): the block's attention
  module returns that instead of recomputing queries, keys, values and patterns.
- :func:`trimmed_mlp`: the last block's MLP sees only the positions the metric reads (an MLP is
  positionwise); elsewhere its output is 0, and those positions of the final residual are never read.

Both are exact up to rounding for the usual pre-norm and parallel blocks; the replay's self-check
(replays under ablation against plain hooked runs) decides whether a model may use them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from einops import einsum
from jaxtyping import Bool, Float
from torch import Tensor

Call = tuple[tuple, dict]


@contextmanager
def recorded_blocks(
    blocks: Any, n_layers: int, *, keep_attention: bool, detach_call: Callable[[tuple, dict], Any]
) -> Iterator[tuple[list, list]]:
    """Inside the block, every forward records how each block was called (``calls[l]``: what
    ``detach_call(args, kwargs)`` makes of it) and, with ``keep_attention``, each block's attention
    output (``attn_out[l]``: the tensor and the length of the tuple it came in, ``None`` for a bare
    tensor). Lists stay ``None`` where nothing ran (a layer without ``attn`` keeps no output)."""
    calls: list[Any] = [None] * n_layers
    attn_out: list[Any] = [None] * n_layers
    handles = []
    if blocks is not None and len(blocks) == n_layers:

        def record(layer: int) -> Callable:
            def pre(module: Any, args: tuple, kwargs: dict) -> None:
                calls[layer] = detach_call(args, kwargs)

            return pre

        def keep_attn(layer: int) -> Callable:
            def post(module: Any, args: tuple, out: Any) -> None:
                if isinstance(out, tuple) and out and isinstance(out[0], Tensor):
                    attn_out[layer] = (out[0].detach(), len(out))
                elif isinstance(out, Tensor):
                    attn_out[layer] = (out.detach(), None)

            return post

        handles = [b.register_forward_pre_hook(record(l), with_kwargs=True) for l, b in enumerate(blocks)]
        if keep_attention:
            handles += [
                b.attn.register_forward_hook(keep_attn(l))
                for l, b in enumerate(blocks)
                if isinstance(getattr(b, "attn", None), torch.nn.Module)
            ]
    try:
        yield calls, attn_out
    finally:
        for h in handles:
            h.remove()


def run_blocks(
    blocks: Any,
    hidden: Float[Tensor, "batch pos d_model"],
    start: int,
    calls: list[Call],
    after_block: Callable[[int], None],
) -> Float[Tensor, "batch pos d_model"]:
    """Blocks ``start, start + 1, ...`` (one per call in ``calls``) on ``hidden``: the final residual.
    ``after_block(l)`` runs after each (the bridge frees the pattern it keeps there)."""
    for l, (args, kwargs) in enumerate(calls, start):
        out = blocks[l](hidden, *args, **kwargs)
        hidden = out[0] if isinstance(out, (tuple, list)) else out
        after_block(l)
    return hidden


@contextmanager
def attention_calls(
    model: Any, layers: Iterable[int], outputs: Iterable[int] = ()
) -> Iterator[tuple[dict[int, tuple[tuple, dict]], dict[int, Tensor]]]:
    """Record, while the block runs, each call of ``layers``' attention modules (their positional and
    keyword arguments, detached) and the output of ``outputs``' (the first of a tuple, detached)."""
    calls: dict[int, tuple[tuple, dict]] = {}
    outs: dict[int, Tensor] = {}

    def record(layer: int) -> Any:
        def pre(module: Any, args: tuple, kwargs: dict) -> None:
            calls[layer] = (_detached(args), _detached(kwargs))

        return pre

    def output(layer: int) -> Any:
        def post(module: Any, args: tuple, out: Any) -> None:
            outs[layer] = (out[0] if isinstance(out, (tuple, list)) else out).detach()

        return post

    blocks = model.blocks
    handles = [blocks[l].attn.register_forward_pre_hook(record(l), with_kwargs=True) for l in layers]
    handles += [blocks[l].attn.register_forward_hook(output(l)) for l in outputs]
    try:
        yield calls, outs
    finally:
        for h in handles:
            h.remove()


def _detached(x: Any) -> Any:
    """``x`` with every tensor in it (in tuples and lists) detached."""
    if isinstance(x, Tensor):
        return x.detach()
    if isinstance(x, (tuple, list)):
        return type(x)(_detached(v) for v in x)
    return x


def masked_lm_head(model: Any) -> torch.nn.Module | None:
    """The Hugging Face module that turns an encoder's final residual into logits, when the model has
    a transform (dense + activation) before its final norm (``mlm_head`` on the bridge): the smallest
    module of the wrapped model holding both that dense layer and the unembedding."""
    dense, unembed = getattr(model, "mlm_head", None), getattr(model, "unembed", None)
    hf_model = getattr(model, "original_model", None)
    if dense is None or unembed is None or hf_model is None:
        return None
    best: tuple[int, Any] | None = None
    for module in hf_model.modules():
        inside = {id(m) for m in module.modules()}
        if id(dense) in inside and id(unembed) in inside:
            size = len(inside)
            if best is None or size < best[0]:
                best = (size, module)
    return None if best is None else best[1]


def logits_from_resid(model: Any, hidden: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos vocab"]:
    """Logits from the final residual stream exactly as the model's forward makes them."""
    head = masked_lm_head(model)
    if head is not None:
        out = head(hidden)
        logits = out[0] if isinstance(out, (tuple, list)) else out
    else:
        logits = model.unembed(model.ln_final(hidden))
    cap = float(getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0)
    if cap > 0:  # Gemma 2's final logit softcapping (TransformerLens's field; its forward applies it too)
        logits = cap * torch.tanh(logits / cap)
    return logits


def by_head(z: Tensor, n_heads: int) -> Float[Tensor, "batch pos head d_head"]:
    """``hook_z`` with its head axis of size ``n_heads``.

    The last two axes of ``hook_z`` flatten to the output projection's input, ``n_heads x d_head``
    wide. TransformerLens reshapes it with ``cfg.d_head``, which on latent attention (DeepSeek-V3) is
    the rotary part of the query/key head, not the value head: its ``hook_z`` comes as
    ``[batch, pos, 8, 8]`` for 4 heads of 16. Viewed again by head count, every head is its own slice
    of the projection's input, as in Hugging Face's model.
    """
    if z.shape[-2] == n_heads:
        return z
    return z.reshape(*z.shape[:-2], n_heads, -1)


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
    ablate: Bool[Tensor, "rep head"] | Bool[Tensor, "rep head pos"],
) -> Iterator[None]:
    """Inside the block ``attn`` returns ``clean + sum_h ablate[r, h] per_head[..., h, :]`` for each of
    ``rep`` batched copies, without computing anything (``n_outputs``: the length of the tuple the
    module returns, its first item the output; ``None`` when it returns a tensor). A mask with a
    position axis (``[rep, head, pos]``) adds each head's change at its masked positions only."""
    pattern = "r h p, b p h m -> r b p m" if ablate.ndim == 3 else "r h, b p h m -> r b p m"
    delta = einsum(ablate.to(per_head.dtype), per_head, pattern)
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


__all__ = [
    "by_head",
    "head_outputs",
    "logits_from_resid",
    "masked_lm_head",
    "recorded_blocks",
    "run_blocks",
    "reused_attention",
    "trimmed_mlp",
]
