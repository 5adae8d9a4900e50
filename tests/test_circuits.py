"""Exact edge patching, circuits and path patching on the one intervention replay
(interp.patching.edge_patch): known answers on hand-set and trained models, and equality with
references written here as plain hooked forwards that never touch the replay."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import interp
from interp.ablation.modes import derangement
from interp.circuits import MIB_FRACTIONS, Circuit, Graph, Shape, edge_scores, evaluate_circuits, graph_of
from interp.circuits.circuit import REFINE, REFINE_SIZES, prune, select, sizes_of
from interp.circuits.curve import FaithfulnessCurve
from interp.errors import UsageError
from interp.patching.core import setup
from interp.patching.edge_patch import CodeUnits, EdgeSweeper
from interp.patching.edge_replay import SOURCE
from interp.probes.task import task_probe
from interp.toy.model import ToyConfig, ToyTransformer
from interp.toy.planted import planted_model
from tests.test_edges import _metric, _outputs, _receiver_hooks

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = interp.RunConfig(n_boot=200)
CHAIN = {"input->0.0<v>", "0.0->1.0<k>", "1.0->logits"}


def _random_toy(n_layers=2, dtype=torch.float32, seed=0):
    """LayerNorm, MLPs and grouped keys/values (4 query heads, 2 key/value heads), random weights."""
    torch.manual_seed(seed)
    cfg = ToyConfig(
        n_layers=n_layers, d_model=32, n_heads=4, n_key_value_heads=2, attn_only=False, d_mlp=64, d_vocab=50, n_ctx=32
    )
    cfg.init_range = 0.5
    model = ToyTransformer(cfg).eval().to(dtype)
    return model, task_probe(model, "repeat", n_pairs=6, seed=1)


# ---- the hand-set model: the answer flows through one chain of edges ------------------------------


def test_planted_chain_exact_and_eap_name_its_edges_first_and_its_circuit_is_fully_faithful():
    model = planted_model(n_ctx=64)
    exact = edge_scores(model, "repeat", method="exact", direction="noise", config=FAST)
    eap = edge_scores(model, "repeat", method="eap", direction="noise", config=FAST)
    for r in (exact, eap):
        assert set(r.top(3).edge) == CHAIN
    # each edge of the chain alone carries the whole gap (noising one breaks the chain; the logits'
    # edge exactly, the two below a little more: 1.0's own value input, noised alone, gives some back)
    gap = exact.meta["gap"]
    t = exact.table.set_index("edge")
    assert t.loc["1.0->logits", "score"] == pytest.approx(-gap, rel=1e-5)
    assert (t.loc[sorted(CHAIN), "score"] <= -gap * (1 - 1e-5)).all()
    rest = exact.table[~exact.table.edge.isin(CHAIN)]
    assert rest.score.abs().max() < 0.02 * abs(gap)
    keep = exact.table.edge.isin(CHAIN).to_numpy()
    curve = evaluate_circuits(model, "repeat", [keep, ~keep, np.zeros_like(keep), np.ones_like(keep)], config=FAST)
    assert curve.table.faithfulness.tolist() == pytest.approx([1.0, 0.0, 0.0, 1.0], abs=1e-6)
    assert exact.circuit(3).edges == sorted(CHAIN, key=list(exact.table.edge).index)


# ---- exact edge patching against a plain loop -------------------------------------------------------


def test_exact_edge_scores_equal_a_plain_forward_per_edge():
    model, task = _random_toy()
    r = edge_scores(model, task, method="exact", metric="raw-logit-diff", config=FAST)
    t = r.table.set_index("edge")
    own, donor = task.corrupted, task.clean  # denoising: the corrupted prompts run
    with torch.no_grad():
        base = _metric(model, own, task, [])
        outs_d, outs_o = _outputs(model, donor), _outputs(model, own)
        for edge in t.index:
            sender, receiver = edge.split("->")
            patched = _metric(model, own, task, _receiver_hooks(model, receiver, outs_d[sender] - outs_o[sender]))
            assert t.loc[edge, "score"] == pytest.approx(float((patched - base).mean()), rel=1e-4, abs=1e-5), edge
    assert t.score.abs().max() > 0.5 and r.meta["replay"] == "fast"


def test_exact_on_a_subset_leaves_the_rest_nan_and_refuses_an_unknown_edge():
    model = planted_model(n_ctx=64)
    r = edge_scores(model, "repeat", method="exact", edges=["1.0->logits", "0.0->1.0<k>"], config=FAST)
    assert int(r.table.score.notna().sum()) == 2 and r.meta["patched_edges"] == 2
    with pytest.raises(UsageError, match=r"edges=: '1.0->logit' is not an edge .* \(did you mean 1.0->logits\?\)"):
        edge_scores(model, "repeat", method="exact", edges=["1.0->logit"], config=FAST)
    with pytest.raises(UsageError, match="method=eap scores every edge at once; edges= picks"):
        edge_scores(model, "repeat", edges=["1.0->logits"], config=FAST)


def test_eap_equals_exact_edge_patching_where_the_metric_is_linear_in_the_receiver_input():
    torch.manual_seed(2)
    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=32, normalization_type=None)
    cfg.init_range = 0.6
    model = ToyTransformer(cfg).eval()
    task = task_probe(model, "repeat", n_pairs=5, seed=0)
    eap = edge_scores(model, task, metric="raw-logit-diff", config=FAST).table.set_index("edge")
    exact = edge_scores(model, task, method="exact", metric="raw-logit-diff", config=FAST).table.set_index("edge")
    linear = [e for e in eap.index if e.endswith("->logits") or (e.endswith("<v>") and e.split("->")[1][0] == "1")]
    scale = float(exact.loc[linear, "score"].abs().max())  # float32 sums of terms this large
    np.testing.assert_allclose(eap.loc[linear, "score"], exact.loc[linear, "score"], rtol=1e-4, atol=1e-5 * scale)
    assert scale > 10
    nonlinear = exact.index[exact.index.str.endswith("<k>")]  # through the softmax: they differ
    assert float((eap.loc[nonlinear, "score"] - exact.loc[nonlinear, "score"]).abs().max()) > 1e-3


# ---- circuit evaluation against EAP-IG's definition, written as plain hooks --------------------------


def _circuit_reference(
    model, task, keep_edges: set, zero: bool = False, donors=None, positions: bool = False
) -> torch.Tensor:
    """The clean prompts run; every receiver reads each sender outside the circuit at its output on
    the corrupted prompt (the rest as this run computes it): EAP-IG's evaluate_graph, as plain hooks
    (``zero``: at zero instead; ``donors``: on these prompts instead; ``positions``: the circuit is a
    set of (edge, position) pairs)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    graph = graph_of(model)
    table = graph.table()
    corrupted = _outputs(model, task.corrupted if donors is None else donors)
    if zero:
        corrupted = {k: torch.zeros_like(v) for k, v in corrupted.items()}
    actual: dict[str, torch.Tensor] = {}
    seen: dict[str, torch.Tensor] = {}

    def shift(receiver: str) -> torch.Tensor:
        if positions:  # keep_edges holds (edge, position) pairs: outside, the sender at that position only
            rows = table[table.receiver == receiver]
            T = task.seq_len
            out = [torch.tensor([(e, t) not in keep_edges for t in range(T)])[None, :, None] for e in rows.edge]
            return sum((o * (corrupted[s] - actual[s]) for o, s in zip(out, rows.sender)), torch.zeros(()))
        rows = table[(table.receiver == receiver) & ~table.edge.isin(keep_edges)]
        return sum((corrupted[s] - actual[s] for s in rows.sender), torch.zeros(()))

    def grab(name):
        def hook(x, hook):
            seen[name] = x
            if name == "input":
                actual["input"] = x
            elif name.startswith("z"):
                l = int(name[1:])
                for h in range(H):
                    actual[f"{l}.{h}"] = x[:, :, h] @ model.blocks[l].attn.W_O[h]
            elif name.startswith("mlp."):
                actual[name] = x

        return hook

    def heads(l, site):
        attn = model.blocks[l].attn
        W = attn._weight("qkv".index(site))
        n = W.shape[0]

        def hook(y, hook):
            y = y.clone()
            x = seen[f"x{l}"]
            for j in range(n):
                name = f"{l}.{j}<{site}>" if n == H else f"{l}.kv{j}<{site}>"
                y[:, :, j] += (model.blocks[l].ln1(x + shift(name)) - model.blocks[l].ln1(x)) @ W[j]
            return y

        return hook

    def mlp_in(l):
        def hook(y, hook):
            if seen.get("inside"):  # the norm called below runs this hook again
                return y
            seen["inside"] = True
            x = seen[f"mid{l}"]
            y = y + model.blocks[l].ln2(x + shift(f"mlp.{l}")) - model.blocks[l].ln2(x)
            seen["inside"] = False
            return y

        return hook

    hooks = [("blocks.0.hook_resid_pre", grab("input"))]
    for l in range(L):
        hooks += [(f"blocks.{l}.hook_resid_pre", grab(f"x{l}")), (f"blocks.{l}.attn.hook_z", grab(f"z{l}"))]
        hooks += [(f"blocks.{l}.attn.hook_{s}", heads(l, s)) for s in "qkv"]
        hooks += [(f"blocks.{l}.hook_resid_mid", grab(f"mid{l}")), (f"blocks.{l}.ln2.hook_normalized", mlp_in(l))]
        hooks += [(f"blocks.{l}.hook_mlp_out", grab(f"mlp.{l}"))]
    hooks.append((f"blocks.{L - 1}.hook_resid_post", lambda x, hook: x + shift("logits")))
    with torch.no_grad():
        return _metric(model, task.clean, task, hooks)


def test_circuit_evaluation_equals_eap_igs_definition_as_plain_hooks():
    model, task = _random_toy()
    graph = graph_of(model)
    names = list(graph.table().edge)
    ranked = list(
        edge_scores(model, task, metric="raw-logit-diff", direction="noise", config=FAST).top(len(names)).edge
    )
    rng = random.Random(0)  # the top edges (they hold paths from the input), some with random others
    circuits = [set(ranked[:5]), set(ranked[:15]) | set(rng.sample(names, 10)), set(ranked[:40])]
    circuits += [set(), set(names)]
    masks = [np.array([n in c for n in names]) for c in circuits]
    curve = evaluate_circuits(model, task, masks, metric="raw-logit-diff", config=FAST)
    clean = curve.meta["clean_metric"]
    empty = float(_circuit_reference(model, task, set()).mean())
    assert curve.meta["empty_metric"] == pytest.approx(empty, rel=1e-5)
    assert empty == pytest.approx(curve.meta["corrupted_metric"], rel=1e-5)  # nothing kept: the corrupted run
    for c, got in zip(circuits, curve.table.itertuples()):
        want = float(_circuit_reference(model, task, c).mean())
        assert got.metric == pytest.approx(want, rel=1e-5, abs=1e-5)
        assert got.faithfulness == pytest.approx((want - empty) / (clean - empty), rel=1e-4, abs=1e-5)
        assert got.faithfulness_lo <= got.faithfulness <= got.faithfulness_hi
    assert curve.table.faithfulness.iloc[-1] == pytest.approx(1.0) and curve.table.faithfulness.iloc[-2] == 0.0
    m = curve.table.metric.to_numpy()  # the two larger circuits are neither empty nor whole, nor alike
    assert min(abs(m[1] - m[2]), *abs(m[1:3, None] - m[None, 3:]).ravel()) > 0.02


def test_circuits_of_edges_at_positions_equal_plain_hooks_that_patch_those_positions_alone():
    """Codes by position on the replay (random sets of (edge, position) pairs, from a few to most),
    and the faithfulness curve of scores by position (its top pairs), against the plain hooks."""
    model, task = _random_toy()
    run = setup(model, task, metric="raw-logit-diff", direction="noise", config=FAST)
    graph = graph_of(model)
    names, T = list(graph.table().edge), task.seq_len
    rng = random.Random(2)
    units = [(e, t) for e in names for t in range(T)]
    circuits = [set(rng.sample(units, int(f * len(units)))) for f in (0.05, 0.5, 0.95)]
    where = graph.edges.T.nonzero()  # receiver-major, as the table
    codes = torch.zeros(len(circuits), len(graph.senders), len(graph.receivers), T, dtype=torch.int8)
    for i, c in enumerate(circuits):
        inside = torch.tensor([[(e, t) in c for t in range(T)] for e in names])
        codes[i, where[:, 1], where[:, 0]] = torch.where(inside, 0, SOURCE).to(torch.int8)
    got = EdgeSweeper(run, graph).evaluate(CodeUnits(graph, codes))
    want = [_circuit_reference(model, task, c, positions=True) for c in circuits]
    for value, reference in zip(got, want):
        torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-5)
    every = _circuit_reference(model, task, set(names))
    assert min(float((w - every).abs().max()) for w in want) > 0.05  # the positions left out matter

    per = edge_scores(model, task, by="position", metric="raw-logit-diff", direction="noise", config=FAST)
    curve = per.faithfulness_curve(model, task, metric="raw-logit-diff", refine=False, config=FAST)
    assert curve.meta["by"] == "position" and curve.meta["graph_units"] == len(units) == len(per.table)
    order = np.argsort(-per.table.score.abs().to_numpy(), kind="stable")
    rows = [row for row in curve.table.itertuples() if row.fraction in (0.05, 0.2)]
    assert len(rows) == 2
    for row in rows:
        kept = {units[i] for i in order[: row.size]}
        want = float(_circuit_reference(model, task, kept, positions=True).mean())
        assert row.metric == pytest.approx(want, rel=1e-5, abs=1e-5), row.fraction
    # the summary and the figure count pairs among the graph's pairs (not edges among its edges)
    n, E = 40, len(units)
    curve.meta["smallest_faithful"] = {"size": n, "n_edges": n, "fraction": n / E, "faithfulness": 0.85}
    assert curve.summary()[-1] == (
        f"smallest circuit reaching faithfulness 0.8: {n} (edge, position) pairs ({n / E:.2%} of the graph's {E:,}), "
        "faithfulness 0.850"
    )
    fig = curve.figure()
    assert fig.layout.xaxis.title.text == "share of the graph's (edge, position) pairs"
    star = next(t for t in fig.data if t.name.startswith("smallest reaching"))
    assert star.x[0] == pytest.approx(n / E) and star.name == f"smallest reaching 0.8: {n} (edge, position) pairs"
    with pytest.raises(UsageError, match=r"^how=greedy grows or cuts whole edges; by='position' keeps the top"):
        per.faithfulness_curve(model, task, how="greedy", config=FAST)
    from interp.circuits.circuit import faithfulness_curve

    short = per.table.score.to_numpy()[:-1]
    with pytest.raises(
        UsageError,
        match=rf"^{len(short)} scores for a graph of {len(names)} edges at {len(units):,} \(edge, position\) pairs: "
        r"score this model's graph \(edge_scores, by=position\)$",
    ):
        faithfulness_curve(model, task, short, by="position", metric="raw-logit-diff", config=FAST)


def test_the_mean_source_reads_the_corrupted_prompts_mean_everywhere_outside_the_circuit():
    model, task = _random_toy()
    run = setup(model, task, metric="raw-logit-diff", direction="noise", config=FAST)
    graph = graph_of(model)
    sweeper = EdgeSweeper(run, graph, source="mean")
    every = (graph.edges.to(torch.int8) * SOURCE)[None]
    got = sweeper.evaluate(CodeUnits(graph, every))[0]
    mean_in = _outputs(model, task.corrupted)["input"].mean(0, keepdim=True)  # the input held at its mean ...
    L = model.cfg.n_layers
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.attn.hook_z" for l in range(L)]
    names += [f"blocks.{l}.hook_mlp_out" for l in range(L)]
    with torch.no_grad():
        _, cache = model.run_with_cache(task.corrupted, names_filter=lambda n: n in names)
    means = {n: cache[n].mean(0, keepdim=True) for n in names}
    hooks = [(n, lambda x, hook: means[hook.name].expand_as(x)) for n in names]
    want = _metric(model, task.clean, task, hooks)  # ... and every node's output at its mean
    assert mean_in.shape[0] == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_zero_source_reads_zero_outside_the_circuit():
    """``source="zero"``: every receiver reads each sender outside the circuit at zero (a zero
    ablation of those edges, the input's embedding included), against the plain hooks; the empty
    circuit is the faithfulness's zero, as with every source."""
    model, task = _random_toy(dtype=torch.float64)  # float32 rounding, scaled up by the norms, differs by CPU
    graph = graph_of(model)
    names = list(graph.table().edge)
    ranked = list(edge_scores(model, task, metric="raw-logit-diff", config=FAST).top(len(names)).edge)
    inputs = {n for n in names if n.startswith("input")}
    # circuits that keep some of the input: with none of it every receiver reads only rounding
    # (the senders' outputs cancel), which a norm then scales up, in both computations alike
    circuits = [set(ranked[:20]) | inputs, set(ranked[:40]), set(ranked[:60]), set()]
    masks = [np.array([n in c for n in names]) for c in circuits]
    curve = evaluate_circuits(model, task, masks, source="zero", metric="raw-logit-diff", config=FAST)
    wants = [float(_circuit_reference(model, task, c, zero=True).mean()) for c in circuits]
    for got, want in zip(curve.table.metric[:3], wants[:3]):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (got, want)
    assert curve.meta["empty_metric"] == pytest.approx(wants[-1], abs=1e-4)  # nothing read: 0 within rounding
    patched = evaluate_circuits(model, task, masks[:1], metric="raw-logit-diff", config=FAST).table.metric.iloc[0]
    assert abs(wants[0] - patched) > 0.1 and abs(wants[0] - wants[-1]) > 0.1  # zero is neither patch nor empty


def test_the_resample_source_reads_another_pairs_prompt_outside_the_circuit():
    """``source="resample"``: every receiver reads each sender outside the circuit at its output on
    another pair's clean prompt (the run's seeded derangement), against the plain hooks; no pair reads
    itself; one pair is refused."""
    model, task = _random_toy(dtype=torch.float64)
    graph = graph_of(model)
    names = list(graph.table().edge)
    ranked = list(edge_scores(model, task, metric="raw-logit-diff", config=FAST).top(len(names)).edge)
    circuits = [set(ranked[:40]), set(ranked[:60]), set()]
    masks = [np.array([n in c for n in names]) for c in circuits]
    config = interp.RunConfig(n_boot=200, seed=3)
    curve = evaluate_circuits(model, task, masks, source="resample", metric="raw-logit-diff", config=config)
    order = derangement(task.n_pairs, 3)
    assert not (order == torch.arange(task.n_pairs)).any()
    wants = [float(_circuit_reference(model, task, c, donors=task.clean[order]).mean()) for c in circuits]
    for got, want in zip(curve.table.metric, wants):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (got, want)
    patched = evaluate_circuits(model, task, masks[:1], metric="raw-logit-diff", config=FAST).table.metric.iloc[0]
    assert abs(wants[0] - patched) > 0.05 and abs(wants[0] - wants[-1]) > 0.05  # neither patch nor empty
    with pytest.raises(UsageError) as e:
        evaluate_circuits(model, task_probe(model, "repeat", n_pairs=1, seed=1), masks[:1], source="resample")
    assert str(e.value) == (
        "source=resample reads each pair's senders on another pair's prompt: 1 pair cannot; use more pairs, "
        "or another source"
    )


@pytest.mark.parametrize("to, source", [("corrupted", "patch"), ("mean", "mean")])
def test_head_faithfulness_is_the_node_circuits_evaluation(to, source):
    """One meaning of each source: the faithfulness curve of the top ``n`` heads (every other head's
    output replaced) equals circuit evaluation of the node circuit that keeps every edge but those out
    of the other heads; ``mean`` is the position-wise mean over the corrupted prompts in both."""
    from interp.patching import faithfulness_curves, patch_heads

    model, task = _random_toy(dtype=torch.float64)
    ranking = patch_heads(model, task, config=FAST)
    ns = [0, 1, 3, 6, 8]
    curves = faithfulness_curves(model, task, {"exact": ranking}, to=to, ns=ns, config=FAST)
    t = ranking.table.sort_values(["effect", "layer", "head"], ascending=[False, True, True], kind="mergesort")
    order = [f"{l}.{h}" for l, h in zip(t["layer"], t["head"])]
    graph = graph_of(model)
    mlps = [f"mlp.{l}" for l in graph.shape.mlp_layers]
    nodes = [Circuit.of_nodes(graph, ["input", *order[:n], *mlps]) for n in ns]  # the other heads send nothing
    assert nodes[1].meta["nodes"] == ["input", order[0], *mlps] and nodes[1].meta["level"] == "node"
    circuits = evaluate_circuits(model, task, [c.in_circuit for c in nodes], source=source, config=FAST)
    np.testing.assert_allclose(circuits.table.metric, curves.table.metric, rtol=1e-9, atol=1e-9)
    assert np.ptp(curves.table.metric) > 0.1  # the curve moves: the comparison is not of constants


@pytest.mark.parametrize(
    "method, steps",
    [("eap-ig-inputs", 3), ("eap-ig-activations", 2), ("clean-corrupted", None)],
)
def test_each_gradient_method_gives_a_head_the_sum_of_its_edges_scores(method, steps):
    """One definition of each method, nodes and edges alike: patch_heads by edge attribution's method
    (its passes read at the heads' outputs) gives each head the sum of its edges' scores by that
    method (read at the receivers), per head and per position, both directions."""
    from interp.patching import patch_heads

    model, task = _random_toy(dtype=torch.float64)
    for direction in ("noise", "denoise"):
        kw = dict(method=method, steps=steps, direction=direction, metric="raw-logit-diff", config=FAST)
        scores = edge_scores(model, task, **kw)
        nodes = scores.node_scores().set_index("node")
        heads = patch_heads(model, task, **kw).table
        got = nodes.loc[[f"{l}.{h}" for l, h in zip(heads["layer"], heads["head"])], "score"].to_numpy()
        np.testing.assert_allclose(got, heads["effect"], rtol=1e-6, atol=1e-6)  # tables keep float32
        assert np.abs(heads["effect"]).max() > 0.5  # scores well above the tolerance
        per_edge = edge_scores(model, task, by="position", **kw).table
        per_edge = per_edge[per_edge.sender.str.fullmatch(r"\d+\.\d+")]
        want = per_edge.groupby(["sender", "position"])["score"].sum()
        per_head = patch_heads(model, task, by="position", **kw).table
        got = want.loc[[(f"{l}.{h}", p) for l, h, p in zip(per_head["layer"], per_head["head"], per_head["position"])]]
        np.testing.assert_allclose(got.to_numpy(), per_head["effect"], rtol=1e-6, atol=1e-6)
    eap = patch_heads(model, task, method="attribution", metric="raw-logit-diff", config=FAST).table["effect"]
    assert np.abs(heads["effect"] - eap).max() > 1e-3  # not attribution patching under another name


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_a_heads_node_score_is_its_attribution_and_the_top_nodes_make_a_node_circuit(direction):
    """One definition of attribution for nodes and edges: a head's EAP node score (the sum of its
    edges') equals patch_heads' attribution of it, the gradient path of node patching."""
    from interp.patching import patch_heads

    model, task = _random_toy(dtype=torch.float64)
    scores = edge_scores(model, task, direction=direction, metric="raw-logit-diff", config=FAST)
    nodes = scores.node_scores().set_index("node")
    heads = patch_heads(model, task, method="attribution", direction=direction, metric="raw-logit-diff", config=FAST)
    t = heads.table
    got = nodes.loc[[f"{l}.{h}" for l, h in zip(t["layer"], t["head"])], "score"].to_numpy()
    np.testing.assert_allclose(got, t["effect"], rtol=1e-5, atol=1e-6)
    assert np.abs(t["effect"]).max() > 0.5  # scores well above the tolerance
    assert list(nodes.index[:3]) == ["input", "0.0", "0.1"] and nodes.loc["mlp.1", "layer"] == 1
    circuit = scores.node_circuit(3)
    top = list(nodes.index[np.argsort(-nodes["abs_score"].to_numpy(), kind="stable")[:3]])
    assert circuit.meta["nodes"] == top and set(circuit.table[circuit.in_circuit].sender) == set(top)
    assert (circuit.table["score"] == scores.table["score"]).all()
    with pytest.raises(UsageError) as e:
        scores.node_circuit(12)
    assert str(e.value) == "n=12: a number of nodes from 0 to 11 (the graph's senders)"
    some = edge_scores(model, task, method="exact", edges=["1.0->logits"], metric="raw-logit-diff", config=FAST)
    assert some.node_scores()["score"].isna().all()  # every sender has an unscored edge
    with pytest.raises(UsageError, match=r"^some nodes have unscored edges \(exact scores of a subset of edges\?\)"):
        some.node_circuit(1)


def test_node_circuits_keep_every_edge_out_of_their_nodes_and_refuse_unknown_ones():
    graph = Graph(Shape(2, 4, 2, (0, 1)))
    circuit = Circuit.of_nodes(graph, ["input", "a0.h1", "L1H2", "mlp.0"])  # any spelling
    t = circuit.table
    assert set(t[t.in_circuit].sender) == {"input", "0.1", "1.2", "mlp.0"}
    assert t[t.sender.isin(["input", "0.1", "1.2", "mlp.0"])].in_circuit.all() and circuit.meta["nodes"][1] == "0.1"
    assert circuit.n_edges == int(t.sender.isin(["input", "0.1", "1.2", "mlp.0"]).sum()) > 0
    with pytest.raises(UsageError) as e:
        Circuit.of_nodes(graph, ["0.1", "2.0"])
    assert str(e.value) == (
        "nodes=: '2.0' is not a sender of this graph (11 senders, 19 receivers, 82 edges (2 layers x 4 heads, "
        "2 key/value heads, 2 MLPs)): name the input ('input'), heads ('0.1') and MLPs ('mlp.0')"
    )


# ---- extraction, pruning and MIB's areas --------------------------------------------------------


def test_pruning_keeps_only_edges_on_input_to_logits_paths_and_greedy_grows_from_the_logits():
    g = Graph(Shape(2, 2, 2, ()))  # two layers of two heads, no MLPs
    names = list(g.table().edge)
    keep = lambda *edges: np.array([n in edges for n in names])  # noqa: E731
    on_path = ("input->0.0<v>", "0.0->1.1<k>", "1.1->logits")
    # a sender nothing reaches (0.1), and a receiver that reaches nothing (1.0): both go
    dangling = ("0.1->1.1<q>", "input->1.0<q>")
    pruned = prune(g, keep(*on_path, *dangling))
    assert [n for n, k in zip(names, pruned) if k] == sorted(on_path, key=names.index)
    scores = np.zeros(len(names))
    for edge, value in {"1.1->logits": 5, "0.0->1.1<k>": -4, "input->0.0<v>": 3, "input->1.0<q>": 9}.items():
        scores[names.index(edge)] = value
    # the top 4 by |score| hold input->1.0<q> (9), whose head never reaches the logits: pruned to the chain;
    # the top 3 lack the chain's first edge: nothing reaches the logits from the input
    assert {n for n, k in zip(names, select(g, scores, "top", n=4)) if k} == set(on_path)
    assert int(select(g, scores, "top", n=3).sum()) == 0
    # greedy from the logits only takes edges into nodes already in: the chain, not the 9
    assert {n for n, k in zip(names, select(g, scores, "greedy", n=3)) if k} == set(on_path)
    assert {n for n, k in zip(names, select(g, scores, "threshold", threshold=3.5)) if k} == set()
    with pytest.raises(UsageError, match="how=threshold needs threshold="):
        select(g, scores, "threshold")


def test_unscored_edges_rank_below_every_scored_one():
    """Exact scores of a subset leave the rest NaN: neither the top n nor a threshold keeps one of
    them (they had read as |score| 1, above every score under 1)."""
    graph = graph_of(planted_model(n_ctx=64))
    scores = np.full(graph.n_edges, np.nan)
    names = list(graph.table().edge)
    for name, value in (("input->0.0<v>", 0.5), ("0.0->1.0<k>", 0.2), ("1.0->logits", -0.4)):
        scores[names.index(name)] = value
    unscored = np.isnan(scores)
    for keep in (select(graph, scores, "top", n=3), select(graph, scores, "threshold", threshold=0.1)):
        assert keep.sum() == 3 and not keep[unscored].any()
    assert select(graph, scores, "threshold", threshold=0.3).sum() == 0  # 0.2 breaks the chain: pruned


def test_mib_sizes_and_the_areas_of_a_known_curve():
    assert sizes_of(32491) == [32, 64, 162, 324, 649, 1624, 3249, 6498, 16245, 32491]
    f = np.array([0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.0])
    x = np.array(MIB_FRACTIONS)
    areas = [sum((x[i + 1] - x[i]) * (v[i] + v[i + 1]) / 2 for i in range(9)) for v in (f, abs(1 - f))]
    from interp.circuits.curve import trapezoid as _trapezoid

    assert _trapezoid(f, x) == pytest.approx(areas[0]) and _trapezoid(abs(1 - f), x) == pytest.approx(areas[1])
    assert areas[0] + areas[1] == pytest.approx(1 - 0.001)  # f in [0, 1]: the two areas fill the strip


# ---- the trained toy ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy():
    return interp.load_model("toy")


def test_trained_toy_exact_edges_are_the_induction_circuit(toy):
    # noising: the previous-token head 0.1 reading the token as its value, writing into the induction
    # heads' keys, and the induction heads writing the answer
    r = edge_scores(toy, "repeat", method="exact", direction="noise", config=FAST)
    top = list(r.top(5).edge)
    assert top[:3] == ["input->0.1<v>", "1.2->logits", "0.1->1.2<k>"]
    assert set(top[3:]) == {"1.1->logits", "0.1->1.1<k>"}
    assert (r.top(5).score_hi < 0).all() and (r.top(5).stability == 1).all()


def test_trained_toy_circuit_curve_is_monotone_enough_and_finds_a_faithful_circuit(toy, tmp_path):
    scores = edge_scores(toy, "repeat", method="exact", direction="noise", config=FAST)
    curve = scores.faithfulness_curve(toy, "repeat", config=FAST)
    mib = curve.table[curve.table.mib]
    assert mib.fraction.tolist() == list(MIB_FRACTIONS) and mib.faithfulness.iloc[-1] == pytest.approx(1.0)
    assert mib.faithfulness.iloc[0] == 0.0  # floor(0.001 * 81) = 0 edges: the empty circuit
    reach = curve.meta["smallest_faithful"]
    assert reach["faithfulness"] >= 0.8
    refined = curve.table[~curve.table.mib]
    below = curve.table[curve.table.n_edges < reach["n_edges"]]
    assert len(refined) and (below.faithfulness < 0.8).all()  # nothing smaller reached it
    assert 0 < curve.meta["cpr"] < 1 and curve.meta["cpr"] + curve.meta["cmd"] == pytest.approx(0.999, abs=1e-6)
    # two rounds of at most 8 sizes find what evaluating every size of the first bracket finds
    assert len(refined) <= REFINE * REFINE_SIZES
    sizes = mib["size"].tolist()
    first = next(i for i, f in enumerate(mib.faithfulness) if f >= 0.8)
    every = list(range(sizes[first - 1] + 1, sizes[first] + 1))
    scored = scores.table["score"].to_numpy()
    all_sizes = evaluate_circuits(toy, "repeat", [select(scores.graph, scored, "top", n=n) for n in every], config=FAST)
    assert len(every) > len(refined) + 1 and reach["size"] == every[int(np.argmax(all_sizes.table.faithfulness >= 0.8))]
    back = FaithfulnessCurve.load(curve.save(tmp_path)[1])
    assert back.table.equals(curve.table) and back.meta == curve.meta
    circuit = scores.circuit(reach["size"])
    assert circuit.n_edges == reach["n_edges"] and {"1.2->logits", "0.1->1.2<k>"} <= set(circuit.edges)
    again = Circuit.load(circuit.save(tmp_path)[1])
    assert again.edges == circuit.edges and again.graph.n_edges == 81
    # the figure marks the level 0.8, the smallest circuit reaching it and a chosen one with its CI
    chosen = scores.circuit(10)
    chosen.meta.update(faithfulness=0.25, faithfulness_ci=[0.125, 0.375])
    fig = curve.figure(chosen=chosen)
    assert [s.y0 for s in fig.layout.shapes] == [1.0, 0.0, 0.8]
    marks = {t.name: t for t in fig.data[1:]}
    star = marks[f"smallest reaching 0.8: {reach['n_edges']} edges"]
    assert star.x == (reach["n_edges"] / 81,) and star.y == (reach["faithfulness"],)
    diamond = marks[f"chosen: {chosen.n_edges} edges, faithfulness 0.250 [0.125, 0.375]"]
    assert diamond.x == (chosen.n_edges / 81,) and diamond.error_y.arrayminus == (0.125,)
    assert len(curve.figure().data) == 2  # nothing chosen: the curve and the star


def test_a_circuit_round_trips_through_eap_igs_json(toy, tmp_path):
    scores = edge_scores(toy, "repeat", direction="noise", config=FAST)
    circuit = scores.circuit(20)
    back = Circuit.from_eapig(circuit.to_json(), toy)
    assert back.edges == circuit.edges
    np.testing.assert_array_equal(back.table.score.to_numpy(np.float32), circuit.table.score.to_numpy(np.float32))


# ---- path patching on the replay equals Wang et al.'s two runs ------------------------------------


def _wang(model, task, sender, receiver, site, direction):
    """Wang et al.'s path patching as two plain hooked runs: every head frozen at its own run's output
    but the sender (the paired prompt's), the receiver's input recorded; then a free run with it."""
    L = model.cfg.n_layers
    own, donor = (task.corrupted, task.clean) if direction == "denoise" else (task.clean, task.corrupted)
    names = [f"blocks.{l}.attn.hook_z" for l in range(L)]
    with torch.no_grad():
        _, o = model.run_with_cache(own, names_filter=lambda n: n in names)
        _, d = model.run_with_cache(donor, names_filter=lambda n: n in names)
    sl, sh = sender

    def frozen(l):
        def hook(z, hook):
            z = o[names[l]].clone()
            if l == sl:
                z[:, :, sh] = d[names[l]][:, :, sh]
            return z

        return hook

    freeze = [(names[l], frozen(l)) for l in range(L)]
    if receiver == "logits":
        with torch.no_grad():
            return _metric(model, own, task, freeze)
    rl, rh = receiver
    point = f"blocks.{rl}.attn.hook_{site}"
    seen = {}
    with torch.no_grad():
        model.run_with_hooks(own, fwd_hooks=[*freeze, (point, lambda x, hook: seen.setdefault("x", x.clone()))])
        unit = rh // (model.cfg.n_heads // seen["x"].shape[2])

        def swap(x, hook):
            x = x.clone()
            x[:, :, unit] = seen["x"][:, :, unit]
            return x

        return _metric(model, own, task, [(point, swap)])


@pytest.mark.parametrize("direction", ["noise", "denoise"])
def test_path_patching_on_the_replay_equals_the_two_plain_runs(direction):
    from interp.patching.paths import path_patch

    model, task = _random_toy(n_layers=3, dtype=torch.float64)
    run = setup(model, task, metric="logit-diff", direction=direction, config=FAST)
    clean, corrupted = run.clean.double(), run.corrupted.double()
    for receivers, site in (("logits", "q"), ("1.1,2.2", "q"), ("1.0,2.3", "k"), ("2.1", "v")):
        paths = path_patch(model, task, receivers=receivers, site=site, direction=direction, config=FAST)
        t = paths.table.set_index(["sender", "receiver"])
        for (sender, receiver), row in t.iterrows():
            s = tuple(map(int, sender.split(".")))
            r = "logits" if receiver == "logits" else tuple(map(int, receiver.split(".")))
            if r != "logits" and r[0] <= s[0]:
                assert np.isnan(row.effect)
                continue
            m = _wang(model, task, s, r, site, direction).double()
            num = (m - corrupted) if direction == "denoise" else (clean - m)
            want = float(num.sum() / (clean - corrupted).sum())
            # the replay keeps each pair's metric in float32, as every sweep does: equal to its rounding
            assert row.effect == pytest.approx(want, rel=1e-6, abs=1e-7), (sender, receiver, site)
        assert np.nanmax(np.abs(paths.table.effect)) > 0.05


def test_a_model_with_a_writer_the_graph_does_not_name_is_refused():
    # a hidden writer: layer 1's residual also gets the mean of the embeddings over positions, by no sender
    # of the graph, so with every edge patched the logits still read the run's own tokens, not the source's
    model, task = _random_toy()
    keep = {}
    model.blocks[0].hook_resid_pre.add_hook(lambda x, hook: keep.__setitem__("x", x), is_permanent=True)
    model.blocks[1].hook_resid_pre.add_hook(lambda x, hook: x + keep["x"].mean(1, keepdim=True), is_permanent=True)
    with pytest.raises(
        UsageError,
        match=r"^exact edge patching cannot reproduce toy: with every edge patched a forward should give the "
        r"source's output, off by .*; its receivers may read inputs the graph does not name",
    ):
        edge_scores(model, task, method="exact", config=FAST)
