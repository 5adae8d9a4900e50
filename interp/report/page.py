""":func:`render_atlas`: the head atlas as one self-contained HTML page (plotly.js inlined, offline).

The page is drawn from an :class:`~interp.report.atlas.Atlas` and sits above it: the atlas holds
data, this module knows HTML. :func:`interp.report.head_atlas` hands :func:`render_atlas` to the
atlas it builds, so that :meth:`Atlas.save` writes the page.
"""

from __future__ import annotations

import html
import json
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from interp.parts.table import ROLES, THRESHOLD, role_columns
from interp.plots import DIVERGING, EFFECT, PRETTY, Scale, curves, heatmap, short_name
from interp.report.atlas import Atlas
from interp.report.viewer import CARD_JS, VIEWER_JS
from interp.results import plural
from interp.roles.qk import TARGETS
from interp.scores import HeadScores

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; padding: 24px 16px;
       max-width: 1400px; color: #1f2933; }
h1 { margin: 0 0 4px; font-size: 26px; } h2 { margin-top: 36px; border-bottom: 1px solid #d9e2ec; }
.meta { color: #52606d; margin: 0 0 12px; } nav a { margin-right: 14px; }
.glance { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.glance div { border: 1px solid #d9e2ec; border-radius: 6px; padding: 10px 14px; min-width: 180px; }
.glance b { display: block; font-size: 13px; color: #52606d; font-weight: 600; }
.glance span { font-size: 20px; }
.table-wrap { max-height: 560px; overflow: auto; border: 1px solid #d9e2ec; width: fit-content; max-width: 100%; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 7px; text-align: right; white-space: nowrap; border-bottom: 1px solid #eef2f6; }
th { position: sticky; top: 0; background: #f5f7fa; white-space: normal; min-width: 48px; vertical-align: bottom; }
td.role, th.role { text-align: left; white-space: normal; min-width: 72px; }
td .ci { display: block; font-size: 11px; color: #52606d; font-weight: 400; }
tr.baseline td { color: #52606d; font-style: italic; background: #fbfcfd; }
td.clear { font-weight: 700; } td.role { color: #0b6e4f; font-weight: 600; }
.note { color: #52606d; font-size: 14px; max-width: 900px; }
#head-picker button { margin: 1px; padding: 3px 6px; border: 1px solid #bcccdc; background: white;
                      border-radius: 4px; font-size: 12px; cursor: pointer; }
#head-picker button.has-role { border-color: #0b6e4f; }
#head-picker button[aria-pressed="true"] { background: #0b6e4f; color: white; }
#pattern-view { display: flex; flex-wrap: wrap; gap: 8px; margin-top: 12px; }
tr[data-head] { cursor: pointer; } tr[data-head]:hover td { background: #f0f7f4; }
tr.picked td { background: #e3f1ea; }
#head-card { border: 1px solid #0b6e4f; border-radius: 6px; padding: 8px 14px; margin-top: 14px; max-width: 100%;
             box-sizing: border-box; }
#head-card h3 { margin: 4px 0 8px; } .card-role { color: #0b6e4f; font-size: 15px; margin-left: 8px; }
.card-grid { display: flex; flex-wrap: wrap; gap: 12px 28px; align-items: flex-start; }
.card-block { min-width: 0; max-width: 100%; } .card-block h4 { margin: 6px 0 4px; font-size: 14px; }
.card-block th { position: static; text-align: left; }
.card-block ol { margin: 0; padding-left: 26px; font-size: 13px; } .card-block p { font-size: 12px; color: #52606d; }
.card-pattern { display: block; border: 1px solid #d9e2ec; }
"""


def render_atlas(atlas: Atlas) -> str:
    """The whole page: header, roles at a glance, the role table, heatmaps, sinks, ablation, patterns."""
    m = atlas.meta
    name = short_name(m["model"])
    sections = [
        ("roles", "What each head is", _roles_section(atlas)),
    ]
    if "task" in m:
        sections.append(("task", f"Which heads matter for the task: {m['task']['name']}", _task_section(atlas)))
    if _has_writes(atlas):
        sections.append(("circuits", "What heads write and read", _writes_section(atlas)))
    sections.append(("heatmaps", "Scores of every head", _heatmaps_section(atlas)))
    if atlas.sinks is not None:
        sections.append(("sinks", "Attention sinks", _sinks_section(atlas)))
    if atlas.exact is not None or atlas.gradient is not None or atlas.pruning is not None:
        sections.append(("ablation", "Which heads matter: ablation", _ablation_section(atlas)))
    if atlas.retrieval is not None or _retrieval_note(atlas):
        sections.append(("retrieval", "Retrieval and streaming heads", _retrieval_section(atlas)))
    if atlas.pattern:
        sections.append(("patterns", "Attention patterns", _patterns_section(atlas)))
    return document(f"Head atlas: {name}", _describe_run(atlas), sections)


def document(title: str, meta: str, sections: list[tuple[str, str, str]], style: str = STYLE) -> str:
    """A self-contained page: ``title`` (escaped) as its title and heading, the ``meta`` line, a
    link to each section and the sections, each ``(id, heading, html)``; plotly.js inlined."""
    from plotly.offline import get_plotlyjs

    nav = " ".join(f'<a href="#{key}">{html.escape(heading)}</a>' for key, heading, _ in sections)
    body = "\n".join(
        f'<section id="{key}"><h2>{html.escape(t)}</h2>\n{content}</section>' for key, t, content in sections
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{style}</style>
<script>{get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(title)}</h1>
<p class="meta">{html.escape(meta)}</p>
<nav>{nav}</nav>
{body}
</body></html>
"""


def _describe_run(atlas: Atlas) -> str:
    m = atlas.meta
    p = m["probe"]
    parts = [
        f"{m['n_layers']} layers x {m['n_heads']} heads, {'causal' if m['causal'] else 'encoder'}",
        f"head scores on {p.get('batch', '?')} sequences of {p.get('n_repeats', '?')} x {p.get('block_len', '?')} "
        f"repeated random tokens, seed {m['seed']}, {m['ci_level']:.0%} bootstrap CIs",
    ]
    if "sink_probe" in m:
        sp = m["sink_probe"]
        parts.append(f"sinks on {sp.get('batch', '?')} x {sp.get('seq_len', '?')} random tokens")
    if "metric" in m:
        parts.append(f"ablation: {m['ablation']} ablation, {m['metric']}")
    if m.get("skipped"):
        parts.append(f"skipped: {', '.join(m['skipped'])}")
    return "; ".join(parts)


def _roles_section(atlas: Atlas) -> str:
    m = atlas.meta
    cards = []
    for col, role in role_columns().items():
        if col not in atlas.roles:
            continue
        named = atlas.named(role)
        shown = ", ".join(named[:8]) + (f" (+{len(named) - 8})" if len(named) > 8 else "") if named else "none"
        cards.append(f"<div><b>{html.escape(role)} heads</b><span>{html.escape(shown)}</span></div>")
    rule = (
        f"A head is named for a role only when its score's {m['ci_level']:.0%} CI lies wholly above what a head "
        f"attending uniformly would score (the <i>uniform</i> row) and the score is at least {m['threshold']:g}. "
        f"Bold: the score meets that rule (CI above uniform and at least {m['threshold']:g}). The copying score (Olsson et al., -1..1) has no CI and names no "
        "role. Importances: how much worse the metric gets when the head alone is ablated (exact) and "
        "Michel et al.'s first-order estimate of it (gradient)."
    )
    if atlas.cards:
        rule += " Click a head (a row here or below, a cell of the heatmaps or a point of the map) for its card."
    cols = [c for c in ROLE_COLS if c in atlas.roles and c not in CIRCUIT_COLS]
    card = _card_html(atlas) if atlas.cards else ""
    return f'<div class="glance">{"".join(cards)}</div><p class="note">{rule}</p>{_role_html(atlas, cols)}{card}'


def _has_writes(atlas: Atlas) -> bool:
    return any(c in atlas.roles for c in CIRCUIT_COLS) or bool(_circuit_notes(atlas)) or atlas.head_map is not None


def _circuit_notes(atlas: Atlas) -> list[str]:
    return [n for n in atlas.meta.get("notes", []) if not n.startswith(("retrieval:", "task:"))]


def _writes_section(atlas: Atlas) -> str:
    """What heads write and read: OV roles, encoder heads and entropy, composition in and out."""
    m = atlas.meta
    text = (
        "Copy suppression (McDougall et al.): the share of tokens whose own logit is among the 10 lowest of the "
        "head's effective OV row; successor (Gould et al.): the share of ordinal pairs whose OV image ranks the next "
        "item first (both from weights, CIs over tokens or pairs). [CLS], [SEP], punctuation, next token, "
        "positional and rare word (Clark et al., Voita et al.) and the entropy of each head's attention (against the "
        f"<i>uniform</i> row's) are read on {m.get('encoder_probe', {}).get('batch', '?')} windows of text; a "
        "positional head needs 0.9 (Voita et al.'s bar), the others the role table's. "
        "Composition in / out: the head's strongest Q-, K- or V-composition from an earlier head / into a later "
        "one, as z against random heads of the same shapes (the score ignores norms and biases)."
    )
    left_out = _circuit_notes(atlas)
    notes = "<ul class='note'>" + "".join(f"<li>{html.escape(n)}</li>" for n in left_out) + "</ul>" if left_out else ""
    cols = [c for c in CIRCUIT_COLS if c in atlas.roles]
    table = _role_html(atlas, cols) if cols else ""
    return f"<p class='note'>{text}</p>{notes}{table}{_head_map_html(atlas)}"


def _head_map_html(atlas: Atlas) -> str:
    """The map of heads: every pair's Jensen-Shannon distance laid out in 2-D, coloured by layer."""
    if atlas.head_map is None:
        return ""
    p = atlas.head_map.meta.get("probe") or {}
    note = (
        "Heads by their patterns: each pair of heads' Jensen-Shannon distance (base 2, 0 the same pattern, 1 "
        f"disjoint), averaged over the queries of {p.get('batch', '?')} windows of text, laid out in two dimensions "
        "(classical multidimensional scaling): heads that attend alike sit together. Colour: layer."
        + (" Click a point for the head's card." if atlas.cards else "")
    )
    fig = atlas.head_map.figure(title="heads by the Jensen-Shannon distance of their patterns")
    return f"<p class='note'>{html.escape(note)}</p>" + figure_html(fig, "atlas-headmap")


def _task_section(atlas: Atlas) -> str:
    """The task part: exact per-head patching beside direct logit attribution, both per head with CIs."""
    t = atlas.meta["task"]
    cols = [c for c in TASK_COLS if c in atlas.roles]
    ranked = atlas.roles.reindex(atlas.roles["patch_effect"].abs().sort_values(ascending=False, kind="mergesort").index)
    top = ranked["label"].head(8).tolist()
    cards = [f"<div><b>largest patching effect</b><span>{html.escape(', '.join(top[:4]))}</span></div>"]
    if "dla" in cols:
        by_dla = atlas.roles.reindex(atlas.roles["dla"].abs().sort_values(ascending=False, kind="mergesort").index)
        cards.append(
            f"<div><b>largest direct logit attribution</b><span>{html.escape(', '.join(by_dla['label'].head(4)))}"
            "</span></div>"
        )
    what = "the task's own metric" if t["metric"] == "logit-diff" else f"the task's own metric, {t['metric']}"
    text = (
        f"{plural(t['n_pairs'], 'pair')} of a clean and a corrupted prompt of {t['seq_len']} tokens, read at position "
        f"{t['read_position']}; metric {t['metric']} ({what}): clean {t['clean_metric']:.4g}, corrupted "
        f"{t['corrupted_metric']:.4g}. Patching effect (exact, denoising): run the corrupted prompt, patch in one "
        "head's clean output at every position, and measure the fraction of the clean-corrupted gap it restores (1: "
        "the head alone restores the answer; 0: nothing), pooled over pairs with a "
        f"{atlas.meta['ci_level']:.0%} bootstrap CI; cells inside the noise floor ({t['noise_floor']:.3g}) or whose "
        "CI reaches 0 are grey. "
    )
    if "dla" in cols:
        text += (
            f"Direct logit attribution: what the head's output writes straight onto {t['dla_direction']} on the clean "
            "prompts, through the final norm frozen at the clean run (CI over prompts). A head can matter by patching "
            "yet write nothing directly: it feeds the heads that do."
        )
    notes = [n for n in atlas.meta.get("notes", []) if n.startswith("task:")]
    listed = "<ul class='note'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>" if notes else ""
    frame = atlas.roles[["layer", "head", "label", *[f"{c}{e}" for c in cols for e in ("", "_lo", "_hi")]]]
    scores = HeadScores(frame)
    # centred on 0, each its own bar: patching on the fixed scale of effects (no grey: grey marks its noise
    # floor), attribution fitted to its logits
    scales = {"patch_effect": replace(EFFECT, title=NAMES["patch_effect"])}
    if "dla" in cols:
        scales["dla"] = Scale(NAMES["dla"], "RdBu_r", zmin=-_bound(frame["dla"]), zmax=_bound(frame["dla"]), zmid=0.0)
    fig = heatmap(
        scores,
        cols,
        scales=scales,
        noise_floor={"patch_effect": float(t["noise_floor"])},
        names={"patch_effect": "patching effect (exact, denoising)", "dla": "direct logit attribution"},
        title=None,
    )
    table = _role_html(atlas, cols, rows=ranked.head(TASK_ROWS))
    shown = f"The {min(TASK_ROWS, len(ranked))} heads of largest patching effect (click one for its card):"
    return (
        f'<div class="glance">{"".join(cards)}</div><p class="note">{html.escape(text)}</p>{listed}'
        + figure_html(fig, "atlas-task")
        + f"<p class='note'>{html.escape(shown)}</p>{table}"
    )


def _bound(values: pd.Series) -> float:
    """The half-width of a colour scale centred on 0 that holds ``values``."""
    finite = values.abs()[np.isfinite(values)]
    return float(finite.max()) if len(finite) and float(finite.max()) > 0 else 1.0


NAMES = {
    "retrieval_mass": "retrieval mass",
    "streaming": "streaming (sink + window)",
    "first_mass": "sink (first-token mass)",
    "exact_importance": "exact importance",
    "gradient_importance": "gradient importance",
    "copy_suppression": "copy suppression",
    "successor": "successor",
    "cls": "[CLS]",
    "sep": "[SEP]",
    "punct": "punctuation",
    "next": "next token",
    "entropy": "entropy (nats)",
    "positional": "positional",
    "rare_word": "rare word",
    "comp_in": "composition in (z)",
    "comp_out": "composition out (z)",
    "patch_effect": "patching effect",
    "dla": "direct logit attribution",
}
TASK_COLS = ("patch_effect", "dla")  # the task part's columns: its own section and the cards
TASK_ROWS = 12  # heads in the task section's table, by patching effect
COMPOSITION_COLS = ("comp_in", "comp_out")
# the columns of the second table, what heads write and read (interp.roles); the role table has the rest
CIRCUIT_COLS = (
    "copy_suppression",
    "successor",
    "cls",
    "sep",
    "punct",
    "next",
    "positional",
    "rare_word",
    "entropy",
    *COMPOSITION_COLS,
)


def _card_html(atlas: Atlas) -> str:
    """The card panel (empty until a head is clicked) and its data: :attr:`Atlas.cards`."""
    from interp.report.atlas import plain

    data = {
        "cards": plain(atlas.cards),
        "baselines": plain(atlas.baselines),
        "names": {**{c: PRETTY.get(c, c) for c in role_columns()}, **PRETTY, **NAMES},
        "ci": f"{atlas.meta['ci_level']:.0%}",
        "targets": {t: TARGETS.doc(t) for t in TARGETS},
    }
    blob = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (
        "<div id='head-card' hidden></div>"
        f'<script type="application/json" id="atlas-cards">{blob}</script><script>{CARD_JS}</script>'
    )


def _role_html(atlas: Atlas, cols: list[str], rows: pd.DataFrame | None = None) -> str:
    """The table of ``cols`` over every head (``rows``: these rows of the role table, in their order,
    without the uniform row when no column has a baseline)."""
    t = atlas.roles if rows is None else rows
    names = {**{c: PRETTY.get(c, c) for c in cols}, **{c: n for c, n in NAMES.items() if c in cols}}
    pick = " tabindex='0'" if atlas.cards else ""
    threshold = atlas.meta.get("threshold", THRESHOLD)
    bars = {c: ROLES.info(role, "threshold", None) or threshold for c, role in role_columns().items()}
    head = "<tr><th>head</th><th class='role'>role</th>" + "".join(f"<th>{html.escape(names[c])}</th>" for c in cols)
    uniform = "".join(f"<td>{atlas.baselines[c]:.3f}</td>" if c in atlas.baselines else "<td></td>" for c in cols)
    lines = [] if rows is not None and not any(c in atlas.baselines for c in cols) else [uniform]
    rows = [f"<tr class='baseline'><td>uniform</td><td class='role'></td>{u}" for u in lines]
    for _, r in t.iterrows():
        cells = [f"<td>{html.escape(str(r['label']))}</td>", f"<td class='role'>{html.escape(r['role'])}</td>"]
        for c in cols:
            v = r[c]
            if pd.isna(v):
                cells.append("<td>-</td>")
            elif c in COMPOSITION_COLS:
                cells.append(f"<td>{html.escape(str(v))}<span class='ci'>z {r[f'{c}_z']:.1f}</span></td>")
            elif f"{c}_lo" in t:
                # bold needs the role rule: the CI above the uniform baseline and the score at the threshold
                clear = c in atlas.baselines and r[f"{c}_lo"] > atlas.baselines[c] and v >= bars.get(c, threshold)
                ci = f"<span class='ci'>[{r[f'{c}_lo']:.3f}, {r[f'{c}_hi']:.3f}]</span>"
                cells.append(f"<td{' class=clear' if clear else ''}>{v:.3f}{ci}</td>")
            else:
                cells.append(f"<td>{v:.3g}</td>")
        attrs = f" data-head='{html.escape(str(r['label']))}'{pick}" if atlas.cards else ""
        rows.append(f"<tr{attrs}>" + "".join(cells) + "</tr>")
    return f"<div class='table-wrap'><table><thead>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"


def figure_html(fig: go.Figure, div_id: str) -> str:
    """A figure as a ``<div>`` for a page that inlines plotly.js once (the atlas, the checkpoints page)."""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False})


def _heatmaps_section(atlas: Atlas) -> str:
    fig = atlas.figure()
    return (
        "<p class='note'>One colour scale per family: attention masses on 0..1, copying on -1..1 centred on 0, "
        "the OV roles' shares on 0..1. Hover a cell for the head, its score, CI and the uniform baseline"
        + ("; click it for the head's card." if atlas.cards else ".")
        + "</p>"
        + figure_html(fig, "atlas-heatmaps")
    )


def _sinks_section(atlas: Atlas) -> str:
    from interp.sinks import sink_rate_bars

    rep = atlas.sinks
    m = rep.meta
    fig = sink_rate_bars(rep.layers, rep.meta)
    fig.update_layout(title=f"Sink^eps per layer (eps = {m['epsilon']}); model: {rep.sink_rate:.0%} of heads")
    text = (
        f"Sink^eps: the share of a layer's heads that put more than eps = {m['epsilon']} of their attention on the "
        f"first token ({html.escape(str(m['first_token']))}); a uniform head gives it {m['uniform_first_mass']:.3f}. "
        f"{m['n_massive']} massive activations (|x| > {m['abs_threshold']:g} and > {m['rel_threshold']:g} x the "
        "median of their hidden state)."
    )
    return f"<p class='note'>{text}</p>" + figure_html(fig, "atlas-sinks")


def _ablation_section(atlas: Atlas) -> str:
    parts = []
    found = {"exact_importance": atlas.exact, "gradient_importance": atlas.gradient}
    cols = [c for c, r in found.items() if r is not None]
    if cols:
        scales = IMPORTANCE_SCALES
        frame = atlas.roles[["layer", "head", "label"]]
        floors = {}
        for c in cols:
            result = found[c]
            keep = [k for k in ("importance", "importance_lo", "importance_hi") if k in result.table]
            part = result.table[["layer", "head", *keep]].rename(columns={k: k.replace("importance", c) for k in keep})
            frame = frame.merge(part, on=["layer", "head"], how="left")
            if result.meta.get("noise_floor") is not None:
                floors[c] = float(result.meta["noise_floor"])
        scores = HeadScores(frame)
        metric = atlas.meta.get("metric", "the metric")
        names = {
            "exact_importance": f"exact: how much worse {metric} gets",
            "gradient_importance": "gradient importance",
        }
        fig = heatmap(scores, cols, scales=scales, noise_floor=floors, names=names)
        parts.append(figure_html(fig, "atlas-importance"))
    if atlas.pruning is not None:
        clean = atlas.meta.get("clean_metric", atlas.pruning.attrs.get("clean_metric"))
        tol = 0.1
        band = None
        ran = atlas.exact or atlas.gradient
        if clean is not None:
            worse = -1 if ran is not None and ran.meta.get("higher_is_better") else 1
            band = (clean, clean + worse * tol * abs(clean), f"within {tol:.0%} of the unablated metric")
        fig = curves(
            atlas.pruning,
            "n_pruned",
            "metric",
            "label",
            title="pruning: heads removed in increasing order of importance",
            x_title="heads pruned",
            y_title=atlas.meta.get("metric", "metric"),
            band=band,
        )
        parts.append(figure_html(fig, "atlas-pruning"))
    note = (
        f"{atlas.meta.get('ablation', '')} ablation at hook_z, metric {atlas.meta.get('metric', '')}"
        + (f" (unablated {atlas.meta['clean_metric']:.4f})" if atlas.meta.get("clean_metric") is not None else "")
        + "; importance anchored at 0 (a diverging scale when some ablations help)."
    )
    return f"<p class='note'>{html.escape(note)}</p>" + "".join(parts)


RETRIEVAL_COLS = ("retrieval", "retrieval_mass", "streaming")
ROLE_COLS = (*role_columns(), "copying", "exact_importance", "gradient_importance", *RETRIEVAL_COLS)
# the importance panels' scales: each its own colour bar, neither holding a grey (grey marks the noise floor)
IMPORTANCE_SCALES = {
    "exact_importance": Scale("exact importance", anchor=0.0, diverging=DIVERGING),
    "gradient_importance": Scale("gradient importance", colorscale="Plasma", anchor=0.0, diverging=DIVERGING),
}
CURVES = 12  # heads drawn in the atlas's copy-distance figure (the strongest copiers)


def _retrieval_note(atlas: Atlas) -> str:
    return " ".join(n for n in atlas.meta.get("notes", []) if n.startswith("retrieval:"))


def _retrieval_section(atlas: Atlas) -> str:
    from interp.retrieval.figures import copy_distance_figure, retrieval_figure

    r = atlas.retrieval
    if r is None:
        return f"<p class='note'>{html.escape(_retrieval_note(atlas))}</p>"
    m = r["meta"]
    table = r["scores"]
    cards = []
    for role in ("retrieval", "streaming"):
        named = table[table["role"] == role].sort_values(role, ascending=False, kind="mergesort")["label"].tolist()
        shown = ", ".join(named[:8]) + (f" (+{len(named) - 8})" if len(named) > 8 else "") if named else "none"
        cards.append(f"<div><b>{role} heads</b><span>{html.escape(shown)}</span></div>")
    p = atlas.meta.get("retrieval_probe", {})
    note = (
        f"Needle probe: {p.get('batch', '?')} sequences of {m['seq_len']} tokens, {m['n_needles']} needles of "
        f"{p.get('needle_len', '?')} tokens copied teacher-forced at the end ({m['engine']} engine). Retrieval "
        f"(Wu et al. 2024): the share of copy steps at which the head's most-attended key is the needle token "
        f"being copied, {m['ci_level']:.0%} bootstrap CI over needles; a retrieval head scores at least 0.1. "
        f"Streaming: the share of attention on the first {m['sink']} keys plus the last {m['window']}; a streaming "
        "head (kept whole by a sink + window KV cache) has at least 0.9 and is not a retrieval head. "
        "The role table above has both columns (retrieval_role in atlas_roles.csv)."
    )
    dist = r["distance"]
    strength = dist.groupby(["layer", "head"])[["induction", "retrieval"]].mean().max(axis=1)
    heads = strength.sort_values(ascending=False, kind="mergesort").index[:CURVES].tolist()
    windows = [w for w in r["windows"] if w]
    curve_note = (
        f"Copy distance: induction mass and retrieval score against the distance to the earlier copy, one curve "
        f"per head ({'every head' if len(heads) == len(strength) else f'the {len(heads)} strongest copiers'}); "
        "the dashed line is a uniform head's induction mass"
        + (
            "; dotted lines mark the sliding windows, past which a windowed head cannot see the copy."
            if windows
            else "."
        )
    )
    fig = copy_distance_figure(dist, windows=r["windows"], heads=heads, title="copy distance")
    return (
        f'<div class="glance">{"".join(cards)}</div><p class="note">{html.escape(note)}</p>'
        + figure_html(retrieval_figure(HeadScores(table), title="retrieval and streaming"), "atlas-retrieval")
        + f"<p class='note'>{html.escape(curve_note)}</p>"
        + figure_html(fig, "atlas-copy-distance")
    )


def _patterns_section(atlas: Atlas) -> str:
    p = atlas.pattern
    t = atlas.roles
    data: dict[str, Any] = {
        "tokens": p["tokens"],
        "layers": list(range(atlas.meta["n_layers"])),
        "heads": list(range(atlas.meta["n_heads"])),
        "order": t["label"].tolist(),
        "roles": {lab: role for lab, role in zip(t["label"], t["role"]) if role},
        "selected": p["selected"],
        "patterns": {
            lab: np.asarray(p["patterns"][l, h]).tolist() for lab, l, h in zip(t["label"], t["layer"], t["head"])
        },
    }
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    note = (
        f"Every head's attention on one sequence of {len(p['tokens'])} tokens (a random block repeated twice). "
        "Click heads on the grid (rows: layers) to show or hide them; the strongest head of each role is shown first. "
        "Induction heads light the diagonal stripe one past each earlier copy of the current token."
    )
    return (
        f"<p class='note'>{html.escape(note)}</p><div id='head-picker'></div><div id='pattern-view'></div>"
        f'<script type="application/json" id="atlas-patterns">{blob}</script><script>{VIEWER_JS}</script>'
    )
