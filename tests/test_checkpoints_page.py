"""The page over revisions (``checkpoints_atlas.html``) and the retrieval score per revision (issue 24):
hand-set toy checkpoints where the induction role moves from head 1.0 to 1.2, one revision a
duplicate; the page's data against the sweep's own grids, and in headless Chromium: no sideways
scroll and no overlapping text at 1280 and 1920 px, and the slider (or a click on a revisions row)
shows that revision's values in the heatmaps, read back from the page."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from interp.checkpoints import CheckpointScores, checkpoint_scores
from interp.checkpoints.page import heatmap_columns
from interp.checkpoints.sweep import sweep_sizes
from interp.cli import checkpoints as cli_checkpoints
from interp.config import RunConfig
from interp.errors import OutputError, UsageError
from interp.probes.needle import needle_probe
from interp.retrieval import retrieval_scores
from interp.toy import ToyConfig, ToyTransformer
from tests.test_checkpoints import PROG, SMALL, SMALL_FLAGS, _cli, only_head, save_steps

pytestmark = pytest.mark.usefixtures("one_torch_thread")
RETRIEVAL = ["retrieval", "retrieval_lo", "retrieval_hi", "retrieval_mass", "streaming", "streaming_lo", "streaming_hi"]


def models() -> dict[int, ToyTransformer]:
    """Steps 0-30: the induction role on 1.0, then on 1.2; step 30 holds step 0's weights (a duplicate)."""
    found = {0: only_head(1, 0), 10: only_head(1, 0), 20: only_head(1, 2), 30: only_head(1, 0)}
    with torch.no_grad():
        found[10].unembed.bias += 0.01
    return found


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("page")
    save_steps(root / "ck", models())
    return root


@pytest.fixture(scope="module")
def sweep(folders):
    return checkpoint_scores(str(folders / "ck" / "step*"), parts=("sinks", "retrieval"), **SMALL)


def page_data(text: str) -> dict:
    return json.loads(text.split('id="ckpt-data">')[1].split("</script>")[0])


# --------------------------------------------------------------------------------------------
# the retrieval score per revision


def test_the_retrieval_score_is_read_on_one_needle_probe_for_every_revision(sweep):
    assert set(RETRIEVAL) <= set(sweep.table.columns)
    # the toy's context holds 255 body tokens: the probe fills it, 3 needles of 8 tokens in 2 sequences
    assert sweep.meta["needles"] == {"batch": 2, "seq_len": 255, "n_needles": 3, "needle_len": 8}
    for step, model in models().items():  # an independent reference: the retrieval analysis on the same probe
        probe = needle_probe(model, seq_len=255, depths=(0.1, 0.5, 0.9), needle_len=8, batch=2, seed=0)
        want = retrieval_scores(model, probe, config=RunConfig(seed=0)).table
        got = sweep.table[sweep.table["step"] == step].reset_index(drop=True)
        for column in RETRIEVAL:
            assert got[column].tolist() == want[column].tolist(), (step, column)
    at = {s: sweep.grid("retrieval", s) for s in (10, 20)}
    # the one copier moves with the induction role: 1.0 at step 10, 1.2 at step 20 (a silenced head never retrieves)
    assert at[10][1, 0] > 0.25 and at[10][1, 2] == 0 and at[20][1, 2] > 0.25 and at[20][1, 0] == 0


def test_the_summary_names_the_best_retrieval_head_at_the_first_and_last_step(sweep):
    from interp.cli.checkpoints import summary

    first, last = sweep.grid("retrieval", 10)[1, 0], sweep.grid("retrieval", 30)[1, 0]
    assert first > 0.25 and last > 0.25  # step 0 is a duplicate of step 30: the first step kept is 10
    assert (
        f"retrieval score of the best head: {first:.3f} at step 10 (head 1.0), {last:.3f} at step 30 (head 1.0)"
        in summary(sweep).splitlines()
    )


def test_without_retrieval_the_sweep_has_no_retrieval_columns(folders):
    plain = checkpoint_scores(str(folders / "ck" / "step0"), parts=(), **SMALL)
    assert not set(RETRIEVAL) & set(plain.table.columns) and "needles" not in plain.meta


def test_a_context_that_cannot_hold_the_needle_probe_is_refused_in_one_line(tmp_path, capsys):
    short = ToyConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=40, d_vocab=64, attn_only=True)
    torch.manual_seed(0)
    ToyTransformer(short).save_pretrained(tmp_path / "ck" / "step0")
    with pytest.raises(UsageError) as e:
        checkpoint_scores(
            str(tmp_path / "ck" / "step0"),
            parts=("sinks", "retrieval"),
            sizes=sweep_sizes(batch=2, seq_len=8, icl_len=20),
        )
    assert str(e.value) == (
        "the retrieval score's needle probe (3 needles of 8 tokens, their copies and a haystack) needs at least "
        "56 tokens and step0's context holds 39: leave out retrieval=True (command line: --retrieval)"
    )
    out = tmp_path / "out"
    flags = ["--checkpoints", str(tmp_path / "ck" / "step0"), "--retrieval", "--out", str(out), *SMALL_FLAGS]
    code, _, err = _cli([*flags[:-1], "--icl-len", "20", "--no-progress"], capsys)
    assert code == 2 and err == f"{PROG}: error: {e.value}\n"
    assert not out.exists()  # nothing written, no journal left


def test_a_needle_probe_longer_than_the_context_is_refused_in_one_line(folders, tmp_path, capsys):
    argv = ["--checkpoints", str(folders / "ck" / "step0"), "--retrieval", "--retrieval-len", "300"]
    code, _, err = _cli([*argv, "--out", str(tmp_path / "o"), *SMALL_FLAGS], capsys)
    assert code == 2 and err == (
        f"{PROG}: error: the retrieval score's needle probe (3 needles of 8 tokens, their copies and a haystack) "
        "cannot be 300 tokens: step0's context holds 255 and the probe needs at least 56; ask for retrieval_len=56 to 255 "
        "(command line: --retrieval-len)\n"
    )


def test_toy_training_with_a_needle_probe_it_cannot_hold_is_refused_before_training(tmp_path, capsys):
    out = tmp_path / "o"
    code, _, err = _cli(["--model", "toy-training", "--retrieval", "--retrieval-len", "200", "--out", str(out)], capsys)
    assert code == 2 and err == (
        f"{PROG}: error: the retrieval score's needle probe (3 needles of 8 tokens, their copies and a haystack) "
        "cannot be 200 tokens: toy-training's context holds 95 and the probe needs at least 56; ask for retrieval_len=56 to 95 "
        "(command line: --retrieval-len)\n"
    )
    assert not out.exists()
    code, _, err = _cli(["--retrieval-len", "60", "--out", str(out)], capsys)
    assert (
        code == 2
        and err == f"{PROG}: error: --retrieval-len sets the needle probe of --retrieval: pass --retrieval too\n"
    )


def test_model_toy_training_trains_sweeps_with_retrieval_and_writes_the_page(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["--model", "toy-training", "--train-steps", "4", "--every", "2", "--retrieval", "--out", str(out)]
    code, text, err = _cli([*argv, *SMALL_FLAGS], capsys)
    assert code == 0, err
    assert "training the toy from scratch (seed 0, 4 steps, a checkpoint every 2)" in text
    result = CheckpointScores.load(out)
    assert result.revisions["revision"].tolist() == ["step0", "step2", "step4"]
    assert result.meta["needles"]["seq_len"] == 95 and "retrieval" in result.table  # the toy's 96-token context
    assert (out / "checkpoints_atlas.html").is_file() and str(out / "checkpoints_atlas.html") in text


# --------------------------------------------------------------------------------------------
# the page's contents


def test_the_page_carries_every_revisions_grids_and_tables(sweep):
    text = sweep.page()
    data = page_data(text)
    columns = heatmap_columns(sweep)
    assert columns == ["prev_token", "current", "duplicate", "induction", "first_mass", "copying", "retrieval",
                       "retrieval_mass", "streaming"]  # fmt: skip
    assert [r["revision"] for r in data["revisions"]] == ["step0", "step10", "step20", "step30"]
    assert [r["duplicate_of"] for r in data["revisions"]] == ["step30", "", "", ""]
    for i, label in enumerate(["step0", "step10", "step20", "step30"]):
        for column in columns:
            want = sweep.grid(column, label)
            np.testing.assert_allclose(np.array(data["z"][column][i], dtype=float), want, atol=1e-4, rtol=0)
    assert data["start"] == 3  # the last revision of training is shown first
    for fingerprint in sweep.revisions["weights"]:
        assert f"<code>{fingerprint}</code>" in text
    # the handoffs: 1.0 -> 1.2 between 10 and 20, back between 20 and 30 (step 0 is a duplicate, left out)
    assert sweep.handoffs()[["from_step", "to_step"]].values.tolist() == [[10, 20], [20, 30]]
    assert "<h3>induction</h3>" in text and "First passes the role rule: 1.0 at step 10" in text
    assert "Phase change" not in text and "No phase change" in text


def test_save_page_writes_one_self_contained_file_and_a_sweep_with_out_writes_it(sweep, folders, tmp_path):
    (path,) = sweep.save_page(tmp_path)
    assert path.name == "checkpoints_atlas.html"
    text = path.read_text()
    from plotly.offline import get_plotlyjs

    assert get_plotlyjs() in text  # plotly.js inlined: the page works offline
    assert "<script src=" not in text.replace(get_plotlyjs(), "") and "<link" not in text
    with pytest.raises(OutputError, match="checkpoints_atlas.html already holds a saved result: pass overwrite=True"):
        sweep.save_page(tmp_path)
    out = tmp_path / "run"
    written = checkpoint_scores(str(folders / "ck" / "step*"), out=out, **SMALL).written
    assert "checkpoints_atlas.html" in [p.name for p in written]


# --------------------------------------------------------------------------------------------
# in the browser

from tests.test_browser import BROWSER, WIDTHS, chromium  # noqa: E402, F401  (the session's browser)

needs_browser = pytest.mark.skipif(BROWSER is None, reason="no Chrome or Chromium")


@pytest.fixture(scope="module")
def page(folders, tmp_path_factory):
    out = tmp_path_factory.mktemp("page-out")
    code = cli_checkpoints.cli(["--checkpoints", str(folders / "ck" / "step*"), "--retrieval", "--out", str(out),
                                *SMALL_FLAGS])  # fmt: skip
    assert code == 0
    return out / "checkpoints_atlas.html"


# the value of every heatmap panel at its trace, the slider's place and the label, read from the page
READ = """(() => { const gd = document.getElementById('ckpt-heatmaps'), d = JSON.parse(document.getElementById('ckpt-data').textContent);
  const z = {}; for (const c of d.columns) z[c] = gd.data[d.traces[c].heat].z;
  const dots = gd.data[d.traces.induction.dots];
  return {z, value: +document.getElementById('ckpt-revision').value, label: document.getElementById('ckpt-revision-label').textContent,
          dots: dots.x.map((x, k) => [Math.round(dots.y[k] + 0.3), Math.round(x - 0.34)]),
          picked: Array.from(document.querySelectorAll('#ckpt-revisions tr.picked')).map(r => r.dataset.index)}; })()"""


def at_slider(i: int, n: int) -> str:
    """The window pixel of the slider's stop ``i`` of ``n`` (Chromium's thumb is 16 px wide)."""
    return (
        "(() => { const s = document.getElementById('ckpt-revision'); s.scrollIntoView({block: 'center'});"
        f" const r = s.getBoundingClientRect(); return [r.left + 8 + {i} / {n - 1} * (r.width - 16), r.top + r.height / 2]; }})()"
    )


def _grids_equal(read: dict, sweep, label: str) -> None:
    for column, z in read["z"].items():
        got = np.array(z, dtype=float)  # null (NaN) as nan
        np.testing.assert_allclose(got, sweep.grid(column, label), atol=1e-4, rtol=0, err_msg=column)


@needs_browser
@pytest.mark.parametrize("width", WIDTHS)
def test_the_page_lays_out_cleanly_and_the_slider_shows_each_revisions_heads(chromium, page, sweep, width):  # noqa: F811
    from tests.browser import LAYOUT, layout_problems

    steps = [
        ("eval", "layout", LAYOUT),
        ("eval", "first", READ),
        ("click_at", at_slider(2, 4)),  # each move but the last changes the induction role's head
        ("eval", "step20", READ),
        ("click", "#ckpt-revisions tr[data-index='0']"),
        ("eval", "step0", READ),
        ("click_at", at_slider(1, 4)),
        ("eval", "step10", READ),
    ]
    visit = chromium.visit(page.as_uri(), width=width, height=900, steps=steps)
    assert not visit.errors and visit.drawn
    assert not layout_problems(visit.values["layout"]), layout_problems(visit.values["layout"])
    first = visit.values["first"]
    assert first["value"] == 3 and first["label"].startswith("step30 (step 30); in-context score")
    _grids_equal(first, sweep, "step30")
    for i, label in ((2, "step20"), (0, "step0"), (1, "step10")):
        read = visit.values[label]
        assert read["value"] == i and read["picked"] == [str(i)] and read["label"].startswith(f"{label} (step ")
        _grids_equal(read, sweep, label)
    # the role rule's dots follow the revision: induction on 1.0 at step 10, on 1.2 at step 20
    assert [1, 0] in visit.values["step10"]["dots"] and [1, 2] not in visit.values["step10"]["dots"]
    assert [1, 2] in visit.values["step20"]["dots"] and [1, 0] not in visit.values["step20"]["dots"]
    assert visit.values["step0"]["label"].startswith("step0 (step 0), duplicate of step30")


@needs_browser
def test_the_layout_check_reads_text_clipped_by_a_scrolling_box_as_unseen(chromium, tmp_path):  # noqa: F811
    from tests.browser import LAYOUT, layout_problems

    page = tmp_path / "clipped.html"
    rows = "".join(f"<tr><td>row {i}</td></tr>" for i in range(30))
    page.write_text(
        "<html><body data-ready='1' style='margin:0'><div style='max-height:80px;overflow:auto'><table>"
        f"{rows}</table></div><p style='margin:0'>below the box</p>"
        "<p style='margin:0'>one line</p><p style='margin:-10px 0 0'>the next on top of it</p></body></html>"
    )
    visit = chromium.visit(page.as_uri(), width=1280, height=900, steps=[("eval", "layout", LAYOUT)])
    texts = [t["text"] for t in visit.values["layout"]["texts"]]
    assert "row 0" in texts and "row 29" not in texts  # below the box's fold: not seen, so not overlapping
    problems = layout_problems(visit.values["layout"])
    assert problems == ["1 overlapping text boxes, e.g. [('one line', 'the next on top of it')]"], problems
