"""Attention sinks: which heads dump attention, on which tokens, and the massive activations behind them.

Definitions (``A`` is a head's attention pattern on one sequence of ``T`` tokens, rows are queries
``i``, columns keys ``k``; a query *sees* key ``k`` when ``k <= i`` for causal models, always for
encoders; ``n_k`` is how many queries see ``k``: ``T - k`` causal, ``T`` encoder):

- **sink mass** of key ``k`` (Gu et al. 2024, ``alpha_k``): the mean attention the queries that see
  ``k`` give it, ``alpha_k = sum_i A[i, k] / n_k``, averaged over the probe's sequences.
  ``first_mass`` is ``alpha_0``: the first token, which is the BOS of a causal model that has one
  and ``[CLS]`` for an encoder; ``sep_mass`` (encoders) is ``alpha`` at the ``[SEP]`` position.
  ``top_other_mass`` / ``top_other_pos`` are the largest ``alpha_k`` over the other positions seen
  by at least ``min_queries`` queries, and the ``positions`` table summarises ``alpha_k`` over heads
  for every position of every layer.
- **Sink_k^eps** (Gu et al.): the share of heads whose ``alpha_k`` exceeds ``epsilon`` (0.3), per
  layer and for the whole model (the mean over layers of the per-layer share).
- **sink discovery**: for every token occurrence, the attention it draws relative to a head that
  attends uniformly over what each query sees (``alpha_k`` over its uniform value
  ``mean_{i sees k} 1 / (#keys i sees)``), averaged over all heads of all layers; occurrences are
  grouped by token and *role* (``first``, ``BOS``, ``[CLS]``, ``[SEP]``, ``punctuation``,
  ``newline``, ``space``, ``special``, ``word``) and ranked. Only keys seen by at least
  ``min_queries`` queries count: the last few keys of a causal sequence are seen by so few queries
  that a local (previous-token) head makes them look like sinks. ``sink_head_share`` is the share
  of heads that *dump* on the occurrence: ``alpha_k > epsilon`` and ``alpha_k >= sink_ratio`` times
  the uniform value. An occurrence (or, on average, a token) is a sink when its attention ratio
  reaches ``sink_ratio`` (3) or at least one head dumps on it (a share of at least ``1 / #heads``):
  averaged over all heads, one dumping head among many is diluted below any ratio.
- **sink positions** of a sequence: the first position, the ``[SEP]`` of an encoder, and every
  occurrence that is a sink.
- **value norms**: ``value_norm_first`` is the mean ``||v_0||`` of the head's value vector at the
  first position, ``value_norm_other`` its mean over the other body positions, and
  ``value_norm_ratio`` their ratio. ``first_mass_by_norm`` is ``first_mass * value_norm_ratio``:
  the first token's attention weighted by how much its value carries, in units of an ordinary
  token's value (the norm-based view of Kobayashi et al. 2020, before ``W_O``). A head that *parks*
  attention has a large ``first_mass`` but a small ``value_norm_ratio`` and ``first_mass_by_norm``;
  a head that reads the first token's content has both large.
- **confidence** (Voita et al. 2019): the mean over queries of the largest attention weight;
  ``confidence_no_first`` takes the largest weight among keys other than the first position (not
  renormalised). Both average over the queries that see at least two keys (causal: ``i >= 1``).
- **massive activations** (Sun et al. 2024): residual-stream entries (``blocks.{l}.hook_resid_post``,
  so ``layer`` is the block whose output holds them) with ``|x| > abs_threshold`` (100) and
  ``|x| > rel_threshold`` (1000) times the median ``|x|`` of their own hidden state. Per layer the
  *outlier ratio* ``max|x| / median|x|`` of each hidden state is averaged over sink positions and
  over the other positions, next to the largest three magnitudes and the median of each sequence.

Memory: the hooks reduce each layer's ``[batch, head, T, T]`` pattern to per-key sums and per-query
maxima as it is produced, value vectors to their norms and residuals to per-position maxima and
medians (plus the few massive entries): everything kept across layers is linear in ``T``. The
forward pass stops after the last layer's residual output. (The TransformerBridge itself keeps
each layer's pattern on its attention module; :func:`interp.hooks.run_with_reducers` drops it once the layer
is done, see ``analyses/bench_sinks.py``.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from interp._io import atomic_write, atomic_write_json
from interp.cli.common import base_parser, float_in, format_table, positive_int, run_cli
from interp.errors import NonFiniteAttentionError, UsageError
from interp.hooks import layer_of, pattern_hook, resid_post_hook, run_with_reducers, v_hook
from interp.models import ModelInfo, describe
from interp.plots import bars, curves, heatmap, save_figure
from interp.probes import TokenProbe, ordinary_vocab, random_tokens, text_probe
from interp.scores import HeadScores, bootstrap_ratio

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
    resid_median: Float[Tensor, "batch layer pos"]  # median_d |x|
    resid_top: Float[Tensor, "batch layer 3"]  # the 3 largest |x| of each sequence's layer output
    resid_seq_median: Float[Tensor, "batch layer"]  # median |x| over the whole layer output
    massive: list[tuple[int, int, int, int, float, float]]  # layer, seq, pos, dim, value, |x|/median
    max_row_deviation: float  # max |sum_k A[i, k] - 1| seen


def sink_statistics(
    model: Any,
    probe: TokenProbe,
    *,
    abs_threshold: float = ABS_THRESHOLD,
    rel_threshold: float = REL_THRESHOLD,
    max_massive: int = MAX_MASSIVE_PER_LAYER,
    minibatch: int | None = None,
    progress: bool = False,
) -> SinkStatistics:
    """Run ``probe`` through ``model`` once, reducing patterns, values and residuals in their hooks.

    Hooks: ``blocks.{l}.attn.hook_v``, ``blocks.{l}.attn.hook_pattern`` and
    ``blocks.{l}.hook_resid_post``; the pass stops after the last layer's residual output.
    """
    info = describe(model)
    if probe.seq_len > info.n_ctx:
        raise UsageError(f"probe of {probe.seq_len} tokens is longer than the model's context of {info.n_ctx}")
    B, L, H, T = probe.batch, info.n_layers, info.n_heads, probe.seq_len
    scored = _scored_queries(T, info.is_causal)
    stats = SinkStatistics(
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
    )
    step = minibatch or B
    chunks = range(0, B, step)
    for start in tqdm(chunks, desc="sink pass", disable=not progress or len(chunks) == 1):
        sl = slice(start, start + step)

        def values(v: Float[Tensor, "batch pos kv_head d_head"], hook: Any) -> None:
            norm = v.detach().float().norm(dim=-1)
            if norm.shape[-1] != H:  # grouped K/V: one value head serves H / n_kv query heads
                norm = norm.repeat_interleave(H // norm.shape[-1], dim=-1)
            stats.value_norm[sl, layer_of(hook)] = norm.cpu()

        def pattern(a: Float[Tensor, "batch head q k"], hook: Any) -> None:
            layer = layer_of(hook)
            a = a.detach().float()
            rows = a.sum(-1)  # [b, h, q]: NaN or inf here iff anywhere in the row (weights are >= 0)
            if not torch.isfinite(rows).all():
                raise NonFiniteAttentionError(
                    f"layer {layer}: the attention pattern holds NaN or inf; the model is unstable "
                    f"in {info.name}'s dtype on this input: try --dtype float32"
                )
            stats.max_row_deviation = max(stats.max_row_deviation, float((rows - 1).abs().max()))
            stats.received[sl, layer] = a.sum(-2).cpu()
            stats.confidence[sl, layer] = a[:, :, scored].amax(-1).sum(-1).cpu()
            stats.confidence_no_first[sl, layer] = a[:, :, scored, 1:].amax(-1).sum(-1).cpu()

        def residual(x: Float[Tensor, "batch pos d_model"], hook: Any) -> None:
            layer = layer_of(hook)
            x = x.detach().float()
            mag = x.abs()
            med = mag.median(-1).values
            stats.resid_max[sl, layer] = mag.amax(-1).cpu()
            stats.resid_median[sl, layer] = med.cpu()
            flat = mag.flatten(1)
            stats.resid_top[sl, layer] = flat.topk(min(3, flat.shape[1]), dim=-1).values.cpu()
            stats.resid_seq_median[sl, layer] = flat.median(-1).values.cpu()
            hits = (mag > abs_threshold) & (mag > rel_threshold * med[..., None])
            if hits.any():
                idx = hits.nonzero()
                vals = x[hits]
                ratio = mag[hits] / med[idx[:, 0], idx[:, 1]].clamp_min(1e-30)
                keep = vals.abs().argsort(descending=True)[:max_massive]
                for (b, t, d), v, r in zip(idx[keep].tolist(), vals[keep].tolist(), ratio[keep].tolist()):
                    stats.massive.append((layer, start + b, t, d, v, r))

        hooks = []
        for layer in range(L):
            hooks += [(v_hook(layer), values), (pattern_hook(layer), pattern), (resid_post_hook(layer), residual)]
        run_with_reducers(model, probe.tokens[sl], hooks, stop_after=resid_post_hook(L - 1))
    stats.massive.sort(key=lambda m: -abs(m[4]))
    by_layer: dict[int, int] = {}
    kept = []
    for m in stats.massive:  # cap per layer across minibatches
        by_layer[m[0]] = by_layer.get(m[0], 0) + 1
        if by_layer[m[0]] <= max_massive:
            kept.append(m)
    stats.massive = kept
    return stats


def _scored_queries(T: int, causal: bool) -> slice:
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


# --------------------------------------------------------------------------------------------
# the report


@dataclass
class SinkReport:
    """Everything :func:`sink_scores` found: one per-head table and four tidy tables.

    - ``heads``: a :class:`HeadScores`, a row per (layer, head) (see the module docstring);
    - ``layers``: a row per layer: Sink^eps of the first token (and of ``[SEP]``), residual
      magnitudes, outlier ratios at sink positions and elsewhere, massive-activation counts;
    - ``positions``: a row per (layer, position): ``alpha_k`` summarised over the layer's heads;
    - ``tokens``: sink discovery, a row per (token, role), ranked by attention ratio;
    - ``massive``: a row per massive activation, largest first.
    """

    heads: HeadScores
    layers: pd.DataFrame
    positions: pd.DataFrame
    tokens: pd.DataFrame
    massive: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sink_rate(self) -> float:
        """Model-level Sink_0^eps: the share of all heads whose first-token mass exceeds epsilon."""
        return float(self.meta["sink_rate"])

    def roles(self) -> pd.DataFrame:
        """Sink discovery summarised by role (first, BOS, [SEP], punctuation, newline, word, ...)."""
        t = self.tokens
        if t.empty:
            return pd.DataFrame(columns=["role", "occurrences", "attention_ratio", "sink_head_share"])
        w = t["occurrences"]
        out = (
            t.assign(r=t["attention_ratio"] * w, s=t["sink_head_share"] * w)
            .groupby("role", sort=False)
            .agg(occurrences=("occurrences", "sum"), r=("r", "sum"), s=("s", "sum"))
        )
        out["attention_ratio"] = out.pop("r") / out["occurrences"]
        out["sink_head_share"] = out.pop("s") / out["occurrences"]
        return out.reset_index().sort_values("attention_ratio", ascending=False, kind="mergesort")

    def save(self, out: str | Path, stem: str = "sinks") -> list[Path]:
        """Write ``<stem>.csv/.json`` (heads), ``<stem>_{layers,positions,tokens,massive}.csv`` and
        ``<stem>_summary.json`` (meta, layers, roles, the top tokens and massive activations), atomically."""
        out = Path(out)
        written = self.heads.save(out, stem)
        for name in ("layers", "positions", "tokens", "massive"):
            frame: pd.DataFrame = getattr(self, name)
            written.append(atomic_write(out / f"{stem}_{name}.csv", frame.to_csv(index=False)))
        records = lambda f: json.loads(f.to_json(orient="records"))  # noqa: E731
        written.append(
            atomic_write_json(
                out / f"{stem}_summary.json",
                {
                    "meta": self.meta,
                    "layers": records(self.layers),
                    "roles": records(self.roles()),
                    "top_tokens": records(self.tokens.head(50)),
                    "top_massive": records(self.massive.head(50)),
                },
            )
        )
        return written


def sink_scores(
    model: Any,
    probe: TokenProbe | None = None,
    *,
    epsilon: float = EPSILON,
    abs_threshold: float = ABS_THRESHOLD,
    rel_threshold: float = REL_THRESHOLD,
    sink_ratio: float = SINK_RATIO,
    min_queries: int = MIN_QUERIES,
    max_massive: int = MAX_MASSIVE_PER_LAYER,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    minibatch: int | None = None,
    progress: bool = False,
) -> SinkReport:
    """Find attention sinks and massive activations in ``model`` on ``probe``.

    ``probe`` defaults to Gu et al.'s: ``random_tokens(model, seed=seed)`` (16 x 64 random tokens).
    ``first_mass`` carries a bootstrap interval over sequences at ``level``.
    """
    if not 0 < epsilon < 1:
        raise UsageError(f"epsilon must be between 0 and 1, got {epsilon}")
    for name, value in (("abs_threshold", abs_threshold), ("rel_threshold", rel_threshold), ("sink_ratio", sink_ratio)):
        if not value > 0:
            raise UsageError(f"{name} must be > 0, got {value}")
    if probe is None:
        probe = random_tokens(model, seed=seed)
    info = describe(model)
    stats = sink_statistics(
        model,
        probe,
        abs_threshold=abs_threshold,
        rel_threshold=rel_threshold,
        max_massive=max_massive,
        minibatch=minibatch,
        progress=progress,
    )
    T, causal, L, H = probe.seq_len, info.is_causal, info.n_layers, info.n_heads
    n_k = queries_per_key(T, causal)
    alpha_seq = stats.received / n_k  # [B, L, H, T]
    alpha = alpha_seq.mean(0)  # [L, H, T]
    sep = _sep_position(info, probe)
    eligible = n_k >= min(min_queries, T)
    first = _first_label(info, probe)

    heads = _head_table(stats, alpha, sep, eligible, probe, causal, n_boot, level, seed)
    occ = _occurrences(alpha_seq, probe, info, model, eligible, epsilon, sink_ratio)
    is_sink = lambda f: (f["attention_ratio"] >= sink_ratio) | (f["sink_head_share"] >= 0.999 / (L * H))  # noqa: E731
    sink_pos = _sink_positions(occ[is_sink(occ)], probe, sep)
    tokens = _token_table(occ, is_sink)
    massive = _massive_table(stats, probe, model, info, sink_pos)
    layers = _layer_table(alpha, stats, sep, sink_pos, massive, epsilon, info)
    positions = _position_table(alpha, epsilon, sep, n_k, first)

    shares = (alpha[:, :, 0] > epsilon).float()
    meta = {
        "model": info.name,
        "n_layers": info.n_layers,
        "n_heads": info.n_heads,
        "causal": causal,
        "first_token": first,
        "sep_position": sep,
        "probe": probe.meta,
        "epsilon": epsilon,
        "sink_rate": float(shares.mean()),
        "sep_sink_rate": None if sep is None else float((alpha[:, :, sep] > epsilon).float().mean()),
        "uniform_first_mass": float(uniform_mass(T, causal)[0]),
        "abs_threshold": abs_threshold,
        "rel_threshold": rel_threshold,
        "sink_ratio": sink_ratio,
        "min_queries": min_queries,
        "n_massive": len(massive),
        "max_row_sum_deviation": stats.max_row_deviation,
        "ci_level": level,
        "n_boot": n_boot,
        "seed": seed,
    }
    heads.meta.update(meta)
    return SinkReport(heads=heads, layers=layers, positions=positions, tokens=tokens, massive=massive, meta=meta)


def _first_label(info: ModelInfo, probe: TokenProbe) -> str:
    if probe.body_start == 0:
        return "first token"
    return "BOS" if info.is_causal else "[CLS]"


def _sep_position(info: ModelInfo, probe: TokenProbe) -> int | None:
    """The encoder's trailing ``[SEP]`` position, when the probe is framed with one."""
    if info.is_causal or info.sep_token_id is None or probe.body_end >= probe.seq_len:
        return None
    return probe.body_end


def _head_table(
    stats: SinkStatistics,
    alpha: Tensor,
    sep: int | None,
    eligible: Tensor,
    probe: TokenProbe,
    causal: bool,
    n_boot: int,
    level: float,
    seed: int,
) -> HeadScores:
    T = probe.seq_len
    n_k = queries_per_key(T, causal)
    num = stats.received[..., 0]
    point, lo, hi = bootstrap_ratio(num, torch.full_like(num, float(n_k[0])), n_boot=n_boot, level=level, seed=seed)
    grids: dict[str, Tensor] = {"first_mass": point, "first_mass_lo": lo, "first_mass_hi": hi}
    if sep is not None:
        grids["sep_mass"] = alpha[..., sep]
    other = alpha.clone()
    other[..., 0] = -1.0
    other[..., ~eligible] = -1.0
    if other.shape[-1] > 1:
        grids["top_other_mass"], grids["top_other_pos"] = other.max(-1)
        grids["top_other_mass"] = grids["top_other_mass"].clamp_min(0)
    n_scored = len(range(T)[_scored_queries(T, causal)])
    grids["confidence"] = stats.confidence.mean(0) / max(n_scored, 1)
    grids["confidence_no_first"] = stats.confidence_no_first.mean(0) / max(n_scored, 1)
    vn = stats.value_norm  # [B, L, T, H]
    body = torch.zeros(T, dtype=torch.bool)
    body[max(probe.body_start, 1) : probe.body_end] = True
    if sep is not None:
        body[sep] = False
    vn_first = vn[:, :, 0].mean(0)  # [L, H]
    vn_other = vn[:, :, body].mean((0, 2)) if body.any() else torch.full_like(vn_first, float("nan"))
    grids["value_norm_first"] = vn_first
    grids["value_norm_other"] = vn_other
    grids["value_norm_ratio"] = vn_first / vn_other.clamp_min(1e-30)
    if sep is not None:
        grids["sep_value_norm_ratio"] = vn[:, :, sep].mean(0) / vn_other.clamp_min(1e-30)
    grids["first_mass_by_norm"] = point * grids["value_norm_ratio"]
    return HeadScores.from_grids(grids)


_PUNCT = lambda s: bool(s) and all(unicodedata.category(c).startswith(("P", "S")) for c in s)  # noqa: E731


def token_texts(model: Any, probe: TokenProbe, ids: Sequence[int]) -> dict[int, str]:
    """A readable string per token id: the tokenizer's, or the byte a byte-mapped text probe used."""
    tok = getattr(model, "tokenizer", None)
    if tok is not None:
        return {i: tok.decode([i]) for i in ids}
    info = describe(model)
    names = {info.bos_token_id: "<bos>"} if info.bos_token_id is not None else {}
    if str(probe.meta.get("tokenization", "")).startswith("utf-8 bytes"):
        index = {int(t): j for j, t in enumerate(ordinary_vocab(info).tolist())}
        for i in ids:
            j = index.get(i)
            if i not in names and j is not None and j < 256:
                names[i] = chr(j) if j < 128 else f"\\x{j:02x}"
    return {i: names.get(i, f"<{i}>") for i in ids}


def _role(token: int, text: str, position: int, info: ModelInfo) -> str:
    if position == 0:
        return "first"
    if token == info.sep_token_id:
        return "[SEP]"
    if token == info.cls_token_id:
        return "[CLS]"
    if token == info.bos_token_id:
        return "BOS"
    if token in info.special_token_ids:
        return "special"
    if "\n" in text:
        return "newline"
    if not text.strip():
        return "space"
    return "punctuation" if _PUNCT(text.strip()) else "word"


def _occurrences(
    alpha_seq: Tensor,
    probe: TokenProbe,
    info: ModelInfo,
    model: Any,
    eligible: Tensor,
    epsilon: float,
    sink_ratio: float,
) -> pd.DataFrame:
    """A row per eligible (sequence, position): its token, role and the attention it draws."""
    uniform = uniform_mass(probe.seq_len, probe.causal)
    ratio = alpha_seq.mean((1, 2)) / uniform  # [B, T]
    share = ((alpha_seq > epsilon) & (alpha_seq >= sink_ratio * uniform)).float().mean((1, 2))
    mass = alpha_seq.mean((1, 2))
    tokens = probe.tokens.cpu()
    b, k = torch.meshgrid(torch.arange(probe.batch), torch.arange(probe.seq_len), indexing="ij")
    keep = eligible.expand(probe.batch, -1)
    ids = tokens[keep].tolist()
    texts = token_texts(model, probe, sorted(set(ids)))
    pos = k[keep].tolist()
    return pd.DataFrame(
        {
            "sequence": b[keep].numpy(),
            "position": pos,
            "token_id": ids,
            "token": [texts[i] for i in ids],
            "role": [_role(i, texts[i], p, info) for i, p in zip(ids, pos)],
            "attention_ratio": ratio[keep].numpy(),
            "mass": mass[keep].numpy(),
            "sink_head_share": share[keep].numpy(),
        }
    )


def _sink_positions(hit: pd.DataFrame, probe: TokenProbe, sep: int | None) -> Tensor:
    """``[batch, pos]``: the first position, an encoder's [SEP], and the sink occurrences ``hit``."""
    mask = torch.zeros(probe.batch, probe.seq_len, dtype=torch.bool)
    mask[:, 0] = True
    if sep is not None:
        mask[:, sep] = True
    mask[
        torch.tensor(hit["sequence"].tolist(), dtype=torch.long),
        torch.tensor(hit["position"].tolist(), dtype=torch.long),
    ] = True
    return mask


def _token_table(occ: pd.DataFrame, is_sink: Callable[[pd.DataFrame], pd.Series]) -> pd.DataFrame:
    cols = [
        "token",
        "token_id",
        "role",
        "occurrences",
        "mean_position",
        "attention_ratio",
        "mass",
        "sink_head_share",
        "is_sink",
    ]
    if occ.empty:
        return pd.DataFrame(columns=cols)
    g = (
        occ.groupby(["token_id", "role"], sort=False)
        .agg(
            token=("token", "first"),
            occurrences=("position", "size"),
            mean_position=("position", "mean"),
            attention_ratio=("attention_ratio", "mean"),
            mass=("mass", "mean"),
            sink_head_share=("sink_head_share", "mean"),
        )
        .reset_index()
    )
    g["is_sink"] = is_sink(g)
    g = g.sort_values(["attention_ratio", "occurrences"], ascending=[False, False], kind="mergesort")
    return g[cols].reset_index(drop=True)


def _massive_table(
    stats: SinkStatistics, probe: TokenProbe, model: Any, info: ModelInfo, sink_pos: Tensor
) -> pd.DataFrame:
    cols = ["layer", "sequence", "position", "token", "role", "dim", "value", "magnitude_ratio", "on_sink"]
    if not stats.massive:
        return pd.DataFrame(columns=cols)
    frame = pd.DataFrame(stats.massive, columns=["layer", "sequence", "position", "dim", "value", "magnitude_ratio"])
    seq, pos = frame["sequence"].tolist(), frame["position"].tolist()
    ids = probe.tokens.cpu()[seq, pos].tolist()
    texts = token_texts(model, probe, sorted(set(ids)))
    frame["token"] = [texts[i] for i in ids]
    frame["role"] = [_role(i, texts[i], p, info) for i, p in zip(ids, pos)]
    frame["on_sink"] = sink_pos[seq, pos].numpy()
    return frame[cols]


def _layer_table(
    alpha: Tensor,
    stats: SinkStatistics,
    sep: int | None,
    sink_pos: Tensor,
    massive: pd.DataFrame,
    epsilon: float,
    info: ModelInfo,
) -> pd.DataFrame:
    L, H = alpha.shape[:2]
    first = (alpha[:, :, 0] > epsilon).sum(1)
    data: dict[str, Any] = {
        "layer": np.arange(L),
        "n_heads": H,
        "sink_heads": first.numpy(),
        "sink_share": first.numpy() / H,
    }
    if sep is not None:
        s = (alpha[:, :, sep] > epsilon).sum(1)
        data.update(sep_sink_heads=s.numpy(), sep_sink_share=s.numpy() / H)
    top = stats.resid_top.mean(0)  # [L, 3]
    for j in range(3):
        data[f"resid_top{j + 1}"] = top[:, j].numpy()
    data["resid_median"] = stats.resid_seq_median.mean(0).numpy()
    ratio = stats.resid_max / stats.resid_median.clamp_min(1e-30)  # [B, L, T]
    sink = sink_pos[:, None, :].expand_as(ratio)
    data["outlier_ratio_sink"] = _masked_mean(ratio, sink).numpy()
    data["outlier_ratio_other"] = _masked_mean(ratio, ~sink).numpy()
    counts = massive.groupby("layer").size() if len(massive) else pd.Series(dtype=int)
    data["n_massive"] = [int(counts.get(layer, 0)) for layer in range(L)]
    return pd.DataFrame(data)


def _masked_mean(x: Float[Tensor, "batch layer pos"], mask: Tensor) -> Float[Tensor, " layer"]:
    m = mask.float()
    total = m.sum((0, 2))
    return torch.where(total > 0, (x * m).sum((0, 2)) / total.clamp_min(1), torch.tensor(float("nan")))


def _position_table(alpha: Tensor, epsilon: float, sep: int | None, n_k: Tensor, first: str) -> pd.DataFrame:
    L, H, T = alpha.shape
    layer, pos = np.meshgrid(np.arange(L), np.arange(T), indexing="ij")
    best, best_head = alpha.max(1)  # [L, T]
    role = np.array(["body"] * T, dtype=object)
    role[0] = first
    if sep is not None:
        role[sep] = "[SEP]"
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "position": pos.ravel(),
            "role": np.tile(role, L),
            "n_queries": np.tile(n_k.numpy().astype(int), L),
            "mean_mass": alpha.mean(1).numpy().ravel(),
            "max_mass": best.numpy().ravel(),
            "max_head": best_head.numpy().ravel(),
            "sink_share": (alpha > epsilon).float().mean(1).numpy().ravel(),
        }
    )


# --------------------------------------------------------------------------------------------
# figures


def first_mass_heatmap(report: SinkReport) -> go.Figure:
    """Layer x head heatmap of first-token mass (and [SEP] mass for encoders), on a 0..1 scale."""
    first = report.meta["first_token"]
    cols = ["first_mass"] + (["sep_mass"] if "sep_mass" in report.heads.table else [])
    return heatmap(
        report.heads,
        cols,
        zmin=0.0,
        zmax=1.0,
        title=f"{report.meta['model']}: attention mass on the first token ({first})"
        + (" and on [SEP]" if len(cols) > 1 else ""),
    )


def sink_rate_bars(report: SinkReport) -> go.Figure:
    """Sink_k^eps per layer: the share of heads whose mass on the first token (and [SEP]) exceeds eps."""
    eps, first = report.meta["epsilon"], report.meta["first_token"]
    fig = bars(
        report.layers,
        "layer",
        "sink_share",
        title=f"{report.meta['model']}: Sink^eps per layer (eps = {eps}; model: {report.sink_rate:.0%})",
        y_title=f"share of heads with mass > {eps}",
    )
    fig.data[0].name = f"first token ({first})"
    if "sep_sink_share" in report.layers:
        fig.add_trace(go.Bar(x=report.layers["layer"], y=report.layers["sep_sink_share"], name="[SEP]"))
        fig.update_layout(barmode="group", showlegend=True)
    fig.update_yaxes(range=[0, 1])
    return fig


def residual_curves(report: SinkReport) -> go.Figure:
    """The largest three residual magnitudes and the median, by layer (Sun et al.'s figure), log scale."""
    cols = ["resid_top1", "resid_top2", "resid_top3", "resid_median"]
    long = report.layers.melt(id_vars="layer", value_vars=cols, var_name="magnitude", value_name="value")
    long["magnitude"] = long["magnitude"].map(
        {"resid_top1": "top 1", "resid_top2": "top 2", "resid_top3": "top 3", "resid_median": "median"}
    )
    return curves(
        long,
        "layer",
        "value",
        "magnitude",
        log_y=True,
        y_title="|residual| (mean over sequences)",
        title=f"{report.meta['model']}: largest residual-stream magnitudes by layer",
    )


# --------------------------------------------------------------------------------------------
# CLI: python -m interp.sinks

STEM = "sinks"


def build_parser(prog: str = "python -m interp.sinks") -> argparse.ArgumentParser:
    p = base_parser(
        prog,
        "Find attention-sink heads, the tokens they park attention on, and the massive "
        "residual activations behind them.",
    )
    p.set_defaults(batch=16)
    p.add_argument(
        "--probe",
        choices=["random", "text"],
        default=None,
        help="random tokens (Gu et al.) or natural text (default: text with --dataset, else random)",
    )
    p.add_argument(
        "--dataset",
        default=None,
        help="text probe source: a Hub data set NAME[:CONFIG] or a local .txt/.json/.csv file "
        "(default: the bundled English text in data/text)",
    )
    p.add_argument("--split", default="train", help="--dataset split")
    p.add_argument("--text-column", default="text", help="--dataset column holding the text")
    p.add_argument("--seq-len", type=positive_int, default=64, help="body tokens per sequence")
    p.add_argument(
        "--epsilon",
        type=float_in(0, 1, low_open=True, high_open=True),
        default=EPSILON,
        help="Sink_k^eps threshold on a head's mass",
    )
    p.add_argument(
        "--sink-ratio",
        type=float_in(0, low_open=True),
        default=SINK_RATIO,
        help="a token is a sink when it draws this many times a uniform head's attention",
    )
    p.add_argument(
        "--abs-threshold",
        type=float_in(0, low_open=True),
        default=ABS_THRESHOLD,
        help="massive activation: |x| above this",
    )
    p.add_argument(
        "--rel-threshold",
        type=float_in(0, low_open=True),
        default=REL_THRESHOLD,
        help="massive activation: |x| above this times its hidden state's median |x|",
    )
    p.add_argument("--minibatch", type=positive_int, default=None, help="sequences per forward pass")
    return p


def main(args: argparse.Namespace, model: Any, out: Path) -> list[Path]:
    kind = args.probe or ("text" if args.dataset else "random")
    if kind == "random" and args.dataset:
        raise UsageError("--dataset needs --probe text")
    if kind == "text":
        probe = text_probe(
            model,
            batch=args.batch,
            seq_len=args.seq_len,
            seed=args.seed,
            dataset=args.dataset,
            split=args.split,
            text_column=args.text_column,
        )
    else:
        probe = random_tokens(model, batch=args.batch, seq_len=args.seq_len, seed=args.seed)
    info = describe(model)
    t0 = time.perf_counter()
    report = sink_scores(
        model,
        probe,
        epsilon=args.epsilon,
        abs_threshold=args.abs_threshold,
        rel_threshold=args.rel_threshold,
        sink_ratio=args.sink_ratio,
        seed=args.seed,
        minibatch=args.minibatch,
        progress=not args.no_progress,
    )
    elapsed = time.perf_counter() - t0
    report.meta["model_spec"] = report.heads.meta["model_spec"] = args.model
    print(_summary(report, info, probe, args.top, elapsed))

    written = report.save(out, STEM)
    for suffix, fig in (
        ("heatmap", first_mass_heatmap(report)),
        ("layers", sink_rate_bars(report)),
        ("residual", residual_curves(report)),
    ):
        written += save_figure(fig, out, f"{STEM}_{suffix}")
    return written


def _summary(report: SinkReport, info: ModelInfo, probe: TokenProbe, top: int, elapsed: float) -> str:
    m = report.meta
    first, eps = m["first_token"], m["epsilon"]
    framing = probe.meta.get("framing", [])
    shape = "+".join(
        [f for f in framing if f != "[SEP]"]
        + [str(probe.body_end - probe.body_start)]
        + [f for f in framing if f == "[SEP]"]
    )
    what = "random tokens" if probe.meta.get("kind") == "random_tokens" else f"text from {probe.meta.get('source')}"
    sep = m["sep_position"] is not None
    lines = [
        f"{info.name} ({'causal' if info.is_causal else 'encoder'}, {info.n_layers} layers x {info.n_heads} "
        f"heads); probe: {probe.batch} x ({shape}) tokens of {what}, seed {m['seed']}; scored in {elapsed:.2f}s",
        f"first token = {first}"
        + (f"; [SEP] at position {m['sep_position']}" if sep else "")
        + f"; a uniform head gives the first token {m['uniform_first_mass']:.3f}",
        "",
        f"Sink_0^eps (eps = {eps}): {m['sink_rate']:.1%} of heads put more than {eps} on the first token"
        + (f"; {m['sep_sink_rate']:.1%} on [SEP]" if sep else ""),
        "per layer: Sink^eps; largest |residual| and outlier ratio max|x|/median|x| at sink positions vs elsewhere:",
    ]
    lay = report.layers
    cols = (
        ["layer", "sink_heads", "sink_share"]
        + (["sep_sink_heads", "sep_sink_share"] if sep else [])
        + ["resid_top1", "outlier_ratio_sink", "outlier_ratio_other", "n_massive"]
    )
    lines += [lay[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"), ""]

    ranked = report.heads.rank("first_mass", top=top)
    score_cols = (
        ["first_mass"]
        + (["sep_mass"] if sep else [])
        + ["confidence", "confidence_no_first", "value_norm_ratio", "first_mass_by_norm"]
    )
    lines += [
        f"top {len(ranked)} sink heads by first-token ({first}) mass ({m['ci_level']:.0%} bootstrap CI):",
        format_table(ranked, score_cols, ci=["first_mass"]),
        "",
    ]

    roles = report.roles()
    if len(roles):
        lines += [
            "attention drawn by role (x uniform): "
            + ", ".join(f"{r} {v:.2f}" for r, v in zip(roles["role"], roles["attention_ratio"]))
        ]
    toks = report.tokens.head(top)
    if len(toks):
        lines += [
            f"top {len(toks)} sink tokens (attention x uniform; a sink draws >= {m['sink_ratio']:g} x, "
            f"or a head dumps > {eps} on it):",
            toks.assign(token=toks["token"].map(repr))[
                ["token", "role", "occurrences", "mean_position", "attention_ratio", "sink_head_share", "is_sink"]
            ].to_string(index=False, float_format=lambda v: f"{v:.2f}"),
            "",
        ]

    mas = report.massive.head(top)
    limits = f"|x| > {m['abs_threshold']:g} and > {m['rel_threshold']:g} x the median of its hidden state"
    if len(mas):
        lines += [
            f"largest {len(mas)} of {m['n_massive']} massive activations ({limits}):",
            mas.assign(token=mas["token"].map(repr))[
                ["layer", "sequence", "position", "token", "dim", "value", "magnitude_ratio", "on_sink"]
            ].to_string(index=False, float_format=lambda v: f"{v:.1f}"),
        ]
    else:
        i = int(lay["resid_top1"].to_numpy().argmax())
        lines.append(f"no massive activations ({limits}); largest |x| {lay['resid_top1'].iloc[i]:.3g} at layer {i}")
    return "\n".join(lines)


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.sinks") -> int:
    return run_cli(build_parser(prog), main, argv, STEM)


if __name__ == "__main__":
    sys.exit(cli())
