"""Sink and copying scores on grouped-query (GQA) models, and minibatched passes, against
computations by hand from the model's own hooks and weights."""

import pytest
import torch

from interp.config import RunConfig
from interp.heads import copying_scores, head_scores
from interp.hooks import pattern_hook, v_hook
from interp.probes import random_tokens, repeated_tokens
from interp.sinks import sink_scores
from interp.toy import ToyConfig, ToyTransformer
from tests.helpers import ov_only_model


@pytest.fixture(scope="module")
def gqa_toy():
    """4 query heads reading 2 key/value heads (query head h reads kv head h // 2), random weights
    large enough that heads differ."""
    torch.manual_seed(0)
    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, n_key_value_heads=2, d_vocab=64, n_ctx=64, init_range=0.5)
    return ToyTransformer(cfg).eval()


def _hooked(model, tokens, layer):
    seen = {}

    def keep(name):
        def hook(x, hook):
            seen[name] = x.detach().clone()

        return hook

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[(pattern_hook(layer), keep("p")), (v_hook(layer), keep("v"))])
    return seen["p"], seen["v"]


def test_sink_scores_on_gqa_map_query_heads_to_their_kv_head(gqa_toy):
    probe = random_tokens(gqa_toy, batch=3, seq_len=15)
    T = probe.seq_len
    table = sink_scores(gqa_toy, probe, config=RunConfig(n_boot=10)).heads.table.set_index(["layer", "head"])
    for layer in range(2):
        pattern, v = _hooked(gqa_toy, probe.tokens, layer)  # [b, 4, T, T], [b, T, 2, d_head]
        assert pattern.shape[1] == 4 and v.shape[2] == 2
        first = pattern[..., 0].sum(-1).mean(0) / T  # alpha_0: causal, every query sees key 0
        norms = v[:, 0].norm(dim=-1).mean(0)  # ||v_0|| per kv head
        for h in range(4):
            row = table.loc[(layer, h)]
            assert row["first_mass"] == pytest.approx(float(first[h]), rel=1e-5)
            assert row["value_norm_first"] == pytest.approx(float(norms[h // 2]), rel=1e-5)
        # the two kv heads differ, so a wrong head-to-group map would be caught
        assert abs(float(norms[0] - norms[1])) > 1e-2 * float(norms.max())


def test_copying_scores_on_gqa_pair_each_query_head_with_its_kv_head():
    """W_O of query head h is +-W_V[h // 2]^T: the OV circuit is a (negative) projection, +-1, only
    when the score pairs h with kv head h // 2 (pairing it with h % 2 gives neither)."""

    m = ov_only_model(4, "ov-gqa")
    W_V = torch.randn(1, 2, 8, 4)  # two kv heads
    m.W_V = W_V
    signs = [1.0, -1.0, 1.0, -1.0]
    m.W_O = torch.stack([signs[h] * W_V[0, h // 2].T for h in range(4)])[None]
    s = copying_scores(m)
    assert s[0].tolist() == pytest.approx(signs, abs=1e-5)


def test_copying_scores_on_the_gqa_toy_equal_the_full_ov_circuit(gqa_toy):
    """Against the full vocab x vocab OV circuit W_E W_V W_O W_U (the scores use a small equivalent)."""
    got = copying_scores(gqa_toy)
    W_E, W_U = gqa_toy.W_E.detach().double(), gqa_toy.W_U.detach().double()
    W_V, W_O = gqa_toy.W_V.detach().double(), gqa_toy.W_O.detach().double()
    # the toy's W_V is already one slice per query head: heads 0, 1 share kv head 0; 2, 3 kv head 1
    assert torch.equal(W_V[:, 0], W_V[:, 1]) and not torch.equal(W_V[:, 1], W_V[:, 2])
    for l in range(2):
        for h in range(4):
            full = W_E @ W_V[l, h] @ W_O[l, h] @ W_U
            eig = torch.linalg.eigvals(full)
            want = eig.real.sum() / eig.abs().sum()
            assert float(got[l, h]) == pytest.approx(float(want), abs=1e-4)


def test_minibatches_give_the_whole_batch_scores(gqa_toy):
    probe = repeated_tokens(gqa_toy, batch=5, block_len=8, seed=2)
    whole = head_scores(gqa_toy, probe, copying=False, config=RunConfig(n_boot=10))
    parts = head_scores(gqa_toy, probe, copying=False, config=RunConfig(n_boot=10, minibatch=2))
    first = head_scores(
        gqa_toy, repeated_tokens(gqa_toy, batch=2, block_len=8, seed=2), copying=False, config=RunConfig(n_boot=10)
    )
    for col in ("prev_token", "duplicate", "induction"):
        assert torch.allclose(torch.tensor(parts.grid(col)), torch.tensor(whole.grid(col)), atol=1e-6)
        # one minibatch alone differs by far more: a pass that kept only some would be caught
        assert abs(first.grid(col) - whole.grid(col)).max() > 1e-3
    sp = random_tokens(gqa_toy, batch=5, seq_len=15)
    s_whole = sink_scores(gqa_toy, sp, config=RunConfig(n_boot=10)).heads
    s_parts = sink_scores(gqa_toy, sp, config=RunConfig(n_boot=10, minibatch=2)).heads
    for col in ("first_mass", "value_norm_first", "confidence"):
        assert torch.allclose(torch.tensor(s_parts.grid(col)), torch.tensor(s_whole.grid(col)), rtol=1e-5)
