"""A tiny decoder built from `interp.toy.attention`, with TransformerLens hook names throughout.

Why `HookedRootModule`: it is the hook API that TransformerLens models and the TransformerBridge
both expose (`run_with_hooks`, `hooks(...)`, `run_with_cache`, `hook_dict`), so an analysis written
for GPT-2 on the bridge runs on this toy unchanged -- no branches on the model type. Every
activation an analysis may read or edit passes through a `HookPoint` named as in TransformerLens:

    hook_embed, hook_pos_embed
    blocks.{l}.hook_resid_pre
    blocks.{l}.ln1.hook_scale / hook_normalized               (normalization_type == "LN")
    blocks.{l}.attn.hook_q / hook_k / hook_v                   [batch, pos, head_index, d_head]
    blocks.{l}.attn.hook_attn_scores / hook_pattern            [batch, head_index, q_pos, k_pos]
    blocks.{l}.attn.hook_z                                     [batch, pos, head_index, d_head]
    blocks.{l}.attn.hook_result                                [batch, pos, head_index, d_model]
    blocks.{l}.hook_attn_out, blocks.{l}.hook_resid_mid
    blocks.{l}.ln2.*, blocks.{l}.mlp.hook_pre / hook_post, blocks.{l}.hook_mlp_out   (with MLPs)
    blocks.{l}.hook_resid_post
    ln_final.hook_scale / hook_normalized

Returning a new tensor from a hook changes the computation (zeroing `hook_z` of a head silences
it). The pattern is only materialised when a hook asks for it; otherwise attention runs on the
flash path. Weights are saved as safetensors beside a JSON config.

Vocabulary convention: token 0 is BOS, ordinary tokens are 1 .. d_vocab - 1.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import repeat
from jaxtyping import Float, Int
from safetensors.torch import load_file, save
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from interp._io import atomic_write
from interp.toy.attention import Attention, LatentAttention


@dataclass
class ToyConfig:
    """Model shape, with TransformerLens's field names so code reading a bridge cfg reads this."""

    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    d_head: int | None = None  # default d_model // n_heads
    n_ctx: int = 256
    d_vocab: int = 512
    n_key_value_heads: int | None = None  # None: MHA; 1: MQA; in between: GQA
    d_kv_latent: int | None = None  # set: multi-head latent attention instead
    d_mlp: int | None = None  # None with attn_only
    attn_only: bool = True
    causal: bool = True
    normalization_type: str | None = "LN"  # "LN" or None
    positional_embedding_type: str = "standard"  # learned absolute positions
    act_fn: str = "gelu"  # "gelu", "gelu_new" (GPT-2's tanh approximation) or "relu"
    eps: float = 1e-5
    init_range: float | None = None  # std of the weight init; None: 0.8 / sqrt(d_model), as TransformerLens
    pos_init: str = "sinusoidal"  # start of the learned positions: "sinusoidal" or "normal"
    use_flash: bool = True  # flash path whenever nobody hooks the scores or the pattern
    flash_impl: str = "auto"  # "auto" (Triton on CUDA, else blockwise), "triton", "blockwise", "sdpa"
    bos_token_id: int = 0
    tokenizer_prepends_bos: bool = True
    default_prepend_bos: bool = True
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    model_name: str = "toy"
    original_architecture: str = "ToyTransformer"

    def __post_init__(self):
        if self.d_head is None:
            self.d_head = self.d_model // self.n_heads
        if self.init_range is None:
            self.init_range = 0.8 / self.d_model**0.5
        if self.attn_only:
            self.d_mlp = None
        elif self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        if self.normalization_type not in ("LN", None):
            raise ValueError(f"normalization_type must be 'LN' or None, got {self.normalization_type!r}")
        if self.positional_embedding_type != "standard":
            raise ValueError("the toy has learned ('standard') positional embeddings only")
        if isinstance(self.dtype, str):
            self.dtype = getattr(torch, self.dtype.removeprefix("torch."))

    @property
    def attention_dir(self) -> str:
        """TransformerLens spells causal-or-not this way."""
        return "causal" if self.causal else "bidirectional"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dtype"] = str(self.dtype).removeprefix("torch.")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ToyConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


# ---------------------------------------------------------------------------------------------
# components
# ---------------------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.eps = cfg.eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = x - x.mean(dim=-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(dim=-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)


class MLP(nn.Module):
    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.act = {"gelu": F.gelu, "gelu_new": partial(F.gelu, approximate="tanh"), "relu": F.relu}[cfg.act_fn]
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        post = self.hook_post(self.act(self.hook_pre(x @ self.W_in + self.b_in)))
        return post @ self.W_out + self.b_out


def _norm(cfg: ToyConfig) -> nn.Module:
    return LayerNorm(cfg) if cfg.normalization_type == "LN" else nn.Identity()


class TransformerBlock(nn.Module):
    """Pre-norm block: resid_mid = resid_pre + attn(ln1(resid_pre)); resid_post = resid_mid + mlp(ln2(.))."""

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.ln1 = _norm(cfg)
        if cfg.d_kv_latent is not None:
            self.attn = LatentAttention(
                cfg.d_model, cfg.n_heads, cfg.d_kv_latent, cfg.d_head, None, cfg.causal, cfg.use_flash, cfg.flash_impl
            )
        else:
            self.attn = Attention(
                cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head, cfg.causal, cfg.use_flash, cfg.flash_impl
            )
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        if not cfg.attn_only:
            self.ln2 = _norm(cfg)
            self.mlp = MLP(cfg)
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        resid = self.hook_resid_mid(resid + self.hook_attn_out(self.attn(self.ln1(resid))))
        if hasattr(self, "mlp"):
            resid = resid + self.hook_mlp_out(self.mlp(self.ln2(resid)))
        return self.hook_resid_post(resid)


# ---------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------


class ToyTransformer(HookedRootModule):
    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg = cfg
        self.tokenizer = None
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = _norm(cfg)
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab)
        self._init_weights()
        self.to(device=cfg.device, dtype=cfg.dtype)
        self.setup()  # names every HookPoint and fills hook_dict, as in TransformerLens

    def _init_weights(self):
        for name, p in self.named_parameters():
            if p.ndim >= 2:
                nn.init.normal_(p, std=self.cfg.init_range)
            elif not name.endswith(".w"):  # LayerNorm gains stay at one, every bias starts at zero
                nn.init.zeros_(p)
        if self.cfg.pos_init == "sinusoidal":  # still learned; a start where "one back" is one rotation
            with torch.no_grad():
                self.pos_embed.weight.copy_(sinusoids(self.cfg.n_ctx, self.cfg.d_model) * self.cfg.init_range)

    def forward(
        self,
        input: Int[Tensor, "batch pos"] | Float[Tensor, "batch pos d_model"],
        return_type: str | None = "logits",
        loss_per_token: bool = False,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        tokens: Int[Tensor, "batch pos"] | None = None,
    ):
        """Run the model, TransformerLens style.

        input: tokens, or with `start_at_layer=k` the residual stream entering block k (pass
        `tokens=` too for a loss). `stop_at_layer=k` returns the residual stream entering block k.
        return_type: "logits" [batch, pos, d_vocab], "loss" (next-token cross-entropy, mean, or
        [batch, pos - 1] with loss_per_token), "both" (logits, loss), or None.
        """
        if start_at_layer is None:
            tokens = input
            if tokens.shape[1] > self.cfg.n_ctx:
                raise ValueError(f"sequence of {tokens.shape[1]} tokens exceeds n_ctx={self.cfg.n_ctx}")
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            pos_embed = repeat(self.pos_embed(positions), "p d -> b p d", b=tokens.shape[0])
            resid = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(pos_embed)
        else:
            resid = input
        for block in self.blocks[start_at_layer:stop_at_layer]:
            resid = block(resid)
        if stop_at_layer is not None:
            return resid

        logits = self.unembed(self.ln_final(resid))
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if tokens is None:
            raise ValueError("a loss needs the tokens: pass tokens= with start_at_layer")
        loss = lm_cross_entropy(logits, tokens, per_token=loss_per_token)
        if return_type == "loss":
            return loss
        if return_type == "both":
            return logits, loss
        raise ValueError(f"unknown return_type {return_type!r}")

    def set_flash_impl(self, impl: str) -> ToyTransformer:
        """Choose the flash path's implementation ("auto", "triton", "blockwise", "sdpa")."""
        self.cfg.flash_impl = impl
        for block in self.blocks:
            block.attn.flash_impl = impl
        return self

    # -- weights in TransformerLens shapes, stacked over layers ----------------------------------

    def _stack(self, name: str) -> Tensor:
        return torch.stack([getattr(block.attn, name) for block in self.blocks])

    @property
    def W_Q(self) -> Float[Tensor, "layer head d_model d_head"]:
        return self._stack("W_Q")

    @property
    def W_K(self) -> Float[Tensor, "layer head d_model d_head"]:
        """Per query head: with GQA, the heads of a group show their shared key weights."""
        return self._stack("W_K")

    @property
    def W_V(self) -> Float[Tensor, "layer head d_model d_head"]:
        return self._stack("W_V")

    @property
    def W_O(self) -> Float[Tensor, "layer head d_head d_model"]:
        return self._stack("W_O")

    def _zeros(self, *shape: int) -> Tensor:
        return torch.zeros(*shape, device=self.embed.weight.device, dtype=self.embed.weight.dtype)

    @property
    def b_Q(self) -> Float[Tensor, "layer head d_head"]:
        return self._zeros(self.cfg.n_layers, self.cfg.n_heads, self.cfg.d_head)  # no attention biases

    b_K = b_Q
    b_V = b_Q

    @property
    def b_O(self) -> Float[Tensor, "layer d_model"]:
        return self._zeros(self.cfg.n_layers, self.cfg.d_model)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.weight

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.pos_embed.weight

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.unembed.weight.T

    @property
    def b_U(self) -> Float[Tensor, " d_vocab"]:
        return self.unembed.bias

    # -- saving and loading ------------------------------------------------------------------------

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write model.safetensors and config.json (each atomically) into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        atomic_write(directory / "model.safetensors", save(state))
        atomic_write(directory / "config.json", json.dumps(self.cfg.to_dict(), indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike, device: str | None = None, dtype: torch.dtype | None = None
    ) -> ToyTransformer:
        """Load what `save_pretrained` wrote, in eval mode."""
        directory = Path(directory)
        cfg = ToyConfig.from_dict(json.loads((directory / "config.json").read_text()))
        if device is not None:
            cfg.device = str(device)
        if dtype is not None:
            cfg.dtype = dtype
        model = cls(cfg)
        model.load_state_dict(load_file(str(directory / "model.safetensors")))
        model.to(device=cfg.device, dtype=cfg.dtype)
        return model.eval()


def sinusoids(n_ctx: int, d_model: int) -> Float[Tensor, "n_ctx d_model"]:
    """Transformer sinusoids, interleaved sin/cos per frequency, entries of mean square one."""
    position = torch.arange(n_ctx, dtype=torch.float64)[:, None]
    frequency = 10_000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angle = position * frequency
    table = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)[:, :d_model]
    return (table * 2**0.5).float()


def lm_cross_entropy(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False
) -> Float[Tensor, ""] | Float[Tensor, "batch pos_minus_1"]:
    """Next-token cross-entropy: position i predicts token i + 1."""
    log_probs = logits[:, :-1].float().log_softmax(dim=-1)
    loss = -log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return loss if per_token else loss.mean()
