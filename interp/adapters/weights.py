"""Each head's weights, read once for the weight-based analyses (composition, OV circuit roles).

TransformerLens (the bridge and the toy alike) exposes stacked ``W_Q``, ``W_K``, ``W_V``, ``W_O``
in its own shapes; grouped keys and values (GQA/MQA) come stacked per key-value head on the bridge
and per query head on the toy. :func:`read_head_weights` gives one slice per *query* head, with
the group size recorded, NaN heads for layers without softmax attention, and refuses what has no
per-head weights to read:

- multi-head latent attention (DeepSeek-V2/V3): keys and values come out of one shared compressed
  projection through a norm, so no head has a linear ``W_K`` or ``W_V`` of its own;
- weights TransformerLens cannot materialise (offloaded to disk or on the meta device).

:func:`first_mlp` runs block 0's MLP (after its own norm) on residual vectors: the "effective
embedding" of McDougall et al. (``W_E + MLP0(W_E)``) is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from interp.adapters.info import ModelInfo
from interp.errors import UsageError
from interp.hooks import resid_post_hook, resid_pre_hook


@dataclass(frozen=True)
class HeadWeights:
    """One slice per query head of every layer (float64, NaN for layers without softmax attention)."""

    W_Q: Float[Tensor, "layer head d_model d_head_qk"]
    W_K: Float[Tensor, "layer head d_model d_head_qk"]  # grouped heads: their shared keys, repeated
    W_V: Float[Tensor, "layer head d_model d_head"]
    W_O: Float[Tensor, "layer head d_head d_model"]
    W_E: Float[Tensor, "d_vocab d_model"]
    W_U: Float[Tensor, "d_model d_vocab"]
    b_U: Float[Tensor, " d_vocab"]  # zeros for a model without an unembedding bias
    group: int  # query heads per key-value head (1: multi-head attention)
    rotary: bool  # queries and keys are rotated by position before they meet

    def notes(self) -> list[str]:
        """What a score read from these weights leaves out."""
        out = []
        if self.rotary:
            out.append(
                "rotary positions: W_Q W_K^T is the query-key map at relative offset 0; the rotation "
                "applied between queries and keys at other offsets is not in the score"
            )
        if self.group > 1:
            out.append(
                f"grouped keys/values: every {self.group} query heads share one W_K and W_V, "
                "so those heads' K- and V-composition share their keys/values side"
            )
        return out


def latent_refusal(info: ModelInfo, what: str) -> str:
    """Why ``what`` (a weight-based score) is refused for a model with multi-head latent attention."""
    return (
        f"{what} reads each head's W_Q, W_K, W_V and W_O, and {info.name} has multi-head latent attention: "
        "keys and values come out of one shared compressed projection through a norm, so no head has a "
        "linear W_K or W_V of its own and the score is not defined; the attention scores are unaffected"
    )


def read_head_weights(model: Any, info: ModelInfo, what: str) -> HeadWeights:
    """The weights of every head of ``model``, one slice per query head (see the module docstring)."""
    if info.latent_attention:
        raise UsageError(latent_refusal(info, what))
    try:
        raw = {name: getattr(model, name) for name in ("W_Q", "W_K", "W_V", "W_O", "W_E", "W_U")}
    except (NotImplementedError, RuntimeError) as e:  # TransformerLens cannot read offloaded weights
        raise UsageError(
            f"{what} reads the model's weights, and this model's are offloaded ({e}): "
            "load the model without disk offload"
        ) from None
    dev = raw["W_E"].device
    w = {k: v.detach().to(dev, torch.float64) for k, v in raw.items()}
    H = info.n_heads
    group = H // w["W_K"].shape[1] if w["W_K"].shape[1] != H else 1
    if w["W_V"].shape[1] != H and H // w["W_V"].shape[1] != group:
        raise UsageError(f"{what}: W_K and W_V of {info.name} are grouped differently; cannot read per-head weights")
    per_head = {k: per_query_head(w[k], H) for k in ("W_Q", "W_K", "W_V", "W_O")}
    if per_head["W_Q"].shape[0] != info.n_layers:  # a hybrid model: attention layers only, stacked
        for k, t in per_head.items():
            full = t.new_full((info.n_layers, *t.shape[1:]), float("nan"))
            full[list(info.attention_layers)] = t
            per_head[k] = full
    b_U = getattr(model, "b_U", None)
    b_U = w["W_U"].new_zeros(w["W_U"].shape[1]) if b_U is None else b_U.detach().to(dev, torch.float64)
    cfg = model.cfg
    rotary = str(getattr(cfg, "positional_embedding_type", "standard")) == "rotary"
    return HeadWeights(**per_head, W_E=w["W_E"], W_U=w["W_U"], b_U=b_U, group=group, rotary=rotary)


def per_query_head(w: Tensor, n_heads: int) -> Tensor:
    """Grouped (GQA/MQA) K/V weights expanded to one slice per query head (query head ``h`` reads
    key-value head ``h // group``, as Hugging Face and TransformerLens do)."""
    if w.shape[1] == n_heads:
        return w
    return w.repeat_interleave(n_heads // w.shape[1], dim=1)


@torch.no_grad()
def first_mlp(
    model: Any, resid: Float[Tensor, "n d_model"], chunk: int = 2048
) -> tuple[Float[Tensor, "n d_model"] | None, str]:
    """Block 0's MLP, after its own norm, on each row of ``resid`` (rows in chunks of ``chunk``, in
    the MLP's dtype), and a line saying what ran; ``None`` when block 0 has no MLP (an
    attention-only model) or its MLP cannot run on its own (a bridge whose MLP wraps its whole
    layer, as BERT's does)."""
    blocks = getattr(model, "blocks", None)
    block = blocks[0] if blocks is not None and len(blocks) else None
    mlp, norm = getattr(block, "mlp", None), getattr(block, "ln2", None)
    if not isinstance(mlp, torch.nn.Module):
        return None, "block 0 has no MLP"
    param = next(mlp.parameters())
    out = []
    try:
        for start in range(0, resid.shape[0], chunk):
            x = resid[start : start + chunk][None].to(param.device, param.dtype)
            if isinstance(norm, torch.nn.Module):
                x = norm(x)
            y = mlp(x)
            y = y[0] if isinstance(y, tuple) else y
            out.append(y[0].to(resid.device, resid.dtype))
    except (RuntimeError, TypeError, ValueError) as e:  # TransformerLens refuses to run a containerless MLP
        return None, f"block 0's MLP cannot run on its own here ({str(e).splitlines()[0][:120]})"
    return torch.cat(out), "block 0's MLP after its norm"


@dataclass(frozen=True)
class NormSite:
    """Where a normalization's input, scale and output are hooked: ``output = P(input) / scale * w + b``,
    ``P`` the centering when ``centered`` (LayerNorm), the identity otherwise (RMSNorm)."""

    input: str
    scale: str
    output: str
    centered: bool


def final_norm_site(model: Any) -> NormSite | None:
    """The final norm's hooks (``None``: the model has no final norm)."""
    norm = str(getattr(model.cfg, "normalization_type", None))
    if norm == "None" or "ln_final.hook_scale" not in model.hook_dict:
        return None
    centered = norm.startswith("LN")
    if "ln_final.hook_in" in model.hook_dict:  # a bridge
        return NormSite("ln_final.hook_in", "ln_final.hook_scale", "ln_final.hook_out", centered)
    last = len(model.blocks) - 1  # the toy: its final norm reads the last block's output
    return NormSite(resid_post_hook(last), "ln_final.hook_scale", "ln_final.hook_normalized", centered)


def input_norm_site(model: Any, layer: int) -> NormSite | None:
    """The norm layer ``layer``'s attention reads its input through (``ln1``), ``None`` without one."""
    prefix = f"blocks.{layer}.ln1"
    centered = str(getattr(model.cfg, "normalization_type", None)).startswith("LN")
    if f"{prefix}.hook_in" in model.hook_dict:  # a bridge
        return NormSite(f"{prefix}.hook_in", f"{prefix}.hook_scale", f"{prefix}.hook_out", centered)
    if f"{prefix}.hook_scale" in model.hook_dict:  # the toy
        return NormSite(resid_pre_hook(layer), f"{prefix}.hook_scale", f"{prefix}.hook_normalized", centered)
    return None


def post_attention_norm_site(model: Any, layer: int) -> NormSite | None:
    """The norm between layer ``layer``'s attention output and the residual (Gemma 2's
    ``post_attention_layernorm``), ``None`` where the attention output is added as it is."""
    prefix = f"blocks.{layer}.ln1_post"
    if f"{prefix}.hook_in" not in model.hook_dict:
        return None
    centered = str(getattr(model.cfg, "normalization_type", None)).startswith("LN")
    return NormSite(f"{prefix}.hook_in", f"{prefix}.hook_scale", f"{prefix}.hook_out", centered)


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


QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm")  # the attention's own query/key norms


def qk_norm_modules(model: Any, layer: int) -> dict[str, torch.nn.Module]:
    """The norms layer ``layer``'s attention passes its queries and keys through after the
    projection (Qwen 3, Gemma 3, OLMo 2), by attribute name: empty without them."""
    attn = getattr(model.blocks[layer], "attn", None)
    inner = getattr(attn, "original_component", attn)
    return {n: m for n in QK_NORMS if isinstance(m := getattr(inner, n, None), torch.nn.Module)}


def qk_norm_sites(model: Any, layer: int) -> dict[str, NormSite] | None:
    """Where each of those norms' input, scale and output are hooked (a bridge hooks them all);
    ``None`` where one is not hooked, so its scale cannot be read."""
    sites = {}
    for name, module in qk_norm_modules(model, layer).items():
        prefix = f"blocks.{layer}.attn.{name}"
        if f"{prefix}.hook_scale" not in model.hook_dict or f"{prefix}.hook_in" not in model.hook_dict:
            return None
        inner = getattr(module, "original_component", module)
        centered = "rms" not in f"{type(module).__name__} {type(inner).__name__}".lower()
        sites[name] = NormSite(f"{prefix}.hook_in", f"{prefix}.hook_scale", f"{prefix}.hook_out", centered)
    return sites


def final_softcap(model: Any) -> float | None:
    """The cap ``c`` of the final logits, ``c * tanh(logit / c)`` (Gemma 2), ``None`` when uncapped."""
    for name in ("output_logits_soft_cap", "final_logit_softcapping"):
        value = getattr(model.cfg, name, None)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


__all__ = [
    "affine_fit",
    "centered",
    "gain_and_bias",
    "QK_NORMS",
    "HeadWeights",
    "final_softcap",
    "NormSite",
    "final_norm_site",
    "first_mlp",
    "input_norm_site",
    "latent_refusal",
    "per_query_head",
    "post_attention_norm_site",
    "qk_norm_modules",
    "qk_norm_sites",
    "read_head_weights",
]
