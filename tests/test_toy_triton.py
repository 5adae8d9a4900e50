"""Our Triton kernel against SDPA, the reference path and the blockwise path.

On CPU the kernel runs under Triton's interpreter, which must be switched on (TRITON_INTERPRET=1)
before triton is first imported. So that this never leaks into the other test files,
`test_kernel_under_the_interpreter` re-runs this file in a child pytest with the variable set;
the `interp_*` tests run only there (and are reported as skipped in the parent). On a CUDA device
the `gpu` tests run the compiled kernel in this process.
"""

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from interp.toy.flash import HAS_TRITON  # importable Triton (an absent or broken one is False)
from tests.helpers import INTERPRETING, ROOT, child_env

needs_interpreter = pytest.mark.skipif(
    not (INTERPRETING and HAS_TRITON),
    reason="runs in the TRITON_INTERPRET=1 child" if HAS_TRITON else "Triton is not installed (pip install triton)",
)
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and HAS_TRITON), reason="needs CUDA and Triton")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


HEADS = {"MHA": (4, 4), "GQA": (4, 2), "MQA": (4, 1)}


@pytest.mark.skipif(INTERPRETING, reason="this is the child run")
@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (pip install triton)")
def test_kernel_under_the_interpreter(triton_interpreter):
    triton_interpreter(__file__)


@pytest.mark.skipif(INTERPRETING, reason="this is the child run")
def test_toy_imports_and_runs_without_triton():
    """Triton is an optional extra: with it unimportable, interp.toy still loads and runs."""
    # None in sys.modules is how Python spells "not installed": `import triton` raises ImportError and
    # importlib.util.find_spec("triton") (which torch itself calls on import) returns None.
    code = """
import sys
sys.modules["triton"] = None
import importlib.util
assert importlib.util.find_spec("triton") is None
import torch
from interp.toy import ToyConfig, ToyTransformer, flash
assert not flash.HAS_TRITON
model = ToyTransformer(ToyConfig(d_model=32, n_heads=2, n_ctx=16, d_vocab=10))
assert model(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 10)
try:
    flash.triton_attention(*(torch.randn(1, 2, 8, 16) for _ in range(3)))
except ImportError as error:
    message = str(error)
else:
    raise AssertionError("triton_attention ran without triton")
expected = "triton_attention needs Triton, which is not installed: pip install triton (the 'gpu' extra of interp)"
assert message == expected, message
"""
    env = child_env(OMP_NUM_THREADS="1")
    child = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]


def make(n_heads, n_kv_heads, n, d_head, dtype, device="cpu", batch=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    draw = lambda h: torch.randn(batch, h, n, d_head, generator=g).to(device, dtype).requires_grad_()  # noqa: E731
    return draw(n_heads), draw(n_kv_heads), draw(n_kv_heads)


def check_against_sdpa(q, k, v, causal, out, lse, out_tol, grad_tol):
    """out/lse from the kernel vs SDPA in fp32 on the same (rounded) inputs; gradients too."""
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
    k_full = leaves[1].detach().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = leaves[0].detach() @ k_full.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(out.float(), expected, **out_tol)
    torch.testing.assert_close(lse, scores.logsumexp(-1), atol=1e-4, rtol=1e-5)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    got = torch.autograd.grad(out, (q, k, v), d_out.to(out.dtype))
    want = torch.autograd.grad(expected, leaves, d_out)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w, **grad_tol)


FP32 = dict(atol=1e-5, rtol=1e-5)
FP16 = dict(atol=3e-3, rtol=3e-3)
FP16_GRAD = dict(atol=1e-2, rtol=1e-2)


# -------------------------------------------------------------------------------------------
# interpreter (CPU), small sizes, pinned 16 x 16 tiles
# -------------------------------------------------------------------------------------------


@needs_interpreter
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_interp_fp32_matches_sdpa(causal, heads):
    from interp.toy.flash import triton_attention

    q, k, v = make(*HEADS[heads], n=37, d_head=16, dtype=torch.float32)  # 37: ragged last tile
    out, lse = triton_attention(q, k, v, causal)
    check_against_sdpa(q, k, v, causal, out, lse, FP32, FP32)


@needs_interpreter
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_interp_fp16_matches_sdpa(causal):
    from interp.toy.flash import triton_attention

    q, k, v = make(4, 2, n=29, d_head=32, dtype=torch.float16)
    out, lse = triton_attention(q, k, v, causal)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    check_against_sdpa(q, k, v, causal, out, lse, FP16, FP16_GRAD)


@needs_interpreter
@pytest.mark.parametrize("d_head", [24, 128])  # not a power of two (padded lanes), and the largest
def test_interp_head_dims(d_head):
    from interp.toy.flash import triton_attention

    q, k, v = make(2, 1, n=19, d_head=d_head, dtype=torch.float32)
    out, lse = triton_attention(q, k, v, causal=True)
    check_against_sdpa(q, k, v, True, out, lse, FP32, FP32)


@needs_interpreter
def test_interp_agrees_with_reference_and_blockwise():
    from interp.toy.attention import reference_attention
    from interp.toy.flash import blockwise_attention, triton_attention

    q, k, v = (t.detach() for t in make(4, 2, n=40, d_head=16, dtype=torch.float32))
    for causal in (False, True):
        outs = [
            triton_attention(q, k, v, causal, block_size=32),
            blockwise_attention(q, k, v, causal, block_size=16),
            reference_attention(q, k, v, causal),
        ]
        for out, lse in outs[1:]:
            torch.testing.assert_close(outs[0][0], out, **FP32)
            torch.testing.assert_close(outs[0][1], lse, **FP32)


@needs_interpreter
def test_interp_toy_module_runs_the_kernel():
    from interp.toy.attention import Attention

    torch.manual_seed(0)
    attn = Attention(32, n_heads=2, n_kv_heads=1, flash_impl="triton")
    x = torch.randn(1, 21, 32)
    flash = attn(x)
    attn.use_flash = False
    torch.testing.assert_close(flash, attn(x), **FP32)


# -------------------------------------------------------------------------------------------
# compiled kernel on a CUDA device
# -------------------------------------------------------------------------------------------


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("d_head", [16, 64, 96, 128])
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_matches_sdpa(causal, heads, d_head, dtype):
    from interp.toy.flash import triton_attention

    q, k, v = make(*HEADS[heads], n=1000, d_head=d_head, dtype=dtype, device="cuda", batch=2)
    out, lse = triton_attention(q, k, v, causal)
    tol = FP32 if dtype == torch.float32 else FP16
    check_against_sdpa(
        q, k, v, causal, out, lse, tol, dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else FP16_GRAD
    )


@gpu
@needs_cuda
def test_gpu_module_uses_the_kernel_by_default():
    from interp.toy import flash
    from interp.toy.attention import Attention

    attn = Attention(128, n_heads=4, n_kv_heads=2).cuda()
    calls = []
    original = flash.triton_attention
    flash.triton_attention = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        x = torch.randn(2, 300, 128, device="cuda")
        out = attn(x)
    finally:
        flash.triton_attention = original
    assert calls
    attn.use_flash = False
    torch.testing.assert_close(out, attn(x), atol=1e-4, rtol=1e-4)
