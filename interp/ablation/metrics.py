"""Metrics: a number per sequence from the model's output, and which positions it reads.

The built-in metrics are registered once in :data:`METRICS` under their CLI names, each with its
direction (``higher_is_better``) and whether it is at its optimum on the unablated run
(``flat_at_clean``: no gradient there); :func:`builtin_metric` builds one for a probe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.ablation.settings import checked
from interp.errors import AblationError, MetricError
from interp.probes import TokenProbe
from interp.registry import Registry


@dataclass(frozen=True)
class Metric:
    """A per-sequence metric, and what of the model's output it reads.

    ``fn(out, tokens, clean, rows)`` gets ``out``: the logits (or, with ``reads="hidden"``, the final
    residual stream) at ``positions`` only (all positions when ``None``), ``[batch, n_read, ...]``;
    ``tokens``: the sequences; ``clean``: the unablated ``out`` of the same sequences (in patching:
    the read-out of each pair's clean prompt, :func:`interp.patching.core.against_clean`); ``rows``:
    their indices in the probe. It returns ``[batch]``.
    """

    name: str
    fn: Callable[[Tensor, Tensor, Tensor | None, Tensor | None], Tensor]
    positions: tuple[int, ...] | None = None
    reads: Literal["logits", "hidden"] = "logits"
    higher_is_better: bool = False
    needs_clean: bool = False  # compares with the unablated output (``clean`` must be passed)
    flat_at_clean: bool = False  # at its optimum on the unablated run: its gradient there is zero
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def read(self, out: Float[Tensor, "batch pos ..."]) -> Tensor:
        return out if self.positions is None else out[:, list(self.positions)]

    def __call__(
        self, out: Tensor, tokens: Tensor, clean: Tensor | None = None, rows: Tensor | None = None
    ) -> Float[Tensor, " batch"]:
        value = self.fn(out, tokens, clean, rows)
        if not isinstance(value, Tensor):
            value = torch.as_tensor(value)
        if tuple(value.shape) != (tokens.shape[0],):
            raise MetricError(
                f"metric {self.name!r} must return one number per sequence (shape [{tokens.shape[0]}]), "
                f"got shape {list(value.shape)}"
            )
        bad = ~torch.isfinite(value)
        if bool(bad.any()):
            raise MetricError(
                f"metric {self.name!r} returned non-finite values (nan/inf) for "
                f"{int(bad.sum())} of {len(value)} sequences"
            )
        return value.float()

    def badness(self, value: Tensor) -> Tensor:
        """The value turned so that larger is worse (a loss)."""
        return -value if self.higher_is_better else value

    def degradation(self, value: Tensor | float, clean: Tensor | float) -> Tensor | float:
        """How much worse ``value`` is than ``clean``, as a fraction of ``|clean|``."""
        diff = (clean - value) if self.higher_is_better else (value - clean)
        return diff / max(abs(float(clean)), 1e-12)


UNWRAPPED = (
    "a plain function does not say which way is better: wrap it as "
    "interp.as_metric(fn, higher_is_better=True) for a score such as a logit difference, or "
    "interp.as_metric(fn, higher_is_better=False) for a loss"
)


def as_metric(fn: Callable | Metric, *, name: str | None = None, higher_is_better: bool | None = None) -> Metric:
    """Wrap a plain ``fn(logits, tokens) -> [batch]`` (it reads the logits at every position).

    ``higher_is_better`` is required for a plain function: a logit difference (higher is better) and a
    loss (lower is better) rank heads in opposite orders, and guessing would flip every importance. A
    :class:`Metric` is returned as it is (``higher_is_better``, when given, must agree with it).
    """
    if isinstance(fn, Metric):
        if higher_is_better is not None and bool(higher_is_better) != fn.higher_is_better:
            raise MetricError(
                f"metric {fn.name!r} is {'higher' if fn.higher_is_better else 'lower'}-is-better; "
                f"as_metric was told higher_is_better={higher_is_better}"
            )
        return fn
    if not callable(fn):
        raise MetricError(f"a metric must be callable as fn(logits, tokens), got {type(fn).__name__}")
    if higher_is_better is None:
        raise MetricError(UNWRAPPED)
    return Metric(
        name or getattr(fn, "__name__", "metric"),
        lambda out, tokens, clean, rows: fn(out, tokens),
        higher_is_better=higher_is_better,
    )


def _next_token_metric(name: str, predicted: Sequence[int], probe: TokenProbe) -> Metric:
    """Mean next-token cross-entropy of the tokens at ``predicted`` (read at the position before)."""
    predicted = sorted(int(p) for p in predicted if p >= 1)
    if not predicted:
        raise AblationError(f"{name}: the probe has no position to score")
    read = tuple(p - 1 for p in predicted)
    target_pos = torch.tensor(predicted)

    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        targets = tokens[:, target_pos.to(tokens.device)].to(out.device)  # logits: the last block's device
        logits = out.float()
        # -log_softmax at the target, without writing out the whole log-softmax
        return (logits.logsumexp(-1) - logits.gather(-1, targets[..., None]).squeeze(-1)).mean(-1)

    return Metric(name, fn, positions=read, meta={"scored_positions": len(predicted)})


def _need_causal(probe: TokenProbe, what: str) -> None:
    if not probe.causal:
        raise AblationError(f"{what} needs a causal (decoder) model; for an encoder use the pooled-cosine metric")


def predictable_mask(tokens: Int[Tensor, "batch pos"]) -> Bool[Tensor, "batch pos"]:
    """Positions whose token an induction head can predict: the pair (previous token, token) occurred
    earlier in the sequence. On a repeated-token probe: every later repeat but the first token of the
    second repeat (nothing before it was followed by it)."""
    prev, cur = tokens[:, :-1], tokens[:, 1:]
    same = (prev[:, :, None] == prev[:, None, :]) & (cur[:, :, None] == cur[:, None, :])  # [batch, p, q]
    n = prev.shape[1]
    earlier = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril(-1)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, 1:] = (same & earlier).any(-1)
    return mask


def incontext_loss(probe: TokenProbe) -> Metric:
    """Next-token loss on the tokens of a repeated-token probe that in-context copying can predict.

    Those are the positions where the pair (previous token, token) occurred earlier, in every
    sequence (:func:`predictable_mask`): the later repeats, less the first token of the second repeat,
    which no head can predict (it would only add a constant to every score).
    """
    _need_causal(probe, "the in-context loss")
    if probe.block_len is None:
        raise AblationError("the in-context loss needs a repeated-token probe (interp.probes.repeated_tokens)")
    positions = predictable_mask(probe.tokens).all(0).nonzero().squeeze(-1).tolist()
    return _next_token_metric("incontext_loss", positions, probe)


def lm_loss(probe: TokenProbe) -> Metric:
    """Next-token loss on every body token (after the first position) of a probe, e.g. a text probe.

    On a padded probe each row's loss is the mean over its own text's body tokens, read at real
    positions only: what the text gives alone."""
    _need_causal(probe, "the language-model loss")
    if probe.padded:
        return _padded_next_token_metric("lm_loss", probe.body_mask() & (probe.real_index() >= 1), probe)
    return _next_token_metric("lm_loss", range(max(probe.body_start, 1), probe.body_end), probe)


def _rows_of(mask: Tensor, rows: Tensor | None, n: int) -> Tensor:
    """The probe-wide ``mask``'s rows for the sequences ``rows`` (all of them when ``None``)."""
    if rows is None:
        if mask.shape[0] != n:
            raise MetricError(
                f"the metric was built for a probe of {mask.shape[0]} sequences, got {n}: pass rows=", params="rows"
            )
        return mask
    return mask[rows.to(mask.device)]


def _padded_next_token_metric(name: str, predicted: Bool[Tensor, "batch pos"], probe: TokenProbe) -> Metric:
    """Mean next-token cross-entropy per row over the positions ``predicted`` marks (each read at the
    position before, a real one): a padded probe's rows score different positions."""
    predicted = predicted.cpu()
    if not bool(predicted.any(-1).all()):
        raise AblationError(f"{name}: a text of the probe has no position to score (it needs 2 tokens or more)")

    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        score = _rows_of(predicted, rows, tokens.shape[0])[:, 1:].to(out.device)  # [b, T - 1]
        logits = out[:, :-1].float()
        targets = tokens[:, 1:].to(out.device)
        loss = logits.logsumexp(-1) - logits.gather(-1, targets[..., None]).squeeze(-1)
        return torch.where(score, loss, 0.0).sum(-1) / score.sum(-1)

    return Metric(name, fn, positions=None, meta={"scored_positions": int(predicted.sum())})


def refuse_padded_ablation(probe: TokenProbe, ablation: Any) -> None:
    """Mean and resample ablations average head outputs over the probe's positions, and do not yet
    leave padded ones out: refuse them on a padded probe."""
    kind = ablation if isinstance(ablation, str) else getattr(ablation, "kind", None)
    if probe.padded and kind != "zero":
        raise AblationError(
            f"{kind} ablation does not take padded probes yet (its averages would read padded positions): "
            "use ablation='zero', or texts of one length",
            params="ablation",
        )


def logit_diff(
    correct: int | Sequence[int] | Tensor,
    wrong: int | Sequence[int] | Tensor,
    *,
    position: int = -1,
    name: str = "logit_diff",
) -> Metric:
    """``logit[correct] - logit[wrong]`` at ``position``; answers are token ids, one or one per sequence."""
    c, w = torch.as_tensor(correct).long(), torch.as_tensor(wrong).long()

    def pick(ids: Tensor, rows: Tensor | None, n: int, device: torch.device) -> Tensor:
        ids = ids.to(device)
        if ids.ndim == 0:
            return ids.expand(n)
        return ids if rows is None else ids[rows.to(device)]

    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        logits = out[:, 0].float()
        n = logits.shape[0]
        cc, ww = pick(c, rows, n, logits.device), pick(w, rows, n, logits.device)
        return logits.gather(-1, cc[:, None]).squeeze(-1) - logits.gather(-1, ww[:, None]).squeeze(-1)

    return Metric(name, fn, positions=(position,), higher_is_better=True)


def incontext_logit_diff(probe: TokenProbe) -> Metric:
    """Logit difference at the last body token of a repeated-token probe.

    The correct answer is the in-context continuation (the token that followed the last token's
    earlier occurrence); the wrong one is the token after that (an off-by-one copy).
    """
    _need_causal(probe, "the in-context logit difference")
    if probe.block_len is None or probe.block_len < 3:
        raise AblationError("the in-context logit difference needs a repeated-token probe with blocks of >= 3 tokens")
    last = probe.body_end - 1
    earlier = last - probe.block_len
    correct = probe.tokens[:, earlier + 1].cpu()
    wrong = probe.tokens[:, earlier + 2].cpu()
    return logit_diff(correct, wrong, position=last, name="logit_diff")


def pooled_cosine(probe: TokenProbe) -> Metric:
    """Cosine similarity of the mean-pooled final hidden state (over body tokens) to the unablated one.

    On a padded probe each row pools over its own text's body tokens."""
    if probe.padded:
        return _padded_pooled_cosine(probe)
    body = tuple(range(probe.body_start, probe.body_end))

    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        if clean is None:
            raise MetricError("the pooled-cosine metric needs the unablated output")
        return F.cosine_similarity(out.float().mean(1), clean.float().mean(1), dim=-1)

    return Metric(
        "pooled_cosine",
        fn,
        positions=body,
        reads="hidden",
        higher_is_better=True,
        needs_clean=True,
        flat_at_clean=True,  # cosine 1 is its maximum: ablation can only lower it, the gradient is 0
    )


def _padded_pooled_cosine(probe: TokenProbe) -> Metric:
    body = probe.body_mask().cpu()

    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        if clean is None:
            raise MetricError("the pooled-cosine metric needs the unablated output")
        w = _rows_of(body, rows, tokens.shape[0]).to(out.device)[..., None].float()
        pool = lambda x: (x.float() * w).sum(1) / w.sum(1)  # noqa: E731
        return F.cosine_similarity(pool(out), pool(clean), dim=-1)

    return Metric("pooled_cosine", fn, reads="hidden", higher_is_better=True, needs_clean=True, flat_at_clean=True)


METRICS: Registry[Callable[[TokenProbe], Metric]] = Registry("metric")
METRICS.add(
    "incontext",
    "loss on the tokens of a repeated probe that in-context copying can predict",
    incontext_loss,
    higher_is_better=False,
    flat_at_clean=False,
)
METRICS.add("lm", "next-token loss on a text probe", lm_loss, higher_is_better=False, flat_at_clean=False)
METRICS.add(
    "logit-diff",
    "last position: the in-context answer's logit minus the off-by-one copy's",
    incontext_logit_diff,
    higher_is_better=True,
    flat_at_clean=False,
)
METRICS.add(
    "pooled-cos",
    "encoders: cosine of the mean-pooled output to the unablated one",
    pooled_cosine,
    higher_is_better=True,
    flat_at_clean=True,
)


def builtin_metric(name: str, probe: TokenProbe) -> Metric:
    """A built-in metric by its CLI name (one of :data:`METRICS`: ``incontext``, ``lm``,
    ``logit-diff``, ``pooled-cos``), built for ``probe``."""
    return METRICS.get(checked(METRICS, name))(probe)
