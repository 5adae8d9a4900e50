"""One layer's QK terms (:mod:`interp.roles.qk`): each upstream component's query at the targets'
queries, key at their keys and mean key over the rest of their windows, and the pair terms built
from them, per target (:func:`layer_terms`) or summed over each sequence's targets, grouped
(:func:`sequence_terms`: one product per sequence, never a term per target and pair)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters import HookedModel
from interp.roles.qk_parts import (
    CleanRun,
    Component,
    LayerParts,
    Sides,
    Windows,
    qk_parts,
    visible_keys,
    window_key_sums,
    window_sums,
)


@dataclass
class QKTerms:
    """Per target and head, every (query component, key component) pair's term of the score and of
    the contrast, and the model's own score and contrast (from the query and key it attended with)."""

    components: list[Component]
    score: Float[Tensor, "n head c c"]  # each pair's term of the score
    contrast: Float[Tensor, "n head c c"]  # each pair's term of the contrast
    model_score: Float[Tensor, "n head"]
    model_contrast: Float[Tensor, "n head"]
    report: LayerParts


@dataclass
class LayerSides:
    """Each component's side of every target, ``[component, n, head, d]`` (float64): its query
    at the target's query ``q``, its key at the target's key ``k`` and its mean key over the other
    keys the query sees ``mean``, times nothing yet (``scale`` multiplies each product); ALiBi's
    pair (``alibi``: its score and contrast terms ``[n, head]``), when the layer has one."""

    components: list[Component]
    q: Tensor
    k: Tensor
    mean: Tensor
    scale: float
    model_score: Tensor
    model_contrast: Tensor
    report: LayerParts
    alibi: tuple[Tensor, Tensor] | None = None

    def error(self) -> tuple[float, float]:
        """The largest difference between the terms' sums (score and contrast, per target) and the
        model's own, and the largest score (the scale the difference is judged on). Every pair's
        term summed is the summed query side times the summed key side."""
        q, k, mean = self.q.sum(0), self.k.sum(0), self.mean.sum(0)
        score, contrast = self.scale * (q * k).sum(-1), self.scale * (q * (k - mean)).sum(-1)
        if self.alibi is not None:
            score, contrast = score + self.alibi[0], contrast + self.alibi[1]
        err = max(float((score - self.model_score).abs().max()), float((contrast - self.model_contrast).abs().max()))
        return err, float(self.model_score.abs().max())


def layer_sides(
    model: HookedModel, info: Any, run: CleanRun, layer: int, heads: list[int], pairs: Tensor
) -> LayerSides:
    """Every component's sides of ``heads`` of ``layer`` at ``pairs``: the query side read at the
    targets' queries only, the key side's window sums streamed in blocks of keys
    (:func:`~interp.roles.qk_parts.window_key_sums`)."""
    a = run.inputs[layer]
    dev = a.q.device
    b, i, j = pairs.to(dev).unbind(-1)
    lo, hi, _ = visible_keys(a, pairs)
    h = torch.tensor(heads, device=dev)
    g = h // (a.q.shape[1] // a.k.shape[1])  # the key/value head each query head reads
    real = torch.ones(a.k.shape[0], a.k.shape[2], dtype=torch.float64, device=dev)
    if a.key_mask is not None:
        real = a.key_mask.to(dev).double()
    windows = Windows(b, lo.to(dev), hi.to(dev), real)
    points = torch.unique(torch.cat([i, j])).contiguous()  # sorted: where the targets' queries and keys are
    at_i, at_j = torch.searchsorted(points, i.contiguous()), torch.searchsorted(points, j.contiguous())
    n = torch.arange(len(pairs), device=dev)
    n_other = window_sums(real[:, None, :, None], real, b, torch.zeros_like(g), windows.lo, windows.hi)[..., 0] - 1

    def sides(s: Sides) -> tuple[Tensor, Tensor, Tensor]:
        qi = s.q[b[:, None], h[None], at_i[:, None]]  # [n, head, d]
        kj = s.k[b[:, None], g[None], at_j[:, None]]
        mean = (s.k_sums[n[:, None], g[None]] - kj) / n_other[..., None]
        return qi, kj, mean

    comps, Q, K, M = [], [], [], []
    report = LayerParts(layer, "none")
    for comp, part in qk_parts(model, info, run, layer, report, points, windows):
        qi, kj, mean = sides(part)
        comps.append(comp)
        Q.append(qi), K.append(kj), M.append(mean)
    own = Sides(
        a.q[:, :, points].double(),
        a.k[:, :, points].double(),
        window_key_sums(lambda pos: a.k[:, :, pos].double(), windows),
    )
    qi, kj, mean = sides(own)
    got = LayerSides(
        comps,
        torch.stack(Q),
        torch.stack(K),
        torch.stack(M),
        a.scale,
        a.scale * (qi * kj).sum(-1),
        a.scale * (qi * (kj - mean)).sum(-1),
        report,
    )
    if a.bias_slopes is not None:  # ALiBi: a pair of its own
        slope = a.bias_slopes.to(dev).double()[h][None]
        pos = torch.arange(a.k.shape[2], device=dev, dtype=torch.float64)[None, None, :, None].expand(
            a.k.shape[0], 1, -1, 1
        )
        mean_j = (window_sums(pos, real, b, torch.zeros_like(g), windows.lo, windows.hi)[..., 0] - j[:, None]) / n_other
        got.alibi = (slope * (j - i)[:, None], slope * (j[:, None] - mean_j))
        got.model_score, got.model_contrast = got.model_score + got.alibi[0], got.model_contrast + got.alibi[1]
        got.components.append(Component("alibi", "bias"))
    return got


def layer_terms(sides: LayerSides) -> QKTerms:
    """Every target's pair terms of the score and the contrast (``[n, head, c, c]`` each)."""
    value = sides.scale * torch.einsum("cnhd,enhd->nhce", sides.q, sides.k)
    contrast = sides.scale * torch.einsum("cnhd,enhd->nhce", sides.q, sides.k - sides.mean)
    if sides.alibi is not None:
        value, contrast = _with_pair(value, sides.alibi[0]), _with_pair(contrast, sides.alibi[1])
    return QKTerms(
        sides.components, value.cpu(), contrast.cpu(), sides.model_score.cpu(), sides.model_contrast.cpu(), sides.report
    )


def sequence_terms(
    sides: LayerSides, matrix: Float[Tensor, "c group"], batch: Int[Tensor, " n"], B: int
) -> dict[str, Tensor]:
    """The grouped pair terms of the score and the contrast summed over each sequence's targets,
    ``{"score"|"contrast": [B, head, group, group]}``: the sides grouped first, then one product
    of a sequence's query sides and key sides over its targets and channels. ``matrix`` maps the
    components (ALiBi's last, where the layer has it) to their groups."""
    dev = sides.q.device
    m = matrix.to(dev)
    group = m[: len(sides.q)].argmax(1)  # each component's one group

    def grouped(x: Tensor) -> Tensor:  # [component, n, head, d] summed into [head, group, n, d]
        return x.new_zeros(m.shape[1], *x.shape[1:]).index_add_(0, group, x).permute(2, 0, 1, 3)

    q = grouped(sides.q)
    keys = {"score": sides.k, "contrast": sides.k - sides.mean}
    out = {}
    for value, k in keys.items():
        k = grouped(k)
        sums = torch.zeros(B, q.shape[0], m.shape[1], m.shape[1], dtype=torch.float64, device=dev)
        for s in torch.unique(batch).tolist():
            at = torch.nonzero(batch.to(dev) == s).flatten()
            flat_q, flat_k = q[:, :, at].flatten(2), k[:, :, at].flatten(2)  # [head, group, targets * d]
            sums[s] = sides.scale * torch.bmm(flat_q, flat_k.transpose(1, 2))
        out[value] = sums.cpu()
    if sides.alibi is not None:
        f = int(m[-1].argmax())
        for value, term in zip(keys, sides.alibi):
            out[value][:, :, f, f] += torch.zeros(B, term.shape[1], dtype=torch.float64).index_add_(
                0, batch.cpu(), term.cpu()
            )
    return out


def _with_pair(terms: Tensor, diagonal: Tensor) -> Tensor:
    """``terms`` with one more component whose only term is ``(it, it)``: ``diagonal`` ``[n, head]``."""
    out = torch.nn.functional.pad(terms, (0, 1, 0, 1))
    out[..., -1, -1] = diagonal
    return out


__all__ = ["LayerSides", "QKTerms", "layer_sides", "layer_terms", "sequence_terms"]
