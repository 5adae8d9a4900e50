"""Encoder heads and entropy: a hand-set encoder with a [SEP] head and a next-token head; both are
found, and a head with zero weights (uniform attention) scores exactly every baseline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.config import RunConfig
from interp.probes import probe_from_tokens
from interp.roles.encoder import encoder_scores, head_map, js_distance
from interp.toy import ToyConfig, ToyTransformer
from tests.helpers import word_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V, N, SHARP = 30, 16, 200.0  # vocabulary, context, match logit before the 1/sqrt(d_head) scale
CONST = V + N  # a coordinate that is 1 in every token's embedding


def set_head(attn, head, W_Q, W_K):
    d, H = attn.d_head, attn.n_heads
    attn.W_qkv.weight.data[head * d : (head + 1) * d] = W_Q.T
    attn.W_qkv.weight.data[H * d + head * d : H * d + (head + 1) * d] = W_K.T


def hand_set_encoder() -> ToyTransformer:
    """Residual [token one-hot | position one-hot | 1]. Head 0.0 attends to [SEP] (its query is the
    constant, its key "I am [SEP]"); head 0.1 to the next position; head 0.2 has zero weights."""
    cfg = ToyConfig(
        n_layers=1, d_model=V + N + 1, n_heads=3, d_head=N, n_ctx=N, d_vocab=V, causal=False, normalization_type=None
    )
    model = ToyTransformer(cfg)
    model.tokenizer = word_tokenizer(V, bert=True)  # [PAD] [UNK] [CLS] [SEP] [MASK] w5 ... w29
    sep = model.tokenizer.sep_token_id
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.weight[:, :V] = torch.eye(V)
        model.embed.weight[:, CONST] = 1.0
        model.pos_embed.weight[:, V : V + N] = torch.eye(N)
        attn = model.blocks[0].attn
        W_Q, W_K = torch.zeros(cfg.d_model, N), torch.zeros(cfg.d_model, N)
        W_Q[CONST, 0], W_K[sep, 0] = SHARP, 1.0
        set_head(attn, 0, W_Q, W_K)
        W_Q, W_K = torch.zeros(cfg.d_model, N), torch.zeros(cfg.d_model, N)
        W_Q[V : V + N] = SHARP * torch.eye(N)  # "I am at i"
        W_K[V + 1 : V + N, : N - 1] = torch.eye(N - 1)  # "I am at i + 1"
        set_head(attn, 1, W_Q, W_K)
    return model.eval()


@pytest.fixture(scope="module")
def setup():
    model = hand_set_encoder()
    body = torch.randint(5, V, (6, 12), generator=torch.Generator().manual_seed(0))
    probe = probe_from_tokens(model, body)  # [CLS] 12 tokens [SEP]
    freq = torch.arange(V, 0, -1).double()  # higher ids are rarer
    return model, probe, encoder_scores(model, probe, frequencies=freq, config=RunConfig(n_boot=200))


def test_sep_head_and_next_token_head_are_found(setup):
    _, _, s = setup
    assert s.grid("sep")[0, 0] > 0.999
    assert s.grid("next")[0, 1] > 0.999
    assert s.grid("positional")[0, 1] == pytest.approx(13 / 14)  # every query but [SEP] looks one ahead
    assert s.grid("positional_offset")[0, 1] == 1
    assert s.grid("positional")[0, 1] >= s.meta["positional_threshold"]
    assert s.grid("entropy")[0, 0] < 1e-3  # all on one key
    assert s.grid("cls")[0, 0] < 1e-6 and s.grid("next")[0, 0] < 0.1


def test_uniform_head_scores_every_baseline_exactly(setup):
    _, _, s = setup
    base = s.meta["baselines"]
    for name in ["cls", "sep", "prev", "own", "next", "entropy", "positional", "rare_word"]:
        assert s.grid(name)[0, 2] == pytest.approx(base[name], rel=1e-5), name
    assert base["sep"] == pytest.approx(1 / 14)
    assert base["entropy"] == pytest.approx(np.log(14))
    assert np.isnan(s.grid("punct")).all()  # the word tokenizer holds no punctuation: said, not guessed
    assert any(n.startswith("punct: no query of this probe sees such a key") for n in s.meta["notes"])


def test_rare_word_head_reads_the_frequency_table(setup):
    """The [SEP] head attends to [SEP], a special token, never a rare word; with a table where every
    body token is equally rare, the uniform head's rare-word score is its whole body share."""
    model, probe, s = setup
    assert s.grid("rare_word")[0, 0] == 0.0
    flat = encoder_scores(
        model, probe, scores=["sep"], frequencies={t: 1 for t in range(V)}, config=RunConfig(n_boot=10)
    )
    assert flat.grid("rare_word")[0, 2] == pytest.approx(12 / 14)


def test_head_map_puts_the_uniform_head_between_and_is_symmetric(setup):
    model, probe, _ = setup
    m = head_map(model, probe)
    d = m.distance
    np.testing.assert_allclose(d, d.T)
    np.testing.assert_allclose(np.diag(d), 0, atol=1e-6)
    # per query: 12 rows one-hot on different keys (distance 1), the row before [SEP] where both look
    # at [SEP] (0), and [SEP]'s own row, where the next-token head has no next and attends uniformly
    hot, uniform = torch.zeros(14), torch.full((14,), 1 / 14)
    hot[0] = 1
    assert d[0, 1] == pytest.approx((12 + float(js_distance(hot, uniform))) / 14, rel=1e-5)
    assert 0 < d[0, 2] < d[0, 1]
    fig = m.figure()
    assert list(fig.data[0].text) == ["0.0", "0.1", "0.2"]


def test_js_distance_known_values():
    p = torch.tensor([1.0, 0.0])
    q = torch.tensor([0.0, 1.0])
    assert float(js_distance(p, q)) == pytest.approx(1.0)
    assert float(js_distance(p, p)) == 0.0
    u = torch.tensor([0.5, 0.5])
    # JSD([1,0],[.5,.5]) = 0.5 * log2(4/3) + 0.5 * (0.5 log2(2/3) + 0.5 log2(2)) ... computed directly:
    m = torch.tensor([0.75, 0.25])
    jsd = 0.5 * (1 * np.log2(1 / 0.75)) + 0.5 * (0.5 * np.log2(0.5 / 0.75) + 0.5 * np.log2(0.5 / 0.25))
    assert float(js_distance(p, u)) == pytest.approx(jsd**0.5)
    assert m.sum() == 1


def test_decoder_next_token_is_nan_saying_why():
    torch.manual_seed(0)
    model = ToyTransformer(ToyConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=40, n_ctx=16)).eval()
    probe = probe_from_tokens(model, torch.randint(1, 40, (3, 10)))
    s = encoder_scores(model, probe, scores=["next", "own"], frequencies=torch.ones(40), config=RunConfig(n_boot=10))
    assert np.isnan(s.grid("next")).all()
    assert (
        "next: no query of this probe sees such a key (a causal model never sees the next token)" in s.meta["notes"][0]
    )
    assert s.grid("own").min() > 0


def test_roles_are_named_from_the_encoder_scores(setup):
    from interp.report.roles import role_table

    _, _, s = setup
    roles = role_table(s, s.meta["baselines"]).set_index("label")["role"]
    assert roles.to_dict() == {"0.0": "[SEP]", "0.1": "next-token, positional", "0.2": ""}
