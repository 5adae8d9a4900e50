"""The stream engine checks itself before any real work: on a short prefix of the probe, its row
statistics must reproduce the model's own attention pattern.

An architecture the capture does not fully understand (an attention class that bypasses Hugging
Face's attention interface, a bias or mask it does not pass on, a feature of next year) would
otherwise give plausible wrong numbers. :func:`check_stream_conformance` runs the first
:data:`PREFIX` tokens of the first sequence (its real tokens, on a padded probe) twice: through the stream engine (capture, row pass,
gathered weights) and through the pattern engine (``hook_pattern``, the model's own eager
attention), and compares each row's largest weight and the weights at a few ``(q, k)`` pairs per
row (key 0, the previous key, the query itself, the middle of the row). A layer that never called
the capture, or an error above :func:`tolerance`, is a :class:`~interp.errors.UsageError` that says
what differed and to use the pattern engine. A model that passed is remembered (weakly): the check
costs two forwards of :data:`PREFIX` tokens once per model.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp.adapters import AttentionInputs, HookedModel, adapter_for, describe
from interp.adapters.info import attention_module
from interp.errors import UsageError
from interp.hooks import layer_of, pattern_hook, resid_post_hook
from interp.stream.blockwise import own_attention
from interp.stream.passes import gather_pass, row_pass

PREFIX = 64
_PASSED: weakref.WeakSet = weakref.WeakSet()


def tolerance(dtype: torch.dtype) -> float:
    """Largest weight error accepted: float32 math differs by rounding only; half precision by more."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2


def guard_pairs(n: int) -> Int[Tensor, "m 3"]:
    """``(0, q, k)`` rows: for every query, key 0, the previous key, itself and the middle key."""
    rows = []
    for q in range(n):
        for k in sorted({0, max(q - 1, 0), q, q // 2, n - 1 if q == n - 1 else q}):
            rows.append((0, q, k))
    return torch.tensor(rows, dtype=torch.long)


def attention_layers(model: HookedModel) -> list[int]:
    """The layers whose attention is a softmax over keys (see :attr:`ModelInfo.attention_layers`)."""
    return list(describe(model).attention_layers)


def architecture(model: HookedModel, layer: int) -> str:
    """``model_type (AttentionClass)`` of a bridge's layer, or the model's class name."""
    hf = getattr(model, "original_model", None)
    model_type = getattr(getattr(hf, "config", None), "model_type", None) or type(model).__name__
    attn = attention_module(model, layer)
    inner = getattr(attn, "original_component", attn)
    return f"{model_type} ({type(inner).__name__})"


def check_stream_conformance(
    model: HookedModel,
    tokens: Tensor,
    *,
    force: bool = False,
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
) -> float:
    """Refuse (:class:`UsageError`) unless the stream engine reproduces ``model``'s own attention on
    the first :data:`PREFIX` tokens of ``tokens[0]``; returns the largest error seen (0 if the model
    passed before and ``force`` is False). With ``attention_mask`` (a padded probe's) the prefix is
    taken from the first sequence's real tokens only: an unpadded stretch of its text."""
    if model in _PASSED and not force:
        return 0.0
    adapter = adapter_for(model)
    info = describe(model)
    layers = attention_layers(model)
    stop = resid_post_hook(info.n_layers - 1)
    first = tokens[0] if attention_mask is None else tokens[0][attention_mask[0].to(tokens.device).bool()]
    prefix = first[None, : min(PREFIX, first.shape[0])].to(info.device)
    n = prefix.shape[1]
    pairs = guard_pairs(n)
    got: dict[int, tuple[Tensor, Tensor]] = {}

    def on_attention(a: AttentionInputs) -> None:
        r = row_pass(a)
        got[a.layer] = (torch.exp(r.max - r.lse)[0].cpu(), gather_pass(a, r.lse, pairs).cpu())

    failed: Exception | None = None
    with adapter.capture_attention(on_attention, attend=own_attention) as hooks:
        try:
            adapter.run_with_reducers(prefix, hooks, stop_after=stop)
        except UsageError:
            raise
        except Exception as e:  # e.g. an attention class of its own that needs the [T, T] mask we withhold
            failed = e
    missing = [layer for layer in layers if layer not in got]
    if missing:
        raise UsageError(
            f"the stream engine cannot run {architecture(model, missing[0])}: its attention does not call "
            f"Hugging Face's attention interface (no q and k from layer(s) {missing}); use engine='pattern'",
            params="engine",
        ) from failed
    if failed is not None:
        raise failed
    want: dict[int, tuple[Tensor, Tensor]] = {}

    def grab(p: Tensor, hook: Any) -> None:
        p = p.detach().float()[0].cpu()
        want[layer_of(hook)] = (p.amax(-1), p[:, pairs[:, 1], pairs[:, 2]].T)

    adapter.run_with_reducers(prefix, [(pattern_hook(layer), grab) for layer in layers], stop_after=stop)
    worst, where = 0.0, layers[0]
    for layer in layers:
        err = max(float((got[layer][i] - want[layer][i]).abs().max()) for i in range(2))
        if not err <= worst:  # NaN counts as the worst
            worst, where = err, layer
    dtype = next(iter(model.parameters())).dtype
    if not worst <= tolerance(dtype):
        raise UsageError(
            f"the stream engine does not reproduce {architecture(model, where)}'s own attention on a "
            f"{n}-token prefix (max weight error {worst:.2g} in layer {where}): use engine='pattern'",
            params="engine",
        )
    _PASSED.add(model)
    return worst


__all__ = ["PREFIX", "attention_layers", "check_stream_conformance", "guard_pairs", "tolerance"]
