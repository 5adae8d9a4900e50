"""Attribution patching and EAP-IG: estimates of every patch from a few forwards and backwards.

Each head's output is gated as ``r + g (z - r)`` (the gated forward of
:mod:`interp.ablation.gradient`, with the ``patch`` kind's replacement ``r``: the donor prompt's
output), ``g = 1`` being the unpatched run; patching the head moves ``g`` to 0, so its effect on the
metric is estimated as ``-dM/dg = (r - z) . dM/dz``, kept signed. One gate per sequence and head
estimates patching the head at every position, one per sequence, position and head patching it at
that position alone. Exact where the metric is linear in the head's output (a last-layer head whose
output reaches the logits without a normalisation in between), an approximation elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from interp.ablation.gradient import frozen, gated_forward
from interp.ablation.modes import PatchAblation
from interp.patching.core import Setup


def attribution_values(run: Setup, *, steps: int = 1) -> tuple[Float[Tensor, "unit pair"], dict[str, Any]]:
    """The estimated patched metric per unit (head, or head and position) and pair.

    ``steps = 1``: attribution patching, the gradient at the unpatched run (every gate 1). ``steps =
    m > 1``: EAP-IG at head granularity, the gradient averaged over every gate at ``k / m`` for ``k =
    1 .. m`` (every head's output moved together along the straight line from its donor value to its
    own), Hanna et al. (2024)'s integrated gradients; ``m`` forwards and backwards per minibatch."""
    info, T = run.info, run.task.seq_len
    L, H = info.n_layers, info.n_heads
    ablation = PatchAblation.fit(run.model, run.probe, minibatch=run.config.minibatch)
    base = torch.zeros(L, H, dtype=torch.bool)
    n = run.task.n_pairs
    step = run.config.minibatch or n
    parts = []
    for start in range(0, n, step):
        rows = torch.arange(start, min(start + step, n))
        tokens = run.probe.tokens[rows.to(run.probe.tokens.device)]
        shape = (len(rows), H) if run.by == "head" else (len(rows), T, H)
        delta = torch.zeros(len(rows), L, *shape[1:])
        for k in range(1, steps + 1):
            gates = [torch.full(shape, k / steps, device=tokens.device, requires_grad=True) for _ in range(L)]
            with frozen(run.model):
                value = gated_forward(run.model, tokens, run.metric, ablation, gates, base, rows, None)
                grads = torch.autograd.grad(value.sum(), gates, allow_unused=True)
            for l, g in enumerate(grads):
                if g is not None:
                    delta[:, l] -= g.detach().float().cpu() / steps
        parts.append(delta)  # [b, L, H] or [b, L, T, H]
    delta = torch.cat(parts)
    if run.by == "position":
        delta = rearrange(delta, "b l t h -> b l h t")
    units = [delta[:, l, h] if p is None else delta[:, l, h, p] for l, h in run.heads for p in run.positions]
    values = run.unpatched[None] + torch.stack(units)
    passes = steps * -(-n // step)
    return values, {"forwards": passes, "backwards": passes, **({"steps": steps} if steps > 1 else {})}
