"""One attention layer's queries and keys, each split exactly into one part per upstream component.

With the layer's input norm frozen at the run's own scale (:mod:`interp.roles.frozen`), its output
is ``N(x) = sum_c P(c) / s * w + b`` over the parts ``c`` of the residual stream entering the
layer:

- ``embed`` (the token embedding, and every other write before block 0) and ``pos_embed`` (learned
  absolute positions, where the model has them);
- each earlier head ``l.h``: its output ``z W_O`` (through a post-attention norm frozen the same
  way, Gemma 2), ``attn_other.l``: the rest of that attention's write (the output bias ``b_O``, a
  post-norm's bias), ``mlp.l``: the MLP's write; ``block.l``: the whole write of a layer without
  softmax attention;
- ``norm_bias``: the input norm's own bias ``b`` (a LayerNorm's).

The query and key the model attends with (after rotary: :class:`~interp.adapters.AttentionInputs`)
are affine in that normalized input at each position, whatever the architecture does in between,
once the attention's own query/key norms (``q_norm``, ``k_norm``: Qwen 3, Gemma 3, OLMo 2) are
frozen the same way: each position's (and head's) scale is the run's own, read from the norm's
hooks, so ``q_norm(W_q x)`` becomes ``W_q x / s_q * w_q``, linear in ``x``.
So each part's query and key are read by running the layer's own attention module again on that
part alone (the call the run made, recorded, its hidden input replaced, in float64, at the positions
asked: the targets' queries and keys, then one block of keys at a time), minus a run on
zero input; the zero run itself is ``qk_bias``, the attention's own query/key biases (rotated).
Nothing is assumed about the projections: the model's module computes every part, and the parts of
every query and key add up to the model's own (checked by the caller).

Refused before any forward: latent attention, per-head output gates, query/key norms whose scale is
not hooked (a model that is not a bridge), and encoders (post-LayerNorm blocks: a layer's input is
a norm of the sum, not a sum of parts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
from einops import einsum
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.adapters import AttentionInputs, HookedModel, adapter_for, describe, gated_attention_modules
from interp.adapters.info import ModelInfo, attention_module, has_hook, mlp_layers
from interp.adapters.surgery import attention_calls
from interp.adapters.weights import (
    NormSite,
    centered,
    gain_and_bias,
    input_norm_site,
    post_attention_norm_site,
    qk_norm_modules,
    qk_norm_sites,
    read_head_weights,
)
from interp.errors import UsageError
from interp.hooks import POS_EMBED_HOOK, resid_post_hook, resid_pre_hook
from interp.roles.frozen import FrozenNorm, freeze
from interp.stream.blockwise import attention_output, own_attention

WHAT = "QK attribution"
CACHES = ("past_key_values", "past_key_value", "layer_past")
KEY_BLOCK = 1024  # positions of keys read at once when summing a target's window
FIT_ROWS = 4096  # positions a frozen norm's gain and bias are fitted on


@dataclass(frozen=True)
class Component:
    """One upstream part of a layer's input: its name (``embed``, ``0.1``, ``mlp.0``, ...), its kind
    (``embed``, ``pos_embed``, ``head``, ``attn_other``, ``mlp``, ``block``, ``bias``) and the layer
    it was written by (``None``: the embeddings, and the decomposed layer's own biases)."""

    name: str
    kind: str
    layer: int | None = None


@dataclass
class CleanRun:
    """What one run keeps for the layers it decomposes (every read on the model's device)."""

    grabbed: dict[str, Tensor] = field(default_factory=dict)  # residual reads, keyed by the name asked
    z: dict[int, Tensor] = field(default_factory=dict)  # earlier layers: [batch, head, pos, d_head]
    attn_out: dict[int, Tensor] = field(default_factory=dict)  # earlier layers: the attention module's output
    inputs: dict[int, AttentionInputs] = field(default_factory=dict)  # decomposed layers, as the model attends
    calls: dict[int, tuple[tuple, dict]] = field(default_factory=dict)  # decomposed layers' attention calls
    W_O: Tensor | None = None  # every head's output weights (float64), read once for all the layers


def refusal(model: HookedModel, info: ModelInfo, layers: list[int]) -> str | None:
    """Why the queries and keys of ``layers`` cannot be split into upstream parts (``None``: they can)."""
    if info.latent_attention:
        return (
            f"{WHAT} splits each head's query and key into upstream parts, and {info.name} has multi-head "
            "latent attention: its keys come out of one shared compressed projection through a norm, "
            "not as a sum of parts: refused"
        )
    if info.is_encoder:
        return (
            f"{WHAT} splits the residual stream entering a layer into upstream parts, and {info.name} is an "
            "encoder whose blocks normalise after adding (post-LayerNorm): a layer's input is a norm of the "
            "sum, not a sum of parts: refused"
        )
    gated = sorted(gated_attention_modules(model))
    if gated:
        return (
            f"{WHAT} reads each earlier head's output as its pattern times its values through W_O, and "
            f"{info.name}'s attention in layers {gated} multiplies each head's output by a sigmoid gate: refused"
        )
    for l in layers:
        norms = qk_norm_modules(model, l)
        if norms and qk_norm_sites(model, l) is None:
            return (
                f"{WHAT} freezes the query and key norms ({', '.join(norms)}) of {info.name}'s attention at the "
                "run's own scale, and their scale is not hooked (load the model as a TransformerBridge): refused"
            )
    return None


def check_decomposable(model: HookedModel, layers: list[int]) -> ModelInfo:
    """Raise :class:`UsageError` (before any forward) unless ``layers`` can be decomposed."""
    info = describe(model)
    why = refusal(model, info, layers)
    if why is not None:
        raise UsageError(why)
    absent = [l for l in layers if l not in info.attention_layers]
    if absent:
        raise UsageError(
            f"layer(s) {absent} of {info.name} have no softmax attention: name heads of {list(info.attention_layers)}",
            params="heads",
        )
    return info


def check_interface(model: HookedModel, tokens: Int[Tensor, "batch pos"], layers: list[int]) -> None:
    """Refuse, after a 2-token forward of the first sequence, when the capture never sees the query
    and key of ``layers`` (an attention class of its own that bypasses the attention interface)."""
    info = describe(model)
    seen: set[int] = set()
    with adapter_for(model).capture_attention(lambda a: seen.add(a.layer), attend=own_attention) as hooks:
        try:
            adapter_for(model).run_with_reducers(
                tokens[:1, :2].to(info.device), hooks, stop_after=resid_post_hook(max(layers))
            )
        except UsageError:
            raise
        except Exception:  # an attention of its own that needs the mask the capture withholds
            pass
    missing = [l for l in layers if l not in seen]
    if missing:
        raise UsageError(
            f"{WHAT} reads the query and key of layer(s) {missing} as {info.name}'s attention forms them, and its "
            "attention does not pass them through Hugging Face's attention interface: refused"
        )


def clean_run(
    model: HookedModel,
    tokens: Int[Tensor, "batch pos"],
    layers: list[int],
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
) -> CleanRun:
    """One forward up to the last of ``layers`` with attention fused (no ``[T, T]`` pattern): the
    residual reads, each earlier layer's per-head output (the blockwise attention output of its
    captured inputs) and attention output, and each decomposed layer's attention inputs and call."""
    info = describe(model)
    adapter = adapter_for(model)
    last = max(layers)
    run = CleanRun()

    def on_attention(a: AttentionInputs) -> None:
        if a.layer < last:
            run.z[a.layer] = attention_output(a)
        if a.layer in layers:
            run.inputs[a.layer] = a
        if a.layer == last:  # all it needs is in hand: the layer's attention and all after it are never run
            raise _Caught

    def grab(name: str) -> Any:
        def keep(t: Tensor, hook: Any) -> None:
            run.grabbed[name] = t.detach()

        return keep

    names = [resid_pre_hook(0), *(resid_pre_hook(l) for l in range(last + 1))]
    names += [resid_post_hook(l) for l in range(last)]
    if _learned_positions(model):
        names.append(POS_EMBED_HOOK)
    sites = [post_attention_norm_site(model, l) for l in range(last)] + [input_norm_site(model, l) for l in layers]
    sites += [site for l in layers for site in (qk_norm_sites(model, l) or {}).values()]
    names += [n for site in sites if site is not None for n in (site.input, site.scale, site.output)]
    hooks = [(n, grab(n)) for n in dict.fromkeys(names)]

    outputs = [l for l in info.attention_layers if l < last]
    with attention_calls(model, layers, outputs) as (run.calls, run.attn_out):
        try:
            with adapter.capture_attention(on_attention, attend=own_attention) as capture:
                adapter.run_with_reducers(
                    tokens.to(info.device),
                    [*capture, *hooks],
                    stop_after=resid_post_hook(last),
                    attention_mask=None if attention_mask is None else attention_mask.to(info.device),
                )
        except _Caught:
            pass
    missing = [l for l in layers if l not in run.inputs or l not in run.calls]
    if missing:
        raise UsageError(
            f"{WHAT} reads the query and key of layer(s) {missing} as {info.name}'s attention forms them, and its "
            "attention does not pass them through Hugging Face's attention interface: refused"
        )
    return run


def _learned_positions(model: HookedModel) -> bool:
    kind = str(getattr(model.cfg, "positional_embedding_type", "standard"))
    return kind == "standard" and has_hook(model, POS_EMBED_HOOK)


Reader = Callable[[Tensor], Float[Tensor, "batch pos d_model"]]  # positions -> a part at them (float64)


def _rows(x: Tensor) -> Reader:
    return lambda pos: x[:, pos].double()


def _difference(after: Reader, before: Reader) -> Reader:
    return lambda pos: after(pos) - before(pos)


def residual_parts(
    model: HookedModel, info: ModelInfo, run: CleanRun, layer: int, W_O: Tensor
) -> Iterator[tuple[Component, Reader]]:
    """The parts of the residual stream entering ``layer``, one at a time, each as a reader: given
    positions, the part at them in float64 (the run's reads stay in the model's dtype, so no part is
    ever held at every position). They add up to ``blocks.{layer}.hook_resid_pre``."""
    g, mlps = run.grabbed, set(mlp_layers(model))
    pre0 = g[resid_pre_hook(0)]
    pos = g.get(POS_EMBED_HOOK)
    if pos is not None and pos.shape[-1] == pre0.shape[-1]:
        at = _rows(pos.expand_as(pre0))
        yield Component("embed", "embed"), _difference(_rows(pre0), at)
        yield Component("pos_embed", "pos_embed"), at
    else:
        yield Component("embed", "embed"), _rows(pre0)
    for l in range(layer):
        delta = _difference(_rows(g[resid_post_hook(l)]), _rows(g[resid_pre_hook(l)]))
        if l not in run.z:
            yield Component(f"block.{l}", "block", l), delta
            continue
        post = post_attention_norm_site(model, l)
        write = _rows(run.attn_out[l] if post is None else g[post.output])
        w_post = None if post is None else gain_and_bias(post, g, max_rows=FIT_ROWS)[0]
        heads = [_head_part(run.z[l][:, h], W_O[l, h], post, w_post, g) for h in range(info.n_heads)]
        for h, part in enumerate(heads):
            yield Component(f"{l}.{h}", "head", l), part
        has_mlp = l in mlps
        other = write if has_mlp else delta
        yield Component(f"attn_other.{l}", "attn_other", l), lambda p, o=other, hs=heads: o(p) - sum(h(p) for h in hs)
        if has_mlp:
            yield Component(f"mlp.{l}", "mlp", l), _difference(delta, write)


def _head_part(
    z: Float[Tensor, "batch pos d_head"],
    W_O: Tensor,
    post: NormSite | None,
    w_post: Tensor | None,
    g: dict[str, Tensor],
) -> Reader:
    """One head's write ``z W_O`` (through a post-attention norm frozen at the run's scale)."""

    def read(pos: Tensor) -> Tensor:
        part = einsum(z[:, pos].double(), W_O.to(z.device).double(), "b p d, d m -> b p m")
        if post is None:
            return part
        return centered(part, post) / g[post.scale][:, pos].double() * w_post.to(part.device)

    return read


@contextmanager
def _in_float64(modules: list[torch.nn.Module]) -> Iterator[None]:
    """Inside the block the modules' floating parameters and buffers are float64 (the originals back
    afterwards, bit for bit)."""
    seen: dict[int, tuple[Tensor, Tensor]] = {}
    for t in chain.from_iterable(chain(m.parameters(), m.buffers()) for m in modules):
        if t.is_floating_point() and id(t) not in seen:
            seen[id(t)] = (t, t.data)
    try:
        for t, data in seen.values():
            t.data = data.double()
        yield
    finally:
        for t, data in seen.values():
            t.data = data


def _as_float64(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.double() if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_as_float64(v) for v in x)
    if isinstance(x, dict):
        return {k: _as_float64(v) for k, v in x.items()}
    return x


def _is_cache(name: str, value: Any) -> bool:
    """A key/value cache argument (a replay must not append to it)."""
    return name in CACHES or (hasattr(value, "update") and hasattr(value, "get_seq_length"))


class _Caught(Exception):
    """Raised from the capture once the replayed layer's query and key are in hand."""


def _at_positions(x: Any, pos: Tensor, T: int) -> Any:
    """An argument of a recorded call read at positions ``pos`` of its ``T``: a position axis (the
    first of a vector, both last of a ``[batch, head, T, T]`` mask, else the second: hidden states,
    position ids, rotary tables) is indexed, anything else kept."""
    if isinstance(x, Tensor):
        p = pos.to(x.device)
        if x.ndim == 1 and x.shape[0] == T:
            return x[p]
        if x.ndim == 4 and x.shape[-2:] == (T, T):
            return x[..., p[:, None], p]
        if x.ndim >= 2 and x.shape[1] == T:
            return x[:, p]
        return x
    if isinstance(x, (tuple, list)):
        return type(x)(_at_positions(v, pos, T) for v in x)
    if isinstance(x, dict):
        return {k: _at_positions(v, pos, T) for k, v in x.items()}
    return x


def replayer(
    model: HookedModel, layer: int, call: tuple[tuple, dict], norms: dict[str, FrozenNorm] | None = None
) -> Any:
    """``replay(x, pos)``: the query and key (float64, as the model attends) of layer ``layer``'s
    attention run again on the normalized input ``x`` ``[batch, len(pos), d_model]`` at positions
    ``pos`` of the recorded ``call``, every other argument of it read at those positions (rotary
    tables, position ids, a mask). A query or key depends on its own position's input alone, so a
    block of positions gives what the whole run would there. The attention itself is never computed.
    ``norms``: the attention's query/key norms (by attribute name), each frozen at the run's scale
    at ``pos`` in place of the module's own, so the query and key stay affine in ``x``."""
    adapter = adapter_for(model)
    attn = attention_module(model, layer)
    modules = [attn] + (
        [attn.original_component] if isinstance(getattr(attn, "original_component", None), torch.nn.Module) else []
    )
    norm_modules = qk_norm_modules(model, layer)
    args, kwargs = call
    kwargs = {k: (None if _is_cache(k, v) else False if k == "use_cache" else v) for k, v in kwargs.items()}
    positional = bool(args) and isinstance(args[0], Tensor)
    if not positional and not isinstance(kwargs.get("hidden_states"), Tensor):
        raise UsageError(
            f"{WHAT}: layer {layer}'s attention was called without a hidden-state input it can replace: refused"
        )
    T = (args[0] if positional else kwargs["hidden_states"]).shape[1]

    def replay(x: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        got: dict[str, Tensor] = {}

        def on_attention(a: AttentionInputs) -> None:
            if a.layer == layer:
                got["q"], got["k"] = a.q, a.k
                raise _Caught

        def attend(own: AttentionInputs, seen: AttentionInputs, callback: Any) -> Tensor:
            callback(seen)
            raise _Caught

        at_args, at_kwargs = _as_float64(_at_positions((args[1:] if positional else args, kwargs), pos, T))
        call_args = (x, *at_args) if positional else at_args
        call_kwargs = at_kwargs if positional else {**at_kwargs, "hidden_states": x}
        handles = [
            norm_modules[n].register_forward_hook(_frozen_output(f, pos), with_kwargs=True)
            for n, f in (norms or {}).items()
        ]
        try:
            with torch.no_grad(), _in_float64(modules), adapter.capture_attention(on_attention, attend) as hooks:
                with model.hooks(fwd_hooks=hooks) if hooks else nullcontext():
                    try:
                        attn(*call_args, **call_kwargs)
                    except _Caught:
                        pass
        finally:
            for h in handles:
                h.remove()
        if "q" not in got:
            raise UsageError(f"{WHAT}: replaying layer {layer}'s attention gave no query and key: refused")
        return got["q"].double(), got["k"].double()

    return replay


def _frozen_output(norm: FrozenNorm, pos: Tensor) -> Any:
    def hook(module: Any, args: tuple, kwargs: dict, out: Any) -> Tensor:
        x = args[0] if args else next(v for v in kwargs.values() if isinstance(v, Tensor))
        return norm(x, pos)

    return hook


@dataclass
class LayerParts:
    """How ``layer``'s input was split: the frozen norm's pieces, for the caller's checks."""

    layer: int
    norm: str  # "LayerNorm", "RMSNorm" or "none"
    residual_error: float = 0.0  # largest |sum of parts - the layer's input| at the targets' positions
    norm_error: float = 0.0  # largest |sum of normalized parts - the norm's output| there
    qk_norms: list[str] = field(default_factory=list)  # the attention's query/key norms, frozen the same way


def visible_keys(a: AttentionInputs, pairs: Int[Tensor, "n 3"]) -> tuple[Tensor, Tensor, Tensor]:
    """Per target: the first and last key its query may see, and whether the target is one of them
    with another key beside it (a contrast needs two)."""
    b, i, j = pairs.unbind(-1)
    T = a.k.shape[2]
    lo = (i - a.window + 1).clamp_min(0) if a.window is not None else torch.zeros_like(i)
    hi = i.clone() if a.causal else torch.full_like(i, T - 1)
    ok = (j >= lo) & (j <= hi) & (i < T) & (j < T) & (hi - lo >= 1)
    if a.key_mask is not None:
        real = a.key_mask.cpu().bool()
        ok &= real[b, j.clamp_max(T - 1)] & real[b, i.clamp_max(T - 1)]
    return lo, hi, ok


def window_sums(
    x: Float[Tensor, "batch kv pos d"], real: Tensor, b: Tensor, g: Tensor, lo: Tensor, hi: Tensor
) -> Tensor:
    """``sum over keys lo..hi`` of ``x`` (padding left out) at each target's batch and key head: one
    prefix sum over positions (``O(T)``, never ``[T, T]``; for the key counts and positions, one
    value a position)."""
    prefix = torch.cumsum(x * real[:, None, :, None], dim=2)
    prefix = torch.cat([torch.zeros_like(prefix[:, :, :1]), prefix], dim=2)
    return prefix[b[:, None], g, (hi + 1)[:, None]] - prefix[b[:, None], g, lo[:, None]]


@dataclass
class Windows:
    """The keys each target's query may see: its sequence ``b``, first key ``lo`` and last ``hi``
    (each ``[n]``), and ``real`` ``[batch, pos]`` (float64, 0 at padded keys)."""

    b: Int[Tensor, " n"]
    lo: Int[Tensor, " n"]
    hi: Int[Tensor, " n"]
    real: Float[Tensor, "batch pos"]


def window_key_sums(
    read: Callable[[Tensor], Float[Tensor, "batch kv_head block d"]], w: Windows, block: int | None = None
) -> Float[Tensor, "n kv_head d"]:
    """Per target, the sum of the keys ``lo..hi`` it may see (padding left out), the keys read a
    block of positions at a time (``read(positions)``): never a ``[T, T]`` tensor, nor a key at
    every position at once. ``block``: positions a read, default :data:`KEY_BLOCK`."""
    block = block or KEY_BLOCK
    out = None
    for start in range(int(w.lo.min()), int(w.hi.max()) + 1, block):
        pos = torch.arange(start, min(start + block, int(w.hi.max()) + 1), device=w.real.device)
        k = read(pos) * w.real[:, None, pos, None]
        prefix = torch.nn.functional.pad(torch.cumsum(k, dim=2), (0, 0, 1, 0))
        first, last = (w.lo - start).clamp(0, len(pos)), (w.hi + 1 - start).clamp(0, len(pos))
        part = prefix[w.b, :, last] - prefix[w.b, :, first]  # [n, kv_head, d]
        out = part if out is None else out + part
    return out


@dataclass
class Sides:
    """One component's query and key at the targets' positions ``[batch, head, len(points), d]``,
    and the sum of its keys over each target's window ``[n, kv_head, d]`` (float64)."""

    q: Tensor
    k: Tensor
    k_sums: Tensor

    def __sub__(self, other: Sides) -> Sides:
        return Sides(self.q - other.q, self.k - other.k, self.k_sums - other.k_sums)


def qk_parts(
    model: HookedModel,
    info: ModelInfo,
    run: CleanRun,
    layer: int,
    report: LayerParts,
    points: Int[Tensor, " p"],
    windows: Windows,
) -> Iterator[tuple[Component, Sides]]:
    """Each component's query and key at ``points`` (the targets' queries and keys) and its keys
    summed over each target's window, one component at a time; the last are ``norm_bias`` (a
    LayerNorm's) and ``qk_bias`` (the zero-input run, when not zero). ``report`` gets the residual
    and norm errors at ``points`` once every part has been seen."""
    if run.W_O is None:
        run.W_O = read_head_weights(model, info, WHAT).W_O
    W_O = run.W_O
    site = input_norm_site(model, layer)
    g = run.grabbed
    resid = g[resid_pre_hook(layer)]
    if site is not None:
        w, b = gain_and_bias(site, g, max_rows=FIT_ROWS)
        w, b = w.to(resid.device), b.to(resid.device)
        report.norm = "LayerNorm" if site.centered else "RMSNorm"
    n_pos = resid.shape[1]
    norms = {n: freeze(site, g, n_pos, max_rows=FIT_ROWS) for n, site in (qk_norm_sites(model, layer) or {}).items()}
    report.qk_norms = list(norms)
    replay = replayer(model, layer, run.calls[layer], norms)

    def sides(normalized: Reader) -> Sides:
        q, k = replay(normalized(points), points)
        return Sides(q, k, window_key_sums(lambda pos: replay(normalized(pos), pos)[1], windows))

    def frozen(part: Reader) -> Reader:
        return part if site is None else lambda pos: centered(part(pos), site) / g[site.scale][:, pos].double() * w

    zero = sides(
        lambda pos: torch.zeros(resid.shape[0], len(pos), resid.shape[-1], dtype=torch.float64, device=resid.device)
    )
    total = torch.zeros(resid.shape[0], len(points), resid.shape[-1], dtype=torch.float64, device=resid.device)
    normalized = total.clone()
    for comp, part in residual_parts(model, info, run, layer, W_O):
        total += part(points)
        normalized += frozen(part)(points)
        yield comp, sides(frozen(part)) - zero
    report.residual_error = float((total - resid[:, points].double()).abs().max())
    if site is not None:
        if site.centered:
            yield Component("norm_bias", "bias"), sides(lambda pos: b.expand(resid.shape[0], len(pos), -1)) - zero
            normalized += b
        report.norm_error = float((normalized - g[site.output][:, points].double()).abs().max())
    if bool(zero.q.any()) or bool(zero.k.any()) or bool(zero.k_sums.any()):
        yield Component("qk_bias", "bias"), zero


__all__ = [
    "CleanRun",
    "Component",
    "LayerParts",
    "Sides",
    "Windows",
    "check_decomposable",
    "check_interface",
    "clean_run",
    "qk_parts",
    "refusal",
    "replayer",
    "residual_parts",
    "visible_keys",
    "window_key_sums",
    "window_sums",
]
