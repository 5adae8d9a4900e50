"""What the analyses know about a model: :class:`ModelInfo`, read once by :func:`describe_model`.

Shapes come from the TransformerLens config, special tokens from the tokenizer, and causality is
observed: four tokens run to the first attention layer's pattern, and a causal model never attends
forward. Layers without softmax attention (Qwen3-Next's linear-attention layers) are not in
:attr:`ModelInfo.attention_layers`; every analysis iterates that tuple, and its tables give those
layers' heads NaN. Latent attention (DeepSeek-V3) has query/key heads wider than its value heads:
:attr:`ModelInfo.d_head` is the value (head output) size, :attr:`ModelInfo.d_head_qk` the other.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from interp.errors import ModelLoadError, NonFiniteAttentionError
from interp.hooks import pattern_hook, resid_mid_hook


@dataclass(frozen=True)
class ModelInfo:
    """What the analyses need to know about a hooked model, whatever its architecture."""

    name: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int  # each head's output size (its value width: what ``hook_z`` holds per head)
    n_ctx: int
    d_vocab: int
    is_causal: bool
    bos_token_id: int | None  # prepended to decoder probes (None: the model expects no BOS)
    cls_token_id: int | None  # encoders: [CLS] ... [SEP] framing
    sep_token_id: int | None
    special_token_ids: frozenset[int]
    device: torch.device
    attention_layers: tuple[int, ...] = ()  # layers with softmax attention (empty: read as all)
    d_head_qk: int = 0  # query/key head size (0: read as d_head)
    v_layout: str = "b p h d"  # how hook_v lays out its axes (latent attention: head first)
    latent_attention: bool = False  # multi-head latent attention (DeepSeek-V2/V3): no per-head W_V

    def __post_init__(self) -> None:
        if not self.attention_layers:
            object.__setattr__(self, "attention_layers", tuple(range(self.n_layers)))
        if not self.d_head_qk:
            object.__setattr__(self, "d_head_qk", self.d_head)

    @property
    def absent_layers(self) -> tuple[int, ...]:
        """Layers without softmax attention: no pattern, no ``hook_z``, NaN in every head table."""
        present = set(self.attention_layers)
        return tuple(l for l in range(self.n_layers) if l not in present)

    @property
    def is_encoder(self) -> bool:
        return not self.is_causal

    def head_labels(self) -> list[str]:
        return [f"{l}.{h}" for l in range(self.n_layers) for h in range(self.n_heads)]


def describe_model(adapter: Any) -> ModelInfo:
    """Read a model's shape, special tokens and causality (observed once, then remembered).

    ``adapter`` is the model's :class:`~interp.adapters.base.Adapter` (it runs the causality probe).
    The device is read afresh on every call, so the answer follows ``model.to(device)``.
    """
    model = adapter.model
    cached = getattr(model, "_interp_info", None)
    if cached is not None:
        device = _model_device(model)
        return cached if cached.device == device else dataclasses.replace(cached, device=device)
    cfg = model.cfg
    tok = getattr(model, "tokenizer", None)
    special: set[int] = set()
    bos = cls = sep = None
    if tok is not None:
        special = {int(i) for i in (getattr(tok, "all_special_ids", None) or []) if i is not None}
        cls = getattr(tok, "cls_token_id", None)
        sep = getattr(tok, "sep_token_id", None)
        if getattr(cfg, "default_prepend_bos", True) and getattr(cfg, "tokenizer_prepends_bos", True):
            bos = getattr(tok, "bos_token_id", None)
    else:
        bos = getattr(cfg, "bos_token_id", None)
        if bos is not None:
            special.add(int(bos))
    d_vocab = int(cfg.d_vocab)
    in_vocab = lambda t: t if t is not None and 0 <= int(t) < d_vocab else None  # noqa: E731
    bos, cls, sep = in_vocab(bos), in_vocab(cls), in_vocab(sep)
    special = {t for t in special if 0 <= t < d_vocab}
    layers = attention_layers(model)
    heads = head_sizes(model)
    info = ModelInfo(
        name=str(getattr(cfg, "model_name", None) or type(model).__name__),
        n_layers=int(cfg.n_layers),
        n_heads=int(cfg.n_heads),
        d_model=int(cfg.d_model),
        d_head=heads["v"],
        d_head_qk=heads["qk"],
        v_layout=heads["v_layout"],
        latent_attention=heads["latent"],
        attention_layers=layers,
        n_ctx=int(cfg.n_ctx),
        d_vocab=d_vocab,
        is_causal=_observe_causal(adapter, d_vocab, special, layers[0] if layers else 0),
        bos_token_id=None if bos is None else int(bos),
        cls_token_id=None if cls is None else int(cls),
        sep_token_id=None if sep is None else int(sep),
        special_token_ids=frozenset(special),
        device=_model_device(model),
    )
    try:
        object.__setattr__(model, "_interp_info", info)
    except Exception:
        pass
    return info


def attention_layers(model: Any) -> tuple[int, ...]:
    """The blocks that have a softmax attention module (``blocks[l].attn``); all of them for a model
    without ``blocks``. Qwen3-Next's linear-attention blocks have ``linear_attn`` instead."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        return tuple(range(int(model.cfg.n_layers)))
    return tuple(l for l, b in enumerate(blocks) if isinstance(getattr(b, "attn", None), torch.nn.Module))


def attention_module(model: Any, layer: int) -> torch.nn.Module | None:
    """Block ``layer``'s attention module (``blocks[l].attn``), ``None`` where it has none."""
    attn = getattr(model.blocks[layer], "attn", None)
    return attn if isinstance(attn, torch.nn.Module) else None


def mlp_layers(model: Any) -> tuple[int, ...]:
    """The blocks that have an MLP module (``blocks[l].mlp``); an attention-only model has none."""
    return tuple(l for l, b in enumerate(model.blocks) if isinstance(getattr(b, "mlp", None), torch.nn.Module))


def has_hook(model: Any, name: str) -> bool:
    """Does ``model`` expose the hook point ``name``?"""
    return name in getattr(model, "hook_dict", {})


def is_parallel(model: Any) -> bool:
    """Do attention and the MLP read the same residual (GPT-J, NeoX)? Read as TransformerLens reports
    it, or from the hooks: a parallel block has no residual between its attention and its MLP."""
    if bool(getattr(model.cfg, "parallel_attn_mlp", False)):
        return True
    return bool(mlp_layers(model)) and not has_hook(model, resid_mid_hook(0))


def head_sizes(model: Any) -> dict[str, Any]:
    """Query/key and value head sizes, and the layout of ``hook_v``.

    TransformerLens copies Hugging Face's ``head_dim`` into ``cfg.d_head``; for multi-head latent
    attention (DeepSeek-V2/V3) that is the rotary part of the query/key head only
    (``qk_rope_head_dim``), while heads attend with ``qk_nope_head_dim + qk_rope_head_dim`` and output
    ``v_head_dim``. Their bridge's ``hook_v`` is head first (Hugging Face's layout).
    """
    d = int(model.cfg.d_head)
    hf_config = getattr(getattr(model, "original_model", None), "config", None)
    v_dim = getattr(hf_config, "v_head_dim", None)
    rope, nope = getattr(hf_config, "qk_rope_head_dim", None), getattr(hf_config, "qk_nope_head_dim", None)
    if v_dim and rope is not None and nope is not None:  # latent attention
        return {"v": int(v_dim), "qk": int(rope) + int(nope), "v_layout": "b h p d", "latent": True}
    return {"v": d, "qk": d, "v_layout": "b p h d", "latent": False}


def _model_device(model: Any) -> torch.device:
    """Where inputs go: the embedding's device (``cfg.device``) for a model spread over devices."""
    if int(getattr(model.cfg, "n_devices", 1) or 1) > 1 and getattr(model.cfg, "device", None) is not None:
        return torch.device(str(model.cfg.device))
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device(str(getattr(model.cfg, "device", "cpu")))


def _observe_causal(adapter: Any, d_vocab: int, special: set[int], layer: int = 0) -> bool:
    """Run four tokens to ``layer``'s pattern (the first attention layer) and look: a causal model
    never attends forward.

    Architecture names lie less often than configs but are open-ended; the pattern cannot lie.
    """
    model = adapter.model
    explicit = getattr(model.cfg, "causal", None)
    if isinstance(explicit, bool):
        return explicit
    ordinary = [t for t in range(min(d_vocab, 64)) if t not in special][:4]
    tokens = torch.tensor([ordinary], device=_model_device(model))
    seen: dict[str, torch.Tensor] = {}

    def grab(pattern: torch.Tensor, hook: Any) -> None:
        seen["pattern"] = pattern.detach()

    adapter.run_with_reducers(tokens, [(pattern_hook(layer), grab)], stop_after=pattern_hook(layer))
    if "pattern" not in seen:
        raise ModelLoadError(
            f"the model never produced {pattern_hook(layer)}: its attention runs in a fused "
            "kernel. Load it with attn_implementation='eager' (interp.models.from_hf_model does)."
        )
    if not torch.isfinite(seen["pattern"]).all():  # else NaN would read as "attends forward": an encoder
        raise NonFiniteAttentionError(
            f"layer {layer}: the attention pattern holds NaN or inf on 4 ordinary tokens; the model's weights "
            "or its dtype make it unstable: check the weights, or load it with dtype='float32'",
            params="dtype",
        )
    upper = torch.triu(seen["pattern"][0].float(), diagonal=1)
    return bool(upper.abs().max() < 1e-6)


__all__ = ["ModelInfo", "attention_layers", "describe_model", "head_sizes"]
