"""One spelling of a component (:mod:`interp.names`): in memory and prints ``1.2``, ``mlp.0``; in files
``L1H2``; EAP-IG's ``a1.h2``, ``m0`` read anywhere and written only into its JSON. Edge tables and head
tables name a head alike, and a saved edge table reads back without two heads collapsing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from interp.circuits import Graph, Shape
from interp.circuits.edges import EdgeScores
from interp.names import Part, eapig_name, file_name, memory_name, parse
from interp.results import load_result

# every kind of name, as memory, files and EAP-IG spell it
SPELLINGS = [
    ("0.10", "L0H10", "a0.h10"),
    ("1.2<k>", "L1H2<k>", "a1.h2<k>"),
    ("3.kv1<v>", "L3KV1<v>", "a3.kv1<v>"),
    ("mlp.0", "mlp.0", "m0"),
    ("input", "input", "input"),
    ("logits", "logits", "logits"),
    ("0.1->1.10<q>", "L0H1->L1H10<q>", "a0.h1->a1.h10<q>"),
    ("mlp.11->logits", "mlp.11->logits", "m11->logits"),
    ("input->2.kv0<k>", "input->L2KV0<k>", "input->a2.kv0<k>"),
]


@pytest.mark.parametrize("memory, file, eapig", SPELLINGS)
def test_each_spelling_reads_as_the_same_component_and_writes_each_other(memory, file, eapig):
    for given in (memory, file, eapig):
        assert (memory_name(given), file_name(given), eapig_name(given)) == (memory, file, eapig), given


def test_parts_and_what_names_no_component():
    assert parse("L2H3<q>") == Part("head", 2, 3, "q") and parse("a2.h3<q>").name == "2.3<q>"
    assert parse("m4") == Part("mlp", 4) and parse("2.kv1").node == "2.kv1"
    for other in ("0.1.2", "mlp", "a1", "L1H", "1.2<x>", "0.1->", "head", "1.2->3.4->logits", "m1.5"):
        assert parse(other) is None or "->" in other
        assert memory_name(other) == other == file_name(other)  # left as it is
    assert memory_name(0.1) == 0.1 and file_name(None) is None


def test_edge_tables_name_heads_as_head_tables_do():
    graph = Graph(Shape(2, 4, 2, (0, 1)))
    table = graph.table()
    assert {"0.1", "mlp.0", "input"} <= set(table["sender"]) and {"1.2<q>", "1.kv1<k>", "mlp.1", "logits"} <= set(
        table["receiver"]
    )
    assert all(e == f"{s}->{r}" for e, s, r in zip(table["edge"], table["sender"], table["receiver"]))
    assert [n.name for n in graph.senders[:3]] == ["input", "0.0", "0.1"]


def test_a_saved_edge_table_keeps_heads_0_1_and_0_10_apart(tmp_path):
    """Saved as ``L0H1`` and ``L0H10``: a plain ``pd.read_csv`` reads them as two names, and loading
    gives the table back as memory spells it."""
    graph = Graph(Shape(1, 11, 11, ()))
    table = graph.table()
    table = table[table["receiver"] == "logits"].reset_index(drop=True)
    scores = np.arange(len(table), dtype=float)
    table = table.assign(score=scores, score_lo=scores - 1, score_hi=scores + 1, abs_score=scores)
    written = EdgeScores(table, {"shape": graph.shape.as_dict()}).save(tmp_path)
    raw = pd.read_csv(written[0])
    assert {"L0H1", "L0H10"} <= set(raw["sender"]) and "L0H10->logits" in set(raw["edge"])
    assert raw["sender"].nunique() == len(raw)  # no two heads collapse
    back = load_result(written[1])
    assert isinstance(back, EdgeScores)
    pd.testing.assert_frame_equal(back.table[table.columns], table, check_dtype=False)


def test_a_table_saved_with_eapig_names_loads_in_ours(tmp_path):
    """Results saved before this spelling hold EAP-IG's names: they load as memory spells them."""
    graph = Graph(Shape(1, 2, 2, (0,)))
    table = graph.table().assign(score=0.5, score_lo=0.0, score_hi=1.0, abs_score=0.5)
    js = EdgeScores(table, {"shape": graph.shape.as_dict()}).save(tmp_path)[1]
    old = js.read_text().replace("L0H", "a0.h").replace("mlp.0", "m0")
    assert '"a0.h1->m0"' in old
    js.write_text(old)
    assert list(EdgeScores.load(js).table["edge"]) == list(table["edge"])
