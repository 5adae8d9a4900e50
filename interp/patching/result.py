""":class:`PatchScores`: what activation patching found, per head or per head x position.

A :class:`~interp.scores.HeadScores` whose table has a row per head (``by="head"``) or per head and
position (``by="position"``: also ``position`` and ``token`` columns). ``effect`` is the fraction of
the clean-corrupted gap a patch moves (denoising: how much patching in the clean activation
restores; noising: how much patching in the corrupted one destroys), pooled over pairs, with a
bootstrap CI over pairs (``effect_lo``, ``effect_hi``); a raw metric's ``effect`` is its change.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from interp._io import PARTIAL, partial_name
from interp.results import file_frame, memory_frame
from interp.scores import HeadScores

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from interp.plots import Scale


def _pairs_path(json_path: Path) -> Path:
    """The ``_pairs.csv`` beside a saved JSON (an interrupted run's files: ``<stem>_pairs.partial.csv``)."""
    base = json_path.stem.removesuffix(PARTIAL)
    pairs_path = json_path.with_name(f"{base}_pairs.csv")
    return partial_name(pairs_path) if base != json_path.stem else pairs_path


def _read_pairs(json_path: Path) -> pd.DataFrame:
    path = _pairs_path(json_path)
    return memory_frame(pd.read_csv(path, dtype={"label": str})) if path.is_file() else pd.DataFrame()


def warned(title: str, meta: dict[str, Any]) -> str:
    """A figure's ``title`` with the result's gap warning (``meta["gap_warning"]``) under it, if any."""
    warning = meta.get("gap_warning")
    return f"{title}<br><sup>{html.escape(warning)}</sup>" if warning else title


@dataclass(repr=False)
class PatchScores(HeadScores):
    """Activation patching's table: ``.table``, ``.grid``, ``.save``, ``.load``, ``.figure``.

    :attr:`pairs` is the effect per pair (a row per pair and head[, position]): what the pooled
    ``effect`` and its CI are drawn from. :meth:`save` writes it beside the table as
    ``<stem>_pairs.csv``, and :meth:`load` reads it back.
    """

    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)

    KIND = "patch_head"

    @property
    def by(self) -> str:
        return "position" if "position" in self.table else "head"

    @property
    def n_positions(self) -> int:
        return int(self.table["position"].max()) + 1 if self.by == "position" else 1

    @property
    def score_names(self) -> list[str]:
        return [c for c in super().score_names if c not in ("position", "token")]

    def grid(self, score: str = "effect") -> np.ndarray:
        """``[layer, head]`` per head; ``[layer, head, position]`` per position."""
        if self.by == "head":
            return super().grid(score)
        self._check(score)
        out = np.full((self.n_layers, self.n_heads, self.n_positions), np.nan)
        t = self.table
        out[t["layer"].to_numpy(), t["head"].to_numpy(), t["position"].to_numpy()] = t[score].to_numpy()
        return out

    def extra_files(self, stem: str) -> dict[str, str]:
        """``<stem>_pairs.csv`` beside ``<stem>.csv`` and ``<stem>.json`` (as :meth:`HeadScores.save`)."""
        return {f"{stem}_pairs.csv": file_frame(self.pairs).to_csv(index=False)}

    @classmethod
    def from_json(cls, blob: Mapping[str, Any], path: Path) -> PatchScores:
        """The table and meta of the JSON, and the pairs from the ``_pairs.csv`` beside it (none there:
        an empty frame)."""
        scores = super().from_json(blob, path)
        scores.pairs = _read_pairs(path)
        return scores

    @classmethod
    def claims(cls, blob: Mapping[str, Any], path: Path) -> bool:
        """A per-head table's JSON with the pairs' CSV beside it (every kind of patching writes one)."""
        return super().claims(blob, path) and _pairs_path(path).is_file()

    def tokens(self) -> list[str]:
        """The labels of the positions (the tokens of the first pair's patched prompt)."""
        if self.by == "head":
            return []
        first = self.table.drop_duplicates("position").sort_values("position")
        return [str(t) for t in first["token"]]

    def figure(self, scores: Sequence[str] | None = None, *, title: str | None = None, **kwargs: Any) -> go.Figure:
        """A diverging heatmap on the one fixed scale of effects (:func:`effect_scale`: -1..1 of the gap,
        never fitted to the data): layer x head (the CIs in the hover), or per position head x position
        with the heads and the tokens as labels; cells whose CI reaches 0 or whose size is under
        ``meta["noise_floor"]`` grey."""
        score = (list(scores) if scores else ["effect"])[0]
        what = f"{self.meta.get('direction', '')} patching, {self.meta.get('metric', '')}".strip(", ")
        title = warned(title or f"{self.meta.get('model', 'model')}: {score} of each head ({what})", self.meta)
        floor = self.meta.get("noise_floor") if self.has_ci(score) else None
        scale = effect_scale(self.meta)
        if self.by == "head":
            kwargs.setdefault("noise_floor", {score: floor} if floor is not None else {})
            return super().figure([score], title=title, scales={score: scale}, **kwargs)
        from interp.plots import labelled_heatmap

        rows = [f"{l}.{h}" for l in range(self.n_layers) for h in range(self.n_heads)]
        shape = (len(rows), self.n_positions)
        ci = {"lo": self.grid(f"{score}_lo").reshape(shape), "hi": self.grid(f"{score}_hi").reshape(shape)}
        return labelled_heatmap(
            self.grid(score).reshape(shape),
            [f"{p}: {t}" for p, t in enumerate(self.tokens())],
            rows,
            scale,
            **(ci if self.has_ci(score) else {}),
            floor=floor,
            title=title,
            x_title="position (token)",
            y_title="head",
            x_name="position",
            y_name="head",
        )


def effect_scale(meta: dict[str, Any]) -> Scale:
    """The colour scale of patching effects, fixed by the metric and never by the data: -1..1 (the
    whole clean-corrupted gap, either way) for a normalised metric, the gap in the metric's own units
    for a raw one."""
    from dataclasses import replace

    from interp.plots import EFFECT

    if meta.get("normalised", True):
        return EFFECT
    gap = abs(float(meta["clean_metric"]) - float(meta["corrupted_metric"])) or 1.0
    return replace(EFFECT, title=f"change of {meta.get('metric', 'the metric')}", zmin=-gap, zmax=gap)
