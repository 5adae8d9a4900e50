"""The stream engine's Triton kernels against the blockwise torch passes.

On CPU the kernels run under Triton's interpreter, which must be switched on before triton is first
imported: `test_kernels_under_the_interpreter` re-runs this file in a child pytest with
TRITON_INTERPRET=1; the `interp_*` tests run only there. GPU timings are not measured here.
"""

import importlib.util

import pytest
import torch

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
        got = triton_row_stats(q, k, scale, causal)
        for field in ("lse", "max", "max_rest"):
            a, b = getattr(got, field), getattr(want, field)
            finite = torch.isfinite(b)
            assert torch.equal(finite, torch.isfinite(a)), field
            torch.testing.assert_close(a[finite], b[finite], rtol=0, atol=1e-5)
        received, _ = column_sums(q, k, want.lse, scale, causal, block=8)
        torch.testing.assert_close(triton_column_sums(q, k, want.lse, scale, causal), received, rtol=0, atol=1e-5)
        assert float(received[..., 0].min()) > 0.1  # the masses compared stand far above the tolerance
