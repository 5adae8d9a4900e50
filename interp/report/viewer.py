"""The JavaScript of the atlas's attention-pattern viewer (kept as a string: the page inlines it)."""

VIEWER_JS = r"""
// The atlas's attention-pattern viewer: toggle heads on the layer x head grid; each chosen head
// draws its pattern on the probe sequence, tokens on both axes, on one fixed 0..1 scale.
(function () {
  "use strict";
  var source = document.getElementById("atlas-patterns");
  if (!source) { return; }
  var data = JSON.parse(source.textContent);
  var picker = document.getElementById("head-picker");
  var view = document.getElementById("pattern-view");
  var chosen = {};
  data.selected.forEach(function (label) { chosen[label] = true; });
  var positions = data.tokens.map(function (_, i) { return i; });
  var ticks = data.tokens.map(function (t, i) { return i + " " + t; });
  var size = Math.max(300, Math.min(560, 120 + 16 * data.tokens.length));
  // one tick label every `step` positions when they would crowd (9 px text needs about 11 px)
  var step = Math.max(1, Math.ceil(11 * data.tokens.length / (size - 120)));
  var shown = positions.filter(function (i) { return i % step === 0; });
  var shownText = shown.map(function (i) { return ticks[i]; });

  function draw() {
    view.textContent = "";
    data.order.forEach(function (label) {
      if (!chosen[label]) { return; }
      var box = document.createElement("div");
      box.className = "pattern";
      view.appendChild(box);
      var role = data.roles[label] ? " (" + data.roles[label] + ")" : "";
      Plotly.newPlot(box, [{
        type: "heatmap", z: data.patterns[label], x: positions, y: positions,
        zmin: 0, zmax: 1, colorscale: "Viridis",
        colorbar: { thickness: 10, title: { text: "weight", side: "right" } },
        hovertemplate: "query %{y} \u2192 key %{x}<br>weight %{z:.3f}<extra>" + label + "</extra>"
      }], {
        title: { text: "head " + label + role, font: { size: 14 } },
        width: size, height: size, margin: { l: 40, r: 10, t: 40, b: 40 },
        xaxis: { title: { text: "key", standoff: 8 }, tickvals: shown, ticktext: shownText, tickfont: { size: 9 },
                 tickangle: -90, automargin: true },
        yaxis: { title: { text: "query", standoff: 8 }, tickvals: shown, ticktext: shownText, tickfont: { size: 9 },
                 autorange: "reversed", automargin: true }
      }, { displayModeBar: false, responsive: false });
    });
    if (!view.firstChild) { view.textContent = "Choose heads above to see their patterns."; }
  }

  data.layers.forEach(function (layer) {
    var row = document.createElement("div");
    row.className = "picker-row";
    data.heads.forEach(function (head) {
      var label = layer + "." + head;
      var button = document.createElement("button");
      button.type = "button";
      button.textContent = label;
      button.title = data.roles[label] || "no role";
      if (data.roles[label]) { button.className = "has-role"; }
      button.setAttribute("aria-pressed", chosen[label] ? "true" : "false");
      button.addEventListener("click", function () {
        chosen[label] = !chosen[label];
        button.setAttribute("aria-pressed", chosen[label] ? "true" : "false");
        draw();
      });
      row.appendChild(button);
    });
    picker.appendChild(row);
  });
  draw();
})();
"""

CARD_JS = r"""
// The atlas's head card: click a head in the role table (or a cell of a heatmap, a point of the map) to show
// its scores with their CIs, the tokens its OV circuit writes and suppresses, its strongest
// compositions in and out, why it attends (its top query x key component pairs at its role's
// targets), and a thumbnail of its pattern on the viewer's sequence.
(function () {
  "use strict";
  var source = document.getElementById("atlas-cards");
  if (!source) { return; }
  var data = JSON.parse(source.textContent);
  var box = document.getElementById("head-card");
  var patterns;  // the viewer's data, read on the first click (it comes later in the page)
  var SKIP = { role: 1, comp_in: 1, comp_in_z: 1, comp_out: 1, comp_out_z: 1 };

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }
  function num(v) {
    if (v === null || v === undefined) { return "-"; }
    var a = Math.abs(v);
    return a !== 0 && (a < 0.001 || a >= 1000) ? v.toPrecision(3) : v.toFixed(3);
  }
  function token(t) {
    var s = JSON.stringify(t);
    return esc(s.length > 18 ? s.slice(0, 17) + "\u2026" : s);
  }
  function scores(s) {
    var rows = [];
    Object.keys(s).forEach(function (k) {
      if (SKIP[k] || /_(lo|hi)$/.test(k) || typeof s[k] !== "number" && s[k] !== null) { return; }
      var ci = (k + "_lo") in s ? "[" + num(s[k + "_lo"]) + ", " + num(s[k + "_hi"]) + "]" : "";
      var base = k in data.baselines ? num(data.baselines[k]) : "";
      rows.push("<tr><th>" + esc(data.names[k] || k) + "</th><td>" + num(s[k]) + "</td><td>" + ci +
                "</td><td>" + base + "</td></tr>");
    });
    return "<table><thead><tr><th>score</th><th>value</th><th>" + esc(data.ci) + " CI</th><th>uniform</th></tr>" +
           "</thead><tbody>" + rows.join("") + "</tbody></table>";
  }
  function tokens(title, list) {
    return "<h4>" + title + "</h4><ol>" + list.map(function (p) {
      return "<li><code>" + token(p[0]) + "</code> " + (p[1] >= 0 ? "+" : "") + num(p[1]) + "</li>";
    }).join("") + "</ol>";
  }
  function compositions(title, list, other) {
    if (!list.length) { return "<h4>" + title + "</h4><p>none (no head in that direction)</p>"; }
    return "<h4>" + title + "</h4><table><thead><tr><th>kind</th><th>" + other + "</th><th>score</th><th>z</th>" +
      "</tr></thead><tbody>" + list.map(function (c) {
        return "<tr><td>" + esc(c.kind) + "</td><td>" + esc(other === "from" ? c.src : c.dst) + "</td><td>" +
               num(c.score) + "</td><td>" + c.z.toFixed(1) + "</td></tr>";
      }).join("") + "</tbody></table>";
  }
  function why(list) {
    // the pairs of each role the head is named for, the role's own contrast beside them
    var roles = [];
    list.forEach(function (r) { if (roles.indexOf(r.role) < 0) { roles.push(r.role); } });
    return "<h4>Why it attends</h4>" + roles.map(function (role) {
      var rows = list.filter(function (r) { return r.role === role; });
      var at = rows[0].at;
      return "<p class='why-role' title='" + esc(data.targets[at] || at) + "'>" + esc(role) + " (at " + esc(at) +
        " targets): contrast " + num(rows[0].total) + "</p>" +
        "<table class='why-pairs'><thead><tr><th>query side</th><th>key side</th><th>contrast</th><th>" +
        esc(data.ci) + " CI</th></tr></thead><tbody>" + rows.map(function (r) {
          return "<tr><td>" + esc(r.query) + "</td><td>" + esc(r.key) + "</td><td>" + num(r.contrast) +
                 "</td><td>[" + num(r.contrast_lo) + ", " + num(r.contrast_hi) + "]</td></tr>";
        }).join("") + "</tbody></table>";
    }).join("");
  }
  function thumbnail(label) {
    if (patterns === undefined) {
      var source = document.getElementById("atlas-patterns");
      patterns = source ? JSON.parse(source.textContent) : null;
    }
    var p = patterns && patterns.patterns[label];
    if (!p) { return null; }
    var n = p.length, cell = Math.max(2, Math.floor(160 / n));
    var canvas = document.createElement("canvas");
    canvas.width = canvas.height = n * cell;
    canvas.className = "card-pattern";
    var ctx = canvas.getContext("2d");
    for (var q = 0; q < n; q++) {
      for (var k = 0; k < n; k++) {
        var v = Math.max(0, Math.min(1, p[q][k]));
        ctx.fillStyle = "rgb(" + Math.round(255 - 244 * v) + "," + Math.round(255 - 145 * v) + "," +
                        Math.round(255 - 176 * v) + ")";
        ctx.fillRect(k * cell, q * cell, cell, cell);
      }
    }
    return canvas;
  }
  function show(label, anchor) {
    var c = data.cards[label];
    if (!c) { return; }
    if (anchor && anchor.nextElementSibling !== box) { anchor.after(box); }  // under what was clicked
    var s = c.scores || {};
    var parts = ["<div class='card-block'><h4>Scores</h4>" + scores(s) + "</div>"];
    if (c.writes) {
      parts.push("<div class='card-block'>" + tokens("OV writes most", c.writes) +
                 tokens("OV suppresses most", c.suppresses) + "</div>");
    }
    if (c.composes_in) {
      parts.push("<div class='card-block'>" + compositions("Strongest compositions in", c.composes_in, "from") +
                 compositions("Strongest compositions out", c.composes_out, "into") + "</div>");
    }
    if (c.why_attends && c.why_attends.length) {
      parts.push("<div class='card-block' id='card-why'>" + why(c.why_attends) + "</div>");
    }
    parts.push("<div class='card-block' id='card-pattern'><h4>Pattern</h4></div>");
    box.innerHTML = "<h3>Head " + esc(label) + (s.role ? " <span class='card-role'>" + esc(s.role) + "</span>" : "") +
      "</h3><div class='card-grid'>" + parts.join("") + "</div>";
    var slot = document.getElementById("card-pattern");
    var canvas = thumbnail(label);
    if (canvas) {
      slot.appendChild(canvas);
      slot.insertAdjacentHTML("beforeend", "<p>on the viewer's sequence (rows: queries, columns: keys)</p>");
    } else {
      slot.insertAdjacentHTML("beforeend", "<p>left out (the patterns part was skipped)</p>");
    }
    box.hidden = false;
    box.dataset.head = label;
    document.querySelectorAll("tr[data-head]").forEach(function (tr) {
      tr.classList.toggle("picked", tr.dataset.head === label);
    });
  }
  // rows of every head table, those later in the page (the task section's) included: one listener
  function row(e) { var tr = e.target.closest && e.target.closest("tr[data-head]"); return tr && box.contains(tr) ? null : tr; }
  document.addEventListener("click", function (e) {
    var tr = row(e);
    if (tr) { show(tr.dataset.head, tr.closest(".table-wrap")); }
  });
  document.addEventListener("keydown", function (e) {
    var tr = e.key === "Enter" && row(e);
    if (tr) { show(tr.dataset.head, tr.closest(".table-wrap")); }
  });
  // the figures whose points are heads: a heatmap cell is (layer, head) = (y, x); a point of the map
  // of heads carries its label as customdata
  window.addEventListener("load", function () {
    ["atlas-heatmaps", "atlas-task", "atlas-headmap"].forEach(function (id) {
      var fig = document.getElementById(id);
      if (!fig || !fig.on) { return; }
      fig.on("plotly_click", function (e) {
        var p = e.points && e.points[0];
        if (!p) { return; }
        var label = typeof p.customdata === "string" && /^\d+\.\d+$/.test(p.customdata) ? p.customdata :
                    Math.round(p.y) + "." + Math.round(p.x);
        show(label, fig);
        box.scrollIntoView({ block: "nearest" });
      });
    });
  });
})();
"""
