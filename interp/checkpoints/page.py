""":func:`render_page`: a checkpoint sweep as one self-contained HTML page (plotly.js inlined, offline).

The page over revisions, in the atlas's style (:mod:`interp.report.page`): the scores against
training step with the phase-change window shaded (:meth:`CheckpointScores.figure`), each role's
holders over the steps with its handoffs and first passes, the revisions table (step, weights
fingerprint, ``duplicate_of``, the in-context score), and the layer x head heatmaps of every score
at one revision, picked with a slider (or a click on a row of the revisions table). The heatmaps are
drawn once by :func:`interp.plots.heatmap`; every revision's grids ride along as JSON and the slider
restyles the panels in place, so the page costs one figure however many revisions it holds.
"""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from interp.checkpoints.roles import holder_runs
from interp.plots import MASS, PRETTY, Scale, panel_size, short_name
from interp.report.atlas import HEATMAP_SCORES, plain
from interp.report.page import STYLE, document, figure_html
from interp.report.roles import ROLES
from interp.scores import HeadScores

if TYPE_CHECKING:
    import plotly.graph_objects as go


class CheckpointScores(Protocol):
    """What the page draws from a sweep's result (the data, not its class: the result imports the
    page, never the other way): its tables, meta and baselines, and the views read from them."""

    table: pd.DataFrame
    revisions: pd.DataFrame
    meta: dict[str, Any]

    @property
    def baselines(self) -> dict[str, float]: ...

    @property
    def kept(self) -> pd.DataFrame: ...

    def figure(self) -> go.Figure: ...

    def holders(self) -> pd.DataFrame: ...

    def handoffs(self) -> pd.DataFrame: ...

    def first_passes(self) -> pd.DataFrame: ...

    def phase_change(self) -> dict | None: ...


# the heatmaps: the atlas's scores, then the retrieval columns of a sweep run with retrieval
RETRIEVAL_HEATMAPS = ("retrieval", "retrieval_mass", "streaming")
SHARE = Scale("share of copy steps", colorscale="Plasma", zmin=0.0, zmax=1.0)  # the retrieval score
NAMES = {"first_mass": "sink (first-token mass)", "retrieval_mass": "retrieval mass", "streaming": "streaming"}
DIGITS = 4  # decimals of the grids the page carries (the hover shows three significant digits)

EXTRA_STYLE = """
.slider-row { display: flex; flex-wrap: wrap; align-items: center; gap: 8px 16px; margin: 12px 0; }
.slider-row input[type=range] { flex: 1 1 320px; max-width: 720px; }
#ckpt-revision-label { font-variant-numeric: tabular-nums; min-width: 260px; }
#ckpt-revisions tbody tr { cursor: pointer; } #ckpt-revisions tbody tr:hover td { background: #f0f7f4; }
#ckpt-revisions tr.picked td { background: #e3f1ea; } tr.dup td { color: #8a5a00; }
td.left, th.left { text-align: left; }
h3 { margin: 22px 0 6px; font-size: 17px; } .role-block { margin-bottom: 8px; }
"""


def heatmap_columns(result: CheckpointScores) -> list[str]:
    """The scores the revision heatmaps show: the atlas's (:data:`HEATMAP_SCORES`) and the
    retrieval columns, those the sweep has."""
    return [c for c in (*HEATMAP_SCORES, *RETRIEVAL_HEATMAPS) if c in result.table]


def revision_data(result: CheckpointScores, columns: list[str]) -> dict[str, Any]:
    """What the slider reads: every revision's ``[layer][head]`` grid of each column (and its CI
    bounds), in step order, rounded to :data:`DIGITS` decimals; NaN as null."""
    revs = result.revisions
    t = result.table
    L, H = int(t["layer"].max()) + 1, int(t["head"].max()) + 1
    grids: dict[str, dict[str, list]] = {}
    for part in ("", "_lo", "_hi"):
        cols = [c for c in columns if f"{c}{part}" in t]
        for c in cols:
            cube = np.full((len(revs), L, H), np.nan)
            index = {r: i for i, r in enumerate(revs["revision"])}
            rows = t[["revision", "layer", "head", f"{c}{part}"]].to_numpy()
            for rev, layer, head, value in rows:
                cube[index[rev], int(layer), int(head)] = value
            grids.setdefault(part or "z", {})[c] = np.round(cube, DIGITS).tolist()
    return {
        "revisions": plain(revs[["revision", "step", "duplicate_of", "icl"]].to_dict(orient="records")),
        "columns": columns,
        "z": plain(grids["z"]),
        "lo": plain(grids.get("_lo", {})),
        "hi": plain(grids.get("_hi", {})),
        "baselines": plain({c: result.baselines[c] for c in columns if c in result.baselines}),
        "threshold": float(result.meta.get("threshold", 0.3)),
    }


def _heatmaps(result: CheckpointScores, columns: list[str], at: int) -> tuple[go.Figure, dict[str, dict[str, int]]]:
    """The layer x head panels at revision ``at`` (its position), and each column's trace indices
    (``heat``: the heatmap; ``dots``: the role-rule markers, an empty trace where none pass yet)."""
    import plotly.graph_objects as go

    label = result.revisions["revision"].iloc[at]
    rows = result.table[result.table["revision"] == label]
    scores = HeadScores(rows.drop(columns=["revision", "step", "duplicate_of"]).reset_index(drop=True))
    scales = {c: MASS for c in ("retrieval_mass", "streaming")} | {"retrieval": SHARE}
    fig = scores.figure(columns, baselines=result.baselines, title=None, scales=scales, names=NAMES)
    heat = [i for i, trace in enumerate(fig.data) if trace.type == "heatmap"]
    traces: dict[str, dict[str, int]] = {}
    cell = panel_size(scores.n_layers, scores.n_heads)[2]
    for column, i in zip(columns, heat):
        traces[column] = {"heat": i}
        if column not in result.baselines or f"{column}_lo" not in result.table:
            continue
        after = fig.data[i + 1] if i + 1 < len(fig.data) else None
        if after is not None and after.type == "scatter" and after.xaxis == fig.data[i].xaxis:
            traces[column]["dots"] = i + 1
            continue
        fig.add_trace(
            go.Scatter(
                x=[],
                y=[],
                xaxis=fig.data[i].xaxis,
                yaxis=fig.data[i].yaxis,
                mode="markers",
                marker=dict(size=max(3, min(7, cell // 6)), color="white", line=dict(color="black", width=1)),
                hoverinfo="skip",
                showlegend=False,
            )
        )
        traces[column]["dots"] = len(fig.data) - 1
    return fig, traces


def render_page(result: CheckpointScores, figure: go.Figure | None = None) -> str:
    """The whole page (see the module docstring); ``figure``: the sweep's figure, when drawn already."""
    name = short_name(str(result.meta.get("model", "model")))
    columns = heatmap_columns(result)
    revs = result.revisions
    kept = [i for i, d in enumerate(revs["duplicate_of"]) if d == ""]
    start = kept[-1] if kept else len(revs) - 1  # the last revision of training
    sections = [
        ("training", "Scores over training", _training_section(result, figure)),
        ("roles", "Roles over time", _roles_section(result)),
        ("revisions", "Revisions", _revisions_section(result)),
        ("heads", "Every head at one revision", _heads_section(result, columns, start)),
    ]
    return document(f"Heads over training: {name}", _describe(result), sections, STYLE + EXTRA_STYLE)


def _describe(result: CheckpointScores) -> str:
    m = result.meta
    p = m.get("probe", {})
    revs = result.revisions
    n_dup = int((revs["duplicate_of"] != "").sum())
    parts = [
        f"{len(revs)} revisions, steps {int(revs['step'].min())} to {int(revs['step'].max())}"
        + (f" ({n_dup} duplicate{'s' if n_dup != 1 else ''}, left out of the roles and the figure)" if n_dup else ""),
        f"head scores on {p.get('batch', '?')} sequences of {p.get('n_repeats', '?')} x {p.get('block_len', '?')} "
        f"repeated random tokens, the same for every revision, seed {m.get('settings', {}).get('seed', '?')}",
        f"in-context learning score: {m.get('icl', {}).get('description', '?')}",
    ]
    if "needles" in m:
        n = m["needles"]
        parts.append(
            f"retrieval on {n['batch']} sequences of {n['seq_len']} tokens with {n['n_needles']} needles of "
            f"{n['needle_len']} tokens"
        )
    return "; ".join(parts)


def _training_section(result: CheckpointScores, figure: go.Figure | None) -> str:
    window = result.phase_change()
    if window is None:
        text = "No phase change: the best induction score never rises from below 0.1 to above 0.5 over these steps."
    else:
        text = (
            f"Phase change (shaded): steps {window['start']}-{window['end']}. The best induction score rises "
            f"{window['score_start']:.3f} -> {window['score_end']:.3f} while the in-context learning score goes "
            f"{window['icl_start']:.3f} -> {window['icl_end']:.3f} nats ({window['icl_fraction']:.0%} of its final "
            f"{window['icl_final']:.3f})."
        )
    fig = figure if figure is not None else result.figure()
    return f"<p class='note'>{html.escape(text)}</p>" + figure_html(fig, "ckpt-training")


def _table(frame: pd.DataFrame, names: dict[str, str], left: tuple[str, ...] = (), attrs: str = "") -> str:
    head = "".join(f"<th{' class=left' if c in left else ''}>{html.escape(names.get(c, c))}</th>" for c in names)
    rows = []
    for r in frame.itertuples(index=False):
        cells = []
        for c in names:
            v = getattr(r, c)
            shown = ("-" if v != v else f"{v:.3f}") if isinstance(v, float) else str(v)  # NaN: none holds it
            cells.append(f"<td{' class=left' if c in left else ''}>{html.escape(shown)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<div class='table-wrap'><table{attrs}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"


def _roles_section(result: CheckpointScores) -> str:
    held = result.holders()
    moves = result.handoffs()
    firsts = result.first_passes()
    scores = result.kept.set_index(["step", "label"])
    blocks, never = [], []
    for role in ROLES:
        seq = held[held["role"] == role]
        if seq.empty:
            continue
        runs = holder_runs(seq)
        if not any(h for h, _, _ in runs) and firsts[firsts["role"] == role].empty:
            never.append(role)
            continue
        column = ROLES.info(role, "column")
        timeline = pd.DataFrame(
            [
                {
                    "head": h or "none",
                    "steps": f"{a}-{b}",
                    "first": float(scores.loc[(a, h), column]) if h else float("nan"),
                    "last": float(scores.loc[(b, h), column]) if h else float("nan"),
                }
                for h, a, b in runs
            ]
        )
        parts = [
            f"<h3>{html.escape(role)}</h3>",
            _table(
                timeline,
                {"head": "holder", "steps": "steps", "first": "score at first step", "last": "score at last step"},
                left=("head", "steps"),
            ),
        ]
        mine = moves[moves["role"] == role]
        if len(mine):
            parts.append("<p class='note'>Handoffs: the holder changes between two steps.</p>")
            parts.append(
                _table(
                    mine,
                    {
                        "from_step": "from step",
                        "to_step": "to step",
                        "from_head": "from head",
                        "to_head": "to head",
                        "from_head_before": "from head, before",
                        "from_head_after": "from head, after",
                        "to_head_before": "to head, before",
                        "to_head_after": "to head, after",
                    },
                )
            )
        first = firsts[firsts["role"] == role]
        if len(first):
            passes = ", ".join(f"{r.head} at step {r.step} ({r.score:.3f})" for r in first.itertuples())
            parts.append(f"<p class='note'>First passes the role rule: {html.escape(passes)}.</p>")
        blocks.append(f"<div class='role-block'>{''.join(parts)}</div>")
    rule = (
        f"A head holds a role at a step when it passes the atlas's role rule there (its CI above the uniform "
        f"baseline and a score of at least {result.meta.get('threshold', 0.3):g}) with the highest score; the "
        "holder keeps the role while a rival's lead stays inside its CI. Duplicate revisions are left out."
    )
    tail = f"<p class='note'>No head ever holds: {html.escape(', '.join(never))}.</p>" if never else ""
    return f"<p class='note'>{html.escape(rule)}</p>" + "".join(blocks) + tail


def _revisions_section(result: CheckpointScores) -> str:
    revs = result.revisions
    head = "".join(
        f"<th{' class=left' if c in ('revision', 'weights', 'duplicate_of') else ''}>{t}</th>"
        for c, t in (
            ("revision", "revision"),
            ("step", "step"),
            ("weights", "weights fingerprint"),
            ("duplicate_of", "duplicate of"),
            ("icl", "in-context score (nats)"),
            ("icl_loss_early", "loss early"),
            ("icl_loss_late", "loss late"),
        )
    )
    rows = []
    for i, r in enumerate(revs.itertuples(index=False)):
        cls = " class='dup'" if r.duplicate_of else ""
        rows.append(
            f"<tr data-index='{i}' tabindex='0'{cls}><td class='left'>{html.escape(str(r.revision))}</td><td>{r.step}</td>"
            f"<td class='left'><code>{html.escape(str(r.weights))}</code></td>"
            f"<td class='left'>{html.escape(str(r.duplicate_of))}</td><td>{r.icl:.3f}</td>"
            f"<td>{r.icl_loss_early:.3f}</td><td>{r.icl_loss_late:.3f}</td></tr>"
        )
    note = (
        "Each revision's weights are hashed: a revision whose weights equal another's is a duplicate (the last of "
        "the group in step order is kept) and is left out of the roles and the figure. Click a row to show its "
        "heads below."
    )
    return (
        f"<p class='note'>{html.escape(note)}</p><div class='table-wrap'><table id='ckpt-revisions'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _heads_section(result: CheckpointScores, columns: list[str], start: int) -> str:
    fig, traces = _heatmaps(result, columns, start)
    data = {**revision_data(result, columns), "traces": traces, "start": start}
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    n = len(result.revisions)
    note = (
        "Every score of every head at one revision, on one colour scale per family for all revisions (a dot: "
        "the CI above the uniform baseline and the score at least the role bar). Drag the slider, or use the "
        "arrow keys on it, to move through training."
    )
    names = ", ".join(NAMES.get(c, PRETTY.get(c, c)) for c in columns)
    return (
        f"<p class='note'>{html.escape(note)} Scores: {html.escape(names)}.</p>"
        f"<div class='slider-row'><label for='ckpt-revision'>revision</label>"
        f"<input type='range' id='ckpt-revision' min='0' max='{n - 1}' step='1' value='{start}'>"
        f"<span id='ckpt-revision-label'></span></div>"
        + figure_html(fig, "ckpt-heatmaps")
        + f'<script type="application/json" id="ckpt-data">{blob}</script><script>{SLIDER_JS}</script>'
    )


SLIDER_JS = r"""
(() => {
  const data = JSON.parse(document.getElementById('ckpt-data').textContent);
  const gd = document.getElementById('ckpt-heatmaps');
  const slider = document.getElementById('ckpt-revision');
  const label = document.getElementById('ckpt-revision-label');
  const rows = Array.from(document.querySelectorAll('#ckpt-revisions tbody tr'));
  const g3 = v => (v === null || v === undefined) ? 'NaN' : String(+v.toPrecision(3));
  function show(i) {
    const r = data.revisions[i];
    label.textContent = `${r.revision} (step ${r.step})` + (r.duplicate_of ? `, duplicate of ${r.duplicate_of}` : '')
      + `; in-context score ${r.icl === null ? 'NaN' : r.icl.toFixed(3)} nats`;
    const heat = [], z = [], text = [], dots = [], dx = [], dy = [];
    for (const c of data.columns) {
      const t = data.traces[c], g = data.z[c][i];
      const lo = data.lo[c] ? data.lo[c][i] : null, hi = data.hi[c] ? data.hi[c][i] : null;
      const base = data.baselines[c];
      const tail = base === undefined ? '' : `<br>uniform: ${g3(base)}`;
      heat.push(t.heat); z.push(g);
      text.push(g.map((row, l) => row.map((v, h) => (lo ? `${g3(v)} [${g3(lo[l][h])}, ${g3(hi[l][h])}]` : g3(v)) + tail)));
      if (t.dots !== undefined) {
        const xs = [], ys = [];
        g.forEach((row, l) => row.forEach((v, h) => {
          if (v !== null && lo[l][h] !== null && lo[l][h] > base && v >= data.threshold) { xs.push(h + 0.34); ys.push(l - 0.3); }
        }));
        dots.push(t.dots); dx.push(xs); dy.push(ys);
      }
    }
    Plotly.restyle(gd, {z, text}, heat);
    if (dots.length) Plotly.restyle(gd, {x: dx, y: dy}, dots);
    rows.forEach((tr, k) => tr.classList.toggle('picked', k === i));
    gd.dataset.revision = r.revision;
  }
  slider.addEventListener('input', () => show(+slider.value));
  rows.forEach(tr => {
    const pick = () => { slider.value = tr.dataset.index; show(+slider.value); };
    tr.addEventListener('click', pick);
    tr.addEventListener('keydown', e => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pick(); } });
  });
  const start = () => show(+slider.value);
  if (gd._fullLayout) start(); else window.addEventListener('load', start);
})();
"""

__all__ = ["heatmap_columns", "render_page", "revision_data"]
