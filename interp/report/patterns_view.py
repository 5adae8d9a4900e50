""":func:`view_patterns`: every head's attention on your own texts, as one self-contained HTML page.

The page holds a thumbnail of every chosen head; a click on one enlarges it. Hovering a token (in
the token strip or on the enlarged pattern) lights up what it attends to and what attends to it;
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
from interp.report.patterns import attention_patterns

STEM = "patterns"
WINDOW = 64  # positions shown at once; longer texts are windowed
MASKED = 255  # the byte of a cell the query may not see


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
        lens = ", ".join(str(len(t["tokens"])) for t in self.texts)
        n_win = sum(len(_windows(len(t["tokens"]), self.window)) for t in self.texts)
        return (
            f"{self.meta.get('model', 'model')}: attention patterns of {len(self.heads)} heads on "
            f"{len(self.texts)} text(s) of {lens} tokens; {n_win} window(s) of up to {self.window} positions"
        )

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
    out: str | Path | None = None,
    overwrite: bool = False,
) -> PatternPage:
    """Every chosen head's attention pattern on each text, as one self-contained HTML page.

    ``texts``: a string or a list of strings (each run alone, framed as the model expects, e.g.
    with its BOS; a model without a tokenizer, the toy, reads a text as its UTF-8 bytes, one token
    a byte). ``heads``: ``None`` for every head, or labels ``"1.2"``/``"L1H2"`` or
    ``(layer, head)`` pairs. ``window``: positions shown at once. ``out``: a folder to write
    ``patterns.html`` into (see :meth:`PatternPage.save`); the page is returned either way.
    """
    from interp.probes import probe_from_texts
    from interp.sinks import token_texts

    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise UsageError("texts must be a non-empty string or a non-empty list of non-empty strings")
    if not isinstance(window, int) or window < 4:
        raise UsageError(f"window must be an integer >= 4 (positions shown at once), got {window!r}")
    info = describe(model)
    chosen = _head_list(info, heads)
    index_l = [l for l, _ in chosen]
    index_h = [h for _, h in chosen]
    drawn = []
    for text in texts:
        probe = probe_from_texts(model, text)
        ids = probe.tokens[0]
        pattern = attention_patterns(model, ids).numpy()[index_l, index_h]  # [head, q, k]
        names = token_texts(model, probe, sorted(set(ids.tolist())))
        drawn.append({"tokens": [names[int(t)] for t in ids.tolist()], "patterns": pattern})
    page = PatternPage(
        heads=[f"{l}.{h}" for l, h in chosen],
        texts=drawn,
        meta={"model": info.name, "n_layers": info.n_layers, "n_heads": info.n_heads, "causal": info.is_causal},
        window=window,
    )
    if out is not None:
        page.save(out, overwrite=overwrite)
    return page


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
    return {"heads": page.heads, "texts": texts, "causal": causal, "model": page.meta.get("model", "")}


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; padding: 20px;
       max-width: 1400px; color: #1f2933; }
h1 { font-size: 22px; margin: 0 0 4px; } .meta { color: #52606d; margin: 0 0 10px; font-size: 14px; }
.controls { display: flex; gap: 14px; align-items: center; margin: 8px 0; flex-wrap: wrap; font-size: 14px; }
#thumbs { display: flex; flex-wrap: wrap; gap: 6px; margin: 10px 0; }
.thumb { border: 2px solid #d9e2ec; border-radius: 4px; padding: 2px; cursor: pointer; text-align: center;
         font-size: 11px; background: white; }
.thumb.active { border-color: #0b6e4f; } .thumb canvas { display: block; image-rendering: pixelated; }
#big { display: flex; gap: 20px; align-items: flex-start; flex-wrap: wrap; }
#big canvas { image-rendering: pixelated; border: 1px solid #d9e2ec; cursor: crosshair; }
.strip { display: flex; flex-wrap: wrap; gap: 2px; margin: 4px 0 10px; max-width: 760px; }
.tok { font-family: ui-monospace, monospace; font-size: 13px; padding: 1px 3px; border-radius: 3px;
       border: 1px solid #e4e7eb; white-space: pre; cursor: default; }
.tok.hovered { outline: 2px solid #d64545; }
.legend { font-size: 13px; color: #52606d; } #hover-info { font-size: 13px; min-height: 1.4em; }
"""

VIEWER = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("pattern-data").textContent);
  var state = { text: 0, win: 0, head: 0, token: null };
  var GREY = [205, 210, 216];
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
  var thumbs = document.getElementById("thumbs"), big = document.getElementById("big-canvas");
  function drawThumbs() {
    thumbs.textContent = "";
    var scale = Math.max(1, Math.floor(96 / size()));
    data.heads.forEach(function (label, h) {
      var box = document.createElement("div"); box.className = "thumb" + (h === state.head ? " active" : "");
      box.dataset.head = label; box.title = "head " + label + ": click to enlarge";
      var c = document.createElement("canvas"); paint(c, h, scale, state.token);
      box.appendChild(c); box.appendChild(document.createTextNode(label));
      box.addEventListener("click", function () { state.head = h; drawThumbs(); drawBig(); });
      thumbs.appendChild(box);
    });
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
      var tok = t.tokens[w.start + i];
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
  function drawBig() {
    var scale = Math.max(2, Math.floor(520 / size()));
    paint(big, state.head, scale, state.token);
    document.getElementById("big-title").textContent = "head " + data.heads[state.head];
    strips();
  }
  function hover(i) { state.token = i; drawBig(); drawThumbs(); }
  big.addEventListener("mousemove", function (e) {
    var r = big.getBoundingClientRect(), q = Math.floor((e.clientY - r.top) / r.height * size());
    if (q >= 0 && q < size() && q !== state.token) { hover(q); }
  });
  var textSel = document.getElementById("text-choice"), winSel = document.getElementById("window-choice");
  data.texts.forEach(function (t, i) { var o = document.createElement("option"); o.value = i;
    o.textContent = t.name + " (" + t.tokens.length + " tokens)"; textSel.appendChild(o); });
  function windows() { winSel.textContent = ""; data.texts[state.text].windows.forEach(function (w, i) {
    var o = document.createElement("option"); o.value = i; var n = data.texts[state.text].tokens.length;
    o.textContent = "positions " + w.start + "-" + (Math.min(n, w.start + W) - 1); winSel.appendChild(o); });
    winSel.disabled = data.texts[state.text].windows.length < 2; }
  textSel.addEventListener("change", function () { state.text = +textSel.value; state.win = 0; state.token = null; windows(); drawThumbs(); drawBig(); });
  winSel.addEventListener("change", function () { state.win = +winSel.value; state.token = null; drawThumbs(); drawBig(); });
  windows(); drawThumbs(); drawBig();
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
grey cells are masked (a query cannot see later tokens).</p>
<div class="controls"><label>text <select id="text-choice"></select></label>
<label>window <select id="window-choice"></select></label></div>
<div id="thumbs"></div>
<div id="big"><div><b id="big-title"></b><br><canvas id="big-canvas"></canvas></div>
<div><div id="hover-info"></div>
<div class="legend">what <span id="hovered-token">the hovered token</span> attends to (red):</div>
<div class="strip" id="attends-to"></div>
<div class="legend">what attends to it (orange):</div><div class="strip" id="attended-by"></div></div></div>
<script type="application/json" id="pattern-data">{blob}</script>
<script>{VIEWER}</script>
</body></html>
"""


__all__ = ["PatternPage", "view_patterns", "render_patterns"]
