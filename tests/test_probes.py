import pytest
import torch

from interp.probes import repeated_tokens


def test_same_seed_same_tokens_and_structure(gpt2_tiny):
    a = repeated_tokens(gpt2_tiny, batch=3, block_len=7, n_repeats=3, seed=5)
    b = repeated_tokens(gpt2_tiny, batch=3, block_len=7, n_repeats=3, seed=5)
    c = repeated_tokens(gpt2_tiny, batch=3, block_len=7, n_repeats=3, seed=6)
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)
    assert a.tokens.shape == (3, 1 + 7 * 3)
    assert (a.tokens[:, 0] == 0).all()  # BOS
    body = a.tokens[:, 1:]
    assert torch.equal(body[:, :7], body[:, 7:14]) and torch.equal(body[:, :7], body[:, 14:])
    assert (body != 0).all()  # special tokens never drawn
    # within a block, no token repeats (the vocabulary is large enough)
    assert all(len(set(row[:7].tolist())) == 7 for row in body)


def test_masks_match_direct_definitions(gpt2_tiny):
    p = repeated_tokens(gpt2_tiny, batch=2, block_len=5, n_repeats=3, seed=1)
    toks = p.tokens.tolist()
    dup, ind = p.duplicate_mask(), p.induction_mask()
    for b, row in enumerate(toks):
        for q in range(len(row)):
            for k in range(len(row)):
                want_dup = k < q and row[k] == row[q] and row[q] != 0
                want_ind = 1 <= k <= q and row[k - 1] == row[q] and k - 1 < q and row[q] != 0
                assert bool(dup[b, q, k]) == want_dup, (b, q, k)
                assert bool(ind[b, q, k]) == want_ind, (b, q, k)
    # each query in repeat r >= 2 has exactly r - 1 induction targets
    per_q = ind.sum(-1)[0, 1:]
    assert per_q.tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert p.second_repeat_mask()[0].tolist() == [False] * 6 + [True] * 10


def test_encoder_probe_is_framed_cls_sep_and_bidirectional(bert_tiny):
    p = repeated_tokens(bert_tiny, batch=2, block_len=4, seed=0)
    assert not p.causal
    assert (p.tokens[:, 0] == 2).all() and (p.tokens[:, -1] == 3).all()  # [CLS] ... [SEP]
    dup = p.duplicate_mask()
    # position 1 (first block) sees its later copy at 5 as a duplicate in an encoder
    assert dup[0, 1, 5] and dup[0, 5, 1]
    assert not dup[:, 0].any() and not dup[:, -1].any()  # framing tokens are never targets


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch=0), "batch must be an integer >= 1, got 0"),
        (dict(block_len=0), "block_len must be an integer >= 1, got 0"),
        (dict(n_repeats=1), "n_repeats must be at least 2"),
        (
            dict(block_len=200, n_repeats=2),
            "probe of 401 tokens (BOS + 2 x 200) is longer than the model's context of 256 tokens: "
            "the longest block for 2 repeats is 127; pass block_len=127 or less",  # 2 repeats: none fewer
        ),
        (
            dict(block_len=100, n_repeats=3),
            "probe of 301 tokens (BOS + 3 x 100) is longer than the model's context of 256 tokens: "
            "the longest block for 3 repeats is 85; pass block_len=85 or less (or lower n_repeats=)",
        ),
    ],
)
def test_bad_probe_arguments(gpt2_tiny, kwargs, message):
    with pytest.raises(ValueError) as err:
        repeated_tokens(gpt2_tiny, **kwargs)
    assert str(err.value).startswith(message)
    assert ("lower n_repeats=" in str(err.value)) == (kwargs.get("n_repeats", 2) > 2)  # 2 is the fewest


def test_probe_constructors_have_one_implementation_and_the_old_names_warn(gpt2_tiny):
    import interp.probes as probes

    texts = ["w5 w6 w7 w8 w5 w6", "w9 w10 w11 w12 w9 w10"]
    by_class = probes.TokenProbe.from_texts(gpt2_tiny, texts)
    assert torch.equal(by_class.tokens, probes.probe_from_texts(gpt2_tiny, texts).tokens)
    body = by_class.tokens[:, 1:]
    assert torch.equal(probes.TokenProbe.from_tokens(gpt2_tiny, body).tokens, by_class.tokens)
    assert torch.equal(probes.probe_from_tokens(gpt2_tiny, body).tokens, by_class.tokens)
    for old, new in (("texts_probe", probes.probe_from_texts), ("tokens_probe", probes.probe_from_tokens)):
        with pytest.warns(DeprecationWarning, match=f"interp.probes.{old} is renamed {new.__name__}"):
            assert getattr(probes, old) is new
    assert "texts_probe" not in probes.__all__
