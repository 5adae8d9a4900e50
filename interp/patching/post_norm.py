"""Heads whose layer's attention output passes through a norm before the residual (Gemma 2 and 3's
``post_attention_layernorm``, an RMSNorm): what each head writes, as edges read it.

The layer adds ``N(sum_h z_h W_O_h) = (sum_h z_h W_O_h) / s * w``, with ``s`` the norm's scale at
each position of the run. Frozen at each run's own ``s``, head ``h`` writes ``(z_h / s) W_O_h w``:
linear in its output, and the layer's heads' writes add up to what the layer adds, in every run
(the run's own, the paired prompt's, a patched one). Edge patching and attribution therefore keep
``z / s`` as such a layer's head outputs (:func:`scaled`) and fold the gain ``w`` into ``W_O``
(:func:`fold`); an MLP's post-norm needs nothing, its write being the norm's output as a whole.
The gain is read from a run (:func:`~interp.adapters.weights.gain_and_bias`), so Gemma's ``1 + w``
convention need not be known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor

from interp.adapters.surgery import by_head
from interp.adapters.weights import NormSite, gain_and_bias, post_attention_norm_site
from interp.hooks import mlp_out_hook, resid_pre_hook, z_hook


def post_norms(model: Any, n_layers: int) -> dict[int, NormSite]:
    """The layers whose attention output passes through a norm before the residual, with its site."""
    return {l: site for l in range(n_layers) if (site := post_attention_norm_site(model, l)) is not None}


def fold(
    model: Any, W_O: Float[Tensor, "layer head d_head d_model"], tokens: Tensor, posts: dict[int, NormSite]
) -> Float[Tensor, "layer head d_head d_model"]:
    """``W_O`` with each post-normed layer's gain folded in (``W_O_h w``), the gain fitted on one
    plain forward of ``tokens``; ``W_O`` itself where no layer has a post-norm."""
    if not posts:
        return W_O
    grabbed: dict[str, Tensor] = {}

    def grab(name: str) -> Any:
        def hook(x: Tensor, hook: Any) -> None:
            grabbed[name] = x.detach()

        return hook

    names = [n for site in posts.values() for n in (site.input, site.scale, site.output)]
    with torch.no_grad(), model.hooks(fwd_hooks=[(n, grab(n)) for n in names]):
        model(tokens)
    out = W_O.clone()
    for l, site in posts.items():
        w, _ = gain_and_bias(site, grabbed)
        out[l] = W_O[l] * w.to(W_O.dtype)
    return out


def scaled(z: Float[Tensor, "... pos head d_head"], s: Tensor) -> Float[Tensor, "... pos head d_head"]:
    """A post-normed layer's head outputs divided by the norm's scale at each position (``s``: the
    norm's ``hook_scale``, one value per position, its last axis 1)."""
    return z / s.reshape(*z.shape[:-2], 1, 1).to(z.dtype)


def layer_write(
    zs: Float[Tensor, "batch pos head d_head"], W_O: Float[Tensor, "head d_head d_model"]
) -> Float[Tensor, "batch pos d_model"]:
    """What a post-normed layer adds, from its scaled head outputs and folded ``W_O``."""
    return einsum(zs, W_O.to(zs.dtype), "b t h e, h e d -> b t d")


def sender_hooks(
    posts: dict[int, NormSite],
    n_layers: int,
    n_heads: int,
    mlp_layers: Iterable[int],
    put: Callable[[str, Tensor], Any],
    layers: Iterable[int] | None = None,
) -> list[tuple[str, Callable]]:
    """Hooks handing every sender's output on a forward to ``put(key, output)``, detached: the stream
    entering block 0 (``"input"``), each layer's ``hook_z`` by head (``"z{l}"``; a post-normed
    layer's divided by its norm's scale, :func:`scaled`, once the scale is seen; ``layers``: these
    layers' alone, default every one) and each MLP's output (``"m{l}"``)."""
    raw: dict[str, Tensor] = {}  # a post-normed layer's z, until its norm's scale is seen

    def grab(key: str) -> Callable:
        return lambda x, hook: put(key, x.detach())

    def head_outputs(key: str, post: bool) -> Callable:
        def hook(z: Tensor, hook: Any) -> None:
            z = by_head(z.detach(), n_heads)
            if post:
                raw[key] = z
            else:
                put(key, z)

        return hook

    def scale(key: str) -> Callable:
        return lambda s, hook: put(key, scaled(raw.pop(key), s.detach()))

    hooks = [(resid_pre_hook(0), grab("input"))]
    for l in range(n_layers) if layers is None else layers:
        hooks.append((z_hook(l), head_outputs(f"z{l}", l in posts)))
        if l in posts:
            hooks.append((posts[l].scale, scale(f"z{l}")))
    return hooks + [(mlp_out_hook(l), grab(f"m{l}")) for l in mlp_layers]


__all__ = ["fold", "layer_write", "post_norms", "scaled", "sender_hooks"]
