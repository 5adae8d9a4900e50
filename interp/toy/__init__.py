"""A toy transformer with known induction heads, built from attention written from scratch.

    from interp.toy import load_toy
    model = load_toy()                     # the bundled 2-layer attention-only checkpoint
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))

`interp.toy.attention` (MHA/GQA/MQA/MLA, reference and flash paths), `interp.toy.flash` (blockwise
online softmax and the Triton kernel), `interp.toy.model` (the decoder), `interp.toy.train`
(`python -m interp.toy.train` regrows the checkpoint). Triton is optional.
"""

from __future__ import annotations

from pathlib import Path

import torch

from interp._io import bundled
from interp.toy.model import ToyConfig, ToyTransformer

__all__ = ["ToyConfig", "ToyTransformer", "load_toy", "toy_dir"]


def toy_dir() -> Path:
    """Where the bundled toy lives: $INTERP_DATA_DIR/toy, else the installed ``interp.data/toy``
    (``data/toy`` in a source checkout)."""
    return bundled("toy")


def load_toy(device: str | None = None, dtype: torch.dtype | None = None) -> ToyTransformer:
    """Load the bundled, trained toy (eval mode). Its card is `toy_dir() / "card.json"`."""
    directory = toy_dir()
    if not (directory / "model.safetensors").is_file() or not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"no toy checkpoint in {directory} (model.safetensors + config.json): "
            "run `python -m interp.toy.train` to train one, or set INTERP_DATA_DIR to a data dir holding toy/"
        )
    return ToyTransformer.from_pretrained(directory, device=device, dtype=dtype)
