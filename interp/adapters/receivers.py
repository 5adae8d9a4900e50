"""Where the edge graph's receivers read (:mod:`interp.patching.graph`): the norms their inputs pass
through and how each input is reached on a forward, for edge patching and edge attribution alike.

- a head's queries, keys and values read its layer's input norm (``ln1``);
- an MLP reads its own norm (``ln2``), or attention's where a parallel block shares one (GPT-J);
- the logits read the final norm (``ln_final``).

A norm's input is reached by a forward pre-hook on its module; an MLP's input (after its norm) by
its ``mlp.hook_in`` where the model has one (a bridge fires it whether or not the module is
called), else by a pre-hook on the MLP module itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from interp.hooks import mlp_in_hook

PreHook = Callable[[Tensor], Tensor | None]  # a norm's or an MLP's input in; a replacement, or None


@dataclass(frozen=True)
class ReceiverNorms:
    """The norms the receivers of ``model`` read through: ``heads[l]``, ``mlps[l]`` and ``final``."""

    model: Any
    heads: dict[int, torch.nn.Module]
    mlps: dict[int, torch.nn.Module]
    final: torch.nn.Module

    @classmethod
    def of(cls, model: Any, mlp_layers: Iterable[int]) -> ReceiverNorms:
        blocks = model.blocks
        heads = {l: blocks[l].ln1 for l in range(len(blocks))}
        mlps = {}
        for l in mlp_layers:
            own = getattr(blocks[l], "ln2", None)
            mlps[l] = own if isinstance(own, torch.nn.Module) else heads[l]
        return cls(model, heads, mlps, model.ln_final)

    def shared(self, layer: int) -> bool:
        """Does layer ``layer``'s MLP read through its attention's norm (a parallel block sharing one)?"""
        return self.mlps[layer] is self.heads[layer]

    def computed(self, module: torch.nn.Module) -> Callable[[Tensor], Tensor]:
        """``module``'s own computation, for inputs the edge replay forms itself: a bridge's norm
        in its native mode returns its Hugging Face module's output, after working out the
        statistics its hooks would see; that module is called directly, once (bit for bit the
        same). Any other norm is called as it is."""
        inner = getattr(module, "original_component", None)
        native = getattr(module, "use_native_layernorm_autograd", False) or getattr(
            getattr(module, "config", None), "layer_norm_folding", False
        )
        if isinstance(inner, torch.nn.Module) and native and not isinstance(inner, torch.nn.Identity):
            return inner
        return module

    def watch(self, stack: ExitStack, module: torch.nn.Module, fn: PreHook) -> None:
        """``fn`` on ``module``'s first input at every call of it, for as long as ``stack`` is open
        (what ``fn`` returns, if not None, replaces that input)."""
        handle = module.register_forward_pre_hook(on_input(fn))
        stack.callback(handle.remove)

    def mlp_input(self, stack: ExitStack, layer: int, fn: Callable[[Tensor, Any], Tensor | None]) -> list:
        """``fn(x, hook)`` on layer ``layer``'s MLP input after its norm: returned as a forward hook
        ``(name, fn)`` for the caller's run where the model has ``mlp.hook_in``, else put on the MLP
        module as a pre-hook for as long as ``stack`` is open (and ``[]`` returned)."""
        return self._input(stack, mlp_in_hook(layer), self.model.blocks[layer].mlp, fn)

    def logits_input(self, stack: ExitStack, fn: Callable[[Tensor, Any], Tensor | None]) -> list:
        """``fn(x, hook)`` on the unembedding's input (after the final norm), as :meth:`mlp_input`."""
        return self._input(stack, "unembed.hook_in", self.model.unembed, fn)

    def _input(self, stack: ExitStack, name: str, module: torch.nn.Module, fn: Callable) -> list:
        if name in getattr(self.model, "hook_dict", {}):  # a bridge: its hook, whether or not the module is called
            return [(name, fn)]
        self.watch(stack, module, lambda x: fn(x, None))
        return []


def on_input(hook: Callable[[Tensor], Tensor | None]) -> Callable:
    """``hook`` on a module's first argument, as a forward pre-hook (its result, if not None,
    replaces the argument)."""

    def pre(module: Any, args: tuple) -> tuple | None:
        out = hook(args[0])
        return None if out is None else (out, *args[1:])

    return pre


__all__ = ["ReceiverNorms", "on_input"]
