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
are affine in that normalized input at each position, whatever the architecture does in between.
So each part's query and key are read by running the layer's own attention module again on that
part alone (the call the run made, recorded, its hidden input replaced, in float64), minus a run on
zero input; the zero run itself is ``qk_bias``, the attention's own query/key biases (rotated).
Nothing is assumed about the projections: the model's module computes every part, and the parts of
every query and key add up to the model's own (checked by the caller).

Refused before any forward: latent attention, per-head output gates, query/key norms, and encoders
(post-LayerNorm blocks: a layer's input is a norm of the sum, not a sum of parts).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
from einops import einsum
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.adapters import AttentionInputs, HookedModel, adapter_for, describe
from interp.adapters.bridge import gated_attention_modules
from interp.adapters.info import ModelInfo
from interp.adapters.weights import input_norm_site, post_attention_norm_site, read_head_weights
from interp.errors import UsageError
from interp.hooks import resid_post_hook
from interp.roles.frozen import centered, gain_and_bias
from interp.stream.blockwise import attention_output, own_attention

WHAT = "QK attribution"
QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm")
CACHES = ("past_key_values", "past_key_value", "layer_past")


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
    blocks = getattr(model, "blocks", None)
    for l in layers:
        attn = getattr(blocks[l], "attn", None) if blocks is not None else None
        inner = getattr(attn, "original_component", attn)
        norms = [n for n in QK_NORMS if isinstance(getattr(inner, n, None), torch.nn.Module)]
        if norms:
            return (
                f"{WHAT} needs each query and key to be affine in the layer's input, and {info.name}'s "
                f"attention normalises them ({', '.join(norms)}) after the projection: refused"
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


def _detached(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.detach()
    if isinstance(x, (tuple, list)):
        return type(x)(_detached(v) for v in x)
    return x


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

    def grab(name: str) -> Any:
        def keep(t: Tensor, hook: Any) -> None:
            run.grabbed[name] = t.detach()

        return keep

    names = ["blocks.0.hook_resid_pre", *(f"blocks.{l}.hook_resid_pre" for l in range(last + 1))]
    names += [f"blocks.{l}.hook_resid_post" for l in range(last)]
    if _learned_positions(model):
        names.append("hook_pos_embed")
    sites = [post_attention_norm_site(model, l) for l in range(last)] + [input_norm_site(model, l) for l in layers]
    names += [n for site in sites if site is not None for n in (site.input, site.scale, site.output)]
    hooks = [(n, grab(n)) for n in dict.fromkeys(names)]

    def record(layer: int) -> Any:
        def pre(module: Any, args: tuple, kwargs: dict) -> None:
            run.calls[layer] = (_detached(args), _detached(kwargs))

        return pre

    def output(layer: int) -> Any:
        def post(module: Any, args: tuple, out: Any) -> None:
            run.attn_out[layer] = (out[0] if isinstance(out, (tuple, list)) else out).detach()

        return post

    blocks = model.blocks
    handles = [blocks[l].attn.register_forward_pre_hook(record(l), with_kwargs=True) for l in layers]
    handles += [blocks[l].attn.register_forward_hook(output(l)) for l in info.attention_layers if l < last]
    try:
        with adapter.capture_attention(on_attention, attend=own_attention) as capture:
            adapter.run_with_reducers(
                tokens.to(info.device),
                [*capture, *hooks],
                stop_after=resid_post_hook(last),
                attention_mask=None if attention_mask is None else attention_mask.to(info.device),
            )
    finally:
        for h in handles:
            h.remove()
    missing = [l for l in layers if l not in run.inputs or l not in run.calls]
    if missing:
        raise UsageError(
            f"{WHAT} reads the query and key of layer(s) {missing} as {info.name}'s attention forms them, and its "
            "attention does not pass them through Hugging Face's attention interface: refused"
        )
    return run


def _learned_positions(model: HookedModel) -> bool:
    kind = str(getattr(model.cfg, "positional_embedding_type", "standard"))
    return kind == "standard" and "hook_pos_embed" in model.hook_dict


def residual_parts(
    model: HookedModel, info: ModelInfo, run: CleanRun, layer: int, W_O: Tensor
) -> Iterator[tuple[Component, Float[Tensor, "batch pos d_model"]]]:
    """The parts of the residual stream entering ``layer``, one at a time (float64): they add up to
    ``blocks.{layer}.hook_resid_pre``."""
    g = run.grabbed
    pre0 = g["blocks.0.hook_resid_pre"].double()
    pos = g.get("hook_pos_embed")
    if pos is not None and pos.shape[-1] == pre0.shape[-1]:
        pos = pos.double().expand_as(pre0)
        yield Component("embed", "embed"), pre0 - pos
        yield Component("pos_embed", "pos_embed"), pos
    else:
        yield Component("embed", "embed"), pre0
    for l in range(layer):
        before, after = g[f"blocks.{l}.hook_resid_pre"].double(), g[f"blocks.{l}.hook_resid_post"].double()
        if l not in run.z:
            yield Component(f"block.{l}", "block", l), after - before
            continue
        post = post_attention_norm_site(model, l)
        write = run.attn_out[l].double() if post is None else g[post.output].double()
        if post is not None:
            w_post, _ = gain_and_bias(post, g)
            s_post = g[post.scale].double()
        heads = torch.zeros_like(write)
        z = run.z[l]
        for h in range(info.n_heads):
            part = einsum(z[:, h].double(), W_O[l, h].to(z.device), "b p d, d m -> b p m")
            if post is not None:
                part = centered(part, post) / s_post * w_post
            heads += part
            yield Component(f"{l}.{h}", "head", l), part
        has_mlp = isinstance(getattr(model.blocks[l], "mlp", None), torch.nn.Module)
        yield Component(f"attn_other.{l}", "attn_other", l), (write if has_mlp else after - before) - heads
        if has_mlp:
            yield Component(f"mlp.{l}", "mlp", l), after - before - write


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
    return x


def _is_cache(name: str, value: Any) -> bool:
    """A key/value cache argument (a replay must not append to it)."""
    return name in CACHES or (hasattr(value, "update") and hasattr(value, "get_seq_length"))


class _Caught(Exception):
    """Raised from the capture once the replayed layer's query and key are in hand."""


def replayer(model: HookedModel, layer: int, call: tuple[tuple, dict]) -> Any:
    """``replay(x)``: the query and key (float64, as the model attends) of layer ``layer``'s attention
    run again on the normalized input ``x`` ``[batch, pos, d_model]``, with every other argument of
    the recorded ``call``. The attention itself is never computed."""
    adapter = adapter_for(model)
    attn = model.blocks[layer].attn
    modules = [attn] + (
        [attn.original_component] if isinstance(getattr(attn, "original_component", None), torch.nn.Module) else []
    )
    args, kwargs = call
    kwargs = {k: (None if _is_cache(k, v) else False if k == "use_cache" else v) for k, v in kwargs.items()}
    args, kwargs = _as_float64(args), _as_float64(kwargs)
    positional = bool(args) and isinstance(args[0], Tensor)
    if not positional and not isinstance(kwargs.get("hidden_states"), Tensor):
        raise UsageError(
            f"{WHAT}: layer {layer}'s attention was called without a hidden-state input it can replace: refused"
        )

    def replay(x: Tensor) -> tuple[Tensor, Tensor]:
        got: dict[str, Tensor] = {}

        def on_attention(a: AttentionInputs) -> None:
            if a.layer == layer:
                got["q"], got["k"] = a.q, a.k
                raise _Caught

        def attend(own: AttentionInputs, seen: AttentionInputs, callback: Any) -> Tensor:
            callback(seen)
            raise _Caught

        call_args, call_kwargs = ((x, *args[1:]), kwargs) if positional else (args, {**kwargs, "hidden_states": x})
        with torch.no_grad(), _in_float64(modules), adapter.capture_attention(on_attention, attend) as hooks:
            with model.hooks(fwd_hooks=hooks) if hooks else nullcontext():
                try:
                    attn(*call_args, **call_kwargs)
                except _Caught:
                    pass
        if "q" not in got:
            raise UsageError(f"{WHAT}: replaying layer {layer}'s attention gave no query and key: refused")
        return got["q"].double(), got["k"].double()

    return replay


@dataclass
class LayerParts:
    """How ``layer``'s input was split: the frozen norm's pieces, for the caller's checks."""

    layer: int
    norm: str  # "LayerNorm", "RMSNorm" or "none"
    residual_error: float = 0.0  # largest |sum of parts - the layer's input| (float64 against the run)
    norm_error: float = 0.0  # largest |sum of normalized parts - the norm's output|


def qk_parts(
    model: HookedModel,
    info: ModelInfo,
    run: CleanRun,
    layer: int,
    report: LayerParts,
) -> Iterator[tuple[Component, Float[Tensor, "batch head pos d"], Float[Tensor, "batch kv_head pos d"]]]:
    """Each component's query and key at every position of ``layer`` (float64), one at a time; the
    last are ``norm_bias`` (a LayerNorm's) and ``qk_bias`` (the zero-input run, when not zero).
    ``report`` gets the residual and norm errors once every part has been seen."""
    W_O = read_head_weights(model, info, WHAT).W_O
    site = input_norm_site(model, layer)
    g = run.grabbed
    resid = g[f"blocks.{layer}.hook_resid_pre"].double()
    if site is not None:
        w, b = gain_and_bias(site, g)
        w, b = w.to(resid.device), b.to(resid.device)
        scale = g[site.scale].double()
        report.norm = "LayerNorm" if site.centered else "RMSNorm"
    replay = replayer(model, layer, run.calls[layer])
    zero_q, zero_k = replay(torch.zeros_like(resid))
    total, normalized = torch.zeros_like(resid), torch.zeros_like(resid)
    for comp, part in residual_parts(model, info, run, layer, W_O):
        total += part
        x = part if site is None else centered(part, site) / scale * w
        normalized += x
        q, k = replay(x)
        yield comp, q - zero_q, k - zero_k
    report.residual_error = float((total - resid).abs().max())
    if site is not None:
        if site.centered:
            q, k = replay(b.expand_as(resid).contiguous())
            yield Component("norm_bias", "bias"), q - zero_q, k - zero_k
            normalized += b
        report.norm_error = float((normalized - g[site.output].double()).abs().max())
    if bool(zero_q.any()) or bool(zero_k.any()):
        yield Component("qk_bias", "bias"), zero_q, zero_k


__all__ = [
    "CleanRun",
    "Component",
    "LayerParts",
    "check_decomposable",
    "check_interface",
    "clean_run",
    "qk_parts",
    "refusal",
    "replayer",
    "residual_parts",
]
