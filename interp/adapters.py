"""The one home of model internals: what the analyses need from a hooked model, behind one interface.

:class:`HookedModel` is the shape every public function takes as ``model``: a TransformerLens 4
``TransformerBridge`` or the bundled toy (both expose ``cfg``, ``blocks`` and ``run_with_hooks``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class HookedModel(Protocol):
    """A model with TransformerLens hook points: a ``TransformerBridge`` or the toy."""

    cfg: Any
    blocks: Any

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    def parameters(self, *args: Any, **kwargs: Any) -> Any: ...


__all__ = ["HookedModel"]
