"""What the analyses know about a model: :class:`ModelInfo`, read once by :func:`describe_model`.

Shapes come from the TransformerLens config, special tokens from the tokenizer, and causality is
observed: four tokens run to layer 0's pattern, and a causal model never attends forward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from interp.errors import ModelLoadError, NonFiniteAttentionError
from interp.hooks import pattern_hook


@dataclass(frozen=True)
class ModelInfo:
    """What the analyses need to know about a hooked model, whatever its kind."""

    name: str
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    n_ctx: int
    d_vocab: int
    is_causal: bool
    bos_token_id: int | None  # prepended to decoder probes (None: the model expects no BOS)
    cls_token_id: int | None  # encoders: [CLS] ... [SEP] framing
    sep_token_id: int | None
    special_token_ids: frozenset[int]
    device: torch.device

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
    info = ModelInfo(
        name=str(getattr(cfg, "model_name", None) or type(model).__name__),
        n_layers=int(cfg.n_layers),
        n_heads=int(cfg.n_heads),
        d_model=int(cfg.d_model),
        d_head=int(cfg.d_head),
        n_ctx=int(cfg.n_ctx),
        d_vocab=d_vocab,
        is_causal=_observe_causal(adapter, d_vocab, special),
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


def _model_device(model: Any) -> torch.device:
    """Where inputs go: the embedding's device (``cfg.device``) for a model spread over devices."""
    if int(getattr(model.cfg, "n_devices", 1) or 1) > 1 and getattr(model.cfg, "device", None) is not None:
        return torch.device(str(model.cfg.device))
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device(str(getattr(model.cfg, "device", "cpu")))


def _observe_causal(adapter: Any, d_vocab: int, special: set[int]) -> bool:
    """Run four tokens to layer 0's pattern and look: a causal model never attends forward.

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

    adapter.run_with_reducers(tokens, [(pattern_hook(0), grab)], stop_after=pattern_hook(0))
    if "pattern" not in seen:
        raise ModelLoadError(
            "the model never produced blocks.0.attn.hook_pattern: its attention runs in a fused "
            "kernel. Load it with attn_implementation='eager' (interp.models.from_hf_model does)."
        )
    if not torch.isfinite(seen["pattern"]).all():  # else NaN would read as "attends forward": an encoder
        raise NonFiniteAttentionError(
            "layer 0: the attention pattern holds NaN or inf on 4 ordinary tokens; the model's weights "
            "or its dtype make it unstable: check the weights, or load it in float32 (command line: --dtype float32)"
        )
    upper = torch.triu(seen["pattern"][0].float(), diagonal=1)
    return bool(upper.abs().max() < 1e-6)


__all__ = ["ModelInfo", "describe_model"]
