"""Pruning curves as one result: the tidy table, what can be read off it, saving, loading, the figure.

:func:`~interp.ablation.pruning.pruning_curves` returns a :class:`PruningCurves`; ``.table`` is a
row per (curve, step), ``.meta`` the run header; :func:`heads_prunable` reads off how many heads
each curve could lose within a tolerance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from interp._io import atomic_write, atomic_write_json
from interp.errors import AblationError
from interp.scores import Shown

if TYPE_CHECKING:
    import plotly.graph_objects as go

# the frame attributes a pruning curve has always carried (``frame.attrs``), kept on ``.table``
CURVE_ATTRS = ("metric", "ablation", "reestimate", "clean_metric", "partial")


@dataclass(repr=False)
class PruningCurves(Shown):
    """Pruning curves of several orders: ``table`` a row per (curve, step), ``meta`` the run header.

    ``table`` columns: ``order``, ``seed``, ``step``, ``n_pruned``, ``frac_pruned``, ``metric``,
    ``degradation``, ``removed``, ``label`` (one per curve, e.g. ``"random (seed 1)"``).
    """

    table: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        """Whether a Ctrl-C stopped the curves early (the steps done are kept)."""
        return bool(self.meta.get("partial", self.table.attrs.get("partial", False)))

    def prunable(self, tolerance: float = 0.1) -> pd.DataFrame:
        """:func:`heads_prunable` of these curves."""
        return heads_prunable(self, tolerance)

    def save(
        self,
        out_dir: str | Path,
        stem: str = "pruning",
        *,
        tolerance: float = 0.1,
        meta: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> list[Path]:
        """Write ``<stem>.csv`` (the table) and ``<stem>.json`` (``meta`` updated with ``meta`` and
        ``tolerance``, the heads prunable within ``tolerance``, and the rows), each atomically."""
        from interp.saving import claim, provenance

        csv, js = claim(Path(out_dir), [f"{stem}.csv", f"{stem}.json"], overwrite=overwrite)
        return [
            atomic_write(csv, self.table.to_csv(index=False)),
            atomic_write_json(
                js,
                {
                    "kind": "pruning",
                    **provenance(),
                    "probe": self.meta.get("probe"),
                    "baselines": None,
                    "meta": {**self.meta, **(meta or {}), "tolerance": tolerance},
                    "prunable": self.prunable(tolerance).to_dict(orient="records"),
                    "rows": self.table.to_dict(orient="records"),
                },
            ),
        ]

    @classmethod
    def load(cls, path: str | Path, stem: str = "pruning") -> PruningCurves:
        """Read back what :meth:`save` wrote: its ``.json``, or the folder (then ``<stem>.json``)."""
        path = Path(path)
        path = path / f"{stem}.json" if path.is_dir() else path
        if not path.is_file():
            raise AblationError(f"no saved pruning curves at {path}: pass the .json that save() wrote")
        blob = json.loads(path.read_text(encoding="utf-8"))
        table = pd.DataFrame.from_records(blob["rows"])
        meta = blob["meta"]
        table.attrs.update({k: meta[k] for k in CURVE_ATTRS if k in meta})
        return cls(table, meta)

    def figure(self, title: str | None = None, *, tolerance: float | None = 0.1) -> go.Figure:
        """The metric against the number of heads pruned, a line per curve (each its own dash, so
        curves that coincide stay visible), with the band of metrics within ``tolerance`` (a fraction
        of the unpruned metric) of the unpruned one shaded; ``None`` draws no band."""
        from interp.plots import curves

        metric = self.meta.get("metric", "metric")
        clean = self.meta.get("clean_metric", self.table.attrs.get("clean_metric"))
        band = None
        if tolerance is not None and clean is not None:
            worse = -1 if self.meta.get("higher_is_better") else 1
            band = (clean, clean + worse * tolerance * abs(clean), f"within {tolerance:.0%} of unpruned")
        return curves(
            self.table,
            "n_pruned",
            "metric",
            "label",
            title=title or f"{metric} as heads are pruned",
            x_title="heads pruned",
            y_title=metric,
            band=band,
        )


def heads_prunable(curves: PruningCurves | pd.DataFrame, tolerance: float = 0.1) -> pd.DataFrame:
    """Per curve: how many heads were pruned at the last step before the metric first degraded by more
    than ``tolerance`` (a fraction of the unpruned metric). ``curves``: a :class:`PruningCurves` or
    its table (or one :func:`~interp.ablation.pruning.pruning_curve` frame)."""
    if tolerance < 0:
        raise AblationError(f"tolerance must be >= 0, got tolerance={tolerance}", params="tolerance")
    frame = curves.table if isinstance(curves, PruningCurves) else curves
    keys = ["label"] if "label" in frame else ["order", "seed"]
    rows = []
    for key, part in frame.sort_values("step", kind="mergesort").groupby(keys, sort=False):
        over = part["degradation"] > tolerance
        ok = part[~over.cumsum().astype(bool)]
        last = ok.iloc[-1] if len(ok) else part.iloc[0]
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                "n_prunable": int(last["n_pruned"]),
                "frac_prunable": float(last["frac_pruned"]),
                "tolerance": tolerance,
            }
        )
    return pd.DataFrame(rows)
