"""The one shape of a result: a tidy table, its ``meta``, and save / load / figure; one loader.

:class:`Result` is the base: ``.table`` (a tidy :class:`pandas.DataFrame`) and ``.meta`` (the facts
of the run, from :func:`interp.config.run_header` on), what every result shows (:class:`Shown`), and
one way to the disk: :meth:`Result.save` writes ``<stem>.csv`` and ``<stem>.json`` atomically, the
JSON starting with the result's ``kind`` and the run's provenance; :meth:`Result.load` and
:func:`load_result` read them back through one code path. A class names its ``KIND`` (the JSON's
``"kind"`` and its default file stem) and adds what its JSON holds beside the meta and the rows
(:meth:`Result.json_body`) and what it writes beside the two files (:meth:`Result.extra_files`).

Here too are the tidy per-head table's facts that a result and the figure drawing it both read
(:func:`head_grid`, :func:`score_columns`, :func:`ci_sequences`), so that a renderer takes data, not
the result class, and the table's records written bit for bit (:func:`json_records`).
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import pandas as pd

from interp._io import atomic_write, atomic_write_json
from interp.errors import UnknownNameError, UsageError
from interp.names import file_name, head_name, memory_name
from interp.registry import Registry

CI_SUFFIXES = ("_lo", "_hi")
MIN_CI_SEQUENCES = 5  # a bootstrap CI over fewer probe sequences is flagged as unreliable
_FILE_LABEL = re.compile(r"^L(\d+)H(\d+)$")
# the modules whose result classes :func:`load_result` may meet in a file (named, not imported, here)
HOMES = (
    "interp.scores",
    "interp.ablation.curves",
    "interp.patching.result",
    "interp.patching.paths",
    "interp.patching.faithfulness",
    "interp.roles.composition",
    "interp.circuits.edges",
    "interp.roles.qk_result",
)
R = TypeVar("R", bound="Result")


# --------------------------------------------------------------------------------------------
# what every result shows


SHOWN_ROWS = 5  # the rows a result's repr and notebook summary show
SHOWN_COLUMNS = 6  # the columns its repr shows (its notebook table: twice as many)
# the columns that name a row, shown first where a table has them (a label stands for layer and head)
KEY_COLUMNS = ("label", "sender", "receiver", "kind", "ranking", "revision", "role")


# an edge table's columns as a repr shows them: the edge names its sender and receiver
EDGE_COLUMNS = ("edge", "position", "in_circuit", "score", "score_lo", "score_hi", "stability", "site")


def plural(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 pair``, ``3 pairs`` (``plural``: an irregular
    plural, ``1 query``/``2 queries``)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


class Shown:
    """What every result object shows: a short ``repr`` (its class, model, shape and a few top rows,
    never whole arrays) and, in a notebook, that summary as a table followed by its :meth:`figure`
    (``_repr_html_``). A class mixes it in and is declared ``@dataclass(repr=False)``; it needs a
    ``.table``, a ``.meta`` and a ``.figure()``. ``shown_by`` names the column its top rows are
    ranked by (largest first); ``None`` keeps the table's own order."""

    shown_by: ClassVar[str | None] = None
    key_columns: ClassVar[tuple[str, ...]] = ()  # a class's own columns naming a row, before KEY_COLUMNS
    fixed_columns: ClassVar[tuple[str, ...]] = ()  # where set, the columns shown: these, those the table has

    def ranked_by(self) -> str | None:
        """The column the top rows are ranked by: :attr:`shown_by` where the table has it."""
        return self.shown_by if self.shown_by in self.table.columns else None  # type: ignore[attr-defined]

    def shown_rows(self, n: int = SHOWN_ROWS) -> pd.DataFrame:
        """The first ``n`` rows of :attr:`table`, ranked by :attr:`shown_by` where it is a column."""
        table = self.table  # type: ignore[attr-defined]
        by = self.ranked_by()
        if by is not None:
            table = table.sort_values(by, ascending=False, kind="mergesort", na_position="last")
        return table.head(n)

    def shown_columns(self, n: int = SHOWN_COLUMNS) -> list[str]:
        """At most ``n`` columns: those naming a row (:data:`KEY_COLUMNS`), the ranked one and its CI,
        then the rest in the table's order."""
        cols = list(self.table.columns)  # type: ignore[attr-defined]
        if self.fixed_columns:
            return [c for c in self.fixed_columns if c in cols][:n]
        first = [c for c in dict.fromkeys((*self.key_columns, *KEY_COLUMNS)) if c in cols]
        by = self.ranked_by()
        ranked = [c for c in (by, f"{by}_lo", f"{by}_hi") if by is not None and c in cols]
        skip = {"layer", "head"} if "label" in first else set()
        rest = [c for c in cols if c not in first + ranked and c not in skip]
        return (first + ranked + rest)[:n]

    def headline(self) -> str:
        """One line: the class, the model, the table's rows and the model's layers x heads."""
        meta = getattr(self, "meta", None) or {}
        rows = len(self.table)  # type: ignore[attr-defined]
        line = f"{type(self).__name__} of {meta.get('model', 'a model')}: {plural(rows, 'row')}"
        if meta.get("n_layers") is not None and meta.get("n_heads") is not None:
            line += f" ({plural(meta['n_layers'], 'layer')} x {plural(meta['n_heads'], 'head')})"
        by = self.ranked_by()
        return line + (f", top by {by}" if by else "")

    def __repr__(self) -> str:
        rows = self.shown_rows()[self.shown_columns()].to_string(
            index=False, max_colwidth=16, float_format=lambda v: f"{v:.4g}"
        )
        return f"{self.headline()}\n{rows}"

    def _repr_html_(self) -> str:
        import html

        rows = self.shown_rows()[self.shown_columns(2 * SHOWN_COLUMNS)]
        table = rows.to_html(index=False, float_format=lambda v: f"{v:.4g}", border=0)
        figure = notebook_figure(self.figure())  # type: ignore[attr-defined]
        return f"<div><p><b>{html.escape(self.headline())}</b></p>{table}{figure}</div>"


_PLOTLY_IN_NOTEBOOK = [False]  # whether this session's notebook has been given plotly.js


def notebook_figure(fig: Any) -> str:
    """A figure's HTML for a notebook cell, offline: plotly.js inlined in the session's first one
    (as plotly's own ``init_notebook_mode(connected=False)`` does), the later ones drawn with it;
    never loaded from the network."""
    first = not _PLOTLY_IN_NOTEBOOK[0]
    _PLOTLY_IN_NOTEBOOK[0] = True
    return fig.to_html(full_html=False, include_plotlyjs=first, config={"displaylogo": False})


# --------------------------------------------------------------------------------------------
# the one result shape, and its one loader

RESULTS: Registry[type[Result]] = Registry("result kind")


@dataclass(repr=False)
class Result(Shown):
    """A tidy :attr:`table` and its :attr:`meta`, saved as ``<stem>.csv`` and ``<stem>.json``.

    A subclass sets ``KIND`` (the JSON's ``"kind"``, the default stem, its entry in :data:`RESULTS`)
    and ``what`` (how an error names it), and overrides what differs: :meth:`file_table` (the table
    as the CSV writes it), :meth:`json_body` (the JSON after its provenance), :meth:`extra_files`
    (files written beside the two) and :meth:`from_json` (the inverse of :meth:`json_body`)."""

    table: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    KIND: ClassVar[str] = ""
    what: ClassVar[str] = "result"
    reads_csv: ClassVar[bool] = False  # whether a bare .csv (no meta) loads too
    missing: ClassVar[type[Exception]] = UsageError  # what loading from where nothing was saved raises

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "KIND" in cls.__dict__:
            RESULTS.add(cls.KIND, cls.what, cls)

    def stem(self) -> str:
        """The file stem :meth:`save` uses when none is given, and the JSON's ``kind``: the class's
        :attr:`KIND`."""
        return type(self).KIND

    def file_table(self) -> pd.DataFrame:
        """The table as the CSV (and the JSON's rows) hold it: heads as ``L0H10`` (:func:`file_frame`)."""
        return file_frame(self.table)

    def json_body(self, files: pd.DataFrame) -> dict[str, Any]:
        """What the JSON holds after its ``kind`` and provenance: the meta and the rows."""
        return {"meta": self.meta, "rows": json_records(files)}

    def extra_files(self, stem: str) -> dict[str, str]:
        """Files written beside ``<stem>.csv`` and ``<stem>.json``: name -> text (none here)."""
        return {}

    def save(self, out_dir: str | Path, stem: str | None = None, *, overwrite: bool = False) -> list[Path]:
        """Write ``<stem>.csv`` (the table), ``<stem>.json`` (the kind, versions and command line,
        then :meth:`json_body`) and any :meth:`extra_files`, each atomically. ``stem`` defaults to
        :meth:`stem`. Saving over an earlier result refuses unless ``overwrite=True``."""
        from interp.saving import claim, provenance

        stem = stem or self.stem()
        extra = self.extra_files(stem)
        csv_path, js_path, *extra_paths = claim(
            Path(out_dir), [f"{stem}.csv", f"{stem}.json", *extra], overwrite=overwrite
        )
        files = self.file_table()
        written = [atomic_write(csv_path, files.to_csv(index=False))]
        written.append(atomic_write_json(js_path, {"kind": self.stem(), **provenance(), **self.json_body(files)}))
        return written + [atomic_write(p, text) for p, text in zip(extra_paths, extra.values())]

    @classmethod
    def from_json(cls: type[R], blob: Mapping[str, Any], path: Path) -> R:
        """The result a saved JSON (read from ``path``) holds: the inverse of :meth:`json_body`."""
        return cls(memory_frame(from_records(blob["rows"])), dict(blob.get("meta", {})))

    @classmethod
    def claims(cls, blob: Mapping[str, Any], path: Path) -> bool:
        """Whether a saved JSON of another ``kind`` than the class's is one of this class's (a class
        whose kind follows its meta says so here)."""
        return False

    @classmethod
    def load(cls: type[R], path: str | Path, stem: str | None = None) -> R:
        """Read back what :meth:`save` wrote: its ``.json`` (or, where the class reads one, a bare
        ``.csv`` without meta), or the folder it wrote into (then ``<stem>.json`` there)."""
        path = saved_path(path, stem or cls.KIND, cls.what, csv=cls.reads_csv, error=cls.missing)
        if path.suffix == ".csv":
            return cls(memory_frame(read_csv(path, dtype={"label": str})))
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")), path)


def saved_path(
    path: str | Path, stem: str, what: str, *, csv: bool = False, error: type[Exception] = UsageError
) -> Path:
    """The saved JSON at ``path`` (a folder: ``<stem>.json`` in it); ``error`` when there is none."""
    path = Path(path)
    path = path / f"{stem}.json" if path.is_dir() else path
    if not path.is_file():
        raise error(f"no saved {what} at {path}: pass the .json{' (or .csv)' if csv else ''} that save() wrote")
    return path


# the saved results of a shape of their own (several files, no one table): their JSON's ``kind`` ->
# the class whose ``load(path)`` reads them back
LOADERS = {
    "atlas": "interp.report.atlas:Atlas",
    "logit_attribution": "interp.roles.logit:LogitAttribution",
    "head_map": "interp.roles.encoder:HeadMap",
    "gates": "interp.ablation.gates:GateSweep",
    "sinks_summary": "interp.sinks.report:SinkReport",
}


def _loader(kind: str) -> Any:
    module, name = LOADERS[kind].split(":")
    return getattr(importlib.import_module(module), name)


def load_result(path: str | Path) -> Shown:
    """Any saved result, by the ``kind`` its JSON holds: a :class:`~interp.scores.HeadScores`, a
    :class:`~interp.patching.PatchScores`, a :class:`~interp.patching.paths.PathScores`, an
    :class:`~interp.report.Atlas`, a :class:`~interp.sinks.SinkReport` (from its ``_summary.json``), ..."""
    for home in HOMES:  # the classes register themselves as their modules load
        importlib.import_module(home)
    path = saved_path(path, "", "result")
    blob = json.loads(path.read_text(encoding="utf-8"))
    kind = blob.get("kind") if isinstance(blob, dict) else None
    if kind is None and isinstance(blob, dict) and path.name.endswith("_summary.json") and "top_massive" in blob:
        kind = "sinks_summary"  # written before the summary said its kind
    if kind == "sinks_summary":  # the report's stem is the summary's, less "_summary"
        return _loader(kind).load(path.parent, path.name[: -len("_summary.json")])
    if kind in LOADERS:
        return _loader(kind).load(path)
    if kind in RESULTS:
        return RESULTS.get(kind).from_json(blob, path)
    for name in reversed(RESULTS.names()):  # the most derived class first
        if RESULTS.get(name).claims(blob, path):
            return RESULTS.get(name).from_json(blob, path)
    if isinstance(blob, dict) and {"cfg", "nodes", "edges"} <= set(blob):
        raise UsageError(
            f"{path} is an EAP-IG graph JSON: read it with interp.Circuit.from_eapig(path, model), which needs the "
            "model it was made on"
        )
    kinds = [*RESULTS.names(), *LOADERS]
    raise UsageError(f"{path} holds no result this toolkit reads (kind {kind!r}): choose from {kinds}")


# --------------------------------------------------------------------------------------------
# the tidy per-head table


def score_columns(table: pd.DataFrame) -> list[str]:
    """A per-head table's score columns: not the ids (layer, head, label), not CI bounds."""
    skip = {"layer", "head", "label"}
    cols = [c for c in table.columns if c not in skip]
    return [c for c in cols if not (c.endswith(CI_SUFFIXES) and c[:-3] in cols)]


def has_ci(table: pd.DataFrame, score: str) -> bool:
    return f"{score}_lo" in table and f"{score}_hi" in table


def check_score(table: pd.DataFrame, score: str, names: Sequence[str] | None = None) -> None:
    """Refuse a column the table does not have, naming those it does (``names``: the scores shown)."""
    if score not in table.columns:
        raise UnknownNameError(f"no score {score!r}; have {list(names if names is not None else score_columns(table))}")


def head_grid(table: pd.DataFrame, score: str, n_layers: int | None = None, n_heads: int | None = None) -> np.ndarray:
    """The ``[n_layers, n_heads]`` matrix of one column (NaN where the table has no row)."""
    L = int(table["layer"].max()) + 1 if n_layers is None else n_layers
    H = int(table["head"].max()) + 1 if n_heads is None else n_heads
    out = np.full((L, H), np.nan)
    out[table["layer"].to_numpy(), table["head"].to_numpy()] = table[score].to_numpy()
    return out


def ci_sequences(table: pd.DataFrame, meta: Mapping[str, Any]) -> int | None:
    """How many probe sequences a table's CIs rest on: the fewest that hold a target for a score with
    an interval (``meta["ci_sequences"]``, which the analyses record), else the probe's batch (its
    ``batch``, or how many texts a padded probe holds), when the meta records it."""
    per_score = meta.get("ci_sequences") or {}
    counts = [int(n) for c, n in per_score.items() if c in table and has_ci(table, c)]
    if counts:
        return min(counts)
    probe = meta.get("probe") or {}
    if not isinstance(probe, dict):
        return None
    n = probe.get("batch")
    if n is None and probe.get("lengths") is not None:
        n = len(probe["lengths"])
    return int(n) if n is not None else None


def few_ci_sequences(table: pd.DataFrame, meta: Mapping[str, Any]) -> int | None:
    """:func:`ci_sequences` when it is fewer than :data:`MIN_CI_SEQUENCES` and a score has a CI
    (such CIs are flagged wherever they are shown), else ``None``."""
    n = ci_sequences(table, meta)
    few = n is not None and n < MIN_CI_SEQUENCES and any(has_ci(table, c) for c in score_columns(table))
    return n if few else None


def few_sequences_note(n: int, unit: str = "sequence") -> str:
    """The warning under a table (and in a figure) whose CIs rest on fewer than
    :data:`MIN_CI_SEQUENCES` probe sequences (``unit``: what they are, e.g. a task's ``"pair"``)."""
    return (
        f"! CIs from {plural(n, unit)}: fewer than {MIN_CI_SEQUENCES}, so an interval "
        "says little about the spread; use a larger batch"
    )


# --------------------------------------------------------------------------------------------
# tables on disk, bit for bit


def file_label(layer: int, head: int) -> str:
    """A head's label in saved files, ``L0H10``: no spreadsheet or ``pd.read_csv`` reads it as a
    number (``"0.10"`` becomes ``0.1``, the label of head 1)."""
    return file_name(head_name(layer, head))


def json_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``frame`` as JSON-ready records whose floats read back bit for bit: :mod:`json`
    writes each float's shortest exact form (pandas' ``to_json`` keeps 10 digits); NaN becomes null."""
    nan = lambda v: isinstance(v, float) and math.isnan(v)  # noqa: E731
    return [{k: None if nan(v) else v for k, v in row.items()} for row in frame.to_dict(orient="records")]


def from_records(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The inverse of :func:`json_records`: a column that held only NaN (null) comes back as floats."""
    frame = pd.DataFrame.from_records(rows)
    for name in frame.columns:
        if frame[name].dtype == object and frame[name].isna().all():
            frame[name] = frame[name].astype(float)
    return frame


def read_csv(path: str | Path, **kwargs: Any) -> pd.DataFrame:
    """A saved table, its floats parsed exactly as written (``float_precision="round_trip"``)."""
    return pd.read_csv(path, float_precision="round_trip", **kwargs)


# the columns that name a component (a head "0.10", a receiver "0.10<q>", an edge "0.1->0.10<k>")
# as memory spells it: saved as files spell it (``L0H10``, :func:`interp.names.file_name`) like
# ``label``, and read back as memory spells it
NAME_COLUMNS = ("edge", "sender", "receiver", "src", "dst", "query", "key")


def file_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame as saved: ``label`` written ``L0H10`` (from the integer layer and head), and so each
    component named in a :data:`NAME_COLUMNS` column."""
    columns = _name_columns(frame)
    labelled = {"layer", "head", "label"} <= set(frame.columns)
    if not (labelled or columns):
        return frame
    out = frame.copy()
    if labelled:
        out["label"] = [file_label(l, h) for l, h in zip(out["layer"], out["head"])]
    for c in columns:
        out[c] = [file_name(v) for v in out[c]]
    return out


def memory_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The inverse of :func:`file_frame`: ``label`` and the components' names back to the spelling
    the toolkit prints (``0.10``; EAP-IG's, which results saved before this spelling hold, too)."""
    columns = _name_columns(frame)
    relabel = "label" in frame and len(frame) and frame["label"].astype(str).str.match(_FILE_LABEL).all()
    if not (relabel or columns):
        return frame
    frame = frame.copy()
    if relabel:
        frame["label"] = [head_name(l, h) for l, h in zip(frame["layer"], frame["head"])]
    for c in columns:
        frame[c] = [memory_name(v) for v in frame[c]]
    return frame


def _name_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in NAME_COLUMNS if c in frame and not pd.api.types.is_numeric_dtype(frame[c])]
