"""Every attention path against torch's SDPA and each other: outputs, log-sum-exp, gradients.

The Triton kernel is checked in tests/test_toy_triton.py (its interpreter needs its own process).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from interp.toy.attention import Attention, AttentionShape, LatentAttention, reference_attention
from interp.toy.flash import blockwise_attention

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


HEADS = {"MHA": (4, 4), "GQA": (4, 2), "MQA": (4, 1)}
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=3e-3, rtol=3e-3)}
GRAD_TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=1e-2, rtol=1e-2)}


def qkv(n_heads, n_kv_heads, n=37, d_head=16, batch=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(batch, h, n, d_head, generator=g).to(dtype).requires_grad_()  # noqa: E731
    return make(n_heads), make(n_kv_heads), make(n_kv_heads)


def sdpa(q, k, v, causal):
    """The yardstick, in fp32: output, log-sum-exp (from explicit scores), gradients."""
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal, enable_gqa=True)
    scores = q32 @ k32.repeat_interleave(q.shape[1] // k.shape[1], dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
    return out, scores.logsumexp(-1).detach(), (q32, k32, v32)


PATHS = {
    "reference": lambda q, k, v, causal: reference_attention(q, k, v, causal),
    "blockwise": lambda q, k, v, causal: blockwise_attention(q, k, v, causal, block_size=16),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("heads", list(HEADS), ids=list(HEADS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("path", list(PATHS))
def test_paths_match_sdpa(path, causal, heads, dtype):
    q, k, v = qkv(*HEADS[heads], n=37, dtype=dtype)  # 37: not a multiple of the 16-wide blocks
    expected, expected_lse, leaves = sdpa(q, k, v, causal)
    out, lse = PATHS[path](q, k, v, causal)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == q.shape[:-1]
    torch.testing.assert_close(out.float(), expected, **TOL[dtype])
    torch.testing.assert_close(lse.float(), expected_lse, **TOL[torch.float32])

    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(out, (q, k, v), d_out.to(dtype))
    expected_grads = torch.autograd.grad(expected, leaves, d_out)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got.float(), want, **GRAD_TOL[dtype])


@pytest.mark.parametrize("n, block", [(1, 16), (16, 16), (17, 16), (50, 7), (64, 128)])
def test_blockwise_equals_reference_for_any_blocking(n, block):
    q, k, v = qkv(6, 2, n=n, d_head=8)
    for causal in (False, True):
        out, lse = blockwise_attention(q, k, v, causal, block_size=block)
        ref_out, ref_lse = reference_attention(q, k, v, causal)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


def test_blockwise_is_stable_for_huge_scores():
    """The running max keeps exp() finite where a naive softmax would overflow."""
    q, k, v = (t.detach() for t in qkv(2, 2, n=20))
    out, lse = blockwise_attention(q * 300, k * 300, v, causal=True, block_size=8)
    ref_out, ref_lse = reference_attention(q * 300, k * 300, v, causal=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-5)


def test_flash_gqa_never_copies_keys_per_query_head(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("repeat_interleave in the flash path")

    monkeypatch.setattr(torch, "repeat_interleave", forbidden)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", forbidden)
    q, k, v = qkv(8, 2, n=33)
    out, _ = blockwise_attention(q, k, v, causal=True, block_size=16)
    out.sum().backward()
    assert k.grad.shape == k.shape


# -------------------------------------------------------------------------------------------
# the module: hooks pick the path, and both paths compute the same thing
# -------------------------------------------------------------------------------------------


def module_input(d_model=32, n=23, seed=0):
    return torch.randn(2, n, d_model, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("make", [
    lambda: Attention(32, n_heads=4, n_kv_heads=4),
    lambda: Attention(32, n_heads=4, n_kv_heads=2),
    lambda: Attention(32, n_heads=4, n_kv_heads=2, flash_impl="sdpa"),
    lambda: Attention(32, n_heads=4, n_kv_heads=1, causal=False),
    lambda: LatentAttention(32, n_heads=4, d_latent=8),
    lambda: LatentAttention(32, n_heads=4, d_latent=8, d_q_latent=12, causal=False),
], ids=["MHA", "GQA", "GQA-sdpa", "MQA-bidirectional", "MLA", "MLA-q-latent"])  # fmt: skip
def test_module_paths_agree_and_hooks_switch_path(make):
    torch.manual_seed(0)
    attn = make()
    x = module_input().requires_grad_()
    flash_out = attn(x)
    flash_grad = torch.autograd.grad(flash_out.sum(), x)[0]

    seen = {}
    attn.hook_pattern.add_hook(lambda pattern, hook: seen.update(pattern=pattern))
    ref_out = attn(x)
    ref_grad = torch.autograd.grad(ref_out.sum(), x)[0]
    attn.hook_pattern.remove_hooks()

    assert seen["pattern"].shape == (2, 4, 23, 23)
    torch.testing.assert_close(seen["pattern"].sum(-1), torch.ones(2, 4, 23))
    if attn.causal:
        assert seen["pattern"].triu(1).abs().max() == 0
    torch.testing.assert_close(flash_out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flash_grad, ref_grad, atol=1e-5, rtol=1e-5)
    assert not attn.pattern_requested


def test_module_matches_sdpa_from_tl_shaped_weights():
    """q = x W_Q per head etc. (TransformerLens shapes), SDPA, then z W_O: the module's output."""
    torch.manual_seed(0)
    attn = Attention(32, n_heads=4, n_kv_heads=2)
    x = module_input()
    q, k, v = (torch.einsum("bpm,hmd->bhpd", x, w) for w in (attn.W_Q, attn.W_K, attn.W_V))
    z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected = torch.einsum("bhpd,hdm->bpm", z, attn.W_O)
    torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-5)


def test_hook_result_is_per_head_and_editable():
    torch.manual_seed(0)
    attn = Attention(32, n_heads=4, n_kv_heads=2)
    x = module_input()
    plain = attn(x)
    seen = {}

    def drop_head_2(result, hook):
        seen["result"] = result
        return result * torch.tensor([1.0, 1.0, 0.0, 1.0])[:, None]

    attn.hook_result.add_hook(drop_head_2)
    edited = attn(x)
    attn.hook_result.remove_hooks()
    assert seen["result"].shape == (2, 23, 4, 32)
    torch.testing.assert_close(seen["result"].sum(dim=2), plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(edited, plain - seen["result"][:, :, 2], atol=1e-5, rtol=1e-5)


def test_hook_shapes_follow_transformer_lens():
    torch.manual_seed(0)
    attn = Attention(32, n_heads=4, n_kv_heads=2)
    shapes = {}
    for name in ["hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"]:
        getattr(attn, name).add_hook(lambda t, hook, name=name: shapes.update({name: tuple(t.shape)}))
    attn(module_input())
    assert shapes == {
        "hook_q": (2, 23, 4, 8),
        "hook_k": (2, 23, 2, 8),
        "hook_v": (2, 23, 2, 8),
        "hook_attn_scores": (2, 4, 23, 23),
        "hook_pattern": (2, 4, 23, 23),
        "hook_z": (2, 23, 4, 8),
    }


def test_gqa_weight_views_share_keys_within_a_group():
    attn = Attention(32, n_heads=4, n_kv_heads=2)
    assert attn.W_K.shape == attn.W_Q.shape == (4, 32, 8) and attn.W_O.shape == (4, 8, 32)
    torch.testing.assert_close(attn.W_K[0], attn.W_K[1])
    torch.testing.assert_close(attn.W_V[2], attn.W_V[3])
    assert not torch.equal(attn.W_K[1], attn.W_K[2])


# -------------------------------------------------------------------------------------------
# the calculator
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_heads", [1, 8])
def test_parameter_count_does_not_depend_on_head_count(n_heads):
    shape = AttentionShape(d_model=512, n_heads=n_heads)
    assert shape.n_params() == 1_048_576 == 4 * 512 * 512
    module = Attention(512, n_heads)
    assert sum(p.numel() for p in module.parameters()) == shape.n_params()


def test_kv_cache_llama2_70b():
    mha = AttentionShape(d_model=8192, n_heads=64, n_kv_heads=64, d_head=128)
    gqa = AttentionShape(d_model=8192, n_heads=64, n_kv_heads=8, d_head=128)
    assert (mha.kind, gqa.kind) == ("MHA", "GQA")
    assert mha.kv_cache_bytes_per_token(n_layers=80, bytes_per_element=2) == 2_621_440
    assert gqa.kv_cache_bytes_per_token(n_layers=80, bytes_per_element=2) == 327_680
    assert mha.kv_cache_bytes_per_token(80) * 4096 / 2**30 == 10.0
    assert gqa.kv_cache_bytes_per_token(80) * 4096 / 2**30 == 1.25


def test_calculator_counts_match_modules_for_gqa_mqa_mla():
    cases = [
        (AttentionShape(64, 8, n_kv_heads=2), Attention(64, 8, n_kv_heads=2)),
        (AttentionShape(64, 8, n_kv_heads=1), Attention(64, 8, n_kv_heads=1)),
        (AttentionShape(64, 8, d_latent=16), LatentAttention(64, 8, d_latent=16)),
        (AttentionShape(64, 8, d_latent=16, d_q_latent=24), LatentAttention(64, 8, d_latent=16, d_q_latent=24)),
    ]
    for shape, module in cases:
        assert sum(p.numel() for p in module.parameters()) == shape.n_params(), shape
    assert [s.kind for s, _ in cases] == ["GQA", "MQA", "MLA", "MLA"]


def test_mla_cache_is_the_latent_deepseek_v2():
    """DeepSeek-V2: 60 layers, latent 512 + decoupled RoPE key 64 = 4.5 head dims per token-layer."""
    mla = AttentionShape(d_model=5120, n_heads=128, d_head=128, d_latent=512, d_q_latent=1536, d_rope=64)
    assert mla.kv_cache_bytes_per_token(n_layers=60, bytes_per_element=2) == 60 * 576 * 2
    mha = AttentionShape(d_model=5120, n_heads=128, d_head=128)
    assert mha.kv_cache_bytes_per_token(60) / mla.kv_cache_bytes_per_token(60) == pytest.approx(2 * 128 / 4.5)
