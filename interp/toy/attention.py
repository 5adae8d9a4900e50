"""Multi-head attention from scratch, with TransformerLens hook names.

One knob covers the family: `n_kv_heads == n_heads` is multi-head attention (MHA), `n_kv_heads == 1`
multi-query attention (MQA), anything in between grouped-query attention (GQA), where query head h
reads key/value head h // (n_heads // n_kv_heads). `LatentAttention` is multi-head latent
attention (MLA, DeepSeek-V2): keys and values are up-projected from a small latent, which is all a
KV cache would keep. Both share one interface and one pair of paths:

* reference path: scores = q k^T / sqrt(d_head), causal mask, softmax, pattern @ v. The scores and
  the pattern pass through `hook_attn_scores` and `hook_pattern`, so analyses can read or edit them.
* flash path (`interp.toy.flash`): never stores the n x n pattern. Taken when `use_flash` is on and
  nobody hooks `hook_attn_scores` or `hook_pattern`; asking for the pattern switches to the
  reference path automatically, so hooks always see what the model computes.

Hook layout as in TransformerLens: q/k/v/z are [batch, pos, head_index, d_head] (k and v with
n_kv_heads heads), scores and pattern [batch, head_index, query_pos, key_pos], and the per-head
output `hook_result` is [batch, pos, head_index, d_model] -- computed only when hooked.

At the bottom, `AttentionShape` counts parameters and KV-cache bytes per token for MHA, GQA, MQA
and MLA configurations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import einsum, rearrange, repeat
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from interp.toy.flash import flash_attention

# ---------------------------------------------------------------------------------------------
# the reference math, on [batch, head, pos, d_head] like torch's scaled_dot_product_attention
# ---------------------------------------------------------------------------------------------


def attention_logits(
    q: Float[Tensor, "batch head q_pos d_head"],
    k: Float[Tensor, "batch kv_head k_pos d_head"],
    causal: bool,
    scale: float,
) -> Float[Tensor, "batch head q_pos k_pos"]:
    """q k^T * scale, -inf above the diagonal when causal. Query head h reads key head h // group."""
    group = q.shape[1] // k.shape[1]
    q = rearrange(q, "b (kv g) q d -> b kv g q d", g=group)
    scores = einsum(q, k, "b kv g q d, b kv k d -> b kv g q k") * scale
    scores = rearrange(scores, "b kv g q k -> b (kv g) q k")
    if causal:
        n_q, n_k = scores.shape[-2:]
        if n_q != n_k:
            raise ValueError("causal attention here needs as many queries as keys")
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, -math.inf)
    return scores


def apply_pattern(
    pattern: Float[Tensor, "batch head q_pos k_pos"],
    v: Float[Tensor, "batch kv_head k_pos d_head"],
) -> Float[Tensor, "batch head q_pos d_head"]:
    """Mix the values by the pattern: z = pattern @ v, query head h reading value head h // group."""
    group = pattern.shape[1] // v.shape[1]
    pattern = rearrange(pattern, "b (kv g) q k -> b kv g q k", g=group)
    z = einsum(pattern, v, "b kv g q k, b kv k d -> b kv g q d")
    return rearrange(z, "b kv g q d -> b (kv g) q d")


def reference_attention(
    q: Float[Tensor, "batch head q_pos d_head"],
    k: Float[Tensor, "batch kv_head k_pos d_head"],
    v: Float[Tensor, "batch kv_head k_pos d_head"],
    causal: bool = False,
    scale: float | None = None,
) -> tuple[Float[Tensor, "batch head q_pos d_head"], Float[Tensor, "batch head q_pos"]]:
    """Attention the plain way, (output, log-sum-exp per query row); the yardstick for flash.

    Computes in fp32 and returns the output in the input dtype; the log-sum-exp is fp32.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = attention_logits(q.float(), k.float(), causal, scale)
    out = apply_pattern(scores.softmax(dim=-1), v.float())
    return out.to(q.dtype), scores.logsumexp(dim=-1)


def is_hooked(hook_point: nn.Module) -> bool:
    """Does anyone listen at this hook point (forward or backward)?"""
    return bool(hook_point._forward_hooks or hook_point._forward_pre_hooks or hook_point._backward_hooks)


# ---------------------------------------------------------------------------------------------
# modules
# ---------------------------------------------------------------------------------------------


class _HookedAttention(nn.Module):
    """What every variant shares: hook points, the two paths, and the output projection.

    A subclass defines `project_qkv(x) -> q, k, v` in hook layout and the weight views
    `W_Q`, `W_K`, `W_V` ([n_heads, d_model, d_head], keys and values per query head).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        d_head: int,
        causal: bool,
        use_flash: bool,
        flash_impl: str,
    ):
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        self.d_model, self.n_heads, self.n_kv_heads, self.d_head = d_model, n_heads, n_kv_heads, d_head
        self.causal, self.use_flash, self.flash_impl = causal, use_flash, flash_impl
        self.scale = d_head**-0.5
        self.W_out = nn.Linear(n_heads * d_head, d_model, bias=False)
        self.hook_q = HookPoint()  # [batch, pos, head_index, d_head]
        self.hook_k = HookPoint()  # [batch, pos, kv_head_index, d_head]
        self.hook_v = HookPoint()  # [batch, pos, kv_head_index, d_head]
        self.hook_attn_scores = HookPoint()  # [batch, head_index, query_pos, key_pos]
        self.hook_pattern = HookPoint()  # [batch, head_index, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, head_index, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head_index, d_model]

    def project_qkv(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        q, k, v = self.project_qkv(x)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        z = self.hook_z(self.attend(q, k, v))
        return self.output(z)

    @property
    def pattern_requested(self) -> bool:
        return is_hooked(self.hook_attn_scores) or is_hooked(self.hook_pattern)

    def attend(
        self,
        q: Float[Tensor, "batch pos head d_head"],
        k: Float[Tensor, "batch pos kv_head d_head"],
        v: Float[Tensor, "batch pos kv_head d_head"],
    ) -> Float[Tensor, "batch pos head d_head"]:
        q, k, v = (rearrange(t, "b p h d -> b h p d") for t in (q, k, v))
        if self.use_flash and not self.pattern_requested:
            z, _lse = flash_attention(q, k, v, self.causal, self.scale, impl=self.flash_impl)
        else:
            scores = self.hook_attn_scores(attention_logits(q, k, self.causal, self.scale))
            pattern = self.hook_pattern(scores.float().softmax(dim=-1).to(v.dtype))
            z = apply_pattern(pattern, v)
        return rearrange(z, "b h p d -> b p h d")

    def output(self, z: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "batch pos d_model"]:
        if is_hooked(self.hook_result):  # per-head contributions, only when someone asks
            result = einsum(z, self.W_O, "b p h d, h d m -> b p h m")
            return self.hook_result(result).sum(dim=2)
        return self.W_out(rearrange(z, "b p h d -> b p (h d)"))

    def split_heads(self, t: Float[Tensor, "batch pos head_x_d_head"]) -> Float[Tensor, "batch pos head d_head"]:
        return rearrange(t, "b p (h d) -> b p h d", d=self.d_head)

    @property
    def W_O(self) -> Float[Tensor, "head d_head d_model"]:
        return rearrange(self.W_out.weight, "m (h d) -> h d m", h=self.n_heads)

    def _per_query_head(self, w: Float[Tensor, "kv_head d_model d_head"]) -> Float[Tensor, "head d_model d_head"]:
        return repeat(w, "kv m d -> (kv g) m d", g=self.n_heads // w.shape[0])


class Attention(_HookedAttention):
    """MHA / GQA / MQA: one fused projection x -> [q heads | k heads | v heads], no biases."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        d_head: int | None = None,
        causal: bool = True,
        use_flash: bool = True,
        flash_impl: str = "auto",
    ):
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        d_head = d_model // n_heads if d_head is None else d_head
        super().__init__(d_model, n_heads, n_kv_heads, d_head, causal, use_flash, flash_impl)
        self.W_qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * d_head, bias=False)

    def project_qkv(
        self, x: Float[Tensor, "batch pos d_model"]
    ) -> tuple[
        Float[Tensor, "batch pos head d_head"],
        Float[Tensor, "batch pos kv_head d_head"],
        Float[Tensor, "batch pos kv_head d_head"],
    ]:
        q, k, v = self.W_qkv(x).split(self._split_sizes, dim=-1)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    @property
    def _split_sizes(self) -> list[int]:
        return [self.n_heads * self.d_head, self.n_kv_heads * self.d_head, self.n_kv_heads * self.d_head]

    def _weight(self, i: int) -> Float[Tensor, "h d_model d_head"]:
        w = self.W_qkv.weight.split(self._split_sizes, dim=0)[i]
        return rearrange(w, "(h d) m -> h m d", d=self.d_head)

    @property
    def W_Q(self) -> Float[Tensor, "head d_model d_head"]:
        return self._weight(0)

    @property
    def W_K(self) -> Float[Tensor, "head d_model d_head"]:
        return self._per_query_head(self._weight(1))

    @property
    def W_V(self) -> Float[Tensor, "head d_model d_head"]:
        return self._per_query_head(self._weight(2))


class LatentAttention(_HookedAttention):
    """Multi-head latent attention (DeepSeek-V2), without the decoupled RoPE key.

    x -> c = x W_DKV (d_latent, the only thing a KV cache keeps) -> per-head k = c W_UK, v = c W_UV.
    Queries come straight from x, or through their own latent of size d_q_latent. Every query
    head has its own key/value head (n_kv_heads == n_heads in the hooks). The extra hook
    `hook_kv_latent` ([batch, pos, d_latent]) shows the cached latent.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_latent: int,
        d_head: int | None = None,
        d_q_latent: int | None = None,
        causal: bool = True,
        use_flash: bool = True,
        flash_impl: str = "auto",
    ):
        d_head = d_model // n_heads if d_head is None else d_head
        super().__init__(d_model, n_heads, n_heads, d_head, causal, use_flash, flash_impl)
        self.d_latent, self.d_q_latent = d_latent, d_q_latent
        if d_q_latent is None:
            self.W_q = nn.Linear(d_model, n_heads * d_head, bias=False)
        else:
            self.W_q = nn.Sequential(
                nn.Linear(d_model, d_q_latent, bias=False), nn.Linear(d_q_latent, n_heads * d_head, bias=False)
            )
        self.W_dkv = nn.Linear(d_model, d_latent, bias=False)  # down: the cached latent
        self.W_ukv = nn.Linear(d_latent, 2 * n_heads * d_head, bias=False)  # up: [k heads | v heads]
        self.hook_kv_latent = HookPoint()

    def project_qkv(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
        latent = self.hook_kv_latent(self.W_dkv(x))
        k, v = self.W_ukv(latent).chunk(2, dim=-1)
        return self.split_heads(self.W_q(x)), self.split_heads(k), self.split_heads(v)

    def _effective(self, up: Tensor, down: Tensor) -> Float[Tensor, "head d_model d_head"]:
        """The per-head map d_model -> d_head that a down- then up-projection amounts to."""
        return rearrange(up @ down, "(h d) m -> h m d", d=self.d_head)

    @property
    def W_Q(self) -> Float[Tensor, "head d_model d_head"]:
        if self.d_q_latent is None:
            return rearrange(self.W_q.weight, "(h d) m -> h m d", d=self.d_head)
        return self._effective(self.W_q[1].weight, self.W_q[0].weight)

    @property
    def W_K(self) -> Float[Tensor, "head d_model d_head"]:
        return self._effective(self.W_ukv.weight.chunk(2, dim=0)[0], self.W_dkv.weight)

    @property
    def W_V(self) -> Float[Tensor, "head d_model d_head"]:
        return self._effective(self.W_ukv.weight.chunk(2, dim=0)[1], self.W_dkv.weight)


# ---------------------------------------------------------------------------------------------
# the calculator
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionShape:
    """Parameter count and KV-cache size of one attention layer.

    MHA: n_kv_heads = n_heads (the default). GQA: 1 < n_kv_heads < n_heads. MQA: n_kv_heads = 1.
    MLA: give d_latent (the cached latent per token), optionally d_q_latent (queries through a
    latent too) and d_rope (DeepSeek's decoupled RoPE key, shared by all heads and cached as well).
    No biases.
    """

    d_model: int
    n_heads: int
    n_kv_heads: int | None = None
    d_head: int | None = None
    d_latent: int | None = None
    d_q_latent: int | None = None
    d_rope: int = 0

    @property
    def kind(self) -> str:
        if self.d_latent is not None:
            return "MLA"
        kv = self.kv_heads
        return "MHA" if kv == self.n_heads else ("MQA" if kv == 1 else "GQA")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads if self.d_head is None else self.d_head

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def n_params(self) -> int:
        d, h, dh = self.d_model, self.n_heads, self.head_dim
        out = h * dh * d
        if self.d_latent is None:
            return d * h * dh + 2 * d * self.kv_heads * dh + out
        q_in = d if self.d_q_latent is None else self.d_q_latent
        queries = (0 if self.d_q_latent is None else d * self.d_q_latent) + q_in * h * (dh + self.d_rope)
        keys_values = d * self.d_latent + 2 * self.d_latent * h * dh + d * self.d_rope
        return queries + keys_values + out

    def kv_cache_bytes_per_token(self, n_layers: int = 1, bytes_per_element: int = 2) -> int:
        """Bytes one token adds to the KV cache over `n_layers` layers (fp16/bf16: 2 bytes)."""
        if self.d_latent is None:
            per_layer = 2 * self.kv_heads * self.head_dim
        else:
            per_layer = self.d_latent + self.d_rope
        return n_layers * per_layer * bytes_per_element
