"""Every result object shows itself the same way: a short ``repr`` (class, model, shape, a few top
rows, never whole arrays) and, in a notebook, a summary table and its figure (``_repr_html_``);
``LogitAttribution`` has the common shape (``.table``, ``.grid``, ``.figure``, ``.load``)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from interp.ablation import incontext_loss, pruning_curves, train_gates
from interp.checkpoints import checkpoint_scores
from interp.checkpoints.sweep import sweep_sizes
from interp.config import RunConfig
from interp.heads import head_scores
from interp.models import load_model
from interp.patching import patch_heads
from interp.patching.faithfulness import faithfulness_curves
from interp.patching.paths import path_patch
from interp.probes import repeated_tokens
from interp.probes.task import task_probe
from interp.report import head_atlas
from interp.report.build import atlas_sizes
from interp.results import load_result, plural
from interp.roles import composition_scores, head_map, logit_attribution
from interp.roles.logit import LogitAttribution
from interp.scores import HeadScores
from interp.sinks import sink_scores

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def toy():
    return load_model("toy", device="cpu")


@pytest.fixture(scope="module")
def results(toy, tmp_path_factory):
    """One result of each class, each from its analysis on the toy at small sizes."""
    probe = repeated_tokens(toy, batch=3, block_len=6, n_repeats=2, seed=0)
    task = task_probe(toy, "repeat", n_pairs=3, seed=0, block_len=4)
    patched = patch_heads(toy, task)
    folder = tmp_path_factory.mktemp("steps")
    for step in (0, 10):
        toy.save_pretrained(folder / f"step{step}")
    made = {
        "HeadScores": head_scores(toy, probe),
        "PatchScores": patched,
        "PathScores": path_patch(toy, task),
        "FaithfulnessCurves": faithfulness_curves(toy, task, {"patching": patched}),
        "Compositions": composition_scores(toy, n_random=20),
        "LogitAttribution": logit_attribution(toy, task, config=RunConfig(n_boot=20)),
        "HeadMap": head_map(toy, probe),
        "SinkReport": sink_scores(toy, probe, config=RunConfig(n_boot=20)),
        "PruningCurves": pruning_curves(toy, probe, incontext_loss(probe), orders=["random"], step=0.5),
        "GateSweep": train_gates(toy, probe, incontext_loss(probe), [0.0], steps=2),
        "Atlas": head_atlas(
            toy,
            skip=["pruning", "gradient", "exact"],
            sizes=atlas_sizes(batch=3, seq_len=12, sink_batch=3, sink_seq_len=12),
            config=RunConfig(seed=0),
        ),
        "CheckpointScores": checkpoint_scores(
            str(folder / "step*"), sizes=sweep_sizes(batch=3, seq_len=8, icl_len=40, icl_batch=3)
        ),
    }
    for result in made.values():
        print(repr(result), end="\n\n")  # what a reader sees (pytest -s)
    return made


CLASSES = [
    "HeadScores",
    "PatchScores",
    "PathScores",
    "FaithfulnessCurves",
    "Compositions",
    "LogitAttribution",
    "HeadMap",
    "SinkReport",
    "PruningCurves",
    "GateSweep",
    "Atlas",
    "CheckpointScores",
]


@pytest.mark.parametrize("name", CLASSES)
def test_a_notebook_shows_a_summary_table_and_the_figure(results, name):
    result = results[name]
    assert type(result).__name__ == name
    page = result._repr_html_()
    assert page.count("<table") == 1 and "</table>" in page
    assert '<div id="' in page and "Plotly.newPlot" in page  # the figure's div, drawn by plotly
    assert page.index("</table>") < page.index("Plotly.newPlot")  # the table first, then its figure
    assert f"{name} of {result.meta['model']}: " in page  # the class and the model, above the table


@pytest.mark.parametrize("name", CLASSES)
def test_repr_is_a_short_summary_not_a_dataclass_dump(results, name):
    result = results[name]
    text = repr(result)
    assert text.startswith(f"{name} of {result.meta['model']}: ")
    assert len(text) < 1000 and len(text.splitlines()) <= 7  # a headline and at most five rows under a header
    assert "array(" not in text and "tensor(" not in text and "DataFrame" not in text


def test_the_top_rows_are_ranked_by_the_main_score(results):
    dla = results["LogitAttribution"]
    shown = dla.shown_rows()
    assert shown["dla"].tolist() == sorted(dla.table["dla"], reverse=True)[:5]
    assert "top by dla" in repr(dla)


def test_repr_of_a_gpt2_sized_result_stays_short():
    """12 layers x 12 heads, three scores with CIs, 50 prompts of 20 tokens: the repr shows five rows."""
    g = np.random.default_rng(0)
    meta = {"model": "gpt2", "n_layers": 12, "n_heads": 12}
    grids = {k: g.normal(size=(12, 12)) for k in ("a", "a_lo", "a_hi", "b", "b_lo", "b_hi", "c", "c_lo", "c_hi")}
    scores = HeadScores.from_grids(grids, meta)
    parts = pd.DataFrame({"prompt": np.arange(50), "embed": g.normal(size=50), "total": g.normal(size=50)})
    dla = LogitAttribution(
        HeadScores.from_grids({"dla": grids["a"], "dla_lo": grids["a_lo"], "dla_hi": grids["a_hi"]}, meta),
        g.normal(size=(50, 12, 12, 20)),
        parts,
        meta,
    )
    for result in (scores, dla):
        text = repr(result)
        assert len(text) < 1000, text
        assert "144 rows (12 layers x 12 heads)" in text


def test_logit_attribution_has_the_common_shape_and_round_trips(toy, tmp_path):
    task = task_probe(toy, "repeat", n_pairs=3, seed=0, block_len=4)
    r = logit_attribution(toy, task, config=RunConfig(n_boot=20))
    assert r.table is r.heads.table and r.meta["model"] == "toy"
    np.testing.assert_array_equal(r.grid(), r.heads.grid("dla"))
    assert r.grid("dla_hi").shape == (2, 4)  # the toy's 2 layers x 4 heads
    fig = r.figure()
    assert [t.type for t in fig.data] == ["heatmap"]
    np.testing.assert_array_equal(np.asarray(fig.data[0].z, dtype=float), r.grid())
    r.save(tmp_path)
    back = LogitAttribution.load(tmp_path)
    pd.testing.assert_frame_equal(back.table, r.table)
    pd.testing.assert_frame_equal(back.parts, r.parts)
    np.testing.assert_array_equal(back.per_position, r.per_position)  # bit for bit, NaN where NaN
    assert back.meta == r.meta
    assert LogitAttribution.load(tmp_path / "logit_attribution.json").meta == r.meta
    via = load_result(tmp_path / "logit_attribution.json")
    assert type(via) is LogitAttribution and via.table.equals(back.table) and via.parts.equals(back.parts)


def test_logit_attribution_load_says_what_is_missing(tmp_path):
    from interp.errors import UsageError

    with pytest.raises(UsageError, match=r"^no saved logit attribution at .*: pass the logit_attribution.json"):
        LogitAttribution.load(tmp_path)


def test_plural_is_singular_for_one():
    assert plural(1, "pair") == "1 pair" and plural(2, "pair") == "2 pairs" and plural(0, "path") == "0 paths"
    assert plural(1, "query", "queries") == "1 query" and plural(3, "query", "queries") == "3 queries"
    assert plural(1200, "row") == "1,200 rows"


def test_one_shared_view_serves_every_class(results):
    """No result class writes its own repr or notebook view (a dataclass's own repr would win)."""
    for name in CLASSES:
        own = [k for k in ("__repr__", "_repr_html_") if k in vars(type(results[name]))]
        assert not own, f"{name} defines {own}"


def test_a_notebook_figure_never_loads_plotly_from_the_network(results, monkeypatch):
    """Offline, a CDN script never arrives and the cell stays blank: plotly.js is inlined in the
    session's first figure, and the later ones draw with it."""
    from interp import results as module

    monkeypatch.setattr(module, "_PLOTLY_IN_NOTEBOOK", [False])
    first, second = (results["HeadScores"]._repr_html_() for _ in range(2))
    for page in (first, second):
        assert not re.search(r"<script[^>]*\bsrc=", page)  # a script fetched from elsewhere
    assert len(first) > len(second) + 1_000_000  # plotly.js itself, once
    assert "Plotly.newPlot" in second


def test_a_qk_attribution_shows_the_pair_each_row_is():
    """Its rows are (head, query side, key side) terms: the repr shows all three before the
    contrast (``key`` was cut off by the column limit)."""
    from interp.roles.qk_result import QKAttribution

    rows = [
        {"head": "1.2", "layer": 1, "query": q, "key": k, "query_kind": "head", "key_kind": "head"}
        | {"contrast": c, "contrast_lo": c - 0.1, "contrast_hi": c + 0.1, "score": c, "score_lo": c, "score_hi": c}
        for q, k, c in (("embed", "0.1", 0.5), ("0.3", "0.0", 0.9))
    ]
    r = QKAttribution(pd.DataFrame(rows), {"model": "toy"})
    assert r.shown_columns() == ["head", "query", "key", "contrast", "contrast_lo", "contrast_hi"]
    lines = repr(r).splitlines()
    assert lines[1].split() == ["head", "query", "key", "contrast", "contrast_lo", "contrast_hi"]
    assert lines[2].split()[:4] == ["1.2", "0.3", "0.0", "0.9"]  # the largest contrast first


def test_edge_results_show_the_signed_score_the_circuit_and_the_curves_figures():
    """EdgeScores showed ``abs_score`` alone; a Circuit every row without its size or faithfulness;
    a FaithfulnessCurve five rows of empty circuits and not its CPR, CMD or smallest faithful size."""
    from interp.circuits import Circuit, EdgeScores, FaithfulnessCurve

    edges = pd.DataFrame(
        {
            "edge": ["0.0->logits", "input->0.0<q>", "input->logits"],
            "sender": ["0.0", "input", "input"],
            "receiver": ["logits", "0.0<q>", "logits"],
            "site": ["logits", "q", "logits"],
            "score": [-0.5, 0.2, 0.01],
            "score_lo": [-0.6, 0.1, 0.0],
            "score_hi": [-0.4, 0.3, 0.02],
            "stability": [1.0, 0.9, 0.5],
        }
    )
    edges["abs_score"] = edges["score"].abs()
    lines = repr(EdgeScores(edges, {"model": "toy"})).splitlines()
    assert lines[1].split() == ["edge", "score", "score_lo", "score_hi", "stability", "site"]
    assert lines[2].split()[:2] == ["0.0->logits", "-0.5"]  # ranked by |score|, shown signed
    inside = edges.assign(in_circuit=[True, False, True])
    meta = {"model": "toy", "faithfulness": 0.9, "faithfulness_ci": [0.85, 0.95]}
    lines = repr(Circuit(inside, meta)).splitlines()
    assert lines[0] == "Circuit of toy: 2 edges of 3, faithfulness 0.900 [0.850, 0.950]"
    assert [line.split()[0] for line in lines[2:]] == ["0.0->logits", "input->logits"]  # its own edges only
    curve = pd.DataFrame(
        {"size": [0, 1, 2, 3], "fraction": [0.001, 0.3, 0.6, 1.0], "n_edges": [0, 0, 2, 3], "metric": [0.0] * 4}
        | {"faithfulness": [0.0, 0.0, 0.9, 1.0], "faithfulness_lo": [0.0] * 4, "faithfulness_hi": [1.0] * 4}
    )
    reach = {"n_edges": 2, "fraction": 0.6, "faithfulness": 0.9}
    meta = {"model": "toy", "cpr": 0.5, "cmd": 0.4, "smallest_faithful": reach, "graph_edges": 3}
    lines = repr(FaithfulnessCurve(curve, meta)).splitlines()
    assert lines[0] == (
        "FaithfulnessCurve of toy: CPR 0.500 (area under the curve), CMD 0.400 (area between it and 1); smallest "
        "circuit reaching faithfulness 0.8: 2 edges (66.67% of the graph, after pruning), faithfulness 0.900"
    )
    assert [int(line.split()[2]) for line in lines[2:]] == [2, 3]  # the circuits that keep edges
