"""Michel et al.'s gradient importance."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float
from torch import Tensor

import interp.distributed as distributed
import interp.memory as memory
from interp.ablation.metrics import Metric, as_metric, refuse_padded_ablation
from interp.ablation.modes import HeadAblation, as_ablation, head_labels, head_mask
from interp.ablation.replay import read_out
from interp.ablation.sweep import scores_meta
from interp.adapters import HookedModel
from interp.config import RunConfig
from interp.errors import AblationError, MetricError
from interp.hooks import z_hook
from interp.memory import gradient_memory
from interp.models import describe
from interp.probes import TokenProbe
from interp.progress import tqdm
from interp.registry import Registry
from interp.scores import NOISE_FLOOR_FRACTION, HeadScores, bootstrap_mean


@contextmanager
def frozen(model: HookedModel) -> Iterator[HookedModel]:
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
    model: HookedModel,
    tokens: Tensor,
    metric: Metric,
    ablation: HeadAblation,
    gates: list[Tensor],
    base: Tensor,
    rows: Tensor,
    reference: Tensor | None,
    attention_mask: Tensor | None = None,
    read_positions: bool = False,
) -> Tensor:
    """Metric per sequence with every head's output mixed as ``r + g (z - r)`` (base heads at r).
    ``read_positions``: only the positions the metric reads are unembedded (:func:`read_out`)."""
    L = len(gates)
    layers = describe(model).attention_layers  # a layer without attention has no hook_z

    def gate_hook(layer: int) -> Callable:
        def hook(z: Tensor, hook: Any) -> Tensor:
            g = gates[layer].to(z.device)  # blocks may live on different devices
            g = g[..., None] if g.ndim == 3 else g[:, None, :, None]
            g = torch.where(base[layer].to(z.device)[:, None], torch.zeros((), device=z.device, dtype=g.dtype), g)
            return ablation.mix(z, layer, g.to(z.dtype), rows)

        return hook

    hooks = [(z_hook(l), gate_hook(l)) for l in layers]
    out = read_out(
        model, tokens, metric, hooks, L, grad=True, attention_mask=attention_mask, read_positions=read_positions
    )
    return metric(out, tokens, reference, rows)


ZERO_GRADIENT_WARNING = (
    "gradient importance under zero ablation: the gradient at the unablated point says little about "
    "replacing a head by zero, far from where it sits, so it tracks the exact sweep poorly; use "
    "ablation='mean'"
)

# what one gate covers (``per=``): a sequence (Michel et al.) or a token
GATE_UNITS: Registry[str] = Registry("gate unit")
GATE_UNITS.add("example", "one gate per sequence: the gate gradient's absolute value per sequence (Michel et al.)")
GATE_UNITS.add("token", "one gate per token: its absolute value per token, averaged over every token")


def validate_gradient_importance(*, per: str = "example") -> None:
    """Refuse options :func:`gradient_importance` cannot run with, before any model is touched."""
    if per not in GATE_UNITS:
        raise AblationError(f"per must be 'example' or 'token', got per={per!r}", params="per")


@dataclass(frozen=True)
class _Sums:
    """One rank's block of sequences: |gate gradient| summed per head, the gates counted, the metric
    per sequence, and each sequence's importance (for the CIs)."""

    total: Float[Tensor, "layer head"]
    count: int
    values: Float[Tensor, " batch"]
    per_seq: Float[Tensor, "batch layer head"]


@dataclass(frozen=True)
class _GatePasses:
    """The forward and backward passes of gradient importance, one per minibatch of ``step`` sequences."""

    model: HookedModel
    probe: TokenProbe
    metric: Metric
    ablation: HeadAblation
    base: Bool[Tensor, "layer head"]
    per: str
    step: int
    progress: bool

    def over(self, block: range) -> _Sums:
        """The sums over the sequences in ``block``."""
        L, H = self.base.shape
        total = torch.zeros(L, H, dtype=torch.float64)
        count, values, per_seq = 0, [torch.zeros(0)], [torch.zeros(0, L, H, dtype=torch.float64)]
        starts = range(block.start, block.stop, self.step)
        sizes = (
            f"{L * H} heads' gates, {len(block)} sequences of {self.probe.seq_len} tokens, "
            f"{len(starts)} forward and backward pass(es)"
        )
        bar = tqdm(
            starts, desc="gradient importance", disable=not (self.progress and distributed.is_main()), sizes=sizes
        )
        for start in bar:
            rows = torch.arange(start, min(start + self.step, block.stop))
            grads, value, padding = self._pass(rows)
            b, T = value.shape[0], self.probe.seq_len
            mine = torch.zeros(b, L, H, dtype=torch.float64)
            for l, g in enumerate(grads):
                if g is not None:
                    a = g.detach().double().abs().cpu()
                    total[l] += a.reshape(-1, H).sum(0)
                    if self.per == "example":
                        mine[:, l] = a
                    else:  # a sequence's mean over its real tokens (a padded one has no gradient)
                        n_real = T if padding is None else padding.sum(1).cpu().double()[:, None]
                        mine[:, l] = a.sum(1) / n_real
            per_seq.append(mine)
            # per token: every real token is one gate
            count += b if self.per == "example" else (b * T if padding is None else int(padding.sum()))
            values.append(value.detach().float().cpu())
        return _Sums(total, count, torch.cat(values), torch.cat(per_seq))

    def _pass(self, rows: Tensor) -> tuple[tuple[Tensor | None, ...], Tensor, Tensor | None]:
        """One forward and backward on the sequences ``rows``: each layer's gate gradient, the metric
        per sequence, and the rows' padding mask."""
        model, probe, metric, L = self.model, self.probe, self.metric, self.base.shape[0]
        tokens = probe.tokens[rows.to(probe.tokens.device)]
        padding = None if probe.attention_mask is None else probe.attention_mask[rows.to(probe.tokens.device)]
        reference = None
        if metric.needs_clean:
            with torch.no_grad():
                reference = read_out(model, tokens, metric, [], L, attention_mask=padding)
        b, T = tokens.shape
        H = self.base.shape[1]
        shape = (b, H) if self.per == "example" else (b, T, H)
        gates = [torch.ones(*shape, device=tokens.device, requires_grad=True) for _ in range(L)]
        with frozen(model):
            value = gated_forward(model, tokens, metric, self.ablation, gates, self.base, rows, reference, padding)
            grads = torch.autograd.grad(metric.badness(value).sum(), gates, allow_unused=True)
        return grads, value, padding


def gradient_importance(
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    ablation: str | HeadAblation = "zero",
    base: Any = None,
    normalize: bool = False,
    per: Literal["example", "token"] = "example",
    config: RunConfig | None = None,
) -> HeadScores:
    """Michel et al.'s head importance ``I_h = E_x |A_h(x)^T dL(x)/dA_h(x)|``.

    ``A_h(x)`` is head ``h``'s output (``hook_z``) on sequence ``x`` and ``L(x)`` the metric's loss
    on it (the metric, negated when higher is better). This is the gradient of ``L(x)`` with respect
    to a gate ``g`` on the head (``z' = g z``) at ``g = 1``; as in Michel et al. the gate is one per
    sequence (``per="example"``): the product is summed over the sequence's tokens, its absolute
    value averaged over the sequences. ``per="token"`` gates every token separately (absolute value
    per token, averaged over every token); :data:`GATE_UNITS` registers the two. With mean or
    resample ablation the gate mixes towards the ablated value instead (``z' = r + g (z - r)``), so
    ``A_h - r`` takes the place of ``A_h``. One forward and backward per minibatch; the model's
    weights are frozen meanwhile. ``normalize`` divides each layer's scores by their L2 norm (Michel
    et al.'s option). Heads in ``base`` stay ablated and get NaN. ``config`` (its ``minibatch``,
    ``seed`` of a resample ablation and of the CIs, ``progress``, ``n_boot``, ``level``) sets the run.

    A metric at its optimum on the unablated run (``flat_at_clean``, e.g. the pooled cosine to the
    clean output) has no gradient there and is refused, as is any metric whose gradient comes out
    as rounding noise: the ranking would mean nothing. Use :func:`exact_sweep` for those.
    """
    validate_gradient_importance(per=per)
    metric = as_metric(metric)
    config = RunConfig.of(config)
    if metric.flat_at_clean:
        raise MetricError(_flat_message(metric.name, "it is at its optimum on the unablated run"))
    info = describe(model)
    L, H = info.n_layers, info.n_heads
    refuse_padded_ablation(probe, ablation)
    step = config.minibatch or probe.batch
    memory.check(gradient_memory(model, info, probe, metric), step, info.device)  # before any forward
    abl = as_ablation(ablation, model, probe, seed=config.seed, minibatch=config.minibatch)
    if abl.kind == "zero":
        warnings.warn(ZERO_GRADIENT_WARNING, UserWarning, stacklevel=2)
    base_mask = torch.zeros(L, H, dtype=torch.bool) if base is None else head_mask(info, base, allow_empty=True)
    passes = _GatePasses(model, probe, metric, abl, base_mask, per, step, config.progress)
    # under torchrun each rank takes a block of sequences; the sums are added up in rank order
    parts = distributed.run_sharded(lambda: passes.over(distributed.row_block(probe.batch)), "gradient importance")
    imp, imp_lo, imp_hi, value = _importance(parts, metric, base_mask, config)
    if normalize:
        norm = imp.norm(dim=-1, keepdim=True).clamp_min(1e-20)
        imp, imp_lo, imp_hi = imp / norm, imp_lo / norm, imp_hi / norm
    for t in (imp, imp_lo, imp_hi):
        t[base_mask] = float("nan")
        t[list(info.absent_layers)] = float("nan")
    return HeadScores.from_grids(
        {"importance": imp, "importance_lo": imp_lo, "importance_hi": imp_hi},
        scores_meta(
            model,
            probe,
            metric,
            abl,
            method="gradient",
            normalized=normalize,
            metric_value=value,
            per=per,
            base=head_labels(base_mask),
            # normalized scores have no metric units: no floor then
            noise_floor=None if normalize else NOISE_FLOOR_FRACTION * abs(value),
            ci_level=config.level,
        ),
    )


def _importance(
    parts: list[_Sums], metric: Metric, base: Bool[Tensor, "layer head"], config: RunConfig
) -> tuple[Tensor, Tensor, Tensor, float]:
    """The ranks' sums as the importance with its CI bounds, and the metric's mean; a gradient that
    vanishes against the metric is refused."""
    imp = (torch.stack([p.total for p in parts]).sum(0) / sum(p.count for p in parts)).float()
    _, lo, hi = bootstrap_mean(
        torch.cat([p.per_seq for p in parts]), n_boot=config.n_boot, level=config.level, seed=config.seed
    )
    value = float(torch.cat([p.values for p in parts]).mean())
    largest = float(imp[~base].max()) if bool((~base).any()) else 0.0
    if largest <= 1e-6 * max(abs(value), 1e-6):
        raise MetricError(
            _flat_message(
                metric.name, f"its gradient vanishes there (largest importance {largest:.1e}, metric {value:.3g})"
            )
        )
    return imp, lo.float(), hi.float(), value


def _flat_message(name: str, why: str) -> str:
    return (
        f"gradient importance cannot rank heads by metric {name!r} at the unablated run: {why}, so the "
        "ranking would be rounding noise. Use the exact sweep (exact_sweep), or a metric with a "
        "gradient there (a loss or a logit difference)"
    )
