"""The stream engine on modern attention (issue 16): sliding windows, logit softcapping, ALiBi,
learned sink logits and padded keys, in the torch passes and the model's own output, and the guard
that refuses what it cannot reproduce.

References are independent of interp: a dense softmax written out here for the passes, and
tests/conformance.py's Hugging Face eager attention for the models (gpt_oss, gemma2, mistral,
gemma3: windows of 16 tokens, shorter than the 41-token probe).
"""

from __future__ import annotations

import math

import pytest
import torch

from interp.adapters.base import AttentionInputs
from interp.config import RunConfig
from interp.errors import UsageError
from interp.stream.blockwise import (
    attention_column_sums,
    attention_gathered,
    attention_output,
    attention_row_stats,
)
from tests import conformance

TOL = 1e-5

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# --------------------------------------------------------------------------------------------
# the passes against a dense softmax written out here


def _dense(a: AttentionInputs):
    """Weights over real keys, log-sum-exp (sink included) and output, all in float64."""
    H = a.q.shape[1]
    k = a.k.double().repeat_interleave(H // a.k.shape[1], dim=1)
    v = a.v.double().repeat_interleave(H // a.v.shape[1], dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", a.q.double(), k) * a.scale
    if a.softcap is not None:
        s = a.softcap * torch.tanh(s / a.softcap)
    T = s.shape[-1]
    qi, ki = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if a.bias_slopes is not None:
        s = s + a.bias_slopes.double()[:, None, None] * (ki - qi)
    hide = torch.zeros(T, T, dtype=torch.bool)
    if a.causal:
        hide |= ki > qi
    if a.window is not None:
        hide |= ki <= qi - a.window
    s = s.masked_fill(hide, -math.inf)
    if a.key_mask is not None:
        s = s.masked_fill(~a.key_mask[:, None, None, :], -math.inf)
    cols = [s]
    if a.sink is not None:
        cols.append(a.sink.double()[None, :, None, None].expand(*s.shape[:3], 1))
    full = torch.cat(cols, -1)
    lse = full.logsumexp(-1)
    A = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # a row that sees nothing: weights 0
    return A, lse, A @ v


FEATURES = {
    "window": dict(window=7),
    "softcap": dict(softcap=2.0),
    "alibi": dict(bias_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),
    "sink": dict(sink=torch.tensor([3.0, 0.0, -2.0, 1.0])),
}


@pytest.mark.parametrize("feature", [*FEATURES, "all"])
@pytest.mark.parametrize("causal", [True, False])
def test_passes_apply_each_feature_like_a_dense_softmax(feature, causal):
    torch.manual_seed(0)
    B, H, T, d = 2, 4, 53, 8  # ragged blocks of 16
    q, k, v = torch.randn(B, H, T, d) * 2, torch.randn(B, 2, T, d) * 2, torch.randn(B, 2, T, 6)
    kw = {k: v for f in FEATURES.values() for k, v in f.items()} if feature == "all" else FEATURES[feature]
    a = AttentionInputs(0, q, k, v, d**-0.5, causal, **kw)
    A, lse, out = _dense(a)
    _, plain_lse, _ = _dense(AttentionInputs(0, q, k, v, d**-0.5, causal))
    assert float((lse - plain_lse).abs().max()) > 0.05  # the feature changes what is compared
    r = attention_row_stats(a, block=16, values=True)
    torch.testing.assert_close(r.lse.double(), lse, rtol=0, atol=TOL)
    torch.testing.assert_close(torch.exp(r.max - r.lse).double(), A.amax(-1), rtol=0, atol=TOL)
    rest = torch.exp(r.max_rest - r.lse).double()
    torch.testing.assert_close(rest[..., 1:], A[..., 1:, 1:].amax(-1), rtol=0, atol=TOL)
    torch.testing.assert_close(r.out.double(), out, rtol=0, atol=TOL)
    torch.testing.assert_close(attention_output(a, block=16).double(), out, rtol=0, atol=TOL)
    received, totals = attention_column_sums(a, r.lse, block=16)
    torch.testing.assert_close(received.double(), A.sum(-2), rtol=0, atol=1e-4)
    assert float((totals - 1).abs().max()) < TOL  # the sink's share is counted in each row's total
    pairs = torch.stack([torch.randint(B, (400,)), torch.randint(T, (400,)), torch.randint(T, (400,))], -1)
    got = attention_gathered(a, r.lse, pairs)
    torch.testing.assert_close(got.double(), A[pairs[:, 0], :, pairs[:, 1], pairs[:, 2]], rtol=0, atol=TOL)


def test_padded_keys_and_queries():
    torch.manual_seed(2)
    B, H, T, d = 2, 2, 40, 8
    q, k, v = torch.randn(B, H, T, d), torch.randn(B, H, T, d), torch.randn(B, H, T, d)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :5] = False  # left padding
    mask[1, 33:] = False  # right padding
    a = AttentionInputs(0, q, k, v, 0.5, True, key_mask=mask, window=12)
    A, _, out = _dense(a)
    r = attention_row_stats(a, block=16, values=True)
    live = mask[:, None, :].expand(B, H, T)
    torch.testing.assert_close(r.out.double()[live], out[live], rtol=0, atol=TOL)
    assert (r.lse[0, :, :5] == 0).all() and (r.out[0, :, :5] == 0).all()  # rows that see nothing
    received, totals = attention_column_sums(a, r.lse, block=16)
    want = (A * live[..., None]).sum(-2)  # padded queries give no mass
    torch.testing.assert_close(received.double(), want, rtol=0, atol=1e-4)
    assert float(received[0, :, :5].abs().max()) == 0 and float(received[1, :, 33:].abs().max()) == 0
    torch.testing.assert_close(totals, live.float(), rtol=0, atol=TOL)


def test_a_window_reads_only_the_band(monkeypatch):
    """Cost O(T x window): the tiles read cover the band, not the causal triangle."""
    import interp.stream.blockwise as bw

    seen: list[int] = []
    tile = bw.logits_tile
    monkeypatch.setattr(
        bw, "logits_tile", lambda a, q0, q1, k0, k1: seen.append((q1 - q0) * (k1 - k0)) or tile(a, q0, q1, k0, k1)
    )
    T, W, block = 512, 32, 32
    q = torch.randn(1, 1, T, 8)
    for window, limit in ((None, T * (T + block) / 2), (W, T * (W + 2 * block))):
        seen.clear()
        bw.attention_row_stats(AttentionInputs(0, q, q, q, 1.0, True, window=window), block=block)
        assert sum(seen) <= limit, (window, sum(seen))
    assert sum(seen) < T * T / 4  # the band reads under a quarter of the causal triangle's tiles


# --------------------------------------------------------------------------------------------
# the models: stream = pattern = Hugging Face


def _model(family: str, seed: int = 0, edit=None):
    from interp.models import from_hf_model
    from interp.probes import repeated_tokens

    ref, tok = conformance.build(family, seed)
    hf, _ = conformance.build(family, seed)
    for m in (ref, hf):
        if edit is not None:
            edit(m)
    model = from_hf_model(hf, tok, name=family)
    probe = repeated_tokens(model, batch=2, block_len=20, n_repeats=2, seed=seed)
    return ref, model, probe


def _errors(family: str, edit=None) -> dict[str, float]:
    """Largest error against Hugging Face per statistic and engine."""
    from interp.heads import head_scores
    from interp.sinks import sink_scores

    ref, model, probe = _model(family, edit=edit)
    patterns = conformance.hf_patterns(ref, probe.tokens)
    body, special = (probe.body_start, probe.body_end), set(probe.special_token_ids)
    want = conformance.reference_head_scores(patterns, probe.tokens, body, special, True)
    want.update(conformance.reference_sink_stats(patterns, True))
    err = {}
    for engine in ("pattern", "stream"):
        hs = head_scores(model, probe, config=RunConfig(engine=engine, n_boot=10), copying=False)
        sr = sink_scores(model, probe, config=RunConfig(engine=engine, n_boot=10))
        for name in ("prev_token", "induction"):
            err[f"{engine} {name}"] = conformance._max_err(hs.grid(name), want[name])
        for name in ("first_mass", "confidence", "learned_sink_mass"):
            err[f"{engine} {name}"] = conformance._max_err(sr.grid(name), want[name])
    return err


@pytest.mark.parametrize("family", ["gpt_oss", "gpt_oss_128", "gemma2", "mistral", "gemma3"])
def test_stream_equals_pattern_equals_hugging_face(family):
    err = _errors(family)
    assert max(err.values()) < TOL, err


def test_a_large_sink_logit_absorbs_its_head():
    def big_sink(m):
        with torch.no_grad():
            m.model.layers[1].self_attn.sinks[2] = 30.0

    from interp.sinks import sink_scores

    ref, model, probe = _model("gpt_oss", edit=big_sink)
    want = conformance.reference_sink_stats(conformance.hf_patterns(ref, probe.tokens), True)["learned_sink_mass"]
    assert float(want[1, 2]) > 0.9 and float(want[0].max()) < 0.5
    for engine in ("pattern", "stream"):
        r = sink_scores(model, probe, config=RunConfig(engine=engine, n_boot=10))
        grid = torch.as_tensor(r.grid("learned_sink_mass"))
        assert float(grid[1, 2]) > 0.9, engine
        torch.testing.assert_close(grid.float(), want, rtol=0, atol=TOL)
        row = r.tokens[r.tokens["token"] == "<learned sink>"]
        assert len(row) == 1 and row["role"].item() == "learned sink"
        assert r.meta["learned_sinks"] is True


def test_models_without_sinks_have_no_learned_sink_row(toy_model=None):
    from interp.models import load_model
    from interp.probes import repeated_tokens
    from interp.sinks import sink_scores

    toy = load_model("toy", device="cpu")
    probe = repeated_tokens(toy, batch=2, block_len=20)
    for engine in ("pattern", "stream"):
        r = sink_scores(toy, probe, config=RunConfig(engine=engine, n_boot=10))
        assert float(abs(r.grid("learned_sink_mass")).max()) < 1e-6
        assert "<learned sink>" not in set(r.tokens["token"]) and r.meta["learned_sinks"] is False


# --------------------------------------------------------------------------------------------
# the guard


def test_the_guard_refuses_attention_it_cannot_capture_before_any_work():
    from interp.heads import head_scores

    _, model, probe = _model("bloom")
    calls: list[tuple[int, ...]] = []
    embed = model.original_model.get_input_embeddings()
    handle = embed.register_forward_hook(lambda m, args, out: calls.append(tuple(args[0].shape)))
    try:
        with pytest.raises(UsageError) as e:
            head_scores(model, probe, config=RunConfig(engine="stream", n_boot=10), copying=False)
    finally:
        handle.remove()
    assert str(e.value) == (
        "the stream engine cannot run bloom (BloomAttention): its attention does not call Hugging Face's "
        "attention interface (no q and k from layer(s) [0, 1]); use engine='pattern'"
    )
    assert calls == [(1, probe.seq_len)]  # the guard's prefix of the first sequence only: the probe never ran


def test_the_guard_catches_a_wrong_statistic(monkeypatch):
    """The bug of issue 16 (sinks left out of the denominator) is refused, with the error's size."""
    import interp.adapters.bridge as bridge
    from interp.sinks import sink_scores

    _, model, probe = _model("gpt_oss_128")
    monkeypatch.setattr(bridge, "_sink_logits", lambda module, kwargs: None)
    with pytest.raises(UsageError, match=r"^the stream engine does not reproduce gpt_oss \(GptOssAttention\)'s own "
                       r"attention on a 41-token prefix \(max weight error [\d.e+-]+ in layer \d\): use engine=\'pattern\'$"):  # fmt: skip
        sink_scores(model, probe, config=RunConfig(engine="stream", n_boot=10))


# --------------------------------------------------------------------------------------------
# output gates (qwen3_next): the hook point, with planted gates


def test_output_gate_means_read_the_planted_gates():
    """Gate rows of q_proj zeroed: sigmoid(0) = 0.5 on every head; head 3's gate made large: 1."""
    from interp.adapters.bridge import gated_attention_modules, output_gate_means

    hf, _ = conformance.build("qwen3_next")
    attn = gated_attention_modules(hf)
    assert list(attn) == [1]  # layer 0 is linear attention
    d, w = attn[1].head_dim, attn[1].q_proj.weight
    with torch.no_grad():
        for h in range(conformance.N_HEADS):
            w[h * 2 * d + d : (h + 1) * 2 * d] = 0.0
        bias = torch.zeros(w.shape[0]) if attn[1].q_proj.bias is None else attn[1].q_proj.bias.detach().clone()
        bias[3 * 2 * d + d : 4 * 2 * d] = 40.0
        attn[1].q_proj.bias = torch.nn.Parameter(bias)
    got: dict[int, torch.Tensor] = {}
    with torch.no_grad(), output_gate_means(hf, lambda layer, mean: got.__setitem__(layer, mean)) as gated:
        hf(torch.randint(1, 200, (2, 12)))
    assert gated and list(got) == [1] and got[1].shape == (2, conformance.N_HEADS)
    want = torch.tensor([0.5, 0.5, 0.5, 1.0]).expand(2, -1)
    torch.testing.assert_close(got[1], want, rtol=0, atol=1e-6)
    assert gated_attention_modules(conformance.build("llama")[0]) == {}
