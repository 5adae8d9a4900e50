"""The in-context learning score (Olsson et al. 2022): the loss at token 500 minus the loss at token 50.

A model that uses its context predicts a late token better than an early one, so the score is
negative, and it falls sharply when induction heads form. Olsson et al. read it on 512-token
contexts; a shorter context keeps the ratio: the late token is ``500/512`` of the way in, the
early one a tenth of that (:func:`icl_positions`), and every result says which tokens were read.

The text it is read on (:data:`ICL_DATA`): natural ``"text"`` (the bundled sentences, Olsson's
setting, for a model with a tokenizer) or ``"repeated"`` random-token blocks (a model without a
tokenizer, such as the toy, which was trained on repeats).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters import HookedModel, describe
from interp.errors import UsageError
from interp.probes import TokenProbe, repeated_tokens, text_probe
from interp.registry import Registry

OLSSON_CONTEXT, OLSSON_LATE, OLSSON_EARLY = 512, 500, 50

ICL_DATA: Registry[Callable[..., TokenProbe]] = Registry("in-context data")
ICL_DATA.add(
    "text",
    "natural text (the bundled sentences): Olsson et al.'s setting",
    lambda model, length, batch, seed: text_probe(model, batch=batch, seq_len=length - _framing(model), seed=seed),
)
ICL_DATA.add(
    "repeated",
    "random tokens in blocks of a tenth of the context, repeated to its end",
    lambda model, length, batch, seed: _repeated(model, length, batch, seed),
)


def _framing(model: HookedModel) -> int:
    """Tokens the probes add around the body (a BOS)."""
    return 1 if describe(model).bos_token_id is not None else 0


def _repeated(model: HookedModel, length: int, batch: int, seed: int) -> TokenProbe:
    body = length - _framing(model)
    block = max(2, body // 10)
    return repeated_tokens(model, batch=batch, block_len=block, n_repeats=max(2, body // block), seed=seed)


def default_icl_data(model: HookedModel) -> str:
    """``"text"`` for a model with a tokenizer, ``"repeated"`` for one without (the toy)."""
    return "text" if getattr(model, "tokenizer", None) is not None else "repeated"


def icl_positions(length: int) -> tuple[int, int]:
    """(early, late) token indices for a ``length``-token context: Olsson's (50, 500) when it holds
    501 tokens or more, else the same fractions of a 512-token context scaled to ``length``."""
    if length < 12:
        raise UsageError(f"the in-context score needs a context of at least 12 tokens, got {length}")
    if length > OLSSON_LATE:
        return OLSSON_EARLY, OLSSON_LATE
    late = min(length - 1, OLSSON_LATE * length // OLSSON_CONTEXT)
    return max(1, round(late * OLSSON_EARLY / OLSSON_LATE)), late


@dataclass(frozen=True)
class ICLScore:
    """The score and what it was read from."""

    score: float  # loss(late) - loss(early), nats
    loss_early: float
    loss_late: float
    early: int
    late: int
    length: int
    data: str
    batch: int

    def describe(self) -> str:
        scaled = (
            "Olsson et al.'s tokens"
            if (self.early, self.late) == (OLSSON_EARLY, OLSSON_LATE)
            else f"Olsson et al.'s 500 and 50 scaled to a {self.length}-token context"
        )
        return f"loss at token {self.late} minus loss at token {self.early} ({scaled}; {self.data}, {self.batch} sequences)"

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def token_losses(
    model: HookedModel, tokens: Int[Tensor, "batch pos"], positions: list[int], minibatch: int = 4
) -> Float[Tensor, "batch n"]:
    """Cross-entropy of the tokens at ``positions`` given everything before each (read one position earlier)."""
    device = describe(model).device
    target = torch.tensor(positions, device=device)
    out = []
    with torch.no_grad():
        for rows in tokens.to(device).split(minibatch):
            logits = model(rows)[:, target - 1].float()
            picked = logits.gather(-1, rows[:, target].to(logits.device)[..., None]).squeeze(-1)
            out.append((logits.logsumexp(-1) - picked).cpu())
    return torch.cat(out)


def icl_score(
    model: HookedModel, *, length: int | None = None, data: str | None = None, batch: int = 16, seed: int = 0
) -> ICLScore:
    """Olsson et al.'s in-context learning score of ``model`` (see the module docstring).

    ``length``: the context in tokens (default: the model's context, at most 512); ``data``: a name
    in :data:`ICL_DATA` (default :func:`default_icl_data`).
    """
    info = describe(model)
    length = length or min(OLSSON_CONTEXT, info.n_ctx or OLSSON_CONTEXT)
    data = ICL_DATA.check(data or default_icl_data(model))
    probe = ICL_DATA.get(data)(model, length, batch, seed)
    early, late = icl_positions(probe.seq_len)
    losses = token_losses(model, probe.tokens, [early, late]).mean(0)
    return ICLScore(
        score=float(losses[1]) - float(losses[0]),
        loss_early=float(losses[0]),
        loss_late=float(losses[1]),
        early=early,
        late=late,
        length=probe.seq_len,
        data=data,
        batch=probe.batch,
    )
