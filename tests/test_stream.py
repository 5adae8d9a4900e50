"""The stream engine: pattern-free statistics equal the pattern engine's, on every architecture.

Known answers come from an independent computation: the explicit softmax for the blockwise passes,
the probes' [q, k] masks for the target pairs, and the pattern engine (hooks on hook_pattern) for
every statistic of head_scores and sink_scores on tiny GPT-2, Llama-style (rotary, grouped K/V),
BERT and the trained toy.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from interp.config import RunConfig
from interp.errors import UsageError
from interp.heads import attention_scores, head_scores, uniform_baseline
from interp.models import describe, from_hf_model, load_model
from interp.probes import TokenProbe, random_tokens, repeated_tokens
from interp.report.roles import uniform_baselines
from interp.sinks import sink_scores
from interp.sinks.stats import sink_statistics
from interp.stream.blockwise import column_sums, gathered_weights, row_stats
from interp.stream.budget import choose_engine
from interp.stream.guard import check_stream_conformance
from tests.helpers import VOCAB, llama_model

TOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def llama_tiny():
    return from_hf_model(llama_model(n_positions=2048), name="llama-tiny")


@pytest.fixture(scope="module")
def toy():
    return load_model("toy", device="cpu")


@pytest.fixture
def models(request, gpt2_tiny, bert_tiny, llama_tiny, toy):
    return {"gpt2": gpt2_tiny, "bert": bert_tiny, "llama": llama_tiny, "toy": toy}


# --------------------------------------------------------------------------------------------
# the blockwise passes against the explicit softmax


def _reference(q, k, scale, causal):
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if causal:
        T = s.shape[-1]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return s, s.softmax(-1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_blockwise_passes_match_the_softmax(causal, kv_heads):
    torch.manual_seed(1)
    B, H, T, d = 2, 4, 203, 16  # 203 = 3 blocks of 64 and a ragged one
    q, k = torch.randn(B, H, T, d) * 2, torch.randn(B, kv_heads, T, d) * 2
    scale = d**-0.5
    s, A = _reference(q, k, scale, causal)
    rows = row_stats(q, k, scale, causal, block=64)
    torch.testing.assert_close(rows.lse.double(), s.logsumexp(-1), rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.exp(rows.max - rows.lse).double(), A.amax(-1), rtol=0, atol=TOL)
    rest = torch.exp(rows.max_rest - rows.lse).double()
    torch.testing.assert_close(rest[..., 1:], A[..., 1:].amax(-1)[..., 1:], rtol=0, atol=TOL)
    if causal:  # query 0 sees key 0 only: no weight beyond the first position
        assert (rest[..., 0] == 0).all()
    received, row_sums = column_sums(q, k, rows.lse, scale, causal, block=64)
    torch.testing.assert_close(received.double(), A.sum(-2), rtol=0, atol=1e-4)
    assert float((row_sums - 1).abs().max()) < 1e-5
    pairs = torch.stack([torch.randint(B, (500,)), torch.randint(T, (500,)), torch.randint(T, (500,))], -1)
    if causal:
        pairs[:, 2] = torch.minimum(pairs[:, 1], pairs[:, 2])
    got = gathered_weights(q, k, rows.lse, scale, pairs, chunk=128)
    want = A[pairs[:, 0], :, pairs[:, 1], pairs[:, 2]]
    torch.testing.assert_close(got.double(), want, rtol=0, atol=TOL)
    assert float(A.amax(-1).min()) > 0.05  # the weights compared are far above the tolerance


# --------------------------------------------------------------------------------------------
# target pairs == the probes' masks, with and without repeats inside a block


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("vocab", [1000, 12])  # 12: tokens repeat many times inside a block
def test_target_pairs_are_the_masks(causal, vocab):
    gen = torch.Generator().manual_seed(0)
    block = torch.randint(1, vocab, (3, 90), generator=gen)
    body = block.repeat(1, 2)
    tokens = torch.cat([torch.zeros(3, 1, dtype=torch.long), body, torch.zeros(3, 1, dtype=torch.long)], 1)
    probe = TokenProbe(tokens, 1, 181, causal, frozenset({0}), block_len=90, n_repeats=2)
    for pairs, mask in (
        (probe.duplicate_pairs(), probe.duplicate_mask()),
        (probe.induction_pairs(), probe.induction_mask()),
    ):
        assert len(pairs) >= 3 * 90 * (1 if vocab > 100 else 10)
        assert sorted(map(tuple, pairs.tolist())) == sorted(map(tuple, mask.nonzero().tolist()))
    prev = torch.zeros(probe.batch, probe.seq_len, probe.seq_len, dtype=torch.bool)
    b, q, k = probe.prev_pairs().unbind(-1)
    prev[b, q, k] = True
    rows = torch.arange(1, probe.seq_len)
    assert torch.equal(prev[:, rows, rows - 1], probe.prev_query_mask()[:, 1:])
    assert prev.sum() == probe.prev_query_mask()[:, 1:].sum()
    assert len(probe.prev_pairs(every_query=True)) == 3 * (probe.seq_len - 1)
    # the uniform baselines, read from the pairs, equal the mask computation
    keys = torch.arange(1, 183).float() if causal else torch.full((182,), 182.0)
    for name, mask in (
        ("prev_token", prev),
        ("duplicate", probe.duplicate_mask()),
        ("induction", probe.induction_mask()),
    ):
        has = mask.any(-1)
        want = float((mask.sum(-1) / keys)[has].mean())
        assert uniform_baselines(probe)[name] == pytest.approx(want, rel=1e-6)
    assert uniform_baseline(probe) == pytest.approx(uniform_baselines(probe)["induction"], rel=1e-6)


def test_long_blocks_draw_without_replacement_when_the_vocabulary_allows(llama_tiny):
    probe = repeated_tokens(llama_tiny, batch=1, block_len=VOCAB - 1, n_repeats=2)
    assert len(probe.duplicate_pairs()) == VOCAB - 1  # each token once per block: one earlier copy
    assert probe.meta["distinct_in_block"] is True
    probe = repeated_tokens(llama_tiny, batch=1, block_len=VOCAB + 50, n_repeats=2)
    assert probe.meta["distinct_in_block"] is False


# --------------------------------------------------------------------------------------------
# stream == pattern for every statistic, on every architecture


@pytest.mark.parametrize("model_name", ["gpt2", "llama", "bert", "toy"])
def test_head_statistics_stream_equals_pattern(models, model_name):
    model = models[model_name]
    block = 120 if model_name != "llama" else 1000  # llama: T = 2001, rotary far from position 0
    probe = repeated_tokens(model, batch=2 if model_name != "llama" else 1, block_len=block, seed=3)
    for queries in ("targets", "all"):
        num_p, den_p = attention_scores(model, probe, queries=queries, config=RunConfig(engine="pattern"))
        num_s, den_s = attention_scores(model, probe, queries=queries, config=RunConfig(engine="stream"))
        for name in num_p:
            torch.testing.assert_close(num_s[name], num_p[name], rtol=0, atol=TOL * den_p[name].max())
            torch.testing.assert_close(den_s[name], den_p[name], rtol=TOL, atol=0)
            ratio = num_p[name] / den_p[name]
            assert float(ratio.max()) > 100 * TOL  # the scores compared stand far above the tolerance


@pytest.mark.parametrize("model_name", ["gpt2", "llama", "bert", "toy"])
def test_sink_statistics_stream_equals_pattern(models, model_name):
    model = models[model_name]
    probe = random_tokens(model, batch=2, seq_len=150, seed=2)
    p = sink_statistics(model, probe, config=RunConfig(engine="pattern"))
    s = sink_statistics(model, probe, config=RunConfig(engine="stream"))
    T = probe.seq_len
    torch.testing.assert_close(s.received / T, p.received / T, rtol=0, atol=TOL)
    for field in ("confidence", "confidence_no_first"):
        torch.testing.assert_close(getattr(s, field) / T, getattr(p, field) / T, rtol=0, atol=TOL)
    for field in ("value_norm", "resid_max", "resid_median", "resid_top", "resid_seq_median"):
        torch.testing.assert_close(getattr(s, field), getattr(p, field), rtol=TOL, atol=TOL)
    assert s.massive == p.massive
    assert s.max_row_deviation < TOL
    assert float(p.received[..., 0].min()) / T > 100 * TOL


def test_reports_are_the_same_tables(toy):
    probe = random_tokens(toy, batch=3, seq_len=100)
    a, b = (
        sink_scores(toy, probe, config=RunConfig(engine="pattern", n_boot=100)),
        sink_scores(toy, probe, config=RunConfig(engine="stream", n_boot=100)),
    )
    for name in ("layers", "positions", "tokens"):
        fa, fb = getattr(a, name), getattr(b, name)
        assert list(fa.columns) == list(fb.columns) and len(fa) == len(fb)
    ta, tb = a.heads.table, b.heads.table
    assert list(ta.columns) == list(tb.columns)
    for col in ta.columns:
        if ta[col].dtype.kind == "f":
            assert float((ta[col] - tb[col]).abs().max()) < TOL, col
    probe = repeated_tokens(toy, batch=3, block_len=60)
    ha, hb = (
        head_scores(toy, probe, config=RunConfig(engine="pattern", n_boot=100)),
        head_scores(toy, probe, config=RunConfig(engine="stream", n_boot=100)),
    )
    assert ha.top("induction")[0] == 1 and hb.top("induction") == ha.top("induction")
    for col in ha.table.columns:
        if ha.table[col].dtype.kind == "f":
            assert float((ha.table[col] - hb.table[col]).abs().max()) < TOL, col


# --------------------------------------------------------------------------------------------
# the model's own attention never forms the pattern; auto picks the engine by the budget


def test_stream_never_forms_the_pattern(llama_tiny, gpt2_tiny, bert_tiny, toy, monkeypatch):
    """Bridges fire hook_pattern whenever their attention forms it; the toy forms it in one function."""
    import interp.toy.attention as toy_attention

    formed: list[int] = []
    logits = toy_attention.attention_logits
    monkeypatch.setattr(toy_attention, "attention_logits", lambda *a, **k: formed.append(1) or logits(*a, **k))
    for model in (llama_tiny, gpt2_tiny, bert_tiny, toy):
        describe(model)  # once per model, describe() looks at a 4-token pattern to see causality
        # once per model, the stream engine's guard compares a 64-token prefix with the pattern
        check_stream_conformance(model, repeated_tokens(model, batch=1, block_len=30).tokens)
    for model in (llama_tiny, gpt2_tiny, bert_tiny):
        model.blocks[0].attn.hook_pattern.register_forward_hook(lambda *_: formed.append(1))
    try:
        for model in (llama_tiny, gpt2_tiny, bert_tiny, toy):
            probe = repeated_tokens(model, batch=1, block_len=30)
            attention_scores(model, probe, config=RunConfig(engine="stream"))
            sink_statistics(model, probe, config=RunConfig(engine="stream"))
            assert formed == [], type(model).__name__
            attention_scores(model, probe, config=RunConfig(engine="pattern"))
            assert formed, type(model).__name__
            formed.clear()
    finally:
        for model in (llama_tiny, gpt2_tiny, bert_tiny):
            model.blocks[0].attn.hook_pattern._forward_hooks.clear()


def test_a_toy_built_without_flash_streams_on_its_flash_path(monkeypatch):
    import interp.toy.attention as toy_attention
    from interp.toy import ToyConfig, ToyTransformer

    torch.manual_seed(0)
    model = ToyTransformer(ToyConfig(d_model=32, n_heads=2, n_ctx=64, d_vocab=50, use_flash=False)).eval()
    probe = repeated_tokens(model, batch=2, block_len=20)
    want, _ = attention_scores(model, probe, config=RunConfig(engine="pattern"))
    check_stream_conformance(model, probe.tokens)  # the guard's prefix forms a pattern, once per model
    formed: list[int] = []
    logits = toy_attention.attention_logits
    monkeypatch.setattr(toy_attention, "attention_logits", lambda *a, **k: formed.append(1) or logits(*a, **k))
    got, _ = attention_scores(model, probe, config=RunConfig(engine="stream"))
    assert formed == [] and not any(block.attn.use_flash for block in model.blocks)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=TOL)


def test_the_model_is_unchanged_after_streaming(llama_tiny):
    tokens = repeated_tokens(llama_tiny, batch=1, block_len=20).tokens
    with torch.no_grad():
        before = llama_tiny(tokens)
        attention_scores(
            llama_tiny, repeated_tokens(llama_tiny, batch=1, block_len=20), config=RunConfig(engine="stream")
        )
        after = llama_tiny(tokens)
    assert torch.equal(before, after)
    assert llama_tiny.original_model.config._attn_implementation == "eager"
    assert "forward" not in llama_tiny.blocks[0].attn.__dict__


def test_auto_streams_only_past_the_budget(toy):
    probe = repeated_tokens(toy, batch=2, block_len=50)  # 2 x 4 x 101 x 101 x 4 bytes = 319 KiB a layer
    assert choose_engine("auto", toy, 2, probe.seq_len)[0] == "pattern"
    engine, why = choose_engine("auto", toy, 2, probe.seq_len, budget=300 * 1024)
    assert (
        engine == "stream"
        and why == "stream (one layer's pattern for 2 x 101 tokens takes 0.311 MiB, over the 0.293 MiB budget)"
    )
    scores = head_scores(toy, probe, config=RunConfig(n_boot=10))
    assert scores.meta["engine"] == "pattern"
    assert head_scores(toy, probe, config=RunConfig(n_boot=10, budget=300 * 1024)).meta["engine"] == "stream"
    with pytest.raises(UsageError, match=r"unknown engine 'fast': choose from \['auto', 'pattern', 'stream'\]"):
        head_scores(toy, probe, config=RunConfig(engine="fast"))


# --------------------------------------------------------------------------------------------
# the CLIs


def test_clis_take_the_engine_and_say_which_ran(gpt2_dir, tmp_path, capsys):
    from interp.cli.induction import cli as induction
    from interp.cli.sinks import cli as sinks

    common = ["--model", str(gpt2_dir), "--batch", "3", "--device", "cpu", "--no-progress"]
    tables = {}
    for engine in ("pattern", "stream"):
        out = tmp_path / engine
        assert induction([*common, "--seq-len", "30", "--out", str(out), "--engine", engine]) == 0
        printed = capsys.readouterr().out
        assert f"engine: {engine} (asked for; one layer's pattern for 3 x 61 tokens takes 0.17 MiB)" in printed
        tables[engine] = pd.read_csv(out / "induction.csv", dtype={"label": str})
        assert sinks([*common, "--seq-len", "40", "--out", str(out), "--engine", engine]) == 0
        assert f"engine: {engine} (asked for" in capsys.readouterr().out
        tables[f"sinks_{engine}"] = pd.read_csv(out / "sinks.csv", dtype={"label": str})
    for a, b in (("pattern", "stream"), ("sinks_pattern", "sinks_stream")):
        cols = [c for c in tables[a].columns if tables[a][c].dtype.kind == "f"]
        assert float((tables[a][cols] - tables[b][cols]).abs().max().max()) < TOL
    assert induction([*common, "--seq-len", "30", "--out", str(tmp_path / "a")]) == 0
    assert "engine: pattern (one layer's pattern for 3 x 61 tokens takes 0.17 MiB, within the 1 GiB budget)" in (
        capsys.readouterr().out
    )
    with pytest.raises(SystemExit) as e:
        induction([*common, "--engine", "flash"])
    assert e.value.code == 2
    assert "argument --engine: invalid choice: 'flash'" in capsys.readouterr().err


def test_stream_runs_form_no_query_by_key_mask(gpt2_dir, tmp_path, monkeypatch):
    """At long T a [batch, T, T] target mask is as big as a pattern: the stream path never builds one."""
    from interp.cli.induction import cli as induction
    from interp.cli.sinks import cli as sinks

    def refuse(*_):
        raise AssertionError("a [batch, T, T] mask was built")

    for name in ("duplicate_mask", "induction_mask", "second_repeat_mask"):
        monkeypatch.setattr(TokenProbe, name, refuse)
    common = ["--model", str(gpt2_dir), "--batch", "2", "--device", "cpu", "--no-progress", "--engine", "stream"]
    assert induction([*common, "--seq-len", "20", "--out", str(tmp_path / "i")]) == 0
    assert sinks([*common, "--seq-len", "20", "--out", str(tmp_path / "s")]) == 0


def test_a_sliding_window_streams_exactly():
    """A window shorter than the probe (issue 16: it used to be refused) streams like the pattern engine."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(
        num_hidden_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        sliding_window=8,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = from_hf_model(MistralForCausalLM(cfg).eval())
    probe = repeated_tokens(model, batch=1, block_len=20)
    want, _ = attention_scores(model, probe, config=RunConfig(engine="pattern"))
    got, _ = attention_scores(model, probe, config=RunConfig(engine="stream"))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=TOL)
    assert float(want["induction"].abs().max()) == 0  # induction targets lie outside the 8-token band
    assert model.original_model.config._attn_implementation == "eager"  # restored after the run
