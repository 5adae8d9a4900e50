"""The bundled toy transformer as an :class:`~interp.adapters.base.Adapter`.

Its attention runs on the flash path whenever nobody hooks the pattern; the capture switches the
flash path on inside the block (a toy built with ``use_flash=False`` would form the pattern) and
catches ``q`` and ``k`` at ``hook_q``/``hook_k``, calling back from ``hook_v`` (the toy has learned
positions, no rotary: these are exactly what it attends with). On a padded run the callback's
:class:`~interp.adapters.AttentionInputs` carry the run's mask as ``key_mask``, as the bridge's do.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Bool, Int
from torch import Tensor

from interp.adapters.base import Attend, AttentionInputs, HookedAdapter, HookList, OnAttention, padded_positions
from interp.hooks import k_hook, layer_of, q_hook, v_hook

# the padding mask of the padded run each toy is in (absent: none, or every position real); read by
# the capture's callback, which fires inside that run
_KEY_MASKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_toy(model: Any) -> bool:
    from interp.toy.model import ToyTransformer

    return isinstance(model, ToyTransformer)


class ToyAdapter(HookedAdapter):
    """:class:`interp.toy.ToyTransformer`: hook points everywhere, a flash path of its own."""

    @contextlib.contextmanager
    def capture_attention(self, on_attention: OnAttention, attend: Attend | None = None) -> Iterator[HookList]:
        attns = [block.attn for block in self.model.blocks]
        saved = [a.use_flash for a in attns]
        try:
            for a in attns:  # a toy built with use_flash=False would form the pattern itself
                a.use_flash = True
            yield self._capture_hooks(on_attention)
        finally:
            for a, flag in zip(attns, saved):
                a.use_flash = flag

    def check_capture(self) -> None:
        return None

    def padding_inputs(
        self, tokens: Int[Tensor, "batch pos"], attention_mask: Bool[Tensor, "batch pos"]
    ) -> tuple[dict[str, Any], HookList]:
        """The toy takes no mask: hooks give each token its position in its text alone (learned
        positions read at ``cumsum(mask) - 1``) and drop padded keys from every attention's logits
        (which runs the reference path: the flash path has no key mask). The capture reports the
        mask as each layer's ``key_mask`` until the run ends."""
        mask = attention_mask.to(tokens.device).bool()
        if not bool(mask.all()):
            _KEY_MASKS[self.model] = mask
        positions = padded_positions(mask)

        def position(pos_embed: Tensor, hook: Any) -> Tensor:
            return self.model.pos_embed(positions.to(pos_embed.device)).to(pos_embed.dtype)

        def keys(scores: Tensor, hook: Any) -> Tensor:  # a finite fill: a padded query row stays finite
            padded = ~mask.to(scores.device)[:, None, None, :]
            return scores.masked_fill(padded, torch.finfo(scores.dtype).min)

        hooks: HookList = [("hook_pos_embed", position)]
        hooks += [(f"blocks.{layer}.attn.hook_attn_scores", keys) for layer in range(self.n_layers)]
        return {}, hooks

    def after_run(self) -> None:
        _KEY_MASKS.pop(self.model, None)

    def _capture_hooks(self, on_attention: OnAttention) -> HookList:
        caught: dict[str, Tensor] = {}
        to_sdpa = lambda t: rearrange(t.detach(), "b p h d -> b h p d")  # noqa: E731

        def grab(t: Tensor, hook: Any) -> None:
            caught[hook.name.rsplit("_", 1)[-1]] = t

        def fire(v: Tensor, hook: Any) -> None:
            layer = layer_of(hook)
            attn = self.model.blocks[layer].attn
            q, k = to_sdpa(caught.pop("q")), to_sdpa(caught.pop("k"))
            key_mask = _KEY_MASKS.get(self.model)
            on_attention(AttentionInputs(layer, q, k, to_sdpa(v), float(attn.scale), attn.causal, key_mask=key_mask))

        hooks: HookList = []
        for layer in range(self.n_layers):
            hooks += [(q_hook(layer), grab), (k_hook(layer), grab), (v_hook(layer), fire)]
        return hooks


__all__ = ["ToyAdapter", "is_toy"]
