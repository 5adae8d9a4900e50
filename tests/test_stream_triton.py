"""The stream engine's Triton kernels against the blockwise torch passes.

On CPU the kernels run under Triton's interpreter, which must be switched on before triton is first
imported: `test_kernels_under_the_interpreter` re-runs this file in a child pytest with
TRITON_INTERPRET=1; the `interp_*` tests run only there. GPU timings are not measured here.
"""

import importlib.util

import pytest
import torch

from interp.adapters.base import AttentionInputs
from tests.helpers import INTERPRETING, one_thread

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_interpreter = pytest.mark.skipif(not INTERPRETING, reason="runs in the TRITON_INTERPRET=1 child")


@pytest.mark.skipif(INTERPRETING, reason="this is the child run")
@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (pip install -e '.[gpu]')")
def test_kernels_under_the_interpreter(triton_interpreter):
    triton_interpreter(__file__)


@needs_interpreter
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_interp_row_stats_and_column_sums_match_blockwise(causal, kv_heads):
    from interp.stream.blockwise import column_sums, row_stats
    from interp.stream.triton import triton_column_sums, triton_row_stats

    with one_thread():
        torch.manual_seed(0)
        q, k = torch.randn(1, 2, 37, 16) * 2, torch.randn(1, kv_heads, 37, 16) * 2  # 37: a ragged last block
        scale = 16**-0.5
        want = row_stats(q, k, scale, causal, block=8)
        got = triton_row_stats(AttentionInputs(0, q, k, k, scale, causal))
        for field in ("lse", "max", "max_rest"):
            a, b = getattr(got, field), getattr(want, field)
            finite = torch.isfinite(b)
            assert torch.equal(finite, torch.isfinite(a)), field
            torch.testing.assert_close(a[finite], b[finite], rtol=0, atol=1e-5)
        received, _ = column_sums(q, k, want.lse, scale, causal, block=8)
        plain = AttentionInputs(0, q, k, k, scale, causal)
        torch.testing.assert_close(triton_column_sums(plain, want.lse), received, rtol=0, atol=1e-5)
        assert float(received[..., 0].min()) > 0.1  # the masses compared stand far above the tolerance


@needs_interpreter
@pytest.mark.parametrize("feature", ["window", "softcap", "alibi", "sink", "key_mask", "all"])
def test_interp_kernels_apply_every_attention_feature(feature):
    """Each AttentionInputs feature in the kernels equals the torch passes (logits_tile, the reference)."""
    from interp.stream.blockwise import attention_column_sums, attention_row_stats
    from interp.stream.triton import triton_column_sums, triton_row_stats

    with one_thread():
        torch.manual_seed(1)
        B, H, T, d = 2, 2, 45, 16  # 45: ragged blocks of 16
        q, k = torch.randn(B, H, T, d) * 2, torch.randn(B, 1, T, d) * 2
        key_mask = torch.ones(B, T, dtype=torch.bool)
        key_mask[1, :7] = False  # left padding of sequence 1
        on = {
            "window": dict(window=9),
            "softcap": dict(softcap=1.5),
            "alibi": dict(bias_slopes=torch.tensor([0.5, 0.125])),
            "sink": dict(sink=torch.tensor([2.0, -1.0])),
            "key_mask": dict(key_mask=key_mask),
        }
        kw = {k: v for f in on.values() for k, v in f.items()} if feature == "all" else on[feature]
        a = AttentionInputs(0, q, k, k, d**-0.5, True, **kw)
        want = attention_row_stats(a, block=8)
        got = triton_row_stats(a)
        for field in ("lse", "max", "max_rest"):
            x, y = getattr(got, field), getattr(want, field)
            finite = torch.isfinite(y)
            assert torch.equal(finite, torch.isfinite(x)), field
            torch.testing.assert_close(x[finite], y[finite], rtol=0, atol=1e-5)
        plain = attention_row_stats(AttentionInputs(0, q, k, k, d**-0.5, True), block=8)
        assert float((want.lse - plain.lse).abs().max()) > 0.1  # the feature changes what is compared
        received, _ = attention_column_sums(a, want.lse, block=8)
        torch.testing.assert_close(triton_column_sums(a, want.lse), received, rtol=0, atol=1e-5)
