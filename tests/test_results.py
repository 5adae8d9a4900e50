"""The one result shape: every table result saves through one code path and loads back through one
loader, :func:`interp.results.load_result`, which finds the class from what the files hold."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from interp.errors import UsageError
from interp.patching.faithfulness import FaithfulnessCurves
from interp.patching.paths import PathScores
from interp.patching.result import PatchScores
from interp.results import RESULTS, Result, load_result
from interp.roles.composition import Compositions
from interp.scores import HeadScores

HEADER = {"model": "toy", "n_layers": 2, "n_heads": 2, "causal": True}


def _heads(meta: dict) -> HeadScores:
    scores = HeadScores.from_grids({"induction": np.arange(4.0).reshape(2, 2) / 10}, {**HEADER, **meta})
    scores.table["induction_lo"] = scores.table["induction"] - 0.05
    scores.table["induction_hi"] = scores.table["induction"] + 0.05
    return scores


def _results() -> list[Result]:
    patch = PatchScores(_heads({"kind": "patch_position"}).table, {**HEADER, "kind": "patch_position"})
    patch.pairs = patch.table[["layer", "head", "label"]].assign(pair=0, effect=0.25)
    paths = pd.DataFrame({"sender": ["0.0", "0.1"], "receiver": ["1.0", "1.0"], "effect": [0.5, np.nan]})
    faith = pd.DataFrame({"ranking": ["patching", "patching"], "n": [1, 2], "faithfulness": [0.4, 0.9]})
    comp = pd.DataFrame(
        {"kind": ["Q"], "src_layer": [0], "src_head": [1], "dst_layer": [1], "dst_head": [0], "score": [0.3]}
    )
    return [
        _heads({"kind": "induction"}),
        _heads({"method": "exact"}),
        patch,
        PathScores(paths, {"model": "toy", "site": "q"}),
        FaithfulnessCurves(faith, {"model": "toy", "task": "ioi"}),
        Compositions(comp, {"kind": "weights", **HEADER}),
    ]


@pytest.mark.parametrize("result", _results(), ids=lambda r: type(r).__name__)
def test_every_result_loads_back_through_the_one_loader_as_its_own_class(tmp_path, result):
    written = result.save(tmp_path)
    js = next(p for p in written if p.suffix == ".json")
    back = load_result(js)
    assert type(back) is type(result)
    pd.testing.assert_frame_equal(back.table, result.table, check_dtype=False)
    assert back.meta == result.meta
    again = type(result).load(js)  # the class's own load reads the same files the same way
    pd.testing.assert_frame_equal(again.table, back.table)
    if isinstance(result, PatchScores):
        pd.testing.assert_frame_equal(back.pairs, result.pairs, check_dtype=False)


def test_a_saved_json_starts_with_its_kind_and_provenance(tmp_path):
    paths = _results()[3]
    blob = json.loads(paths.save(tmp_path)[1].read_text())
    assert list(blob) == ["kind", "versions", "command", "meta", "rows"] and blob["kind"] == "path_patching"
    assert blob["rows"][1]["effect"] is None  # NaN as null, read back as NaN
    assert list(json.loads(_heads({}).save(tmp_path)[1].read_text())) == [
        "kind",
        "versions",
        "command",
        "probe",
        "baselines",
        "ci_warning",
        "meta",
        "rows",
    ]


def test_a_folder_loads_its_default_stem_and_nothing_there_is_named(tmp_path):
    _results()[3].save(tmp_path)
    assert isinstance(PathScores.load(tmp_path), PathScores)
    with pytest.raises(
        UsageError, match=r"^no saved faithfulness curves at .*faithfulness\.json: pass the \.json that"
    ):
        FaithfulnessCurves.load(tmp_path)
    with pytest.raises(UsageError, match=r"^no saved scores at .*: pass the \.json \(or \.csv\) that save\(\) wrote$"):
        HeadScores.load(tmp_path / "nowhere.json")


def test_an_unknown_kind_is_refused_with_the_kinds_there_are(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"kind": "nonsense", "meta": {}}))
    with pytest.raises(UsageError, match=r"holds no result this toolkit reads \(kind 'nonsense'\): choose from \["):
        load_result(tmp_path / "x.json")
    assert {"head_scores", "patch_head", "path_patching", "faithfulness", "composition"} <= set(RESULTS.names())


def test_an_eapig_graph_json_is_pointed_to_circuit_from_eapig(tmp_path):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({"cfg": {"n_layers": 2}, "nodes": {}, "edges": {}}))
    with pytest.raises(UsageError) as e:
        load_result(path)
    assert str(e.value) == (
        f"{path} is an EAP-IG graph JSON: read it with interp.Circuit.from_eapig(path, model), which needs the "
        "model it was made on"
    )


def test_a_head_map_loads_back_through_load_result(tmp_path):
    from interp.roles.encoder import HeadMap

    distance = np.array([[0.0, 0.5], [0.5, 0.0]])
    m = HeadMap(distance, np.array([[0.0, 1.0], [1.0, 0.0]]), {"model": "toy", "n_layers": 1, "n_heads": 2})
    m.save(tmp_path)
    back = load_result(tmp_path / "head_map.json")
    assert type(back) is HeadMap and np.array_equal(back.distance, distance) and back.meta == m.meta


def test_the_head_column_leaves_pandas_head_method_alone(tmp_path):
    """Chosen: the column keeps TransformerLens's word, ``head``; ``table.head(n)`` is still pandas'
    first n rows (attribute access finds the method), ``table["head"]`` the column, and both come back
    from a saved file the same way."""
    scores = _heads({"kind": "induction"})
    for table in (scores.table, load_result(scores.save(tmp_path)[1]).table):
        assert table.head(3).shape[0] == 3 and callable(table.head)
        assert table["head"].tolist() == [0, 1, 0, 1] and table["head"].dtype.kind == "i"
        assert table.groupby(["layer", "head"])["induction"].mean().loc[(1, 1)] == pytest.approx(0.3)
