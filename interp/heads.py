"""Per-head scores: previous-token, duplicate-token, induction (prefix matching) and copying.

Definitions (``A`` is a head's attention pattern, rows are queries ``q``, columns keys ``k``; every
row sums to 1):

- **previous-token**: mean of ``A[q, q-1]`` over the probe's body queries (positions >= 1).
- **duplicate-token**: over the queries whose token occurred before (any other occurrence, for
  encoders), the mean of the attention mass on those earlier occurrences.
- **induction** (prefix matching, Olsson et al. 2022): over exactly the queries that *have* an
  induction target, the mean of the attention mass on the positions right after earlier
  occurrences of the current token. Queries without a target (the first repeat) do not count, so a
  perfect induction head scores 1.0, not ``(n_repeats - 1) / n_repeats``.
- **copying** (Olsson et al.'s positive-eigenvalue score): the head's full OV circuit read through
  the embedding and unembedding, ``F = W_E W_V W_O W_U`` (a ``d_vocab x d_vocab`` map from an
  attended token to the logits it writes), scored as ``sum(lambda) / sum(|lambda|)`` over F's
  eigenvalues ``lambda``. It is +1 when the head only ever raises the logit of the token it attends
  to (pure copying), -1 for pure anti-copying, near 0 for a random map. The non-zero eigenvalues of
  ``F`` are those of the small ``d_head x d_head`` matrix ``W_O W_U W_E W_V``, which is what we
  diagonalise. LayerNorm scales are not folded in (fold them first, e.g. the bridge's
  ``enable_compatibility_mode()``, if they matter to you). Input-independent: it has no CI.

Each attention score carries a bootstrap interval over probe sequences. Scores are reduced inside
the ``hook_pattern`` hook, layer by layer, and the forward pass stops after the last layer's
pattern: nothing after the last attention softmax is computed, and no pattern outlives its layer.

With ``queries="all"`` the three attention scores instead average over *every* query position (a
row without a target contributes 0), which is exactly TransformerLens ``detect_head``'s ``"mul"``
measure; the tests use this to check our numbers against the peer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import einops
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp import distributed
from interp.errors import NonFiniteAttentionError, UsageError
from interp.hooks import layer_of, pattern_hook, run_with_reducers
from interp.models import describe
from interp.probes import TokenProbe, repeated_tokens
from interp.scores import HeadScores, bootstrap_ratio
from interp.stream.budget import PATTERN_BUDGET, choose_engine

ATTENTION_SCORES = ("prev_token", "duplicate", "induction")


def _targets(probe: TokenProbe, queries: str) -> dict[str, Float[Tensor, "batch q k"]]:
    """The ``[batch, q, k]`` 0/1 target masks of the three attention scores."""
    n = probe.seq_len
    prev = torch.zeros(probe.batch, n, n, dtype=torch.bool, device=probe.tokens.device)
    rows = torch.arange(1, n, device=probe.tokens.device)
    prev[:, rows, rows - 1] = probe.prev_query_mask()[:, 1:] if queries == "targets" else True
    masks = {"prev_token": prev, "duplicate": probe.duplicate_mask(), "induction": probe.induction_mask()}
    return {k: v.float() for k, v in masks.items()}


def _query_counts(targets: dict[str, Tensor], queries: str, n: int) -> dict[str, Tensor]:
    """Per-sequence denominators: how many queries each score averages over."""
    if queries == "all":
        return {k: torch.full((m.shape[0],), float(n), device=m.device) for k, m in targets.items()}
    return {k: m.amax(-1).sum(-1) for k, m in targets.items()}


def attention_scores(
    model: Any,
    probe: TokenProbe,
    *,
    scores: Sequence[str] = ATTENTION_SCORES,
    queries: Literal["targets", "all"] = "targets",
    minibatch: int | None = None,
    progress: bool = False,
    engine: Literal["pattern", "stream"] = "pattern",
) -> tuple[dict[str, Float[Tensor, "batch layer head"]], dict[str, Float[Tensor, "batch layer head"]]]:
    """Per-sequence numerators and denominators of the attention scores, for every head.

    Only ``blocks.{l}.attn.hook_pattern`` is captured; each pattern is reduced to ``[batch, head]``
    numbers inside its hook, and the pass stops after the last layer's pattern. ``engine="stream"``
    gathers the same weights from q, k and the log-sum-exp instead (:mod:`interp.stream`).
    """
    unknown = set(scores) - set(ATTENTION_SCORES)
    if unknown:
        raise UsageError(f"unknown score(s) {sorted(unknown)}: choose from {list(ATTENTION_SCORES)}")
    if queries not in ("targets", "all"):
        raise UsageError(f"queries must be 'targets' or 'all', got {queries!r}")
    info = describe(model)
    if probe.seq_len > info.n_ctx:
        raise UsageError(f"probe of {probe.seq_len} tokens is longer than the model's context of {info.n_ctx}")
    if engine == "stream":
        from interp.stream.engine import stream_attention_scores

        return stream_attention_scores(model, probe, scores, queries, minibatch=minibatch, progress=progress)
    if engine != "pattern":
        raise UsageError(f"unknown engine {engine!r}: use 'pattern' or 'stream'")
    targets = {k: v for k, v in _targets(probe, queries).items() if k in scores}
    counts = _query_counts(targets, queries, probe.seq_len)
    if queries == "targets":
        for name, c in counts.items():
            if float(c.sum()) == 0:
                raise UsageError(f"the probe has no query with a {name} target: use at least 2 repeats")
    L, H, B = info.n_layers, info.n_heads, probe.batch
    num = {k: torch.zeros(B, L, H) for k in targets}
    den = {k: torch.zeros(B, L, H) for k in targets}
    step = minibatch or B
    chunks = range(0, B, step)
    for start in tqdm(chunks, desc="scoring heads", disable=not progress or len(chunks) == 1):
        sl = slice(start, start + step)
        chunk_targets = {k: v[sl] for k, v in targets.items()}

        def reduce(pattern: Float[Tensor, "batch head q k"], hook: Any) -> None:
            layer = layer_of(hook)
            pattern = pattern.detach().float()
            if not torch.isfinite(pattern).all():
                raise NonFiniteAttentionError(
                    f"layer {layer}: the attention pattern holds NaN or inf; the model is unstable "
                    f"in {info.name}'s dtype on this input: try --dtype float32"
                )
            for name, mask in chunk_targets.items():
                mask = mask.to(pattern.device)  # blocks may live on different devices
                num[name][sl, layer] = einops.einsum(pattern, mask, "b h q k, b q k -> b h").cpu()
                if queries == "all":  # detect_head divides by the pattern's total mass
                    den[name][sl, layer] = einops.reduce(pattern, "b h q k -> b h", "sum").cpu()

        run_with_reducers(
            model,
            probe.tokens[sl],
            [(pattern_hook(l), reduce) for l in range(L)],
            stop_after=pattern_hook(L - 1),
        )
    if queries == "targets":
        for name in den:
            den[name][:] = counts[name].cpu()[:, None, None]
    return num, den


def copying_scores(model: Any) -> Float[Tensor, "layer head"]:
    """Olsson et al.'s copying score ``sum(lambda) / sum(|lambda|)`` of each head's OV circuit.

    See the module docstring for the exact definition.
    """
    info = describe(model)
    try:
        weights = [model.W_E, model.W_U, model.W_V, model.W_O]
    except NotImplementedError as e:  # TransformerLens cannot read weights offloaded to disk / meta
        raise UsageError(
            f"the copying score reads W_E, W_U, W_V and W_O, and this model's are offloaded ({e}): "
            "pass copying=False, or load the model without disk offload"
        ) from None
    with torch.no_grad():
        dev = weights[0].device  # a model spread over devices: the embedding's (the unembedding may be elsewhere)
        W_E, W_U, W_V, W_O = (w.detach().to(dev).double() for w in weights)
        W_V = _per_query_head(W_V, info.n_heads)  # [layer, head, d_model, d_head]
        W_O = _per_query_head(W_O, info.n_heads)  # [layer, head, d_head, d_model]
        vocab = min(W_E.shape[0], W_U.shape[1])
        UE = W_U[:, :vocab] @ W_E[:vocab]  # [d_model, d_model]
        small = W_O @ UE @ W_V  # [layer, head, d_head, d_head]: same non-zero spectrum as F
        eig = torch.linalg.eigvals(small)
        score = eig.real.sum(-1) / eig.abs().sum(-1).clamp_min(1e-30)
    return score.float()


def _per_query_head(w: Tensor, n_heads: int) -> Tensor:
    """Expand grouped (GQA/MQA) K/V weights to one slice per query head, by index."""
    if w.shape[1] == n_heads:
        return w
    return w.repeat_interleave(n_heads // w.shape[1], dim=1)


def head_scores(
    model: Any,
    probe: TokenProbe | None = None,
    *,
    scores: Sequence[str] = ATTENTION_SCORES,
    copying: bool = True,
    queries: Literal["targets", "all"] = "targets",
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    minibatch: int | None = None,
    progress: bool = False,
    engine: str = "auto",
    budget: int = PATTERN_BUDGET,
) -> HeadScores:
    """Score every head of ``model`` as previous-token, duplicate-token, induction and copying head.

    ``probe`` defaults to ``repeated_tokens(model, seed=seed)`` (10 sequences, 50 tokens x 2).
    Returns a :class:`HeadScores` with columns ``prev_token``, ``duplicate``, ``induction`` (each
    with ``_lo``/``_hi`` bootstrap bounds at ``level``) and ``copying``.

    ``engine``: ``"pattern"`` reduces each layer's pattern in its hook; ``"stream"`` never forms it
    (memory linear in the probe's length, same numbers to float rounding); ``"auto"`` streams when
    one layer's pattern for a forward pass would exceed ``budget`` bytes. ``meta["engine"]`` says
    which ran and why.
    """
    if probe is None:
        probe = repeated_tokens(model, seed=seed)
    info = describe(model)
    engine, why = choose_engine(engine, model, min(minibatch or probe.batch, probe.batch), probe.seq_len, budget)
    num, den = distributed.map_sequences(  # under torchrun: each rank scores its block of sequences
        lambda p: attention_scores(
            model,
            p,
            scores=scores,
            queries=queries,
            minibatch=minibatch,
            progress=progress and distributed.is_main(),
            engine=engine,
        ),
        probe,
        what="scoring heads",
    )
    grids: dict[str, Tensor] = {}
    for name in scores:
        point, lo, hi = bootstrap_ratio(num[name], den[name], n_boot=n_boot, level=level, seed=seed)
        grids.update({name: point, f"{name}_lo": lo, f"{name}_hi": hi})
    if copying:
        grids["copying"] = copying_scores(model)
    meta = {
        "model": info.name,
        "n_layers": info.n_layers,
        "n_heads": info.n_heads,
        "causal": info.is_causal,
        "probe": probe.meta,
        "queries": queries,
        "ci_level": level,
        "n_boot": n_boot,
        "seed": seed,
        "engine": engine,
        "engine_reason": why,
    }
    return HeadScores.from_grids(grids, meta)


def uniform_baseline(probe: TokenProbe) -> float:
    """Expected induction score of a head that attends uniformly over the keys it may see.

    A causal query at ``q`` spreads ``1 / (q + 1)`` over its keys, so its induction mass is
    ``(#targets) / (q + 1)``; averaged over the queries that have a target. Random-weight models
    sit near this value, which is the floor any claim of an induction head must clear.
    """
    b, q, _ = probe.induction_pairs().unbind(-1)  # index rows, no [q, k] mask: fine at long context
    targets = torch.zeros(probe.batch, probe.seq_len).index_put_((b, q), torch.ones(len(b)), accumulate=True)
    n_keys = (
        torch.arange(1, probe.seq_len + 1).float()
        if probe.causal
        else torch.full((probe.seq_len,), float(probe.seq_len))
    )
    per_q = targets / n_keys
    has = targets > 0
    return float(per_q[has].mean())
