"""Per-head scores: previous-token, current-token, duplicate-token, induction (prefix matching) and copying.

Definitions (``A`` is a head's attention pattern, rows are queries ``q``, columns keys ``k``; every
row sums to 1):

- **previous-token**: mean of ``A[q, q-1]`` over the probe's body queries (positions >= 1).
- **current-token**: mean of ``A[q, q]`` (the query's own position) over the probe's body queries.
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

The stream engine (``engine="stream"``) reduces the same sums without any pattern: one row pass
gives each query row's log-sum-exp, and each score's weights are gathered at its ``(batch, q, k)``
target pairs (:mod:`interp.stream` runs the model and the passes; the reduction is here, beside the
pattern one).

Each attention score is registered once in :data:`SCORES` with its target pairs (the stream
engine's), its ``[batch, q, k]`` target mask (the pattern engine's) and its description; its uniform
baseline is read from the pairs. :data:`ATTENTION_SCORES` is the tuple of their names.

With ``queries="all"`` the three attention scores instead average over *every* query position (a
row without a target contributes 0), which is exactly TransformerLens ``detect_head``'s ``"mul"``
measure; the tests use this to check our numbers against the peer.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

import interp.distributed as distributed
from interp.adapters import AttentionInputs, HookedModel, ModelInfo, describe, run_with_reducers
from interp.adapters.weights import per_query_head
from interp.config import RunConfig, run_header
from interp.errors import InterpError, NonFiniteAttentionError, UsageError
from interp.hooks import layer_of, pattern_hook
from interp.probes import TokenProbe, repeated_tokens
from interp.progress import tqdm
from interp.registry import Registry
from interp.scores import HeadScores, bootstrap_ratio, interval_notes
from interp.stream.budget import choose_engine
from interp.stream.driver import check_finite, gather_pass, row_pass, run_streamed

Queries = Literal["targets", "all"]


# --------------------------------------------------------------------------------------------
# the registry: each attention score once, with its targets


@dataclass(frozen=True)
class HeadScore:
    """Where an attention score looks: its targets as index rows and as a mask (the same set)."""

    pairs: Callable[[TokenProbe, Queries], Int[Tensor, "n 3"]]  # (batch, q, k) rows: the stream engine's
    mask: Callable[[TokenProbe, Queries], Bool[Tensor, "batch q k"]]  # the pattern engine's

    def uniform_baseline(self, probe: TokenProbe) -> float:
        """What a head attending uniformly over the keys it may see scores (see :func:`uniform_baselines`)."""
        return _uniform_mass(self.pairs(probe, "targets"), probe)


SCORES: Registry[HeadScore] = Registry("head score")

QUERIES: Registry[str] = Registry("query set")
QUERIES.add("targets", "the queries that have a target for the score (a perfect head scores 1)")
QUERIES.add("all", "every query position, a row without a target counting 0 (TransformerLens detect_head's 'mul')")


def _prev_mask(probe: TokenProbe, queries: Queries) -> Bool[Tensor, "batch q k"]:
    n = probe.seq_len
    prev = torch.zeros(probe.batch, n, n, dtype=torch.bool, device=probe.tokens.device)
    rows = torch.arange(1, n, device=probe.tokens.device)
    prev[:, rows, rows - 1] = probe.prev_query_mask()[:, 1:] if queries == "targets" else True
    if probe.padded:  # a padded row's queries are its real tokens past its first
        prev &= ((probe.real_index() >= 1) & probe.real_mask())[:, :, None]
    return prev


SCORES.add(
    "prev_token",
    "attention on the previous position",
    HeadScore(
        pairs=lambda probe, queries: probe.prev_pairs(every_query=queries == "all"),
        mask=_prev_mask,
    ),
)


def _current_pairs(probe: TokenProbe, queries: Queries) -> Int[Tensor, "n 3"]:
    if probe.padded:  # rows differ: each row's own body (or every real query)
        rows = probe.body_mask() if queries == "targets" else probe.real_mask()
        b, q = rows.cpu().nonzero().unbind(-1)
        return torch.stack([b, q, q], -1)
    q = torch.arange(probe.seq_len)
    if queries == "targets":
        q = q[(q >= probe.body_start) & (q < probe.body_end)]
    b = torch.arange(probe.batch).repeat_interleave(len(q))
    q = q.repeat(probe.batch)
    return torch.stack([b, q, q], -1)


def _current_mask(probe: TokenProbe, queries: Queries) -> Bool[Tensor, "batch q k"]:
    n = probe.seq_len
    mask = torch.zeros(probe.batch, n, n, dtype=torch.bool, device=probe.tokens.device)
    b, q, k = _current_pairs(probe, queries).to(probe.tokens.device).unbind(-1)
    mask[b, q, k] = True
    return mask


SCORES.add(
    "current",
    "attention on the query's own position",
    HeadScore(pairs=_current_pairs, mask=_current_mask),
)
SCORES.add(
    "duplicate",
    "attention on earlier occurrences of the current token",
    HeadScore(pairs=lambda probe, _: probe.duplicate_pairs(), mask=lambda probe, _: probe.duplicate_mask()),
)
SCORES.add(
    "induction",
    "attention on the positions right after earlier occurrences of the current token",
    HeadScore(pairs=lambda probe, _: probe.induction_pairs(), mask=lambda probe, _: probe.induction_mask()),
)

ATTENTION_SCORES = SCORES.names()


# --------------------------------------------------------------------------------------------
# uniform baselines: the chance level of every registered score


def _uniform_mass(pairs: Int[Tensor, "n 3"], probe: TokenProbe) -> float:
    """Mean over the queries with a target of the mass a uniform head puts on the targets.

    A causal query at ``q`` spreads ``1 / (q + 1)`` over its keys (an encoder's ``1 / T``), so its
    mass on the targets is ``(#targets) / (q + 1)``. Read from the ``(batch, q, k)`` pairs, never a
    ``[q, k]`` mask, so long probes stay cheap. NaN when no query has a target.
    """
    n = probe.seq_len
    targets = torch.zeros(probe.batch, n).index_put_(
        (pairs[:, 0], pairs[:, 1]), torch.ones(len(pairs)), accumulate=True
    )
    keys: Float[Tensor, "batch q"]
    if probe.padded:  # the keys a query sees in its text alone
        index, lengths = probe.real_index().cpu(), probe.lengths().cpu()
        keys = (index + 1).clamp_min(1).float() if probe.causal else lengths[:, None].expand(-1, n).float()
    else:
        keys = torch.arange(1, n + 1).float() if probe.causal else torch.full((n,), float(n))
    per_query = targets / keys
    has = targets > 0
    return float(per_query[has].mean()) if bool(has.any()) else float("nan")


def uniform_baselines(probe: TokenProbe) -> dict[str, float]:
    """What a head attending uniformly over the keys it may see scores on ``probe``, per registered score.

    Random-weight models sit near these values, the floor any claim of a head's role must clear.
    """
    return {name: SCORES.get(name).uniform_baseline(probe) for name in SCORES}


def uniform_baseline(probe: TokenProbe) -> float:
    """Expected induction score of a head that attends uniformly over the keys it may see.

    A causal query at ``q`` spreads ``1 / (q + 1)`` over its keys, so its induction mass is
    ``(#targets) / (q + 1)``; averaged over the queries that have a target. Random-weight models
    sit near this value, which is the floor any claim of an induction head must clear.
    """
    return SCORES.get("induction").uniform_baseline(probe)


# --------------------------------------------------------------------------------------------
# the two reductions: the pattern engine and the stream engine


def _query_counts(targets: dict[str, Tensor], queries: str, n: int) -> dict[str, Tensor]:
    """Per-sequence denominators: how many queries each score averages over."""
    if queries == "all":
        return {k: torch.full((m.shape[0],), float(n), device=m.device) for k, m in targets.items()}
    return {k: m.amax(-1).sum(-1) for k, m in targets.items()}


def attention_scores(
    model: HookedModel,
    probe: TokenProbe,
    *,
    scores: Sequence[str] = ATTENTION_SCORES,
    queries: Queries = "targets",
    config: RunConfig | None = None,
    registry: Registry[HeadScore] = SCORES,
) -> tuple[dict[str, Float[Tensor, "batch layer head"]], dict[str, Float[Tensor, "batch layer head"]]]:
    """Per-sequence numerators and denominators of the attention scores, for every head.

    Only ``blocks.{l}.attn.hook_pattern`` is captured; each pattern is reduced to ``[batch, head]``
    numbers inside its hook, and the pass stops after the last layer's pattern. ``engine="stream"``
    gathers the same weights from q, k and the log-sum-exp instead (:func:`stream_attention_scores`);
    ``"auto"`` (``config``'s default) chooses by the pattern's size
    (:func:`~interp.stream.budget.choose_engine`). ``config`` gives the engine, the minibatch and
    progress. ``registry``: where the score names are looked up (another analysis's own
    :class:`HeadScore` registrations, e.g. :mod:`interp.roles.encoder`'s).
    """
    scores = registry.check_all(scores)
    _check_queries(queries)
    cfg = RunConfig.of(config)
    minibatch, progress = cfg.minibatch, cfg.progress
    info = describe(model)
    if probe.seq_len > info.n_ctx:
        raise UsageError(f"probe of {probe.seq_len} tokens is longer than the model's context of {info.n_ctx}")
    engine, _ = choose_engine(cfg.engine, model, min(minibatch or probe.batch, probe.batch), probe.seq_len, cfg.budget)
    if engine == "stream":
        return stream_attention_scores(model, probe, scores, queries, config=cfg, registry=registry)
    targets = {name: registry.get(name).mask(probe, queries).float() for name in registry if name in scores}
    counts = _query_counts(targets, queries, probe.seq_len)  # a score no query has a target for: 0 / 0
    L, H, B = info.n_layers, info.n_heads, probe.batch
    real = probe.real_mask()  # padded query rows are dropped before any reduction
    num = {k: _absent_nan(torch.zeros(B, L, H), info) for k in targets}
    den = {k: torch.zeros(B, L, H) for k in targets}
    step = minibatch or B
    chunks = range(0, B, step)
    sizes = f"{L * H} heads x {B} sequences of {probe.seq_len} tokens, {len(chunks)} chunks"
    for start in tqdm(chunks, desc="scoring heads", disable=not progress or len(chunks) == 1, sizes=sizes):
        sl = slice(start, start + step)
        chunk_targets = {k: v[sl] for k, v in targets.items()}
        chunk_mask = probe.attention_mask[sl] if probe.padded else None

        def reduce(pattern: Float[Tensor, "batch head q k"], hook: Any) -> None:
            layer = layer_of(hook)
            pattern = pattern.detach().float()
            if chunk_mask is not None:
                pattern = torch.where(real[sl].to(pattern.device)[:, None, :, None], pattern, 0.0)
            check_finite(pattern, layer, info.name)
            for name, mask in chunk_targets.items():
                mask = mask.to(pattern.device)  # blocks may live on different devices
                num[name][sl, layer] = einops.einsum(pattern, mask, "b h q k, b q k -> b h").cpu()
                if queries == "all":  # detect_head divides by the pattern's total mass
                    den[name][sl, layer] = einops.reduce(pattern, "b h q k -> b h", "sum").cpu()

        run_with_reducers(
            model,
            probe.tokens[sl],
            [(pattern_hook(l), reduce) for l in info.attention_layers],
            stop_after=pattern_hook(info.attention_layers[-1]),
            attention_mask=chunk_mask,
        )
    if queries == "targets":
        for name in den:
            den[name][:] = counts[name].cpu()[:, None, None]
    return num, den


def stream_attention_scores(
    model: HookedModel,
    probe: TokenProbe,
    scores: Sequence[str],
    queries: Queries,
    *,
    config: RunConfig | None = None,
    registry: Registry[HeadScore] = SCORES,
) -> tuple[dict[str, Float[Tensor, "batch layer head"]], dict[str, Float[Tensor, "batch layer head"]]]:
    """Numerators and denominators of :func:`attention_scores`, pattern-free: each layer's row pass
    gives the log-sum-exp, and the weights at each score's target pairs are gathered from it.

    A padded probe runs with its mask (padded keys masked, positions as in each text alone); the
    target pairs never touch padding, and ``queries="all"`` counts each row's real queries.
    ``config`` gives the minibatch and progress."""
    cfg = RunConfig.of(config)
    info = describe(model)
    B, L, H = probe.batch, info.n_layers, info.n_heads
    pairs = {name: registry.get(name).pairs(probe, queries) for name in scores}
    den: dict[str, Tensor] = {}
    for name, p in pairs.items():
        if queries == "all":  # detect_head divides by the pattern's total mass: a row of mass 1 per real query
            den[name] = probe.lengths().cpu().float()[:, None, None].expand(B, L, H).clone()
            continue
        count = _queries_with_target(p, B)  # all zeros: no target on this probe, the score is NaN
        den[name] = count[:, None, None].expand(B, L, H).clone()
    num = {name: _absent_nan(torch.zeros(B, L, H), info) for name in pairs}

    def on_chunk(rows: slice) -> tuple[Callable[[AttentionInputs], None], list]:
        chunk = {}
        for name, p in pairs.items():
            p = p[(p[:, 0] >= rows.start) & (p[:, 0] < rows.stop)].clone()
            p[:, 0] -= rows.start
            chunk[name] = p

        def reduce(a: AttentionInputs) -> None:
            stats = row_pass(a)
            check_finite(stats.lse, a.layer, info.name)
            for name, p in chunk.items():
                w = gather_pass(a, stats.lse, p)
                num[name][rows, a.layer] = _per_sequence(p, w, rows.stop - rows.start)

        return reduce, []

    run_streamed(
        model,
        probe.tokens,
        cfg.minibatch,
        cfg.progress,
        "scoring heads (stream)",
        on_chunk,
        attention_mask=probe.attention_mask,
    )
    return num, den


def _absent_nan(num: Float[Tensor, "batch layer head"], info: ModelInfo) -> Tensor:
    """NaN for the heads of layers without softmax attention (they have no pattern to score)."""
    num[:, list(info.absent_layers)] = float("nan")
    return num


def _queries_with_target(pairs: Int[Tensor, "n 3"], batch: int) -> Float[Tensor, " batch"]:
    """How many distinct queries of each sequence have at least one target."""
    rows = torch.unique(pairs[:, :2], dim=0)
    return torch.zeros(batch).index_add_(0, rows[:, 0], torch.ones(len(rows)))


def _per_sequence(pairs: Int[Tensor, "n 3"], weights: Float[Tensor, "n head"], n_seqs: int) -> Tensor:
    return torch.zeros(n_seqs, weights.shape[1]).index_add_(0, pairs[:, 0], weights.cpu())


# --------------------------------------------------------------------------------------------
# copying, and everything together


def copying_scores(model: HookedModel) -> Float[Tensor, "layer head"]:
    """Olsson et al.'s copying score ``sum(lambda) / sum(|lambda|)`` of each head's OV circuit.

    See the module docstring for the exact definition.
    """
    info = describe(model)
    check_copying(info)
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
        W_V = per_query_head(W_V, info.n_heads)  # [attention layer, head, d_model, d_head]
        W_O = per_query_head(W_O, info.n_heads)  # [attention layer, head, d_head, d_model]
        vocab = min(W_E.shape[0], W_U.shape[1])
        UE = W_U[:, :vocab] @ W_E[:vocab]  # [d_model, d_model]
        small = W_O @ UE @ W_V  # [layer, head, d_head, d_head]: same non-zero spectrum as F
        eig = torch.linalg.eigvals(small)
        score = eig.real.sum(-1) / eig.abs().sum(-1).clamp_min(1e-30)
    if score.shape[0] == info.n_layers:
        return score.float()
    # a hybrid model: TransformerLens stacks the attention layers' weights only
    full = torch.full((info.n_layers, info.n_heads), float("nan"))
    full[list(info.attention_layers)] = score.float().cpu()
    return full


def check_copying(info: ModelInfo) -> None:
    """Refuse, before any work, a model whose heads have no ``W_V`` of their own to score."""
    if info.latent_attention:
        raise UsageError(f"{_no_copying(info)}: pass copying=False; the attention scores are unaffected")


def _no_copying(info: ModelInfo) -> str:
    return (
        f"the copying score reads each head's W_V and W_O, and {info.name} has multi-head latent attention "
        "(values come out of a shared compressed projection, no per-head W_V)"
    )


def validate_head_scores(*, scores: Sequence[str] = ATTENTION_SCORES, queries: str = "targets") -> None:
    """:func:`head_scores`'s options checked without a model: every name of ``scores`` registered in
    :data:`SCORES`, ``queries`` one of :data:`QUERIES`."""
    SCORES.check_all(scores)
    _check_queries(queries)


def _check_queries(queries: Any) -> None:
    if not isinstance(queries, str) or queries not in QUERIES:
        raise UsageError(f"queries= must be one of {list(QUERIES)}, got {queries!r}", params="queries")


def head_scores(
    model: HookedModel,
    probe: TokenProbe | None = None,
    *,
    scores: Sequence[str] = ATTENTION_SCORES,
    copying: bool = True,
    queries: Queries = "targets",
    config: RunConfig | None = None,
) -> HeadScores:
    """Score every head of ``model`` as previous-token, duplicate-token, induction and copying head.

    ``probe`` defaults to ``repeated_tokens(model, seed=config.seed)`` (10 sequences, 50 tokens x 2).
    Returns a :class:`HeadScores` with columns ``prev_token``, ``duplicate``, ``induction`` (each
    with ``_lo``/``_hi`` bootstrap bounds at ``config.level``) and ``copying``.

    ``config`` (a :class:`~interp.config.RunConfig`, by default ``RunConfig()``: ``n_boot=1000``,
    ``level=0.95``, ``seed=0``, the whole probe per pass, no progress, ``engine="auto"``, 1 GiB)
    holds the run settings.

    ``config.engine``: ``"pattern"`` reduces each layer's pattern in its hook; ``"stream"`` never
    forms it (memory linear in the probe's length, same numbers to float rounding); ``"auto"``
    streams when one layer's pattern for a forward pass would exceed ``config.budget`` bytes.
    ``meta["engine"]`` says which ran and why.
    """
    validate_head_scores(scores=scores, queries=queries)
    cfg = RunConfig.of(config)
    scores = list(scores)
    _check_order(model, probe)
    if probe is None:
        probe = repeated_tokens(model, seed=cfg.seed)
    info = describe(model)
    n_seqs = min(cfg.minibatch or probe.batch, probe.batch)
    engine, why = choose_engine(cfg.engine, model, n_seqs, probe.seq_len, cfg.budget)
    run = dataclasses.replace(cfg, engine=engine, progress=cfg.progress and distributed.is_main())
    num, den = distributed.map_sequences(  # under torchrun: each rank scores its block of sequences
        lambda p: attention_scores(model, p, scores=scores, queries=queries, config=run),
        probe,
        what="scoring heads",
    )
    grids, notes, ci_sequences = _attention_grids(num, den, scores, probe, cfg)
    if copying:
        grids["copying"] = _copying_column(model, info)
    meta = run_header(
        info,
        probe,
        queries=queries,
        ci_level=cfg.level,
        n_boot=cfg.n_boot,
        seed=cfg.seed,
        engine=engine,
        engine_reason=why,
    )
    meta["ci_sequences"] = ci_sequences
    try:  # what a uniform head scores: the figure's baselines and marks, recorded in every saved JSON
        meta["baselines"] = {k: v for k, v in uniform_baselines(probe).items() if k in scores}
    except (InterpError, ZeroDivisionError, ValueError):
        pass
    if notes:
        meta["notes"] = notes
    return HeadScores.from_grids(grids, meta)


def _attention_grids(
    num: dict[str, Tensor], den: dict[str, Tensor], scores: Sequence[str], probe: TokenProbe, cfg: RunConfig
) -> tuple[dict[str, Tensor], list[str], dict[str, int]]:
    """Each score's point and bootstrap bounds as ``[layer, head]`` grids, the notes on them, and
    how many sequences each interval resampled."""
    grids: dict[str, Tensor] = {}
    notes: list[str] = []
    ci_sequences: dict[str, int] = {}
    for name in scores:
        ci = bootstrap_ratio(num[name], den[name], n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
        if float(den[name].sum()) == 0:  # e.g. duplicate/induction on a prompt with no repeated token
            notes.append(no_target_note(name))
        else:
            notes.extend(interval_notes(name, ci, unit=_unit(probe)))
        ci_sequences[name] = ci.units
        grids.update({name: ci.point, f"{name}_lo": ci.lo, f"{name}_hi": ci.hi})
    return grids, notes, ci_sequences


def _copying_column(model: HookedModel, info: ModelInfo) -> Float[Tensor, "layer head"]:
    """The copying scores, or NaN with a warning for a model without per-head ``W_V`` (the rest stands)."""
    if info.latent_attention:
        warnings.warn(f"{_no_copying(info)}; its copying column is NaN", stacklevel=3)
        return torch.full((info.n_layers, info.n_heads), float("nan"))
    return copying_scores(model)


def _check_order(model: HookedModel, probe: Any) -> None:
    """``head_scores(probe, model)``: say so, rather than fail deep inside on a missing attribute."""
    if isinstance(model, TokenProbe) or (probe is not None and not isinstance(probe, TokenProbe)):
        got = ", ".join(type(x).__name__ for x in (model, probe))
        raise UsageError(
            f"head_scores takes the model first and the probe second: head_scores(model, probe), got ({got})"
        )


def _unit(probe: TokenProbe) -> str:
    """What a probe's sequences are called in a note: the user's texts, or sequences."""
    return "text" if (probe.meta or {}).get("kind") == "texts" else "sequence"


def no_target_note(name: str) -> str:
    """Why score ``name`` is NaN: no query of the probe has a target for it."""
    return f"{name}: no query of this probe has a target for this score (e.g. no token occurs twice), so it is NaN"


__all__ = [
    "ATTENTION_SCORES",
    "QUERIES",
    "SCORES",
    "HeadScore",
    "NonFiniteAttentionError",
    "attention_scores",
    "copying_scores",
    "head_scores",
    "no_target_note",
    "stream_attention_scores",
    "uniform_baseline",
    "uniform_baselines",
    "validate_head_scores",
]
