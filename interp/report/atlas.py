""":class:`Atlas`: every per-head analysis of a model gathered in one object (data only).

:func:`interp.report.head_atlas` (in :mod:`interp.report.build`) fills it; the HTML page is drawn
from it by :func:`interp.report.page.render_atlas`, a layer above: the atlas holds the data and
knows nothing of HTML. :meth:`Atlas.save` writes the page with the renderer it was given
(``render=``, which :func:`head_atlas` sets), then the role table and ``<stem>.json``;
:meth:`Atlas.load` reads those back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from interp._io import atomic_write, atomic_write_json
from interp.errors import UsageError
from interp.parts.table import role_column
from interp.results import Shown, file_frame, from_records, json_records, memory_frame, read_csv
from interp.scores import HeadScores

if TYPE_CHECKING:
    import plotly.graph_objects as go

STEM = "atlas"
# the atlas's score heatmaps (the OV roles' on a 0..1 scale of their own)
OV_HEATMAPS = ("copy_suppression", "successor")
HEATMAP_SCORES = (
    "prev_token",
    "current",
    "duplicate",
    "induction",
    "first_mass",
    "copying",
    "copy_suppression",
    "successor",
)


def plain(value: Any) -> Any:
    """``value`` with NaN as None and numpy scalars as Python's: strict JSON (a page's ``JSON.parse``)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return None if not np.isfinite(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


@dataclass(repr=False)
class Atlas(Shown):
    """What :func:`~interp.report.head_atlas` found; :meth:`save` writes the page and its tables.

    ``roles`` is the tidy per-head table (every score with its CI, importances, ``role``), also
    :attr:`table`; ``pattern`` holds the viewer's sequence: ``tokens`` (strings), ``patterns``
    (``[layer, head, q, k]``) and ``selected`` (head labels shown first). With a task (the task
    part), the role table has ``patch_effect`` and ``dla`` with their CIs and ``meta["task"]`` says
    how they were read. ``render`` draws the
    HTML page of an atlas (:func:`interp.report.page.render_atlas` for one :func:`head_atlas`
    made; ``None`` for one read back by :meth:`load`, until one is passed to :meth:`save`).
    """

    roles: pd.DataFrame
    baselines: dict[str, float]
    meta: dict[str, Any]
    sinks: Any = None
    exact: HeadScores | None = None
    gradient: HeadScores | None = None
    pruning: pd.DataFrame | None = None
    pattern: dict[str, Any] = field(default_factory=dict)
    retrieval: dict[str, Any] | None = None  # the retrieval part: scores, copy distance, windows, meta
    compositions: Any = None  # the composition part's :class:`~interp.roles.Compositions`
    cards: dict[str, dict[str, Any]] | None = None  # head label -> :func:`~interp.roles.card.head_card`
    head_map: Any = None  # the headmap part's :class:`~interp.roles.HeadMap` (a loaded one: coordinates only)
    render: Callable[[Atlas], str] | None = field(default=None, repr=False, compare=False)

    # ---- views ------------------------------------------------------------------------------

    @property
    def table(self) -> pd.DataFrame:
        """The per-head role table (a row per (layer, head)), as every result object has."""
        return self.roles

    def grid(self, score: str) -> np.ndarray:
        """The ``[n_layers, n_heads]`` matrix of one column of the role table."""
        return HeadScores(self.roles).grid(score)

    def named(self, role: str) -> list[str]:
        """Head labels named ``role`` ("induction", "previous-token", ...), strongest first."""
        col = role_column(role)
        hit = self.roles[self.roles["role"].str.split(", ").map(lambda rs: role in rs)]
        return hit.sort_values(col, ascending=False, kind="mergesort")["label"].tolist()

    def figure(self, scores: Sequence[str] | None = None) -> go.Figure:
        """The layer x head heatmaps of the role table's scores (default: those of
        :data:`HEATMAP_SCORES` it has), each titled with its uniform baseline."""
        from interp.plots import Scale

        cols = list(scores) if scores is not None else [c for c in HEATMAP_SCORES if c in self.roles]
        share = Scale("share (OV roles)", zmin=0.0, zmax=1.0)  # copy suppression, successor: shares of 0..1
        return HeadScores(self.roles).figure(
            cols,
            baselines=self.baselines,
            title=None,
            scales={c: share for c in OV_HEATMAPS},
            names={"copy_suppression": "copy suppression"},
        )

    # ---- files ------------------------------------------------------------------------------

    def save(
        self,
        out: str | Path,
        stem: str = STEM,
        *,
        render: Callable[[Atlas], str] | None = None,
        overwrite: bool = False,
    ) -> list[Path]:
        """Write ``<stem>.html`` (self-contained, offline; drawn by ``render`` or :attr:`render`,
        left out when there is neither), ``<stem>_roles.csv`` and ``<stem>.json``, atomically."""
        out = Path(out)
        draw = render or self.render
        roles = file_frame(self.roles)  # labels as the CSV writes them, in the JSON too
        blob = {"meta": self.meta, "baselines": self.baselines, "roles": json_records(roles)}
        if self.pruning is not None:
            blob["pruning"] = json_records(self.pruning)
        if self.cards is not None:
            blob["cards"] = plain(self.cards)
        if self.head_map is not None:  # the map's coordinates (the distances stay in memory: n^2 numbers)
            blob["head_map"] = plain({"coords": self.head_map.coords.tolist(), "meta": self.head_map.meta})
        from interp.saving import claim, provenance

        names = ([f"{stem}.html"] if draw is not None else []) + [f"{stem}_roles.csv", f"{stem}.json"]
        paths = claim(out, names, overwrite=overwrite)
        blob = {"kind": "atlas", **provenance(), "probe": self.meta.get("probe"), **blob}
        page = [atomic_write(paths[0], draw(self))] if draw is not None else []
        return [
            *page,
            atomic_write(paths[-2], roles.to_csv(index=False)),
            atomic_write_json(paths[-1], blob),
        ]

    @classmethod
    def load(cls, path: str | Path, stem: str = STEM) -> Atlas:
        """Read back what :meth:`save` wrote: the folder (and ``stem``), or its ``<stem>.json``.

        The role table (from ``<stem>_roles.csv``, exact; with a task, its patching and attribution
        columns), the baselines, the meta, the pruning curves, the cards and the head map's
        coordinates come back (its distances are not saved: NaN); the sink report, the sweeps' own
        tables and the viewer's patterns are not saved, so they stay empty (the page of a loaded
        atlas shows what remains).
        """
        path = Path(path)
        folder, stem = (path, stem) if path.is_dir() else (path.parent, path.stem)
        files = [folder / f"{stem}.json", folder / f"{stem}_roles.csv"]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UsageError(f"no saved atlas in {folder}: missing {', '.join(missing)}")
        blob = json.loads(files[0].read_text(encoding="utf-8"))
        roles = memory_frame(read_csv(files[1], dtype={"label": str, "role": str}))
        roles["role"] = roles["role"].fillna("")
        pruning = from_records(blob["pruning"]) if "pruning" in blob else None
        head_map = None
        if "head_map" in blob:
            from interp.roles.encoder import HeadMap

            coords = np.array(blob["head_map"]["coords"], dtype=float)
            head_map = HeadMap(np.full((len(coords), len(coords)), np.nan), coords, blob["head_map"]["meta"])
        return cls(
            roles=roles,
            baselines=dict(blob["baselines"]),
            meta=blob["meta"],
            pruning=pruning,
            cards=blob.get("cards"),
            head_map=head_map,
        )


__all__ = ["HEATMAP_SCORES", "STEM", "Atlas", "plain"]
