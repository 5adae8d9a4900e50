"""A normalization frozen at the run's own scale: ``N(x) = P(x) / s * w + b``, linear in ``x``.

Logit attribution freezes the final norm, QK attribution each attention layer's input norm: with
the scale ``s`` of every position read from the run itself, the norm's output is a sum of one part
per part of its input plus the bias. ``P`` is the centering of a LayerNorm (the identity for an
RMSNorm). The gain and bias are read from the run too (:func:`gain_and_bias`: a least-squares fit
of the hooked output on ``P(input) / scale`` over every position, exact for an elementwise affine
map), so no architecture's parameter convention (Gemma's ``1 + w``) needs knowing.
"""

from __future__ import annotations

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


__all__ = ["affine_fit", "centered", "gain_and_bias"]
