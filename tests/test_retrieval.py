"""Needle probes, the planted long-context model and the retrieval / streaming / copy-distance scores.

Sizes stay at 1-2K tokens: the pattern engine holds one layer's T x T pattern. The planted model's
32K claim is checked here from its weights (one query row per planted head over all 32K keys);
the full 32K run needs the stream engine.
"""

from __future__ import annotations

import math

import pytest
import torch

from interp.config import RunConfig
from interp.errors import UsageError
from interp.hooks import pattern_hook
from interp.probes.needle import copy_distance_probe, needle_probe
from interp.retrieval import copy_distance_scores, retrieval_counts, retrieval_scores
from interp.toy.model import ToyConfig, ToyTransformer
from interp.toy.planted import PREV_TOKEN, RETRIEVAL, STREAMING, planted_model


@pytest.fixture(scope="module")
def planted():
    return planted_model(2049)


@pytest.fixture(scope="module")
def needles(planted):
    return needle_probe(planted, seq_len=1024, depths=(0.0, 0.3, 0.7, 1.0), needle_len=6, batch=2, seed=3)


# ---- the needle probe ------------------------------------------------------------------------


def test_pairs_are_exact_and_needles_unique(needles):
    b, q, k = needles.retrieval_pairs().unbind(-1)
    assert len(b) == 2 * 4 * 5  # rows x needles x (needle_len - 1) steps
    assert torch.equal(needles.tokens[b, k], needles.tokens[b, q + 1])  # the key holds the token predicted
    assert bool((k < q).all())
    b, q, k = needles.copy_induction_pairs().unbind(-1)
    assert torch.equal(needles.tokens[b, k - 1], needles.tokens[b, q])  # key follows the earlier occurrence
    for m in range(needles.n_needles):  # each needle token occurs exactly twice: needle and copy
        row = needles.tokens[needles.needle_row[m]]
        span = row[needles.needle_pos[m] : needles.needle_pos[m] + 6]
        assert len(span.unique()) == 6
        assert all(int((row == t).sum()) == 2 for t in span)


def test_depths_are_honoured(needles):
    hay = 1024 - 2 * 4 * 6
    expected = [1 + round(d * hay) + rank * 6 for rank, d in enumerate((0.0, 0.3, 0.7, 1.0))]
    assert needles.meta["needle_positions"] == expected
    assert needles.needle_pos[:4].tolist() == expected
    assert needles.copy_pos[:4].tolist() == [1 + 1024 - 24 + 6 * i for i in range(4)]
    assert needles.needle_pos[3] + 6 == needles.copy_pos[0]  # depth 1: the needle closes the haystack


def test_seeded(planted):
    a, b = (needle_probe(planted, seq_len=256, batch=2, seed=5) for _ in range(2))
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, needle_probe(planted, seq_len=256, batch=2, seed=6).tokens)


def test_given_haystack_keeps_needles_unique(planted):
    ids = torch.arange(1, 64).repeat(20)  # every ordinary token occurs in the haystack
    probe = needle_probe(planted, seq_len=512, depths=(0.5,), needle_len=4, batch=1, haystack=ids)
    assert probe.meta["replaced"] > 0
    row = probe.tokens[0]
    for t in row[probe.needle_pos[0] : probe.needle_pos[0] + 4]:
        assert int((row == t).sum()) == 2


def test_select_keeps_needles_with_their_rows(needles):
    sub = needles.select([1])
    assert sub.n_needles == 4 and sub.needle_row.tolist() == [0] * 4
    assert torch.equal(sub.tokens[0], needles.tokens[1])
    b, q, k = sub.retrieval_pairs().unbind(-1)
    assert torch.equal(sub.tokens[b, k], sub.tokens[b, q + 1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"depths": (0.5, 1.5)},
            "depth must be within [0, 1] (0: the needle opens the haystack, 1: it closes it), got 1.5",
        ),
        (
            {"depths": (-0.1,)},
            "depth must be within [0, 1] (0: the needle opens the haystack, 1: it closes it), got -0.1",
        ),
        (
            {"seq_len": 20, "depths": (0.5,), "needle_len": 8},
            "needle of 8 tokens is longer than the haystack of 4 tokens (seq_len 20 - 1 needle(s) x 8 tokens "
            "x 2 for needle and copy): raise seq_len or lower needle_len",
        ),
        (
            {"seq_len": 4096},
            "probe of 4097 tokens (BOS + 4096) is longer than the model's context of 2049 tokens: "
            "the longest seq_len is 2048",
        ),
        (
            {"needle_len": 1},
            "needle_len must be at least 2 (a copy step is scored when the token before it is a needle token), got 1",
        ),
    ],
)
def test_bad_input(planted, kwargs, message):
    with pytest.raises(UsageError) as e:
        needle_probe(planted, **kwargs)
    assert str(e.value) == message


# ---- the planted model and the scores --------------------------------------------------------


def test_planted_heads_found(planted, needles):
    scores = retrieval_scores(planted, needles, window=64, config=RunConfig(n_boot=200))
    t = scores.table.set_index(["layer", "head"])
    assert t.loc[RETRIEVAL, "retrieval"] >= 0.99 and t.loc[RETRIEVAL, "retrieval_lo"] >= 0.99
    assert t.loc[RETRIEVAL, "retrieval_mass"] >= 0.99
    others = t.drop(index=[RETRIEVAL])
    assert (others["retrieval"] <= 0.01).all() and (others["retrieval_mass"] <= 0.01).all()
    assert t.loc[RETRIEVAL, "role"] == "retrieval"
    assert t.loc[STREAMING, "role"] == "streaming" and t.loc[STREAMING, "streaming"] >= 0.999
    assert t.loc[PREV_TOKEN, "role"] == "streaming"  # a local head keeps all its mass in the window
    silent = t.drop(index=[RETRIEVAL, STREAMING, PREV_TOKEN])
    assert (silent["role"] == "neither").all() and (silent["streaming"] < 0.3).all()
    assert scores.meta["retrieval_threshold"] == 0.1 and scores.meta["streaming_threshold"] == 0.9


def _full_pattern_reference(model, probe, sink, window):
    """Hits per needle, target mass and sink + window share, from whole cached patterns."""
    _, cache = model.run_with_cache(probe.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    L, H, T = model.cfg.n_layers, model.cfg.n_heads, probe.seq_len
    hits = torch.zeros(probe.n_needles, L, H, dtype=torch.float64)
    mass = torch.zeros(L, H, dtype=torch.float64)
    pairs, ids = probe.retrieval_pairs(), probe.retrieval_needles()
    q_idx = torch.arange(T)[:, None]
    k_idx = torch.arange(T)[None, :]
    band = (k_idx < sink) | ((k_idx > q_idx - window) & (k_idx <= q_idx))  # [q, k], small T only
    share = torch.zeros(L, H, dtype=torch.float64)
    for l in range(L):
        pattern = cache[pattern_hook(l)].double()
        for (b, q, k), m in zip(pairs.tolist(), ids.tolist()):
            for h in range(H):
                row = pattern[b, h, q]
                hits[m, l, h] += float(int(torch.argmax(row)) == k)
                mass[l, h] += row[k]
        share[l] = (pattern * band).sum(-1)[:, :, sink + window :].mean((0, 2))
    return hits, mass / len(pairs), share


@pytest.mark.parametrize("which", ["planted", "random", "gpt2"])
def test_scores_equal_full_pattern_computation(planted, which, request):
    seq_len, window = 512, 32
    if which == "planted":
        model = planted
    elif which == "random":
        cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, n_ctx=600, d_vocab=64, init_range=0.5, use_flash=False)
        torch.manual_seed(1)
        model = ToyTransformer(cfg).eval()
    else:  # a TransformerLens bridge goes through the same code
        model, seq_len, window = request.getfixturevalue("gpt2_tiny"), 200, 16
    probe = needle_probe(model, seq_len=seq_len, depths=(0.2, 0.9), needle_len=5, batch=2, seed=0)
    sink = 4
    counts = retrieval_counts(model, probe, sink=sink, window=window, config=RunConfig(minibatch=1))
    hits, mass, share = _full_pattern_reference(model, probe, sink, window)
    assert torch.equal(counts.hits, hits)
    scores = retrieval_scores(model, probe, sink=sink, window=window, config=RunConfig(n_boot=50))
    got = lambda col: torch.tensor(scores.grid(col), dtype=torch.float64)
    assert torch.allclose(got("retrieval"), hits.sum(0) / (probe.n_needles * 4), atol=1e-6, rtol=0)
    assert torch.allclose(got("retrieval_mass"), mass, atol=1e-6, rtol=0)
    assert torch.allclose(got("streaming"), share, atol=1e-6, rtol=0)
    if which != "planted":  # the check bites: shares are spread, not all 0 or 1
        assert 0.05 < float(share.min()) and float(share.max()) < 0.95


def test_copy_distance(planted):
    probe = copy_distance_probe(planted, (16, 64, 256, 1024), span=4, batch=1)
    b, q, k = probe.retrieval_pairs().unbind(-1)
    assert (q + 1 - k).tolist() == [d for d in (16, 64, 256, 1024) for _ in range(3)]
    table = copy_distance_scores(planted, probe).set_index(["layer", "head", "distance"])
    assert len(table) == 2 * 4 * 4
    ret = table.loc[RETRIEVAL]
    assert (ret["induction"] > 0.999).all() and (ret["retrieval"] == 1.0).all()
    silent = table.loc[(1, 1)]
    assert torch.allclose(torch.tensor(silent["induction"].to_numpy()), torch.tensor(silent["uniform"].to_numpy()))
    assert (silent["retrieval"] == 0).all()


def test_streaming_needs_a_long_enough_probe(planted):
    probe = needle_probe(planted, seq_len=256, batch=1)
    with pytest.raises(UsageError) as e:
        retrieval_scores(planted, probe, window=1024)
    assert str(e.value) == (
        "probe of 257 tokens is too short for sink 4 + window 1024: every query sees all its keys; "
        "lower the window or lengthen the probe"
    )


def test_planted_heads_stay_hard_at_32k():
    """Layer 0's planted heads, last query row against all 32K keys, straight from the weights."""
    model = planted_model()
    T = model.cfg.n_ctx
    assert T >= 32768
    resid = model.pos_embed.weight + model.embed.weight[torch.zeros(T, dtype=torch.long)]
    attn = model.blocks[0].attn
    with torch.no_grad():
        for (_, head), target in ((PREV_TOKEN, [T - 2]), (STREAMING, [0, T - 1])):
            q = resid[-1] @ attn.W_Q[head]
            k = resid @ attn.W_K[head]
            scores = (k @ q).double() * attn.scale
            assert scores[target].min() - scores.topk(len(target) + 1).values[-1] > 40
            assert float(scores.softmax(-1)[target].sum()) > 1 - 1e-9
    assert math.log(T) < 11


def test_retrieval_options_are_checked_without_a_model():
    from interp.errors import UsageError
    from interp.retrieval import validate_retrieval_scores

    for kw, message, param in (
        (dict(sink=-1), "sink= must be >= 0, got -1", "sink"),
        (dict(window=0), "window= must be >= 1, got 0", "window"),
        (dict(window=2.5), "window= must be an integer, got 2.5", "window"),
    ):
        with pytest.raises(UsageError) as e:
            validate_retrieval_scores(**kw)
        assert str(e.value) == message and e.value.params == (param,)
    validate_retrieval_scores(sink=0, window=None)
