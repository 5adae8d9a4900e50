"""Displays that do not invite over-reading, and saving that never loses work.

On a random-weight 12 x 12 GPT-2 (vocabulary 300, a short probe) no head meets the role rule, so
the induction figure and the atlas mark none and name none, and every exact and gradient
importance lies inside its noise floor.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch

import interp
from interp.errors import OutputError
from interp.plots import heatmap, inside_noise
from interp.report.build import atlas_sizes
from interp.scores import HeadScores, format_table
from tests.helpers import gpt2_model, one_thread


@pytest.fixture(scope="module")
def random12():
    with one_thread():
        model = interp.from_hf_model(gpt2_model(n_layer=12, n_head=12, n_embd=768))
        probe = interp.repeated_tokens(model, batch=5, block_len=8, seed=0)
        yield model, probe


def _marks(fig):
    return [t for t in fig.data if t.type == "scatter" and len(t.x)]


def test_random_gpt2_induction_figure_and_atlas_mark_no_head(random12):
    from interp.report import head_atlas
    from interp.report.page import render_atlas

    model, probe = random12
    with one_thread():
        scores = interp.head_scores(model, probe)
        atlas = head_atlas(
            model, skip=["sinks", "exact", "gradient", "pruning", "patterns"], sizes=atlas_sizes(batch=5, seq_len=8)
        )
    base = scores.meta["baselines"]
    # the CI alone clears the baseline for many heads: the old dots; the role rule marks none
    assert sum(int((scores.table[f"{c}_lo"] > base[c]).sum()) for c in base) > 10
    assert _marks(scores.figure(["prev_token", "duplicate", "induction"])) == []
    assert (atlas.roles["role"] == "").all() and _marks(atlas.figure()) == []
    assert "class=clear" not in render_atlas(atlas)


def test_random_gpt2_importances_lie_inside_their_noise_floor(random12):
    model, probe = random12
    from interp.ablation import builtin_metric

    metric = builtin_metric("incontext", probe)
    with one_thread():
        heads = [(l, h) for l in range(12) for h in range(12) if l >= 1]  # a short sweep: layer 0
        exact = interp.exact_sweep(model, probe, metric, ablation="mean", base=heads)
        grad = interp.gradient_importance(model, probe, metric, ablation="mean")
    for result in (exact, grad):
        floor = result.meta["noise_floor"]
        assert floor == pytest.approx(0.01 * abs(result.meta.get("clean_metric", result.meta.get("metric_value"))))
        finite = np.isfinite(result.grid("importance"))
        assert finite.sum() >= 12 and inside_noise(result, "importance", floor)[finite].all()
        fig = heatmap(result, ["importance"])
        coloured = [t for t in fig.data if t.type == "heatmap" and t.name != "noise"][0]
        assert np.isnan(np.asarray(coloured.z, dtype=float)).all()  # nothing drawn in colour
        assert "noise floor" in fig.layout.annotations[0].text
        assert result.table["importance_lo"].notna().sum() == finite.sum()


def test_importance_ci_is_the_bootstrap_of_per_sequence_deltas():
    from interp.scores import bootstrap_mean

    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 0.0], [6.0, 0.0]])
    point, lo, hi = bootstrap_mean(x, n_boot=2000, seed=0)
    # 4 sequences: the expanded interval (Student's t with 3 degrees of freedom) spans the data's range
    assert point.tolist() == [3.0, 0.0] and lo[0] == 1.0 and hi[0] == 6.0 and lo[1] == hi[1] == 0
    # 50 sequences: about the mean -+ t[49] standard errors
    gen = torch.Generator().manual_seed(0)
    y = 2.0 + torch.randn(50, 1, generator=gen, dtype=torch.float64)
    point, lo, hi = bootstrap_mean(y, n_boot=4000, seed=0)
    se = float(y.std() / 50**0.5)
    assert float(point) - float(lo) == pytest.approx(2.01 * se, rel=0.12)
    assert float(hi) - float(point) == pytest.approx(2.01 * se, rel=0.12)


def test_noise_floor_greys_only_small_or_uncertain_cells():
    s = HeadScores.from_grids(
        {
            "importance": np.array([[0.5, 0.005, 0.5]]),
            "importance_lo": np.array([[0.4, 0.001, -0.1]]),
            "importance_hi": np.array([[0.6, 0.009, 0.9]]),
        },
        {"noise_floor": 0.01},
    )
    assert inside_noise(s, "importance", 0.01).tolist() == [[False, True, True]]
    fig = heatmap(s, ["importance"])
    coloured = [t for t in fig.data if t.type == "heatmap" and t.name != "noise"][0]
    assert np.isnan(np.asarray(coloured.z, dtype=float)).tolist() == [[False, True, True]]


def test_marks_need_the_role_rule_not_the_ci_alone():
    s = HeadScores.from_grids(
        {
            "induction": np.array([[0.2, 0.9]]),
            "induction_lo": np.array([[0.15, 0.85]]),
            "induction_hi": np.array([[0.25, 0.95]]),
        }
    )
    (dots,) = _marks(heatmap(s, ["induction"], baselines={"induction": 0.014}))
    assert list(dots.x) == [1 + 0.34]  # 0.2 clears the baseline but not the 0.3 effect size


def test_few_sequences_are_flagged_in_table_and_figure():
    s = HeadScores.from_grids(
        {"induction": np.array([[0.5]]), "induction_lo": np.array([[0.5]]), "induction_hi": np.array([[0.5]])},
        {"probe": {"batch": 1}},
    )
    text = format_table(s.table, ["induction"], ci=["induction"], n_sequences=1)
    assert text.splitlines()[-2].strip().endswith("0.500 [0.500, 0.500]!")
    assert text.splitlines()[-1] == (
        "! CIs from 1 sequence: fewer than 5, so an interval says little about the spread; use a larger batch"
    )
    assert "CIs from 1 sequence (&lt; 5)" in heatmap(s, ["induction"]).layout.annotations[0].text
    s.meta["probe"]["batch"] = 5
    assert "&lt; 5" not in heatmap(s, ["induction"]).layout.annotations[0].text
    assert "!" not in format_table(s.table, ["induction"], ci=["induction"], n_sequences=5)


def test_saving_refuses_to_replace_and_records_versions_probe_baselines_and_command(tmp_path):
    s = HeadScores.from_grids(
        {"induction": np.zeros((1, 11))}, {"probe": {"batch": 3}, "baselines": {"induction": 0.1}}
    )
    paths = s.save(tmp_path)
    assert [p.name for p in paths] == ["head_scores.csv", "head_scores.json"]
    with pytest.raises(OutputError) as e:
        s.save(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / 'head_scores.csv'} already holds a saved result: pass overwrite=True to replace it, "
        "or save under another stem= or folder"
    )
    assert s.save(tmp_path, overwrite=True) == paths
    exact = HeadScores(s.table, {"method": "exact"})
    assert [p.name for p in exact.save(tmp_path)] == ["exact.csv", "exact.json"]  # the kind is the stem
    blob = json.loads(paths[1].read_text())
    assert set(blob["versions"]) == {"interp", "torch", "transformers", "transformer_lens"}
    assert blob["versions"]["torch"] == torch.__version__.split("+")[0] or blob["versions"]["torch"]
    assert blob["probe"] == {"batch": 3} and blob["baselines"] == {"induction": 0.1} and blob["command"]
    # labels survive pandas: L0H10 is no number, and integer layer/head columns sit beside it
    table = pd.read_csv(paths[0])
    assert table["label"].tolist()[9:] == ["L0H9", "L0H10"] and table["head"].dtype.kind == "i"
    back = HeadScores.load(paths[1])
    assert back.table["label"].tolist()[10] == "0.10" and HeadScores.load(paths[0]).table["label"][10] == "0.10"


def test_sink_tokens_need_three_occurrences_and_bos_comes_first():
    from interp.sinks.tables import token_table

    occ = pd.DataFrame(
        {
            "sequence": [0, 1, 2, 0, 1],
            "position": [0, 0, 0, 5, 7],
            "token_id": [0, 0, 0, 9, 8],
            "token": ["<bos>"] * 3 + ["x", "y"],
            "role": ["first"] * 3 + ["word", "word"],
            "attention_ratio": [4.0, 4.0, 4.0, 30.0, 20.0],
            "mass": [0.5] * 5,
            "sink_head_share": [0.5] * 5,
        }
    )
    table = token_table(occ, lambda f: f["attention_ratio"] >= 3)
    assert table["token"].tolist() == ["<bos>", "x", "y"] and table["is_sink"].tolist() == [True, False, False]


def _rgb_at(axis, value: float) -> tuple[float, ...]:
    """The colour a plotly colour axis gives ``value``: a linear blend between the scale's stops, as
    plotly.js draws it (read from the figure, independent of interp.plots)."""
    stops = []
    for pos, colour in axis.colorscale:
        c = colour.strip()
        rgb = (
            tuple(int(c[i : i + 2], 16) for i in (1, 3, 5))
            if c.startswith("#")
            else tuple(float(v) for v in c[c.index("(") + 1 : -1].split(",")[:3])
        )
        stops.append((float(pos), rgb))
    t = (value - axis.cmin) / (axis.cmax - axis.cmin)
    for (p0, c0), (p1, c1) in zip(stops, stops[1:]):
        if p0 <= t <= p1 and p1 > p0:
            return tuple(a + (t - p0) / (p1 - p0) * (b - a) for a, b in zip(c0, c1))
    raise AssertionError(f"{value} lies outside the colour axis [{axis.cmin}, {axis.cmax}]")


def _chroma(rgb) -> float:
    return max(rgb) - min(rgb)  # 0 for a pure grey; the neutral floor colour has 9


@pytest.mark.parametrize(
    "col, grid",
    [  # the atlas's case: gradient importances 0.104 and 0.091 drawn grey under "grey cells lie inside it"
        ("gradient_importance", [[0.0003, 0.104, 0.091, 0.2], [0.0, 0.0004, 0.05, 0.15]]),
        ("exact_importance", [[-0.3, -0.0002, 0.2, 1.0], [0.001, -0.02, 0.0004, 0.5]]),  # diverging: some help
    ],
)
def test_grey_means_only_inside_the_noise_floor(col, grid):
    from interp.plots import NEUTRAL
    from interp.report.page import IMPORTANCE_SCALES

    floor = 0.000474
    z = np.array(grid)
    s = HeadScores.from_grids({col: z})
    fig = heatmap(s, [col], scales=IMPORTANCE_SCALES, noise_floor={col: floor})
    title = " ".join(re.sub(r"<[^>]+>", " ", fig.layout.annotations[0].text).split())  # as read, lines joined
    assert title == f"{col} noise floor 0.000474: grey cells lie inside it"
    noise = [t for t in fig.data if t.name == "noise"][0]
    coloured = [t for t in fig.data if t.type == "heatmap" and t.name != "noise"][0]
    inside = np.abs(z) <= floor
    assert (~np.isnan(np.asarray(noise.z, dtype=float)) == inside).all() and noise.colorscale[0][1] == NEUTRAL
    assert (np.isnan(np.asarray(coloured.z, dtype=float)) == inside).all()
    axis = fig.layout[coloured.coloraxis]
    for v in z[~inside]:
        assert _chroma(_rgb_at(axis, v)) >= 40, f"{v} is drawn grey: {_rgb_at(axis, v)}"
    # and so is every value the scale can show outside the floor, not only these
    lo, hi = axis.cmin, axis.cmax
    for v in [*np.linspace(floor, hi, 300), *(np.linspace(lo, -floor, 300) if lo < 0 else [])]:
        assert _chroma(_rgb_at(axis, v)) >= 40, f"{v:.4g} would be drawn grey: {_rgb_at(axis, v)}"


def test_a_scale_with_greys_is_refused_on_a_panel_with_a_noise_floor():
    from interp.plots import DIVERGING, Scale, grey_free

    assert not grey_free("Cividis") and not grey_free("RdBu_r") and grey_free("Viridis") and grey_free(DIVERGING)
    s = HeadScores.from_grids({"importance": np.array([[0.5, 0.0001]])})
    with pytest.raises(ValueError) as e:
        heatmap(
            s,
            ["importance"],
            scales={"importance": Scale("x", "Cividis", anchor=0.0)},
            noise_floor={"importance": 0.01},
        )
    assert str(e.value) == (
        "the colour scale Cividis of importance holds greys, and grey marks the cells inside the noise floor: "
        "choose one without (Viridis, Plasma, plots.DIVERGING)"
    )
    heatmap(s, ["importance"], scales={"importance": Scale("x", "Cividis", anchor=0.0)})  # no floor: no grey to mean


def test_importance_from_the_cli_diverges_without_a_white_middle():
    s = HeadScores.from_grids({"importance": np.array([[-0.4, 0.003, 0.8]])}, {"noise_floor": 0.01})
    fig = heatmap(s, ["importance"])
    axis = fig.layout.coloraxis
    assert axis.cmin == -0.8 and axis.cmax == 0.8
    assert min(_chroma(_rgb_at(axis, v)) for v in (-0.011, 0.011, -0.4, 0.8)) >= 40
