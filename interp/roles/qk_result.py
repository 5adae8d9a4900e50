"""The result of a QK attribution: a tidy table of (head, query component, key component) terms with
CIs, and its grid, top pairs, figure, save and load."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from interp.errors import UsageError
from interp.results import Result, few_ci_sequences, few_sequences_note, file_frame, memory_frame, read_csv

if TYPE_CHECKING:
    import plotly.graph_objects as go

STEM = "qk_attribution"
VALUES = ("contrast", "score")


class QKAttribution(Result):
    """A row per head x query component x key component: its mean term of the ``contrast`` and the
    ``score`` at the targets, each with a CI (``_lo``, ``_hi``). ``meta["totals"]`` holds each head's
    own mean contrast and score (what the terms add up to)."""

    KIND = STEM
    what = "QK attribution"
    shown_by = "contrast"
    key_columns = ("head", "query", "key")  # a term is a head's (query side, key side) pair

    @property
    def heads(self) -> list[str]:
        return list(dict.fromkeys(self.table["head"]))

    def _head(self, head: str | None) -> str:
        head = self.heads[0] if head is None else str(head)
        if head not in self.heads:
            raise UsageError(f"head {head!r} is not in this attribution: choose from {self.heads}", params="head")
        return head

    def grid(self, head: str | None = None, value: str = "contrast") -> pd.DataFrame:
        """Query components (rows) x key components (columns) of one head's ``value`` terms."""
        if value not in VALUES:
            raise UsageError(f"value={value!r}: choose from {list(VALUES)}", params="value")
        rows = self.table[self.table["head"] == self._head(head)]
        order = list(dict.fromkeys([*rows["query"], *rows["key"]]))  # a top= table: the pairs it holds, NaN elsewhere
        return rows.pivot(index="query", columns="key", values=value).reindex(index=order, columns=order)

    def top(self, k: int = 10, head: str | None = None, value: str = "contrast") -> pd.DataFrame:
        """The ``k`` pairs of largest ``|value|`` per head (of ``head`` alone, if given)."""
        rows = self.table if head is None else self.table[self.table["head"] == self._head(head)]
        ranked = rows.assign(_size=rows[value].abs()).sort_values(
            ["head", "_size"], ascending=[True, False], kind="mergesort"
        )
        return ranked.groupby("head", sort=False).head(k).drop(columns="_size").reset_index(drop=True)

    def figure(self, head: str | None = None, value: str = "contrast", title: str | None = None) -> go.Figure:
        """The heatmap of query-side x key-side components, each margin the pair totals of its side."""
        from interp.roles.qk_figure import pair_heatmap

        head = self._head(head)
        total = self.meta.get("totals", {}).get(head, {}).get(value)
        title = title or f"why {head} attends ({value} at {self.meta.get('at', '')}): {self.meta.get('model', '')}"
        return pair_heatmap(self.grid(head, value), title=title, total=total)

    def file_table(self) -> pd.DataFrame:
        """The table as saved: integer ``layer`` and ``head``, the head's ``label`` as ``L1H2`` and
        the heads among the components likewise (``L0H3``), so no reader takes one for a number."""
        t = self.table.rename(columns={"head": "label"})
        t.insert(0, "head", [int(str(name).split(".")[1]) for name in t["label"]])
        t.insert(0, "layer", t.pop("layer"))
        return file_frame(t)

    def json_body(self, files: pd.DataFrame) -> dict[str, Any]:
        """The JSON holds the few sequences' warning (or null) and the meta; the rows are the CSV's."""
        few = few_ci_sequences(self.table, self.meta)
        return {"ci_warning": few_sequences_note(few) if few is not None else None, "meta": self.meta}

    @classmethod
    def from_json(cls, blob: Mapping[str, Any], path: Path) -> QKAttribution:
        """The table from the CSV beside ``path`` (heads back to ``1.2``), the meta from its JSON."""
        t = memory_frame(read_csv(path.with_suffix(".csv"), dtype={"label": str, "query": str, "key": str}))
        t = t.drop(columns="head").rename(columns={"label": "head"})
        t.insert(0, "head", t.pop("head"))
        return cls(t, dict(blob["meta"]))


def head_totals(result: QKAttribution, head: str) -> dict[str, float]:
    """The model's own mean contrast and score of ``head`` at the targets, and what its terms sum to."""
    rows = result.table[result.table["head"] == head]
    own = result.meta["totals"][head]
    return {**own, "contrast_terms": float(np.sum(rows["contrast"])), "score_terms": float(np.sum(rows["score"]))}


__all__ = ["STEM", "VALUES", "QKAttribution", "head_totals"]
