"""Conformance against Hugging Face's own attention: tiny random models of many families, and
references computed from the Hugging Face model alone (never through interp).

Not a test file: the suite and the README table script import it.

- :data:`FAMILIES` / :func:`build`: a tiny random model per architecture family, built offline from
  its ``transformers`` config, eager attention, eval mode, weights large enough that attention is far
  from uniform; and the facts a check needs (windows per layer, softcap, learned sinks, encoder, which
  layers are softmax-attention layers).
- References: :func:`hf_patterns` (``output_attentions=True``), :func:`reference_head_scores` and
  :func:`reference_sink_stats` (a few lines each, from those patterns), :func:`hf_head_ablation_delta`
  (a forward pre-hook zeroing one head's slice of the output projection's input).
- :func:`attention_call_kwargs`: what the attention-interface function of each layer receives.
- :func:`hf_gradient_importance`: Michel et al.'s importance by autograd through the Hugging Face
  model, a gate per (sequence, head) multiplying the head's slice of the output projection's input.
- :func:`prepare` (one family built once) and :func:`run_check` (one engine against its reference,
  with the work done before the outcome); :func:`check_family` runs every check of a family.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from interp.config import RunConfig
from tests.helpers import VOCAB, word_tokenizer

TOL = 1e-5
D_MODEL, N_HEADS, D_HEAD, N_LAYERS, MAX_POS = 64, 4, 16, 2, 256
WINDOW = 16  # sliding windows shorter than the probe (41 tokens)


@dataclass(frozen=True)
class Family:
    """One architecture family: how to build it, and what its attention does."""

    name: str
    model_type: str
    config: dict[str, Any]
    windows: tuple[int | None, ...] = (None,) * N_LAYERS  # per layer: keys a query sees (None: all)
    softcap: float | None = None
    has_sinks: bool = False  # learned per-head sink logits in the softmax denominator
    has_gate: bool = False  # an output gate per head (qwen3_next)
    is_encoder: bool = False
    attention_layers: tuple[int, ...] = tuple(range(N_LAYERS))  # softmax-attention layers
    o_proj: str = "o_proj"  # the attention output projection, relative to the attention module
    attn_path: str = "model.layers.{l}.self_attn"  # the attention module of layer l
    init: float = 0.3  # initializer_range: large, so patterns are far from uniform
    notes: str = ""

    @property
    def n_layers(self) -> int:
        return len(self.windows)


def _common(**kw: Any) -> dict[str, Any]:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=N_HEADS,
        intermediate_size=2 * D_MODEL,
        max_position_embeddings=MAX_POS,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    base.update(kw)
    return base


_GEMMA3_LAYERS = ("sliding_attention",) * 5 + ("full_attention",)
_FAMS = [
    Family(
        "gpt2",
        "gpt2",
        dict(vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=64, n_positions=MAX_POS, bos_token_id=0, eos_token_id=0),
        o_proj="c_proj",
        attn_path="transformer.h.{l}.attn",
    ),
    Family(
        "gptj",
        "gptj",
        dict(
            vocab_size=VOCAB,
            n_layer=2,
            n_head=4,
            n_embd=64,
            n_positions=MAX_POS,
            rotary_dim=8,
            bos_token_id=0,
            eos_token_id=0,
        ),
        o_proj="out_proj",
        attn_path="transformer.h.{l}.attn",
        notes="partial rotary (rotary_dim 8 of 16), parallel block",
    ),
    Family(
        "gpt_neox",
        "gpt_neox",
        _common(use_parallel_residual=True, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25}),
        o_proj="dense",
        attn_path="gpt_neox.layers.{l}.attention",
        notes="partial rotary 0.25, parallel residual",
    ),
    Family(
        "opt",
        "opt",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            ffn_dim=128,
            num_attention_heads=4,
            max_position_embeddings=MAX_POS,
            word_embed_proj_dim=64,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=VOCAB - 1,
        ),
        o_proj="out_proj",
        attn_path="model.decoder.layers.{l}.self_attn",
    ),
    Family(
        "bloom",
        "bloom",
        dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0),
        o_proj="dense",
        attn_path="transformer.h.{l}.self_attention",
        notes="ALiBi, its own attention code (no attention interface)",
    ),
    Family(
        "falcon",
        "falcon",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            multi_query=True,
            new_decoder_architecture=False,
            parallel_attn=True,
            alibi=False,
            bias=False,
            max_position_embeddings=MAX_POS,
            bos_token_id=0,
            eos_token_id=0,
        ),
        o_proj="dense",
        attn_path="transformer.h.{l}.self_attention",
        notes="multi-query, rotary, parallel attention",
    ),
    Family("llama", "llama", _common(num_key_value_heads=2)),
    Family(
        "mistral",
        "mistral",
        _common(num_key_value_heads=2, head_dim=D_HEAD, sliding_window=WINDOW),
        windows=(WINDOW, WINDOW),
    ),
    Family(
        "mixtral",
        "mixtral",
        _common(
            num_key_value_heads=2, head_dim=D_HEAD, sliding_window=None, num_local_experts=4, num_experts_per_tok=2
        ),
        notes="MoE",
    ),
    Family("qwen2", "qwen2", _common(num_key_value_heads=2, use_sliding_window=False), notes="q/k/v bias"),
    Family(
        "qwen3", "qwen3", _common(num_key_value_heads=2, head_dim=D_HEAD, use_sliding_window=False), notes="qk-norm"
    ),
    Family(
        "qwen3_next",
        "qwen3_next",
        _common(
            num_key_value_heads=2,
            head_dim=D_HEAD,
            layer_types=["linear_attention", "full_attention"],
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        ),
        has_gate=True,
        attention_layers=(1,),
        notes="gated attention (sigmoid output gate per head); layer 0 is linear attention (Gated DeltaNet)",
    ),
    Family(
        "gemma2",
        "gemma2",
        _common(
            num_key_value_heads=2,
            head_dim=D_HEAD,
            query_pre_attn_scalar=D_HEAD,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
        windows=(WINDOW, None),
        softcap=50.0,
        init=0.5,
        notes="attention logit softcapping 50, alternating windows",
    ),
    Family(
        "gemma3",
        "gemma3_text",
        _common(
            num_hidden_layers=6,
            num_key_value_heads=2,
            head_dim=D_HEAD,
            query_pre_attn_scalar=D_HEAD,
            sliding_window=WINDOW,
            layer_types=list(_GEMMA3_LAYERS),
        ),
        windows=(WINDOW,) * 5 + (None,),
        attention_layers=tuple(range(6)),
        notes="5:1 local/global (6 layers), qk-norm",
    ),
    Family("phi3", "phi3", _common(num_key_value_heads=2, sliding_window=None), notes="fused qkv_proj"),
    Family("olmo2", "olmo2", _common(num_key_value_heads=2), notes="qk-norm over all heads"),
    Family(
        "gpt_oss",
        "gpt_oss",
        _common(
            num_key_value_heads=2,
            head_dim=D_HEAD,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        windows=(WINDOW, None),
        has_sinks=True,
        notes="learned sink logits, alternating band, MoE",
    ),
    Family(
        "gpt_oss_128",
        "gpt_oss",
        _common(
            num_key_value_heads=2,
            head_dim=D_HEAD,
            sliding_window=128,
            layer_types=["sliding_attention", "full_attention"],
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        windows=(128, None),
        has_sinks=True,
        notes="gpt_oss with its shipped 128-token band, longer than the probe: no mask reaches the stream engine",
    ),
    Family(
        "gemma2_wide",
        "gemma2",
        _common(
            num_key_value_heads=2,
            head_dim=D_HEAD,
            query_pre_attn_scalar=D_HEAD,
            sliding_window=4096,
            layer_types=["sliding_attention", "full_attention"],
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
        ),
        windows=(4096, None),
        softcap=50.0,
        init=0.5,
        notes="gemma2 with its shipped 4096 window, longer than the probe: only the softcap differs from plain attention",
    ),
    Family(
        "deepseek_v3",
        "deepseek_v3",
        _common(
            num_key_value_heads=N_HEADS,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            head_dim=8,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            n_shared_experts=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        ),
        notes="multi-head latent attention: q/k head dim 24 (16 nope + 8 rope), v head dim 16",
    ),
    Family(
        "bert",
        "bert",
        _common(pad_token_id=0, bos_token_id=None, eos_token_id=None, tie_word_embeddings=True),
        is_encoder=True,
        o_proj="output.dense",
        attn_path="bert.encoder.layer.{l}.attention",
    ),
    Family(
        "roberta",
        "roberta",
        _common(
            pad_token_id=0,
            bos_token_id=None,
            eos_token_id=None,
            tie_word_embeddings=True,
            max_position_embeddings=MAX_POS + 2,
        ),
        is_encoder=True,
        o_proj="output.dense",
        attn_path="roberta.encoder.layer.{l}.attention",
    ),
]
FAMILIES: dict[str, Family] = {f.name: f for f in _FAMS}


def build(family: str | Family, seed: int = 0) -> tuple[Any, Any]:
    """A tiny random Hugging Face model of ``family`` (eager attention, eval mode) and a word tokenizer.

    The same seed gives the same weights: build twice to have one copy for the reference and one to
    wrap in a bridge (the bridge replaces the model's submodules in place).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    fam = FAMILIES[family] if isinstance(family, str) else family
    cfg = AutoConfig.for_model(fam.model_type, initializer_range=fam.init, **fam.config)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    auto = AutoModelForMaskedLM if fam.is_encoder else AutoModelForCausalLM
    model = auto.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".sinks"):  # learned sink logits (zero at init): make them matter
                p.copy_(torch.randn_like(p))
            elif name.endswith(("q_norm.weight", "k_norm.weight")):  # qk-norm undoes a large init
                p.copy_(p * 4 if bool((p != 0).any()) else p + 3)  # gemma norms scale by (1 + weight)
    return model.eval(), word_tokenizer(bert=fam.is_encoder)  # in memory: from_hf_model copes


# --------------------------------------------------------------------------------------------
# references from Hugging Face alone


def _submodule(model: Any, path: str) -> Any:
    for part in path.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


@torch.no_grad()
def hf_patterns(hf_model: Any, tokens: Tensor) -> list[Tensor | None]:
    """``[layer][batch, head, q, k]`` attention weights from the model's eager attention.

    Layers without softmax attention (qwen3_next's linear-attention layers) get ``None``: Hugging
    Face returns weights only for its full-attention layers, mapped back to their layer index here.
    Learned sink logits take mass that is not in the returned weights (rows sum to less than 1).
    """
    out = hf_model(tokens, output_attentions=True)
    attns = [a for a in out.attentions if a is not None]
    layer_types = getattr(hf_model.config, "layer_types", None)
    n = hf_model.config.num_hidden_layers
    if len(attns) == n:
        return [a.float() for a in attns]
    full = [l for l in range(n) if layer_types is None or layer_types[l] != "linear_attention"]
    result: list[Tensor | None] = [None] * n
    for l, a in zip(full, attns):
        result[l] = a.float()
    return result


def reference_head_scores(
    patterns: list[Tensor | None], tokens: Tensor, body: tuple[int, int], special: set[int], causal: bool
) -> dict[str, Tensor]:
    """prev_token / duplicate / induction ``[layer, head]`` from patterns, by plain loops.

    A query counts when it has a target; its score is the attention mass on its targets; a head's
    score is the sum over sequences and queries of that mass over the number of such queries.
    """
    start, end = body
    B, T = tokens.shape
    L = len(patterns)
    H = next(p for p in patterns if p is not None).shape[1]
    ordinary = [[start <= i < end and int(tokens[b, i]) not in special for i in range(T)] for b in range(B)]
    targets: dict[str, list[tuple[int, int, list[int]]]] = {"prev_token": [], "duplicate": [], "induction": []}
    for b in range(B):
        for q in range(T):
            if start <= q < end and q >= 1:
                targets["prev_token"].append((b, q, [q - 1]))
            if not ordinary[b][q]:
                continue
            seen = [k for k in range(T) if k != q and (k < q or not causal)]
            dup = [k for k in seen if ordinary[b][k] and tokens[b, k] == tokens[b, q]]
            ind = [k + 1 for k in dup if k + 1 < T and ordinary[b][k + 1]]
            if dup:
                targets["duplicate"].append((b, q, dup))
            if ind:
                targets["induction"].append((b, q, ind))
    out = {}
    for name, rows in targets.items():
        grid = torch.full((L, H), float("nan"))
        for l, p in enumerate(patterns):
            if p is None:
                continue
            total = torch.zeros(H, dtype=torch.float64)
            for b, q, ks in rows:
                total += p[b, :, q, ks].double().sum(-1)
            grid[l] = (total / max(len(rows), 1)).float()
        out[name] = grid
    return out


def reference_sink_stats(patterns: list[Tensor | None], causal: bool) -> dict[str, Tensor]:
    """``first_mass`` (mean attention on position 0 over all queries), ``confidence`` (mean largest
    weight over queries that see two or more keys) and ``learned_sink_mass`` (1 - row sum: what a
    learned sink logit absorbs), each ``[layer, head]``."""
    L = len(patterns)
    H = next(p for p in patterns if p is not None).shape[1]
    out = {k: torch.full((L, H), float("nan")) for k in ("first_mass", "confidence", "learned_sink_mass")}
    for l, p in enumerate(patterns):
        if p is None:
            continue
        p = p.double()
        out["first_mass"][l] = p[..., 0].mean((0, 2)).float()
        rows = p[:, :, 1:] if causal else p
        out["confidence"][l] = rows.amax(-1).mean((0, 2)).float()
        out["learned_sink_mass"][l] = (1 - p.sum(-1)).mean((0, 2)).float()
    return out


def token_loss(logits: Tensor, tokens: Tensor, causal: bool = True) -> Tensor:
    """A metric of ``[batch]``: mean next-token cross-entropy (decoders) or the cross-entropy of each
    position's own token (encoders)."""
    logits = logits.float()
    if causal:
        logits, targets = logits[:, :-1], tokens[:, 1:]
    else:
        targets = tokens
    targets = targets.to(logits.device)
    return (logits.logsumexp(-1) - logits.gather(-1, targets[..., None]).squeeze(-1)).mean(-1)


@torch.no_grad()
def hf_head_ablation_delta(
    hf_model: Any,
    tokens: Tensor,
    layer: int,
    head: int,
    metric: Callable[[Tensor, Tensor], Tensor],
    *,
    family: str | Family | None = None,
) -> float:
    """``metric(ablated) - metric(clean)`` (means over sequences) when head ``head`` of ``layer`` is
    zeroed: its slice of the attention output projection's input is set to 0 by a pre-hook."""
    fam = _family_of(hf_model, family)
    proj = _submodule(_submodule(hf_model, fam.attn_path.format(l=layer)), fam.o_proj)
    width = _proj_in_features(proj)
    d = width // _n_heads(hf_model.config)

    def zero(module: Any, args: tuple) -> tuple:
        x = args[0].clone()
        x[..., head * d : (head + 1) * d] = 0
        return (x, *args[1:])

    clean = metric(hf_model(tokens).logits, tokens).mean()
    handle = proj.register_forward_pre_hook(zero)
    try:
        ablated = metric(hf_model(tokens).logits, tokens).mean()
    finally:
        handle.remove()
    return float(ablated - clean)


def _proj_in_features(proj: Any) -> int:
    if hasattr(proj, "in_features"):
        return int(proj.in_features)
    return int(proj.weight.shape[0])  # GPT-2's Conv1D: weight [in, out]


def _n_heads(config: Any) -> int:
    for name in ("num_attention_heads", "n_head"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError("no head count in the config")


def _family_of(hf_model: Any, family: str | Family | None) -> Family:
    if isinstance(family, Family):
        return family
    if isinstance(family, str):
        return FAMILIES[family]
    mt = hf_model.config.model_type
    return next(f for f in _FAMS if f.model_type == mt)


# --------------------------------------------------------------------------------------------
# what the attention-interface function receives


_RECORD: list[dict[str, Any]] = []


def _recorder(kind: str) -> Callable:
    def forward(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any):
        entry = {
            "module": type(module).__name__,
            "layer": getattr(module, "layer_idx", None),
            "mask": None if attention_mask is None else tuple(attention_mask.shape),
            "q": tuple(query.shape),
            "k": tuple(key.shape),
            "v": tuple(value.shape),
            "kwargs": {k: _short(v) for k, v in kwargs.items()},
            "is_causal_attr": getattr(module, "is_causal", None),
        }
        _RECORD.append(entry)
        if kind == "eager":
            fn = sys.modules[type(module).__module__].eager_attention_forward
            return fn(module, query, key, value, attention_mask, **kwargs)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        try:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        except Exception as e:
            entry["sdpa_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            fn = sys.modules[type(module).__module__].eager_attention_forward
            return fn(module, query, key, value, attention_mask, **kwargs)

    return forward


def _short(v: Any) -> Any:
    if isinstance(v, Tensor):
        return f"Tensor{tuple(v.shape)}"
    if isinstance(v, (int, float, str, bool, type(None))):
        return v
    return type(v).__name__


@contextlib.contextmanager
def _implementation(hf_model: Any, name: str) -> Iterator[None]:
    configs = {id(c): c for m in hf_model.modules() if hasattr(c := getattr(m, "config", None), "_attn_implementation")}
    configs[id(hf_model.config)] = hf_model.config
    saved = {k: c._attn_implementation for k, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = name
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = saved[k]


@torch.no_grad()
def attention_call_kwargs(hf_model: Any, tokens: Tensor, kind: str = "eager") -> list[dict[str, Any]]:
    """One entry per call of the attention-interface function in a forward of ``tokens``: its
    module, layer, mask shape (None: no mask passed), q/k/v shapes and keyword arguments.

    ``kind="eager"`` runs each family's own ``eager_attention_forward`` behind the recorder (with the
    eager mask); ``kind="sdpa"`` the SDPA function with the SDPA mask (which is None for an unpadded
    batch when no window applies), noting ``sdpa_error`` where SDPA refuses (then eager runs).
    An empty list: the family's attention never calls the interface (its own code).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    name = f"conformance_{kind}"
    AttentionInterface.register(name, _recorder(kind))
    AttentionMaskInterface.register(name, eager_mask if kind == "eager" else sdpa_mask)
    _RECORD.clear()
    with _implementation(hf_model, name):
        hf_model(tokens)
    return list(_RECORD)


# --------------------------------------------------------------------------------------------
# interp against the references


@dataclass
class Outcome:
    """One check: ``exact`` / ``mismatch`` (with the largest error), ``error`` (a raw exception from a
    library) or ``refused`` (an interp error before or during work)."""

    status: str
    error: float | None = None
    message: str = ""
    work: int = 0  # block calls before the outcome (a refusal must come before any)
    warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.status in ("exact", "mismatch"):
            return f"{self.status} ({self.error:.1e})"
        return f"{self.status}: {self.message}"


def outcome_of(fn: Callable[[], float]) -> Outcome:
    """Run a check that returns its largest error; classify what comes out."""
    from interp.errors import InterpError

    try:
        err = float(fn())
    except InterpError as e:
        return Outcome("refused", message=f"{type(e).__name__}: {_first_line(e)}")
    except Exception as e:
        return Outcome("error", message=f"{type(e).__name__}: {_first_line(e)}")
    if err != err:  # nan
        return Outcome("mismatch", float("nan"), "NaN")
    return Outcome("exact" if err <= TOL else "mismatch", err)


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else ""


def _max_err(a: Any, b: Any) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    both = ~(torch.isnan(a) & torch.isnan(b))
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    diff = (a - b).abs()[both]
    return float(diff.max()) if diff.numel() else 0.0


def hf_gradient_importance(
    hf_model: Any,
    tokens: Tensor,
    metric: Callable[[Tensor, Tensor], Tensor],
    *,
    family: str | Family | None = None,
) -> Tensor:
    """Michel et al.'s importance ``[layer, head]`` (NaN for layers without attention) from the
    Hugging Face model alone: a gate per (sequence, head) multiplies the head's slice of the output
    projection's input; importance = mean over sequences of ``|d metric(sequence) / d gate|``."""
    fam = _family_of(hf_model, family)
    n_heads = _n_heads(hf_model.config)
    B = tokens.shape[0]
    gates: dict[int, Tensor] = {}
    handles = []

    def gate_hook(layer: int, d: int) -> Callable:
        def pre(module: Any, args: tuple) -> tuple:
            x = args[0]
            g = gates[layer].repeat_interleave(d, dim=-1)[:, None, :].to(x.dtype)  # [batch, 1, H * d]
            return (x * g, *args[1:])

        return pre

    for l in fam.attention_layers:
        proj = _submodule(_submodule(hf_model, fam.attn_path.format(l=l)), fam.o_proj)
        gates[l] = torch.ones(B, n_heads, requires_grad=True)
        handles.append(proj.register_forward_pre_hook(gate_hook(l, _proj_in_features(proj) // n_heads)))
    params = [p for p in hf_model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        value = metric(hf_model(tokens).logits, tokens)
        layers = list(gates)
        grads = torch.autograd.grad(value.sum(), [gates[l] for l in layers])
    finally:
        for h in handles:
            h.remove()
        for p in params:
            p.requires_grad_(True)
    out = torch.full((fam.n_layers, n_heads), float("nan"))
    for l, g in zip(layers, grads):
        out[l] = g.abs().mean(0)
    return out


@dataclass
class FamilyReport:
    family: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)


CHECKS = (
    "patterns",
    "scores_pattern",
    "scores_stream",
    "sinks_pattern",
    "sinks_stream",
    "exact_sweep",
    "gradient",
)
STREAM_CHECKS = ("scores_stream", "sinks_stream")


@dataclass
class Setup:
    """One family built for checking: the reference copy, the bridge over the other copy, the probe,
    the references, and a counter of the bridge's block calls (work done)."""

    family: Family
    ref_model: Any
    model: Any
    probe: Any
    ref_patterns: list[Tensor | None]
    ref_scores: dict[str, Tensor]
    ref_sinks: dict[str, Tensor]
    block_calls: list[int]
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def causal(self) -> bool:
        return not self.family.is_encoder

    def metric(self, logits: Tensor, tokens: Tensor) -> Tensor:
        return token_loss(logits, tokens, self.causal)


def prepare(family: str, *, seed: int = 0, block_len: int = 20) -> Setup:
    """Build ``family`` twice, wrap one copy in a bridge (``from_hf_model`` with the in-memory word
    tokenizer), draw the probe and compute the references from the other copy."""
    from interp.models import describe, from_hf_model
    from interp.probes import repeated_tokens

    fam = FAMILIES[family]
    ref_model, _ = build(fam, seed)
    hf_copy, tokenizer = build(fam, seed)
    model = from_hf_model(hf_copy, tokenizer, name=family)
    info = describe(model)
    probe = repeated_tokens(model, batch=2, block_len=block_len, n_repeats=2, seed=seed)
    tokens = probe.tokens
    ref = hf_patterns(ref_model, tokens)
    causal = not fam.is_encoder
    body = (probe.body_start, probe.body_end)
    counter = [0]

    def count(module: Any, args: tuple, kwargs: dict) -> None:
        # work is a block run on the probe's sequences: the stream engine's pre-flight check (one
        # sequence's prefix, batch 1) is the check that lets it refuse before any work, not work
        hidden = args[0] if args else next(iter(kwargs.values()), None)
        if not isinstance(hidden, Tensor) or hidden.shape[0] == probe.batch:
            counter[0] += 1

    for block in model.blocks:
        block.register_forward_pre_hook(count, with_kwargs=True)
    return Setup(
        fam,
        ref_model,
        model,
        probe,
        ref,
        reference_head_scores(ref, tokens, body, set(probe.special_token_ids), causal),
        reference_sink_stats(ref, causal),
        counter,
        {
            "seq_len": probe.seq_len,
            "bridge_causal": info.is_causal,
            "attention_layers": info.attention_layers,
            "mean_max_weight": float(torch.stack([p.amax(-1).mean() for p in ref if p is not None]).mean()),
        },
    )


def _largest_error(setup: Setup, check: str) -> float:
    """Run one check of interp against the references; its largest absolute error."""
    from interp.ablation import as_metric, exact_sweep, gradient_importance
    from interp.heads import head_scores
    from interp.hooks import pattern_hook
    from interp.sinks import sink_scores

    model, probe, layers = setup.model, setup.probe, list(setup.family.attention_layers)
    tokens = probe.tokens
    if check == "patterns":
        got: dict[int, Tensor] = {}

        def grab(p: Tensor, hook: Any) -> None:
            got[int(hook.name.split(".")[1])] = p.detach().float()

        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=[(pattern_hook(l), grab) for l in layers])
        return max(_max_err(got[l], setup.ref_patterns[l]) for l in layers)
    if check.startswith("scores_"):
        hs = head_scores(model, probe, config=RunConfig(engine=check[7:], n_boot=10), copying=False)
        return max(_max_err(hs.grid(k)[layers], setup.ref_scores[k][layers]) for k in ("prev_token", "induction"))
    if check.startswith("sinks_"):
        sr = sink_scores(model, probe, config=RunConfig(engine=check[6:], n_boot=10))
        return max(_max_err(sr.grid(k)[layers], setup.ref_sinks[k][layers]) for k in ("first_mass", "confidence"))
    metric = as_metric(setup.metric, name="token_loss", higher_is_better=False)
    if check == "exact_sweep":
        got_sweep = torch.as_tensor(exact_sweep(model, probe, metric, ablation="zero").grid("delta"))
        want = torch.full_like(got_sweep, float("nan"))
        for l in layers:
            for h in range(N_HEADS):
                want[l, h] = hf_head_ablation_delta(setup.ref_model, tokens, l, h, setup.metric, family=setup.family)
        return _max_err(got_sweep, want)
    if check == "gradient":
        got_grad = torch.as_tensor(gradient_importance(model, probe, metric).grid("importance"))
        want = hf_gradient_importance(setup.ref_model, tokens, setup.metric, family=setup.family)
        return _max_err(got_grad, want)
    raise ValueError(f"unknown check {check!r}")


def run_check(setup: Setup, check: str) -> Outcome:
    """One check as an :class:`Outcome`; ``outcome.work`` is how many block calls ran before it
    ended (a refusal must come before any), ``outcome.warnings`` what interp warned."""
    setup.block_calls[0] = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = outcome_of(lambda: _largest_error(setup, check))
    outcome.work = setup.block_calls[0]
    outcome.warnings = sorted({_first_line(w.message) for w in caught if "interp" in str(w.filename)})
    return outcome


def check_family(family: str, *, seed: int = 0, checks: tuple[str, ...] = CHECKS, block_len: int = 20) -> FamilyReport:
    """Every check of ``checks`` on ``family`` (see :func:`prepare` and :func:`run_check`)."""
    rep = FamilyReport(family)
    try:
        setup = prepare(family, seed=seed, block_len=block_len)
    except Exception as e:
        o = Outcome("error", message=f"{type(e).__name__}: {_first_line(e)}")
        rep.outcomes = {c: o for c in checks}
        return rep
    rep.facts = dict(setup.facts)
    for c in checks:
        rep.outcomes[c] = run_check(setup, c)
        if rep.outcomes[c].warnings:
            rep.facts[f"warnings_{c}"] = rep.outcomes[c].warnings
    return rep


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.conformance [family ...]``: print the table."""
    names = (argv if argv is not None else sys.argv[1:]) or list(FAMILIES)
    torch.set_num_threads(1)
    print("| family | " + " | ".join(CHECKS) + " |")
    print("|" + "---|" * (len(CHECKS) + 1))
    for n in names:
        r = check_family(n)
        print(f"| {n} | " + " | ".join(str(r.outcomes.get(c, "")) for c in CHECKS) + " |", flush=True)
        print(f"  facts {n}: {r.facts}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
