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
from interp.ablation.replay import read_out, unembeds_read_positions
from interp.patching.core import Setup, refuse_equal
from interp.progress import tqdm
from interp.results import plural


def attribution_values(run: Setup, *, steps: int = 1) -> tuple[Float[Tensor, "unit pair"], dict[str, Any]]:
    """The estimated patched metric per unit (head, or head and position) and pair.

    ``steps = 1``: attribution patching, the gradient at the unpatched run (every gate 1). ``steps =
    m > 1``: EAP-IG at head granularity, the gradient averaged over every gate at ``k / m`` for ``k =
    1 .. m`` (every head's output moved together along the straight line from its donor value to its
    own), Hanna et al. (2024)'s integrated gradients; ``m`` forwards and backwards per minibatch.

    The passes are the least any attribution needs: per minibatch one forward of the donor prompts
    (their head outputs, and their metric) and the gated forwards and backwards of the run's prompts
    (the one at gate 1 gives their metric). The run's baselines (``run.clean``, ``run.corrupted``) are
    set from them, refused when they agree (:func:`~interp.patching.core.refuse_equal`). Where the
    metric reads the logits at given positions only those are unembedded, once a sequence has shown
    that this gives the model's own logits (:func:`~interp.ablation.replay.unembeds_read_positions`)."""
    model, info, T = run.model, run.info, run.task.seq_len
    L, H = info.n_layers, info.n_heads
    metric, probe = run.metric, run.probe
    read_positions = unembeds_read_positions(model, probe.tokens[:1], metric, L)
    donor_values: list[Tensor] = []

    def donor_forward(tokens: Tensor, hooks: list, rows: Tensor) -> None:
        out = read_out(model, tokens, metric, hooks, L, read_positions=read_positions)
        donor_values.append(metric(out, tokens, out, rows).cpu())

    ablation = PatchAblation.fit(model, probe, minibatch=run.config.minibatch, forward=donor_forward)
    base = torch.zeros(L, H, dtype=torch.bool)
    n = run.task.n_pairs
    step = run.config.minibatch or n
    parts, own_values = [], []
    starts = range(0, n, step)
    sizes = f"{plural(n, 'pair')}, {len(starts)} minibatch(es) of {steps:,} gated forward and backward pass(es) each"
    desc = "attribution patching" + (f" (eap-ig, {steps} steps)" if steps > 1 else "")
    bar = tqdm(
        total=len(starts) * steps, desc=desc, disable=not run.config.progress or steps == 1, sizes=sizes, unit="pass"
    )
    for start in starts:  # the bar counts passes: an integration's steps show as they go (one pass: no bar)
        rows = torch.arange(start, min(start + step, n))
        tokens = probe.tokens[rows.to(probe.tokens.device)]
        shape = (len(rows), H) if run.by == "head" else (len(rows), T, H)
        delta = torch.zeros(len(rows), L, *shape[1:])
        for k in range(1, steps + 1):
            gates = [torch.full(shape, k / steps, device=tokens.device, requires_grad=True) for _ in range(L)]
            with frozen(model):
                value = gated_forward(
                    model, tokens, metric, ablation, gates, base, rows, None, read_positions=read_positions
                )
                grads = torch.autograd.grad(value.sum(), gates, allow_unused=True)
            if k == steps:  # every gate 1: the run's own prompts, unpatched
                own_values.append(value.detach().cpu())
            for l, g in enumerate(grads):
                if g is not None:
                    delta[:, l] -= g.detach().float().cpu() / steps
            bar.update()
        parts.append(delta)  # [b, L, H] or [b, L, T, H]
    bar.close()
    own, donor = torch.cat(own_values).float(), torch.cat(donor_values).float()
    run.clean, run.corrupted = (donor, own) if run.direction == "denoise" else (own, donor)
    refuse_equal(run.clean, run.corrupted, metric, run.normalised)
    delta = torch.cat(parts)
    if run.by == "position":
        delta = rearrange(delta, "b l t h -> b l h t")
    units = [delta[:, l, h] if p is None else delta[:, l, h, p] for l, h in run.heads for p in run.positions]
    values = run.unpatched[None] + torch.stack(units)
    passes = steps * -(-n // step)
    facts = {
        "forwards": passes,
        "backwards": passes,
        "donor_forwards": -(-n // step),
        "unembedded": _unembedded(run, read_positions),
    }
    return values, {**facts, **({"steps": steps} if steps > 1 else {})}


def _unembedded(run: Setup, read_positions: bool) -> str:
    """Which positions the passes unembedded, for the result's meta."""
    return f"positions {list(run.metric.positions)}" if read_positions else "every position"
