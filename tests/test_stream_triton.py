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


def _check_argmax(a, q0, q1):
    """The Triton row argmax against the torch one (tiles of 7 keys: maxima cross tiles): the same
    keys exactly, the same logits to 1e-6; returns the keys."""
    from interp.stream.blockwise import row_argmax
    from interp.stream.triton import triton_row_argmax

    want_best, want_arg = row_argmax(a, q0, q1, block=7)
    best, arg = triton_row_argmax(a, q0, q1)
    assert arg.dtype == torch.long and arg.shape == want_arg.shape
    assert torch.equal(arg, want_arg)
    finite = torch.isfinite(want_best)
    assert torch.equal(finite, torch.isfinite(best))
    torch.testing.assert_close(best[finite], want_best[finite], rtol=0, atol=1e-6)
    return arg


@needs_interpreter
@pytest.mark.parametrize("feature", ["plain", "window", "softcap", "key_mask", "alibi", "all", "non_causal"])
def test_interp_row_argmax_matches_torch(feature):
    """Random q/k, two query heads per key head, a ragged query range: the kernel's (max, argmax)
    equal row_argmax's, with each AttentionInputs feature."""
    with one_thread():
        torch.manual_seed(2)
        B, H, T, d = 2, 4, 53, 16
        q, k = torch.randn(B, H, T, d), torch.randn(B, 2, T, d)
        key_mask = torch.ones(B, T, dtype=torch.bool)
        key_mask[1, :9] = False  # left padding of sequence 1
        on = {
            "plain": {},
            "non_causal": {},
            "window": dict(window=11),
            "softcap": dict(softcap=1.5),
            "key_mask": dict(key_mask=key_mask),
            "alibi": dict(bias_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),
        }
        kw = {k: v for f in on.values() for k, v in f.items()} if feature == "all" else on[feature]
        a = AttentionInputs(0, q, k, k, d**-0.5, feature != "non_causal", **kw)
        for q0, q1 in [(0, T), (5, 44), (30, 31)]:
            arg = _check_argmax(a, q0, q1)
            if feature in ("window", "all"):  # the band is respected: no key left of it wins
                rows = torch.arange(q0, q1)
                assert bool((arg > rows - 11).all())
        if feature != "plain":  # the feature changes what is compared (softcap: the values only)
            from interp.stream.triton import triton_row_argmax

            plain = AttentionInputs(0, q, k, k, d**-0.5, True)
            (b0, a0), (b1, a1) = triton_row_argmax(plain, 0, T), triton_row_argmax(a, 0, T)
            assert not torch.equal(a0, a1) or float((b0 - b1).nan_to_num(0, 0, 0).abs().max()) > 0.1


@needs_interpreter
@pytest.mark.parametrize("window", [None, 30])
def test_interp_row_argmax_ties_go_to_the_lowest_key(window):
    """Planted exact ties: keys 3, 20 and 40 are one vector (in different 16-key tiles of the kernel,
    3 and 5 in the same one), and every query is that vector scaled up, so each row's maximum is
    shared by the copies it sees; the lowest visible copy must win, within a tile and across tiles."""
    with one_thread():
        torch.manual_seed(3)
        T, d = 50, 16
        k = torch.randn(1, 1, T, d) * 0.1
        key = torch.randn(d)
        for j in (3, 5, 20, 40):
            k[0, 0, j] = key
        q = (key * 4).expand(1, 2, T, d).clone()
        a = AttentionInputs(0, q, k, k, d**-0.5, True, window=window)
        arg = _check_argmax(a, 0, T)
        rows = torch.arange(T)
        copies = torch.tensor([3, 5, 20, 40])
        seen = (copies[None, :] <= rows[:, None]) & (
            copies[None, :] > rows[:, None] - (window if window is not None else T + 1)
        )
        has = seen.any(-1)
        want = torch.where(seen, copies[None, :], T).min(-1).values
        assert torch.equal(arg[0, 0][has], want[has])
        assert int(seen.sum(-1).max()) >= 2  # some rows do see a tie
        assert bool((seen[:, 0] & seen[:, 1]).any()) and bool((seen[:, 1] & seen[:, 2]).any())  # in a tile, across


@needs_interpreter
def test_interp_copy_step_stats_on_the_kernel_equal_torch(monkeypatch):
    """The retrieval scores' argmax_pass dispatch: with the kernel forced on (CPU tensors under the
    interpreter), copy_step_stats' hits and masses equal the torch path's."""
    import interp.stream.passes as passes
    from interp.retrieval.scores import copy_step_stats
    from interp.stream.blockwise import attention_row_stats, row_argmax

    with one_thread():
        torch.manual_seed(4)
        B, H, T, d = 2, 2, 40, 16
        q, k = torch.randn(B, H, T, d) * 2, torch.randn(B, 1, T, d) * 2
        a = AttentionInputs(0, q, k, k, d**-0.5, True, window=25)
        lse = attention_row_stats(a, block=8).lse
        _, top = row_argmax(a, 0, T)
        ret = torch.tensor([[0, 30, 4], [0, 31, 29], [1, 12, 3], [1, 39, 20], [0, 33, 10]])
        ret[:3, 2] = top[ret[:3, 0], 0, ret[:3, 1]]  # three targets are the heads' argmax (head 0)
        ind = torch.tensor([[0, 20, 5], [1, 38, 37]])
        want = copy_step_stats(a, lse, ret, ind)
        calls = []
        monkeypatch.setattr(passes, "use_triton", lambda t: calls.append(t) or True)
        got = copy_step_stats(a, lse, ret, ind)
        assert calls  # the kernel ran
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
        assert float(want[0][:, 0].sum()) == 3 and float(want[0][3:, 0].sum()) == 0
