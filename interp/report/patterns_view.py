""":func:`view_patterns`: every head's attention on your own texts, as one self-contained HTML page.

The page holds a thumbnail of every chosen head, laid out as a layer x head grid; a click on one
enlarges it, beside the grid and kept in view as the grid scrolls, with token labels on both axes
(thinned when there are many). Hovering a token (in the token strip or on the enlarged pattern) lights up what it attends to and what attends to it;
cells a query may not see (the causal mask) are grey. A text longer than ``window`` tokens is shown
one window of positions at a time (windows overlap by half), with the attention a query puts on
keys before the window given in the hover. The page needs no network and no plotly: weights are
stored as bytes (0..254, 255 for a masked cell), base64 in the page, and drawn on canvases.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from interp.adapters import HookedModel
from interp.errors import UsageError
from interp.models import describe
from interp.parts.patterns import attention_patterns, token_labels

STEM = "patterns"
WINDOW = 64  # positions shown at once; longer texts are windowed
MASKED = 255  # the byte of a cell the query may not see
# what one page holds unless asked for more (about 30 MB at most for GPT-2 small's 144 heads): the
# texts, the windows of each text, the heads; what is left out is said on the page and when it is made
MAX_TEXTS = 10
MAX_WINDOWS = 4
MAX_HEADS = 256


@dataclass
class PatternPage:
    """What :func:`view_patterns` drew: ``texts`` (each a dict of ``tokens`` and the ``[head, q, k]``
    weights of the chosen ``heads``), the page itself (:attr:`html`), and :meth:`save`."""

    heads: list[str]
    texts: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    window: int = WINDOW

    @property
    def html(self) -> str:
        return render_patterns(self)

    def _repr_html_(self) -> str:  # a notebook shows the page inline
        return (
            f"<iframe srcdoc='{html.escape(self.html, quote=True)}' style='width:100%;height:760px;border:0'></iframe>"
        )

    def summary(self) -> str:
        """One line: the model, the heads, the texts (their lengths summarised), the windows, and what
        the page's caps left out (:meth:`left_out`)."""
        lens = [len(t["tokens"]) for t in self.texts]
        n_win = sum(len(_windows(n, self.window)) for n in lens)
        line = (
            f"{self.meta.get('model', 'model')}: attention patterns of {len(self.heads)} heads on "
            f"{count_lengths(lens, 'text')}; {n_win} window(s) of up to {self.window} positions"
        )
        left = self.left_out()
        return line + (f"; {left}" if left else "")

    def left_out(self) -> str:
        """What the caps (``max_texts``, ``max_windows``, ``max_heads``) left out and the flag that
        shows more, or ``""`` when the page holds everything."""
        left = self.meta.get("left_out", {})
        parts = []
        if left.get("texts"):
            parts.append(f"{left['texts']:,} more text(s): raise max_texts= (command line: --max-texts)")
        if left.get("windows"):
            parts.append(
                f"the tail of {left['windows']:,} long text(s): raise max_windows= (command line: --max-windows)"
            )
        if left.get("heads"):
            parts.append(
                f"{left['heads']:,} more head(s): raise max_heads= or choose them with heads= (command line: --max-heads, --heads)"
            )
        return "left out: " + "; ".join(parts) if parts else ""

    def save(self, out: str | Path, stem: str = STEM, *, overwrite: bool = False) -> Path:
        """Write ``<stem>.html`` under ``out`` (atomically); refuses to replace one unless ``overwrite``."""
        from interp.saving import claim

        (path,) = claim(Path(out), [f"{stem}.html"], overwrite=overwrite)
        from interp._io import atomic_write

        return atomic_write(path, self.html)


def _head_list(info: Any, heads: Any) -> list[tuple[int, int]]:
    every = [(l, h) for l in range(info.n_layers) for h in range(info.n_heads)]
    if heads is None:
        return every
    if isinstance(heads, str):
        heads = [heads]
    out: list[tuple[int, int]] = []
    for item in heads:
        if isinstance(item, str):
            parts = item.strip().upper().lstrip("L").replace("H", ".").split(".")
            try:
                l, h = int(parts[0]), int(parts[1])
            except (ValueError, IndexError):
                raise UsageError(f"cannot read head {item!r}: write heads as LAYER.HEAD (e.g. 1.2) or L1H2") from None
        else:
            l, h = (int(v) for v in item)
        if (l, h) not in every:
            raise UsageError(
                f"no head {l}.{h} in this model: it has {info.n_layers} layers x {info.n_heads} heads "
                f"(up to {info.n_layers - 1}.{info.n_heads - 1})"
            )
        out.append((l, h))
    if not out:
        raise UsageError("heads is empty: pass None for every head, or a list such as ['0.1', '1.2']")
    return list(dict.fromkeys(out))


def view_patterns(
    model: HookedModel,
    texts: str | Sequence[str],
    heads: Any = None,
    *,
    window: int = WINDOW,
    max_texts: int = MAX_TEXTS,
    max_windows: int = MAX_WINDOWS,
    max_heads: int = MAX_HEADS,
    progress: bool = False,
    out: str | Path | None = None,
    overwrite: bool = False,
) -> PatternPage:
    """Every chosen head's attention pattern on each text, as one self-contained HTML page.

    ``texts``: a string or a list of strings (each run alone, framed as the model expects, e.g.
    with its BOS; a model without a tokenizer, the toy, reads a text as its UTF-8 bytes, one token
    a byte). ``heads``: ``None`` for every head, or labels ``"1.2"``/``"L1H2"`` or
    ``(layer, head)`` pairs. ``window``: positions shown at once. ``out``: a folder to write
    ``patterns.html`` into (see :meth:`PatternPage.save`); the page is returned either way.
    ``progress``: say the sizes, then show progress over the texts.

    A page holds at most ``max_texts`` texts (the first ones; the rest are not run),
    ``max_windows`` windows of each text (a text is cut after its last window shown: a causal
    model never runs on the rest) and ``max_heads`` heads (the first chosen); :meth:`PatternPage.left_out`
    says what was left out and :meth:`PatternPage.summary` includes it.
    """
    from interp.probes import probe_from_texts
    from interp.progress import tqdm

    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise UsageError("texts must be a non-empty string or a non-empty list of non-empty strings")
    if not isinstance(window, int) or window < 4:
        raise UsageError(f"window must be an integer >= 4 (positions shown at once), got {window!r}")
    for name, value in (("max_texts", max_texts), ("max_windows", max_windows), ("max_heads", max_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} must be an integer >= 1, got {value!r}")
    info = describe(model)
    chosen = _head_list(info, heads)
    left_out = {"texts": max(0, len(texts) - max_texts), "heads": max(0, len(chosen) - max_heads), "windows": 0}
    texts, chosen = texts[:max_texts], chosen[:max_heads]
    index_l = [l for l, _ in chosen]
    index_h = [h for _, h in chosen]
    keep = window + (max_windows - 1) * (window // 2)  # the positions the first max_windows windows cover
    drawn = []
    bar = tqdm(
        texts,
        desc="patterns",
        disable=not progress,
        unit="text",
        sizes=f"{len(chosen)} heads on {len(texts)} text(s), up to {max_windows} window(s) of {window} positions each",
    )
    for text in bar:
        probe = probe_from_texts(model, text)
        ids = probe.tokens[0]
        cut = len(ids) > keep
        left_out["windows"] += cut
        ran = ids[:keep] if cut and info.is_causal else ids  # later tokens change no causal pattern shown
        pattern = attention_patterns(model, ran).numpy()[index_l, index_h][:, :keep, :keep]  # [head, q, k]
        ids = ids[:keep]
        drawn.append({"tokens": token_labels(model, ids.tolist(), probe), "patterns": pattern})
    page = PatternPage(
        heads=[f"{l}.{h}" for l, h in chosen],
        texts=drawn,
        meta={
            "model": info.name,
            "n_layers": info.n_layers,
            "n_heads": info.n_heads,
            "causal": info.is_causal,
            "left_out": left_out,
        },
        window=window,
    )
    if out is not None:
        page.save(out, overwrite=overwrite)
    return page


def count_lengths(lengths: Sequence[int], what: str, unit: str = "tokens") -> str:
    """``"3 texts of 12, 40 and 55 tokens"``; more than five: ``"20,000 texts of 12-55 tokens"``.

    >>> count_lengths([7], "text"), count_lengths([12, 55, 40] * 2, "text")
    ('1 text of 7 tokens', '6 texts of 12-55 tokens')
    """
    n = len(lengths)
    if n == 0:
        return f"no {what}s"
    if n == 1:
        return f"1 {what} of {lengths[0]:,} {unit}"
    if n <= 5:
        listed = ", ".join(f"{v:,}" for v in lengths[:-1]) + f" and {lengths[-1]:,}"
        return f"{n} {what}s of {listed} {unit}"
    low, high = min(lengths), max(lengths)
    span = f"{low:,}" if low == high else f"{low:,}-{high:,}"
    return f"{n:,} {what}s of {span} {unit}"


def _windows(n: int, window: int) -> list[int]:
    """Start positions of the windows over ``n`` tokens: ``[0]`` when it fits, else half-overlapping."""
    if n <= window:
        return [0]
    step = window // 2
    starts = list(range(0, n - window + 1, step))
    if starts[-1] + window < n:
        starts.append(n - window)
    return starts


def _encode(weights: np.ndarray, causal: bool) -> str:
    """``[head, q, k]`` weights as base64 bytes: 0..254 for 0..1, 255 where the query may not look."""
    q = np.clip(np.rint(np.nan_to_num(weights, nan=0.0) * 254), 0, 254).astype(np.uint8)
    if causal:
        rows, cols = np.triu_indices(weights.shape[-1], 1)
        q[:, rows, cols] = MASKED
    return base64.b64encode(q.tobytes()).decode("ascii")


def _payload(page: PatternPage) -> dict[str, Any]:
    causal = bool(page.meta.get("causal", True))
    texts = []
    for i, t in enumerate(page.texts):
        w = np.asarray(t["patterns"], dtype=np.float32)
        n = len(t["tokens"])
        windows = []
        for s in _windows(n, page.window):
            e = min(n, s + page.window)
            block = w[:, s:e, s:e]
            before = w[:, s:e, :s].sum(-1) if s else np.zeros(block.shape[:2], np.float32)
            windows.append({"start": s, "data": _encode(block, causal), "before": np.round(before, 3).tolist()})
        texts.append({"name": f"text {i + 1}", "tokens": t["tokens"], "windows": windows})
    return {
        "heads": page.heads,
        "n_heads": page.meta.get("n_heads"),
        "texts": texts,
        "causal": causal,
        "model": page.meta.get("model", ""),
    }


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; padding: 16px 20px;
       max-width: 1800px; color: #1f2933; }
h1 { font-size: 22px; margin: 0 0 4px; } .meta { color: #52606d; margin: 0 0 10px; font-size: 14px; max-width: 1100px; }
.controls { display: flex; gap: 14px; align-items: center; margin: 8px 0; flex-wrap: wrap; font-size: 14px; }
#layout { display: flex; gap: 20px; align-items: flex-start; }
#grid-wrap { flex: 0 1 auto; min-width: 0; }
#thumbs { display: grid; gap: 3px; align-items: center; justify-content: start; }
.row-label, .col-label { font-size: 11px; color: #52606d; text-align: center; }
.row-label { padding-right: 4px; text-align: right; }
.thumb { border: 2px solid #d9e2ec; border-radius: 3px; padding: 1px; cursor: pointer; background: white; min-width: 0; }
.thumb.active { border-color: #0b6e4f; }
.thumb canvas { display: block; width: 100%; height: auto; image-rendering: pixelated; }
#big { flex: 0 0 auto; width: min-content; position: sticky; top: 8px; max-height: calc(100vh - 16px);
       overflow-y: auto; overflow-x: hidden; }
#big-plot { display: grid; grid-template-columns: auto auto; margin-top: 8px; }
#big canvas { display: block; image-rendering: pixelated; border: 1px solid #d9e2ec; cursor: crosshair; }
.labels { font-family: ui-monospace, monospace; font-size: 10px; color: #3e4c59; white-space: pre; }
#ylabels div { text-align: right; padding-right: 4px; overflow: visible; }
#xlabels { display: flex; align-items: flex-start; padding-top: 3px; }
#xlabels div { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; overflow: visible; }
.axis-name { font-size: 11px; color: #52606d; }
.strip { display: flex; flex-wrap: wrap; gap: 2px; margin: 4px 0 8px; }
.tok { font-family: ui-monospace, monospace; font-size: 12px; padding: 0 3px; border-radius: 3px;
       border: 1px solid #e4e7eb; white-space: pre; cursor: default; }
.tok.hovered { outline: 2px solid #d64545; }
.legend { font-size: 13px; color: #52606d; } #hover-info { font-size: 13px; min-height: 1.4em; margin-top: 6px; }
"""

VIEWER = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("pattern-data").textContent);
  var state = { text: 0, win: 0, head: 0, token: null };
  var GREY = [205, 210, 216];
  var LABEL = 12;  // pixels an axis label needs: labels are thinned to one every LABEL pixels or more
  function bytes(b64) { var s = atob(b64), a = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) { a[i] = s.charCodeAt(i); } return a; }
  data.texts.forEach(function (t) { t.windows.forEach(function (w) { w.bytes = bytes(w.data); }); });
  function win() { return data.texts[state.text].windows[state.win]; }
  function size() { var t = data.texts[state.text], w = win(); return Math.min(t.tokens.length - w.start, W); }
  var W = data.window;
  function weight(h, q, k) { var n = size(), v = win().bytes[(h * n + q) * n + k]; return v === 255 ? null : v / 254; }
  function colour(v) { if (v === null) { return GREY; } var c = Math.round(255 * (1 - Math.sqrt(v)));
    return [c, Math.round(c * 0.55 + 115 * (1 - v)), 255 - Math.round(120 * v)]; }
  function paint(canvas, h, scale, mark) {
    var n = size(); canvas.width = n * scale; canvas.height = n * scale;
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(n, n);
    for (var q = 0; q < n; q++) { for (var k = 0; k < n; k++) {
      var c = colour(weight(h, q, k)), o = 4 * (q * n + k);
      img.data[o] = c[0]; img.data[o + 1] = c[1]; img.data[o + 2] = c[2]; img.data[o + 3] = 255; } }
    var tmp = document.createElement("canvas"); tmp.width = n; tmp.height = n; tmp.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false; ctx.drawImage(tmp, 0, 0, n * scale, n * scale);
    if (mark !== null && mark !== undefined) { ctx.strokeStyle = "#d64545"; ctx.lineWidth = Math.max(1, scale / 4);
      ctx.strokeRect(0, mark * scale, n * scale, scale); ctx.strokeStyle = "#f0a202"; ctx.strokeRect(mark * scale, 0, scale, n * scale); }
  }
  // the thumbnails as a layer x head grid: a row per layer shown, a column per head of the model
  var where = data.heads.map(function (label) { var p = label.split("."); return [+p[0], +p[1]]; });
  var nHeads = data.n_heads || Math.max.apply(null, where.map(function (w) { return w[1] + 1; }));
  var layers = where.map(function (w) { return w[0]; }).filter(function (l, i, all) { return all.indexOf(l) === i; })
    .sort(function (a, b) { return a - b; });
  var thumbs = document.getElementById("thumbs"), big = document.getElementById("big-canvas"), boxes = [];
  function cell(cls, text, row, col) { var d = document.createElement("div"); d.className = cls; d.textContent = text;
    d.style.gridRow = row; d.style.gridColumn = col; thumbs.appendChild(d); return d; }
  function buildGrid() {
    thumbs.style.gridTemplateColumns = "auto repeat(" + nHeads + ", minmax(0, 96px))";
    for (var h = 0; h < nHeads; h++) { cell("col-label", "H" + h, 1, h + 2); }
    layers.forEach(function (l, r) { cell("row-label", "L" + l, r + 2, 1); });
    data.heads.forEach(function (label, h) {
      var box = cell("thumb", "", layers.indexOf(where[h][0]) + 2, where[h][1] + 2);
      box.dataset.head = label; box.title = "head " + label + ": click to enlarge";
      box.appendChild(document.createElement("canvas"));
      box.addEventListener("click", function () { state.head = h; drawThumbs(); drawBig(); });
      boxes.push(box);
    });
  }
  function drawThumbs() {
    var scale = Math.max(1, Math.floor(96 / size()));
    boxes.forEach(function (box, h) {
      box.className = "thumb" + (h === state.head ? " active" : "");
      paint(box.firstChild, h, scale, state.token);
    });
  }
  function shown(tok) { return tok.replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5").replace(/\r/g, "\u240d"); }
  function label(i) { var t = data.texts[state.text].tokens[win().start + i], s = shown(t);
    return (win().start + i) + " " + (s.length > 12 ? s.slice(0, 11) + "\u2026" : s); }
  function axisLabels(scale) {
    // token labels on both axes of the enlarged pattern, one every `step` positions when there are many
    var n = size(), step = Math.max(1, Math.ceil(LABEL / scale));
    var ys = document.getElementById("ylabels"), xs = document.getElementById("xlabels");
    ys.textContent = ""; xs.textContent = "";
    for (var i = 0; i < n; i++) {
      var text = i % step === 0 ? label(i) : "";
      var y = document.createElement("div"); y.style.height = scale + "px"; y.style.lineHeight = scale + "px";
      y.textContent = text; if (text) { y.className = "axis-label"; y.dataset.pos = i; } ys.appendChild(y);
      var x = document.createElement("div"); x.style.width = scale + "px"; x.style.lineHeight = scale + "px";
      x.textContent = text; if (text) { x.className = "axis-label"; x.dataset.pos = i; } xs.appendChild(x);
    }
  }
  function chip(text, i, v, rgb) {
    var s = document.createElement("span"); s.className = "tok"; s.textContent = text; s.dataset.pos = i;
    if (v === null) { s.style.background = "rgb(" + GREY.join(",") + ")"; s.dataset.weight = "masked"; }
    else { s.dataset.weight = v.toFixed(3); s.style.background = "rgba(" + rgb + "," + Math.min(1, v * 1.5).toFixed(3) + ")"; }
    if (i === state.token) { s.classList.add("hovered"); }
    s.addEventListener("mouseenter", function () { hover(i); });
    return s;
  }
  function strips() {
    var t = data.texts[state.text], w = win(), n = size(), q = state.token;
    var to = document.getElementById("attends-to"), by = document.getElementById("attended-by");
    to.textContent = ""; by.textContent = "";
    for (var i = 0; i < n; i++) {
      var tok = shown(t.tokens[w.start + i]);
      to.appendChild(chip(tok, i, q === null ? 0 : weight(state.head, q, i), "214,69,69"));
      by.appendChild(chip(tok, i, q === null ? 0 : weight(state.head, i, q), "240,162,2"));
    }
    var info = document.getElementById("hover-info");
    if (q === null) { info.textContent = "Hover a token (or a row of the pattern) to see what it attends to and what attends to it."; return; }
    var before = w.start ? "; " + w.before[state.head][q].toFixed(3) + " of its attention is on tokens before this window" : "";
    info.textContent = "token " + (w.start + q) + " " + JSON.stringify(t.tokens[w.start + q]) + " in head " +
      data.heads[state.head] + before;
    document.getElementById("hovered-token").textContent = JSON.stringify(t.tokens[w.start + q]);
  }
  var drawnScale = null;
  function drawBig() {
    // the enlarged pattern fits beside the grid and, with its labels and token strips, in the window
    var side = Math.max(200, Math.min(520, innerWidth * 0.34 - 60, innerHeight - 400));
    var scale = Math.max(2, Math.floor(side / size()));
    paint(big, state.head, scale, state.token);
    if (scale !== drawnScale || big.dataset.text !== state.text + "/" + state.win) {
      axisLabels(scale); drawnScale = scale; big.dataset.text = state.text + "/" + state.win; }
    document.getElementById("big-title").textContent = "head " + data.heads[state.head];
    strips();
  }
  function hover(i) { state.token = i; drawBig(); drawThumbs(); }
  big.addEventListener("mousemove", function (e) {
    var r = big.getBoundingClientRect(), q = Math.floor((e.clientY - r.top) / r.height * size());
    if (q >= 0 && q < size() && q !== state.token) { hover(q); }
  });
  addEventListener("resize", function () { drawBig(); });
  var textSel = document.getElementById("text-choice"), winSel = document.getElementById("window-choice");
  data.texts.forEach(function (t, i) { var o = document.createElement("option"); o.value = i;
    o.textContent = t.name + " (" + t.tokens.length + " tokens)"; textSel.appendChild(o); });
  function windows() { winSel.textContent = ""; data.texts[state.text].windows.forEach(function (w, i) {
    var o = document.createElement("option"); o.value = i; var n = data.texts[state.text].tokens.length;
    o.textContent = "positions " + w.start + "-" + (Math.min(n, w.start + W) - 1); winSel.appendChild(o); });
    winSel.disabled = data.texts[state.text].windows.length < 2; }
  textSel.addEventListener("change", function () { state.text = +textSel.value; state.win = 0; state.token = null; windows(); drawThumbs(); drawBig(); });
  winSel.addEventListener("change", function () { state.win = +winSel.value; state.token = null; drawThumbs(); drawBig(); });
  buildGrid(); windows(); drawThumbs(); drawBig();
  document.body.dataset.ready = "1";
})();
"""


def render_patterns(page: PatternPage) -> str:
    payload = _payload(page)
    payload["window"] = page.window
    blob = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
    name = html.escape(str(page.meta.get("model", "")))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Attention patterns: {name}</title>
<style>{STYLE}</style></head><body>
<h1>Attention patterns: {name}</h1>
<p class="meta">{html.escape(page.summary())}. Rows are queries, columns keys; darker is more attention;
grey cells are masked (a query cannot see later tokens). A token that holds part of one character shows its
bytes (such as \\xe2\\x80).</p>
<div class="controls"><label>text <select id="text-choice"></select></label>
<label>window <select id="window-choice"></select></label></div>
<div id="layout">
<div id="grid-wrap"><div class="legend">Every head: rows are layers (L), columns heads (H); click one to enlarge it.</div>
<div id="thumbs"></div></div>
<div id="big"><b id="big-title"></b> <span class="axis-name">rows: query, columns: key</span>
<div id="big-plot"><div id="ylabels" class="labels"></div><canvas id="big-canvas"></canvas>
<div></div><div id="xlabels" class="labels"></div></div>
<div id="hover-info"></div>
<div class="legend">what <span id="hovered-token">the hovered token</span> attends to (red):</div>
<div class="strip" id="attends-to"></div>
<div class="legend">what attends to it (orange):</div><div class="strip" id="attended-by"></div></div>
</div>
<script type="application/json" id="pattern-data">{blob}</script>
<script>{VIEWER}</script>
</body></html>
"""


__all__ = ["MAX_HEADS", "MAX_TEXTS", "MAX_WINDOWS", "PatternPage", "count_lengths", "render_patterns", "view_patterns"]
