import math

import pytest
import torch
from transformer_lens.head_detector import detect_head

from interp.config import RunConfig
from interp.errors import UsageError
from interp.heads import NonFiniteAttentionError, copying_scores, head_scores, uniform_baseline
from interp.probes import repeated_tokens
from interp.scores import bootstrap_ratio
from tests.helpers import ov_only_model


@pytest.mark.parametrize(
    "ours, theirs",
    [("prev_token", "previous_token_head"), ("duplicate", "duplicate_token_head"), ("induction", "induction_head")],
)
def test_all_queries_variant_equals_transformerlens_detect_head(gpt2_tiny, ours, theirs):
    """With queries='all' our reduction is TransformerLens's 'mul' measure: same numbers."""
    probe = repeated_tokens(gpt2_tiny, batch=1, block_len=20, n_repeats=3, seed=3)
    text = " ".join(f"w{t}" for t in probe.tokens[0, 1:].tolist())
    assert torch.equal(gpt2_tiny.to_tokens(text)[0], probe.tokens[0])
    expected = detect_head(gpt2_tiny, text, theirs, error_measure="mul")
    got = head_scores(gpt2_tiny, probe, scores=[ours], copying=False, queries="all", config=RunConfig(n_boot=10))
    assert torch.allclose(torch.tensor(got.grid(ours)).float(), expected.float(), atol=1e-6)


def test_targets_variant_rescales_by_scored_queries(gpt2_tiny):
    """Our default averages over the queries that have a target: 'all' x n / n_targets."""
    probe = repeated_tokens(gpt2_tiny, batch=1, block_len=20, n_repeats=2, seed=0)
    a = head_scores(gpt2_tiny, probe, copying=False, queries="all", config=RunConfig(n_boot=10))
    t = head_scores(gpt2_tiny, probe, copying=False, config=RunConfig(n_boot=10))
    n = probe.seq_len
    assert torch.allclose(torch.tensor(t.grid("induction")), torch.tensor(a.grid("induction")) * n / 20)
    assert torch.allclose(torch.tensor(t.grid("prev_token")), torch.tensor(a.grid("prev_token")) * n / (n - 1))


def test_random_weights_sit_at_uniform_baseline(gpt2_tiny):
    probe = repeated_tokens(gpt2_tiny, batch=8, block_len=30, seed=0)
    scores = head_scores(gpt2_tiny, probe, config=RunConfig(n_boot=200))
    base = uniform_baseline(probe)
    assert 0.01 < base < 0.05
    induction = scores.table["induction"]
    assert ((induction - base).abs() < 0.25 * base).all(), (base, induction.tolist())
    assert (scores.table["induction_lo"] <= induction + 1e-9).all()
    assert (scores.table["induction_hi"] >= induction - 1e-9).all()
    assert scores.table["copying"].abs().max() < 0.6


def test_encoder_scores_run_and_stay_in_range(bert_tiny):
    probe = repeated_tokens(bert_tiny, batch=4, block_len=10, seed=0)
    s = head_scores(bert_tiny, probe, config=RunConfig(n_boot=50))
    for col in ("prev_token", "duplicate", "induction"):
        assert s.table[col].between(0, 1).all()
    # bidirectional uniform attention over 22 keys gives 1/22 per target
    assert s.table["prev_token"].sub(1 / probe.seq_len).abs().max() < 0.02


def test_forward_stops_after_last_pattern(gpt2_tiny):
    fired = []
    probe = repeated_tokens(gpt2_tiny, batch=1, block_len=5)
    with gpt2_tiny.hooks(fwd_hooks=[("ln_final.hook_normalized", lambda x, hook: fired.append(1))]):
        head_scores(gpt2_tiny, probe, copying=False, config=RunConfig(n_boot=10))
    assert fired == []


def test_non_finite_attention_is_reported(gpt2_tiny):
    probe = repeated_tokens(gpt2_tiny, batch=1, block_len=5)

    def poison(pattern, hook):
        return pattern * float("nan")

    with gpt2_tiny.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", poison)]):
        with pytest.raises(NonFiniteAttentionError, match="layer 1: the attention pattern holds NaN or inf"):
            head_scores(gpt2_tiny, probe, copying=False, config=RunConfig(n_boot=10))


def test_copying_score_is_plus_one_for_a_pure_copying_circuit():
    """An OV circuit W_E W_V W_O W_U that is a positive multiple of a projection scores +1, its negative -1."""

    m = ov_only_model(2, "ov")
    W_V = torch.randn(1, 2, 8, 4)
    m.W_V = W_V
    m.W_O = torch.stack([W_V[0, 0].T, -W_V[0, 1].T])[None]  # head 0: W_V W_V^T (PSD), head 1: minus
    s = copying_scores(m)
    assert s[0, 0] == pytest.approx(1.0, abs=1e-5)
    assert s[0, 1] == pytest.approx(-1.0, abs=1e-5)


def test_bootstrap_interval_matches_normal_approximation():
    gen = torch.Generator().manual_seed(0)
    hits = (torch.rand(400, generator=gen) < 0.3).float()
    point, lo, hi = bootstrap_ratio(hits, torch.ones(400), n_boot=4000, seed=1)
    se = math.sqrt(point * (1 - point) / 400)
    assert float(point) == pytest.approx(float(hits.mean()))
    assert float(hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.15)
    same = bootstrap_ratio(torch.full((5,), 2.0), torch.full((5,), 4.0), n_boot=100)
    assert [float(x) for x in same] == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("causal", [True, False])
def test_every_registered_score_has_pairs_equal_to_its_mask_and_a_baseline(causal):
    from interp.heads import ATTENTION_SCORES, SCORES, uniform_baselines
    from interp.probes import TokenProbe

    assert ATTENTION_SCORES == SCORES.names()
    block = torch.randint(1, 12, (2, 20), generator=torch.Generator().manual_seed(0))
    tokens = torch.cat([torch.zeros(2, 1, dtype=torch.long), block.repeat(1, 2)], 1)
    probe = TokenProbe(tokens, 1, 40, causal, frozenset({0}), block_len=20, n_repeats=2)
    keys = torch.arange(1, 42).float() if causal else torch.full((41,), 41.0)
    baselines = uniform_baselines(probe)
    assert set(baselines) == set(SCORES.names())
    for name in SCORES:
        score = SCORES.get(name)
        for queries in ("targets", "all"):
            pairs, mask = score.pairs(probe, queries), score.mask(probe, queries)
            assert sorted(map(tuple, pairs.tolist())) == sorted(map(tuple, mask.nonzero().tolist())), (name, queries)
        mask = score.mask(probe, "targets")
        has = mask.any(-1)
        assert baselines[name] == pytest.approx(float((mask.sum(-1) / keys)[has].mean()), rel=1e-6), name
        assert SCORES.doc(name)


def test_head_scores_options_are_checked_without_a_model():
    from interp.heads import validate_head_scores

    with pytest.raises(UsageError) as e:
        validate_head_scores(queries="some")
    assert str(e.value) == "queries= must be one of ['targets', 'all'], got 'some'" and e.value.params == ("queries",)
    with pytest.raises(UsageError, match=r"unknown head score\(s\) \['nope'\]"):
        validate_head_scores(scores=["nope"])
    validate_head_scores(scores=["induction"], queries="all")
