"""``interp.view_patterns`` and ``interp patterns``: every head's attention on your own text, one page.

The browser tests open the page in a real headless Chromium, click a head, hover a token through the
real input pipeline, and check what lights up against the model's own attention patterns.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import interp
from interp.browser import find_browser
from interp.errors import OutputError, UsageError
from interp.report.patterns import attention_patterns
from interp.report.patterns_view import MASKED, _encode, _windows, view_patterns
from tests.helpers import one_thread

TEXT = "the cat sat on the mat. the cat sat on the mat. a dog ran!!"  # 59 bytes: BOS + 59 = 60 tokens
BROWSER = find_browser()
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no Chrome or Chromium (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def toy():
    with one_thread():
        yield interp.load_model("toy")


def test_the_page_holds_every_head_on_a_60_token_text(toy):
    page = view_patterns(toy, TEXT)
    assert len(page.texts[0]["tokens"]) == 60 and page.texts[0]["tokens"][0] == "<bos>"
    assert page.heads == [f"{l}.{h}" for l in range(2) for h in range(4)]
    ids = interp.TokenProbe.from_texts(toy, TEXT).tokens[0]
    want = attention_patterns(toy, ids).numpy().reshape(8, 60, 60)
    np.testing.assert_allclose(page.texts[0]["patterns"], want, atol=1e-6)
    assert page.summary() == (
        "toy: attention patterns of 8 heads on 1 text of 60 tokens; 1 window(s) of up to 64 positions"
    )
    assert "<script src" not in page.html and "http" not in page.html.split("<script>")[1]  # nothing fetched


def test_heads_are_chosen_by_label_or_pair_and_refused_with_a_clear_message(toy):
    assert view_patterns(toy, "abcdef", heads=["1.2", "L0H3", (0, 1)]).heads == ["1.2", "0.3", "0.1"]
    with pytest.raises(UsageError) as e:
        view_patterns(toy, "abcdef", heads=["2.0"])
    assert str(e.value) == "no head 2.0 in this model: it has 2 layers x 4 heads (up to 1.3)"
    with pytest.raises(UsageError) as e:
        view_patterns(toy, "abcdef", heads=["head one"])
    assert str(e.value) == "cannot read head 'head one': write heads as LAYER.HEAD (e.g. 1.2) or L1H2"
    with pytest.raises(UsageError) as e:
        view_patterns(toy, "abcdef", heads=[])
    assert str(e.value) == "heads is empty: pass None for every head, or a list such as ['0.1', '1.2']"
    with pytest.raises(UsageError) as e:
        view_patterns(toy, ["fine", "  "])
    assert str(e.value) == "texts must be a non-empty string or a non-empty list of non-empty strings"
    with pytest.raises(UsageError) as e:
        view_patterns(toy, "abcdef", window=2)
    assert str(e.value) == "window must be an integer >= 4 (positions shown at once), got 2"


def test_saving_refuses_to_replace_a_page_unless_asked(toy, tmp_path):
    page = view_patterns(toy, "abcdef", heads=["0.0"])
    path = page.save(tmp_path)
    with pytest.raises(OutputError) as e:
        page.save(tmp_path)
    assert str(e.value) == (
        f"{path} already holds a saved result: pass overwrite=True to replace it, or save under another stem= or folder"
    )
    assert page.save(tmp_path, overwrite=True) == path


def test_long_texts_are_windowed_with_half_overlap_and_masked_cells_are_marked():
    assert _windows(60, 64) == [0]
    assert _windows(150, 64) == [0, 32, 64, 86]
    w = np.full((1, 3, 3), 1 / 3, dtype=np.float32)
    raw = np.frombuffer(__import__("base64").b64decode(_encode(w, causal=True)), np.uint8).reshape(3, 3)
    assert raw[0, 1] == raw[0, 2] == raw[1, 2] == MASKED and raw[2, 0] == round(254 / 3)
    raw = np.frombuffer(__import__("base64").b64decode(_encode(w, causal=False)), np.uint8).reshape(3, 3)
    assert (raw != MASKED).all()


def test_the_cli_prints_a_summary_and_the_path(tmp_path, capsys):
    from interp.cli import main

    with one_thread():
        code = main(["patterns", "--text", TEXT, "--heads", "0.1,1.2", "--out", str(tmp_path), "--top", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("threads: 1 (")  # every command says first how many threads it uses
    assert out.splitlines()[1].startswith("toy: attention patterns of 2 heads on 1 text of 60 tokens; 1 window(s)")
    assert f"wrote:\n  {tmp_path / 'patterns.html'}\n" in out
    with one_thread():
        code = main(["patterns", "--text", TEXT, "--heads", "0.1", "--out", str(tmp_path)])
    assert code == 0 and f"  {tmp_path / 'patterns.html'} (replaced)" in capsys.readouterr().out


def test_the_cli_refuses_no_text(tmp_path, capsys):
    from interp.cli import main

    with pytest.raises(SystemExit) as e:
        main(["patterns", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith("error: no text given: pass --text 'some text' or --text-file FILE")


@pytest.fixture(scope="module")
def chromium():
    pytest.importorskip("websocket", reason="websocket-client (the dev extra) drives the browser")
    pytest.importorskip("PIL", reason="pillow (the dev extra) reads the screenshots")
    from tests.browser import Chromium

    browser = Chromium(BROWSER)
    yield browser
    browser.close()


WEIGHTS = "Array.from(document.querySelectorAll('#%s .tok')).map(s => s.dataset.weight)"
PIXEL = (
    "(() => { const c = document.getElementById('big-canvas'); const n = %d; const s = c.width / n;"
    " return Array.from(c.getContext('2d').getImageData(Math.floor((%d + 0.5) * s), Math.floor((%d + 0.5) * s), 1, 1)"
    ".data).slice(0, 3); })()"
)


@needs_browser
def test_click_a_head_and_hover_a_token_in_chromium(toy, chromium, tmp_path):
    from tests.browser import ink

    page = view_patterns(toy, TEXT)
    path = page.save(tmp_path / "page")
    q = 40
    visit = chromium.visit(
        path.as_uri(),
        width=1300,
        height=1000,
        steps=[
            ("shot", "thumbnails"),
            ("click", '.thumb[data-head="1.2"]'),
            ("hover", f'#attends-to .tok[data-pos="{q}"]'),
            ("eval", "title", "document.getElementById('big-title').textContent"),
            ("eval", "to", WEIGHTS % "attends-to"),
            ("eval", "by", WEIGHTS % "attended-by"),
            ("eval", "masked", PIXEL % (60, 5, 0)),  # (x = key 5, y = query 0): query 0 cannot see key 5
            ("eval", "seen", PIXEL % (60, 0, 5)),
            ("shot", "hovered"),
        ],
    )
    assert not visit.errors, visit.errors
    for name, png in visit.shots.items():
        (tmp_path / f"patterns_{name}.png").write_bytes(png)
    assert visit.values["title"] == "head 1.2"
    want = page.texts[0]["patterns"][page.heads.index("1.2")]
    to = visit.values["to"]
    assert to[q + 1 :] == ["masked"] * (59 - q)  # a query does not see later tokens
    np.testing.assert_allclose([float(v) for v in to[: q + 1]], want[q, : q + 1], atol=0.5 / 254 + 5e-4)
    by = visit.values["by"]
    assert by[:q] == ["masked"] * q
    np.testing.assert_allclose([float(v) for v in by[q:]], want[q:, q], atol=0.5 / 254 + 5e-4)
    assert visit.values["masked"] == [205, 210, 216] and visit.values["seen"] != [205, 210, 216]
    assert ink(visit.shots["thumbnails"])[0] > 0.05 and visit.shots["hovered"] != visit.shots["thumbnails"]


@needs_browser
def test_a_moved_figure_renders_alone(chromium, tmp_path):
    from interp.plots import heatmap, save_figure
    from interp.scores import HeadScores
    from tests.test_browser import _blank_or_broken

    fig = heatmap(HeadScores.from_grids({"induction": np.eye(4)}), ["induction"], title="moved")
    (html,) = save_figure(fig, tmp_path / "made", "induction", png=False)
    moved = tmp_path / "elsewhere" / "copy.html"
    moved.parent.mkdir()
    shutil.move(html, moved)
    assert sorted(p.name for p in (tmp_path / "made").iterdir()) == []  # nothing left beside it to load
    assert not _blank_or_broken(chromium.visit(moved.as_uri()))


# ---- what one page holds: caps, what was left out, long lists summarised ----------------------------


def test_a_page_holds_at_most_max_texts_windows_and_heads_and_says_what_it_left_out(toy):
    texts = [TEXT] * 2 + ["ab " * 50] + [f"text {i}" for i in range(20_000)]
    with one_thread():
        page = view_patterns(toy, texts, max_texts=3, max_windows=2, max_heads=5, window=16)
    assert len(page.texts) == 3 and page.heads == ["0.0", "0.1", "0.2", "0.3", "1.0"]
    # windows of 16 at a half-overlap: 2 windows cover 24 positions, and a longer text is cut there
    assert [len(t["tokens"]) for t in page.texts] == [24, 24, 24]
    assert page.texts[0]["patterns"].shape == (5, 24, 24)
    want = attention_patterns(toy, interp.TokenProbe.from_texts(toy, TEXT).tokens[0]).numpy()
    np.testing.assert_allclose(page.texts[0]["patterns"], want.reshape(8, 60, 60)[:5, :24, :24], atol=1e-6)
    assert page.summary() == (
        "toy: attention patterns of 5 heads on 3 texts of 24, 24 and 24 tokens; 6 window(s) of up to 16 "
        "positions; left out: 20,000 more text(s): raise max_texts= (command line: --max-texts); the tail of 3 "
        "long text(s): raise max_windows= (command line: --max-windows); 3 more head(s): raise max_heads= or "
        "choose them with heads= (command line: --max-heads, --heads)"
    )
    assert page.summary() in page.html


def test_long_lists_of_lengths_are_summarised():
    from interp.report.patterns_view import count_lengths

    assert count_lengths([12, 55] + [30] * 19_998, "text") == "20,000 texts of 12-55 tokens"
    assert count_lengths([3, 4, 5], "text") == "3 texts of 3, 4 and 5 tokens"
    assert count_lengths([1_500], "text") == "1 text of 1,500 tokens"


@pytest.mark.parametrize("name", ["max_texts", "max_windows", "max_heads"])
def test_caps_must_be_positive(toy, name):
    with pytest.raises(UsageError) as e:
        view_patterns(toy, "abc", **{name: 0})
    assert str(e.value) == f"{name} must be an integer >= 1, got 0"


def test_the_cli_caps_a_file_of_many_paragraphs_in_one_short_line(tmp_path, capsys):
    from interp.cli import main

    paragraphs = "\n\n".join(f"paragraph {i}: " + "w " * (i % 20) for i in range(2_000))
    (tmp_path / "many.txt").write_text(paragraphs)
    with one_thread():
        code = main(["patterns", "--text-file", str(tmp_path / "many.txt"), "--out", str(tmp_path / "o")])
    assert code == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line == (
        "toy: attention patterns of 8 heads on 10 texts of 13-31 tokens; 10 window(s) of up to 64 positions; "
        "left out: 1,990 more text(s): raise max_texts= (command line: --max-texts)"
    )
    with one_thread():
        code = main(
            ["patterns", "--text-file", str(tmp_path / "many.txt"), "--max-texts", "12", "--out", str(tmp_path / "o")]
        )
    assert code == 0 and "on 12 texts of 13-36 tokens" in capsys.readouterr().out


LATIN1 = "Café au lait.\n\nNaïve résumé."


def test_a_latin1_text_file_is_one_line_and_reads_with_encoding(tmp_path, capsys):
    from interp.cli import main

    path = tmp_path / "latin1.txt"
    path.write_bytes(LATIN1.encode("latin-1"))
    with pytest.raises(SystemExit) as e:
        main(["patterns", "--text-file", str(path), "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"interp patterns: error: {path} is not utf-8 text: byte(s) e9 at offset 3 (line 1) cannot be decoded; "
        "pass the file's encoding with --encoding, e.g. latin-1 or cp1252, or save the file as UTF-8"
    )
    assert "Traceback" not in err and not (tmp_path / "o" / "patterns.html").exists()
    with one_thread():
        code = main(["patterns", "--text-file", str(path), "--encoding", "latin-1", "--out", str(tmp_path / "o")])
    assert code == 0
    # the toy reads text as UTF-8 bytes: "é" decoded from latin-1 is two bytes, so 13 characters + 1 -> 14 tokens + BOS
    assert "on 2 texts of 15 and 17 tokens" in capsys.readouterr().out


def test_an_unknown_encoding_is_refused_by_the_parser(tmp_path, capsys):
    from interp.cli import main

    with pytest.raises(SystemExit) as e:
        main(["patterns", "--text", "a", "--encoding", "latin-9x", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "interp patterns: error: argument --encoding: unknown text encoding 'latin-9x': give one Python knows, "
        "e.g. utf-8, latin-1, cp1252, utf-16"
    )
