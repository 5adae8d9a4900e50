"""Michel et al.'s gradient importance."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from interp import distributed
from interp.ablation.engine import read_out
from interp.ablation.metrics import Metric, as_metric
from interp.ablation.modes import HeadAblation, head_labels, head_mask
from interp.ablation.sweep import scores_meta
from interp.hooks import z_hook
from interp.models import describe
from interp.probes import TokenProbe
from interp.scores import HeadScores


@contextmanager
def frozen(model: Any) -> Iterator[Any]:
    """Parameters do not require grad inside the block (restored after)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p in params:
            p.requires_grad_(True)


def gated_forward(
    model: Any,
    tokens: Tensor,
    metric: Metric,
    ablation: HeadAblation,
    gates: list[Tensor],
    base: Tensor,
    rows: Tensor,
    reference: Tensor | None,
) -> Tensor:
    """Metric per sequence with every head's output mixed as ``r + g (z - r)`` (base heads at r)."""
    L = len(gates)

    def gate_hook(layer: int) -> Callable:
        def hook(z: Tensor, hook: Any) -> Tensor:
            g = gates[layer].to(z.device)  # blocks may live on different devices
            g = g[..., None] if g.ndim == 3 else g[:, None, :, None]
            g = torch.where(base[layer].to(z.device)[:, None], torch.zeros((), device=z.device, dtype=g.dtype), g)
            return ablation.mix(z, layer, g.to(z.dtype), rows)

        return hook

    out = read_out(model, tokens, metric, [(z_hook(l), gate_hook(l)) for l in range(L)], L, grad=True)
    return metric(out, tokens, reference, rows)


def gradient_importance(
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    ablation: str | HeadAblation = "zero",
    base: Any = None,
    normalize: bool = False,
    minibatch: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> HeadScores:
    """Michel et al.'s head importance ``I_h = E_x |A_h(x)^T dL/dA_h(x)|``.

    ``A_h(x)`` is head ``h``'s output (``hook_z``) at one token and ``L`` the metric's loss (the
    metric, negated when higher is better, summed over sequences). The product is taken per token,
    its absolute value averaged over every token of the probe. This is the gradient of ``L`` with
    respect to a per-token gate ``g`` on the head (``z' = g z``), at ``g = 1``. With mean or resample
    ablation the gate mixes towards the ablated value instead (``z' = r + g (z - r)``), so
    ``A_h - r`` takes the place of ``A_h``. One forward and backward per minibatch; the model's
    weights are frozen meanwhile. ``normalize`` divides each layer's scores by their L2 norm
    (Michel et al.'s option). Heads in ``base`` stay ablated and get NaN.
    """
    metric = as_metric(metric)
    info = describe(model)
    L, H = info.n_layers, info.n_heads
    abl = (
        ablation
        if isinstance(ablation, HeadAblation)
        else HeadAblation.fit(model, ablation, probe, seed=seed, minibatch=minibatch)
    )
    base_mask = torch.zeros(L, H, dtype=torch.bool) if base is None else head_mask(info, base, allow_empty=True)
    step = minibatch or probe.batch

    def accumulate(block: range) -> tuple[Tensor, int, Tensor]:
        """Sum of |gate gradient| per head over the sequences in ``block``, tokens seen, metric values."""
        total = torch.zeros(L, H, dtype=torch.float64)
        count = 0
        values = [torch.zeros(0)]
        starts = range(block.start, block.stop, step)
        for start in tqdm(starts, desc="gradient importance", disable=not (progress and distributed.is_main())):
            rows = torch.arange(start, min(start + step, block.stop))
            tokens = probe.tokens[rows.to(probe.tokens.device)]
            reference = None
            if metric.needs_clean:
                with torch.no_grad():
                    reference = read_out(model, tokens, metric, [], L)
            b, T = tokens.shape
            gates = [torch.ones(b, T, H, device=tokens.device, requires_grad=True) for _ in range(L)]
            with frozen(model):
                value = gated_forward(model, tokens, metric, abl, gates, base_mask, rows, reference)
                grads = torch.autograd.grad(metric.badness(value).sum(), gates, allow_unused=True)
            for l, g in enumerate(grads):
                if g is not None:
                    total[l] += g.detach().abs().sum((0, 1)).double().cpu()
            count += b * T
            values.append(value.detach().float().cpu())
        return total, count, torch.cat(values)

    # under torchrun each rank takes a block of sequences; the sums are added up in rank order
    parts = distributed.run_sharded(lambda: accumulate(distributed.row_block(probe.batch)), "gradient importance")
    total = torch.stack([p[0] for p in parts]).sum(0)
    count = sum(p[1] for p in parts)
    values = [p[2] for p in parts]
    imp = (total / count).float()
    if normalize:
        imp = imp / imp.norm(dim=-1, keepdim=True).clamp_min(1e-20)
    imp[base_mask] = float("nan")
    return HeadScores.from_grids(
        {"importance": imp},
        scores_meta(
            model,
            probe,
            metric,
            abl,
            method="gradient",
            normalized=normalize,
            metric_value=float(torch.cat(values).mean()),
            base=head_labels(base_mask),
        ),
    )
