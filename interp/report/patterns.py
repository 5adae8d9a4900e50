"""Attention patterns of every head on one short sequence, and the tokens' labels, for the viewers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters import HookedModel, run_with_reducers
from interp.hooks import layer_of, pattern_hook
from interp.models import describe


def attention_patterns(model: HookedModel, tokens: Int[Tensor, " pos"]) -> Float[Tensor, "layer head q k"]:
    """Every head's attention pattern on one sequence; only ``hook_pattern`` is captured and the
    pass stops after the last layer's pattern."""
    info = describe(model)
    if tokens.ndim != 1:
        raise ValueError(f"expected one sequence of token ids, got shape {tuple(tokens.shape)}")
    n = tokens.shape[0]
    out = torch.zeros(info.n_layers, info.n_heads, n, n)

    def grab(pattern: Float[Tensor, "batch head q k"], hook: Any) -> None:
        out[layer_of(hook)] = pattern[0].detach().float().cpu()

    last = pattern_hook(info.n_layers - 1)
    run_with_reducers(
        model,
        tokens[None].to(info.device),
        [(pattern_hook(l), grab) for l in range(info.n_layers)],
        stop_after=last,
    )
    return out


@cache
def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2, Llama 3): the printable Latin-1 bytes stand for themselves;
    every other byte, in order, is drawn as the character 256, 257, ..."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    table = {chr(b): b for b in shown}
    others = sorted(set(range(256)) - set(shown))
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


def token_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    """The bytes a token stands for, read from its piece: a byte-level BPE piece (``"\u0120cat"``) or a
    SentencePiece byte (``"<0xE2>"``); ``None`` for any other piece."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if not isinstance(piece, str) or not piece:
        return None
    byte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if byte:
        return bytes([int(byte.group(1), 16)])
    table = _byte_alphabet()
    return bytes(table[c] for c in piece) if all(c in table for c in piece) else None


def token_labels(model: HookedModel, ids: Sequence[int], probe: Any = None) -> list[str]:
    """A readable label per position: the token's text; a token holding part of one character (a
    byte of a curly quote or an emoji), which decodes to U+FFFD, shows its bytes instead
    (``"\\xe2\\x80"``, text before them kept). Without a tokenizer: :func:`interp.sinks.token_texts`."""
    from interp.sinks import token_texts

    ids = [int(i) for i in ids]
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        names = token_texts(model, probe, sorted(set(ids))) if probe is not None else {i: f"<{i}>" for i in ids}
        return [names[i] for i in ids]
    out = []
    for i in ids:
        text = tokenizer.decode([i])
        raw = token_bytes(tokenizer, i) if "\ufffd" in text else None
        out.append(raw.decode("utf-8", errors="backslashreplace") if raw is not None else text)
    return out
