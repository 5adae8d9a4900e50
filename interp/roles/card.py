"""One head's card: what the atlas would show when a head is clicked, as plain data.

:func:`head_card` gathers, for head ``layer.head``: its scores with their CIs and roles (a row of a
role table), the tokens its OV circuit writes most and suppresses most, its strongest compositions
into it and out of it, and a thumbnail of its attention pattern on one probe sequence. Each part is
optional: a card holds what it was given.

**Writes and suppresses.** The head's average write over the vocabulary: the mean over ordinary
tokens of their effective OV rows, ``mean(W_EE) W_V W_O W_U`` (the same effective embedding as
:mod:`interp.roles.ov`); its largest entries are the tokens it writes most whatever it attends to,
its smallest those it suppresses most. Centered over the vocabulary (a constant shift of every
logit changes nothing).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.adapters import HookedModel, describe, run_with_reducers
from interp.adapters.weights import read_head_weights
from interp.errors import UsageError
from interp.hooks import pattern_hook
from interp.probes import TokenProbe, ordinary_vocab
from interp.roles.composition import Compositions
from interp.roles.ov import effective_embedding
from interp.texts import token_label


def mean_write(model: HookedModel, layer: int, head: int) -> Float[Tensor, " d_vocab"]:
    """The head's average write to each logit, ``mean(W_EE) W_V W_O W_U``, centered over the vocabulary."""
    _check_head(describe(model), layer, head)
    return next(mean_writes(model, [layer]))[1][head]


def mean_writes(
    model: HookedModel, layers: Sequence[int] | None = None
) -> Iterator[tuple[int, Float[Tensor, "head d_vocab"]]]:
    """:func:`mean_write` of every head, a layer at a time (``(layer, [head, d_vocab])``; default:
    every attention layer): the effective embedding is computed once for them all."""
    info = describe(model)
    w = read_head_weights(model, info, "the head card's OV tokens")
    embedding, _ = effective_embedding(model, w)
    x = embedding[ordinary_vocab(info)].mean(0)
    for layer in info.attention_layers if layers is None else layers:
        logits = torch.einsum("d,hde,hem,mv->hv", x, w.W_V[layer], w.W_O[layer], w.W_U)
        yield layer, (logits - logits.mean(-1, keepdim=True)).cpu()


def _check_head(info: Any, layer: int, head: int) -> None:
    if not (0 <= layer < info.n_layers and 0 <= head < info.n_heads):
        raise UsageError(
            f"no head {layer}.{head} in {info.name}: heads are LAYER.HEAD with layer < {info.n_layers}, head < {info.n_heads}"
        )


def _tokens(model: HookedModel, ids: list[int]) -> list[str]:
    tok = getattr(model, "tokenizer", None)
    return [token_label(tok, i) if tok is not None else str(i) for i in ids]


def head_card(
    layer: int,
    head: int,
    *,
    roles: pd.DataFrame | None = None,
    model: HookedModel | None = None,
    compositions: Compositions | None = None,
    probe: TokenProbe | None = None,
    write: Float[Tensor, " d_vocab"] | None = None,
    why: pd.DataFrame | None = None,
    top: int = 10,
) -> dict[str, Any]:
    """The card of head ``layer.head`` (see the module docstring): ``scores`` (its row of ``roles``,
    a role table or any per-head table), ``writes`` / ``suppresses`` (``[(token, logit)]``, with
    ``model``), ``composes_in`` / ``composes_out`` (the ``top`` pairs by z, with ``compositions``) and
    ``pattern`` (``[q][k]`` on the probe's first sequence, with ``model`` and ``probe``). ``write``:
    the head's :func:`mean_write` when already computed (:func:`mean_writes` for many heads).
    ``why``: a table of (query component, key component) pairs per head and role (the atlas's qk
    part: ``head``, ``role``, ``at``, ``query``, ``key``, ``contrast`` with its CI, ``total``); the
    head's rows become ``why_attends``."""
    card: dict[str, Any] = {"head": f"{layer}.{head}", "layer": layer, "head_index": head}
    if roles is not None:
        row = roles[(roles["layer"] == layer) & (roles["head"] == head)]
        if row.empty:
            raise UsageError(f"no head {layer}.{head} in the role table")
        card["scores"] = {k: _plain(v) for k, v in row.iloc[0].items() if k not in ("layer", "head", "label")}
    if model is not None:
        write = mean_write(model, layer, head) if write is None else write
        order = torch.argsort(write, descending=True)
        hi, lo = order[:top].tolist(), order.flip(0)[:top].tolist()
        card["writes"] = list(zip(_tokens(model, hi), [float(write[i]) for i in hi]))
        card["suppresses"] = list(zip(_tokens(model, lo), [float(write[i]) for i in lo]))
    if compositions is not None:
        t = compositions.table
        into = t[(t["dst_layer"] == layer) & (t["dst_head"] == head)].nlargest(top, "z")
        out = t[(t["src_layer"] == layer) & (t["src_head"] == head)].nlargest(top, "z")
        cols = ["kind", "src", "dst", "score", "z"]
        card["composes_in"] = into[cols].to_dict("records")
        card["composes_out"] = out[cols].to_dict("records")
    if why is not None:
        rows = why[why["head"] == f"{layer}.{head}"].drop(columns="head")
        card["why_attends"] = [{k: _plain(v) for k, v in r.items()} for r in rows.to_dict("records")]
    if model is not None and probe is not None:
        card["pattern"] = _thumbnail(model, probe, layer, head)
    return card


def _thumbnail(model: HookedModel, probe: TokenProbe, layer: int, head: int) -> list[list[float]]:
    """The head's pattern on the probe's first sequence (its real tokens), rounded to 3 places."""
    seen: dict[str, Tensor] = {}

    def grab(pattern: Tensor, hook: Any) -> None:
        seen["p"] = pattern[0, head].detach().float().cpu()

    first = probe.select([0])
    run_with_reducers(
        model,
        first.tokens,
        [(pattern_hook(layer), grab)],
        stop_after=pattern_hook(layer),
        attention_mask=first.attention_mask,
    )
    real = first.real_mask()[0].cpu()
    p = seen["p"][real][:, real]
    return np.round(p.numpy(), 3).tolist()


def _plain(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


__all__ = ["head_card", "mean_write", "mean_writes"]
