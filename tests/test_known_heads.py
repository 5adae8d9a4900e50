"""Known answers: a toy transformer whose heads are set by hand.

Residual stream layout (d_model = V + N + V): [current token one-hot | position one-hot |
previous token one-hot]. Layer 0 head 0 is an exact previous-token head (query position i matches
key position i - 1) that copies the previous token into the third slot; layer 1 head 0 is an exact
induction head (query token matches the key's *previous* token). Heads 0.1 and 1.1 have all-zero
weights: uniform attention, nothing written.
"""

import pytest
import torch

from interp.config import RunConfig
from interp.heads import head_scores, uniform_baseline
from interp.probes import repeated_tokens
from interp.toy import ToyConfig, ToyTransformer

V, N, SHARP = 24, 32, 200.0  # vocabulary, context, match logit before the 1/sqrt(d_head) scale


def _set_head(attn, head, W_Q=None, W_K=None, W_V=None, W_O=None):
    """Write one head's [d_model, d_head] / [d_head, d_model] weights into the fused projections."""
    d_head, H = attn.d_head, attn.n_heads
    q, k, v = attn.W_qkv.weight.data.split([H * d_head, H * d_head, H * d_head], dim=0)
    for fused, w in ((q, W_Q), (k, W_K), (v, W_V)):
        if w is not None:
            fused[head * d_head : (head + 1) * d_head] = w.T
    if W_O is not None:
        attn.W_out.weight.data[:, head * d_head : (head + 1) * d_head] = W_O.T


def planted_model() -> ToyTransformer:
    cfg = ToyConfig(
        n_layers=2,
        d_model=2 * V + N,
        n_heads=2,
        d_head=N,
        n_ctx=N,
        d_vocab=V,
        attn_only=True,
        normalization_type=None,
        use_flash=False,
    )
    model = ToyTransformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        tok, pos, prev = slice(0, V), slice(V, V + N), slice(V + N, 2 * V + N)
        model.embed.weight[:, tok] = torch.eye(V)
        model.pos_embed.weight[:, pos] = torch.eye(N)
        eye = torch.eye(N)
        # layer 0 head 0: query "I am at i", key "I am at j + 1"; value: my token -> previous slot
        W_Q = torch.zeros(cfg.d_model, N)
        W_Q[pos] = SHARP * eye
        W_K = torch.zeros(cfg.d_model, N)
        W_K[pos] = torch.roll(eye, shifts=1, dims=1)
        W_K[V + N - 1] = 0  # the last position has no successor (undo the roll's wrap-around)
        W_V = torch.zeros(cfg.d_model, N)
        W_V[tok, :V] = torch.eye(V)
        W_O = torch.zeros(N, cfg.d_model)
        W_O[:V, prev] = torch.eye(V)
        _set_head(model.blocks[0].attn, 0, W_Q, W_K, W_V, W_O)
        # layer 1 head 0: query "my token is t", key "my previous token is t"
        W_Q = torch.zeros(cfg.d_model, N)
        W_Q[tok, :V] = SHARP * torch.eye(V)
        W_K = torch.zeros(cfg.d_model, N)
        W_K[prev, :V] = torch.eye(V)
        _set_head(model.blocks[1].attn, 0, W_Q, W_K)
    return model.eval()


@pytest.fixture(scope="module")
def planted():
    return planted_model()


def test_planted_heads_rank_first_with_scores_above_09(planted):
    probe = repeated_tokens(planted, batch=6, block_len=12, n_repeats=2, seed=0)
    s = head_scores(planted, probe, config=RunConfig(n_boot=200))
    assert s.top("prev_token") == (0, 0)
    assert s.top("induction") == (1, 0)
    assert s.grid("prev_token")[0, 0] > 0.99
    assert s.grid("induction")[1, 0] > 0.99
    # the CI of an exact head is tight around its score
    row = s.table.set_index("label").loc["1.0"]
    assert row["induction_lo"] > 0.99
    # the zero-weight heads attend uniformly: they sit exactly at the uniform baseline
    base = uniform_baseline(probe)
    assert s.grid("induction")[0, 1] == pytest.approx(base, rel=1e-4)
    assert s.grid("induction")[1, 1] == pytest.approx(base, rel=1e-4)
    # and the two planted heads are not what they are not: the previous-token head never looks
    # at induction targets; the induction head, on first-repeat queries (no match yet), attends
    # uniformly, so its previous-token score is exactly the mean of 1 / (i + 1) over those rows
    assert s.grid("induction")[0, 0] < 1e-6
    first_repeat = sum(1 / (i + 1) for i in range(1, 13))
    assert s.grid("prev_token")[1, 0] == pytest.approx(first_repeat / 24, rel=1e-4)


def test_more_repeats_every_earlier_occurrence_counts(planted):
    """With 3 repeats the induction head splits its attention over the two earlier copies: still ~1."""
    probe = repeated_tokens(planted, batch=4, block_len=8, n_repeats=3, seed=1)
    s = head_scores(planted, probe, config=RunConfig(n_boot=50), copying=False)
    assert s.grid("induction")[1, 0] > 0.99
    assert s.grid("duplicate")[1, 0] < 0.05
