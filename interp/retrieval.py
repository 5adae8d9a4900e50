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

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.adapters import run_with_reducers
from interp.errors import NonFiniteAttentionError, UsageError
from interp.hooks import layer_of, pattern_hook
from interp.models import describe
from interp.probes.needle import NeedleProbe, needle_probe
from interp.scores import HeadScores, bootstrap_ratio

RETRIEVAL_THRESHOLD = 0.1  # Wu et al. 2024
STREAMING_THRESHOLD = 0.9  # share of attention on sink + window
ROLES = ("retrieval", "streaming", "neither")
QUERY_BLOCK = 256  # queries per cumulative sum in the streaming reduction


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


def retrieval_counts(
    model: Any,
    probe: NeedleProbe,
    *,
    sink: int | None = 4,
    window: int | None = 1024,
    minibatch: int | None = None,
    engine: str = "pattern",
) -> RetrievalCounts:
    """One pass over ``probe``: every head's retrieval hits and masses per needle and, unless
    ``window`` is None, its sink + window share per sequence (see the module docstring)."""
    info = _check(model, probe, engine)
    streaming = window is not None
    if streaming:
        _check_window(probe, sink, window)
    L, H, B, N = info.n_layers, info.n_heads, probe.batch, probe.n_needles
    ret, ret_needle = probe.retrieval_pairs(), probe.retrieval_needles()
    ind, ind_needle = probe.copy_induction_pairs(), probe.copy_induction_needles()
    counts = RetrievalCounts(
        hits=torch.zeros(N, L, H, dtype=torch.float64),
        mass=torch.zeros(N, L, H, dtype=torch.float64),
        steps=torch.bincount(ret_needle, minlength=N).double(),
        induction=torch.zeros(N, L, H, dtype=torch.float64),
        induction_steps=torch.bincount(ind_needle, minlength=N).double(),
        stream=torch.zeros(B, L, H, dtype=torch.float64) if streaming else None,
        stream_queries=torch.full((B,), float(probe.seq_len - sink - window)) if streaming else None,
    )
    step = minibatch or B
    for start in range(0, B, step):
        rows = slice(start, min(start + step, B))
        in_ret = (ret[:, 0] >= rows.start) & (ret[:, 0] < rows.stop)
        in_ind = (ind[:, 0] >= rows.start) & (ind[:, 0] < rows.stop)
        local_ret, needles_ret = ret[in_ret] - torch.tensor([start, 0, 0]), ret_needle[in_ret]
        local_ind, needles_ind = ind[in_ind] - torch.tensor([start, 0, 0]), ind_needle[in_ind]

        def reduce(pattern: Float[Tensor, "batch head q k"], hook: Any) -> None:
            layer = layer_of(hook)
            pattern = pattern.detach()
            if not torch.isfinite(pattern).all():
                raise NonFiniteAttentionError(
                    f"layer {layer}: the attention pattern holds NaN or inf; the model is unstable "
                    f"in {info.name}'s dtype on this input: load it in float32 (command line: --dtype float32)"
                )
            hits, mass = argmax_hits(pattern, local_ret.to(pattern.device))
            counts.hits[:, layer].index_add_(0, needles_ret, hits.double().cpu())
            counts.mass[:, layer].index_add_(0, needles_ret, mass.double().cpu())
            _, ind_mass = argmax_hits(pattern, local_ind.to(pattern.device), argmax=False)
            counts.induction[:, layer].index_add_(0, needles_ind, ind_mass.double().cpu())
            if streaming:
                counts.stream[rows, layer] = window_share(pattern, sink, window).sum(-1).cpu()

        run_with_reducers(
            model,
            probe.tokens[rows],
            [(pattern_hook(l), reduce) for l in range(L)],
            stop_after=pattern_hook(L - 1),
        )
    return counts


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
    model: Any,
    probe: NeedleProbe | None = None,
    *,
    sink: int = 4,
    window: int = 1024,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    minibatch: int | None = None,
    engine: str = "pattern",
) -> HeadScores:
    """Score every head as retrieval / streaming head on a needle probe (see the module docstring).

    ``probe`` defaults to ``needle_probe(model, seed=seed)``. Columns: ``retrieval`` (with
    ``_lo``/``_hi``, bootstrap over needles), ``retrieval_mass``, ``streaming`` (with ``_lo``/``_hi``,
    bootstrap over sequences) and ``role`` (``"retrieval"``, ``"streaming"`` or ``"neither"``).
    ``meta`` records the thresholds, ``sink``, ``window`` and the probe.
    """
    if probe is None:
        probe = needle_probe(model, seed=seed)
    info = describe(model)
    counts = retrieval_counts(model, probe, sink=sink, window=window, minibatch=minibatch, engine=engine)
    steps = counts.steps[:, None, None].expand_as(counts.hits)
    point, lo, hi = bootstrap_ratio(counts.hits, steps, n_boot=n_boot, level=level, seed=seed)
    grids = {"retrieval": point, "retrieval_lo": lo, "retrieval_hi": hi}
    grids["retrieval_mass"] = (counts.mass.sum(0) / counts.steps.sum()).float()
    queries = counts.stream_queries[:, None, None].expand_as(counts.stream)
    point, lo, hi = bootstrap_ratio(counts.stream, queries, n_boot=n_boot, level=level, seed=seed)
    grids.update({"streaming": point, "streaming_lo": lo, "streaming_hi": hi})
    scores = HeadScores.from_grids(
        grids,
        {
            "model": info.name,
            "n_layers": info.n_layers,
            "n_heads": info.n_heads,
            "probe": probe.meta,
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


def copy_distance_scores(model: Any, probe: NeedleProbe, *, minibatch: int | None = None) -> pd.DataFrame:
    """Tidy ``(layer, head, distance)`` rows with ``induction``, ``retrieval``, ``retrieval_mass``,
    ``uniform`` (the induction mass of a uniform head) and ``n_needles``; see the module docstring.

    Any :class:`NeedleProbe` works; on a :func:`~interp.probes.needle.needle_probe` the distances are
    those between each needle and its copy.
    """
    counts = retrieval_counts(model, probe, window=None, minibatch=minibatch)
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


# ---------------------------------------------------------------------------------------------
# checks


def _check(model: Any, probe: Any, engine: str) -> Any:
    if engine != "pattern":
        raise UsageError(
            f"retrieval scores run on the pattern engine for now, got engine={engine!r}: "
            "the stream engine's row argmax is not built yet"
        )
    if not isinstance(probe, NeedleProbe):
        raise UsageError(
            "retrieval scores need a needle probe: interp.probes.needle.needle_probe or copy_distance_probe"
        )
    info = describe(model)
    if probe.seq_len > info.n_ctx:
        raise UsageError(f"probe of {probe.seq_len} tokens is longer than the model's context of {info.n_ctx}")
    return info


def _check_window(probe: NeedleProbe, sink: int, window: int) -> None:
    for name, value in (("sink", sink), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "sink" else 1):
            raise UsageError(f"{name} must be an integer >= {0 if name == 'sink' else 1}, got {value!r}")
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
    "copy_distance_scores",
    "retrieval_counts",
    "retrieval_scores",
    "window_share",
]
