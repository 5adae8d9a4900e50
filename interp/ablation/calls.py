"""Recorded block calls: what a model passed to each block, and how to pass it again for ``rep`` ablations.

The replay runs blocks ``l .. L-1`` itself, so it must hand each block what the model
handed it (attention masks, position ids, rotary tables, ...). Each argument is classified once, by
recording the same model's block calls at two batch sizes: a tensor whose leading axis follows the
batch (or the batch folded batch-major with another axis, as Bloom's ``[batch * head, 1, T]`` ALiBi
bias) is per sequence (``"seq"``: repeated once per batched ablation), a tensor equal in shape at
both sizes is shared (``"shared"``: passed as is). Containers (tuple, list, dict) are walked;
anything else that is not a plain value makes the call unreplayable, and the replay says why.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from interp.errors import AblationError

Call = tuple[tuple, dict]
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)


class UnreplayableCall(AblationError):
    """A block argument the replay cannot classify or copy."""


def is_cache(x: Any) -> bool:
    return type(x).__name__.endswith("Cache")


def detach_call(args: tuple, kwargs: dict) -> tuple[Tensor, Call]:
    """A block call to replay later: the residual apart, KV caches dropped, ``use_cache`` off."""
    if args:
        hidden, rest = args[0], args[1:]
    else:
        kwargs = dict(kwargs)
        hidden, rest = kwargs.pop("hidden_states"), ()
    rest = tuple(None if is_cache(a) else a for a in rest)
    kw = {k: (None if is_cache(v) else v) for k, v in kwargs.items()}
    if "use_cache" in kw:
        kw["use_cache"] = False
    return hidden.detach(), (rest, kw)


def call_plan(big: Call, small: Call, n_big: int, n_small: int) -> Any:
    """How to expand each argument of a block call, from the same call recorded for ``n_big`` and
    ``n_small`` sequences (``n_big != n_small``). Raises :class:`UnreplayableCall` with the reason."""
    if n_big == n_small:
        raise ValueError("the two recordings must have different batch sizes")

    def walk(a: Any, b: Any, where: str) -> Any:
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
                raise UnreplayableCall(f"{where} is a tensor at one batch size and not at another")
            if a.shape == b.shape:
                return "shared"
            if a.ndim == b.ndim >= 1 and a.shape[1:] == b.shape[1:] and _follows_batch(a.shape[0], b.shape[0]):
                return "seq"
            raise UnreplayableCall(
                f"{where} has shape {list(a.shape)} for {n_big} sequences and {list(b.shape)} for {n_small}"
            )
        if type(a) in (tuple, list):
            if type(b) is not type(a) or len(a) != len(b):
                raise UnreplayableCall(f"{where} changes structure with the batch size")
            return [walk(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b))]
        if type(a) is dict:
            if type(b) is not dict or a.keys() != b.keys():
                raise UnreplayableCall(f"{where} changes keys with the batch size")
            return {k: walk(a[k], b[k], f"{where}[{k!r}]") for k in a}
        if isinstance(a, _PLAIN):
            if a != b:
                raise UnreplayableCall(f"{where} is {a!r} for {n_big} sequences and {b!r} for {n_small}")
            return None
        raise UnreplayableCall(f"{where} is a {type(a).__name__}, which the replay cannot copy per ablation")

    def _follows_batch(a: int, b: int) -> bool:
        # the batch, or the batch folded with another axis batch-major (Bloom's ALiBi is
        # [batch * head, 1, T]): repeating along the leading axis then repeats whole sequences
        return a * n_small == b * n_big and a % n_big == 0 and b % n_small == 0

    (args_a, kw_a), (args_b, kw_b) = big, small
    return walk(list(args_a), list(args_b), "argument"), walk(kw_a, kw_b, "keyword argument")


def expand_call(call: Call, plan: Any, rep: int) -> Call:
    """``call`` for ``rep`` batched copies of its sequences: per-sequence tensors repeated, the rest as is."""

    def grow(x: Any, how: Any) -> Any:
        if how == "seq":
            return x if rep == 1 else x.repeat(rep, *[1] * (x.ndim - 1))
        if isinstance(how, list):
            return type(x)(grow(v, h) for v, h in zip(x, how))
        if isinstance(how, dict):
            return {k: grow(x[k], h) for k, h in how.items()}
        return x

    (args, kwargs), (args_plan, kw_plan) = call, plan
    return tuple(grow(list(args), args_plan)), grow(kwargs, kw_plan)


def eps_of(x: Tensor) -> float:
    return torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0


def replay_tolerance(want: Tensor) -> tuple[float, float]:
    """``want``'s scale, and the largest max error a replay of it may show and still reproduce it:
    batched and unbatched matmuls round differently, so that much is allowed, more in low precision."""
    scale = float(want.abs().max()) + 1e-6
    return scale, max(1e-4, 16 * eps_of(want)) * scale
