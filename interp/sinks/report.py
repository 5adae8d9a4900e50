""":func:`sink_scores` and the :class:`SinkReport` it returns."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

import interp.distributed as distributed
from interp._io import atomic_write, atomic_write_json
from interp.adapters import HookedModel
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.models import describe
from interp.probes import TokenProbe, random_tokens
from interp.results import Shown, json_records, read_csv
from interp.scores import HeadScores
from interp.sinks.stats import (
    ABS_THRESHOLD,
    EPSILON,
    MAX_MASSIVE_PER_LAYER,
    MIN_QUERIES,
    REL_THRESHOLD,
    SINK_RATIO,
    SinkStatistics,
    concat_statistics,
    queries_per_key,
    queries_per_key_rows,
    sink_statistics,
    uniform_mass_rows,
)
from interp.sinks.summary import sink_summary
from interp.sinks.tables import (
    first_label,
    head_table,
    layer_table,
    learned_sink_row,
    massive_table,
    occurrences,
    position_table,
    sep_position,
    sink_positions,
    token_table,
)
from interp.stream.budget import engine_run

if TYPE_CHECKING:
    import plotly.graph_objects as go


@dataclass(repr=False)
class SinkReport(Shown):
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
    shown_by = "first_mass"

    def __post_init__(self) -> None:
        # float64 throughout (float32 values are exact in it), so that saved tables read back bit for bit
        for name in TABLES:
            frame = getattr(self, name)
            wide = {c: "float64" for c, t in frame.dtypes.items() if t == np.float32}
            if wide:
                setattr(self, name, frame.astype(wide))

    @property
    def table(self) -> pd.DataFrame:
        """The per-head table (a row per (layer, head)), as every result object has."""
        return self.heads.table

    def grid(self, score: str) -> np.ndarray:
        """The ``[n_layers, n_heads]`` matrix of one per-head score (``first_mass``, ...)."""
        return self.heads.grid(score)

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

    def figure(self) -> go.Figure:
        """The layer x head heatmap of first-token mass (and ``[SEP]`` mass for encoders): the one
        figure of the report; :meth:`figures` gives all three."""
        from interp.sinks.figures import first_mass_heatmap  # plotly loads only when a figure is drawn

        return first_mass_heatmap(self.heads, self.meta)

    def figures(self) -> dict[str, go.Figure]:
        """Every figure of the report by name: ``heatmap`` (:meth:`figure`), ``layers`` (Sink^eps per
        layer) and ``residual`` (the largest residual magnitudes by layer)."""
        from interp.sinks.figures import first_mass_heatmap, residual_curves, sink_rate_bars

        return {
            "heatmap": first_mass_heatmap(self.heads, self.meta),
            "layers": sink_rate_bars(self.layers, self.meta),
            "residual": residual_curves(self.layers, self.meta),
        }

    def summary(self, probe: TokenProbe, top: int = 10, elapsed: float | None = None) -> str:
        """The text ``interp sinks`` prints for this report on ``probe`` (see :func:`sink_summary`)."""
        tables = {"layers": self.layers, "tokens": self.tokens, "massive": self.massive, "roles": self.roles()}
        return sink_summary(self.heads, tables, self.meta, probe, top, elapsed)

    def save(self, out: str | Path, stem: str = "sinks") -> list[Path]:
        """Write ``<stem>.csv/.json`` (heads), ``<stem>_{layers,positions,tokens,massive}.csv`` and
        ``<stem>_summary.json`` (meta, layers, roles, the top tokens and massive activations), atomically."""
        out = Path(out)
        written = self.heads.save(out, stem)
        for name in TABLES:
            frame: pd.DataFrame = getattr(self, name)
            written.append(atomic_write(out / f"{stem}_{name}.csv", frame.to_csv(index=False)))
        records = json_records
        written.append(
            atomic_write_json(
                out / f"{stem}_summary.json",
                {
                    "kind": "sinks_summary",
                    "meta": self.meta,
                    "layers": records(self.layers),
                    "roles": records(self.roles()),
                    "top_tokens": records(self.tokens.head(50)),
                    "top_massive": records(self.massive.head(50)),
                },
            )
        )
        return written

    @classmethod
    def load(cls, path: str | Path, stem: str = "sinks") -> SinkReport:
        """Read back what :meth:`save` wrote: the folder (and ``stem``), or its ``<stem>.json``."""
        path = Path(path)
        folder, stem = (path, stem) if path.is_dir() else (path.parent, path.stem)
        files = [folder / f"{stem}.json", folder / f"{stem}_summary.json"]
        files += [folder / f"{stem}_{name}.csv" for name in TABLES]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UsageError(f"no saved sink report in {folder}: missing {', '.join(missing)}")
        frames = {name: read_csv(folder / f"{stem}_{name}.csv") for name in TABLES}
        meta = json.loads((folder / f"{stem}_summary.json").read_text(encoding="utf-8"))["meta"]
        return cls(heads=HeadScores.load(files[0]), meta=meta, **frames)


TABLES = ("layers", "positions", "tokens", "massive")
LEARNED_SINK_FLOOR = 1e-4  # a head whose rows miss more than this on average has a learned sink


def validate_sink_scores(
    *,
    epsilon: float = EPSILON,
    abs_threshold: float = ABS_THRESHOLD,
    rel_threshold: float = REL_THRESHOLD,
    sink_ratio: float = SINK_RATIO,
    min_queries: int = MIN_QUERIES,
    max_massive: int = MAX_MASSIVE_PER_LAYER,
) -> None:
    """:func:`sink_scores`'s options checked without a model (see :mod:`interp.sinks` for their meaning)."""
    if not 0 < epsilon < 1:
        raise UsageError(f"epsilon= must be between 0 and 1, got {epsilon}", params="epsilon")
    for name, value in (("abs_threshold", abs_threshold), ("rel_threshold", rel_threshold), ("sink_ratio", sink_ratio)):
        if not value > 0:
            raise UsageError(f"{name}= must be > 0, got {value}", params=name)
    for name, value, low in (("min_queries", min_queries, 1), ("max_massive", max_massive, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"{name}= must be an integer >= {low}, got {value!r}", params=name)


def sink_scores(
    model: HookedModel,
    probe: TokenProbe | None = None,
    *,
    epsilon: float = EPSILON,
    abs_threshold: float = ABS_THRESHOLD,
    rel_threshold: float = REL_THRESHOLD,
    sink_ratio: float = SINK_RATIO,
    min_queries: int = MIN_QUERIES,
    max_massive: int = MAX_MASSIVE_PER_LAYER,
    config: RunConfig | None = None,
) -> SinkReport:
    """Find attention sinks and massive activations in ``model`` on ``probe``.

    ``config`` (a :class:`~interp.config.RunConfig`, by default ``RunConfig()``: 1000 resamples,
    level 0.95, seed 0, the whole probe per pass, engine auto) holds the run settings. ``probe``
    defaults to Gu et al.'s: ``random_tokens(model, seed=config.seed)`` (16 x 64 random tokens).
    ``first_mass`` carries a bootstrap interval over sequences at ``config.level``. The engine and
    its budget choose the pattern or the stream pass as in :func:`interp.heads.head_scores`.
    """
    options = dict(abs_threshold=abs_threshold, rel_threshold=rel_threshold, sink_ratio=sink_ratio)
    validate_sink_scores(epsilon=epsilon, min_queries=min_queries, max_massive=max_massive, **options)
    cfg = RunConfig.of(config)
    if probe is None:
        probe = random_tokens(model, seed=cfg.seed)
    info = describe(model)
    run, why = engine_run(cfg, model, probe.batch, probe.seq_len)
    stats = distributed.map_sequences(  # under torchrun: each rank runs its block of sequences
        lambda p: sink_statistics(
            model, p, abs_threshold=abs_threshold, rel_threshold=rel_threshold, max_massive=max_massive, config=run
        ),
        probe,
        merge=lambda parts: concat_statistics(parts, max_massive),
        what="finding sinks",
    )
    if probe.padded:  # the statistics are aligned: position p of each row is its text's position p
        probe = probe.right_padded()
    mass = key_mass(stats, probe, min_queries)
    alpha, T, L, H = mass.alpha, probe.seq_len, info.n_layers, info.n_heads
    sep, first = sep_position(info, probe), first_label(info, probe)

    heads = head_table(stats, alpha, sep, mass.eligible, probe, info.is_causal, cfg.n_boot, cfg.level, cfg.seed)
    occ = occurrences(mass.per_sequence, probe, info, model, mass.eligible, epsilon, sink_ratio)
    is_sink = lambda f: (f["attention_ratio"] >= sink_ratio) | (f["sink_head_share"] >= 0.999 / (L * H))  # noqa: E731
    sink_pos = sink_positions(occ[is_sink(occ)], probe, sep)
    # a learned sink logit: seen by the stream engine; by the pattern engine as rows summing below 1
    learned = stats.has_sinks or float(stats.learned_sink.mean(0).max()) / T > LEARNED_SINK_FLOOR
    tokens = _sink_tokens(occ, is_sink, stats if learned else None, info.is_causal, epsilon, sink_ratio)
    massive = massive_table(stats, probe, model, info, sink_pos)
    meta = run_header(
        info,
        probe,
        first_token=first,
        sep_position=sep,
        epsilon=epsilon,
        **_sink_rates(alpha, sep, epsilon),
        uniform_first_mass=float(uniform_mass_rows(probe)[:, 0].mean()),
        **options,
        min_queries=min_queries,
        n_massive=len(massive),
        max_row_sum_deviation=stats.max_row_deviation,
        learned_sinks=learned,
        ci_level=cfg.level,
        n_boot=cfg.n_boot,
        seed=cfg.seed,
        engine=run.engine,
        engine_reason=why,
    )
    heads.meta.update(meta)
    layers = layer_table(alpha, stats, sep, sink_pos, massive, epsilon, info)
    positions = position_table(alpha, epsilon, sep, mass.n_queries, first)
    return SinkReport(heads=heads, layers=layers, positions=positions, tokens=tokens, massive=massive, meta=meta)


@dataclass(frozen=True)
class KeyMass:
    """``alpha_k``, the mean attention a key draws from the queries that see it (see :mod:`interp.sinks`)."""

    per_sequence: Tensor  # [batch, layer, head, k]; NaN past a padded row's text
    alpha: Tensor  # [layer, head, k]: the mean over sequences
    eligible: Tensor  # [k] (or [batch, k] for a padded probe): keys seen by at least min_queries queries
    n_queries: Tensor  # [k]: queries that see each key (a padded probe's: the longest text's)


def key_mass(stats: SinkStatistics, probe: TokenProbe, min_queries: int) -> KeyMass:
    """``alpha_k`` of the pass's received mass on ``probe`` (aligned: :meth:`TokenProbe.right_padded`)."""
    T = probe.seq_len
    if not probe.padded:
        n_k = queries_per_key(T, probe.causal)
        alpha_seq = stats.received / n_k  # [B, L, H, T]
        return KeyMass(alpha_seq, alpha_seq.mean(0), n_k >= min(min_queries, T), n_k)
    n_k_rows = queries_per_key_rows(probe)  # [B, T], 0 past a row's text
    alpha_seq = stats.received / n_k_rows[:, None, None, :]  # NaN past a row's text
    lengths = probe.lengths().cpu()[:, None]
    eligible = (n_k_rows >= lengths.clamp_max(min_queries)) & (torch.arange(T)[None] < lengths)
    return KeyMass(alpha_seq, alpha_seq.nanmean(0), eligible, n_k_rows.amax(0))


def _sink_tokens(
    occ: pd.DataFrame,
    is_sink: Callable[[pd.DataFrame], pd.Series],
    learned: SinkStatistics | None,
    causal: bool,
    epsilon: float,
    sink_ratio: float,
) -> pd.DataFrame:
    """Sink discovery's token table, with the row of a learned sink logit when the pass saw one."""
    tokens = token_table(occ, is_sink)
    if learned is None:
        return tokens
    T = learned.received.shape[-1]
    tokens = pd.concat([tokens, learned_sink_row(learned, T, causal, epsilon, sink_ratio)], ignore_index=True)
    tokens = tokens.sort_values(["attention_ratio", "occurrences"], ascending=[False, False], kind="mergesort")
    return tokens.reset_index(drop=True)


def _sink_rates(alpha: Tensor, sep: int | None, epsilon: float) -> dict[str, float | None]:
    """Model-level Sink^eps of the first token (and of ``[SEP]``): the share of heads above ``epsilon``."""
    return {
        "sink_rate": float((alpha[:, :, 0] > epsilon).float().mean()),
        "sep_sink_rate": None if sep is None else float((alpha[:, :, sep] > epsilon).float().mean()),
    }
