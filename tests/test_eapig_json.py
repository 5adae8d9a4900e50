"""EAP-IG's graph JSON (:mod:`interp.circuits.eapig`): exact round trips on GPT-2 small's shape, GQA,
parallel blocks and layers without an MLP; EAP-IG's names, order and node rule; the refusals' exact
messages; and, where the peer venv is installed, EAP-IG's own ``from_json``/``to_json`` in between."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from interp.circuits import Graph, Shape, count_edges
from interp.circuits.eapig import from_eapig, read_eapig_json, to_eapig, write_eapig_json
from interp.errors import UsageError
from interp.names import memory_name
from tests.helpers import ROOT

GPT2 = Shape(12, 12, 12, tuple(range(12)))
GQA = Shape(2, 4, 2, (0, 1))  # query heads 0, 1 read key/value head 0; 2, 3 read 1
PARALLEL = Shape(3, 4, 4, (0, 1, 2), parallel=True)
PEER = ROOT / ".cache" / "peers" / "eapig" / "bin" / "python"


def random_edges(graph: Graph, seed: int = 0, share: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """A random ``in_graph`` and random float64 scores over many magnitudes, in table order."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal(graph.n_edges) * 10.0 ** rng.integers(-30, 30, graph.n_edges)
    return rng.random(graph.n_edges) < share, scores


def through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


def row(graph: Graph, edge: str) -> int:
    """The table row of ``edge``, named as EAP-IG names it (``a0.h1->a1.h2<k>``; ours ``0.1->1.2<k>``)."""
    return edge_names(graph).index(memory_name(edge))


_NAMES: dict[Shape, list[str]] = {}


def edge_names(graph: Graph) -> list[str]:
    """``graph.table()``'s edge names (built once per shape: GPT-2's table takes a while)."""
    if graph.shape not in _NAMES:
        _NAMES[graph.shape] = graph.table()["edge"].tolist()
    return _NAMES[graph.shape]


def test_gpt2_small_round_trip_is_exact_with_eapig_names_and_cfg():
    graph = Graph(GPT2)
    in_graph, scores = random_edges(graph)
    data = to_eapig(graph, in_graph, scores, d_model=768)
    assert data["cfg"] == {"n_layers": 12, "n_heads": 12, "parallel_attn_mlp": False, "d_model": 768}
    assert len(data["edges"]) == 32_491 == graph.n_edges
    assert len(data["nodes"]) == 1 + 12 * 13 + 1  # input, 12 x (12 heads + MLP), logits
    names = list(data["edges"])
    # EAP-IG's order: layer 0's heads' inputs sender by sender, head by head, q/k/v; then the MLP's
    assert names[:4] == ["input->a0.h0<q>", "input->a0.h0<k>", "input->a0.h0<v>", "input->a0.h1<q>"]
    assert names[36] == "input->m0" and names[-1] == "m11->logits"
    for edge in ("a0.h1->a1.h2<k>", "m0->logits", "input->a0.h0<q>", "a11.h11->m11", "m10->a11.h0<v>"):
        i = row(graph, edge)
        assert data["edges"][edge] == {"score": scores[i], "in_graph": bool(in_graph[i])}
    assert "a1.h0->a1.h2<k>" not in data["edges"] and "m1->m1" not in data["edges"]
    # our tables spell the same edges as every table here spells a component; only the JSON is EAP-IG's
    ours = edge_names(graph)
    assert ours[:2] == ["input->0.0<q>", "input->0.1<q>"] and "0.1->1.2<k>" in ours and "mlp.11->logits" in ours
    assert [name for name in ours if name in data["edges"]] == ["input->logits"]  # the one edge spelled alike

    back_in, back_scores = from_eapig(through_json(data), graph)
    assert back_in.dtype == np.bool_ and back_scores.dtype == np.float64
    assert np.array_equal(back_in, in_graph) and np.array_equal(back_scores, scores)


def test_defaults_are_eapigs_fresh_graph():
    graph = Graph(PARALLEL)
    data = to_eapig(graph)
    assert all(v == {"score": 0.0, "in_graph": False} for v in data["edges"].values())
    assert {k for k, v in data["nodes"].items() if v["in_graph"]} == {"logits"}
    assert data["cfg"]["d_model"] == 0  # not known: EAP-IG reads it only to size neuron tensors
    assert from_eapig(data, graph)[0].sum() == 0


def test_node_in_graph_follows_eapigs_rule():
    """A node is in the graph when an outgoing and an incoming edge are (the input: an outgoing one);
    the logits always are."""
    graph = Graph(Shape(2, 2, 2, (0, 1)))
    in_graph = np.zeros(graph.n_edges, dtype=bool)
    for edge in ("input->a0.h1<v>", "a0.h1->logits", "a1.h0->m1", "input->m0"):
        in_graph[row(graph, edge)] = True
    nodes = to_eapig(graph, in_graph)["nodes"]
    inside = {k for k, v in nodes.items() if v["in_graph"]}
    # a1.h0 sends but receives nothing; m1 and m0 receive but send nothing
    assert inside == {"input", "a0.h1", "logits"}
    assert list(nodes) == ["input", "a0.h0", "a0.h1", "m0", "a1.h0", "a1.h1", "m1", "logits"]

    given = to_eapig(graph, in_graph, nodes_in_graph={"m1": True, "a0.h1": False})["nodes"]
    assert {k for k, v in given.items() if v["in_graph"]} == {"input", "m1", "logits"}
    assert to_eapig(graph, in_graph, nodes_in_graph={"mlp.1": True, "0.1": False})["nodes"] == given  # our names
    flags = np.array([n.name == "1.1" for n in graph.senders])
    by_sender = to_eapig(graph, in_graph, nodes_in_graph=flags)["nodes"]
    assert {k for k, v in by_sender.items() if v["in_graph"]} == {"a1.h1", "logits"}


def test_gqa_writes_one_edge_per_query_head_and_merges_them_back():
    graph = Graph(GQA)
    in_graph, scores = random_edges(graph, seed=1, share=0.3)
    data = to_eapig(graph, in_graph, scores)
    assert data["cfg"] == {
        "n_layers": 2,
        "n_heads": 4,
        "parallel_attn_mlp": False,
        "d_model": 0,
        "n_key_value_heads": 2,
    }
    assert len(data["edges"]) == count_edges(2, 4) == 110 and graph.n_edges == 82
    kv = row(graph, "a0.h1->a1.kv1<k>")
    copies = [data["edges"][f"a0.h1->a1.h{q}<k>"] for q in (2, 3)]
    assert [c["in_graph"] for c in copies] == [bool(in_graph[kv])] * 2
    assert copies[0]["score"] + copies[1]["score"] == scores[kv]  # the copies add up to the score
    assert copies[0]["score"] == scores[kv] / 2
    assert "a0.h1->a1.kv1<k>" not in data["edges"]
    q = row(graph, "a0.h1->a1.h2<q>")  # a query receiver is one edge, its score as it is
    assert data["edges"]["a0.h1->a1.h2<q>"] == {"score": scores[q], "in_graph": bool(in_graph[q])}

    back_in, back_scores = from_eapig(through_json(data), graph)
    assert np.array_equal(back_in, in_graph) and np.array_equal(back_scores, scores)


def test_gqa_copies_that_differ_are_summed_and_any_in_graph():
    """EAP-IG's own scores of an ungrouped model differ per copy: the key/value edge gets their sum
    (the gradient at a shared input is the sum over its copies) and is in the graph if any copy is."""
    graph = Graph(GQA)
    data = to_eapig(graph)
    data["edges"]["input->a0.h0<v>"] = {"score": 0.25, "in_graph": False}
    data["edges"]["input->a0.h1<v>"] = {"score": 0.5, "in_graph": True}
    in_graph, scores = from_eapig(data, graph)
    i = row(graph, "input->a0.kv0<v>")
    assert scores[i] == 0.75 and in_graph[i] and in_graph.sum() == 1 and np.count_nonzero(scores) == 1


def test_gqa_round_trip_is_exact_for_a_group_of_three():
    """``score / 3`` is rounded: the last copy takes the remainder, so the sum is the score bit for bit."""
    graph = Graph(Shape(2, 6, 2, (0, 1)))
    in_graph, scores = random_edges(graph, seed=2)
    data = through_json(to_eapig(graph, in_graph, scores))
    assert np.array_equal(from_eapig(data, graph)[1], scores)
    i = row(graph, "input->a1.kv0<k>")
    parts = [data["edges"][f"input->a1.h{q}<k>"]["score"] for q in range(3)]
    assert (parts[0] + parts[1]) + parts[2] == scores[i] and parts[0] == parts[1] == scores[i] / 3


def test_parallel_blocks_round_trip():
    graph = Graph(PARALLEL)
    in_graph, scores = random_edges(graph, seed=3)
    data = to_eapig(graph, in_graph, scores)
    assert data["cfg"]["parallel_attn_mlp"] is True
    assert len(data["edges"]) == graph.n_edges == count_edges(3, 4, parallel=True)
    assert "a0.h0->m0" not in data["edges"] and "input->m0" in data["edges"] and "m0->a1.h0<q>" in data["edges"]
    names = list(data["edges"])  # the MLP's input comes with the heads', sender by sender
    assert names[12:14] == ["input->m0", "input->a1.h0<q>"]
    back_in, back_scores = from_eapig(through_json(data), graph)
    assert np.array_equal(back_in, in_graph) and np.array_equal(back_scores, scores)


def test_a_layer_without_mlp_is_written_empty_and_refused_when_used():
    graph = Graph(Shape(2, 2, 2, (1,)))
    in_graph, scores = random_edges(graph, seed=4, share=0.5)
    data = through_json(to_eapig(graph, in_graph, scores))
    assert len(data["edges"]) == count_edges(2, 2) and data["edges"]["m0->logits"] == {"score": 0.0, "in_graph": False}
    assert data["nodes"]["m0"] == {"in_graph": False}
    back_in, back_scores = from_eapig(data, graph)
    assert np.array_equal(back_in, in_graph) and np.array_equal(back_scores, scores)

    data["edges"]["m0->logits"] = {"score": 0.5, "in_graph": True}
    with pytest.raises(UsageError) as e:
        from_eapig(data, graph)
    assert str(e.value) == (
        "the EAP-IG graph keeps edge 'm0->logits' (in the graph: True, score 0.5) but this graph has no MLP in "
        "layer 0: read it with the graph of the model it was made for"
    )


def refusal(data: dict, graph: Graph) -> str:
    with pytest.raises(UsageError) as e:
        from_eapig(data, graph)
    return str(e.value)


def test_from_eapig_refuses_another_shape_naming_what_differs():
    small = Graph(Shape(2, 4, 4, (0, 1)))
    data = to_eapig(small)
    assert refusal(data, Graph(Shape(3, 2, 2, (0, 1, 2)))) == (
        "the EAP-IG graph is not this graph's: n_layers 2 in the JSON, 3 here; n_heads 4 in the JSON, 2 here: "
        "read it with the graph of the model it was made for"
    )
    assert refusal(data, Graph(Shape(2, 4, 4, (0, 1), parallel=True))) == (
        "the EAP-IG graph is not this graph's: parallel_attn_mlp False in the JSON, True here: "
        "read it with the graph of the model it was made for"
    )
    assert refusal(to_eapig(Graph(GQA)), small) == (
        "the EAP-IG graph is not this graph's: n_key_value_heads 2 in the JSON, 4 here: "
        "read it with the graph of the model it was made for"
    )
    # EAP-IG itself writes no n_key_value_heads (it ungroups): its file reads into a GQA graph
    plain = to_eapig(small)
    assert from_eapig(plain, Graph(GQA))[0].shape == (Graph(GQA).n_edges,)


def test_from_eapig_refuses_missing_keys_edges_and_bad_values():
    graph = Graph(Shape(2, 4, 4, (0, 1)))
    data = to_eapig(graph)
    assert refusal({"cfg": {}, "nodes": {}}, graph) == (
        "the JSON is not an EAP-IG graph: it lacks 'edges' (EAP-IG writes 'cfg', 'nodes', 'edges'): "
        "pass what EAP-IG's Graph.to_json writes"
    )
    assert refusal([1, 2], graph) == (
        "the JSON is not an EAP-IG graph: a JSON list, not an object with keys 'cfg', 'nodes', 'edges': "
        "pass what EAP-IG's Graph.to_json writes"
    )
    assert refusal({**data, "cfg": {"n_layers": 2}}, graph) == (
        "the EAP-IG graph's cfg lacks 'n_heads', 'parallel_attn_mlp' (EAP-IG's graph is built from n_layers, "
        "n_heads, parallel_attn_mlp): pass what EAP-IG's Graph.to_json writes"
    )
    cut = through_json(data)
    del cut["edges"]["a0.h1->a1.h2<k>"], cut["edges"]["m1->logits"]
    assert refusal(cut, graph) == (
        "the EAP-IG graph lacks edge 'a0.h1->a1.h2<k>' and 1 more of the 110 its graph of this shape has: "
        "it was cut short or made for another model; pass what EAP-IG's Graph.to_json writes"
    )
    extra = through_json(data)
    extra["edges"]["a1.h0->a1.h1<q>"] = {"score": 0.0, "in_graph": False}
    assert refusal(extra, graph) == (
        "the EAP-IG graph has edge 'a1.h0->a1.h1<q>' that this graph lacks: read it with the graph of the model "
        "it was made for"
    )
    bad = through_json(data)
    bad["edges"]["m0->logits"] = {"score": "0.5", "in_graph": False}
    assert refusal(bad, graph) == (
        "the EAP-IG graph's edge 'm0->logits' is {'score': '0.5', 'in_graph': False}, not "
        "{'score': number, 'in_graph': bool}: pass what EAP-IG's Graph.to_json writes"
    )
    node = through_json(data)
    node["nodes"]["a2.h0"] = {"in_graph": False}
    assert refusal(node, graph) == (
        "the EAP-IG graph has node 'a2.h0' that this graph lacks: read it with the graph of the model it was made for"
    )


def test_to_eapig_refuses_values_not_per_edge():
    graph = Graph(GQA)
    with pytest.raises(UsageError) as e:
        to_eapig(graph, np.zeros(3, dtype=bool))
    assert str(e.value) == (
        "in_graph= has shape (3,), the graph has 82 edges: pass one value per row of graph.table(), in its order"
    )
    assert e.value.params == ("in_graph",)
    with pytest.raises(UsageError) as e:
        to_eapig(graph, np.zeros(82))
    assert str(e.value) == "in_graph= holds float64 values, not booleans: pass e.g. np.abs(scores) >= threshold"
    with pytest.raises(UsageError) as e:
        to_eapig(graph, scores=np.zeros((82, 2)))
    assert str(e.value).startswith("scores= has shape (82, 2), the graph has 82 edges")
    with pytest.raises(UsageError) as e:
        to_eapig(graph, nodes_in_graph={"a0.kv0": True})
    assert str(e.value) == (
        "nodes_in_graph= names 1 node(s) EAP-IG's graph of this shape lacks (first: 'a0.kv0'): name nodes as "
        "graph.senders does ('input', '0.0', 'mlp.0', 'logits') or as EAP-IG does ('a0.h0', 'm0')"
    )
    with pytest.raises(UsageError) as e:
        to_eapig(graph, nodes_in_graph={"logits": False})
    assert str(e.value) == (
        "nodes_in_graph= takes 'logits' out of the graph: EAP-IG's logits are always in it; drop that entry"
    )


def test_write_and_read_files(tmp_path: Path):
    graph = Graph(GQA)
    in_graph, scores = random_edges(graph, seed=5)
    data = to_eapig(graph, in_graph, scores)
    path = write_eapig_json(tmp_path / "sub" / "circuit.json", data)
    assert path == tmp_path / "sub" / "circuit.json" and [p.name for p in path.parent.iterdir()] == ["circuit.json"]
    assert path.read_text() == json.dumps(data)  # EAP-IG's layout: default separators, no indent
    back_in, back_scores = from_eapig(read_eapig_json(path), graph)
    assert np.array_equal(back_in, in_graph) and np.array_equal(back_scores, scores)


def test_read_refuses_files_that_are_not_eapig_json(tmp_path: Path):
    def message(content: bytes | None, name: str = "g.json") -> str:
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(UsageError) as e:
            read_eapig_json(path)
        return str(e.value).replace(str(tmp_path), "<tmp>")

    assert message(b"\xff\xfe{}") == (
        "<tmp>/g.json is not UTF-8 text (byte 0): pass a JSON file EAP-IG's Graph.to_json wrote"
    )
    assert message(b'{"cfg": ') == (
        "<tmp>/g.json is not JSON (Expecting value at line 1 column 9): pass a JSON file EAP-IG's Graph.to_json wrote"
    )
    assert message(b'{"cfg": {}, "edges": {}}') == (
        "<tmp>/g.json is not an EAP-IG graph: it lacks 'nodes' (EAP-IG writes 'cfg', 'nodes', 'edges'): "
        "pass what EAP-IG's Graph.to_json writes"
    )
    assert message(None, "absent.json") == (
        "cannot read <tmp>/absent.json: no such file or directory: pass the path of a JSON file EAP-IG's "
        "Graph.to_json wrote"
    )


PEER_ROUND_TRIP = """
import sys
from eap.graph import Graph
for path in sys.argv[1:]:
    Graph.from_json(path).to_json(path + ".back")
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not PEER.is_file(),
    reason="no EAP-IG peer venv at .cache/peers/eapig (install it as analyses/eapig_roundtrip.py says)",
)
def test_eapig_reads_and_writes_our_json_unchanged(tmp_path: Path):
    """EAP-IG's own ``Graph.from_json`` then ``to_json`` on our files: the same text, read back exactly
    (scores float32, as EAP-IG keeps them)."""
    cases = {}
    for name, shape in {"gpt2": GPT2, "gqa": GQA, "parallel": PARALLEL}.items():
        graph = Graph(shape)
        in_graph, scores = random_edges(graph, seed=6)
        scores = scores.clip(-1e30, 1e30).astype(np.float32).astype(np.float64)
        path = write_eapig_json(tmp_path / f"{name}.json", to_eapig(graph, in_graph, scores, d_model=64))
        cases[name] = graph, path, in_graph, scores
    child = subprocess.run(
        [str(PEER), "-c", PEER_ROUND_TRIP, *(str(c[1]) for c in cases.values())],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-3000:]
    for graph, path, in_graph, scores in cases.values():
        back = Path(str(path) + ".back")
        assert back.read_text() == path.read_text()
        back_in, back_scores = from_eapig(read_eapig_json(back), graph)
        assert np.array_equal(back_in, in_graph) and np.array_equal(back_scores, scores)
