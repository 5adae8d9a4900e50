"""The stream engine: head and sink statistics in exactly the shapes the pattern engine reduces
patterns into (:func:`interp.heads.attention_scores`, :class:`interp.sinks.stats.SinkStatistics`),
computed from each layer's ``q``, ``k`` and log-sum-exp without ever forming a ``[T, T]`` pattern.

- previous-token, duplicate and induction masses: the weights at the probe's target pairs
  (:meth:`~interp.probes.TokenProbe.induction_pairs` and kin), gathered after one row pass;
- confidence (with and without the first position): ``exp(max - lse)`` from the row pass;
- received mass per key (``alpha_k``, the first-token mass, sink discovery): the column pass;
- value norms and residual statistics: from ``v`` and ``hook_resid_post`` as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from interp.errors import UsageError
from interp.hooks import layer_of, resid_post_hook, run_with_reducers
from interp.models import describe
from interp.probes import TokenProbe
from interp.sinks.stats import (
    SinkStatistics,
    cap_massive,
    check_finite,
    empty_statistics,
    record_value_norms,
    reduce_residual,
    scored_queries,
)
from interp.stream.blockwise import column_sums, gathered_weights, row_stats
from interp.stream.capture import AttentionInputs, streamed_attention


def _row_pass(a: AttentionInputs):
    """The row pass: the Triton kernel on CUDA tensors (when Triton is installed), else torch."""
    from interp.stream import triton as kernels

    if a.q.is_cuda and kernels.HAS_TRITON and 16 <= a.q.shape[-1] <= 128:
        return kernels.triton_row_stats(a.q, a.k, a.scale, a.causal)
    return row_stats(a.q, a.k, a.scale, a.causal)


def _column_pass(a: AttentionInputs, lse: Tensor) -> tuple[Tensor, float]:
    """``(received mass per key, max |row sum - 1|)``. The Triton pass has no row sums; there the
    check is on their mean (the total received mass over ``T``)."""
    from interp.stream import triton as kernels

    if a.q.is_cuda and kernels.HAS_TRITON and 16 <= a.q.shape[-1] <= 128:
        received = kernels.triton_column_sums(a.q, a.k, lse, a.scale, a.causal)
        return received, float((received.sum(-1) / a.q.shape[2] - 1).abs().max())
    received, rows = column_sums(a.q, a.k, lse, a.scale, a.causal)
    return received, float((rows - 1).abs().max())


def target_pairs(probe: TokenProbe, scores: Sequence[str], queries: str) -> dict[str, Int[Tensor, "n 3"]]:
    """``(batch, q, k)`` target rows of each attention score (see :mod:`interp.heads`)."""
    make = {
        "prev_token": lambda: probe.prev_pairs(every_query=queries == "all"),
        "duplicate": probe.duplicate_pairs,
        "induction": probe.induction_pairs,
    }
    return {name: make[name]() for name in scores}


def _queries_with_target(pairs: Int[Tensor, "n 3"], batch: int) -> Float[Tensor, " batch"]:
    """How many distinct queries of each sequence have at least one target."""
    rows = torch.unique(pairs[:, :2], dim=0)
    return torch.zeros(batch).index_add_(0, rows[:, 0], torch.ones(len(rows)))


def _per_sequence(pairs: Int[Tensor, "n 3"], weights: Float[Tensor, "n head"], n_seqs: int) -> Tensor:
    return torch.zeros(n_seqs, weights.shape[1]).index_add_(0, pairs[:, 0], weights.cpu())


def _run_streamed(
    model: Any,
    probe: TokenProbe,
    minibatch: int | None,
    progress: bool,
    desc: str,
    on_chunk: Callable[[slice], tuple[Callable[[AttentionInputs], None], list[tuple[str, Any]]]],
) -> None:
    """Run ``probe`` chunk by chunk with fused attention; ``on_chunk(rows)`` gives the callback and hooks."""
    L, B = describe(model).n_layers, probe.batch
    step = minibatch or B
    bar = tqdm(total=L * len(range(0, B, step)), desc=desc, disable=not progress)
    for start in range(0, B, step):
        rows = slice(start, min(start + step, B))
        callback, hooks = on_chunk(rows)
        seen: set[int] = set()

        def on_attention(a: AttentionInputs) -> None:
            callback(a)
            seen.add(a.layer)
            bar.update()

        with streamed_attention(model, on_attention) as capture_hooks:
            run_with_reducers(model, probe.tokens[rows], [*capture_hooks, *hooks], stop_after=resid_post_hook(L - 1))
        if seen != set(range(L)):
            missing = sorted(set(range(L)) - seen)
            raise UsageError(
                f"the stream engine saw no attention inputs for layer(s) {missing}: this architecture's "
                "attention does not call the registered attention function; use --engine pattern"
            )
    bar.close()


def stream_attention_scores(
    model: Any,
    probe: TokenProbe,
    scores: Sequence[str],
    queries: str,
    minibatch: int | None = None,
    progress: bool = False,
) -> tuple[dict[str, Float[Tensor, "batch layer head"]], dict[str, Float[Tensor, "batch layer head"]]]:
    """Numerators and denominators of :func:`interp.heads.attention_scores`, pattern-free."""
    info = describe(model)
    B, L, H, T = probe.batch, info.n_layers, info.n_heads, probe.seq_len
    pairs = target_pairs(probe, scores, queries)
    den: dict[str, Tensor] = {}
    for name, p in pairs.items():
        if queries == "all":  # detect_head divides by the pattern's total mass: T rows of mass 1
            den[name] = torch.full((B, L, H), float(T))
            continue
        count = _queries_with_target(p, B)
        if float(count.sum()) == 0:
            raise UsageError(f"the probe has no query with a {name} target: use at least 2 repeats")
        den[name] = count[:, None, None].expand(B, L, H).clone()
    num = {name: torch.zeros(B, L, H) for name in pairs}

    def on_chunk(rows: slice) -> tuple[Callable[[AttentionInputs], None], list]:
        chunk = {}
        for name, p in pairs.items():
            p = p[(p[:, 0] >= rows.start) & (p[:, 0] < rows.stop)].clone()
            p[:, 0] -= rows.start
            chunk[name] = p

        def reduce(a: AttentionInputs) -> None:
            stats = _row_pass(a)
            check_finite(stats.lse, a.layer, info.name)
            for name, p in chunk.items():
                w = gathered_weights(a.q, a.k, stats.lse, a.scale, p)
                num[name][rows, a.layer] = _per_sequence(p, w, rows.stop - rows.start)

        return reduce, []

    _run_streamed(model, probe, minibatch, progress, "scoring heads (stream)", on_chunk)
    return num, den


def stream_sink_statistics(
    model: Any,
    probe: TokenProbe,
    *,
    abs_threshold: float,
    rel_threshold: float,
    max_massive: int,
    minibatch: int | None = None,
    progress: bool = False,
) -> SinkStatistics:
    """:func:`interp.sinks.stats.sink_statistics`, pattern-free: the same fields, the same meaning."""
    info = describe(model)
    B, L, H, T = probe.batch, info.n_layers, info.n_heads, probe.seq_len
    scored = scored_queries(T, info.is_causal)
    stats = empty_statistics(B, L, H, T)

    def on_chunk(rows: slice) -> tuple[Callable[[AttentionInputs], None], list]:
        def reduce(a: AttentionInputs) -> None:
            r = _row_pass(a)
            check_finite(r.lse, a.layer, info.name)
            received, deviation = _column_pass(a, r.lse)
            stats.max_row_deviation = max(stats.max_row_deviation, deviation)
            stats.received[rows, a.layer] = received.cpu()
            stats.confidence[rows, a.layer] = torch.exp(r.max - r.lse)[:, :, scored].sum(-1).cpu()
            stats.confidence_no_first[rows, a.layer] = torch.exp(r.max_rest - r.lse)[:, :, scored].sum(-1).cpu()
            norm = rearrange(a.v.float().norm(dim=-1), "b h p -> b p h")
            record_value_norms(stats, norm, a.layer, rows)

        def residual(x: Tensor, hook: Any) -> None:
            reduce_residual(stats, x, layer_of(hook), rows, abs_threshold, rel_threshold, max_massive)

        return reduce, [(resid_post_hook(layer), residual) for layer in range(L)]

    _run_streamed(model, probe, minibatch, progress, "sink pass (stream)", on_chunk)
    return cap_massive(stats, max_massive)
