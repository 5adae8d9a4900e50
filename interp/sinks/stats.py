"""The sink pass: each layer's pattern, values and residual reduced inside its hook to statistics
linear in ``T`` (see :mod:`interp.sinks` for the definitions).

Two reductions, side by side: the pattern engine reads each ``hook_pattern``; the stream engine
(:func:`stream_sink_statistics`) gets the same fields from each layer's ``q``, ``k`` and
log-sum-exp (confidence from the row pass, received mass from the column pass) while the model's
attention runs fused (:mod:`interp.stream` runs the model and the passes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from interp.adapters import AttentionInputs, HookedModel, describe, output_gate_means, run_with_reducers
from interp.config import RunConfig
from interp.errors import UsageError
from interp.hooks import layer_of, pattern_hook, resid_post_hook, v_hook
from interp.probes import TokenProbe
from interp.progress import tqdm
from interp.stream.budget import choose_engine
from interp.stream.driver import check_finite, column_pass, row_pass, run_streamed

EPSILON = 0.3
ABS_THRESHOLD = 100.0
REL_THRESHOLD = 1000.0
SINK_RATIO = 3.0
MIN_QUERIES = 8
MAX_MASSIVE_PER_LAYER = 1000


# --------------------------------------------------------------------------------------------
# the pass: reduce inside the hooks


@dataclass
class SinkStatistics:
    """What the hooks keep: per-key and per-position reductions, all linear in ``T``."""

    received: Float[Tensor, "batch layer head k"]  # sum_i A[i, k]
    confidence: Float[Tensor, "batch layer head"]  # sum over scored queries of max_k A[i, k]
    confidence_no_first: Float[Tensor, "batch layer head"]  # ... of max_{k >= 1} A[i, k]
    value_norm: Float[Tensor, "batch layer k head"]  # ||v_k|| (NaN if hook_v never fired)
    resid_max: Float[Tensor, "batch layer pos"]  # max_d |x|
    resid_median: Float[Tensor, "batch layer pos"]  # median_d |x| (of each hidden state alone)
    resid_top: Float[Tensor, "batch layer 3"]  # the 3 largest |x| of each sequence's layer output
    resid_seq_median: Float[Tensor, "batch layer"]  # median |x| over the whole layer output (massive's scale)
    massive: list[tuple[int, int, int, int, float, float]]  # layer, seq, pos, dim, value, |x|/layer median
    max_row_deviation: float  # max |sum_k A[i, k] + sink share - 1| seen (pattern engine: rows above 1 only)
    learned_sink: Float[Tensor, "batch layer head"] | None = None  # sum over queries of the sink's share
    has_sinks: bool = False  # the stream engine saw learned sink logits
    gate: Float[Tensor, "batch layer head"] | None = None  # mean sigmoid output gate (gated attention; NaN: none)


def sink_statistics(
    model: HookedModel,
    probe: TokenProbe,
    *,
    abs_threshold: float = ABS_THRESHOLD,
    rel_threshold: float = REL_THRESHOLD,
    max_massive: int = MAX_MASSIVE_PER_LAYER,
    config: RunConfig | None = None,
) -> SinkStatistics:
    """Run ``probe`` through ``model`` once, reducing patterns, values and residuals in their hooks.

    Hooks: ``blocks.{l}.attn.hook_v``, ``blocks.{l}.attn.hook_pattern`` and
    ``blocks.{l}.hook_resid_post``; the pass stops after the last layer's residual output.
    ``config.engine="stream"`` computes the same statistics without forming any pattern
    (:mod:`interp.stream`); ``"auto"`` (the default) chooses by the pattern's size
    (:func:`~interp.stream.budget.choose_engine`). ``config`` also gives the minibatch and progress.
    """
    cfg = RunConfig.of(config)
    minibatch, progress = cfg.minibatch, cfg.progress
    info = describe(model)
    if probe.seq_len > info.n_ctx:
        raise UsageError(f"probe of {probe.seq_len} tokens is longer than the model's context of {info.n_ctx}")
    engine, _ = choose_engine(cfg.engine, model, min(minibatch or probe.batch, probe.batch), probe.seq_len, cfg.budget)
    if engine == "stream":
        return stream_sink_statistics(
            model,
            probe,
            abs_threshold=abs_threshold,
            rel_threshold=rel_threshold,
            max_massive=max_massive,
            config=cfg,
        )
    B, L, H, T = probe.batch, info.n_layers, info.n_heads, probe.seq_len
    scored = scored_queries(T, info.is_causal)
    stats = empty_statistics(B, L, H, T)
    step = minibatch or B
    chunks = range(0, B, step)
    sizes = f"{L * H} heads x {B} sequences of {T} tokens, {len(chunks)} chunks"
    for start in tqdm(chunks, desc="sink pass", disable=not progress or len(chunks) == 1, sizes=sizes):
        sl = slice(start, start + step)
        if probe.padded:
            _padded_chunk(model, probe, stats, sl, info.name, abs_threshold, rel_threshold, max_massive)
            continue

        def values(v: Float[Tensor, "batch pos kv_head d_head"], hook: Any) -> None:
            v = rearrange(v.detach().float(), f"{info.v_layout} -> b p h d")  # latent attention: head first
            record_value_norms(stats, v.norm(dim=-1), layer_of(hook), sl)

        def pattern(a: Float[Tensor, "batch head q k"], hook: Any) -> None:
            layer = layer_of(hook)
            a = a.detach().float()
            rows = a.sum(-1)  # [b, h, q]: NaN or inf here iff anywhere in the row (weights are >= 0)
            check_finite(rows, layer, info.name)
            # Hugging Face returns weights over real keys only: a learned sink logit takes 1 - row sum
            stats.max_row_deviation = max(stats.max_row_deviation, float((rows - 1).clamp_min(0).max()))
            stats.learned_sink[sl, layer] = (1 - rows).clamp_min(0).sum(-1).cpu()
            stats.received[sl, layer] = a.sum(-2).cpu()
            stats.confidence[sl, layer] = a[:, :, scored].amax(-1).sum(-1).cpu()
            stats.confidence_no_first[sl, layer] = a[:, :, scored, 1:].amax(-1).sum(-1).cpu()

        def residual(x: Float[Tensor, "batch pos d_model"], hook: Any) -> None:
            reduce_residual(stats, x, layer_of(hook), sl, abs_threshold, rel_threshold, max_massive)

        hooks = [(resid_post_hook(layer), residual) for layer in range(L)]
        for layer in info.attention_layers:
            hooks += [(v_hook(layer), values), (pattern_hook(layer), pattern)]
        with output_gate_means(model, lambda layer, mean, sl=sl: _record_gate(stats, layer, mean, sl)):
            run_with_reducers(model, probe.tokens[sl], hooks, stop_after=resid_post_hook(L - 1))
    return cap_massive(absent_nan(stats, info.absent_layers), max_massive)


def _padded_chunk(
    model: HookedModel,
    probe: TokenProbe,
    stats: SinkStatistics,
    sl: slice,
    name: str,
    abs_threshold: float,
    rel_threshold: float,
    max_massive: int,
) -> None:
    """The sink pass over the padded sequences ``sl``, stored *aligned*: position ``p`` of each row is
    its text's position ``p`` (a left-padded row's real tokens move to the front), padded slots hold 0
    (received mass) or NaN (value norms, residual magnitudes), and the statistics of each row are what
    its text gives alone: padded queries and keys are left out of every reduction."""
    L = stats.received.shape[1]
    real = probe.real_mask()[sl]
    offsets = probe.offsets()[sl]
    T = real.shape[1]
    pos = torch.arange(T, device=real.device)
    index = (pos[None] + offsets[:, None]).clamp_max(T - 1)  # aligned slot -> padded position
    inside = pos[None] < real.sum(-1, keepdim=True)  # aligned slots holding a real token
    ridx = probe.real_index()[sl]
    scored = real & ((ridx >= 1) if probe.causal else True)  # queries that see at least two keys
    first = real & (ridx == 0)  # each row's first real token

    def align(x: Tensor, dim: int, fill: float) -> Tensor:
        """Move ``x``'s position axis ``dim`` into aligned slots; ``fill`` past each row's text."""
        shape = [1] * x.ndim
        shape[0], shape[dim] = x.shape[0], T
        idx = index.to(x.device).reshape(shape).expand_as(x)
        keep = inside.to(x.device).reshape(shape).expand_as(x)
        return torch.where(keep, x.gather(dim, idx), torch.full_like(x, fill))

    def values(v: Float[Tensor, "batch pos kv_head d_head"], hook: Any) -> None:
        record_value_norms(stats, align(v.detach().float().norm(dim=-1), 1, float("nan")), layer_of(hook), sl)

    def pattern(a: Float[Tensor, "batch head q k"], hook: Any) -> None:
        layer = layer_of(hook)
        a = a.detach().float()
        q_real = real.to(a.device)[:, None, :, None]
        a = torch.where(q_real, a, 0.0)  # padded query rows are left out
        rows = a.sum(-1)
        check_finite(rows, layer, name)
        # Hugging Face returns weights over real keys only: a learned sink logit takes 1 - row sum
        q_rows = real.to(a.device)[:, None, :].expand_as(rows)
        stats.max_row_deviation = max(stats.max_row_deviation, float((rows - 1).clamp_min(0)[q_rows].max()))
        # stored as T x the row's mean over its real queries, so that / T (as for unpadded rows) is that mean
        n_real = q_rows.sum(-1).clamp_min(1)
        share = torch.where(q_rows, (1 - rows).clamp_min(0), 0.0).sum(-1) / n_real * T
        stats.learned_sink[sl, layer] = share.cpu()
        stats.received[sl, layer] = align(a.sum(-2), 2, 0.0).cpu()
        s = scored.to(a.device)[:, None, :].float()
        stats.confidence[sl, layer] = (a.amax(-1) * s).sum(-1).cpu()
        rest = a.masked_fill(first.to(a.device)[:, None, None, :], 0.0)  # the first real key left out
        stats.confidence_no_first[sl, layer] = (rest.amax(-1) * s).sum(-1).cpu()

    def residual(x: Float[Tensor, "batch pos d_model"], hook: Any) -> None:
        layer = layer_of(hook)
        x = align(x.detach().float(), 1, float("nan"))
        reduce_residual(stats, x, layer, sl, abs_threshold, rel_threshold, max_massive)

    hooks = [(resid_post_hook(layer), residual) for layer in range(L)]
    for layer in describe(model).attention_layers:
        hooks += [(v_hook(layer), values), (pattern_hook(layer), pattern)]
    with output_gate_means(model, lambda layer, mean: _record_gate(stats, layer, mean, sl)):
        run_with_reducers(
            model, probe.tokens[sl], hooks, stop_after=resid_post_hook(L - 1), attention_mask=probe.attention_mask[sl]
        )


def stream_sink_statistics(
    model: HookedModel,
    probe: TokenProbe,
    *,
    abs_threshold: float,
    rel_threshold: float,
    max_massive: int,
    config: RunConfig | None = None,
) -> SinkStatistics:
    """:func:`sink_statistics`, pattern-free: the same fields, the same meaning.

    A padded probe is run right-padded (:meth:`TokenProbe.right_padded`: the same texts, each row's
    real tokens first) with its mask, so the statistics come out *aligned* exactly as the pattern
    engine stores them: slot ``p`` of each row is its text's position ``p``, padded slots hold 0
    (received mass) or NaN (value norms, residual magnitudes), padded queries are left out of every
    reduction, and a row's first real key is key 0 (the confidence without it). ``config`` gives the
    minibatch and progress."""
    cfg = RunConfig.of(config)
    info = describe(model)
    B, L, H, T = probe.batch, info.n_layers, info.n_heads, probe.seq_len
    if probe.padded:
        probe = probe.right_padded()
    real = probe.real_mask().cpu()  # [B, T]: aligned, so each row's real tokens are its first slots
    scored = real & (probe.real_index().cpu() >= (1 if info.is_causal else 0))  # queries seeing two keys
    n_real = real.sum(-1).clamp_min(1).float()
    stats = empty_statistics(B, L, H, T)
    current: list[slice] = []  # the chunk being run (none during the guard's prefix)

    def on_chunk(rows: slice) -> tuple[Callable[[AttentionInputs], None], list]:
        current[:] = [rows]
        chunk_real, chunk_scored = real[rows], scored[rows]

        def reduce(a: AttentionInputs) -> None:
            r = row_pass(a)
            live = chunk_real.to(r.lse.device)[:, None, :]  # padded query rows are left out
            check_finite(torch.where(live, r.lse, 0.0), a.layer, info.name)
            received, deviation = column_pass(a, r.lse)
            stats.max_row_deviation = max(stats.max_row_deviation, deviation)
            stats.received[rows, a.layer] = received.cpu()
            s = chunk_scored.to(r.lse.device)[:, None, :]
            stats.confidence[rows, a.layer] = torch.where(s, torch.exp(r.max - r.lse), 0.0).sum(-1).cpu()
            rest = torch.where(s, torch.exp(r.max_rest - r.lse), 0.0)
            stats.confidence_no_first[rows, a.layer] = rest.sum(-1).cpu()
            if a.sink is not None:  # the share of each row the sink logit absorbs
                share = torch.where(live, torch.exp(a.sink.float().to(r.lse.device)[None, :, None] - r.lse), 0.0)
                share = share.sum(-1).cpu()
                if probe.padded:  # stored as T x the row's mean over its real queries (as the pattern engine)
                    share = share / n_real[rows, None] * T
                stats.learned_sink[rows, a.layer] = share
                stats.has_sinks = True
            norm = rearrange(a.v.float().norm(dim=-1), "b h p -> b p h")
            if probe.padded:  # padded slots: NaN
                norm = torch.where(live[:, 0, :, None], norm, float("nan"))
            record_value_norms(stats, norm, a.layer, rows)

        def residual(x: Tensor, hook: Any) -> None:
            if probe.padded:  # padded slots: NaN (left out of every residual statistic)
                x = torch.where(chunk_real.to(x.device)[..., None], x.detach().float(), float("nan"))
            reduce_residual(stats, x, layer_of(hook), rows, abs_threshold, rel_threshold, max_massive)

        return reduce, [(resid_post_hook(layer), residual) for layer in range(L)]

    def gate(layer: int, mean: Tensor) -> None:
        if current:
            _record_gate(stats, layer, mean, current[0])

    with output_gate_means(model, gate):
        run_streamed(
            model,
            probe.tokens,
            cfg.minibatch,
            cfg.progress,
            "sink pass (stream)",
            on_chunk,
            attention_mask=probe.attention_mask,
        )
    return cap_massive(absent_nan(stats, info.absent_layers), max_massive)


def _record_gate(stats: SinkStatistics, layer: int, mean: Tensor, rows: slice) -> None:
    stats.gate[rows, layer] = mean.cpu()


def empty_statistics(B: int, L: int, H: int, T: int) -> SinkStatistics:
    """Zeroed statistics for ``B`` sequences of ``T`` tokens through ``L`` layers of ``H`` heads."""
    return SinkStatistics(
        received=torch.zeros(B, L, H, T),
        confidence=torch.zeros(B, L, H),
        confidence_no_first=torch.zeros(B, L, H),
        value_norm=torch.full((B, L, T, H), float("nan")),
        resid_max=torch.zeros(B, L, T),
        resid_median=torch.zeros(B, L, T),
        resid_top=torch.zeros(B, L, 3),
        resid_seq_median=torch.zeros(B, L),
        massive=[],
        max_row_deviation=0.0,
        learned_sink=torch.zeros(B, L, H),
        gate=torch.full((B, L, H), float("nan")),
    )


def absent_nan(stats: SinkStatistics, layers: Sequence[int]) -> SinkStatistics:
    """NaN for the attention statistics of ``layers`` (layers without softmax attention)."""
    for field in (stats.received, stats.confidence, stats.confidence_no_first, stats.learned_sink):
        if field is not None:
            field[:, list(layers)] = float("nan")
    return stats


def record_value_norms(
    stats: SinkStatistics, norm: Float[Tensor, "batch pos kv_head"], layer: int, rows: slice
) -> None:
    """Store ``||v||`` per position and query head (grouped K/V: one value head serves several)."""
    H = stats.value_norm.shape[-1]
    if norm.shape[-1] != H:
        norm = norm.repeat_interleave(H // norm.shape[-1], dim=-1)
    stats.value_norm[rows, layer] = norm.cpu()


def reduce_residual(
    stats: SinkStatistics,
    x: Float[Tensor, "batch pos d_model"],
    layer: int,
    rows: slice,
    abs_threshold: float,
    rel_threshold: float,
    max_massive: int,
) -> None:
    """Reduce one layer's residual output of sequences ``rows`` into magnitudes and massive activations.

    An entry is massive (Sun et al. 2024, as their code measures it) when ``|x| > abs_threshold`` and
    ``|x| > rel_threshold`` times the median ``|x|`` of its sequence's whole layer output: every real
    position and every dimension (padded slots, NaN here, are left out). Its ratio is against that
    median. The median of its own hidden state alone would not do: a token whose state holds several
    large dimensions (the BOS of a trained model) has a median far above the layer's."""
    x = x.detach().float()
    mag = x.abs()
    stats.resid_max[rows, layer] = mag.amax(-1).cpu()
    stats.resid_median[rows, layer] = mag.median(-1).values.cpu()
    flat = mag.flatten(1)
    if bool(flat.isnan().any()):  # padded slots (NaN) are left out: -inf never ranks, nanmedian skips
        top = flat.nan_to_num(-float("inf")).topk(min(3, flat.shape[1]), dim=-1).values
        seq_med = flat.nanmedian(-1).values
    else:
        top = flat.topk(min(3, flat.shape[1]), dim=-1).values
        seq_med = flat.median(-1).values
    stats.resid_top[rows, layer] = top.cpu()
    stats.resid_seq_median[rows, layer] = seq_med.cpu()
    hits = (mag > abs_threshold) & (mag > rel_threshold * seq_med[:, None, None])  # NaN compares False
    if hits.any():
        idx = hits.nonzero()
        vals = x[hits]
        ratio = mag[hits] / seq_med[idx[:, 0]].clamp_min(1e-30)
        keep = vals.abs().argsort(descending=True)[:max_massive]
        for (b, t, d), v, r in zip(idx[keep].tolist(), vals[keep].tolist(), ratio[keep].tolist()):
            stats.massive.append((layer, (rows.start or 0) + b, t, d, v, r))


def cap_massive(stats: SinkStatistics, max_massive: int) -> SinkStatistics:
    """Sort the massive activations largest first and keep at most ``max_massive`` per layer."""
    stats.massive.sort(key=lambda m: -abs(m[4]))
    by_layer: dict[int, int] = {}
    kept = []
    for m in stats.massive:  # cap per layer across minibatches
        by_layer[m[0]] = by_layer.get(m[0], 0) + 1
        if by_layer[m[0]] <= max_massive:
            kept.append(m)
    stats.massive = kept
    return stats


def concat_statistics(parts: list[SinkStatistics], max_massive: int = MAX_MASSIVE_PER_LAYER) -> SinkStatistics:
    """The statistics of consecutive blocks of a probe's sequences, as one pass over the whole probe
    would have made them (massive activations renumbered, re-ranked and capped per layer again)."""
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + p.received.shape[0])
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
    massive = [(m[0], m[1] + off, *m[2:]) for p, off in zip(parts, offsets) for m in p.massive]
    massive.sort(key=lambda m: -abs(m[4]))
    by_layer: dict[int, int] = {}
    kept = []
    for m in massive:
        by_layer[m[0]] = by_layer.get(m[0], 0) + 1
        if by_layer[m[0]] <= max_massive:
            kept.append(m)
    names = ("received", "confidence", "confidence_no_first", "value_norm", "learned_sink", "gate")
    names += ("resid_max", "resid_median", "resid_top", "resid_seq_median")
    return SinkStatistics(
        **{n: cat(n) for n in names},
        massive=kept,
        max_row_deviation=max(p.max_row_deviation for p in parts),
        has_sinks=any(p.has_sinks for p in parts),
    )


def scored_queries(T: int, causal: bool) -> slice:
    """Queries that see at least two keys: all of an encoder's, ``i >= 1`` of a causal model's."""
    return slice(1 if causal else 0, T)


def queries_per_key(T: int, causal: bool) -> Float[Tensor, " k"]:
    """``n_k``: how many queries see key ``k``."""
    return torch.arange(T, 0, -1).float() if causal else torch.full((T,), float(T))


def uniform_mass(T: int, causal: bool) -> Float[Tensor, " k"]:
    """``alpha_k`` of a head that spreads each query's attention evenly over the keys it sees."""
    if not causal:
        return torch.full((T,), 1.0 / T)
    inv = 1.0 / torch.arange(1, T + 1).double()  # query i sees i + 1 keys
    tail = inv.flip(0).cumsum(0).flip(0)  # sum_{i >= k} 1 / (i + 1)
    return (tail / queries_per_key(T, True).double()).float()


def queries_per_key_rows(probe: TokenProbe) -> Float[Tensor, "batch k"]:
    """``n_k`` of each row of an aligned probe (:meth:`TokenProbe.right_padded`): as its text alone
    has them, 0 past its text. An unpadded probe's rows all equal :func:`queries_per_key`."""
    T = probe.seq_len
    if not probe.padded:
        return queries_per_key(T, probe.causal)[None].expand(probe.batch, -1)
    lengths = probe.lengths().cpu().float()[:, None]
    k = torch.arange(T).float()[None]
    n = (lengths - k) if probe.causal else lengths.expand(-1, T)
    return torch.where(k < lengths, n, 0.0)


def uniform_mass_rows(probe: TokenProbe) -> Float[Tensor, "batch k"]:
    """:func:`uniform_mass` of each row's text, aligned (NaN past a row's text)."""
    T = probe.seq_len
    if not probe.padded:
        return uniform_mass(T, probe.causal)[None].expand(probe.batch, -1)
    out = torch.full((probe.batch, T), float("nan"))
    for b, n in enumerate(probe.lengths().cpu().tolist()):
        out[b, :n] = uniform_mass(n, probe.causal)
    return out
