"""Every HTML page the CLIs and the atlas write, opened in a real headless Chromium: no console error,
every plotly figure drawn, a screenshot that is not blank; PNG export through the browser. At 1280 and
1920 pixels no page scrolls sideways and no two text boxes overlap (read from the page's layout);
the atlas's task section and map of heads open head cards; the pattern viewer on GPT-2 small's shape (12 x 12 heads) lays its thumbnails out layer by head and
keeps the enlarged pattern and its tokens in view beside them.

Skips, saying why, only where no Chrome/Chromium can be had (``.ci/run`` installs Debian's chromium).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from interp.browser import find_browser, screenshot_png
from tests.helpers import gpt2_model, one_thread

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="no Chrome or Chromium (Debian: apt-get install chromium, or set BROWSER_PATH)"
)
RUNS = {  # out folder -> (command module, argv)
    "induction": ("interp.cli.induction", []),
    "sinks": ("interp.cli.sinks", []),
    "ablate": ("interp.cli.ablate", ["--method", "exact"]),
    "prune": ("interp.cli.ablate", ["--method", "prune", "--random-seeds", "1"]),
    "gates": ("interp.cli.ablate", ["--method", "gates", "--lambdas", "0.01,0.1", "--gate-steps", "20"]),
    "report": ("interp.cli.report", []),
    "report-task": ("interp.cli.report", ["--task", "repeat", "--skip", "pruning"]),
    "qk": ("interp.cli.qk", ["--head", "1.0"]),
}


@pytest.fixture(scope="session")
def chromium():
    pytest.importorskip("websocket", reason="websocket-client (the dev extra) drives the browser")
    pytest.importorskip("PIL", reason="pillow (the dev extra) reads the screenshots")
    from tests.browser import Chromium

    browser = Chromium(BROWSER)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    import importlib

    root = tmp_path_factory.mktemp("pages")
    with one_thread():
        for name, (module, argv) in RUNS.items():
            code = importlib.import_module(module).cli([*argv, "--out", str(root / name), "--no-progress"])
            assert code == 0, name
    return root


def _blank_or_broken(visit) -> list[str]:
    from tests.browser import ink

    share, colours = ink(visit.png)
    problems = list(visit.errors)
    if not visit.drawn:
        problems.append("plotly never drew every figure")
    if share < 0.005 or colours < 20:  # a blank page: 0% and one colour
        problems.append(f"screenshot looks blank: {share:.1%} non-background pixels, {colours} colours")
    return problems


@pytest.mark.parametrize("name", list(RUNS))
def test_every_page_opens_clean_in_chromium(chromium, outputs, name):
    pages = sorted((outputs / name).glob("*.html"))
    assert pages, f"{name} wrote no HTML"
    for page in pages:
        problems = _blank_or_broken(chromium.visit(page.as_uri()))
        assert not problems, f"{page.name}: {problems}"


def test_atlas_viewer_shows_the_role_heads_and_toggles(chromium, outputs):
    page = (outputs / "report" / "atlas.html").as_uri()
    count = "Array.from(document.querySelectorAll('#pattern-view .pattern')).filter(d => d._fullLayout).length"
    later = "new Promise(done => setTimeout(() => done(" + count + "), 300))"
    click = "document.querySelector('#head-picker button[aria-pressed=false]').click()"
    visit = chromium.visit(page, script=f"const before = {count}; {click}; {later}.then(after => [before, after])")
    assert not visit.errors
    # the strongest head of each role is drawn at once (toy: 1.2, 0.1, 0.3 current-token, 1.0); a click adds one more
    assert visit.value == [4, 5]


def test_the_checks_catch_errors_and_blank_pages(chromium, tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><script>console.error('boom'); missing_function();</script></body></html>")
    visit = chromium.visit(broken.as_uri(), draw_timeout=1)
    assert any("boom" in e for e in visit.errors) and any("missing_function" in e for e in visit.errors)
    blank = tmp_path / "blank.html"
    blank.write_text("<html><body><div class='plotly-graph-div'></div></body></html>")
    problems = _blank_or_broken(chromium.visit(blank.as_uri(), draw_timeout=1))
    assert any("blank" in p for p in problems) and any("never drew" in p for p in problems)


def test_png_export_through_the_browser(tmp_path):
    import numpy as np
    from PIL import Image

    from interp.plots import heatmap
    from interp.scores import HeadScores

    fig = heatmap(HeadScores.from_grids({"induction": np.eye(4)}), ["induction"], title="png")
    png = screenshot_png(fig, BROWSER)
    img = Image.open(__import__("io").BytesIO(png))
    assert img.size == (fig.layout.width, fig.layout.height)
    assert len(img.convert("RGB").getcolors(1 << 24)) > 20


def test_save_figure_writes_a_png(tmp_path, monkeypatch):
    import numpy as np

    from interp.plots import heatmap, save_figure
    from interp.scores import HeadScores

    monkeypatch.setenv("INTERP_PNG", "1")
    fig = heatmap(HeadScores.from_grids({"induction": np.eye(3)}), ["induction"])
    written = save_figure(fig, tmp_path, "fig")
    assert [p.name for p in written] == ["fig.html", "fig.png"] and written[1].stat().st_size > 1000


def test_without_a_browser_save_figure_says_why_in_one_line(tmp_path):
    code = (
        "import numpy as np; from interp.plots import heatmap, save_figure; from interp.scores import HeadScores;"
        "f = heatmap(HeadScores.from_grids({'induction': np.eye(3)}), ['induction']);"
        f"print([p.name for p in save_figure(f, {str(tmp_path)!r}, 'fig')])"
    )
    env = {**os.environ, "INTERP_PNG": "1", "BROWSER_PATH": str(tmp_path / "no-such-browser")}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "['fig.html']" in run.stdout, run.stderr
    assert [l for l in run.stderr.splitlines() if "PNG" in l] == [
        "PNG export skipped: no Chrome or Chromium found: install one (Debian: apt-get install chromium) "
        "or set BROWSER_PATH"
    ]


TEXT = "She said \u201cthe cat sat on the mat\u201d \U0001f600 and the cat sat on the mat again, twice over."
WIDTHS = (1280, 1920)


@pytest.fixture(scope="module")
def pattern_pages(tmp_path_factory):
    """``interp patterns`` on the toy and on a random-weight GPT-2 of GPT-2 small's shape (12 layers x
    12 heads, width 48) whose byte-level BPE splits the curly quotes and the emoji into single bytes."""
    from interp.cli import main
    from tests.test_text_probe import byte_bpe

    root = tmp_path_factory.mktemp("patterns")
    gpt2_model(n_layer=12, n_head=12, n_embd=48, vocab=300).save_pretrained(root / "gpt2-12x12")
    byte_bpe(300).save_pretrained(root / "gpt2-12x12")
    with one_thread():
        for name, model in (("toy", "toy"), ("gpt2", str(root / "gpt2-12x12"))):
            code = main(["patterns", "--model", model, "--text", TEXT, "--out", str(root / name), "--no-progress"])
            assert code == 0, name
    return {name: root / name / "patterns.html" for name in ("toy", "gpt2")}


def _layout(chromium, page, width: int, steps=()):
    from tests.browser import LAYOUT

    visit = chromium.visit(page.as_uri(), width=width, height=900, steps=[*steps, ("eval", "layout", LAYOUT)])
    assert not visit.errors and visit.drawn, (page.name, visit.errors)
    return visit


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_scrolls_sideways_or_overlaps_its_text(chromium, outputs, pattern_pages, width):
    from tests.browser import layout_problems

    pages = [*sorted(outputs.glob("*/*.html")), *pattern_pages.values()]
    assert {p.name for p in pages} >= {"induction.html", "atlas.html", "patterns.html"}
    found = {}
    for page in pages:
        problems = layout_problems(_layout(chromium, page, width).values["layout"])
        if problems:
            found[f"{page.parent.name}/{page.name}"] = problems
    assert not found, f"at {width} px: {found}"


def test_the_qk_figure_of_a_late_head_of_144_fits_1280_px(chromium, pattern_pages, tmp_path):
    """Head 11.3 of a 12 x 12 model reads 155 upstream components: the heatmap's cells narrow to fit
    the window (the names thinned by plotly, each in the hover) and its margins' labels stay apart."""
    from interp.cli import main
    from tests.browser import layout_problems

    model = pattern_pages["gpt2"].parent.parent / "gpt2-12x12"
    argv = ["qk", "--model", str(model), "--head", "11.3", "--batch", "2", "--out", str(tmp_path), "--no-progress"]
    with one_thread():
        assert main(argv) == 0
    visit = _layout(chromium, tmp_path / "qk_attribution_11.3.html", 1280)
    assert layout_problems(visit.values["layout"]) == []


def test_the_layout_checks_catch_sideways_scroll_and_overlaps(chromium, tmp_path):
    from tests.browser import layout_problems

    page = tmp_path / "bad.html"
    page.write_text(
        "<html><body data-ready='1'><div style='overflow:auto;width:300px'><table><tr>"
        + "<td style='white-space:nowrap'>gradient importance 0.104 [0.1, 0.11]</td>" * 3
        + "</tr></table></div><div style='width:1500px'>wide</div>"
        "<p style='margin:0'>one line</p><p style='margin:-10px 0 0'>the next on top of it</p>"
        "<svg width='300' height='80'><text x='10' y='30'>head</text><text x='10' y='46'>induction</text></svg>"
        "</body></html>"
    )
    problems = layout_problems(_layout(chromium, page, 1280).values["layout"])
    assert problems[0] == "the page scrolls sideways: 1508 px wide in a 1280 px window"
    assert problems[1].startswith("div on the first screen scrolls sideways:")
    assert problems[2].startswith("2 overlapping text boxes") and "'one line', 'the next on top of it'" in problems[2]
    assert "('head', 'induction')" in problems[2]  # an axis title touching the next panel's title


GRID = """(() => { const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const thumbs = {}; document.querySelectorAll('.thumb').forEach(t => { thumbs[t.dataset.head] = box(t); });
  return {thumbs, big: box(document.getElementById('big-canvas')), strip: box(document.getElementById('attends-to')),
          height: innerHeight, text: document.body.innerText,
          xlabels: Array.from(document.querySelectorAll('#xlabels .axis-label')).map(e => [+e.dataset.pos, e.textContent]),
          ylabels: Array.from(document.querySelectorAll('#ylabels .axis-label')).map(e => [+e.dataset.pos, e.textContent]),
          scale: document.getElementById('big-canvas').width / document.querySelectorAll('#ylabels div').length}; })()"""


@pytest.mark.parametrize("width", WIDTHS)
def test_the_viewer_on_gpt2_small_shape_is_a_layer_by_head_grid_beside_its_pattern(chromium, pattern_pages, width):
    import json

    data = json.loads(pattern_pages["gpt2"].read_text().split('id="pattern-data">')[1].split("</script>")[0])
    tokens = data["texts"][0]["tokens"]
    scroll = "(() => { document.querySelector('.thumb[data-head=\"11.11\"]').scrollIntoView(); return scrollY; })()"
    visit = _layout(chromium, pattern_pages["gpt2"], width, [("eval", "top", GRID), ("eval", "y", scroll)])
    visit.values["bottom"] = chromium.visit(
        pattern_pages["gpt2"].as_uri(), width=width, height=900, steps=[("eval", "y", scroll), ("eval", "g", GRID)]
    ).values["g"]
    top = visit.values["top"]
    thumbs = top["thumbs"]
    assert len(thumbs) == 144
    rows = [sorted({round(thumbs[f"{l}.{h}"][1]) for h in range(12)}) for l in range(12)]
    cols = [sorted({round(thumbs[f"{l}.{h}"][0]) for l in range(12)}) for h in range(12)]
    assert all(len(r) == 1 for r in rows) and all(len(c) == 1 for c in cols)  # a row per layer, a column per head
    assert [r[0] for r in rows] == sorted(r[0] for r in rows) and len({r[0] for r in rows}) == 12
    assert [c[0] for c in cols] == sorted(c[0] for c in cols) and len({c[0] for c in cols}) == 12
    big = top["big"]
    assert big[0] >= max(t[2] for t in thumbs.values())  # beside the grid, not under it
    assert big[1] - thumbs["0.0"][1] < 60 and big[3] <= top["height"]  # level with the first row, on the first screen
    bottom = visit.values["bottom"]
    assert (
        bottom["thumbs"]["11.11"][3] <= bottom["height"]
        and bottom["big"][1] >= 0
        and bottom["big"][3] <= bottom["height"]
    )
    assert bottom["strip"][1] < bottom["height"]  # the last row, the pattern and the token strip in one view
    # token labels on both axes, thinned so that each has 12 px or more
    step = top["xlabels"][1][0] - top["xlabels"][0][0]
    assert step * top["scale"] >= 12 and (step - 1) * top["scale"] < 12
    assert (
        top["xlabels"]
        == top["ylabels"]
        == [
            [i, f"{i} {tokens[i] if len(tokens[i]) <= 12 else tokens[i][:11] + chr(0x2026)}"]
            for i in range(0, len(tokens), step)
        ]
    )
    assert "\ufffd" not in top["text"] and "\\xe2" in top["text"] and "\\xf0" in top["text"]


HEAD_CARD = """new Promise(done => setTimeout(() => { const c = document.getElementById('head-card');
  done({hidden: c.hidden, head: c.dataset.head, text: c.innerText,
        thumb: !!c.querySelector('canvas.card-pattern')}); }, 100))"""


@pytest.mark.parametrize("width", WIDTHS)
def test_clicking_a_head_of_the_atlas_shows_its_card(chromium, outputs, width):
    import pandas as pd

    from tests.browser import LAYOUT, layout_problems

    page = outputs / "report" / "atlas.html"
    roles = pd.read_csv(outputs / "report" / "atlas_roles.csv").set_index(["layer", "head"])
    row = "tr[data-head='1.2']"
    steps = [
        ("eval", "before", HEAD_CARD),
        ("eval", "scrolled", f'document.querySelector("{row}").scrollIntoView({{block: "center"}})'),
        ("click", row),
        ("eval", "card", HEAD_CARD),
        ("eval", "layout", LAYOUT),
    ]
    visit = chromium.visit(page.as_uri(), width=width, height=900, steps=steps)
    assert not visit.errors
    assert visit.values["before"]["hidden"] is True
    card = visit.values["card"]
    assert card["hidden"] is False and card["head"] == "1.2" and card["thumb"]
    lines = card["text"].splitlines()
    assert lines[0] == "Head 1.2 induction, sink"
    induction = roles.loc[(1, 2)]
    want = (
        f"induction\t{induction['induction']:.3f}\t[{induction['induction_lo']:.3f}, {induction['induction_hi']:.3f}]"
    )
    assert any(line.startswith(want) for line in lines), lines
    # the strongest composition in: K-composition from the previous-token head 0.1
    first_in = lines[lines.index("Strongest compositions in") + 2]
    assert first_in.split("\t")[:2] == ["K", "0.1"] and roles.loc[(1, 2), "comp_in"] == "0.1 (K)"
    assert "OV writes most" in lines and "OV suppresses most" in lines
    assert not layout_problems(visit.values["layout"]), layout_problems(visit.values["layout"])


# the window pixel of the first heatmap panel's cell (layer 0, head 1), read from plotly's own axes
CELL = """(() => { const gd = document.getElementById('atlas-heatmaps'), L = gd._fullLayout, r = gd.getBoundingClientRect();
  return [r.left + L.xaxis._offset + L.xaxis.d2p(1), r.top + L.yaxis._offset + L.yaxis.d2p(0)]; })()"""


def test_clicking_a_heatmap_cell_shows_that_heads_card(chromium, outputs):
    page = (outputs / "report" / "atlas.html").as_uri()
    scroll = "document.getElementById('atlas-heatmaps').scrollIntoView({block: 'start'})"
    steps = [("eval", "s", scroll), ("click_at", CELL), ("eval", "card", HEAD_CARD)]
    visit = chromium.visit(page, height=900, steps=steps)
    assert not visit.errors
    card = visit.values["card"]
    assert card["head"] == "0.1" and card["text"].startswith("Head 0.1 previous-token")


# ---- the atlas's task section and map of heads ------------------------------------------------------

# the window pixel of a point: the task figure's cell (layer 1, head 2), the map's point of head 0.1
TASK_CELL = """(() => { const gd = document.getElementById('atlas-task'), L = gd._fullLayout, r = gd.getBoundingClientRect();
  return [r.left + L.xaxis._offset + L.xaxis.d2p(2), r.top + L.yaxis._offset + L.yaxis.d2p(1)]; })()"""
MAP_POINT = """(() => { const gd = document.getElementById('atlas-headmap'), L = gd._fullLayout, r = gd.getBoundingClientRect();
  const t = gd._fullData[0], i = Array.from(t.customdata).indexOf('0.1');
  return [r.left + L.xaxis._offset + L.xaxis.d2p(t.x[i]), r.top + L.yaxis._offset + L.yaxis.d2p(t.y[i])]; })()"""


@pytest.mark.parametrize("width", WIDTHS)
def test_the_task_section_shows_patching_and_attribution_and_the_card_has_them(chromium, outputs, width):
    import pandas as pd

    from tests.browser import LAYOUT, layout_problems

    page = outputs / "report-task" / "atlas.html"
    roles = pd.read_csv(outputs / "report-task" / "atlas_roles.csv").set_index(["layer", "head"])
    row = "#task tr[data-head='1.2']"
    section = """(() => { const s = document.getElementById('task'), r = s.getBoundingClientRect();
      return {text: s.innerText, right: r.right, figure: document.getElementById('atlas-task').getBoundingClientRect().right,
              wide: document.documentElement.scrollWidth}; })()"""
    steps = [
        ("eval", "section", section),
        ("eval", "scrolled", f'document.querySelector("{row}").scrollIntoView({{block: "center"}})'),
        ("click", row),
        ("eval", "card", HEAD_CARD),
        ("eval", "layout", LAYOUT),
    ]
    visit = chromium.visit(page.as_uri(), width=width, height=900, steps=steps)
    assert not visit.errors and visit.drawn
    s = visit.values["section"]
    assert s["text"].startswith("Which heads matter for the task: repeat") and "largest patching effect" in s["text"]
    assert s["figure"] <= width and s["wide"] <= width  # the heatmaps fit: nothing scrolls sideways
    card = visit.values["card"]
    assert card["hidden"] is False and card["head"] == "1.2"
    lines = card["text"].splitlines()
    r = roles.loc[(1, 2)]
    for name, col in (("patching effect", "patch_effect"), ("direct logit attribution", "dla")):
        want = f"{name}\t{r[col]:.3f}\t[{r[col + '_lo']:.3f}, {r[col + '_hi']:.3f}]"
        assert any(line.startswith(want) for line in lines), (want, lines)
    assert r["patch_effect_lo"] > 0.1  # a number well clear of 0, not a placeholder
    assert not layout_problems(visit.values["layout"]), layout_problems(visit.values["layout"])


@pytest.mark.parametrize("figure, point, head", [("atlas-task", TASK_CELL, "1.2"), ("atlas-headmap", MAP_POINT, "0.1")])
def test_clicking_the_task_heatmap_or_the_head_map_opens_that_heads_card(chromium, outputs, figure, point, head):
    page = (outputs / "report-task" / "atlas.html").as_uri()
    scroll = f"document.getElementById('{figure}').scrollIntoView({{block: 'center'}})"
    steps = [("eval", "s", scroll), ("click_at", point), ("eval", "card", HEAD_CARD)]
    visit = chromium.visit(page, height=900, steps=steps)
    assert not visit.errors
    card = visit.values["card"]
    assert card["hidden"] is False and card["head"] == head and card["text"].startswith(f"Head {head} ")


TICKS = """(() => { const out = {};
  document.querySelectorAll('.plotly-graph-div').forEach(gd => {
    const axes = {};
    gd._fullLayout._subplots.cartesian.forEach(id => {
      const [, x, y] = id.match(/^(x\\d*)(y\\d*)$/);
      for (const [name, letter] of [[x, 'x'], [y, 'y']]) {
        const texts = gd.querySelectorAll(`.subplot.${id} .${letter}axislayer-above .${name}tick text`);
        const at = t => { const r = t.getBoundingClientRect(); return letter === 'x' ? r.left + r.right : r.top + r.bottom; };
        // in the order they stand on the page: left to right, top to bottom
        axes[name.replace(/^(.)/, '$1axis')] = Array.from(texts).sort((a, b) => at(a) - at(b)).map(t => t.textContent);
      }
    });
    out[gd.id] = axes;
  });
  return out; })()"""


def test_the_ticks_plotly_draws_on_every_head_axis_are_the_head_labels(chromium, tmp_path):
    """Every figure with an axis of head labels, written as the commands write it (save_figure: the
    toolkit's template, plotly.js inlined) and drawn in Chromium, on a model of 12 heads a layer: the
    tick labels read back from the page are the heads themselves, "0.1" and "0.10" two of them (a
    linear axis parses both as 0.1 and ticks 0, 0.2, ...); the layer x head grid ticks whole heads."""
    from interp.plots import heatmap, save_figure
    from interp.scores import HeadScores
    from tests.test_head_axes import H, head_figures

    figures = head_figures()
    figures["composition"][0].update_layout(width=2400, height=900)  # room for every one of its 24 ticks
    grid = heatmap(HeadScores.from_grids({"induction": np.zeros((2, H))}), ["induction"])
    figures["grid"] = (grid, {"xaxis": [str(h) for h in range(H)], "yaxis": ["0", "1"]})
    for name, (fig, axes) in figures.items():
        (page,) = save_figure(fig, tmp_path, name, png=False)
        visit = chromium.visit(page.as_uri(), width=2600, script=TICKS)
        assert not visit.errors and visit.drawn, name
        (drawn,) = visit.value.values()
        for axis, labels in axes.items():
            assert drawn[axis] == list(labels), f"{name} {axis}: plotly drew {drawn[axis]}"


WHY_ATTENDS = """new Promise(done => setTimeout(() => { const c = document.getElementById('card-why');
  done(c && {text: c.innerText, roles: Array.from(c.querySelectorAll('p.why-role')).map(p => p.innerText),
        rows: Array.from(c.querySelectorAll('table.why-pairs')).map(t =>
          Array.from(t.tBodies[0].rows).map(r => Array.from(r.cells).map(x => x.innerText)))}); }, 100))"""


def test_the_head_card_shows_why_it_attends(chromium, tmp_path):
    """Clicking induction head 1.2 of the toy's atlas shows its top (query, key) pairs at its
    induction targets with their CIs, as the card's data holds them; a head named for no such role
    has no such section."""
    from interp.config import RunConfig
    from interp.models import load_model
    from interp.report import head_atlas

    skip = ["sinks", "exact", "gradient", "pruning", "patterns", "composition", "ov", "encoder", "headmap"]
    with one_thread():
        atlas = head_atlas(load_model("toy"), skip=skip, config=RunConfig(seed=0, n_boot=200))
    atlas.save(tmp_path)
    steps = [("click", "tr[data-head='1.2']"), ("eval", "why", WHY_ATTENDS)]
    steps += [("click", "tr[data-head='0.0']"), ("eval", "none", WHY_ATTENDS)]
    visit = chromium.visit((tmp_path / "atlas.html").as_uri(), width=1280, height=900, steps=steps)
    assert not visit.errors
    why, want = visit.values["why"], atlas.cards["1.2"]["why_attends"]
    assert why["text"].startswith("Why it attends")
    assert why["roles"] == [f"induction (at induction targets): contrast {want[0]['total']:.3f}"]
    assert why["rows"] == [
        [
            [r["query"], r["key"], f"{r['contrast']:.3f}", f"[{r['contrast_lo']:.3f}, {r['contrast_hi']:.3f}]"]
            for r in want
        ]
    ]
    assert why["rows"][0][0][:2] == ["0.3", "0.1"]  # the toy's mechanism on top (see the README)
    assert visit.values["none"] is None
