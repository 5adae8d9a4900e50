"""A normalization frozen at the run's own scale: ``N(x) = P(x) / s * w + b``, linear in ``x``.

Logit attribution freezes the final norm, QK attribution each attention layer's input norm: with
the scale ``s`` of every position read from the run itself, the norm's output is a sum of one part
per part of its input plus the bias. ``P`` is the centering of a LayerNorm (the identity for an
RMSNorm). The gain and bias are read from the run too (:func:`gain_and_bias`: a least-squares fit
of the hooked output on ``P(input) / scale`` over every position, exact for an elementwise affine
map), so no architecture's parameter convention (Gemma's ``1 + w``) needs knowing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp.adapters.weights import NormSite


def affine_fit(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Per column, ``w`` and ``b`` with ``y = x * w + b`` over the rows (least squares)."""
    xm, ym = x.mean(0), y.mean(0)
    var = ((x - xm) ** 2).sum(0)
    w = torch.where(var > 0, ((x - xm) * (y - ym)).sum(0) / var.clamp_min(1e-300), torch.ones_like(var))
    return w, ym - w * xm


def centered(x: Float[Tensor, "... d_model"], site: NormSite) -> Float[Tensor, "... d_model"]:
    """``P(x)``: ``x`` minus its mean over the model axis for a LayerNorm, ``x`` itself otherwise."""
    return x - x.mean(-1, keepdim=True) if site.centered else x


def gain_and_bias(
    site: NormSite, grabbed: dict[str, Tensor], *, max_rows: int | None = None
) -> tuple[Float[Tensor, " d_model"], Float[Tensor, " d_model"]]:
    """The norm's ``w`` and ``b`` (float64), fitted on the run's input, scale and output at ``site``:
    every position, or ``max_rows`` of them evenly spaced (the map is elementwise affine, so any
    rows that vary fit it exactly; a long run need not be copied to float64 whole)."""
    x, s, y = (grabbed[n].reshape(-1, grabbed[n].shape[-1]) for n in (site.input, site.scale, site.output))
    if max_rows is not None and len(x) > max_rows:
        rows = torch.linspace(0, len(x) - 1, max_rows, device=x.device).round().long()
        x, s, y = x[rows], s[rows], y[rows]
    xhat = centered(x.double(), site) / s.double()
    return affine_fit(xhat, y.double())


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


__all__ = ["FrozenNorm", "affine_fit", "centered", "freeze", "gain_and_bias"]
