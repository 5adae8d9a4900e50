"""``HeadScores``: one tidy table, a row per (layer, head), a column per score.

Scores with uncertainty carry ``<score>_lo`` and ``<score>_hi`` columns (a bootstrap interval over
probe sequences, see :func:`bootstrap_ratio`). The table is a plain :class:`pandas.DataFrame`, ready
for ``groupby("layer")``; :meth:`HeadScores.grid` gives the layer x head matrix for plotting,
:meth:`HeadScores.rank` the sorted view a summary prints (:func:`format_table` prints it) and
:meth:`HeadScores.figure` the heatmap (:func:`interp.plots.heatmap`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp import memory
from interp.errors import UsageError
from interp.results import (
    MIN_CI_SEQUENCES,
    Result,
    check_score,
    ci_sequences,
    few_ci_sequences,
    few_sequences_note,
    file_frame,
    has_ci,
    head_grid,
    json_records,
    score_columns,
)

if TYPE_CHECKING:
    import plotly.graph_objects as go

STEM = "head_scores"  # file stem of a saved table of head scores when none is given
NOISE_FLOOR_FRACTION = 0.01  # importances smaller than 1% of |unablated metric| are drawn as noise


@dataclass(frozen=True)
class RatioInterval:
    """A pooled ratio, its bootstrap interval, and what the interval rests on.

    Unpacks as ``point, lo, hi``. ``units``: how many resampling units (probe sequences, needles)
    hold a target, i.e. a nonzero denominator, for some column; ``empty``: the indices of the units
    that hold none (they add nothing to any resample's numerator or denominator); ``dropped``: how
    many of the ``n_boot`` resamples held no target at all and were left out of the quantiles (the
    largest count over the columns).
    """

    point: Tensor
    lo: Tensor
    hi: Tensor
    units: int
    empty: tuple[int, ...]
    dropped: int
    n_boot: int

    def __iter__(self):
        return iter((self.point, self.lo, self.hi))


def bootstrap_ratio(
    num: Float[Tensor, " batch *rest"],
    den: Float[Tensor, " batch *rest"],
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> RatioInterval:
    """Pooled ratio ``sum(num) / sum(den)`` over units, and its bootstrap CI.

    Each unit (a probe sequence, a needle, a prompt pair) contributes a numerator (e.g. attention
    mass on the targets, summed over its scored queries; a patched pair's share of its gap) and a
    denominator (how many targets it scored; the pair's own clean-corrupted gap). Denominators may
    have either sign: a pair whose gap runs the other way counts in the point estimate and so in every
    resample. The units that hold a target (a nonzero denominator in some column) are resampled with
    replacement ``n_boot`` times, and each resample pools its units (a ratio estimator). A unit with
    no target takes no part: it never counts as a zero, and mixing such units in leaves the interval
    as it was. A resample whose pooled denominator is 0 for a column (it drew only units without that
    column's targets) has no ratio there; it is dropped, and the count is reported
    (:attr:`RatioInterval.dropped`).

    The interval is the expanded percentile interval (Hesterberg 2015): the quantiles of the
    resampled ratios at ``Phi(sqrt(n / (n - 1)) * t[n - 1]((1 - level) / 2))`` and its mirror, ``n``
    the units with a target. It corrects the plain percentile interval's known narrowness with few
    units (on 50 sequences the plain one covered a known score 93.3% of the time at 95%; this one
    94.2%, and pairs whose gaps differ in sign and size are covered at their level too,
    tests/test_bootstrap.py). Columns with no target in any unit are NaN; a single unit with targets
    gives a degenerate interval. Returns a :class:`RatioInterval` (unpacks as ``point, lo, hi``).
    """
    num, den = num.double().cpu(), den.double().cpu()
    total = den.sum(0)
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    point = torch.where(total != 0, num.sum(0) / _nonzero(total), nan)
    b = num.shape[0]
    has = (den.reshape(b, -1) != 0).any(1) if b else torch.zeros(0, dtype=torch.bool)
    pool = torch.nonzero(has).flatten()
    empty = tuple(int(i) for i in torch.nonzero(~has).flatten())
    n = len(pool)
    memory.check_bootstrap(n_boot, n)
    gen = torch.Generator().manual_seed(seed)
    idx = pool[torch.randint(max(n, 1), (n_boot, n), generator=gen)] if n else torch.zeros(n_boot, 0, dtype=torch.long)
    alpha = expanded_alpha(level, n)
    rest = num.shape[1:]
    flat_num, flat_den, flat_total = num.reshape(b, -1), den.reshape(b, -1), total.reshape(-1)
    draws = torch.zeros(n_boot, b, dtype=torch.float64).scatter_add_(1, idx, torch.ones(idx.shape, dtype=torch.float64))
    # each resample's pooled sums are its draw counts times the units' values (one product); a block of
    # columns at a time keeps [n_boot, columns] under the budget (each column's quantiles are its own)
    cols = max(1, _GATHER_BUDGET // (32 * n_boot))
    lo, hi, dropped = [], [], 0
    mean = b > 0 and bool((flat_den == 1).all())  # every resample pools its n draws: no ratio to mask
    for c in range(0, max(flat_num.shape[1], 1), cols):
        if mean:  # the same quotients as below (each pooled denominator is exactly n), without forming them
            low, high = _quantiles(draws @ flat_num[:, c : c + cols] / float(n), (alpha, 1 - alpha))
            lo.append(low), hi.append(high)
            continue
        pooled = draws @ flat_den[:, c : c + cols]
        ratios = torch.where(pooled != 0, draws @ flat_num[:, c : c + cols] / _nonzero(pooled), nan)
        degenerate = (pooled == 0) & (flat_total[c : c + cols] != 0)  # a resample drew only units without its targets
        low, high = _quantiles(ratios, (alpha, 1 - alpha))
        lo.append(low), hi.append(high)
        dropped = max(dropped, int(degenerate.sum(0).max()) if degenerate.numel() else 0)
    low, high = torch.cat(lo).reshape(rest), torch.cat(hi).reshape(rest)
    return RatioInterval(point.float(), low.float(), high.float(), n, empty, dropped, n_boot)


def _quantiles(x: Float[Tensor, "draws columns"], levels: Sequence[float]) -> list[Tensor]:
    """Each column's quantiles at ``levels``, NaN left out: ``torch.nanquantile``'s linear
    interpolation to the bit, from one sort of the columns for all the levels (NaN where a column
    holds no number). Without NaN and with every level in a tail, only the order statistics each level
    reads are selected (:func:`_tail_quantile`): a CI's two ends, several times faster than a sort."""
    n = x.shape[0]
    if n > 1 and all(min(q, 1 - q) * n < n // 4 for q in levels) and not bool(x.isnan().any()):
        return [_tail_quantile(x, q) for q in levels]
    ordered = x.sort(0).values  # NaN sorts last
    valid = (~x.isnan()).sum(0)
    last = (valid - 1).clamp_min(0)
    out = []
    for q in levels:
        rank = q * last.double()
        below = rank.floor().long()
        above = (below + 1).clamp_max(last)
        value = torch.lerp(
            ordered.gather(0, below[None])[0], ordered.gather(0, above[None])[0], (rank - below).to(x.dtype)
        )
        out.append(torch.where(valid > 0, value, torch.full_like(value, float("nan"))))
    return out


def _tail_quantile(x: Float[Tensor, "draws columns"], q: float) -> Float[Tensor, " columns"]:
    """Each column's quantile at ``q`` (no NaN in ``x``), interpolated as :func:`_quantiles` does, from
    the order statistics of its nearer tail alone (a ``topk``, not a sort)."""
    n = x.shape[0]
    rank = q * (n - 1)
    below = math.floor(rank)
    above = min(below + 1, n - 1)
    if above < n - 1 - below:  # the low tail: the above + 1 smallest, ascending
        ordered = x.topk(above + 1, 0, largest=False, sorted=True).values
        low, high = ordered[below], ordered[above]
    else:  # the high tail: the n - below largest, descending (order statistic i at n - 1 - i)
        ordered = x.topk(n - below, 0, largest=True, sorted=True).values
        low, high = ordered[n - 1 - below], ordered[n - 1 - above]
    return torch.lerp(low, high, torch.full_like(low, rank - below))


_GATHER_BUDGET = 1 << 26  # bytes of resampled statistics a bootstrap holds at once (64 MiB)


def _nonzero(x: Tensor) -> Tensor:
    """``x`` with its zeros replaced by 1 (their quotients are masked out), keeping every other sign."""
    return torch.where(x == 0, torch.ones_like(x), x)


def expanded_alpha(level: float, n: int) -> float:
    """The lower quantile at which :func:`bootstrap_ratio` reads its interval on ``n`` units:
    ``Phi(sqrt(n / (n - 1)) * t[n - 1]((1 - level) / 2))`` (Hesterberg's expanded percentile
    interval), the plain ``(1 - level) / 2`` for fewer than 2 units. Student's t quantile comes from
    its Cornish-Fisher expansion in the normal one (Abramowitz & Stegun 26.7.5): within 0.01 of the
    exact quantile at 4 degrees of freedom, 3e-4 from 9 up."""
    plain = (1.0 - level) / 2
    if n < 2:
        return plain
    normal = torch.distributions.Normal(0.0, 1.0)
    z, nu = float(normal.icdf(torch.tensor(plain, dtype=torch.float64))), n - 1
    t = (
        z
        + (z**3 + z) / (4 * nu)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * nu**3)
    )
    return float(normal.cdf(torch.tensor((n / (n - 1)) ** 0.5 * t, dtype=torch.float64)))


def bootstrap_mean(
    values: Float[Tensor, " batch *rest"], *, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[Float[Tensor, "*rest"], Float[Tensor, "*rest"], Float[Tensor, "*rest"]]:
    """The mean over sequences (dim 0) of per-sequence values and its percentile bootstrap CI
    (:func:`bootstrap_ratio` with a denominator of one per sequence). NaN entries (heads not
    evaluated) stay NaN."""
    values = values.double().cpu()
    nan = torch.isnan(values).all(0)
    point, lo, hi = bootstrap_ratio(
        torch.nan_to_num(values), torch.ones_like(values), n_boot=n_boot, level=level, seed=seed
    )
    for t in (point, lo, hi):
        t[nan] = float("nan")
    return point, lo, hi


def interval_notes(name: str, ci: RatioInterval, unit: str = "sequence") -> list[str]:
    """What a reader of ``name``'s interval must know: which units held no target and were left out
    of it, and how many resamples held no target and were dropped."""
    notes = []
    if ci.empty and ci.units:
        which = ", ".join(str(i) for i in ci.empty[:20]) + (", ..." if len(ci.empty) > 20 else "")
        many = len(ci.empty) != 1
        notes.append(
            f"{name}: {unit}{'s' if many else ''} {which} (of {ci.units + len(ci.empty)}) "
            f"{'have' if many else 'has'} no target for this score and add{'' if many else 's'} nothing "
            f"to it or its interval, which rests on {ci.units} {unit}{'s' if ci.units != 1 else ''}"
        )
    if ci.dropped:
        notes.append(
            f"{name}: {ci.dropped} of {ci.n_boot} bootstrap resamples held no target and were dropped from its interval"
        )
    return notes


@dataclass(repr=False)
class HeadScores(Result):
    """A tidy per-head table plus the facts of the run that made it."""

    KIND = STEM
    what = "scores"
    reads_csv = True

    @classmethod
    def from_grids(cls, grids: dict[str, Any], meta: dict[str, Any] | None = None) -> HeadScores:
        """Build from ``{column: [n_layers, n_heads] array}``; all grids must share one shape."""
        shapes = {np.asarray(g).shape for g in grids.values()}
        if len(shapes) != 1:
            raise UsageError(f"all grids must have one shape, got {shapes}")
        ((n_layers, n_heads),) = shapes
        layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
        data: dict[str, Any] = {"layer": layer.ravel(), "head": head.ravel()}
        data["label"] = [f"{l}.{h}" for l, h in zip(data["layer"], data["head"])]
        for name, grid in grids.items():
            g = grid.detach().cpu().numpy() if isinstance(grid, Tensor) else np.asarray(grid)
            data[name] = g.astype(float).ravel()
        return cls(pd.DataFrame(data), dict(meta or {}))

    # ---- views ------------------------------------------------------------------------------

    @property
    def n_layers(self) -> int:
        return int(self.table["layer"].max()) + 1

    @property
    def n_heads(self) -> int:
        return int(self.table["head"].max()) + 1

    @property
    def score_names(self) -> list[str]:
        """Score columns (not ids, not CI bounds)."""
        return score_columns(self.table)

    @property
    def kind(self) -> str:
        """What this table is, and the file stem :meth:`save` uses by default: ``meta["kind"]``, else
        the ablation method (``exact``, ``gradient``), else ``head_scores``."""
        return str(self.meta.get("kind") or self.meta.get("method") or STEM)

    def stem(self) -> str:
        return self.kind

    @property
    def n_sequences(self) -> int | None:
        """How many probe sequences the CIs rest on (:func:`~interp.results.ci_sequences`)."""
        return ci_sequences(self.table, self.meta)

    @property
    def few_sequences(self) -> bool:
        """Whether the CIs rest on fewer than :data:`MIN_CI_SEQUENCES` sequences (flagged when shown)."""
        return few_ci_sequences(self.table, self.meta) is not None

    def ranked_by(self) -> str | None:
        names = self.score_names
        return names[0] if names else None

    def has_ci(self, score: str) -> bool:
        return has_ci(self.table, score)

    def grid(self, score: str) -> np.ndarray:
        """The ``[n_layers, n_heads]`` matrix of one column."""
        self._check(score)
        return head_grid(self.table, score)

    def rank(self, score: str, top: int | None = None, ascending: bool = False) -> pd.DataFrame:
        """Rows sorted by one score (largest first), ties broken by layer then head."""
        self._check(score)
        order = self.table.sort_values([score, "layer", "head"], ascending=[ascending, True, True], kind="mergesort")
        return order.head(top) if top is not None else order

    def top(self, score: str) -> tuple[int, int]:
        row = self.rank(score, top=1).iloc[0]
        return int(row["layer"]), int(row["head"])

    def figure(
        self,
        scores: Sequence[str] | None = None,
        *,
        baselines: Mapping[str, float] | None = None,
        title: str | None = None,
        **kwargs: Any,
    ) -> go.Figure:
        """The layer x head heatmap of ``scores`` (default: every score column), one panel each:
        :func:`interp.plots.heatmap` (``baselines``: what a uniform head scores, under each title)."""
        from interp.plots import heatmap  # plotly loads only when a figure is drawn

        return heatmap(self, scores, title=title, baselines=baselines, **kwargs)

    def _check(self, score: str) -> None:
        check_score(self.table, score, self.score_names)

    # ---- files ------------------------------------------------------------------------------

    def file_table(self) -> pd.DataFrame:
        """The table as saved: integer ``layer`` and ``head`` columns, ``label`` as ``L0H10``."""
        return file_frame(self.table)

    def json_body(self, files: pd.DataFrame) -> dict[str, Any]:
        """The JSON of :meth:`save` after its kind and provenance: the probe, baselines, the few
        sequences' warning (or null), the meta and the rows."""
        few = few_ci_sequences(self.table, self.meta)
        return {
            "probe": self.meta.get("probe"),
            "baselines": self.meta.get("baselines"),
            "ci_warning": few_sequences_note(few) if few is not None else None,
            "meta": self.meta,
            "rows": json_records(files),
        }

    @classmethod
    def claims(cls, blob: Mapping[str, Any], path: Path) -> bool:
        """Every per-head table's JSON holds a ``ci_warning`` (its kind is its analysis's)."""
        return "ci_warning" in blob and "rows" in blob


def join_scores(tables: Sequence[HeadScores]) -> HeadScores:
    """Per-head tables side by side on ``layer`` and ``head`` (a column already there is kept from the
    first); ``meta`` is the first's, with every table's ``baselines`` together."""
    frame = tables[0].table
    for t in tables[1:]:
        keep = [c for c in t.table.columns if c not in frame.columns or c in ("layer", "head")]
        frame = frame.merge(t.table[keep], on=["layer", "head"], how="left")
    meta = dict(tables[0].meta)
    meta["baselines"] = {k: v for t in tables for k, v in (t.meta.get("baselines") or {}).items()}
    return HeadScores(frame, meta)


def with_interval(value: float, lo: float, hi: float, fmt: str = ".3f") -> str:
    """``value [lo, hi]``: the value in ``fmt``, its bounds with as many decimals as the value shows
    (``0.0982 [0.0703, 0.1329]``, not ``[0.07031, 0.1329]``); a value ``fmt`` writes in exponent
    form keeps ``fmt`` for its bounds too. The interval keeps its width: where ``fmt`` shows fewer
    decimals than give the width ``hi - lo`` two significant digits, all three take that many
    (``2.00 [1.81, 2.22]``, never ``2 [2, 2]``)."""
    text = f"{value:{fmt}}"
    if "e" in text or not all(math.isfinite(x) for x in (value, lo, hi)):
        return f"{text} [{lo:{fmt}}, {hi:{fmt}}]"
    places = len(text.split(".")[1]) if "." in text else 0
    width = hi - lo
    if width > 0:
        need = min(12, max(0, math.ceil(-math.log10(width)) + 1))
        if need > places:
            places = need
            text = f"{value:.{places}f}"
    return f"{text} [{lo:.{places}f}, {hi:.{places}f}]"


def format_table(
    frame: pd.DataFrame,
    columns: Sequence[str],
    ci: Sequence[str] = (),
    fmt: str = ".3f",
    *,
    n_sequences: int | None = None,
) -> str:
    """A compact fixed-width table of per-head rows (a ``label`` column and ``columns``), as the
    commands print it; score columns in ``ci`` print as ``v [lo, hi]``; numbers in ``fmt``
    (``".3g"`` for scores of any scale). CIs over ``n_sequences`` < :data:`MIN_CI_SEQUENCES`
    sequences print flagged ``[lo, hi]!`` with :func:`few_sequences_note` under the table."""
    few = bool(ci) and n_sequences is not None and n_sequences < MIN_CI_SEQUENCES
    flag = "!" if few else ""
    shown = pd.DataFrame({"head": frame["label"].astype(str)})
    for col in columns:
        if col in ci:
            shown[col] = [
                with_interval(v, a, b, fmt) + flag
                for v, a, b in zip(frame[col], frame[f"{col}_lo"], frame[f"{col}_hi"])
            ]
        else:
            shown[col] = [f"{v:{fmt}}" for v in frame[col]]
    text = shown.to_string(index=False)
    return text + "\n" + few_sequences_note(n_sequences) if few else text
