"""Heatmaps that do not mislead: one fixed colour scale per score family, sizes that follow the model."""

import numpy as np
import pytest

from interp.errors import UnknownNameError
from interp.plots import MAX_WIDTH, heatmap, short_name
from interp.scores import HeadScores


def _scores(L, H, seed=0):
    rng = np.random.default_rng(seed)
    grids = {}
    for name, scale in (("prev_token", 1.0), ("duplicate", 0.012), ("induction", 1.0)):
        v = scale * rng.random((L, H))
        grids.update({name: v, f"{name}_lo": v * 0.9, f"{name}_hi": v * 1.1})
    grids["copying"] = rng.uniform(-0.2, 0.9, (L, H))
    return HeadScores.from_grids(grids)


def _axis(fig, trace):
    return fig.layout[trace.coloraxis]


def test_attention_masses_share_one_fixed_0_1_scale_and_copying_a_diverging_one():
    s = _scores(2, 4)
    fig = heatmap(s, ["prev_token", "duplicate", "induction", "copying"])
    maps = [t for t in fig.data if t.type == "heatmap"]
    mass = {_axis(fig, t).cmin for t in maps[:3]}, {_axis(fig, t).cmax for t in maps[:3]}
    assert mass == ({0.0}, {1.0})  # duplicate scores of ~0.01 are not stretched to full brightness
    assert len({t.coloraxis for t in maps[:3]}) == 1 and maps[3].coloraxis != maps[0].coloraxis
    copying = _axis(fig, maps[3])
    assert (copying.cmin, copying.cmax, copying.cmid) == (-1.0, 1.0, 0.0)
    assert all(_axis(fig, t).colorbar.title.text for t in maps)  # every family has a colour bar


def test_importance_is_anchored_at_zero_and_diverges_when_signs_mix():
    s = HeadScores.from_grids({"importance": np.array([[0.5, 2.0], [1.0, 3.0]])})
    axis = heatmap(s, ["importance"]).layout.coloraxis
    assert (axis.cmin, axis.cmax) == (0.0, 3.0)
    mixed = HeadScores.from_grids({"importance": np.array([[-1.0, 2.0], [1.0, 4.0]])})
    axis = heatmap(mixed, ["importance"]).layout.coloraxis
    assert (axis.cmin, axis.cmax, axis.cmid) == (-4.0, 4.0, 0.0)


def test_hover_shows_head_value_ci_and_baseline_and_dots_mark_heads_above_it():
    s = HeadScores.from_grids(
        {
            "induction": np.array([[0.01, 0.9]]),
            "induction_lo": np.array([[0.0, 0.85]]),
            "induction_hi": np.array([[0.02, 0.95]]),
        }
    )
    fig = heatmap(s, ["induction"], baselines={"induction": 0.014})
    cell = fig.data[0]
    assert cell.customdata[0][1] == "0.1" and cell.text[0][1] == "0.9 [0.85, 0.95]<br>uniform: 0.014"
    assert "uniform 0.014" in fig.layout.annotations[0].text
    dots = [t for t in fig.data if t.type == "scatter"]
    assert len(dots) == 1 and list(dots[0].y) == [0 - 0.3] and list(dots[0].x) == [1 + 0.34]


@pytest.mark.parametrize("L,H", [(2, 4), (12, 12), (32, 32)])
def test_size_follows_the_model_and_fits_a_1400_pixel_window(L, H):
    fig = heatmap(_scores(L, H), ["prev_token", "duplicate", "induction", "copying"])
    assert fig.layout.width <= MAX_WIDTH
    grid = fig.layout.xaxis.domain[1] - fig.layout.xaxis.domain[0]
    cell = grid * (fig.layout.width - fig.layout.margin.l - fig.layout.margin.r) / H
    assert cell >= 11  # a 32 x 32 model still gets cells a pointer can hit
    if L == 32:
        assert fig.layout.height > heatmap(_scores(2, 4), ["induction"]).layout.height * 3


def test_short_name_drops_local_folders_and_keeps_hub_names():
    assert short_name("/home/me/models/my-gpt/") == "my-gpt"
    assert short_name("./ckpt/run3") == "run3"
    assert short_name("EleutherAI/pythia-70m") == "EleutherAI/pythia-70m"
    assert short_name("gpt2") == "gpt2"


def test_the_heatmap_draws_a_plain_table_and_its_meta_as_it_draws_the_result_holding_them():
    """A renderer takes data: a per-head DataFrame with its meta gives the very figure the HeadScores
    holding them gives (title from the meta's model, baselines under the panel titles, the few
    sequences flagged), and a column the table lacks is refused by name."""
    s = _scores(2, 3)
    s.meta.update(model="toy", baselines={"induction": 0.2}, probe={"batch": 2})
    from_result = heatmap(s, ["induction", "copying"])
    from_data = heatmap(s.table.copy(), ["induction", "copying"], meta=dict(s.meta))
    assert from_data.to_json() == from_result.to_json()
    assert from_data.layout.title.text == "toy: head scores"
    assert "uniform 0.200" in from_data.layout.annotations[0].text and "CIs from 2 sequences" in (
        from_data.layout.annotations[0].text
    )
    with pytest.raises(UnknownNameError, match=r"^no score 'nope'; have \['prev_token', 'duplicate', 'induction'"):
        heatmap(s.table, ["nope"])
