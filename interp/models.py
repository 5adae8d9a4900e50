"""Load a hooked model, and describe any hooked model in the few facts the analyses need.

Three kinds of model spec are accepted by :func:`load_model`:

- ``"toy"``: the bundled toy transformer (``data/toy``), offline, a few hundred KB;
- a local directory holding a Hugging Face model (``config.json`` + weights) and its tokenizer;
- a Hugging Face Hub name (``gpt2``, ``EleutherAI/pythia-70m``, ``bert-base-uncased``, ...), booted
  through TransformerLens 4's ``TransformerBridge.boot_transformers``.

Every analysis talks to the result only through the TransformerLens hook API (``run_with_hooks``,
hook names such as ``blocks.{l}.attn.hook_pattern``) and through :func:`describe`, so the toy,
GPT-2 and BERT go through the same code.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from interp.errors import ModelLoadError, NonFiniteAttentionError, UsageError
from interp.hooks import pattern_hook, run_with_reducers

TOY = "toy"
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
_WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


# --------------------------------------------------------------------------------------------
# devices and dtypes


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/``"auto"`` picks CUDA when present; anything else must be a device this machine has."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"unknown device {device!r}: use cpu, cuda, cuda:N, mps or auto") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {device!r} asked for, but this machine has no CUDA device: use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {device!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"device {device!r} asked for, but MPS is not available here: use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"unknown device {device!r}: use cpu, cuda, cuda:N, mps or auto")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {dtype!r}: use one of float32, float16, bfloat16") from None


# --------------------------------------------------------------------------------------------
# loading


def load_model(
    spec: str | os.PathLike = TOY,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict[str, str | int] | None = None,
    n_devices: int | None = None,
) -> Any:
    """Load a hooked model by spec (``"toy"``, a local HF directory, or a Hub name).

    Returns a TransformerLens ``TransformerBridge`` (or the toy's ``HookedRootModule``) in eval mode
    on ``device``. Raises :class:`ModelLoadError` with a one-paragraph explanation when the model
    cannot be had, and ``ValueError`` for a bad device or dtype.

    A model too large for one device is spread over several, by TransformerLens 4 and accelerate:
    ``n_devices=4`` splits its blocks evenly over ``cuda:0..3``; ``device_map`` is any Hugging Face
    device map (``"auto"``, ``"balanced"``, or ``{"transformer.h.0": "cuda:0", ...}`` by module name).
    Both exclude ``device``, and neither applies to the toy.
    """
    dt = resolve_dtype(dtype)
    spread = device_map is not None or (n_devices is not None and n_devices != 1)
    placement: dict[str, Any] = {"device_map": device_map, "n_devices": n_devices} if spread else {}
    if spread:
        if device not in (None, "auto"):
            raise UsageError("device and device_map/n_devices are exclusive: a spread model has no one device")
        if n_devices is not None and n_devices < 1:
            raise UsageError(f"n_devices must be >= 1, got {n_devices}")
        if n_devices is not None and n_devices > 1 and n_devices > torch.cuda.device_count():
            raise UsageError(
                f"n_devices={n_devices} asked for, but this machine has {torch.cuda.device_count()} CUDA "
                "device(s): pass fewer, or an explicit device_map"
            )
    dev = resolve_device(device)
    spec_str = os.fspath(spec)
    if spec_str == TOY:
        if spread:
            raise UsageError("the toy model runs on one device: pass device=..., not device_map/n_devices")
        return _load_toy(dev, dt)
    path = Path(spec_str).expanduser()
    if path.exists() or _looks_like_path(spec_str):
        return _load_local_dir(path, dev, dt, placement)
    return _load_hub(spec_str, dev, dt, placement)


def _looks_like_path(spec: str) -> bool:
    """A spec that cannot be a Hub name (``./x``, ``/x``, ``~/x``, ``a/b/c``) is meant as a folder."""
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1


def _load_toy(dev: torch.device, dt: torch.dtype) -> Any:
    from interp.toy import load_toy

    try:
        return load_toy(device=dev, dtype=dt)
    except FileNotFoundError as e:
        raise ModelLoadError(str(e)) from None


def _load_local_dir(path: Path, dev: torch.device, dt: torch.dtype, placement: dict[str, Any]) -> Any:
    if not path.exists():
        raise ModelLoadError(f"no such directory: {path}. Pass an existing folder, a Hub name, or 'toy'.")
    if not path.is_dir():
        raise ModelLoadError(f"{path} is a file, not a model directory: pass the folder that holds config.json.")
    if not (path / "config.json").exists():
        raise ModelLoadError(
            f"{path} has no config.json: it is not a Hugging Face model directory "
            "(save one with model.save_pretrained(dir) and tokenizer.save_pretrained(dir))."
        )
    if not any((path / f).exists() for f in _WEIGHT_FILES):
        raise ModelLoadError(
            f"{path} has a config.json but no weights ({', '.join(_WEIGHT_FILES[:2])}): "
            "save the model with model.save_pretrained(dir), or pass a Hub name."
        )
    _check_safetensors(path)
    try:
        return _boot(str(path), dev, dt, placement, what=f"the local directory {path}")
    except ModelLoadError as e:
        if "mismatch" not in str(e).lower():
            raise
        files = ", ".join(str(path / f) for f in _WEIGHT_FILES if (path / f).exists())
        raise ModelLoadError(
            f"the weights in {files} do not match {path / 'config.json'}: a tensor's shape differs from the "
            "one the config asks for; save the model again with model.save_pretrained(dir), or fix the config"
        ) from None


def _check_safetensors(path: Path) -> None:
    """A truncated or corrupt ``.safetensors`` file, named, before the loader says something vaguer.

    Reads only each file's header (8 bytes of length, then JSON): the tensors' byte ranges must end
    where the file ends.
    """
    import json
    import struct

    for file in sorted(path.glob("*.safetensors")):
        size = file.stat().st_size
        why = None
        try:
            with open(file, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8)) if size >= 8 else (None,)
                header = json.loads(f.read(n)) if n is not None and 8 + n <= size else None
            if header is None:
                why = f"its {size} bytes do not hold the header it announces"
            else:
                end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
                if 8 + n + end != size:
                    why = f"its tensors need {8 + n + end} bytes, the file has {size}"
        except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error) as e:
            why = f"its header cannot be read ({type(e).__name__})"
        if why:
            raise ModelLoadError(
                f"{file} is truncated or corrupt: {why}. Copy or download it again "
                "(or save the model again with model.save_pretrained(dir))."
            )


def _load_hub(name: str, dev: torch.device, dt: torch.dtype, placement: dict[str, Any]) -> Any:
    if not _HUB_NAME.match(name):
        raise ModelLoadError(
            f"{name!r} is neither an existing directory nor a valid Hugging Face model name "
            "(names look like 'gpt2' or 'EleutherAI/pythia-70m')."
        )
    cached = _in_hf_cache(name)
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    if not cached and (offline or not hub_reachable()):
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub cannot be reached"
        raise ModelLoadError(
            f"model {name!r} is not in the local Hugging Face cache and {why}. "
            "Download it once with network access (e.g. run this command online), or set "
            "HF_HUB_OFFLINE=1 with a cache that holds it, or pass a local directory "
            "holding the model and its tokenizer. Check the spelling too."
        )
    if cached and not offline:
        # Everything is local: do not let the loader spend a minute retrying the network.
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            return _boot(name, dev, dt, placement, what=f"the cached model {name!r}")
        finally:
            os.environ.pop("HF_HUB_OFFLINE", None)
    return _boot(name, dev, dt, placement, what=f"the Hub model {name!r}")


def _in_hf_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(name, "config.json")
    except Exception:
        return False
    return isinstance(hit, str)


def hub_reachable(timeout: float = 3.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = re.sub(r"^https?://", "", endpoint).split("/")[0].split(":")[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _boot(name: str, dev: torch.device, dt: torch.dtype, placement: dict[str, Any], *, what: str) -> Any:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars are the ones that matter
    try:
        where = placement or {"device": str(dev)}
        model = TransformerBridge.boot_transformers(name, dtype=dt, **where)
    except Exception as e:  # the loaders raise OSError, ValueError, KeyError, HTTP errors, ...
        kind = type(e).__name__
        msg = str(e).strip().splitlines()[0] if str(e).strip() else kind
        hint = ""
        if "RepositoryNotFound" in kind or "404" in msg:
            hint = " No such model on the Hub: check the spelling."
        elif "not supported" in msg.lower() or "architecture" in msg.lower():
            hint = " TransformerLens 4 does not support this architecture."
        raise ModelLoadError(f"could not load {what}: {kind}: {msg}.{hint}") from None
    model.eval()
    return model


def from_hf_model(hf_model: Any, tokenizer: Any = None, *, name: str = "external") -> Any:
    """Wrap an in-memory Hugging Face model (e.g. built from a config in a test) in a bridge.

    The model is switched to eager attention first: the fused SDPA kernels never form the pattern,
    so ``hook_pattern`` would not fire.
    """
    from transformer_lens.model_bridge.sources import build_bridge_from_module

    config = hf_model.config
    config._attn_implementation = "eager"
    if hasattr(hf_model, "set_attn_implementation"):
        try:
            hf_model.set_attn_implementation("eager")
        except Exception:
            pass
    architecture = (getattr(config, "architectures", None) or [type(hf_model).__name__])[0]
    bridge = build_bridge_from_module(
        hf_model.eval(), architecture, hf_config=config, tokenizer=tokenizer, model_name=name
    )
    bridge.eval()
    return bridge


# --------------------------------------------------------------------------------------------
# describing a model


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


def describe(model: Any) -> ModelInfo:
    """Read a model's shape, special tokens and causality (observed once, then remembered).

    The device is read afresh on every call, so the answer follows ``model.to(device)``.
    """
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
        is_causal=_observe_causal(model, d_vocab, special),
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


def _observe_causal(model: Any, d_vocab: int, special: set[int]) -> bool:
    """Run four tokens to layer 0's pattern and look: a causal model never attends forward.

    Architecture names lie less often than configs but are open-ended; the pattern cannot lie.
    """
    explicit = getattr(model.cfg, "causal", None)
    if isinstance(explicit, bool):
        return explicit
    ordinary = [t for t in range(min(d_vocab, 64)) if t not in special][:4]
    tokens = torch.tensor([ordinary], device=_model_device(model))
    seen: dict[str, torch.Tensor] = {}

    def grab(pattern: torch.Tensor, hook: Any) -> None:
        seen["pattern"] = pattern.detach()

    run_with_reducers(model, tokens, [(pattern_hook(0), grab)], stop_after=pattern_hook(0))
    if "pattern" not in seen:
        raise ModelLoadError(
            "the model never produced blocks.0.attn.hook_pattern: its attention runs in a fused "
            "kernel. Load it with attn_implementation='eager' (interp.models.from_hf_model does)."
        )
    if not torch.isfinite(seen["pattern"]).all():  # else NaN would read as "attends forward": an encoder
        raise NonFiniteAttentionError(
            "layer 0: the attention pattern holds NaN or inf on 4 ordinary tokens; the model's weights "
            "or its dtype make it unstable: check the weights, or try --dtype float32"
        )
    upper = torch.triu(seen["pattern"][0].float(), diagonal=1)
    return bool(upper.abs().max() < 1e-6)
