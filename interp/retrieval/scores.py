"""Retrieval heads (Wu et al. 2024), streaming heads (sink + recent window) and copy distance.

Definitions (``A`` is a head's attention pattern, ``A[b, q, k]``; the probe is a
:class:`~interp.probes.needle.NeedleProbe`, whose targets are ``(batch, query, key)`` rows; see
:mod:`interp.probes.needle` for how they are placed):

- **retrieval** (Wu et al., "Retrieval Head Mechanistically Explains Long-Context Factuality",
  teacher-forced): over the copy steps (query ``p`` whose next token is copy token ``j``, target
  key ``n + j``, the needle token being copied), the share of steps at which the target is the
  head's most-attended key, ``argmax_k A[b, p, k] == n + j``. Ties go to the lowest key index
  (``torch.argmax``), so a head that attends uniformly hits only a target at key 0, which never
  occurs. Pooled over needles: ``sum(hits) / sum(steps)``, with a percentile bootstrap interval
  that resamples *needles* (:func:`interp.scores.bootstrap_ratio` on per-needle hits and steps).
  A head is a **retrieval head** when its score is at least ``RETRIEVAL_THRESHOLD`` = 0.1, Wu et
  al.'s threshold.
- **retrieval_mass**: the mean attention on the target key over the same steps, ``A[b, p, n + j]``.
- **streaming** (StreamingLLM's sink + recent window; the heads DuoAttention, RazorAttention and
  HeadKV give a short KV cache): for every query ``q`` that sees more than ``sink + window`` keys
  (``q >= sink + window``), the mass on the first ``sink`` keys plus the last ``window`` keys
  (``q - window + 1 .. q``), averaged over those queries; pooled over sequences with a bootstrap
  interval over sequences. A head is a **streaming head** when this share is at least
  ``STREAMING_THRESHOLD`` = 0.9: at most a tenth of its attention would be lost by keeping only the
  sink and the window in its KV cache. Local heads (previous-token and the like) are streaming
  heads by this definition, as they should be for KV compression.
- **role**: ``"retrieval"`` when retrieval >= 0.1 (first: a head that retrieves needs its whole KV
  cache even if it also looks at the sink), else ``"streaming"`` when streaming >= 0.9, else
  ``"neither"``.
- **copy distance** (:func:`copy_distance_scores`, on :func:`~interp.probes.needle.copy_distance_probe`):
  per head and distance ``d``, *induction* is the mean attention mass on the copy-induction
  targets (query at copy token ``j``, key right after its earlier occurrence, ``d`` back) and
  *retrieval* is the retrieval score above restricted to needles copied from ``d`` back. The
  ``uniform`` column is the induction mass a head attending uniformly would get, the floor a curve
  falls to past a head's reach.

Engine: the pattern engine. Each layer's ``hook_pattern`` is reduced inside its hook to per-needle
and per-sequence sums, and the pass stops after the last layer's pattern; no pattern outlives its
layer. Its memory is one layer's ``[batch, head, T, T]`` pattern, so use it up to a few thousand
tokens; the stream engine (row argmax in the blockwise passes) is what reaches 32K and beyond.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

import interp.distributed as distributed
from interp.adapters import AttentionInputs, HookedModel, run_with_reducers
from interp.config import RunConfig
from interp.errors import UsageError
from interp.hooks import layer_of, pattern_hook
from interp.models import describe
from interp.probes.needle import NeedleProbe, needle_probe
from interp.progress import tqdm
from interp.scores import HeadScores, bootstrap_ratio, interval_notes
from interp.stream.blockwise import logits_tile
from interp.stream.budget import choose_engine
from interp.stream.driver import check_finite, row_pass, run_streamed
from interp.stream.passes import argmax_pass, gather_pass

RETRIEVAL_THRESHOLD = 0.1  # Wu et al. 2024
STREAMING_THRESHOLD = 0.9  # share of attention on sink + window
ROLES = ("retrieval", "streaming", "neither")
QUERY_BLOCK = 256  # queries per cumulative sum (pattern) or per band tile (stream) in the streaming share
DEFAULT_SINK = 4
MAX_WINDOW = 1024  # the window's default: min(MAX_WINDOW, seq_len // 4)


@dataclass
class RetrievalCounts:
    """Sums of one pass over a needle probe, per needle (``n``) or per sequence (``b``)."""

    hits: Float[Tensor, "needle layer head"]  # copy steps whose argmax key is the target
    mass: Float[Tensor, "needle layer head"]  # attention on the target, summed over the steps
    steps: Float[Tensor, " needle"]  # copy steps per needle (needle_len - 1)
    induction: Float[Tensor, "needle layer head"]  # attention on the copy-induction keys, summed
    induction_steps: Float[Tensor, " needle"]  # copy-induction queries per needle (needle_len)
    stream: Float[Tensor, "batch layer head"] | None  # sink + window share, summed over queries
    stream_queries: Float[Tensor, " batch"] | None  # queries that see more than sink + window keys


COUNT_FIELDS = tuple(f.name for f in fields(RetrievalCounts))
PER_NEEDLE = ("hits", "mass", "steps", "induction", "induction_steps")


def default_window(seq_len: int) -> int:
    """The streaming window when none is given: ``min(1024, seq_len // 4)`` (at least 1), so a short
    probe (the bundled toy's 255 tokens) still has queries that see more than sink + window keys."""
    return max(1, min(MAX_WINDOW, seq_len // 4))


def retrieval_counts(
    model: HookedModel,
    probe: NeedleProbe,
    *,
    sink: int = DEFAULT_SINK,
    window: int | None = 1024,
    config: RunConfig | None = None,
) -> RetrievalCounts:
    """One pass over ``probe``: every head's retrieval hits and masses per needle and, unless
    ``window`` is None, its sink + window share per sequence (see the module docstring).

    ``config.engine``: ``"pattern"`` (reduce each layer's pattern in its hook), ``"stream"`` (never
    form it) or ``"auto"`` (:func:`interp.stream.budget.choose_engine`); ``config`` also gives the
    minibatch and progress. Under ``torchrun`` each rank counts its block of sequences
    (:func:`interp.distributed.map_sequences`); every rank gets all.
    """
    cfg = RunConfig.of(config)
    minibatch, progress = cfg.minibatch, cfg.progress
    validate_retrieval_scores(sink=sink, window=window)
    info = _check(model, probe)
    if window is not None:
        _check_window(probe, sink, window)
    engine, _ = choose_engine(cfg.engine, model, min(minibatch or probe.batch, probe.batch), probe.seq_len, cfg.budget)
    count = _pattern_counts if engine == "pattern" else _stream_counts

    def one_block(p: NeedleProbe) -> dict[str, Tensor]:
        c = count(model, p, info, sink, window, minibatch, progress and distributed.is_main())
        return {f: getattr(c, f) for f in COUNT_FIELDS if getattr(c, f) is not None}

    parts = distributed.map_sequences(one_block, probe, what="scoring retrieval heads")
    if distributed.active():  # the blocks' needles come row by row: put them back in the probe's order
        order = torch.cat([(probe.needle_row == r).nonzero().flatten() for r in range(probe.batch)])
        for f in PER_NEEDLE:
            merged = parts[f]
            parts[f] = torch.empty_like(merged)
            parts[f][order] = merged
    return RetrievalCounts(**{f: parts.get(f) for f in COUNT_FIELDS})


def _empty_counts(info: Any, probe: NeedleProbe, sink: int, window: int | None) -> RetrievalCounts:
    L, H, B, N = info.n_layers, info.n_heads, probe.batch, probe.n_needles
    streaming = window is not None
    return RetrievalCounts(
        hits=torch.zeros(N, L, H, dtype=torch.float64),
        mass=torch.zeros(N, L, H, dtype=torch.float64),
        steps=torch.bincount(probe.retrieval_needles(), minlength=N).double(),
        induction=torch.zeros(N, L, H, dtype=torch.float64),
        induction_steps=torch.bincount(probe.copy_induction_needles(), minlength=N).double(),
        stream=torch.zeros(B, L, H, dtype=torch.float64) if streaming else None,
        stream_queries=torch.full((B,), float(probe.seq_len - sink - window), dtype=torch.float64)
        if streaming
        else None,
    )


def _chunk_pairs(pairs: Tensor, needles: Tensor, rows: slice) -> tuple[Tensor, Tensor]:
    """The pairs of sequences ``rows`` with their batch index made local, and their needle ids."""
    keep = (pairs[:, 0] >= rows.start) & (pairs[:, 0] < rows.stop)
    return pairs[keep] - torch.tensor([rows.start, 0, 0]), needles[keep]


def _pattern_counts(
    model: HookedModel,
    probe: NeedleProbe,
    info: Any,
    sink: int,
    window: int | None,
    minibatch: int | None,
    progress: bool,
) -> RetrievalCounts:
    """The pattern engine: each layer's ``hook_pattern`` reduced inside its hook."""
    L, B = info.n_layers, probe.batch
    streaming = window is not None
    ret, ret_needle = probe.retrieval_pairs(), probe.retrieval_needles()
    ind, ind_needle = probe.copy_induction_pairs(), probe.copy_induction_needles()
    counts = _empty_counts(info, probe, sink, window)
    step = minibatch or B
    n_chunks = len(range(0, B, step))
    bar = tqdm(
        total=L * n_chunks,
        desc="scoring retrieval heads (pattern)",
        disable=not progress,
        sizes=f"{B} sequences of {probe.seq_len} tokens, {n_chunks} chunk(s) x {L} layers, each layer's pattern formed",
    )
    for start in range(0, B, step):
        rows = slice(start, min(start + step, B))
        local_ret, needles_ret = _chunk_pairs(ret, ret_needle, rows)
        local_ind, needles_ind = _chunk_pairs(ind, ind_needle, rows)

        def reduce(pattern: Float[Tensor, "batch head q k"], hook: Any) -> None:
            layer = layer_of(hook)
            pattern = pattern.detach()
            check_finite(pattern, layer, info.name)
            hits, mass = argmax_hits(pattern, local_ret.to(pattern.device))
            counts.hits[:, layer].index_add_(0, needles_ret, hits.double().cpu())
            counts.mass[:, layer].index_add_(0, needles_ret, mass.double().cpu())
            _, ind_mass = argmax_hits(pattern, local_ind.to(pattern.device), argmax=False)
            counts.induction[:, layer].index_add_(0, needles_ind, ind_mass.double().cpu())
            if streaming:
                counts.stream[rows, layer] = window_share(pattern, sink, window).sum(-1).cpu()
            bar.update()

        run_with_reducers(
            model,
            probe.tokens[rows],
            [(pattern_hook(l), reduce) for l in range(L)],
            stop_after=pattern_hook(L - 1),
        )
    bar.close()
    return counts


def _stream_counts(
    model: HookedModel,
    probe: NeedleProbe,
    info: Any,
    sink: int,
    window: int | None,
    minibatch: int | None,
    progress: bool,
) -> RetrievalCounts:
    """The stream engine: per layer, the row pass's log-sum-exp, a row argmax at the copy queries
    only, and the sink + window share from the sink and band tiles; no ``T x T`` pattern."""
    counts = _empty_counts(info, probe, sink, window)
    ret, ret_needle = probe.retrieval_pairs(), probe.retrieval_needles()
    ind, ind_needle = probe.copy_induction_pairs(), probe.copy_induction_needles()

    def on_chunk(rows: slice) -> tuple[Callable[[AttentionInputs], None], list]:
        local_ret, needles_ret = _chunk_pairs(ret, ret_needle, rows)
        local_ind, needles_ind = _chunk_pairs(ind, ind_needle, rows)

        def reduce(a: AttentionInputs) -> None:
            lse = row_pass(a).lse  # [batch, head, T]; with a sink logit, the sink is in it
            check_finite(lse, a.layer, info.name)
            hits, mass, ind_mass = copy_step_stats(a, lse, local_ret, local_ind)
            counts.hits[:, a.layer].index_add_(0, needles_ret, hits.double())
            counts.mass[:, a.layer].index_add_(0, needles_ret, mass.double())
            counts.induction[:, a.layer].index_add_(0, needles_ind, ind_mass.double())
            if window is not None:
                counts.stream[rows, a.layer] = stream_window_share(a, lse, sink, window).cpu()

        return reduce, []

    run_streamed(model, probe.tokens, minibatch, progress, "scoring retrieval heads (stream)", on_chunk)
    return counts


def copy_step_stats(
    a: AttentionInputs,
    lse: Float[Tensor, "batch head q"],
    ret: Int[Tensor, "n 3"],
    ind: Int[Tensor, "m 3"],
) -> tuple[Float[Tensor, "n head"], Float[Tensor, "n head"], Float[Tensor, "m head"]]:
    """``(hits, target mass)`` at the retrieval pairs and the mass at the copy-induction pairs. The
    hits from the retrieval queries only: each sequence's queries in runs of consecutive positions,
    each run's rows against every key by :func:`~interp.stream.passes.argmax_pass` (the Triton kernel
    on CUDA, else :func:`~interp.stream.blockwise.row_argmax`; ties to the lowest key). The masses
    from one :func:`~interp.stream.blockwise.logits_tile`-consistent dot product per target
    (:func:`~interp.stream.passes.gather_pass`), ``A = exp(s - lse)``. ``O(queries x T)``."""
    H = a.q.shape[1]
    hits = torch.zeros(len(ret), H)
    for b in ret[:, 0].unique().tolist():
        one = replace(
            a,
            q=a.q[b : b + 1],
            k=a.k[b : b + 1],
            v=a.v[b : b + 1],
            key_mask=None if a.key_mask is None else a.key_mask[b : b + 1],
        )
        for q0, q1 in _runs(ret[ret[:, 0] == b, 1].unique()):
            idx = ((ret[:, 0] == b) & (ret[:, 1] >= q0) & (ret[:, 1] < q1)).nonzero()[:, 0]
            _, arg = argmax_pass(one, q0, q1)
            _, q, k = ret[idx].unbind(-1)
            hits[idx] = (arg[0][:, (q - q0).to(arg.device)].T.cpu() == k[:, None]).float()
    mass = gather_pass(a, lse, ret).float().cpu() if len(ret) else torch.zeros(0, H)
    ind_mass = gather_pass(a, lse, ind).float().cpu() if len(ind) else torch.zeros(0, H)
    return hits, mass, ind_mass


def _runs(positions: Tensor) -> list[tuple[int, int]]:
    """Sorted distinct positions as maximal runs of consecutive integers, ``[(start, stop), ...]``."""
    if len(positions) == 0:
        return []
    p = positions.sort().values.tolist()
    runs, start = [], p[0]
    for prev, cur in zip(p, p[1:]):
        if cur != prev + 1:
            runs.append((start, prev + 1))
            start = cur
    runs.append((start, p[-1] + 1))
    return runs


def stream_window_share(
    a: AttentionInputs, lse: Float[Tensor, "batch head q"], sink: int, window: int, block: int = QUERY_BLOCK
) -> Float[Tensor, "batch head"]:
    """Per sequence and head, the sum over queries ``q >= sink + window`` of the mass on keys
    ``[0, sink)`` and ``[q - window + 1, q]``: only the sink tiles and the band tiles are formed
    (:func:`~interp.stream.blockwise.logits_tile`), ``O(T x (sink + window))``. Float64 sums."""
    T = a.q.shape[2]
    total = torch.zeros(a.q.shape[0], a.q.shape[1], dtype=torch.float64, device=a.q.device)
    for q0 in range(sink + window, T, block):
        q1 = min(q0 + block, T)
        row_lse = lse[..., q0:q1, None].float()
        if sink > 0:
            total += (logits_tile(a, q0, q1, 0, sink) - row_lse).exp().sum((-1, -2)).double()
        k0 = q0 - window + 1  # > sink - 1: the band never reaches the sink keys
        s = logits_tile(a, q0, q1, k0, q1)
        qi = torch.arange(q0, q1, device=s.device)[:, None]
        ki = torch.arange(k0, q1, device=s.device)[None, :]
        s = s.masked_fill(ki <= qi - window, -math.inf)  # causal already masks k > q
        total += (s - row_lse).exp().sum((-1, -2)).double()
    return total


def argmax_hits(
    pattern: Float[Tensor, "batch head q k"], pairs: Int[Tensor, "n 3"], *, argmax: bool = True
) -> tuple[Float[Tensor, "n head"] | None, Float[Tensor, "n head"]]:
    """Per target pair and head: is the key the row's argmax (1/0), and the attention on the key."""
    b, q, k = pairs.unbind(-1)
    mass = pattern[b, :, q, k].float()  # [n, head]
    if not argmax:
        return None, mass
    top = pattern[b, :, q, :].argmax(-1)  # [n, head]; ties: the lowest key
    return (top == k[:, None]).float(), mass


def window_share(
    pattern: Float[Tensor, "batch head q k"], sink: int, window: int, block: int = QUERY_BLOCK
) -> Float[Tensor, "batch head query"]:
    """Mass on keys ``[0, sink)`` plus ``[q - window + 1, q]`` for each query ``q >= sink + window``.

    Cumulative sums over keys in float64, ``block`` queries at a time (memory: one block's rows).
    """
    T = pattern.shape[-1]
    out = []
    for q0 in range(sink + window, T, block):
        q = torch.arange(q0, min(q0 + block, T), device=pattern.device)
        csum = pattern[:, :, q0 : q0 + len(q), :].double().cumsum(-1)  # [b, h, nq, T]
        row = torch.arange(len(q), device=pattern.device)
        head = csum[:, :, :, sink - 1] if sink > 0 else 0.0
        win = csum[:, :, row, q] - csum[:, :, row, q - window]
        out.append(head + win)
    return torch.cat(out, dim=-1)


def retrieval_scores(
    model: HookedModel,
    probe: NeedleProbe | None = None,
    *,
    sink: int = DEFAULT_SINK,
    window: int | None = None,
    config: RunConfig | None = None,
) -> HeadScores:
    """Score every head as retrieval / streaming head on a needle probe (see the module docstring).

    ``probe`` defaults to ``needle_probe(model, seed=config.seed)``. Columns: ``retrieval`` (with
    ``_lo``/``_hi``, bootstrap over needles), ``retrieval_mass``, ``streaming`` (with ``_lo``/``_hi``,
    bootstrap over sequences) and ``role`` (``"retrieval"``, ``"streaming"`` or ``"neither"``).
    ``window`` defaults to :func:`default_window` of the probe's length. ``config`` (a
    :class:`~interp.config.RunConfig`, by default ``RunConfig()``) holds the run settings; its
    ``engine``: ``"pattern"``, ``"stream"`` or ``"auto"`` (stream when one layer's pattern for a
    forward pass exceeds ``config.budget`` bytes); ``meta["engine"]`` says which ran and why.
    ``meta`` also records the thresholds, ``sink``, ``window`` and the probe.
    """
    validate_retrieval_scores(sink=sink, window=window)
    cfg = RunConfig.of(config)
    n_boot, level, seed = cfg.n_boot, cfg.level, cfg.seed
    if probe is None:
        probe = needle_probe(model, seed=seed)
    info = _check(model, probe)
    window = default_window(probe.seq_len) if window is None else window
    n_seqs = min(cfg.minibatch or probe.batch, probe.batch)
    engine, why = choose_engine(cfg.engine, model, n_seqs, probe.seq_len, cfg.budget)
    counts = retrieval_counts(model, probe, sink=sink, window=window, config=dataclasses.replace(cfg, engine=engine))
    steps = counts.steps[:, None, None].expand_as(counts.hits)
    by_needle = bootstrap_ratio(counts.hits, steps, n_boot=n_boot, level=level, seed=seed)
    grids = {"retrieval": by_needle.point, "retrieval_lo": by_needle.lo, "retrieval_hi": by_needle.hi}
    grids["retrieval_mass"] = (counts.mass.sum(0) / counts.steps.sum()).float()
    queries = counts.stream_queries[:, None, None].expand_as(counts.stream)
    by_seq = bootstrap_ratio(counts.stream, queries, n_boot=n_boot, level=level, seed=seed)
    grids.update({"streaming": by_seq.point, "streaming_lo": by_seq.lo, "streaming_hi": by_seq.hi})
    notes = [*interval_notes("retrieval", by_needle, unit="needle"), *interval_notes("streaming", by_seq)]
    scores = HeadScores.from_grids(
        grids,
        {
            "model": info.name,
            "n_layers": info.n_layers,
            "n_heads": info.n_heads,
            "probe": probe.meta,
            "seq_len": probe.seq_len,
            "n_needles": probe.n_needles,
            "sink": sink,
            "window": window,
            "retrieval_threshold": RETRIEVAL_THRESHOLD,
            "streaming_threshold": STREAMING_THRESHOLD,
            "roles": "retrieval if retrieval >= retrieval_threshold, else streaming if streaming >= "
            "streaming_threshold, else neither",
            "ci_level": level,
            "n_boot": n_boot,
            "seed": seed,
            "engine": engine,
            "engine_reason": why,
            "ci_sequences": {"retrieval": by_needle.units, "streaming": by_seq.units},
            **({"notes": notes} if notes else {}),
        },
    )
    scores.table["role"] = classify(scores.table["retrieval"].to_numpy(), scores.table["streaming"].to_numpy())
    return scores


def classify(retrieval: np.ndarray, streaming: np.ndarray) -> list[str]:
    """The role of each head from its retrieval and streaming scores (thresholds above)."""
    return [
        "retrieval" if r >= RETRIEVAL_THRESHOLD else "streaming" if s >= STREAMING_THRESHOLD else "neither"
        for r, s in zip(retrieval, streaming)
    ]


def copy_distance_scores(
    model: HookedModel,
    probe: NeedleProbe,
    *,
    config: RunConfig | None = None,
) -> pd.DataFrame:
    """Tidy ``(layer, head, distance)`` rows with ``induction``, ``retrieval``, ``retrieval_mass``,
    ``uniform`` (the induction mass of a uniform head) and ``n_needles``; see the module docstring.

    Any :class:`NeedleProbe` works; on a :func:`~interp.probes.needle.needle_probe` the distances are
    those between each needle and its copy. ``config`` gives the engine, the minibatch and progress.
    """
    counts = retrieval_counts(model, probe, window=None, config=config)
    distance = probe.needle_distance()
    L, H = counts.hits.shape[1:]
    queries = probe.copy_induction_pairs()[:, 1].double()
    uniform = torch.zeros(probe.n_needles, dtype=torch.float64).index_add_(
        0, probe.copy_induction_needles(), 1.0 / (queries + 1.0)
    )
    frames = []
    for d in distance.unique().tolist():
        sel = distance == d
        grids = {
            "induction": counts.induction[sel].sum(0) / counts.induction_steps[sel].sum(),
            "retrieval": counts.hits[sel].sum(0) / counts.steps[sel].sum(),
            "retrieval_mass": counts.mass[sel].sum(0) / counts.steps[sel].sum(),
        }
        frame = pd.DataFrame(
            {
                "layer": np.repeat(np.arange(L), H),
                "head": np.tile(np.arange(H), L),
                "distance": int(d),
                **{name: g.flatten().numpy() for name, g in grids.items()},
            }
        )
        frame["uniform"] = float(uniform[sel].sum() / counts.induction_steps[sel].sum())
        frame["n_needles"] = int(sel.sum())
        frames.append(frame)
    return pd.concat(frames, ignore_index=True).sort_values(["layer", "head", "distance"], ignore_index=True)


def needle_copy_loss(model: HookedModel, probe: NeedleProbe, *, config: RunConfig | None = None) -> float:
    """Mean cross-entropy (nats) of the copy steps: at each retrieval pair's query ``p``, predicting
    the copied token ``tokens[p + 1]``, teacher-forced. The metric of the window-ablation check.
    ``config.minibatch``: sequences per forward. Under ``torchrun`` each rank runs its block of
    sequences; every rank gets the mean."""
    minibatch = RunConfig.of(config).minibatch
    n_pairs = len(probe.retrieval_pairs())

    def per_row(p: NeedleProbe) -> Tensor:
        pairs = p.retrieval_pairs()
        total = torch.zeros(p.batch, dtype=torch.float64)
        step = minibatch or p.batch
        with torch.no_grad():
            for start in range(0, p.batch, step):
                mine = pairs[(pairs[:, 0] >= start) & (pairs[:, 0] < start + step)]
                if not len(mine):
                    continue
                logits = model(p.tokens[start : start + step])
                b, q = mine[:, 0] - start, mine[:, 1]
                logp = logits[b.to(logits.device), q.to(logits.device)].float().log_softmax(-1)
                target = p.tokens[mine[:, 0], q + 1].to(logp.device)
                nll = -logp.gather(-1, target[:, None])[:, 0].double().cpu()
                total.index_add_(0, mine[:, 0], nll)
        return total

    rows = distributed.map_sequences(per_row, probe, what="measuring the needle-copy loss")
    return float(rows.sum()) / n_pairs


# ---------------------------------------------------------------------------------------------
# checks


def validate_retrieval_scores(*, sink: int = DEFAULT_SINK, window: int | None = None) -> None:
    """:func:`retrieval_scores`'s options checked without a model: ``sink`` an integer >= 0 and
    ``window`` one >= 1 (or None: :func:`default_window`). Whether the probe is longer than sink +
    window is checked against the probe (:func:`retrieval_counts`)."""
    for name, value, low in (("sink", sink, 0), ("window", window, 1)):
        if value is None and name == "window":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{name}= must be an integer, got {value!r}", params=name)
        if value < low:
            raise UsageError(f"{name}= must be >= {low}, got {value!r}", params=name)


def _check(model: HookedModel, probe: Any) -> Any:
    if not isinstance(probe, NeedleProbe):
        raise UsageError(
            "retrieval scores need a needle probe: interp.probes.needle.needle_probe or copy_distance_probe"
        )
    info = describe(model)
    if probe.seq_len > info.n_ctx:
        raise UsageError(f"probe of {probe.seq_len} tokens is longer than the model's context of {info.n_ctx}")
    return info


def _check_window(probe: NeedleProbe, sink: int, window: int) -> None:
    if probe.seq_len <= sink + window:
        raise UsageError(
            f"probe of {probe.seq_len} tokens is too short for sink {sink} + window {window}: every query "
            "sees all its keys; lower the window or lengthen the probe"
        )


__all__ = [
    "RETRIEVAL_THRESHOLD",
    "ROLES",
    "STREAMING_THRESHOLD",
    "RetrievalCounts",
    "classify",
    "copy_step_stats",
    "default_window",
    "copy_distance_scores",
    "retrieval_counts",
    "needle_copy_loss",
    "retrieval_scores",
    "stream_window_share",
    "validate_retrieval_scores",
    "window_share",
]
