"""Every HTML page the CLIs and the atlas write, opened in a real headless Chromium: no console error,
every plotly figure drawn, a screenshot that is not blank; PNG export through the browser.

Skips, saying why, only where no Chrome/Chromium can be had (``.ci/run`` installs Debian's chromium).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from interp.browser import find_browser, screenshot_png
from tests.helpers import one_thread

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
