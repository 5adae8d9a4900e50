"""OV circuit roles from weights: a hand-set copy-suppression head and a hand-set successor head
are found, every other (random) head scores at its chance level, and the refusals say why."""

from __future__ import annotations

import pytest
import torch

from interp.config import RunConfig
from interp.errors import UsageError
from interp.roles.ov import MIN_SUCCESSOR_PAIRS, ordinal_sequences, ov_scores
from interp.toy import ToyConfig, ToyTransformer
from tests.helpers import word_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V = 64  # vocabulary = model width: token codes are the one-hot basis
SEQUENCE = list(range(10, 30))  # an ordinal sequence of 20 tokens


def set_ov(attn, head, W_V, W_O):
    d, H = attn.d_head, attn.n_heads
    attn.W_qkv.weight.data[2 * H * d + head * d : 2 * H * d + (head + 1) * d] = W_V.T
    attn.W_out.weight.data[:, head * d : (head + 1) * d] = W_O.T


def roles_model() -> ToyTransformer:
    """Token codes one-hot (W_E = W_U = I); head 0.0 has W_OV = -I (copy suppression), head 0.1
    the shift t -> t + 1 on :data:`SEQUENCE` (successor); layer 1's heads are random."""
    torch.manual_seed(1)
    cfg = ToyConfig(n_layers=2, d_model=V, n_heads=2, d_head=V, d_vocab=V, n_ctx=8, attn_only=True)
    model = ToyTransformer(cfg)
    with torch.no_grad():
        model.embed.weight.copy_(torch.eye(V))
        model.unembed.weight.copy_(torch.eye(V))
        set_ov(model.blocks[0].attn, 0, torch.eye(V), -torch.eye(V))
        shift = torch.zeros(V, V)
        for a, b in zip(SEQUENCE, SEQUENCE[1:]):
            shift[a, b] = 1.0
        set_ov(model.blocks[0].attn, 1, torch.eye(V), shift)
    return model.eval()


@pytest.fixture(scope="module")
def scores():
    return ov_scores(roles_model(), k=5, sequences={"hand-set": SEQUENCE}, config=RunConfig(n_boot=200))


def test_copy_suppression_head_is_found_and_random_heads_sit_at_k_over_v(scores):
    grid = scores.grid("copy_suppression")
    base = scores.meta["baselines"]["copy_suppression"]
    assert base == pytest.approx(5 / V)
    assert grid[0, 0] == 1.0  # every token's own logit is its row's lowest
    assert scores.table.loc[0, "copy_suppression_lo"] == 1.0
    n = scores.meta["ci_units"]["copy_suppression"]
    assert n == V - 1  # every ordinary token (BOS is special)
    sd = (base * (1 - base) / n) ** 0.5
    for layer, head in [(1, 0), (1, 1)]:
        assert abs(grid[layer, head] - base) < 3 * sd, (layer, head)
    assert grid[0, 1] < base  # the successor head writes its token's successor, not a lower own logit


def test_successor_head_is_found_and_random_heads_sit_at_one_over_n(scores):
    grid = scores.grid("successor")
    base = scores.meta["baselines"]["successor"]
    assert base == pytest.approx(1 / len(SEQUENCE))
    assert grid[0, 1] == 1.0
    assert scores.meta["ci_units"]["successor"] == len(SEQUENCE) - 1
    assert grid[0, 0] == 0.0  # copy suppression ranks the successor no higher than the rest: ties go first
    n = len(SEQUENCE) - 1
    sd = (base * (1 - base) / n) ** 0.5
    for layer, head in [(1, 0), (1, 1)]:
        assert abs(grid[layer, head] - base) < 3 * sd + 1e-9, (layer, head)


def test_successor_score_reads_the_tokenizers_ordinals():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<s>"] + [str(i) for i in range(1, 21)] + ["Monday", "Tuesday", "Wednesday", "A", "B", "zz"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<s>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<s>")
    found = ordinal_sequences(tok, len(words))
    assert found["numbers"][:21] == [*range(1, 21), -1]  # "21" is not a token: the run ends at 20
    assert found["days"][:4] == [21, 22, 23, -1]
    assert found["letters"][:3] == [24, 25, -1]


def test_successor_score_is_refused_when_the_tokenizer_holds_too_few_ordinals():
    model = roles_model()
    model.tokenizer = word_tokenizer(V)  # words w0 ... w63: no numbers, days, months or letters
    msg = (
        f"the successor score needs at least {MIN_SUCCESSOR_PAIRS} ordinal tokens whose successor is also a "
        r"single token \(numbers 1-100, days, months, letters\), and this tokenizer holds 0"
    )
    with pytest.raises(UsageError, match=msg):
        ov_scores(model, ["successor"])


def test_successor_score_without_tokenizer_or_sequences_says_what_to_pass():
    with pytest.raises(UsageError, match=r"has no tokenizer: pass sequences=\{name: \[token ids in order\]\}"):
        ov_scores(roles_model(), ["successor"])


def test_copy_suppression_through_the_first_mlp():
    """With an MLP in block 0, the effective embedding is W_E + MLP0(W_E): the meta says so."""
    torch.manual_seed(0)
    cfg = ToyConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=50, n_ctx=8, attn_only=False)
    s = ov_scores(ToyTransformer(cfg).eval(), ["copy_suppression"], k=3, config=RunConfig(n_boot=50))
    assert "W_E + MLP0(W_E)" in s.meta["notes"][0]


def test_roles_are_named_from_the_ov_scores(scores):
    from interp.report.roles import role_table

    roles = role_table(scores, scores.meta["baselines"]).set_index("label")["role"]
    assert roles.to_dict() == {"0.0": "copy-suppression", "0.1": "successor", "1.0": "", "1.1": ""}


def test_an_mlp_that_cannot_run_alone_falls_back_to_the_embedding_saying_so():
    """A BERT bridge's MLP wraps its whole layer and refuses to run on its own: W_E alone, noted."""
    import interp
    from tests.conformance import build

    s = ov_scores(interp.models.from_hf_model(*build("bert")), ["copy_suppression"], config=RunConfig(n_boot=20))
    assert s.meta["notes"][0].startswith("effective embedding: W_E (block 0's MLP cannot run on its own here")
    assert s.table["copy_suppression"].notna().all()


def test_first_mlp_equals_hugging_faces_own_block_0_mlp():
    import interp
    from interp.adapters.weights import first_mlp
    from tests.conformance import build

    reference = build("gpt2")[0].transformer.h[0]
    bridge = interp.models.from_hf_model(*build("gpt2"))
    W_E = bridge.W_E.detach()[:20]
    ours, how = first_mlp(bridge, W_E)
    with torch.no_grad():
        want = reference.mlp(reference.ln_2(W_E))
    assert how == "block 0's MLP after its norm"
    assert want.abs().max() > 0.1
    torch.testing.assert_close(ours, want, atol=1e-5, rtol=1e-5)


# ---- copy suppression equals the full product, formed whole --------------------------------------


def plain_copy_suppression(E, W_V, W_O, W_U, tokens, k):
    """Per (token, layer, head), written plainly (as the score was first computed): each head's whole
    ``[tokens, vocab]`` product ``F = E W_V W_O W_U`` (float64), and whether fewer than ``k`` other
    logits of a row are as low as the token's own, or lower."""
    f64 = lambda t: t.detach().double()  # noqa: E731
    F = torch.einsum("nd,lhde,lhem,mv->lhnv", f64(E)[tokens], f64(W_V), f64(W_O), f64(W_U))
    own = F[:, :, torch.arange(len(tokens)), tokens]  # [layer, head, n]
    below = (F <= own[..., None]).sum(-1) - 1  # the own logit is as low as itself
    return (below < k).double().mean(-1)  # [layer, head]: the share of tokens


def hf_weights(hf):
    """``W_EE, W_V, W_O, W_U`` read straight from a Hugging Face GPT-2 (``W_EE = W_E + MLP0(ln_2(W_E))``)."""
    d, H = hf.config.n_embd, hf.config.n_head
    dh = d // H
    W_E = hf.transformer.wte.weight
    block0 = hf.transformer.h[0]
    with torch.no_grad():
        E = W_E + block0.mlp(block0.ln_2(W_E))
    W_V = torch.stack([b.attn.c_attn.weight[:, 2 * d :].reshape(d, H, dh).transpose(0, 1) for b in hf.transformer.h])
    W_O = torch.stack([b.attn.c_proj.weight.reshape(H, dh, d) for b in hf.transformer.h])
    return E, W_V, W_O, hf.lm_head.weight.T


def planted_gpt2():
    """A random 2-layer GPT-2 (vocabulary 300, d_head 16 < d_model 64) whose head 1.2 writes minus what
    it reads (``W_V = Q``, ``W_O = -Q^T``): a copy-suppression head whose rows stay undecided long."""
    from tests.helpers import gpt2_model

    hf = gpt2_model(n_layer=2, n_head=4, n_embd=64, vocab=300)
    Q, _ = torch.linalg.qr(torch.randn(64, 16, generator=torch.Generator().manual_seed(0)))
    with torch.no_grad():
        hf.transformer.h[1].attn.c_attn.weight[:, 2 * 64 + 2 * 16 : 2 * 64 + 3 * 16] = 4 * Q
        hf.transformer.h[1].attn.c_proj.weight[2 * 16 : 3 * 16, :] = -Q.T
    return hf


@pytest.mark.parametrize("block", [1024, 7])  # one block of columns, and many
def test_copy_suppression_equals_the_full_product_on_a_small_gpt2(monkeypatch, block):
    import interp.roles.ov as ov_module
    from interp.models import from_hf_model

    hf = planted_gpt2()
    monkeypatch.setattr(ov_module, "COLUMN_BLOCK", block)
    s = ov_scores(
        from_hf_model(hf, word_tokenizer(300)), ["copy_suppression"], k=5, max_tokens=1000, config=RunConfig(n_boot=10)
    )
    want = plain_copy_suppression(*hf_weights(hf), torch.arange(1, 300), k=5)  # token 0 is BOS
    assert want[1, 2] > 0.5 and 0 < want.sum() - want[1, 2]  # the planted head, and a few hits elsewhere
    assert s.meta["ci_units"]["copy_suppression"] == 299
    torch.testing.assert_close(
        torch.as_tensor(s.grid("copy_suppression")).double(), want, rtol=0, atol=1e-6
    )  # a hit is 1/299


def test_copy_suppression_on_the_bundled_toy_equals_the_full_product():
    from interp.models import load_model

    toy = load_model("toy", device="cpu")
    s = ov_scores(toy, ["copy_suppression"], max_tokens=512, config=RunConfig(n_boot=10))  # every ordinary token
    want = plain_copy_suppression(toy.W_E, toy.W_V, toy.W_O, toy.W_U, torch.arange(1, 512), k=10)
    assert want.sum() > 0  # some hits to match
    torch.testing.assert_close(
        torch.as_tensor(s.grid("copy_suppression")).double(), want, rtol=0, atol=1e-6
    )  # a hit is 1/511


def test_copy_suppression_decides_most_rows_in_the_first_blocks_and_embeds_only_its_tokens(monkeypatch):
    """Rows leave once k other logits are found as low as their own, and block 0's MLP runs on the
    scored tokens only, not on the whole vocabulary."""
    import interp.roles.ov as ov_module

    seen, embedded = [], []
    block, first_mlp = ov_module._logit_block, ov_module.first_mlp
    monkeypatch.setattr(ov_module, "COLUMN_BLOCK", 10)
    monkeypatch.setattr(ov_module, "_logit_block", lambda *a: seen.append(len(a[3])) or block(*a))
    monkeypatch.setattr(ov_module, "first_mlp", lambda m, x: embedded.append(len(x)) or first_mlp(m, x))
    torch.manual_seed(0)
    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=2, d_vocab=600, n_ctx=8, attn_only=False)
    ov_scores(ToyTransformer(cfg).eval(), ["copy_suppression"], k=3, max_tokens=100, config=RunConfig(n_boot=10))
    assert embedded == [100]
    assert seen[0] == 2 * 100 and len(seen) <= 2 * 60  # every row of a layer meets the first block
    assert sum(seen) < 0.2 * 2 * 2 * 100 * 60  # most rows are decided long before the last block
