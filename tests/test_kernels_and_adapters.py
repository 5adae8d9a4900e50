"""The kernel layer and the model adapters: one reference, one launch policy, one adapter per kind."""

import pytest
import torch

import interp.hooks
from interp import kernels
from interp.adapters import BridgeAdapter, ToyAdapter, adapter_for, describe
from interp.config import RunConfig
from interp.heads import head_scores
from interp.toy import ToyConfig, ToyTransformer
from interp.toy.attention import reference_attention


@pytest.mark.parametrize("causal", [True, False])
def test_online_softmax_is_the_reference(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 37, 8, generator=g),
        torch.randn(2, 2, 37, 8, generator=g),
        torch.randn(2, 2, 37, 8, generator=g),
    )
    got = kernels.online_softmax(q, k, v, causal=causal, scale=8**-0.5, block=8, rest=True)
    out, lse = reference_attention(q, k, v, causal)
    torch.testing.assert_close(got.out, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.lse, lse, atol=1e-5, rtol=1e-5)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k.repeat_interleave(2, 1)) * 8**-0.5
    if causal:
        scores = scores.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), -torch.inf)
    torch.testing.assert_close(got.max, scores.amax(-1))
    torch.testing.assert_close(got.max_rest, scores[..., 1:].amax(-1))


def test_launch_policy_and_missing_triton(monkeypatch):
    cpu = torch.zeros(1, 1, 4, 32)
    assert not kernels.use_triton(cpu)  # CPU tensors: torch, whatever is installed
    monkeypatch.setattr(kernels, "HAS_TRITON", False)
    with pytest.raises(ImportError, match=r"^triton_attention needs Triton, which is not installed: pip install"):
        kernels.check_launch(cpu, "triton_attention")


def test_one_adapter_per_kind_and_the_old_names_still_import(gpt2_tiny):
    toy = ToyTransformer(ToyConfig(d_model=32, n_heads=2, n_ctx=16, d_vocab=10))
    assert isinstance(adapter_for(toy), ToyAdapter)
    assert isinstance(adapter_for(gpt2_tiny), BridgeAdapter)
    assert not hasattr(interp.hooks, "run_with_reducers")  # hooks holds names; running is the adapters' job
    from interp.models import describe as old_describe

    assert old_describe is describe


def test_head_scores_take_a_run_config(gpt2_tiny):
    a = head_scores(gpt2_tiny, config=RunConfig(n_boot=50, seed=3), copying=False)
    b = head_scores(gpt2_tiny, config=RunConfig(n_boot=50, seed=3), copying=False)
    with pytest.raises(TypeError):  # run settings travel in the config only
        head_scores(gpt2_tiny, config=RunConfig(n_boot=10, seed=3), n_boot=50, copying=False)
    for other in (b,):
        assert a.meta == other.meta
        assert a.table.equals(other.table)
    assert list(a.meta) == [
        "model", "n_layers", "n_heads", "causal", "probe", "queries", "ci_level", "n_boot", "seed", "engine", "engine_reason", "ci_sequences",
        "baselines",
    ]  # fmt: skip
