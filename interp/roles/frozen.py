"""A normalization frozen at the run's own scale: ``N(x) = P(x) / s * w + b``, linear in ``x``.

Logit attribution freezes the final norm, QK attribution each attention layer's input norm: with
the scale ``s`` of every position read from the run itself, the norm's output is a sum of one part
per part of its input plus the bias. ``P`` is the centering of a LayerNorm (the identity for an
RMSNorm). The gain and bias are read from the run too (:func:`~interp.adapters.weights.gain_and_bias`: a fit
of the hooked output on ``P(input) / scale`` over every position, exact for an elementwise affine
map), so no architecture's parameter convention (Gemma's ``1 + w``) needs knowing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from interp.adapters.weights import NormSite, centered, gain_and_bias


@dataclass(frozen=True)
class FrozenNorm:
    """A norm frozen at the run's own scale, applied to inputs at some of the run's positions:
    ``P(x) / s * w + b`` with ``s`` the run's scale there. ``scale`` is the run's (its last axis 1),
    positions along ``pos_dim``: a query/key norm's input is ``[batch, head, pos, d_head]`` or
    ``[batch, pos, d]``."""

    site: NormSite
    scale: Tensor
    w: Tensor
    b: Tensor
    pos_dim: int

    def __call__(self, x: Tensor, pos: Tensor) -> Tensor:
        s = self.scale.index_select(self.pos_dim, pos.to(self.scale.device)).to(x.device, x.dtype)
        return centered(x, self.site) / s * self.w.to(x.device, x.dtype) + self.b.to(x.device, x.dtype)


def freeze(site: NormSite, grabbed: dict[str, Tensor], n_pos: int, *, max_rows: int | None = None) -> FrozenNorm:
    """``site``'s norm frozen at the run's scale (``grabbed`` holds its input, scale and output over
    ``n_pos`` positions). The position axis is the one of that length among the middle axes; where
    a head axis has the same length, the one with the larger stride (positions are outer to heads in
    the projection the input was viewed from)."""
    x = grabbed[site.input]
    axes = [d for d in range(1, x.ndim - 1) if x.shape[d] == n_pos]
    if not axes:
        raise ValueError(f"{site.input} has shape {tuple(x.shape)}: no axis of {n_pos} positions")
    w, b = gain_and_bias(site, grabbed, max_rows=max_rows)
    if not site.centered:  # an RMSNorm has no bias: the fit's is rounding
        b = torch.zeros_like(b)
    return FrozenNorm(site, grabbed[site.scale], w, b, max(axes, key=lambda d: x.stride(d)))


__all__ = ["FrozenNorm", "freeze"]
