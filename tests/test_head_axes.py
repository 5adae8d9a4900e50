"""Figures whose axes name heads read them as labels, and effects sit on one fixed colour scale.

On a model with 12 heads a layer, "0.1" and "0.10" are two heads: a linear axis parses both as the
number 0.1 and draws one on the other, with ticks at 0, 0.2, ... between them. Every axis that names
heads (path patching's senders and receivers, per-position patching's heads, composition's earlier
and later heads) is categorical. Patching and path effects use the scale -1..1 of the gap, never one
fitted to the data (an effect of 3e-8 is not drawn saturated), with grey only for the noise floor.
The tick labels plotly draws are read in Chromium by tests/test_browser.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from interp.patching.paths import PathScores
from interp.patching.result import PatchScores
from interp.plots import NEUTRAL, heatmap
from interp.results import load_result
from interp.roles.composition import Compositions
from interp.roles.qk_result import QKAttribution
from interp.scores import NOISE_FLOOR_FRACTION, HeadScores

H = 12  # GPT-2 small's heads per layer: labels 0.1 and 0.10 both exist


def path_scores(effects: np.ndarray, half_width: float = 1e-3) -> PathScores:
    """Senders 0.0..0.11 to receivers 1.0..1.11 (the effects' rows and columns), CIs of ``half_width``."""
    rows = [
        {
            "sender": f"0.{s}",
            "sender_layer": 0,
            "sender_head": s,
            "receiver": f"1.{r}",
            "effect": effects[s, r],
            "effect_lo": effects[s, r] - half_width,
            "effect_hi": effects[s, r] + half_width,
        }
        for s in range(effects.shape[0])
        for r in range(effects.shape[1])
    ]
    return PathScores(pd.DataFrame(rows), {"model": "gpt2", "site": "q", "noise_floor": NOISE_FLOOR_FRACTION})


def position_scores(n_layers: int = 2, n_positions: int = 4, seed: int = 0) -> PatchScores:
    rng = np.random.default_rng(seed)
    rows = []
    for l in range(n_layers):
        for h in range(H):
            for p in range(n_positions):
                e = float(rng.uniform(-0.5, 0.5))
                rows.append(
                    {"layer": l, "head": h, "label": f"{l}.{h}", "position": p, "token": f"t{p}", "effect": e}
                    | {"effect_lo": e - 0.05, "effect_hi": e + 0.05}
                )
    return PatchScores(pd.DataFrame(rows), {"model": "gpt2", "normalised": True, "noise_floor": NOISE_FLOOR_FRACTION})


def compositions(n_layers: int = 2) -> Compositions:
    rows = [
        {"kind": k, "src_layer": 0, "src_head": s, "dst_layer": 1, "dst_head": d, "score": 0.01 * (s + d)}
        for k in ("Q", "K", "V")
        for s in range(H)
        for d in range(H)
    ]
    return Compositions(pd.DataFrame(rows), {"model": "gpt2", "n_layers": n_layers, "n_heads": H})


def head_figures() -> dict[str, tuple]:
    """Every figure with axes of head labels: ``name -> (figure, {axis name: its head labels})``."""
    paths = path_scores(np.random.default_rng(0).uniform(-0.5, 0.5, (H, H)))
    heads = [f"{l}.{h}" for l in range(2) for h in range(H)]
    comp = compositions().figure()
    comp_axes = {f"{a}axis{i or ''}": heads for i in ("", 2, 3) for a in "xy"}
    return {
        "path": (paths.figure(), {"xaxis": paths.receivers, "yaxis": paths.senders}),
        "position": (position_scores().figure(), {"yaxis": heads}),
        "composition": (comp, comp_axes),
    }


@pytest.mark.parametrize("name", ["path", "position", "composition"])
def test_every_axis_of_head_labels_is_categorical(name):
    fig, axes = head_figures()[name]
    for axis, labels in axes.items():
        assert fig.layout[axis].type == "category", f"{name}: {axis} reads heads as numbers"
        layer = labels[0].split(".")[0]
        assert {f"{layer}.1", f"{layer}.10"} <= set(labels)  # the two heads a linear axis would merge


def test_the_path_heatmap_uses_the_fixed_effect_scale_not_one_fitted_to_tiny_effects():
    effects = np.full((H, H), 2.8e-8)  # the case that drew fully saturated on a +-27n colour bar
    effects[0, :2] = [-2.8e-8, 0.4]
    fig = path_scores(effects, half_width=1e-8).figure()
    coloured = [t for t in fig.data if t.type == "heatmap" and t.name != "noise"]
    assert len(coloured) == 1
    assert (coloured[0].zmin, coloured[0].zmax, coloured[0].zmid) == (-1.0, 1.0, 0.0)
    # grey, and only grey, for the paths inside the noise floor: every one but the 0.4
    (noise,) = [t for t in fig.data if t.name == "noise"]
    inside = ~np.isnan(np.asarray(noise.z, dtype=float))
    assert inside.sum() == H * H - 1 and not inside[0, 1] and noise.colorscale[0][1] == NEUTRAL
    assert np.isnan(np.asarray(coloured[0].z, dtype=float))[inside].all()
    assert "0.4 [0.4, 0.4]" in coloured[0].text[0][1]


def test_a_path_inside_the_noise_floor_is_grey_by_its_ci_too():
    effects = np.full((2, 2), 0.3)
    fig = path_scores(effects, half_width=0.35).figure()  # CIs reach 0
    (noise,) = [t for t in fig.data if t.name == "noise"]
    assert (~np.isnan(np.asarray(noise.z, dtype=float))).all()


def test_patching_effects_per_head_and_per_position_use_the_same_fixed_scale():
    rng = np.random.default_rng(1)
    grid = rng.uniform(-0.02, 0.03, (2, H))  # small effects: a fitted scale would stretch them to +-0.03
    per_head = PatchScores(
        HeadScores.from_grids({"effect": grid, "effect_lo": grid - 1e-3, "effect_hi": grid + 1e-3}).table,
        {"model": "gpt2", "normalised": True, "noise_floor": NOISE_FLOOR_FRACTION},
    )
    axis = per_head.figure().layout.coloraxis
    assert (axis.cmin, axis.cmax, axis.cmid) == (-1.0, 1.0, 0.0)
    coloured = [t for t in position_scores().figure().data if t.name != "noise"][0]
    assert (coloured.zmin, coloured.zmax) == (-1.0, 1.0)


def test_a_raw_metric_is_drawn_on_plus_minus_its_clean_corrupted_gap():
    grid = np.array([[0.5, -0.1, 0.02]])
    meta = {"model": "toy", "normalised": False, "clean_metric": 3.0, "corrupted_metric": 1.0, "noise_floor": 0.02}
    meta["metric"] = "raw-logit-diff"
    scores = PatchScores(HeadScores.from_grids({"effect": grid, "effect_lo": grid, "effect_hi": grid}).table, meta)
    axis = scores.figure().layout.coloraxis
    assert (axis.cmin, axis.cmax) == (-2.0, 2.0) and axis.colorbar.title.text == "change of raw-logit-diff"


def test_the_layer_by_head_grid_ticks_whole_heads_only():
    """The layer x head grid's axes are the layer and the head index: ticks at whole numbers only
    (its role dots sit between them, which a categorical axis would turn into extra categories)."""
    fig = heatmap(HeadScores.from_grids({"induction": np.zeros((12, H))}), ["induction"])
    assert fig.layout.xaxis.dtick == 1 and fig.layout.yaxis.dtick == 1
    assert list(fig.layout.xaxis.range) == [-0.5, H - 0.5]


# ---- saved tables ------------------------------------------------------------------------------


def qk_attribution() -> QKAttribution:
    """Heads 3.1 and 3.10, each with query components 0.1 and 0.10 (and a non-head one)."""
    rows = [
        {"head": head, "layer": 3, "query": q, "key": "embed", "query_kind": "head", "key_kind": "embed"}
        | {"contrast": c, "contrast_lo": c - 0.1, "contrast_hi": c + 0.1, "score": c, "score_lo": c, "score_hi": c}
        for n, (head, q) in enumerate((h, q) for h in ("3.1", "3.10") for q in ("0.1", "0.10", "mlp.0"))
        for c in [0.25 * n]
    ]
    return QKAttribution(pd.DataFrame(rows), {"model": "gpt2", "at": "induction", "totals": {}})


@pytest.mark.parametrize("kind", ["path", "composition", "qk"])
def test_saved_tables_keep_heads_1_and_10_apart(kind, tmp_path):
    """Read with a plain ``pd.read_csv`` (as a spreadsheet would), "0.1" and "0.10" were both the
    number 0.1: every head a table names is saved as ``L0H10``, and loads back as "0.10"."""
    result, columns = {
        "path": (path_scores(np.zeros((H, H))), ["sender", "receiver"]),
        "composition": (compositions(), ["src", "dst"]),
        "qk": (qk_attribution(), ["label", "query"]),
    }[kind]
    if kind == "composition":  # as composition_scores names them
        t = result.table
        t["src"] = [f"{l}.{h}" for l, h in zip(t["src_layer"], t["src_head"])]
        t["dst"] = [f"{l}.{h}" for l, h in zip(t["dst_layer"], t["dst_head"])]
    csv, js = result.save(tmp_path)[:2]
    plain = pd.read_csv(csv)
    for column in columns:
        names = plain[column].astype(str)
        heads = names[names.str.startswith("L")]
        assert len(heads) and heads.str.fullmatch(r"L\d+H\d+").all(), (column, names.tolist())
        assert {"L0H1", "L0H10"} <= set(names) or {"L1H1", "L1H10"} <= set(names) or {"L3H1", "L3H10"} <= set(names)
    back = load_result(js)
    own = result.table[back.table.columns]
    pd.testing.assert_frame_equal(back.table.reset_index(drop=True), own.reset_index(drop=True), check_dtype=False)


def test_qk_attribution_saves_integer_layer_and_head_columns(tmp_path):
    csv = qk_attribution().save(tmp_path)[0]
    plain = pd.read_csv(csv)
    assert list(plain.columns[:5]) == ["layer", "head", "label", "query", "key"]
    assert plain["head"].tolist() == [1, 1, 1, 10, 10, 10] and plain["layer"].dtype.kind == "i"
    assert plain["label"].tolist() == ["L3H1"] * 3 + ["L3H10"] * 3
    assert plain["query"].tolist() == ["L0H1", "L0H10", "mlp.0"] * 2
