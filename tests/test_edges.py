"""Edge attribution (interp.circuits): the graph's edge counts, known answers on hand-set and trained
models, and equality with references computed here as plain loops (one forward per edge)."""

from __future__ import annotations

import random

import pytest
import torch

import interp
from interp.circuits import EdgeScores, Graph, Shape, count_edges, edge_scores, graph_of, validate_edge_scores
from interp.errors import UsageError
from interp.models import describe
from interp.patching.graph import refusal
from interp.probes.task import task_probe
from interp.toy.model import ToyConfig, ToyTransformer
from interp.toy.planted import planted_model

FAST = interp.RunConfig(n_boot=200)


def test_gpt2_small_graph_has_32491_edges_from_its_shape_alone():
    assert count_edges(12, 12) == 32491  # EAP-IG's Graph.from_model(gpt2) count
    # 1 + 144 + 12 senders; 3 * 144 head inputs + 12 MLPs + the logits
    g = Graph(Shape(12, 12, 12, tuple(range(12))))
    assert (len(g.senders), len(g.receivers)) == (157, 445)


def test_parallel_and_grouped_graphs_follow_the_model():
    # a parallel block's MLP does not read its own layer's heads: 12 edges fewer per layer
    assert count_edges(12, 12) - count_edges(12, 12, parallel=True) == 12 * 12
    # GQA: a key or value receiver is a key/value head, shared by its group
    g = Graph(Shape(2, 4, 2, (0, 1)))
    t = g.table()
    keys = t[(t.site == "k") & (t.receiver_layer == 1)]
    assert sorted(set(keys.receiver)) == ["1.kv0<k>", "1.kv1<k>"]
    assert set(keys[keys.receiver == "1.kv1<k>"].query_heads) == {"2 3"}
    # per layer: 4 q + 2 k + 2 v head receivers, then the MLP; senders upstream only
    assert g.n_edges == 8 * 1 + 5 + 8 * 6 + 10 + 11 == len(t)
    # only an MLP reads a sender of its own layer (its heads)
    same = t[t.sender_layer >= t.receiver_layer]
    assert set(same.site) == {"mlp"} and set(same.sender.str[:2]) == {"0.", "1."}


def test_a_model_the_graph_cannot_describe_is_refused_before_any_work():
    latent = ToyTransformer(ToyConfig(n_layers=1, d_model=16, n_heads=2, d_kv_latent=4, d_vocab=20, n_ctx=16))
    assert "latent" in refusal(latent, describe(latent))
    with pytest.raises(UsageError, match="cannot describe toy as a graph of edges: its keys and values"):
        edge_scores(latent, "repeat")


def test_bad_options_are_refused_with_the_parameter_named():
    with pytest.raises(UsageError, match="method=eap does not read steps="):
        validate_edge_scores(method="eap", steps=3)
    with pytest.raises(UsageError, match="steps=0: an integer >= 1"):
        validate_edge_scores(method="eap-ig-inputs", steps=0)
    with pytest.raises(UsageError, match="top=0"):
        validate_edge_scores(top=0)
    with pytest.raises(interp.InterpError, match="edge attribution method"):
        validate_edge_scores(method="acdc")


# ---- a hand-set model: the answer flows through one chain of edges ------------------------------


def test_planted_induction_chain_comes_out_first_and_nothing_else_scores():
    # 0.0 reads the token (its value) and writes it as the next position's "previous token"; 1.0's
    # keys read that, and 1.0 writes the copied token, which the unembedding reads: the chain
    # input -> 0.0<v>, 0.0 -> 1.0<k>, 1.0 -> logits
    model = planted_model(n_ctx=64)
    r = edge_scores(model, "repeat", config=FAST)
    chain = {"input->0.0<v>", "0.0->1.0<k>", "1.0->logits"}
    assert set(r.top(3).edge) == chain
    top = r.top(3)
    assert (top.score_lo > 1).all() and (top.stability == 1).all()
    rest = r.table[~r.table.edge.isin(chain)]
    assert rest.score.abs().max() < 0.01 * top.score.abs().min()
    # the chain to the logits is linear: it carries the whole clean-corrupted gap
    logit = r.table.set_index("edge").loc["1.0->logits", "score"]
    assert logit == pytest.approx(r.meta["gap"], rel=1e-4)


# ---- references: plain loops, one forward per edge ------------------------------------------------


def _outputs(model, tokens):
    """Every sender's output (d_model each) of a plain forward, keyed by node name."""
    L = model.cfg.n_layers
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.attn.hook_z" for l in range(L)]
    names += [f"blocks.{l}.hook_mlp_out" for l in range(L) if hasattr(model.blocks[l], "mlp")]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    out = {"input": cache["blocks.0.hook_resid_pre"]}
    for l in range(L):
        z, W_O = cache[f"blocks.{l}.attn.hook_z"], model.blocks[l].attn.W_O
        for h in range(model.cfg.n_heads):
            out[f"{l}.{h}"] = z[:, :, h] @ W_O[h]
        if hasattr(model.blocks[l], "mlp"):
            out[f"mlp.{l}"] = cache[f"blocks.{l}.hook_mlp_out"]
    return out


def _receiver_hooks(model, receiver: str, shift):
    """Hooks that give ``receiver`` alone the input ``x + shift`` (its norm and projection recomputed)."""
    seen = {}
    L = model.cfg.n_layers

    def keep(name):
        def hook(x, hook):
            seen[name] = x

        return hook

    if receiver == "logits":  # only the final norm reads the last block's output
        return [(f"blocks.{L - 1}.hook_resid_post", lambda x, hook: x + shift)]
    if receiver.startswith("mlp."):
        l = int(receiver[4:])

        def mlp_input(y, hook):
            if seen.get("inside"):  # the norm below runs this hook again
                return y
            seen["inside"] = True
            y = model.blocks[l].ln2(seen["x"] + shift)
            seen["inside"] = False
            return y

        return [(f"blocks.{l}.hook_resid_mid", keep("x")), (f"blocks.{l}.ln2.hook_normalized", mlp_input)]
    head, site = receiver[:-3], receiver[-2]
    l, j = int(head.split(".")[0]), int(head.split(".")[1].lstrip("kv"))
    attn = model.blocks[l].attn
    W = attn._weight("qkv".index(site))[j]  # [d_model, d_head]: head j's (or key/value head j's) own

    def moved(y, hook):
        y = y.clone()
        x = seen["x"]
        y[:, :, j] = y[:, :, j] + (model.blocks[l].ln1(x + shift) - model.blocks[l].ln1(x)) @ W
        return y

    return [(f"blocks.{l}.hook_resid_pre", keep("x")), (f"blocks.{l}.attn.hook_{site}", moved)]


def _metric(model, run_tokens, task, hooks):
    from interp.patching.metrics import task_metric

    metric, _ = task_metric(task)
    logits = model.run_with_hooks(run_tokens, fwd_hooks=hooks)
    return metric(metric.read(logits), run_tokens, None, None)


def reference_eap(model, task, edge: str, point_hooks=(), point_tokens=None):
    """d/de of the metric (mean over pairs) with the receiver's input moved by e (donor - own) sender
    output, at e = 0: one forward and backward per edge, at the run given by ``point_*``."""
    sender, receiver = edge.split("->")
    own, donor = task.corrupted, task.clean  # denoising
    delta = _outputs(model, donor)[sender] - _outputs(model, own)[sender]
    e = torch.zeros((), requires_grad=True)
    hooks = [*point_hooks, *_receiver_hooks(model, receiver, e * delta)]
    value = _metric(model, own if point_tokens is None else point_tokens, task, hooks).mean()
    (grad,) = torch.autograd.grad(value, e)
    return float(grad)


@pytest.fixture(scope="module")
def lngqa():
    """A random toy with LayerNorm, MLPs and grouped keys/values (4 query heads, 2 key/value heads)."""
    torch.manual_seed(0)
    cfg = ToyConfig(
        n_layers=2, d_model=32, n_heads=4, n_key_value_heads=2, attn_only=False, d_mlp=64, d_vocab=50, n_ctx=32
    )
    cfg.init_range = 0.5
    model = ToyTransformer(cfg).eval()
    task = task_probe(model, "repeat", n_pairs=6, seed=1)
    return model, task


@pytest.mark.parametrize("method", ["eap", "clean-corrupted", "eap-ig-inputs", "eap-ig-activations"])
def test_edge_scores_equal_the_plain_loop_on_random_edges(lngqa, method):
    model, task = lngqa
    r = edge_scores(model, task, method=method, steps=3 if "ig" in method else None, config=FAST)
    t = r.table.set_index("edge")
    assert len(t) == graph_of(model).n_edges
    picked = random.Random(0).sample(list(t.index), 10)
    picked += ["0.1->1.kv1<k>", "0.3->1.kv0<v>", "mlp.0->1.2<q>", "1.0->mlp.1", "input->logits", "mlp.1->logits"]
    donor = task.clean  # denoising: the corrupted prompts run
    for edge in picked:
        if method == "eap":
            ref = reference_eap(model, task, edge)
        elif method == "clean-corrupted":
            ref = (reference_eap(model, task, edge) + reference_eap(model, task, edge, point_tokens=donor)) / 2
        elif method == "eap-ig-inputs":  # EAP-IG's points: k / m for k = 0 .. m - 1
            ref = sum(reference_eap(model, task, edge, _moved(model, ["input"], donor, k / 3)) for k in range(3)) / 3
        else:  # each node layer alone, k / m for k = 1 .. m
            nodes = [["input"], ["z0"], ["mlp.0"], ["z1"], ["mlp.1"]]
            points = [_moved(model, n, donor, k / 3) for n in nodes for k in (1, 2, 3)]
            ref = sum(reference_eap(model, task, edge, p) for p in points) / len(points)
        assert t.loc[edge, "score"] == pytest.approx(ref, rel=1e-4, abs=1e-6), edge
    assert t.score.abs().max() > 1e-2  # the scores compared are not all zero


def _moved(model, nodes, donor_tokens, alpha):
    """The hooks of an integrated-gradients point: the nodes' outputs (``input``, ``z{l}`` a layer's
    heads, ``mlp.{l}`` an MLP) at ``donor + alpha (own - donor)``."""
    name = {"input": "blocks.0.hook_resid_pre"}
    name.update({f"z{l}": f"blocks.{l}.attn.hook_z" for l in range(model.cfg.n_layers)})
    name.update({f"mlp.{l}": f"blocks.{l}.hook_mlp_out" for l in range(model.cfg.n_layers)})
    names = [name[n] for n in nodes]
    with torch.no_grad():
        _, cache = model.run_with_cache(donor_tokens, names_filter=lambda n: n in names)
    return [(n, lambda x, hook, d=cache[n]: d + alpha * (x - d)) for n in names]


def test_eap_equals_exact_edge_patching_where_the_metric_is_linear_in_the_receiver_input():
    # attention-only, no norm: the logit difference is linear in the final residual and, with the
    # patterns fixed by the queries and keys, in the last layer's values
    torch.manual_seed(2)
    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=32, normalization_type=None)
    cfg.init_range = 0.6
    model = ToyTransformer(cfg).eval()
    task = task_probe(model, "repeat", n_pairs=5, seed=0)
    t = edge_scores(model, task, config=FAST).table.set_index("edge")
    own, donor = task.corrupted, task.clean
    with torch.no_grad():
        base = _metric(model, own, task, []).mean()
        delta = {k: _outputs(model, donor)[k] - v for k, v in _outputs(model, own).items()}
        edges = [e for e in t.index if e.endswith("->logits") or e.endswith("<v>") and e.split("->")[1][0] == "1"]
        assert len(edges) == 9 + 4 * 5
        for edge in edges:
            sender, receiver = edge.split("->")
            exact = _metric(model, own, task, _receiver_hooks(model, receiver, delta[sender])).mean() - base
            assert t.loc[edge, "score"] == pytest.approx(float(exact), rel=1e-4, abs=1e-6), edge
    assert t.loc[edges, "score"].abs().max() > 0.1


# ---- position-specific edges ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["eap", "eap-ig-inputs"])
def test_edge_scores_per_position_sum_to_the_edges_scores(method, monkeypatch):
    """LayerNorm, MLPs and grouped keys/values: each edge's rows per position add up to its score,
    and the node scores are the same either way (the positions contracted in chunks of 4)."""
    from tests.test_circuits import _random_toy

    model, task = _random_toy()
    kw = {"steps": 3} if method != "eap" else {}
    edges = edge_scores(model, task, method=method, config=FAST, **kw)
    monkeypatch.setattr("interp.circuits.passes.CHUNK", 4)
    per = edge_scores(model, task, method=method, by="position", config=FAST, **kw)
    T, t = task.seq_len, per.table
    assert per.by == "position" and per.meta["by"] == "position" and edges.by == "edge"
    assert len(t) == T * len(edges.table) and (t.position.to_numpy() == list(range(T)) * len(edges.table)).all()
    assert (t.edge.to_numpy()[::T] == edges.table.edge.to_numpy()).all()
    summed = torch.tensor(t.score.to_numpy()).reshape(-1, T).sum(1)
    want = torch.tensor(edges.table.score.to_numpy())
    torch.testing.assert_close(summed, want, rtol=0, atol=1e-6 * float(want.abs().max()))
    assert float(want.abs().max()) > 0.1 and (t.groupby("edge").score.apply(lambda s: (s != 0).sum()) > 1).any()
    nodes, per_nodes = edges.node_scores(), per.node_scores()
    assert (nodes.node == per_nodes.node).all()
    torch.testing.assert_close(
        torch.tensor(per_nodes.score.to_numpy()), torch.tensor(nodes.score.to_numpy()), atol=1e-6, rtol=1e-5
    )


def test_eap_per_position_equals_exact_patching_at_that_position_where_the_metric_is_linear():
    # attention-only, no norm (as the per-edge test above): patching a sender's output at one position,
    # as one receiver reads it there, moves the metric by that edge and position's score (the model in
    # float64; the metric reads float32 logits of order 100, so the reference's differences carry their
    # rounding: 1.5e-5 here)
    torch.manual_seed(2)
    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, d_vocab=40, n_ctx=32, normalization_type=None)
    cfg.init_range = 0.6
    model = ToyTransformer(cfg).eval().double()
    task = task_probe(model, "repeat", n_pairs=5, seed=0)
    t = edge_scores(model, task, by="position", config=FAST).table.set_index(["edge", "position"])
    own, donor = task.corrupted, task.clean
    with torch.no_grad():
        base = _metric(model, own, task, []).mean()
        delta = {k: _outputs(model, donor)[k] - v for k, v in _outputs(model, own).items()}
        edges = ["1.0->logits", "1.3->logits", "input->logits", "0.2->1.1<v>", "input->1.3<v>"]
        checked = 0
        for edge in edges:
            sender, receiver = edge.split("->")
            for p in range(task.seq_len):
                at = torch.zeros_like(delta[sender])
                at[:, p] = delta[sender][:, p]
                exact = _metric(model, own, task, _receiver_hooks(model, receiver, at)).mean() - base
                assert t.loc[(edge, p), "score"] == pytest.approx(float(exact), rel=1e-4, abs=5e-5), (edge, p)
                checked += abs(float(exact)) > 0.01
    assert checked >= 6  # several positions of several edges move the metric, not only the last


def test_scores_per_position_refuse_what_takes_a_score_per_edge(tmp_path):
    model = planted_model(n_ctx=64)
    with pytest.raises(UsageError, match=r"^by='tokens': 'edge' \(a score per edge, summed over positions\) or "):
        edge_scores(model, "repeat", by="tokens")
    with pytest.raises(
        UsageError,
        match=r"^method=exact patches each edge at every position at once; by='position' takes an attribution "
        r"method \(eap, eap-ig-inputs, eap-ig-activations, clean-corrupted\)$",
    ):
        validate_edge_scores(method="exact", by="position")
    per = edge_scores(model, "repeat", by="position", config=FAST)
    per.save(tmp_path)
    back = EdgeScores.load(tmp_path)
    assert back.table.equals(per.table) and back.meta == per.meta and back.by == "position"
    why = r"takes a score per edge; these scores are per edge and position \(by='position'\): score with by='edge'"
    for call, what in (
        (lambda: per.circuit(10), "a circuit"),
        (lambda: per.node_circuit(2), "a node circuit"),
        (lambda: back.figure(), "the graph figure"),
    ):
        with pytest.raises(UsageError, match=f"^{what} {why}"):
            call()


# ---- the trained toy ------------------------------------------------------------------------------


def test_trained_toy_repeat_puts_layer1_heads_to_logits_and_0_1_to_layer1_keys_on_top():
    # noising (EAP-IG's own convention: run clean, corrupted as donor): the induction heads' writes
    # to the logits first, then head 0.1 (the toy's previous-token head) into layer 1's keys
    model = interp.load_model("toy")
    r = edge_scores(model, "repeat", direction="noise", config=FAST)
    top = r.top(10)
    assert set(top.edge[:2]) == {"1.2->logits", "1.1->logits"}
    assert (top.score_hi[:2] < 0).all() and (top.stability[:2] == 1).all()
    keys = set(top.edge[top.edge.str.startswith("0.1->1.") & top.edge.str.endswith("<k>")])
    assert {"0.1->1.3<k>", "0.1->1.1<k>"} <= keys
    # every layer-1 head's write to the logits lowers the metric when noised; none of layer 0's does as much
    logits = r.table[r.table.receiver == "logits"].set_index("sender").score
    assert (logits[[f"1.{h}" for h in range(4)]] < 0).all()
    assert logits[[f"0.{h}" for h in range(4)]].abs().max() < logits[["1.1", "1.2"]].abs().min()


def test_edge_scores_round_trip_and_stability_is_a_share_of_resamples(tmp_path):
    r = edge_scores(planted_model(n_ctx=64), "repeat", config=FAST, top=3)
    r.save(tmp_path)
    back = EdgeScores.load(tmp_path)
    assert back.table.equals(r.table) and back.meta == r.meta
    assert r.meta["n_edges"] == len(r.table) == count_edges(2, 4, mlp=False)
    assert r.meta["model"] == "planted" or r.meta["model"]
    # exactly three edges score: each is in every resample's top 3, nothing else is
    assert sorted(r.table.stability.tolist())[-3:] == [1.0, 1.0, 1.0]
    assert r.table.stability.sum() == pytest.approx(3.0)


@pytest.mark.parametrize("case", ["heavy", "ties at zero", "nan"])
def test_stability_is_each_resamples_top_edges_counted_directly(case, monkeypatch):
    """Stability forms the means of the edges whose largest |score| could put them on top: the same
    shares as every resample's top edges taken from every edge's mean (heavy-tailed scores, fewer
    edges scoring than the top asks for, an unscored edge)."""
    from interp.circuits import edges

    gen = torch.Generator().manual_seed(3)
    n, E, top, n_boot = 12, 5000, 20, 300
    x = torch.randn(n, E, generator=gen, dtype=torch.float64) * torch.rand(E, generator=gen, dtype=torch.float64) ** 6
    if case == "ties at zero":
        x[:, 15:] = 0.0
    if case == "nan":
        x[:, 7] = float("nan")
    formed = []
    real = edges._top_means
    monkeypatch.setattr(edges, "_top_means", lambda d, v, e, *a: formed.append(len(e)) or real(d, v, e, *a))
    got = edges.stability(x, top, n_boot=n_boot, seed=5)
    idx = torch.randint(n, (n_boot, n), generator=torch.Generator().manual_seed(5))
    tops = torch.stack([x[rows].mean(0).abs().topk(top).indices for rows in idx])
    want = torch.bincount(tops.flatten(), minlength=E).double() / n_boot
    assert torch.equal(got.double(), want.float().double())
    assert got.sum() == pytest.approx(top)
    assert (got > 0).sum() > top or case == "ties at zero"  # the top differs between resamples
    if case == "heavy":
        assert formed[-1] < E / 4  # most edges' means never formed
    if case == "nan":
        assert formed == [E] and got[7] == 1.0  # NaN ranks first, as topk ranks it


def test_a_run_that_would_not_fit_is_refused_with_the_estimate_before_any_forward(monkeypatch):
    from interp import memory
    from interp.circuits import edges

    model = planted_model(n_ctx=64)
    monkeypatch.setattr(memory, "free_bytes", lambda device: 10_000)  # far below one pass's estimate
    ran = []
    monkeypatch.setattr(edges.GradientPasses, "all_pairs", lambda *a: ran.append(1))
    with pytest.raises(
        UsageError,
        match=r"edge attribution needs about .* for the per-pair edge scores, .* per forward of 20 .*: use fewer pairs \(n_pairs=\)",
    ):
        edge_scores(model, "repeat", config=FAST)
    assert not ran


def test_gpt2_config_sizes_give_its_edge_count_without_weights():
    from transformers import GPT2Config

    cfg = GPT2Config()  # GPT-2 small's sizes; no model built
    assert count_edges(cfg.n_layer, cfg.n_head) == 32491


def test_integration_steps_are_taken_one_at_a_time_with_progress_within_them(monkeypatch, capsys):
    # a huge --steps is neither built as a list of points up front (1e9 of them: MemoryError after
    # half a minute) nor silent: the sizes line says the passes and the bar counts them as they go
    from interp import progress
    from interp.circuits import edges

    model, config = planted_model(n_ctx=64), interp.RunConfig(n_boot=20, progress=True)
    with progress.lines():
        edge_scores(model, "repeat", method="eap-ig-inputs", steps=4, n_pairs=4, config=config)
    err = capsys.readouterr().err
    assert "1 minibatch(es) of 4 forward and backward pass(es) each" in err
    assert [l.split(",")[0] for l in err.splitlines() if l.startswith("edge attribution (eap-ig-inputs): ")][1:] == [
        "edge attribution (eap-ig-inputs): 1/4 (25%)",
        "edge attribution (eap-ig-inputs): 2/4 (50%)",
        "edge attribution (eap-ig-inputs): 3/4 (75%)",
        "edge attribution (eap-ig-inputs): 4/4 (100%)",
    ]

    class Enough(Exception):
        pass

    contract, done = edges.GradientPasses._contract, []

    def counted(self, *a):
        done.append(1)
        if len(done) == 3:
            raise Enough
        return contract(self, *a)

    monkeypatch.setattr(edges.GradientPasses, "_contract", counted)
    with progress.lines(), pytest.raises(Enough):
        edge_scores(model, "repeat", method="eap-ig-inputs", steps=10**9, n_pairs=4, config=config)
    assert "of 1,000,000,000 forward and backward pass(es) each" in capsys.readouterr().err
