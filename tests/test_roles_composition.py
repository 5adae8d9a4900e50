"""Composition scores: equal to TransformerLens's ``all_composition_scores``, a hand-set induction
pair found by K-composition alone, the toy's induction heads reading the previous-token head."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import interp
from interp.config import RunConfig
from interp.errors import UsageError
from interp.roles import Compositions, composition_scores
from interp.toy import ToyConfig, ToyTransformer
from tests.helpers import gpt2_model, word_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
D = 8  # head width of the hand-set model


def set_head(attn, head, **weights):
    """Write one head's ``W_Q``/``W_K``/``W_V`` ([d_model, d_head]) or ``W_O`` ([d_head, d_model])."""
    d, H = attn.d_head, attn.n_heads
    q, k, v = attn.W_qkv.weight.data.split([H * d, H * d, H * d], dim=0)
    for name, fused in (("W_Q", q), ("W_K", k), ("W_V", v)):
        if name in weights:
            fused[head * d : (head + 1) * d] = weights[name].T
    if "W_O" in weights:
        attn.W_out.weight.data[:, head * d : (head + 1) * d] = weights["W_O"].T


def block(d_model: int, rows: slice) -> torch.Tensor:
    """A ``[d_model, D]`` map reading (or, transposed, writing) the coordinates ``rows``."""
    w = torch.zeros(d_model, D)
    w[rows] = torch.eye(D)
    return w


def induction_pair() -> ToyTransformer:
    """Random heads, except 0.0 (reads coordinates 0-7, writes 8-15) and 1.0, whose keys read 8-15
    while its queries read 16-23 and its values 24-31: pure K-composition of 0.0 into 1.0."""
    torch.manual_seed(3)
    cfg = ToyConfig(n_layers=2, d_model=48, n_heads=3, d_head=D, d_vocab=40, n_ctx=16, attn_only=True)
    model = ToyTransformer(cfg)
    with torch.no_grad():
        set_head(model.blocks[0].attn, 0, W_V=block(48, slice(0, 8)), W_O=block(48, slice(8, 16)).T)
        reads = {"W_K": slice(8, 16), "W_Q": slice(16, 24), "W_V": slice(24, 32)}
        set_head(model.blocks[1].attn, 0, **{k: block(48, s) for k, s in reads.items()})
    return model.eval()


@pytest.mark.parametrize("family", ["gpt2", "llama"])  # llama: rotary, 2 key-value heads for 4 query heads
def test_equals_transformer_lens_all_composition_scores(family):
    if family == "gpt2":
        bridge, pairs = interp.models.from_hf_model(gpt2_model(n_layer=3), word_tokenizer()), 3
    else:
        from tests.conformance import build

        bridge, pairs = interp.models.from_hf_model(*build(family)), 1
    ours = composition_scores(bridge, n_random=20)
    for kind in "QKV":
        ref = bridge.all_composition_scores(kind).scores.detach().double()  # [layer, head, layer, head]
        grid = torch.from_numpy(ours.grid(kind)).reshape(ref.shape)
        scored = ~torch.isnan(grid)
        assert int(scored.sum()) == pairs * 16  # layer pairs x 4 x 4 heads
        assert ref[scored].abs().min() > 0.05  # the comparison is of real numbers, not zeros
        assert (grid[scored] - ref[scored]).abs().max() < 1e-5
        assert (ref[~scored] == 0).all()  # TransformerLens writes 0 where we leave the pair out


def test_hand_set_induction_pair_is_pure_k_composition_and_the_rest_is_at_baseline():
    c = composition_scores(induction_pair(), n_random=400)
    t = c.table.set_index(["kind", "src", "dst"])
    assert t.loc[("K", "0.0", "1.0"), "z"] > 10
    assert t.loc[("K", "0.0", "1.0"), "score"] == pytest.approx(1 / D**0.5)  # two aligned rank-8 identities
    assert t.loc[("Q", "0.0", "1.0"), "score"] < 1e-12
    assert t.loc[("V", "0.0", "1.0"), "score"] < 1e-12
    rest = c.table[~((c.table["src"] == "0.0") & (c.table["dst"] == "1.0"))]
    assert len(rest) == 3 * 8
    assert rest["z"].abs().max() < 3.5
    assert c.strongest("K", dst=(1, 0), top=1)["src"].item() == "0.0"


def test_toy_induction_heads_read_the_previous_token_head_by_k_composition():
    c = composition_scores(interp.load_model("toy"), n_random=50)
    for head in range(4):  # 1.0 - 1.3 are the toy's induction heads, 0.1 its previous-token head
        top = c.strongest("K", dst=(1, head), top=1).iloc[0]
        assert top["src"] == "0.1"
        assert top["z"] > 10


def test_baseline_is_scale_free_and_reproducible():
    a = composition_scores(induction_pair(), kinds=["K"], n_random=50, config=RunConfig(seed=1))
    b = composition_scores(induction_pair(), kinds=["K"], n_random=50, config=RunConfig(seed=1))
    assert a.meta["baselines"] == b.meta["baselines"]
    assert a.meta["baselines"]["K"]["sd"] > 0


def test_saves_and_loads(tmp_path):
    c = composition_scores(induction_pair(), n_random=10)
    c.save(tmp_path)
    back = Compositions.load(tmp_path)
    np.testing.assert_allclose(back.grid("K"), c.grid("K"))
    assert back.meta["notes"] == c.meta["notes"]


def test_rotary_and_grouped_models_say_what_the_score_ignores():
    from tests.conformance import build

    hf, tok = build("llama")  # rotary, 2 key-value heads for 4 query heads
    c = composition_scores(interp.models.from_hf_model(hf, tok), n_random=10)
    notes = " ".join(c.meta["notes"])
    assert "rotary positions" in notes and "relative offset 0" in notes
    assert "every 2 query heads share one W_K and W_V" in notes


def test_latent_attention_is_refused_saying_why():
    from tests.conformance import build

    hf, tok = build("deepseek_v3")
    with pytest.raises(UsageError, match="multi-head latent attention: keys and values come out of one shared"):
        composition_scores(interp.models.from_hf_model(hf, tok))


def test_unknown_kind_is_refused():
    with pytest.raises(UsageError, match=r"unknown composition kind\(s\) \['X'\]: choose from \['Q', 'K', 'V'\]"):
        composition_scores(induction_pair(), kinds=["X"])


def test_pair_scores_block_by_block_equal_all_at_once():
    from interp.roles.composition import pair_scores

    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 4, 32, 8, generator=g, dtype=torch.float64)
    B = torch.randn(3, 4, 8, 32, generator=g, dtype=torch.float64)
    whole = pair_scores(A, B, A, B)
    assert whole.shape == (3, 4, 3, 4)
    # one right head a pass: the same products, blocked otherwise, so equal within a few ulps (not bit for
    # bit: a GEMM's kernel may sum in another order for another batch size, e.g. with AVX-512)
    blocked = pair_scores(A, B, A, B, budget=1)
    ulp = torch.finfo(torch.float64).eps
    torch.testing.assert_close(blocked, whole, rtol=8 * ulp, atol=0)
    assert not torch.allclose(blocked * (1 + 1e-13), whole, rtol=8 * ulp, atol=0)  # the bound is a few ulps


def test_saved_compositions_read_back_bit_for_bit(tmp_path):
    scores = interp.composition_scores(interp.load_model("toy"), n_random=20)
    scores.save(tmp_path)
    back = type(scores).load(tmp_path)
    assert back.table.equals(scores.table) and back.meta == json.loads(json.dumps(scores.meta))
