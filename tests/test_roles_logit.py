"""Direct logit attribution: the parts add up to the model's own logit difference on GPT-2, Llama
and Gemma 2 (pre-cap, said so), and a hand-set head's term and its split by position are known."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import interp
from interp.config import RunConfig
from interp.errors import UsageError
from interp.roles.logit import logit_attribution
from interp.toy import ToyConfig, ToyTransformer
from tests.conformance import build

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def with_norm_weights(model):
    """Every norm's gain and bias set away from their init (1 and 0), the same for the same model:
    the frozen norms' gains and biases then matter. Attention output biases (GPT-2's) are zeroed,
    so the heads carry the attention's whole write."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("norm" in name or "ln_" in name):
                p.add_(0.5 * torch.randn(p.shape, generator=g))
            if name.endswith("attn.c_proj.bias"):
                p.zero_()
    return model


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "gpt_neox"])  # gpt_neox: parallel blocks
def test_parts_add_up_to_the_models_own_logit_difference(family):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 300, (4, 10), generator=g)
    answers, wrongs = torch.randint(1, 300, (4,), generator=g), torch.randint(1, 300, (4,), generator=g)
    reference = with_norm_weights(build(family)[0])  # the same weights, run by Hugging Face alone
    with torch.no_grad():
        logits = reference(tokens).logits[:, -1].double()
    cap = getattr(reference.config, "final_logit_softcapping", None)
    raw = cap * torch.atanh(logits / cap) if cap else logits  # the pre-cap logits
    want = raw[torch.arange(4), answers] - raw[torch.arange(4), wrongs]
    hf, tok = build(family)
    r = logit_attribution(
        interp.models.from_hf_model(with_norm_weights(hf), tok), tokens, answers, wrongs, config=RunConfig(n_boot=50)
    )
    assert want.abs().min() > 0.1  # a real difference to split, well above the tolerance
    np.testing.assert_allclose(r.parts["total"], want.numpy(), atol=1e-4)
    heads = r.per_position.sum(-1)
    np.testing.assert_allclose(r.parts["heads"], heads.sum((1, 2)), atol=1e-9)
    np.testing.assert_allclose(r.heads.grid("dla"), heads.mean(0), atol=1e-6)
    assert np.abs(heads).max() > 1e-2  # the heads carry part of it
    # no attention output bias (nor a post-norm bias): each layer's attention write is its heads' sum,
    # which checks each head's term (through Gemma 2's post-attention norm too), not only the total
    other = r.parts[[c for c in r.parts if c.startswith("attn_other")]].to_numpy()
    assert np.abs(other).max() < 1e-5
    if family == "gemma2":
        assert "the attribution is of the pre-cap logit difference" in r.meta["softcap"]
        capped = logits[torch.arange(4), answers] - logits[torch.arange(4), wrongs]
        np.testing.assert_allclose(r.parts["model_capped"], capped.numpy(), atol=1e-4)
    else:
        assert r.meta["softcap"] is None


def averaging_model() -> ToyTransformer:
    """One layer, no norm, one-hot token codes (W_E = W_U = I, no positions). Head 0.0 attends
    uniformly (zero QK) and copies (W_OV = I); head 0.1 has zero weights."""
    V = 16
    cfg = ToyConfig(n_layers=1, d_model=V, n_heads=2, d_head=V, d_vocab=V, n_ctx=8, normalization_type=None)
    model = ToyTransformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.weight.copy_(torch.eye(V))
        model.unembed.weight.copy_(torch.eye(V))
        d = cfg.d_head
        model.blocks[0].attn.W_qkv.weight.data[2 * 2 * d : 2 * 2 * d + d] = torch.eye(V)
        model.blocks[0].attn.W_out.weight.data[:, :d] = torch.eye(V)
    return model.eval()


def test_a_uniform_copying_head_writes_the_token_counts_it_sees():
    tokens = torch.tensor([[3, 5, 5, 7, 3, 5], [4, 4, 4, 4, 9, 2]])
    r = logit_attribution(averaging_model(), tokens, [5, 4], [3, 2], config=RunConfig(n_boot=50))
    # causal, uniform over the 6 keys at the last position: (#answer - #wrong) / 6
    np.testing.assert_allclose(r.per_position[:, 0, 0].sum(-1), [(3 - 2) / 6, (4 - 1) / 6], atol=1e-6)
    np.testing.assert_allclose(r.per_position[0, 0, 0], np.array([-1, 1, 1, 0, -1, 1]) / 6, atol=1e-6)
    assert np.abs(r.per_position[:, 0, 1]).max() == 0  # the zero head writes nothing
    np.testing.assert_allclose(r.parts["embed"], [1 - 0, 0 - 1])  # the last token's own code: 5 vs 3, 2 vs 4
    np.testing.assert_allclose(r.parts["total"], r.parts["model"], atol=1e-5)


def test_answer_logit_alone_and_positions():
    tokens = torch.tensor([[3, 5, 5, 7, 3, 5]])
    r = logit_attribution(averaging_model(), tokens, [5], positions=[2], config=RunConfig(n_boot=10))
    assert r.meta["direction"] == "answer"
    assert r.per_position[0, 0, 0, :3].sum() == pytest.approx(2 / 3)  # query 2 sees 3, 5, 5
    assert np.isnan(r.heads.table["dla_lo"]).sum() == 0


def test_bad_ids_are_refused_saying_what():
    with pytest.raises(UsageError, match=r"answers must hold one token id per prompt \(1\), got 2"):
        logit_attribution(averaging_model(), torch.tensor([[1, 2]]), [1, 2])
    with pytest.raises(UsageError, match="wrongs: token id 99 is outside the model's vocabulary of 16"):
        logit_attribution(averaging_model(), torch.tensor([[1, 2]]), [1], [99])
    with pytest.raises(
        UsageError,
        match=r"positions must hold one position per prompt \(1\), each inside its prompt \(lengths \[2\]\), got \[5\]",
    ):
        logit_attribution(averaging_model(), torch.tensor([[1, 2]]), [1], positions=[5])


def test_saves(tmp_path):
    r = logit_attribution(averaging_model(), torch.tensor([[3, 5, 5]]), [5], [3], config=RunConfig(n_boot=10))
    files = r.save(tmp_path)
    assert sorted(p.name for p in files) == [
        "logit_attribution.json",
        "logit_attribution_heads.csv",
        "logit_attribution_heads.json",
        "logit_attribution_parts.csv",
    ]


def test_prompts_of_different_lengths_run_each_length_as_its_batch():
    model = averaging_model()
    r = logit_attribution(model, [[3, 5, 5], [4, 4, 9, 2]], [5, 4], [3, 2], config=RunConfig(n_boot=10))
    np.testing.assert_allclose(np.nansum(r.per_position[:, 0, 0], -1), [(2 - 1) / 3, (2 - 1) / 4], atol=1e-6)
    assert np.isnan(r.per_position[0, 0, 0, 3])  # past the first prompt's end
    alone = logit_attribution(model, [[4, 4, 9, 2]], [4], [2], config=RunConfig(n_boot=10))
    np.testing.assert_allclose(r.parts.loc[1, "total"], alone.parts.loc[0, "total"])


def test_gated_attention_is_refused_saying_why():
    hf, tok = build("qwen3_next")
    model = interp.models.from_hf_model(hf, tok)
    with pytest.raises(UsageError, match=r"in layers \[1\] multiplies each head's output by a sigmoid gate first"):
        logit_attribution(model, torch.tensor([[1, 2, 3]]), [4], [5])


def test_encoders_are_refused_saying_why():
    hf, tok = build("bert")
    model = interp.models.from_hf_model(hf, tok)
    with pytest.raises(UsageError, match="is an encoder: its blocks normalise after adding"):
        logit_attribution(model, torch.tensor([[5, 6, 7]]), [8], [9])


def test_several_answers_attribute_the_mean_answer_logit_minus_the_mean_wrong_one():
    tokens = torch.tensor([[3, 5, 5, 7, 3, 5], [4, 4, 4, 4, 9, 2]])
    # -1 pads: prompt 0 compares tokens 5 and 3 with 7; prompt 1 compares 4 with 9 and 2
    r = logit_attribution(averaging_model(), tokens, [[5, 3], [4, -1]], [[7, -1], [9, 2]], config=RunConfig(n_boot=10))
    want = [((3 + 2) / 2 - 1) / 6, (4 - (1 + 1) / 2) / 6]  # the uniform head: mean counts over 6 keys
    np.testing.assert_allclose(r.per_position[:, 0, 0].sum(-1), want, atol=1e-6)
    np.testing.assert_allclose(r.parts["total"], r.parts["model"], atol=1e-5)
    np.testing.assert_allclose(r.parts["embed"], [(1 + 0) / 2 - 0, 0 - (0 + 1) / 2])  # the last token's own code
    assert r.meta["direction"] == "mean answer logit - mean wrong logit"
    with pytest.raises(UsageError, match="answers: prompt 1 has no token id"):
        logit_attribution(averaging_model(), tokens, [[5, 3], [-1, -1]], config=RunConfig(n_boot=10))


def test_the_toys_repeat_task_is_carried_by_its_induction_heads():
    from interp.models import load_model
    from interp.probes.task import task_probe

    model = load_model("toy", device="cpu")
    task = task_probe(model, "repeat", n_pairs=8, seed=0)
    r = logit_attribution(model, task, config=RunConfig(n_boot=50))
    # the model's own logit difference, read independently from a plain forward of the clean prompts
    with torch.no_grad():
        logits = model(task.clean)[:, task.read_position].double()
    rows = torch.arange(task.n_pairs)
    want = logits[rows, task.answer[:, 0]] - logits[rows, task.wrong[:, 0]]
    assert want.abs().min() > 0.5
    np.testing.assert_allclose(r.parts["model"], want.numpy(), atol=1e-4)
    np.testing.assert_allclose(r.parts["total"], want.numpy(), atol=1e-4)
    dla = r.heads.grid("dla")
    assert dla[1].min() > 0.3 and dla[1].min() > 10 * np.abs(dla[0]).max()  # layer 1: the induction heads
    assert r.meta["task"]["name"] == "repeat" and r.meta["direction"] == "answer - wrong"
    with pytest.raises(UsageError, match="a task brings its own answers, wrong answers and positions"):
        logit_attribution(model, task, [1] * 8)


def test_greater_than_says_what_is_attributed():
    from interp.probes.task import TaskProbe

    model = averaging_model()
    clean = torch.tensor([[3, 5, 5, 7]])
    task = TaskProbe(
        clean, clean.clone(), torch.tensor([[5, 7]]), torch.tensor([[3, -1]]), metric="prob-diff", name="gt"
    )
    r = logit_attribution(model, task, config=RunConfig(n_boot=10))
    np.testing.assert_allclose(r.per_position[0, 0, 0].sum(), ((2 + 1) / 2 - 1) / 4, atol=1e-6)
    assert r.meta["direction"].startswith(
        "mean answer logit - mean wrong logit (the gt task's own metric, the answers'"
    )
    assert "its logit counterpart is attributed" in r.meta["direction"]
