"""What the parts read of a model's shape: the framing of a probe, the room its context holds."""

from __future__ import annotations

from interp.adapters import HookedModel, ModelInfo
from interp.probes.draw import frame_tokens

BLOCK_LENS = (50, 20)
"""The head-score probe's block when none is asked (``seq_len=None``): the first of these whose
repeats fit the context (50 on GPT-2 and Pythia; 20 on the 96-token toy of ``toy-training``), else
the longest that fits."""


def frame(info: ModelInfo) -> int:
    """Tokens a probe's framing takes (BOS, or [CLS] ... [SEP])."""
    return sum(len(f) for f in frame_tokens(info)[:2])


def body_room(info: ModelInfo) -> int:
    """The tokens of a probe's body that a model's context holds: its context less the framing."""
    return info.n_ctx - frame(info)


def default_block_len(room: int, repeats: int) -> int:
    """The probe's block length for a context of ``room`` body tokens (the context less the framing)
    holding ``repeats`` copies: the rule of :data:`BLOCK_LENS`, the library's and the command line's."""
    fits = room // repeats
    return next((n for n in BLOCK_LENS if n <= fits), fits)


def info_of(model: HookedModel) -> ModelInfo:
    from interp.models import describe

    return describe(model)


def n_heads(info: ModelInfo) -> int:
    return info.n_heads * len(info.attention_layers)


__all__ = ["BLOCK_LENS", "body_room", "default_block_len", "frame", "info_of", "n_heads"]
