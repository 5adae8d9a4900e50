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
