"""Run a hooked model with only the hooks an analysis needs, and stop as soon as it has them.

Analyses reduce activations *inside* the hook (a pattern becomes a few numbers per head as it is
produced), so nothing of size ``pos x pos`` outlives its layer. When the last hook an analysis needs
has fired, :func:`run_with_reducers` stops the forward pass by raising from a hook: the layers above
and the unembedding are never run.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

Hook = Callable[[Tensor, Any], Any]


class _StopForward(Exception):
    """Raised from a hook to end a forward pass that has given all it was asked for."""


def run_with_reducers(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    fwd_hooks: Sequence[tuple[str, Hook]],
    *,
    stop_after: str | None = None,
    grad: bool = False,
) -> Any:
    """``model.run_with_hooks(tokens, fwd_hooks)``, ending the pass right after ``stop_after`` fires.

    Returns the logits when the pass runs to the end, ``None`` when it was stopped early.
    """
    hooks = list(fwd_hooks)
    if stop_after is not None:

        def stop(_: Tensor, hook: Any) -> None:
            raise _StopForward

        hooks.append((stop_after, stop))  # registered last: fires after the reducers on that point
    with torch.set_grad_enabled(grad):
        try:
            return model.run_with_hooks(tokens, fwd_hooks=hooks)
        except _StopForward:
            return None
