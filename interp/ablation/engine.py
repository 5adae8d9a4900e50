"""Head ablation: which heads matter for a metric, and how many can go.

A head is *ablated* at its output before ``W_O`` (``blocks.{l}.attn.hook_z``), in one of three ways:

- ``zero``: the output is set to 0 (Michel et al. 2019's head mask);
- ``mean``: set to the head's mean output over the probe (every sequence and position);
- ``resample``: set to the head's output on another sequence of the probe (a seeded derangement
  pairs each sequence with a donor; the donor's *clean* output is used).

A **metric** is a callable on ``(logits, tokens)`` returning one number per sequence; a
:class:`Metric` also says which positions it reads (so only those are unembedded), whether it reads
the logits or the final hidden state, and which direction is better. Built in: the language-model
loss on a text probe (:func:`lm_loss`), the in-context loss on the second repeat of a repeated-token
probe (:func:`incontext_loss`), the logit difference between two answer tokens (:func:`logit_diff`),
and for encoders the cosine similarity of the mean-pooled final hidden state to the unablated one
(:func:`pooled_cosine`).

On that footing:

- :func:`ablated` silences heads inside a ``with`` block (notebooks); :class:`Sweeper` evaluates the
  metric under many head sets at once;
- :func:`exact_sweep` ablates every head alone. Its engine runs the clean pass once, caching the
  residual stream entering every block and how each block was called, and then, for the heads of
  layer ``l``, replays only blocks ``l .. L-1``, several ablations batched along the batch axis,
  unembedding only the positions the metric reads. Where replaying a model's blocks does not
  reproduce its own output (checked once per sweep) it falls back to a plain ``run_with_hooks`` loop;
- :func:`gradient_importance` is Michel et al.'s ``I_h = E_x |A_h(x)^T dL/dA_h(x)|``, the absolute
  value taken per token before averaging, from one forward and backward per batch;
- :func:`pruning_curve` removes heads in increasing order of importance (10 % of the heads a step by
  default), optionally re-estimating the importance after each step; :func:`heads_prunable` reads off
  how many heads can go before the metric degrades by a given fraction;
- :func:`train_gates` trains Voita et al. 2019's input-independent Hard-Concrete gates with an L0
  penalty over a sweep of ``lambda`` on the frozen model and binarises them.

Importance is always signed so that *larger means the head matters more*: for a loss, the increase
on ablation; for a higher-is-better metric, the decrease.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp.errors import AblationError, MetricError
from interp.hooks import release_kept_pattern, resid_post_hook, run_with_reducers, z_hook
from interp.models import ModelInfo, describe
from interp.probes import TokenProbe
from interp.scores import HeadScores

ABLATIONS = ("zero", "mean", "resample")
ENGINES = ("auto", "fast", "loop")
ORDERS = ("gradient", "exact", "random")

# Voita et al. 2019 (after Louizos et al. 2018): Hard-Concrete temperature and stretch interval.
GATE_TEMPERATURE = 0.33
GATE_STRETCH = (-0.1, 1.1)

# Tokens per batched forward of the fast engine, unless told otherwise. On a CPU, batches past a
# couple of thousand tokens run slower per token (elementwise ops leave the caches); GPUs want more.
_TOKEN_BUDGET = {"cpu": 2048, "other": 16384}


# --------------------------------------------------------------------------------------------
# head sets


def head_mask(model: Any, heads: Any, *, allow_empty: bool = False) -> Bool[Tensor, "layer head"]:
    """A ``[n_layers, n_heads]`` boolean mask (True = ablate) from heads named any usual way.

    ``heads`` may be a boolean mask of that shape, an iterable of ``(layer, head)`` pairs or
    ``"layer.head"`` strings, or one comma-separated string (``"1.2,0.3"``). Raises :class:`AblationError` for a head out of range or, unless
    ``allow_empty``, for an empty set.
    """
    info = model if isinstance(model, ModelInfo) else describe(model)
    L, H = info.n_layers, info.n_heads
    if isinstance(heads, str):
        heads = [h for h in heads.split(",") if h.strip()]
    if isinstance(heads, (Tensor, np.ndarray)) and str(heads.dtype).endswith("bool"):
        mask = torch.as_tensor(heads.detach().cpu() if isinstance(heads, Tensor) else heads)
        if tuple(mask.shape) != (L, H):
            raise AblationError(f"a head mask must have shape [{L}, {H}] (layers x heads), got {list(mask.shape)}")
    else:
        mask = torch.zeros(L, H, dtype=torch.bool)
        for item in heads:
            layer, head = _parse_head(item)
            if not (0 <= layer < L and 0 <= head < H):
                raise AblationError(
                    f"head {layer}.{head} is out of range: the model has {L} layers x {H} heads "
                    f"(layers 0..{L - 1}, heads 0..{H - 1})"
                )
            mask[layer, head] = True
    if not allow_empty and not bool(mask.any()):
        raise AblationError("the head set is empty: name at least one head to ablate")
    return mask


def _parse_head(item: Any) -> tuple[int, int]:
    if isinstance(item, str):
        parts = item.strip().split(".")
        if len(parts) == 2 and all(p.lstrip("-").isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
        raise AblationError(f"cannot read head {item!r}: write heads as 'layer.head', e.g. '1.3'")
    try:
        layer, head = item
        return int(layer), int(head)
    except (TypeError, ValueError):
        raise AblationError(f"cannot read head {item!r}: give (layer, head) pairs or 'layer.head' strings") from None


def _labels(mask: Bool[Tensor, "layer head"]) -> list[str]:
    return [f"{l}.{h}" for l, h in mask.nonzero().tolist()]


# --------------------------------------------------------------------------------------------
# what an ablated head outputs


@dataclass
class HeadAblation:
    """The value an ablated head's ``hook_z`` is replaced by, for every layer.

    Build with :meth:`fit`. ``mean`` holds ``[layer, head, d_head]`` means over the probe;
    ``source`` (resample) holds, per layer, ``[batch, pos, head, d_head]``: for each probe sequence
    the clean output of its donor sequence.
    """

    kind: str
    mean: Float[Tensor, "layer head d_head"] | None = None
    source: list[Float[Tensor, "batch pos head d_head"]] | None = None
    donors: list[int] | None = None

    @classmethod
    def fit(
        cls,
        model: Any,
        kind: str = "zero",
        probe: TokenProbe | Tensor | None = None,
        *,
        seed: int = 0,
        minibatch: int | None = None,
    ) -> HeadAblation:
        if kind not in ABLATIONS:
            raise AblationError(f"unknown ablation {kind!r}: choose from {list(ABLATIONS)}")
        if kind == "zero":
            return cls(kind)
        if probe is None:
            raise AblationError(f"{kind} ablation needs a probe to take the heads' outputs from")
        tokens = probe.tokens if isinstance(probe, TokenProbe) else probe
        if kind == "resample" and tokens.shape[0] < 2:
            raise AblationError("resample ablation needs a probe of at least 2 sequences (one is the donor)")
        zs = _clean_z(model, tokens, minibatch)
        if kind == "mean":
            mean = torch.stack([_mean_output(z) for z in zs])
            return cls(kind, mean=mean)
        donors = derangement(tokens.shape[0], seed)
        return cls(kind, source=[z[donors] for z in zs], donors=donors.tolist())

    def replacement(self, layer: int, rows: Tensor | slice | None = None) -> Tensor:
        """What replaces ``hook_z`` of ``layer``: a scalar, ``[head, d_head]`` or ``[batch, pos, head, d_head]``."""
        if self.kind == "zero":
            return torch.zeros(())
        if self.kind == "mean":
            return self.mean[layer]
        src = self.source[layer]
        return src if rows is None else src[rows]

    def patch(
        self,
        z: Float[Tensor, "batch pos head d_head"],
        layer: int,
        ablate: Bool[Tensor, "rep head"],
        rows: Tensor | slice | None = None,
    ) -> Tensor:
        """``z`` with the heads in ``ablate`` replaced; the batch is ``rep`` copies of ``rows``."""
        rep = ablate.shape[0]
        zz = z.reshape(rep, z.shape[0] // rep, *z.shape[1:])
        r = self.replacement(layer, rows).to(device=z.device, dtype=z.dtype)
        self._check_batch(r, zz.shape[1])
        where = ablate.to(z.device)[:, None, None, :, None]
        return torch.where(where, r, zz).reshape(z.shape)

    def mix(
        self, z: Float[Tensor, "batch pos head d_head"], layer: int, gate: Tensor, rows: Tensor | slice | None = None
    ) -> Tensor:
        """``r + gate * (z - r)``: gate 1 keeps the head, 0 ablates it (gates broadcast over ``z``)."""
        r = self.replacement(layer, rows).to(device=z.device, dtype=z.dtype)
        self._check_batch(r, z.shape[0])
        return r + gate * (z - r)

    def _check_batch(self, r: Tensor, batch: int) -> None:
        if r.ndim == 4 and r.shape[0] != batch:
            raise AblationError(
                f"resample ablation was fitted on {r.shape[0]} sequences but this run has "
                f"{batch}: run it on the probe it was fitted on"
            )

    def hooks(self, mask: Bool[Tensor, "layer head"], rows: Tensor | slice | None = None) -> list:
        """Forward hooks that ablate the heads in ``mask`` (for ``run_with_hooks`` / ``model.hooks``)."""
        return [
            (z_hook(l), self._layer_hook(l, mask[l][None], rows)) for l in range(mask.shape[0]) if bool(mask[l].any())
        ]

    def _layer_hook(self, layer: int, ablate: Bool[Tensor, "rep head"], rows: Any) -> Callable:
        def hook(z: Tensor, hook: Any) -> Tensor:
            return self.patch(z, layer, ablate, rows)

        return hook


def _mean_output(z: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "head d_head"]:
    """A head's mean output over every sequence and position."""
    return z.double().mean(dim=(0, 1)).to(z.dtype)


def derangement(n: int, seed: int = 0) -> Int[Tensor, " n"]:
    """A seeded permutation of ``range(n)`` without fixed points (one random cycle)."""
    cycle = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    out = torch.empty(n, dtype=torch.long)
    out[cycle] = cycle.roll(-1)
    return out


def _clean_z(model: Any, tokens: Tensor, minibatch: int | None) -> list[Tensor]:
    """Every layer's clean ``hook_z`` on ``tokens``; the pass stops after the last layer's."""
    L = describe(model).n_layers
    parts: list[list[Tensor]] = [[] for _ in range(L)]

    def grab(layer: int) -> Callable:
        def hook(z: Tensor, hook: Any) -> None:
            parts[layer].append(z.detach().clone())

        return hook

    step = minibatch or tokens.shape[0]
    for start in range(0, tokens.shape[0], step):
        run_with_reducers(
            model, tokens[start : start + step], [(z_hook(l), grab(l)) for l in range(L)], stop_after=z_hook(L - 1)
        )
    return [torch.cat(p) for p in parts]


@contextmanager
def ablated(
    model: Any,
    heads: Any,
    *,
    ablation: str | HeadAblation = "zero",
    probe: TokenProbe | Tensor | None = None,
    seed: int = 0,
) -> Iterator[HeadAblation]:
    """Run ``model`` with ``heads`` silenced inside the ``with`` block::

        with ablated(model, ["1.2", "0.3"], ablation="mean", probe=probe):
            logits = model(probe.tokens)

    Mean and resample ablation take the heads' outputs from ``probe``; resample needs each run to
    be on the probe's own sequences.
    """
    mask = head_mask(model, heads)
    abl = ablation if isinstance(ablation, HeadAblation) else HeadAblation.fit(model, ablation, probe, seed=seed)
    with model.hooks(fwd_hooks=abl.hooks(mask)):
        yield abl


# --------------------------------------------------------------------------------------------
# metrics


@dataclass(frozen=True)
class Metric:
    """A per-sequence metric, and what of the model's output it reads.

    ``fn(out, tokens, clean, rows)`` gets ``out``: the logits (or, with ``reads="hidden"``, the final
    residual stream) at ``positions`` only (all positions when ``None``), ``[batch, n_read, ...]``;
    ``tokens``: the sequences; ``clean``: the unablated ``out`` of the same sequences; ``rows``: their
    indices in the probe. It returns ``[batch]``.
    """

    name: str
    fn: Callable[[Tensor, Tensor, Tensor | None, Tensor | None], Tensor]
    positions: tuple[int, ...] | None = None
    reads: Literal["logits", "hidden"] = "logits"
    higher_is_better: bool = False
    needs_clean: bool = False  # compares with the unablated output (``clean`` must be passed)
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


def as_metric(fn: Callable | Metric, *, name: str | None = None, higher_is_better: bool = False) -> Metric:
    """Wrap a plain ``fn(logits, tokens) -> [batch]`` (it reads the logits at every position)."""
    if isinstance(fn, Metric):
        return fn
    if not callable(fn):
        raise MetricError(f"a metric must be callable as fn(logits, tokens), got {type(fn).__name__}")
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
        targets = tokens[:, target_pos.to(tokens.device)]
        logp = out.float().log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
        return -logp.mean(-1)

    return Metric(name, fn, positions=read, meta={"scored_positions": len(predicted)})


def _need_causal(probe: TokenProbe, what: str) -> None:
    if not probe.causal:
        raise AblationError(f"{what} needs a causal (decoder) model; for an encoder use the pooled-cosine metric")


def incontext_loss(probe: TokenProbe) -> Metric:
    """Next-token loss on the second (and later) repeats of a repeated-token probe."""
    _need_causal(probe, "the in-context loss")
    if probe.block_len is None:
        raise AblationError("the in-context loss needs a repeated-token probe (interp.probes.repeated_tokens)")
    positions = probe.second_repeat_mask().all(0).nonzero().squeeze(-1).tolist()
    return _next_token_metric("incontext_loss", positions, probe)


def lm_loss(probe: TokenProbe) -> Metric:
    """Next-token loss on every body token (after the first position) of a probe, e.g. a text probe."""
    _need_causal(probe, "the language-model loss")
    return _next_token_metric("lm_loss", range(max(probe.body_start, 1), probe.body_end), probe)


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
    """Cosine similarity of the mean-pooled final hidden state (over body tokens) to the unablated one."""
    body = tuple(range(probe.body_start, probe.body_end))

    def fn(out: Tensor, tokens: Tensor, clean: Tensor | None, rows: Tensor | None) -> Tensor:
        if clean is None:
            raise MetricError("the pooled-cosine metric needs the unablated output")
        return F.cosine_similarity(out.float().mean(1), clean.float().mean(1), dim=-1)

    return Metric("pooled_cosine", fn, positions=body, reads="hidden", higher_is_better=True, needs_clean=True)


METRICS = ("incontext", "lm", "logit-diff", "pooled-cos")


def builtin_metric(name: str, probe: TokenProbe) -> Metric:
    """A built-in metric by its CLI name (``incontext``, ``lm``, ``logit-diff``, ``pooled-cos``)."""
    makers = {
        "incontext": incontext_loss,
        "lm": lm_loss,
        "logit-diff": incontext_logit_diff,
        "pooled-cos": pooled_cosine,
    }
    if name not in makers:
        raise AblationError(f"unknown metric {name!r}: choose from {list(METRICS)}")
    return makers[name](probe)


# --------------------------------------------------------------------------------------------
# the engine


@dataclass
class _Batch:
    """What the clean (or base-ablated) pass over one minibatch leaves for the replays."""

    rows: Tensor
    tokens: Tensor
    resid: list[Tensor]  # the residual stream entering each block
    calls: list[tuple[tuple, dict]]  # how each block was called (besides the residual)
    out: Tensor  # the metric's read-out of this pass
    reference: Tensor  # the unablated read-out (== out without a base ablation)


class Sweeper:
    """Evaluate a metric with many head sets ablated, on one probe.

    ``base`` heads (a mask) stay ablated throughout (used by pruning with re-estimation). With
    ``engine="auto"`` the fast replay engine is used when replaying the model's blocks reproduces
    its output, else the plain loop; ``"fast"`` insists on the former, ``"loop"`` forces the latter.
    Masks passed to :meth:`evaluate` add to ``base``; :attr:`clean` is the metric per sequence with
    only the ``base`` heads ablated (none by default). ``minibatch``: probe sequences per forward
    (default all); ``chunk``: ablations batched into one forward by the fast engine (default: as many
    as make about 2k tokens on a CPU, 16k elsewhere).
    """

    def __init__(
        self,
        model: Any,
        probe: TokenProbe,
        metric: Metric | Callable,
        *,
        ablation: str | HeadAblation = "zero",
        base: Any = None,
        engine: str = "auto",
        minibatch: int | None = None,
        chunk: int | None = None,
        seed: int = 0,
        progress: bool = False,
    ):
        if engine not in ENGINES:
            raise AblationError(f"unknown engine {engine!r}: choose from {list(ENGINES)}")
        self.model, self.probe, self.metric = model, probe, as_metric(metric)
        self.info = describe(model)
        if probe.seq_len > self.info.n_ctx:
            raise AblationError(
                f"probe of {probe.seq_len} tokens is longer than the model's context of {self.info.n_ctx}"
            )
        self.ablation = (
            ablation
            if isinstance(ablation, HeadAblation)
            else HeadAblation.fit(model, ablation, probe, seed=seed, minibatch=minibatch)
        )
        self.base = (
            torch.zeros(self.info.n_layers, self.info.n_heads, dtype=torch.bool)
            if base is None
            else head_mask(self.info, base, allow_empty=True)
        )
        self.minibatch = minibatch or probe.batch
        self.chunk, self.progress = chunk, progress
        self.engine = "loop" if engine == "loop" else "fast"
        self.interrupted = False
        self._batches = [
            self._capture(torch.arange(s, min(s + self.minibatch, probe.batch)))
            for s in range(0, probe.batch, self.minibatch)
        ]
        self.clean = torch.cat([self.metric(b.out, b.tokens, b.reference, b.rows) for b in self._batches])
        if self.engine == "fast":
            why = self._self_check()
            if why is not None:
                if engine == "fast":
                    raise AblationError(f"the fast engine cannot run this model: {why}")
                warnings.warn(f"falling back to the run_with_hooks loop: {why}", stacklevel=2)
                self.engine = "loop"

    # ---- capture and replay -------------------------------------------------------------------

    def _capture(self, rows: Tensor) -> _Batch:
        model, L = self.model, self.info.n_layers
        tokens = self.probe.tokens[rows.to(self.probe.tokens.device)]
        calls: list[Any] = [None] * L
        blocks = getattr(model, "blocks", None)
        handles = []
        if blocks is not None and len(blocks) == L:

            def record(layer: int) -> Callable:
                def pre(module: Any, args: tuple, kwargs: dict) -> None:
                    calls[layer] = _detach_call(args, kwargs)

                return pre

            handles = [b.register_forward_pre_hook(record(l), with_kwargs=True) for l, b in enumerate(blocks)]
        try:
            out = self._run(tokens, self.base, rows)
        finally:
            for h in handles:
                h.remove()
        reference = out if not bool(self.base.any()) else self._run(tokens, None, rows)
        resid = [c[0][0] if c is not None else None for c in calls]
        return _Batch(rows, tokens, resid, [c if c is None else (c[0][1:], c[1]) for c in calls], out, reference)

    def _run(self, tokens: Tensor, mask: Tensor | None, rows: Tensor) -> Tensor:
        """One plain forward with ``mask``'s heads ablated; the metric's read-out."""
        hooks = [] if mask is None else self.ablation.hooks(mask, rows)
        return _read_out(self.model, tokens, self.metric, hooks, self.info.n_layers)

    def _replay(self, batch: _Batch, start: int, masks: Bool[Tensor, "rep layer head"]) -> Tensor:
        """Blocks ``start .. L-1`` on the cached residual, ``rep`` ablations batched; the read-out."""
        rep, model, L = masks.shape[0], self.model, self.info.n_layers
        hidden = batch.resid[start].repeat(rep, 1, 1)
        hooks = [
            (z_hook(l), self.ablation._layer_hook(l, masks[:, l], batch.rows))
            for l in range(start, L)
            if bool(masks[:, l].any())
        ]
        b = batch.tokens.shape[0]
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            for l in range(start, L):
                args, kwargs = _expand_call(batch.calls[l], b, rep)
                out = model.blocks[l](hidden, *args, **kwargs)
                hidden = out[0] if isinstance(out, (tuple, list)) else out
                release_kept_pattern(model, l)  # the bridge would keep [rep * batch, head, T, T] alive
            picked = self.metric.read(hidden)
            if self.metric.reads == "logits":
                picked = model.unembed(model.ln_final(picked))
        return picked

    def _self_check(self) -> str | None:
        """Replay the first minibatch from block 0 (two copies): does it give the model's own output?"""
        batch = self._batches[0]
        if any(r is None for r in batch.resid):
            return "the model does not call its `blocks` one after another"
        if self.metric.reads == "logits" and not (hasattr(self.model, "ln_final") and hasattr(self.model, "unembed")):
            return "the model has no ln_final/unembed to read logits with"
        try:
            got = self._replay(batch, 0, self.base[None].expand(2, -1, -1))
        except Exception as e:  # an architecture whose blocks need more than the recorded call
            return f"replaying its blocks failed ({type(e).__name__}: {e})"
        want = batch.out.repeat(2, *[1] * (batch.out.ndim - 1))
        if got.shape != want.shape:
            return f"replayed output has shape {list(got.shape)}, the model's {list(want.shape)}"
        scale = float(want.abs().max()) + 1e-6
        err = float((got - want).abs().max())
        # batched and unbatched matmuls round differently: allow that much in low precision
        tol = max(1e-4, 16 * torch.finfo(want.dtype).eps) if want.is_floating_point() else 1e-4
        if err > tol * scale:
            return f"replaying its blocks does not reproduce its output (max error {err:.2e} of {scale:.2e})"
        return None

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(self, masks: Any, *, desc: str = "ablating heads") -> Float[Tensor, "n batch"]:
        """The metric per sequence under each head set in ``masks`` (``[n, layer, head]``, added to base).

        On Ctrl-C the evaluation stops, :attr:`interrupted` is set, and the rows not reached are NaN.
        """
        masks = torch.as_tensor(masks, dtype=torch.bool)
        if masks.ndim != 3 or tuple(masks.shape[1:]) != (self.info.n_layers, self.info.n_heads):
            raise AblationError(
                f"masks must have shape [n, {self.info.n_layers}, {self.info.n_heads}], got {list(masks.shape)}"
            )
        n = masks.shape[0]
        result = torch.full((n, self.probe.batch), float("nan"))
        extra = masks & ~self.base
        effective = masks | self.base
        todo = []
        for i in range(n):
            if not bool(extra[i].any()):
                result[i] = self.clean
            else:
                todo.append((int(extra[i].any(-1).nonzero()[0]), i))
        todo.sort()
        groups = self._groups(todo)
        self.interrupted = False
        bar = tqdm(groups, desc=desc, disable=not self.progress, unit="batch")
        try:
            for start, idx in bar:
                result[idx] = self._evaluate_group(start, effective[idx])
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            bar.close()
        return result

    @property
    def chunk_size(self) -> int:
        """How many ablations the fast engine batches into one forward."""
        budget = _TOKEN_BUDGET["cpu" if self.info.device.type == "cpu" else "other"]
        return self.chunk or max(1, budget // (self.minibatch * self.probe.seq_len))

    def _groups(self, todo: list[tuple[int, int]]) -> list[tuple[int, list[int]]]:
        """Masks grouped by the first layer they touch, cut into chunks of one batched forward."""
        if self.engine == "loop":
            return [(start, [i]) for start, i in todo]
        chunk = self.chunk_size
        groups: list[tuple[int, list[int]]] = []
        for start, i in todo:
            if groups and groups[-1][0] == start and len(groups[-1][1]) < chunk:
                groups[-1][1].append(i)
            else:
                groups.append((start, [i]))
        return groups

    def _evaluate_group(self, start: int, masks: Bool[Tensor, "rep layer head"]) -> Tensor:
        rep = masks.shape[0]
        values = torch.empty(rep, self.probe.batch)
        for batch in self._batches:
            if self.engine == "loop":
                outs = [self._run(batch.tokens, masks[0], batch.rows)]
            else:
                outs = self._replay(batch, start, masks).chunk(rep)
            for r, out in enumerate(outs):
                values[r, batch.rows] = self.metric(out, batch.tokens, batch.reference, batch.rows).cpu()
        return values


def _read_out(model: Any, tokens: Tensor, metric: Metric, hooks: list, n_layers: int, *, grad: bool = False) -> Tensor:
    """Run ``model`` with ``hooks``; return the metric's read-out (logits or final hidden state)."""
    if metric.reads == "logits":
        logits = run_with_reducers(model, tokens, hooks, grad=grad)
        return metric.read(logits)
    seen: dict[str, Tensor] = {}
    last = resid_post_hook(n_layers - 1)

    def grab(x: Tensor, hook: Any) -> None:
        seen["hidden"] = x

    run_with_reducers(model, tokens, [*hooks, (last, grab)], stop_after=last, grad=grad)
    return metric.read(seen["hidden"])


def _is_cache(x: Any) -> bool:
    return type(x).__name__.endswith("Cache")


def _detach_call(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A block call to replay later: the residual first, KV caches dropped, ``use_cache`` off."""
    if args:
        hidden, rest = args[0], args[1:]
    else:
        kwargs = dict(kwargs)
        hidden, rest = kwargs.pop("hidden_states"), ()
    rest = tuple(None if _is_cache(a) else a for a in rest)
    kw = {k: (None if _is_cache(v) else v) for k, v in kwargs.items()}
    if "use_cache" in kw:
        kw["use_cache"] = False
    return (hidden.detach(), *rest), kw


def _expand_call(call: tuple[tuple, dict], batch: int, rep: int) -> tuple[tuple, dict]:
    """Repeat every per-sequence tensor of a recorded block call ``rep`` times along the batch."""

    def grow(x: Any) -> Any:
        if isinstance(x, Tensor) and x.ndim >= 2 and x.shape[0] == batch and batch > 1 and rep > 1:
            return x.repeat(rep, *[1] * (x.ndim - 1))
        if isinstance(x, tuple):
            return tuple(grow(v) for v in x)
        return x

    args, kwargs = call
    return tuple(grow(a) for a in args), {k: grow(v) for k, v in kwargs.items()}


# --------------------------------------------------------------------------------------------
# exact single-head sweep


def _probe_meta(probe: TokenProbe) -> dict[str, Any]:
    return dict(probe.meta) if probe.meta else {"batch": probe.batch, "seq_len": probe.seq_len}


def _scores_meta(model: Any, probe: TokenProbe, metric: Metric, ablation: HeadAblation, **extra: Any) -> dict:
    info = describe(model)
    return {
        "model": info.name,
        "n_layers": info.n_layers,
        "n_heads": info.n_heads,
        "causal": info.is_causal,
        "probe": _probe_meta(probe),
        "metric": metric.name,
        "higher_is_better": metric.higher_is_better,
        "ablation": ablation.kind,
        **extra,
    }


def exact_sweep(
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    ablation: str | HeadAblation = "zero",
    base: Any = None,
    engine: str = "auto",
    minibatch: int | None = None,
    chunk: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> HeadScores:
    """Ablate every head alone (on top of ``base``) and record the metric.

    Columns: ``metric_ablated`` (mean over sequences), ``delta`` (ablated - clean) and
    ``importance`` (the delta signed so that larger = the head matters more). Heads in ``base`` get
    NaN. On Ctrl-C the rows computed so far are returned, with ``meta["partial"] = True``.
    """
    sweeper = Sweeper(
        model,
        probe,
        metric,
        ablation=ablation,
        base=base,
        engine=engine,
        minibatch=minibatch,
        chunk=chunk,
        seed=seed,
        progress=progress,
    )
    return _single_head_scores(sweeper, "exact sweep")


def _single_head_scores(sweeper: Sweeper, desc: str) -> HeadScores:
    L, H = sweeper.info.n_layers, sweeper.info.n_heads
    heads = [(l, h) for l in range(L) for h in range(H) if not bool(sweeper.base[l, h])]
    masks = torch.zeros(len(heads), L, H, dtype=torch.bool)
    for i, (l, h) in enumerate(heads):
        masks[i, l, h] = True
    values = sweeper.evaluate(masks, desc=desc)
    metric, clean = sweeper.metric, float(sweeper.clean.mean())
    ablated_grid = torch.full((L, H), float("nan"))
    for (l, h), v in zip(heads, values.mean(1)):
        ablated_grid[l, h] = v
    delta = ablated_grid - clean
    scores = HeadScores.from_grids(
        {"importance": metric.badness(delta), "metric_ablated": ablated_grid, "delta": delta},
        _scores_meta(
            sweeper.model,
            sweeper.probe,
            metric,
            sweeper.ablation,
            method="exact",
            clean_metric=clean,
            engine=sweeper.engine,
            base=_labels(sweeper.base),
        ),
    )
    if sweeper.interrupted:
        done = set(_labels(torch.isfinite(ablated_grid)))
        scores.table = scores.table[scores.table["label"].isin(done)].reset_index(drop=True)
        scores.meta.update(partial=True, heads_done=len(done), heads_total=len(heads))
    return scores


def loop_sweep(model: Any, probe: TokenProbe, metric: Metric | Callable, **kwargs: Any) -> HeadScores:
    """:func:`exact_sweep` by the plain loop: one ``run_with_hooks`` per head (the reference)."""
    return exact_sweep(model, probe, metric, engine="loop", **kwargs)


# --------------------------------------------------------------------------------------------
# Michel et al.'s gradient importance


@contextmanager
def frozen(model: Any) -> Iterator[Any]:
    """Parameters do not require grad inside the block (restored after)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p in params:
            p.requires_grad_(True)


def _gated_forward(
    model: Any,
    tokens: Tensor,
    metric: Metric,
    ablation: HeadAblation,
    gates: list[Tensor],
    base: Tensor,
    rows: Tensor,
    reference: Tensor | None,
) -> Tensor:
    """Metric per sequence with every head's output mixed as ``r + g (z - r)`` (base heads at r)."""
    L = len(gates)

    def gate_hook(layer: int) -> Callable:
        def hook(z: Tensor, hook: Any) -> Tensor:
            g = gates[layer]
            g = g[..., None] if g.ndim == 3 else g[:, None, :, None]
            g = torch.where(base[layer].to(z.device)[:, None], torch.zeros((), device=z.device, dtype=g.dtype), g)
            return ablation.mix(z, layer, g.to(z.dtype), rows)

        return hook

    out = _read_out(model, tokens, metric, [(z_hook(l), gate_hook(l)) for l in range(L)], L, grad=True)
    return metric(out, tokens, reference, rows)


def gradient_importance(
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    ablation: str | HeadAblation = "zero",
    base: Any = None,
    normalize: bool = False,
    minibatch: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> HeadScores:
    """Michel et al.'s head importance ``I_h = E_x |A_h(x)^T dL/dA_h(x)|``.

    ``A_h(x)`` is head ``h``'s output (``hook_z``) at one token and ``L`` the metric's loss (the
    metric, negated when higher is better, summed over sequences). The product is taken per token,
    its absolute value averaged over every token of the probe. This is the gradient of ``L`` with
    respect to a per-token gate ``g`` on the head (``z' = g z``), at ``g = 1``. With mean or resample
    ablation the gate mixes towards the ablated value instead (``z' = r + g (z - r)``), so
    ``A_h - r`` takes the place of ``A_h``. One forward and backward per minibatch; the model's
    weights are frozen meanwhile. ``normalize`` divides each layer's scores by their L2 norm
    (Michel et al.'s option). Heads in ``base`` stay ablated and get NaN.
    """
    metric = as_metric(metric)
    info = describe(model)
    L, H = info.n_layers, info.n_heads
    abl = (
        ablation
        if isinstance(ablation, HeadAblation)
        else HeadAblation.fit(model, ablation, probe, seed=seed, minibatch=minibatch)
    )
    base_mask = torch.zeros(L, H, dtype=torch.bool) if base is None else head_mask(info, base, allow_empty=True)
    step = minibatch or probe.batch
    total = torch.zeros(L, H, dtype=torch.float64)
    count = 0
    values = []
    for start in tqdm(range(0, probe.batch, step), desc="gradient importance", disable=not progress):
        rows = torch.arange(start, min(start + step, probe.batch))
        tokens = probe.tokens[rows.to(probe.tokens.device)]
        reference = None
        if metric.needs_clean:
            with torch.no_grad():
                reference = _read_out(model, tokens, metric, [], L)
        b, T = tokens.shape
        gates = [torch.ones(b, T, H, device=tokens.device, requires_grad=True) for _ in range(L)]
        with frozen(model):
            value = _gated_forward(model, tokens, metric, abl, gates, base_mask, rows, reference)
            grads = torch.autograd.grad(metric.badness(value).sum(), gates, allow_unused=True)
        for l, g in enumerate(grads):
            if g is not None:
                total[l] += g.detach().abs().sum((0, 1)).double().cpu()
        count += b * T
        values.append(value.detach().cpu())
    imp = (total / count).float()
    if normalize:
        imp = imp / imp.norm(dim=-1, keepdim=True).clamp_min(1e-20)
    imp[base_mask] = float("nan")
    return HeadScores.from_grids(
        {"importance": imp},
        _scores_meta(
            model,
            probe,
            metric,
            abl,
            method="gradient",
            normalized=normalize,
            metric_value=float(torch.cat(values).mean()),
            base=_labels(base_mask),
        ),
    )


# --------------------------------------------------------------------------------------------
# pruning curves


def spearman(a: Any, b: Any) -> float:
    """Spearman rank correlation (average ranks for ties), NaN pairs dropped."""
    frame = pd.DataFrame({"a": np.asarray(a, dtype=float).ravel(), "b": np.asarray(b, dtype=float).ravel()}).dropna()
    return float(frame["a"].rank().corr(frame["b"].rank()))


def _order_from(scores: HeadScores | Tensor | np.ndarray, alive: Tensor) -> list[tuple[int, int]]:
    """Alive heads from least to most important (ties: layer, then head)."""
    grid = torch.as_tensor(
        scores.grid("importance") if isinstance(scores, HeadScores) else np.asarray(scores), dtype=torch.float64
    )
    heads = [(float(grid[l, h]), l, h) for l, h in alive.nonzero().tolist()]
    heads.sort(key=lambda t: (math.inf if math.isnan(t[0]) else t[0], t[1], t[2]))
    return [(l, h) for _, l, h in heads]


def _importance(
    order: str,
    model: Any,
    probe: TokenProbe,
    metric: Metric,
    abl: HeadAblation,
    base: Tensor,
    engine: str,
    minibatch: int | None,
    seed: int,
) -> HeadScores | Tensor:
    info = describe(model)
    if order == "gradient":
        return gradient_importance(model, probe, metric, ablation=abl, base=base, minibatch=minibatch)
    if order == "exact":
        scores = exact_sweep(model, probe, metric, ablation=abl, base=base, engine=engine, minibatch=minibatch)
        if scores.meta.get("partial"):  # an order from a partial sweep is no order: stop the curve here
            raise KeyboardInterrupt
        return scores
    if order == "random":
        return torch.rand(info.n_layers, info.n_heads, generator=torch.Generator().manual_seed(seed))
    raise AblationError(f"unknown order {order!r}: choose from {list(ORDERS)}")


def pruning_curve(
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    order: str | HeadScores | Tensor = "gradient",
    *,
    ablation: str | HeadAblation = "zero",
    step: float = 0.1,
    reestimate: bool = False,
    engine: str = "auto",
    minibatch: int | None = None,
    seed: int = 0,
    label: str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Prune heads in increasing order of importance, ``step`` (a fraction of all heads) at a time.

    ``order`` is ``"gradient"``, ``"exact"``, ``"random"`` (seeded by ``seed``) or a table/grid of
    importances. With ``reestimate`` the importance is recomputed on the pruned model after every
    step (not for ``random`` or a given table). Returns a tidy frame, a row per step: ``order``,
    ``seed``, ``step``, ``n_pruned``, ``frac_pruned``, ``metric``, ``degradation`` (how much worse
    than unpruned, as a fraction), ``removed`` (the heads removed at that step). On Ctrl-C the steps
    done are returned, with ``frame.attrs["partial"] = True``.
    """
    metric = as_metric(metric)
    if not 0 < step <= 1:
        raise AblationError(f"step must be a fraction in (0, 1], got {step}")
    info = describe(model)
    L, H = info.n_layers, info.n_heads
    n_total = L * H
    per_step = max(1, round(step * n_total))
    abl = (
        ablation
        if isinstance(ablation, HeadAblation)
        else HeadAblation.fit(model, ablation, probe, seed=seed, minibatch=minibatch)
    )
    name = label or (order if isinstance(order, str) else "given")
    sweeper = Sweeper(model, probe, metric, ablation=abl, engine=engine, minibatch=minibatch)
    clean = float(sweeper.clean.mean())
    rows: list[dict[str, Any]] = [
        dict(order=name, seed=seed, step=0, n_pruned=0, frac_pruned=0.0, metric=clean, degradation=0.0, removed="")
    ]
    static = not reestimate or not isinstance(order, str) or order == "random"
    pruned = torch.zeros(L, H, dtype=torch.bool)
    partial = False
    try:
        if static:
            scores = (
                _importance(order, model, probe, metric, abl, pruned, engine, minibatch, seed)
                if isinstance(order, str)
                else order
            )
            ranked = _order_from(scores, ~pruned)
            masks, removed = [], []
            for k0 in range(0, n_total, per_step):
                k = min(k0 + per_step, n_total)
                mask = torch.zeros(L, H, dtype=torch.bool)
                for l, h in ranked[:k]:
                    mask[l, h] = True
                masks.append(mask)
                removed.append(ranked[k0:k])
            values = sweeper.evaluate(torch.stack(masks), desc=f"pruning ({name})").mean(1)
            partial = sweeper.interrupted
            for i, (mask, gone, v) in enumerate(zip(masks, removed, values.tolist())):
                if math.isnan(v):
                    break
                rows.append(_curve_row(name, seed, i + 1, mask, n_total, v, clean, metric, gone))
        else:
            for i in tqdm(
                range(math.ceil(n_total / per_step)), desc=f"pruning ({name}, re-estimated)", disable=not progress
            ):
                scores = _importance(order, model, probe, metric, abl, pruned, engine, minibatch, seed)
                gone = _order_from(scores, ~pruned)[:per_step]
                for l, h in gone:
                    pruned[l, h] = True
                v = float(sweeper.evaluate(pruned[None]).mean())
                if sweeper.interrupted:
                    raise KeyboardInterrupt
                rows.append(_curve_row(name, seed, i + 1, pruned, n_total, v, clean, metric, gone))
    except KeyboardInterrupt:
        partial = True
    frame = pd.DataFrame(rows)
    frame.attrs.update(
        metric=metric.name, ablation=abl.kind, reestimate=reestimate and not static, clean_metric=clean, partial=partial
    )
    return frame


def _curve_row(
    name: str,
    seed: int,
    step: int,
    mask: Tensor,
    n_total: int,
    value: float,
    clean: float,
    metric: Metric,
    gone: Sequence[tuple[int, int]],
) -> dict[str, Any]:
    n = int(mask.sum())
    return dict(
        order=name,
        seed=seed,
        step=step,
        n_pruned=n,
        frac_pruned=n / n_total,
        metric=value,
        degradation=float(metric.degradation(value, clean)),
        removed=" ".join(f"{l}.{h}" for l, h in gone),
    )


def pruning_curves(
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    *,
    orders: Sequence[str] = ORDERS,
    random_seeds: Sequence[int] = (0, 1, 2),
    **kwargs: Any,
) -> pd.DataFrame:
    """:func:`pruning_curve` for several orders (random once per seed), stacked into one frame."""
    frames = []
    for order in orders:
        for seed in random_seeds if order == "random" else [kwargs.get("seed", 0)]:
            kw = {**kwargs, "seed": seed}
            frame = pruning_curve(model, probe, metric, order, **kw)
            frame["label"] = f"random (seed {seed})" if order == "random" else order
            frames.append(frame)
            if frame.attrs.get("partial"):
                break
        if frames and frames[-1].attrs.get("partial"):
            break
    out = pd.concat(frames, ignore_index=True)
    out.attrs = dict(frames[0].attrs, partial=any(f.attrs.get("partial") for f in frames))
    return out


def heads_prunable(curves: pd.DataFrame, tolerance: float = 0.1) -> pd.DataFrame:
    """Per curve: how many heads were pruned at the last step before the metric first degraded by more
    than ``tolerance`` (a fraction of the unpruned metric)."""
    if tolerance < 0:
        raise AblationError(f"tolerance must be >= 0, got {tolerance}")
    keys = ["label"] if "label" in curves else ["order", "seed"]
    rows = []
    for key, part in curves.sort_values("step", kind="mergesort").groupby(keys, sort=False):
        over = part["degradation"] > tolerance
        ok = part[~over.cumsum().astype(bool)]
        last = ok.iloc[-1] if len(ok) else part.iloc[0]
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                "n_prunable": int(last["n_pruned"]),
                "frac_prunable": float(last["frac_pruned"]),
                "tolerance": tolerance,
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Voita et al.'s Hard-Concrete gates


def gate_sample(log_alpha: Tensor, shape: Sequence[int], generator: torch.Generator | None = None) -> Tensor:
    """A stochastic Hard-Concrete gate in [0, 1] per head, for every leading index in ``shape``."""
    lo, hi = GATE_STRETCH
    u = torch.rand(*shape, *log_alpha.shape, generator=generator).clamp(1e-6, 1 - 1e-6).to(log_alpha.device)
    s = torch.sigmoid((u.log() - (1 - u).log() + log_alpha) / GATE_TEMPERATURE)
    return (s * (hi - lo) + lo).clamp(0, 1)


def gate_open_probability(log_alpha: Tensor) -> Tensor:
    """``P(gate != 0)``, the summands of Voita et al.'s L_C penalty."""
    lo, hi = GATE_STRETCH
    return torch.sigmoid(log_alpha - GATE_TEMPERATURE * math.log(-lo / hi))


def gate_value(log_alpha: Tensor) -> Tensor:
    """The deterministic gate used at evaluation (before binarising)."""
    lo, hi = GATE_STRETCH
    return (torch.sigmoid(log_alpha) * (hi - lo) + lo).clamp(0, 1)


@dataclass
class GateSweep:
    """Gates trained for each lambda: ``summary`` a row per lambda, ``gates`` a row per (lambda, head)."""

    summary: pd.DataFrame
    gates: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def kept(self, lam: float) -> list[str]:
        part = self.gates[(self.gates["lambda"] == lam) & self.gates["kept"]]
        return part["label"].tolist()

    def grids(self) -> HeadScores:
        """The binarised-before gate values as one HeadScores column per lambda (for a heatmap)."""
        grids = {}
        for lam, part in self.gates.groupby("lambda", sort=True):
            grid = np.zeros((int(part["layer"].max()) + 1, int(part["head"].max()) + 1))
            grid[part["layer"], part["head"]] = part["gate"]
            grids[f"lambda={lam:g}"] = grid
        return HeadScores.from_grids(grids, self.meta)


def train_gates(
    model: Any,
    probe: TokenProbe,
    metric: Metric | Callable,
    lambdas: Iterable[float],
    *,
    ablation: str | HeadAblation = "zero",
    steps: int = 200,
    lr: float = 0.05,
    init: float = 3.0,
    minibatch: int | None = None,
    engine: str = "auto",
    seed: int = 0,
    progress: bool = False,
) -> GateSweep:
    """Train Voita et al.'s input-independent Hard-Concrete head gates, once per lambda.

    Every head's output is mixed as ``r + g (z - r)`` (``r`` the ablated value, 0 for zero
    ablation), ``g`` a Hard-Concrete gate (temperature 0.33, stretch (-0.1, 1.1)) with one learnt
    ``log_alpha`` per head and a fresh sample per sequence. The loss is the metric's loss (mean over
    sequences) plus ``lambda * L_C``, ``L_C = sum_h P(g_h != 0)``; only the gates train (Adam,
    ``lr``, ``steps`` steps over the probe's minibatches), the model is frozen. At evaluation a head
    is kept when its deterministic gate exceeds 0.5, and the metric is measured with the other heads
    ablated. On Ctrl-C the lambdas finished are returned (``meta["partial"] = True``).
    """
    lambdas = [float(x) for x in lambdas]
    if not lambdas:
        raise AblationError("give at least one lambda")
    bad = [x for x in lambdas if not x >= 0 or not math.isfinite(x)]
    if bad:
        raise AblationError(f"lambda must be a finite number >= 0, got {bad[0]}")
    if steps < 1:
        raise AblationError(f"steps must be >= 1, got {steps}")
    metric = as_metric(metric)
    info = describe(model)
    L, H = info.n_layers, info.n_heads
    abl = (
        ablation
        if isinstance(ablation, HeadAblation)
        else HeadAblation.fit(model, ablation, probe, seed=seed, minibatch=minibatch)
    )
    sweeper = Sweeper(model, probe, metric, ablation=abl, engine=engine, minibatch=minibatch)
    clean = float(sweeper.clean.mean())
    refs = [(b.rows, b.tokens, b.reference) for b in sweeper._batches]
    none = torch.zeros(L, H, dtype=torch.bool)
    summary, per_head = [], []
    partial = False
    try:
        for lam in tqdm(lambdas, desc="gates", disable=not progress):
            gen = torch.Generator().manual_seed(seed)
            log_alpha = torch.full((L, H), init, device=probe.tokens.device, requires_grad=True)
            opt = torch.optim.Adam([log_alpha], lr=lr)
            with frozen(model):
                for it in range(steps):
                    rows, tokens, reference = refs[it % len(refs)]
                    g = gate_sample(log_alpha, (tokens.shape[0],), gen)  # [batch, layer, head]
                    gates = [g[:, l] for l in range(L)]
                    value = _gated_forward(model, tokens, metric, abl, gates, none, rows, reference)
                    loss = metric.badness(value).mean() + lam * gate_open_probability(log_alpha).sum()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            la = log_alpha.detach().cpu()
            gate, p_open = gate_value(la), gate_open_probability(la)
            kept = gate > 0.5
            dropped = ~kept
            v = float(sweeper.evaluate(dropped[None]).mean()) if bool(dropped.any()) else clean
            if sweeper.interrupted:
                raise KeyboardInterrupt
            summary.append(
                dict(
                    **{"lambda": lam},
                    heads_kept=int(kept.sum()),
                    metric=v,
                    degradation=float(metric.degradation(v, clean)),
                    clean_metric=clean,
                    l0_penalty=float(p_open.sum()),
                )
            )
            for l in range(L):
                for h in range(H):
                    per_head.append(
                        {
                            "lambda": lam,
                            "layer": l,
                            "head": h,
                            "label": f"{l}.{h}",
                            "log_alpha": float(la[l, h]),
                            "p_open": float(p_open[l, h]),
                            "gate": float(gate[l, h]),
                            "kept": bool(kept[l, h]),
                        }
                    )
    except KeyboardInterrupt:
        partial = True
    meta = _scores_meta(
        model,
        probe,
        metric,
        abl,
        method="gates",
        clean_metric=clean,
        steps=steps,
        lr=lr,
        init=init,
        temperature=GATE_TEMPERATURE,
        stretch=list(GATE_STRETCH),
        partial=partial,
    )
    return GateSweep(
        pd.DataFrame(summary, columns=["lambda", "heads_kept", "metric", "degradation", "clean_metric", "l0_penalty"]),
        pd.DataFrame(per_head, columns=["lambda", "layer", "head", "label", "log_alpha", "p_open", "gate", "kept"]),
        meta,
    )


def largest_lambda_within(sweep: GateSweep, tolerance: float = 0.1) -> float | None:
    """The largest lambda whose binarised gates keep the metric within ``tolerance`` of unpruned."""
    ok = sweep.summary[sweep.summary["degradation"] <= tolerance]
    return float(ok["lambda"].max()) if len(ok) else None
