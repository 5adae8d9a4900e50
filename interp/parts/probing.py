"""The parts on probes of their own: the attention-pattern viewer and the retrieval heads on a needle probe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from interp.adapters import HookedModel, ModelInfo
from interp.config import RunConfig
from interp.errors import UsageError
from interp.parts.base import Given, NotApplicable, PartResult, part
from interp.parts.shape import body_room, frame, info_of
from interp.progress import forward_work

# the retrieval part's needle probe: Wu et al.'s needles at three depths, as `interp retrieval` reads them
DEPTHS, NEEDLE_LEN, NEEDLE_BATCH = (0.1, 0.5, 0.9), 8, 2
RETRIEVAL_COLUMNS = (
    "retrieval",
    "retrieval_lo",
    "retrieval_hi",
    "retrieval_mass",
    "streaming",
    "streaming_lo",
    "streaming_hi",
)
COPY_SPAN = 8  # tokens of each copy-distance probe's copied span


# ---- the attention-pattern viewer -----------------------------------------------------------------


@dataclass(frozen=True)
class PatternSizes:
    """The viewer's sequence: one block of ``view_len`` random tokens, repeated once; ``heads``
    shown first (LAYER.HEAD labels; None: the strongest head of each role)."""

    view_len: int = 12
    heads: tuple[str, ...] | None = None


def _patterns_applies(info: ModelInfo, sizes: PatternSizes, given: Given) -> NotApplicable | None:
    bad = [h for h in sizes.heads or () if h not in set(info.head_labels())]
    if bad:
        raise UsageError(
            f"no head {', '.join(bad)} in this model: heads are LAYER.HEAD, up to {info.head_labels()[-1]}"
        )
    return None


def _patterns_work(info: ModelInfo, sizes: PatternSizes) -> tuple[str, float]:
    n = 2 * sizes.view_len + frame(info)
    return f"the attention-pattern viewer (1 x {n} tokens)", forward_work(n, info.n_layers, info.d_model)


@part(
    "patterns",
    "the attention-pattern viewer",
    PatternSizes,
    work=_patterns_work,
    order=10,
    applicable=_patterns_applies,
    atlas="pattern",
    reads_roles=True,
)
def _patterns(model: HookedModel, sizes: PatternSizes, cfg: RunConfig, given: Given) -> PartResult:
    scores = given.result("scores")
    on_probe = set(scores.score_names) if scores is not None else None
    view = pattern_view(model, given.roles(), sizes.view_len, list(sizes.heads or []), cfg.seed, on_probe)
    return PartResult(result=view)


def pattern_view(
    model: HookedModel,
    roles: pd.DataFrame,
    view_len: int,
    view_heads: list[str] | None,
    seed: int,
    on_probe: set[str] | None = None,
) -> dict:
    """The viewer's sequence: its tokens, every head's pattern on it, and the heads shown first."""
    from interp.probes import repeated_tokens
    from interp.report.patterns import attention_patterns, token_labels

    probe = repeated_tokens(model, batch=1, block_len=view_len, n_repeats=2, seed=seed + 1)
    ids = probe.tokens[0]
    patterns = attention_patterns(model, ids).numpy()
    if view_heads:
        selected = list(dict.fromkeys(view_heads))
    else:
        selected = _strongest(roles, on_probe)
    return {
        "tokens": token_labels(model, ids.tolist(), probe),  # partial characters as their bytes
        "patterns": np.round(patterns, 3),
        "selected": selected,
        "probe": probe.meta,
    }


def _strongest(roles: pd.DataFrame, on_probe: set[str] | None) -> list[str]:
    """The strongest head of each role scored on the repeated probe the viewer shows (``on_probe``:
    every role when None); of the other roles (weights, text), the strongest head named for it."""
    from interp.report.roles import role_columns

    selected = []
    for col, role in role_columns().items():
        if col in roles and roles[col].notna().any():
            pool = (
                roles
                if on_probe is None or col in on_probe
                else roles[roles["role"].str.split(", ").map(lambda r, role=role: role in r)]
            )
            if pool.empty:
                continue
            best = pool.sort_values([col, "layer", "head"], ascending=[False, True, True], kind="mergesort")
            selected.append(best["label"].iloc[0])
    return list(dict.fromkeys(selected))


# ---- retrieval ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrievalSizes:
    """The needle probe: 2 sequences of ``seq_len`` body tokens (None: ``min(1024, the context)``)
    holding 3 needles of 8 tokens; ``distances``: also the copy-distance curves up to its length."""

    seq_len: int | None = None
    distances: bool = True


def retrieval_fits(label: str, room: int, asked: int | None) -> int:
    """The needle probe's length for a context of ``room`` body tokens: ``asked``, else
    ``min(1024, room)``; a one-line :class:`UsageError` when the context cannot hold it."""
    from interp.probes.needle import DEFAULT_SEQ_LEN

    least = 2 * len(DEPTHS) * NEEDLE_LEN + NEEDLE_LEN  # the needles, their copies and a haystack of one needle
    length = asked or min(DEFAULT_SEQ_LEN, room)
    if least <= length <= room:
        return length
    what = f"{len(DEPTHS)} needles of {NEEDLE_LEN} tokens, their copies and a haystack"
    if room < least:
        raise UsageError(
            f"the retrieval score's needle probe ({what}) needs at least {least} tokens and {label}'s context "
            f"holds {room}: leave out retrieval=True (command line: --retrieval)"
        )
    raise UsageError(
        f"the retrieval score's needle probe ({what}) cannot be {length} tokens: {label}'s context holds {room} and "
        f"the probe needs at least {least}; ask for retrieval_len={least} to {room} (command line: --retrieval-len)"
    )


def _retrieval_applies(info: ModelInfo, sizes: RetrievalSizes, given: Given) -> NotApplicable | None:
    """Needle probes need a causal model; a length the context cannot hold is refused."""
    if not info.is_causal:
        return NotApplicable("needle probes read a copy teacher-forced, which needs a causal model")
    retrieval_fits(given.label or info.name, body_room(info), sizes.seq_len)
    return None


def _retrieval_work(info: ModelInfo, sizes: RetrievalSizes) -> tuple[str, float]:
    from interp.probes.needle import default_distances

    length = retrieval_fits(info.name, body_room(info), sizes.seq_len)
    n = NEEDLE_BATCH * (length + frame(info))
    if sizes.distances:
        distances = default_distances(length, COPY_SPAN)
        n += 2 * len(distances) * (max(distances) + 16 + frame(info))
    what = f"the retrieval part (needle probe 2 x {length} tokens{', copy distances' if sizes.distances else ''})"
    return what, forward_work(n, info.n_layers, info.d_model)


@part(
    "retrieval",
    "retrieval and streaming heads on a needle probe, and copy-distance curves (run on min(1024, the "
    "context) tokens when the context holds at least 512, or at the length asked for)",
    RetrievalSizes,
    work=_retrieval_work,
    order=9,
    applicable=_retrieval_applies,
    tracked=RETRIEVAL_COLUMNS,
    atlas="retrieval",
    place=3,
)
def _retrieval(model: HookedModel, sizes: RetrievalSizes, cfg: RunConfig, given: Given) -> PartResult:
    """Scores on a needle probe, copy distance up to the probe's length; the columns carry
    ``retrieval_role`` (retrieval / streaming / neither)."""
    from interp.probes.needle import copy_distance_probe, default_distances, needle_probe
    from interp.retrieval import copy_distance_scores, retrieval_scores
    from interp.retrieval.figures import layer_windows

    info = info_of(model)
    seq_len = retrieval_fits(given.label or info.name, body_room(info), sizes.seq_len)
    probe = needle_probe(
        model, seq_len=seq_len, depths=DEPTHS, needle_len=NEEDLE_LEN, batch=NEEDLE_BATCH, seed=cfg.seed
    )
    scores = retrieval_scores(model, probe, config=cfg)
    table = scores.table.rename(columns={"role": "retrieval_role"})
    columns = table[[c for c in table.columns if c != "label"]]
    shown: dict[str, Any] = {"scores": scores.table}
    meta: dict[str, Any] = {"retrieval_probe": probe.meta}
    if sizes.distances:
        distances = default_distances(seq_len, COPY_SPAN)
        dist_probe = copy_distance_probe(model, distances, span=COPY_SPAN, batch=2, seed=cfg.seed)
        shown.update(distance=copy_distance_scores(model, dist_probe, config=cfg), windows=layer_windows(model))
        meta["retrieval_probe"] = {**probe.meta, "distances": distances}
    shown["meta"] = {k: scores.meta[k] for k in ("seq_len", "n_needles", "sink", "window", "engine", "ci_level")}
    return PartResult(columns, meta=meta, result=shown, probe=probe)


__all__ = ["RETRIEVAL_COLUMNS", "PatternSizes", "RetrievalSizes", "pattern_view", "retrieval_fits"]
