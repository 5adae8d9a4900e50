"""The result of a checkpoint sweep: every head's scores at every revision, and what they show.

:class:`CheckpointScores` holds two tidy tables and the run's facts:

- ``table``: a row per (revision, layer, head): ``revision``, ``step``, ``layer``, ``head``,
  ``label``, every head score with its CI bounds, ``copying``, and ``duplicate_of``;
- ``revisions``: a row per revision: ``revision``, ``step``, ``weights`` (the fingerprint),
  ``duplicate_of`` (``""``, or the revision whose weights these equal), the in-context learning
  score ``icl`` and its two losses.

The views (:meth:`holders`, :meth:`handoffs`, :meth:`first_passes`, :meth:`phase_change`) and the
figure leave duplicates out: a revision serving another's weights is not a step of training.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from interp._io import atomic_write, atomic_write_json
from interp.checkpoints import roles as roles_over_time
from interp.errors import UsageError
from interp.parts.table import ROLES, THRESHOLD
from interp.results import Shown, file_frame, from_records, json_records, memory_frame
from interp.scores import HeadScores

if TYPE_CHECKING:
    import plotly.graph_objects as go

STEM = "checkpoints"
PAGE = f"{STEM}_atlas"  # the page over revisions


@dataclass(repr=False)
class CheckpointScores(Shown):
    table: pd.DataFrame
    revisions: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    written: list[Path] = field(default_factory=list, compare=False, repr=False)  # files a sweep with out= wrote

    # ---- views ------------------------------------------------------------------------------

    @property
    def baselines(self) -> dict[str, float]:
        return dict(self.meta.get("baselines") or {})

    @property
    def kept(self) -> pd.DataFrame:
        """``table`` less the duplicate revisions."""
        return self.table[self.table["duplicate_of"] == ""].reset_index(drop=True)

    @property
    def duplicates(self) -> pd.DataFrame:
        """The revisions whose weights equal another revision's (``revision``, ``duplicate_of``)."""
        dup = self.revisions[self.revisions["duplicate_of"] != ""]
        return dup[["revision", "step", "duplicate_of", "weights"]].reset_index(drop=True)

    def at(self, revision: str | int) -> HeadScores:
        """One revision's scores as a :class:`HeadScores` (``.grid``, ``.rank``, ``.figure``), by label or step."""
        column = "step" if isinstance(revision, int) else "revision"
        rows = self.table[self.table[column] == revision]
        if rows.empty:
            have = ", ".join(map(str, self.revisions[column]))
            raise UsageError(f"no revision {revision!r} in this sweep; it has {have}")
        table = rows.drop(columns=["revision", "step", "duplicate_of"]).reset_index(drop=True)
        return HeadScores(table, {"baselines": self.baselines, "revision": str(rows["revision"].iloc[0])})

    def grid(self, score: str, revision: str | int) -> np.ndarray:
        """The ``[n_layers, n_heads]`` matrix of ``score`` at one revision."""
        return self.at(revision).grid(score)

    def holders(self, threshold: float = THRESHOLD) -> pd.DataFrame:
        """A row per (step, role): which head holds the role (``""``: none) and its score."""
        return roles_over_time.holders(self.kept, self.baselines, threshold)

    def handoffs(self, threshold: float = THRESHOLD) -> pd.DataFrame:
        """A row per change of a role's holder: the step range, both heads and their scores."""
        return roles_over_time.handoffs(self.kept, self.holders(threshold))

    def first_passes(self, threshold: float = THRESHOLD) -> pd.DataFrame:
        """The first step where each head passes each role's rule."""
        return roles_over_time.first_passes(self.kept, self.baselines, threshold)

    def phase_change(self, low: float = 0.1, high: float = 0.5) -> dict | None:
        """The window where the best induction score rises from < ``low`` to > ``high`` (or ``None``)."""
        kept = self.revisions[self.revisions["duplicate_of"] == ""]
        return roles_over_time.phase_change(self.kept, kept, low=low, high=high)

    def role_heads(self, threshold: float = THRESHOLD) -> list[tuple[str, str]]:
        """(role, head) pairs of every head that ever holds a role, in role order then first step."""
        held = self.holders(threshold)
        held = held[held["head"] != ""]
        pairs: list[tuple[str, str]] = []
        for role in ROLES:
            for head in held[held["role"] == role].sort_values("step")["head"]:
                if (role, head) not in pairs:
                    pairs.append((role, head))
        return pairs

    def summary(self, top: int = 10) -> str:
        """What the sweep found, in a few lines, as ``interp checkpoints`` prints it: the duplicates, each
        role's holders, the handoffs, the first passes (``top`` of each), and the phase-change window."""
        lines = [f"in-context learning score: {self.meta['icl']['description']}"]
        dup = self.duplicates
        for row in dup.itertuples():
            lines.append(
                f"duplicate: {row.revision} has the weights of {row.duplicate_of} (fingerprint {row.weights}); "
                "left out of the roles and the figure"
            )
        held = self.holders()
        for role, seq in held.groupby("role", sort=False):
            runs = roles_over_time.holder_runs(seq)
            if any(h for h, _, _ in runs):
                lines.append(f"{role}: " + "; ".join(f"{h or 'none'} (steps {a}-{b})" for h, a, b in runs[-top:]))
        for row in self.handoffs().head(top).itertuples():
            lines.append(
                f"handoff: {row.role} moves from {row.from_head} to {row.to_head} between steps {row.from_step} and "
                f"{row.to_step} ({row.from_head} {row.from_head_before:.3f} -> {row.from_head_after:.3f}, "
                f"{row.to_head} {row.to_head_before:.3f} -> {row.to_head_after:.3f})"
            )
        firsts = self.first_passes()
        for role, group in firsts.groupby("role", sort=False):
            lines.append(
                f"first passes the {role} rule: " + ", ".join(f"{r.head} at step {r.step}" for r in group.itertuples())
            )
        if "retrieval" in self.kept:
            lines.append(_retrieval_line(self.kept))
        window = self.phase_change()
        if window is None:
            steps = sorted(self.kept["step"].unique())
            lines.append(
                f"no phase change: the best induction score never rises from < 0.1 to > 0.5 over steps {fmt_steps(steps)}"
            )
        else:
            lines.append(
                f"phase change: steps {window['start']}-{window['end']}, the best induction score rises "
                f"{window['score_start']:.3f} -> {window['score_end']:.3f} while the in-context score goes "
                f"{window['icl_start']:.3f} -> {window['icl_end']:.3f} nats ({window['icl_fraction']:.0%} of its final "
                f"{window['icl_final']:.3f})"
            )
        return "\n".join(lines)

    # ---- files ------------------------------------------------------------------------------

    def save(self, out_dir: str | Path, stem: str = STEM, *, overwrite: bool = False) -> list[Path]:
        """Write ``<stem>.csv`` (the heads table), ``<stem>_revisions.csv`` and ``<stem>.json``
        (both tables, the roles over time and the meta), each atomically."""
        from interp.saving import claim, provenance

        names = [f"{stem}.csv", f"{stem}_revisions.csv", f"{stem}.json"]
        heads_csv, revs_csv, js = claim(Path(out_dir), names, overwrite=overwrite)
        heads = file_frame(self.table)
        written = [
            atomic_write(heads_csv, heads.to_csv(index=False)),
            atomic_write(revs_csv, self.revisions.to_csv(index=False)),
        ]
        blob = {
            "kind": STEM,
            **provenance(),
            "meta": self.meta,
            "phase_change": self.phase_change(),
            "handoffs": json_records(self.handoffs()),
            "first_passes": json_records(self.first_passes()),
            "revisions": json_records(self.revisions),  # floats bit for bit
            "rows": json_records(heads),
        }
        written.append(atomic_write_json(js, blob))
        return written

    def page(self, figure: go.Figure | None = None) -> str:
        """The page over revisions as one self-contained HTML string (:mod:`interp.checkpoints.page`)."""
        from interp.checkpoints.page import render_page

        return render_page(self, figure)

    def save_page(
        self, out_dir: str | Path, stem: str = PAGE, *, figure: go.Figure | None = None, overwrite: bool = False
    ) -> list[Path]:
        """Write :meth:`page` as ``<stem>.html`` (``checkpoints_atlas.html``), atomically."""
        from interp.saving import claim

        (path,) = claim(Path(out_dir), [f"{stem}.html"], overwrite=overwrite)
        return [atomic_write(path, self.page(figure))]

    @classmethod
    def load(cls, path: str | Path, stem: str = STEM) -> CheckpointScores:
        """Read back what :meth:`save` wrote (its ``.json``, or the folder holding it)."""
        path = Path(path)
        if path.is_dir():
            path = path / f"{stem}.json"
        if not path.is_file() or path.suffix != ".json":
            raise UsageError(f"no saved checkpoint sweep at {path}: pass the .json that save() wrote, or its folder")
        blob = json.loads(path.read_text(encoding="utf-8"))
        table = memory_frame(from_records(blob["rows"]))
        revisions = from_records(blob["revisions"])
        for frame in (table, revisions):
            frame["duplicate_of"] = frame["duplicate_of"].fillna("").astype(str)
        return cls(table, revisions, blob.get("meta", {}))

    # ---- the figure -------------------------------------------------------------------------

    def figure(self, threshold: float = THRESHOLD, title: str | None = None) -> go.Figure:
        """Scores against training step for every head that ever holds a role (top), the in-context
        learning score on the same step axis (bottom); log-scaled steps when they span decades;
        the phase-change window shaded."""
        from plotly.subplots import make_subplots

        revs = self.revisions[self.revisions["duplicate_of"] == ""].sort_values("step")
        steps = sorted(revs["step"])
        log = _log_scaled(steps)
        at = _log_position(steps) if log else (lambda s: s)
        fig = make_subplots(
            rows=2,
            cols=1,
            shared_xaxes=True,
            vertical_spacing=0.08,
            row_heights=[0.68, 0.32],
            subplot_titles=("head scores (heads that ever hold a role)", "in-context learning score"),
        )
        _role_traces(fig, self.kept, self.role_heads(threshold), at)
        fig.add_hline(y=threshold, line_dash="dot", line_color="gray", row=1, col=1)
        _icl_trace(fig, revs, at)
        window = self.phase_change()
        if window is not None:
            for row in (1, 2):
                fig.add_vrect(
                    x0=at(window["start"]),
                    x1=at(window["end"]),
                    fillcolor="orange",
                    opacity=0.2,
                    line_width=0,
                    row=row,
                    col=1,
                )
        xtitle = "training step"
        if log:
            xtitle += " (log scale" + ("; step 0 drawn at half the first step" if steps and steps[0] == 0 else "") + ")"
        fig.update_xaxes(type="log" if log else "linear", row=1, col=1)
        fig.update_xaxes(type="log" if log else "linear", title_text=xtitle, row=2, col=1)
        fig.update_yaxes(title_text="score", range=[0, 1.05], row=1, col=1)
        fig.update_yaxes(title_text="nats", row=2, col=1)
        shaded = f" (shaded: the phase change, steps {window['start']}-{window['end']})" if window is not None else ""
        title = title or f"{self.meta.get('model', 'model')}: heads over training{shaded}"
        _frame(fig, title, self.meta.get("icl", {}).get("description", ""))
        return fig


def _role_traces(fig: go.Figure, kept: pd.DataFrame, role_heads: list[tuple[str, str]], at: Callable) -> None:
    """The top panel: each (role, head)'s score over the steps ``at`` places, with its CI."""
    import plotly.graph_objects as go

    for role, head in role_heads:
        column = ROLES.info(role, "column")
        rows = kept[kept["label"] == head].sort_values("step")
        fig.add_trace(
            go.Scatter(
                x=[at(s) for s in rows["step"]],
                y=rows[column],
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": rows[f"{column}_hi"] - rows[column],
                    "arrayminus": rows[column] - rows[f"{column}_lo"],
                    "thickness": 1,
                    "width": 0,
                },
                mode="lines+markers",
                name=f"{head} {role}",
                customdata=rows["revision"],
                hovertemplate="%{customdata}: %{y:.3f}<extra>" + f"{head} {role}</extra>",
            ),
            row=1,
            col=1,
        )


def _icl_trace(fig: go.Figure, revs: pd.DataFrame, at: Callable) -> None:
    """The bottom panel: the in-context learning score of each revision."""
    import plotly.graph_objects as go

    fig.add_trace(
        go.Scatter(
            x=[at(s) for s in revs["step"]],
            y=revs["icl"],
            mode="lines+markers",
            name="in-context learning score",
            line={"color": "black"},
            customdata=revs["revision"],
            hovertemplate="%{customdata}: %{y:.3f} nats<extra></extra>",
        ),
        row=2,
        col=1,
    )


def _frame(fig: go.Figure, title: str, icl: str) -> None:
    """The title, size and legend, and what the in-context learning score is (``icl``) under it all."""
    note = {
        "text": f"in-context learning score: {icl}",
        "xref": "paper",
        "yref": "paper",
        "x": 0,
        "y": -0.2,
        "xanchor": "left",
        "showarrow": False,
        "font": {"size": 11},
    }
    fig.update_layout(
        title={"text": title, "x": 0.01},
        height=650,
        margin={"b": 110},
        legend={"orientation": "v"},
        annotations=list(fig.layout.annotations) + ([note] if icl else []),
    )


def _log_scaled(steps: list[int]) -> bool:
    """Steps span two decades or more (0 aside)."""
    positive = [s for s in steps if s > 0]
    return len(positive) >= 2 and positive[-1] / positive[0] >= 100


def _log_position(steps: list[int]):
    positive = [s for s in steps if s > 0]
    zero_at = positive[0] / 2 if positive else 1

    def at(step: int) -> float:
        return step if step > 0 else zero_at

    return at


def _retrieval_line(kept) -> str:
    """The best head's retrieval score at the first and the last step kept."""
    ends = []
    for step in sorted(kept["step"].unique())[:: max(1, kept["step"].nunique() - 1)]:
        at = kept[kept["step"] == step].sort_values(["retrieval", "layer", "head"], ascending=[False, True, True])
        ends.append(f"{at['retrieval'].iloc[0]:.3f} at step {step} (head {at['label'].iloc[0]})")
    return "retrieval score of the best head: " + ", ".join(ends)


def fmt_steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 6 else f"{steps[0]}, {steps[1]}, ..., {steps[-1]}"


__all__ = ["PAGE", "STEM", "CheckpointScores", "fmt_steps"]
