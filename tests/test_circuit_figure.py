"""The figure of a circuit as a graph (:func:`interp.circuits.figure.graph_figure`): on the bundled toy's
edge scores and on hand-built tables, it draws exactly the chosen edges and the nodes they touch (and the
input and logits), layers bottom to top, colours by score on a diverging scale centred on 0, says each
edge's score and CI on hover, keeps q/k/v apart, places GQA key/value receivers between their query heads,
and opens clean in a headless Chromium (skipped, saying why, where there is none)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

import interp
from interp.browser import find_browser
from interp.circuits import Graph, Shape
from interp.circuits.figure import CURVE_POINTS, graph_figure
from interp.plots.files import save_figure
from interp.plots.style import DIVERGING, MAX_WIDTH, colour_at, grey_free
from tests.helpers import one_thread

BROWSER = find_browser()


@pytest.fixture(scope="module")
def toy_edges():
    with one_thread():
        model = interp.load_model("toy")
        return interp.edge_scores(model, "repeat", direction="noise", config=interp.RunConfig(n_boot=100))


def hand_table(shape: Shape, seed: int = 0) -> pd.DataFrame:
    """Every edge of ``shape``'s graph with a random score, a CI around it and a stability."""
    table = Graph(shape).table()
    rng = np.random.default_rng(seed)
    table["score"] = rng.normal(size=len(table))
    table["score_lo"], table["score_hi"] = table["score"] - 0.25, table["score"] + 0.25
    table["stability"] = rng.uniform(size=len(table))
    return table


def edge_traces(fig) -> dict:
    return {t.meta["edge"]: t for t in fig.data if isinstance(t.meta, dict) and "edge" in t.meta}


def node_places(fig) -> dict[str, tuple[float, float]]:
    """Every drawn node's name -> (x, y)."""
    places = {}
    for t in fig.data:
        if isinstance(t.meta, dict) and "nodes" in t.meta:
            places.update({name: (x, y) for name, x, y in zip(t.customdata, t.x, t.y)})
    return places


def node_of(end: str) -> str:
    """The node an edge's end is drawn at: a head's receiver ``1.2<k>`` is the head ``1.2``."""
    return re.sub(r"<[qkv]>$", "", end)


def layer_of(node: str, n_layers: int) -> float:
    if node == "input":
        return -1
    if node == "logits":
        return n_layers
    layer = int(re.match(r"(?:mlp\.)?(\d+)", node).group(1))
    return layer + (0.5 if node.startswith("mlp.") else 0)  # a (sequential) MLP reads after its heads


def rgb(colour: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", colour))


def scale_end(t: float) -> tuple[int, ...]:
    return tuple(round(c) for c in colour_at(DIVERGING, t))


def test_draws_exactly_the_top_edges_and_their_nodes(toy_edges):
    fig = graph_figure(toy_edges.table, toy_edges.meta, edges=25)
    top = toy_edges.top(25)
    drawn = edge_traces(fig)
    assert len(drawn) == 25 and set(drawn) == set(top["edge"])
    for trace in drawn.values():  # one line each, no gaps: a single segment per edge
        assert trace.mode == "lines" and all(v is not None for v in trace.x)
    ends = {node_of(e) for e in pd.concat([top["sender"], top["receiver"]])}
    assert set(node_places(fig)) == ends | {"input", "logits"}
    assert "25 of 81 edges" in fig.layout.title.text
    assert "toy" in fig.layout.title.text and "logit-diff" in fig.layout.title.text
    assert "noise" in fig.layout.title.text
    assert fig.layout.width <= MAX_WIDTH


def test_a_large_circuit_draws_its_strongest_edges_and_says_so(toy_edges):
    """A circuit of more edges than ``edges=`` draws its strongest by |score|, its title says how
    many of how many; ``edges=None`` draws all of it."""
    circuit = toy_edges.circuit(40)
    assert circuit.n_edges > 12
    fig = circuit.figure(edges=12)
    inside = circuit.table[circuit.table["in_circuit"]]
    strongest = inside.loc[inside["score"].abs().sort_values(ascending=False).index[:12], "edge"]
    assert set(edge_traces(fig)) == set(strongest)
    title = fig.layout.title.text
    assert f"circuit of {circuit.n_edges} of 81 edges, its 12 of largest |score| drawn" in title
    assert set(edge_traces(circuit.figure(edges=None))) == set(inside["edge"])
    assert "drawn" not in circuit.figure().layout.title.text  # the default 60 takes every edge of 81
    with pytest.raises(ValueError, match=r"edges=0: an integer >= 1, the number of edges to draw, or None for all"):
        circuit.figure(edges=0)


def test_in_circuit_column_chooses_the_edges(toy_edges):
    table = toy_edges.table.copy()
    chosen = table["edge"].isin(["input->0.0<q>", "0.1->1.3<k>", "0.1->1.0<v>", "1.2->logits"])
    table["in_circuit"] = chosen
    fig = graph_figure(table, toy_edges.meta, edges=60)  # edges= does not apply: the column says
    assert set(edge_traces(fig)) == set(table.loc[chosen, "edge"])
    assert set(node_places(fig)) == {"input", "logits", "0.0", "0.1", "1.0", "1.2", "1.3"}
    assert "4 of 81 edges" in fig.layout.title.text
    # an empty circuit: the input and the logits alone
    table["in_circuit"] = False
    fig = graph_figure(table, toy_edges.meta)
    assert not edge_traces(fig) and set(node_places(fig)) == {"input", "logits"}


def test_layers_run_bottom_to_top():
    table = hand_table(Shape(3, 3, 3, (0, 1, 2)))
    fig = graph_figure(table, {"model": "hand", "metric": "m"}, edges=len(table))  # every edge: every node
    places = node_places(fig)
    assert len(places) == 2 + 3 * 3 + 3
    nodes = sorted(places, key=lambda n: layer_of(n, 3))
    for a, b in zip(nodes, nodes[1:]):
        if layer_of(a, 3) < layer_of(b, 3):
            assert places[a][1] < places[b][1], (a, b)
        else:
            assert places[a][1] == places[b][1], (a, b)
    heads = [places[f"1.{h}"][0] for h in range(3)]
    assert heads == sorted(heads) and heads == [places[f"0.{h}"][0] for h in range(3)]  # columns line up
    for trace in edge_traces(fig).values():  # every edge runs upward, sender to receiver
        assert trace.y[-1] > trace.y[0]


def test_mlp_above_its_heads_unless_parallel():
    shape = Shape(2, 3, 3, (0, 1))
    table = hand_table(shape)
    places = node_places(graph_figure(table, {}, edges=len(table)))
    assert places["0.0"][1] < places["mlp.0"][1] < places["1.0"][1]
    par = hand_table(Shape(2, 3, 3, (0, 1), parallel=True))
    for meta in ({"parallel": True}, {"graph": Graph(Shape(2, 3, 3, (0, 1), parallel=True)).describe()}):
        places = node_places(graph_figure(par, meta, edges=len(par)))
        assert places["mlp.0"][1] == places["0.0"][1]  # on its heads' row, after them
        assert places["mlp.0"][0] > max(places[f"0.{h}"][0] for h in range(3))


def test_colour_and_width_follow_the_score():
    table = hand_table(Shape(2, 3, 3, ()))
    table["score"] = np.linspace(-0.5, 0.5, len(table))
    table.loc[5, "score"], table.loc[9, "score"] = 2.0, -2.0
    fig = graph_figure(table, {"metric": "logit-diff"}, edges=12)
    drawn = edge_traces(fig)
    pos, neg = drawn[table.loc[5, "edge"]], drawn[table.loc[9, "edge"]]
    assert rgb(pos.line.color) == scale_end(1.0) and rgb(neg.line.color) == scale_end(0.0)  # the two ends
    assert rgb(pos.line.color) != rgb(neg.line.color)
    ca = fig.layout.coloraxis
    assert ca.cmin == -ca.cmax == -2.0 and ca.cmid == 0.0  # centred on 0
    assert grey_free([tuple(s) for s in ca.colorscale])  # no grey or white middle
    assert "logit-diff" in ca.colorbar.title.text
    widths = {name: t.line.width for name, t in drawn.items()}
    weak = min(drawn.values(), key=lambda t: abs(t.meta["score"]))
    assert widths[pos.name] == widths[neg.name] == max(widths.values()) > 2 * weak.line.width
    assert fig.data.index(pos) > fig.data.index(weak)  # the strong edges drawn over the weak


def test_toy_signs_sit_on_their_sides(toy_edges):
    fig = graph_figure(toy_edges.table, toy_edges.meta, edges=30)
    scores = {name: t.meta["score"] for name, t in edge_traces(fig).items()}
    strongest = max(scores, key=lambda n: abs(scores[n]))
    pos = max(scores, key=scores.get)
    assert scores[pos] > 0 > scores[strongest]  # the toy's top edge lowers the logit difference
    assert rgb(edge_traces(fig)[strongest].line.color) == scale_end(0.0)
    blue, red = scale_end(0.0), scale_end(1.0)
    colour = rgb(edge_traces(fig)[pos].line.color)
    assert colour[0] > colour[2] and red[0] > red[2] and blue[2] > blue[0]  # red side for a positive score


def test_hover_gives_score_ci_and_stability(toy_edges):
    fig = graph_figure(toy_edges.table, toy_edges.meta, edges=10)
    drawn = edge_traces(fig)
    for row in toy_edges.top(10).itertuples():
        text = drawn[row.edge].hovertext[0]
        assert row.edge.replace("<", "&lt;").replace(">", "&gt;") in text
        assert f"{row.score:.4g} [{row.score_lo:.4g}, {row.score_hi:.4g}]" in text
        assert "95% CI" in text and f"stability {row.stability:.2f}" in text
        assert len(set(drawn[row.edge].hovertext)) == 1  # the same wherever the line is hovered
    for t in fig.data:
        if isinstance(t.meta, dict) and "nodes" in t.meta:
            for name, text in zip(t.customdata, t.hovertext):
                assert name in text and "in-circuit edge" in text


def test_q_k_v_are_told_apart():
    table = hand_table(Shape(2, 2, 2, ()))
    chosen = {f"input->1.0<{s}>" for s in "qkv"}
    table["in_circuit"] = table["edge"].isin(chosen)
    fig = graph_figure(table, {})
    drawn = edge_traces(fig)
    assert set(drawn) == chosen
    dashes = {drawn[f"input->1.0<{s}>"].line.dash for s in "qkv"}
    ends = {drawn[f"input->1.0<{s}>"].x[-1] for s in "qkv"}
    assert len(dashes) == 3 and len(ends) == 3  # a dash and an end of its own each
    for site, word in zip("qkv", ("queries", "keys", "values")):
        assert word in drawn[f"input->1.0<{site}>"].hovertext[0]
    legend = {t.meta["legend"]: t for t in fig.data if isinstance(t.meta, dict) and "legend" in t.meta}
    assert {s: legend[s].line.dash for s in "qkv"} == {s: drawn[f"input->1.0<{s}>"].line.dash for s in "qkv"}
    assert set(node_places(fig)) == {"input", "logits", "1.0"}  # the three receivers are one node


def test_gqa_draws_key_value_receivers_between_their_query_heads():
    table = Graph(Shape(2, 4, 2, (0, 1))).table()
    table["score"] = np.where(table["receiver"].str.contains("kv"), 1.0, 0.1)
    table.loc[table["receiver"] == "1.kv1<v>", "score"] = -3.0
    fig = graph_figure(table, {"model": "gqa"}, edges=int((table["score"] != 0.1).sum()))
    drawn = edge_traces(fig)
    assert drawn and all("kv" in name for name in drawn)
    places = node_places(fig)
    assert {n for n in places if ".kv" in n} == {"0.kv0", "0.kv1", "1.kv0", "1.kv1"}
    for l in (0, 1):  # a key/value head between its query heads (0 1 and 2 3)
        assert places[f"{l}.kv0"][0] == 0.5 and places[f"{l}.kv1"][0] == 2.5
    # on its layer, a little under its query heads' row: above the rows below it
    assert places["input"][1] < places["0.kv0"][1] == places["0.kv1"][1] < places["0.0"][1]
    assert places["0.0"][1] < places["mlp.0"][1] < places["1.kv0"][1] < places["logits"][1]
    hover = next(t for t in fig.data if isinstance(t.meta, dict) and t.meta.get("nodes") == "kv")
    text = dict(zip(hover.customdata, hover.hovertext))
    assert "query heads 2 3" in text["1.kv1"] and "query heads 0 1" in text["0.kv0"]
    assert "query heads 2 3" in drawn["0.2->1.kv1<v>"].hovertext[0]
    assert rgb(drawn["0.2->1.kv1<v>"].line.color) == scale_end(0.0)


def test_gpt2_sized_graph_fits_the_width():
    table = hand_table(Shape(12, 12, 12, tuple(range(12))))
    fig = graph_figure(table, {"model": "gpt2", "metric": "logit-diff", "n_edges": len(table)}, edges=200)
    assert len(edge_traces(fig)) == 200 and fig.layout.width <= MAX_WIDTH
    assert "200 of 32,491 edges" in fig.layout.title.text


def test_refusals():
    table = hand_table(Shape(1, 2, 2, ()))
    with pytest.raises(ValueError, match="score"):
        graph_figure(table.drop(columns="score"), {})
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="edges="):
            graph_figure(table, {}, edges=bad)


def test_saved_page_is_self_contained(toy_edges, tmp_path):
    fig = graph_figure(toy_edges.table, toy_edges.meta)
    (path,) = save_figure(fig, tmp_path, "circuit", png=False)
    page = path.read_text()
    assert len(page) > 3_000_000 and "plotly.js" in page.lower()  # plotly.js inlined (about 4.8 MB)
    assert not re.search(r"<script[^>]*\bsrc=", page)  # nothing fetched from a network
    assert "1.2-&gt;logits" in page or "1.2->logits" in page


def hovered(browser, page: str, curve: int, point: int) -> str:
    """The hover label's text once plotly is told that point ``point`` of trace ``curve`` is hovered."""
    script = (
        "new Promise(done => { const gd = document.querySelector('.plotly-graph-div');"
        f" Plotly.Fx.hover(gd, [{{curveNumber: {curve}, pointNumber: {point}}}]);"
        " setTimeout(() => done(Array.from(document.querySelectorAll('.hoverlayer .hovertext'))"
        ".map(e => e.textContent).join(' | ')), 200); })"
    )
    visit = browser.visit(page, width=1280, height=900, script=script)
    assert not visit.errors, visit.errors
    return visit.value


@pytest.mark.skipif(BROWSER is None, reason="no Chrome or Chromium (Debian: apt-get install chromium)")
def test_opens_clean_in_chromium(toy_edges, tmp_path):
    pytest.importorskip("websocket", reason="websocket-client (the dev extra) drives the browser")
    from tests.browser import LAYOUT, Chromium, layout_problems

    figures = {
        "toy": graph_figure(toy_edges.table, toy_edges.meta),
        "gpt2": graph_figure(hand_table(Shape(12, 12, 12, tuple(range(12)))), {"model": "gpt2"}, edges=200),
        "gqa": graph_figure(hand_table(Shape(3, 4, 2, (0, 1, 2))), {"model": "gqa"}, edges=60),
    }
    toy = figures["toy"].data
    strongest = max((i for i, t in enumerate(toy) if "edge" in t.meta), key=lambda i: abs(toy[i].meta["score"]))
    heads = next(i for i, t in enumerate(toy) if t.meta.get("nodes") == "head")
    browser = Chromium(BROWSER)
    try:
        for name, fig in figures.items():
            (path,) = save_figure(fig, tmp_path, name, png=False)
            visit = browser.visit(path.as_uri(), width=1280, height=900, script=LAYOUT)
            assert not visit.errors, (name, visit.errors)
            assert visit.drawn, f"{name}: plotly never drew the figure"
            assert visit.value["scroll"] <= 1280, f"{name}: the page scrolls sideways at 1280 px"
            assert not layout_problems(visit.value), (name, layout_problems(visit.value))
        page = (tmp_path / "toy.html").as_uri()
        edge = toy[strongest].meta["edge"]
        text = hovered(browser, page, strongest, CURVE_POINTS // 2)  # the middle of the strongest edge
        assert edge in text and "95% CI" in text and "stability" in text, text
        text = hovered(browser, page, heads, 0)
        assert toy[heads].customdata[0] in text and "in-circuit edge" in text, text
    finally:
        browser.close()
