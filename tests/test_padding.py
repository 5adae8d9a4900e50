"""Padded probes: texts of different lengths in one batch give, text by text, what each gives alone.

Three texts of 12, 20 and 31 words (each a random block that then repeats, so every score has
targets) are padded right and left; each analysis is run on the padded batch and on each text alone,
and the per-sequence numbers are compared. Models: a tiny GPT-2 (learned positions) and a tiny
Llama-style decoder (rotary positions), both behind TransformerLens bridges, and the bundled toy.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor

from interp.ablation.gradient import gradient_importance
from interp.ablation.metrics import lm_loss
from interp.ablation.replay import Sweeper
from interp.adapters import run_with_reducers
from interp.config import RunConfig
from interp.errors import AblationError, UsageError
from interp.heads import attention_scores, head_scores, uniform_baselines
from interp.models import from_hf_model, load_model
from interp.probes import TokenProbe
from interp.sinks import sink_scores
from interp.sinks.stats import sink_statistics
from tests.helpers import gpt2_model, llama_model, one_thread, word_tokenizer

LENGTHS = (12, 20, 31)
PADDINGS = ("right", "left")


def _text(n: int, seed: int) -> str:
    """``n`` words: a random block of ``n // 2`` words, then the block again (cut to ``n``)."""
    gen = torch.Generator().manual_seed(seed)
    block = (torch.randperm(290, generator=gen)[: n // 2] + 5).tolist()
    words = (block * 3)[:n]
    return " ".join(f"w{i}" for i in words)


TEXTS = [_text(n, seed) for seed, n in enumerate(LENGTHS)]


def _tokenizer(tmp_path_factory):
    """The word tokenizer, saved and reloaded (TransformerLens rebuilds it from its folder and gives it
    a pad token: its EOS)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("word-tok")
    word_tokenizer().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tok = _tokenizer(tmp_path_factory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "gpt2": from_hf_model(gpt2_model(initializer_range=0.3), tok, name="gpt2-pad"),
            "llama": from_hf_model(llama_model(), tok, name="llama-pad"),
        }


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def _alone(model, i: int) -> TokenProbe:
    return TokenProbe.from_texts(model, TEXTS[i])


# ---- the probe ----------------------------------------------------------------------------------


@pytest.mark.parametrize("padding", PADDINGS)
def test_from_texts_pads_with_a_mask_and_targets_never_touch_padding(models, padding):
    model = models["gpt2"]
    probe = TokenProbe.from_texts(model, TEXTS, padding=padding)
    assert probe.seq_len == 1 + max(LENGTHS)  # BOS + the longest text: nothing is cut
    assert probe.lengths().tolist() == [1 + n for n in LENGTHS]
    real = probe.attention_mask
    for i, n in enumerate(LENGTHS):
        row = real[i].nonzero().squeeze(-1)
        assert (row[0], row[-1]) == ((0, n) if padding == "right" else (max(LENGTHS) - n, max(LENGTHS)))
        # the real tokens are the text's own, BOS first
        assert probe.tokens[i, real[i]].tolist() == _alone(model, i).tokens[0].tolist()
    for pairs in (probe.prev_pairs(), probe.duplicate_pairs(), probe.induction_pairs()):
        assert len(pairs) > 0
        b, q, k = pairs.unbind(-1)
        assert bool(real[b, q].all()) and bool(real[b, k].all())
    assert probe.right_padded().attention_mask[:, 0].all()
    # per-row targets equal each text's alone, shifted by the row's padding
    for name in ("prev_pairs", "duplicate_pairs", "induction_pairs"):
        pairs = getattr(probe, name)()
        for i in range(3):
            mine = pairs[pairs[:, 0] == i][:, 1:] - probe.offsets()[i]
            alone = getattr(_alone(model, i), name)()[:, 1:]
            assert sorted(map(tuple, mine.tolist())) == sorted(map(tuple, alone.tolist()))


def test_from_tokens_takes_a_mask(models):
    model = models["llama"]
    bodies = [model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    T = max(LENGTHS)
    ids = torch.full((3, T), 7)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, b in enumerate(bodies):
        ids[i, T - len(b) :], mask[i, T - len(b) :] = torch.tensor(b), 1
    probe = TokenProbe.from_tokens(model, ids, attention_mask=mask)  # the BOS goes before each text
    assert probe.meta["padding"] == "left"
    padded = TokenProbe.from_texts(model, TEXTS, padding="left")
    assert torch.equal(probe.attention_mask, padded.attention_mask)
    assert torch.equal(probe.tokens[probe.attention_mask], padded.tokens[padded.attention_mask])
    again = TokenProbe.from_tokens(model, padded.tokens, attention_mask=padded.attention_mask, framed=True)
    assert torch.equal(again.tokens, padded.tokens) and torch.equal(again.attention_mask, padded.attention_mask)


def test_seq_len_still_cuts(models):
    probe = TokenProbe.from_texts(models["gpt2"], TEXTS, seq_len=12)
    assert probe.attention_mask is None and probe.seq_len == 13
    mixed = TokenProbe.from_texts(models["gpt2"], TEXTS, seq_len=25)  # 12 stays 12: padded
    assert mixed.lengths().tolist() == [13, 21, 26]


def test_unpadded_probes_carry_no_mask(models):
    probe = TokenProbe.from_texts(models["gpt2"], [TEXTS[0], TEXTS[0]])
    assert probe.attention_mask is None and probe.position_ids() is None


# ---- position ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_left_padding_gives_each_text_its_own_logits(models, name):
    """Learned (GPT-2) and rotary (Llama) positions: a left-padded text's logits at its real
    positions are the text's alone. With learned positions, arange positions (the trap) would not
    give them; rotary attention sees only position differences, which a shift keeps."""
    model = models[name]
    probe = TokenProbe.from_texts(model, TEXTS, padding="left")
    logits = run_with_reducers(model, probe.tokens, [], attention_mask=probe.attention_mask)
    arange = torch.arange(probe.seq_len)[None].expand(3, -1)
    with torch.no_grad():
        shifted = model(probe.tokens, attention_mask=probe.attention_mask.long(), position_ids=arange)
    for i in range(3):
        alone = run_with_reducers(model, _alone(model, i).tokens, [])[0]
        real = probe.attention_mask[i]
        torch.testing.assert_close(logits[i, real], alone, atol=1e-5, rtol=0)
        if i < 2 and name == "gpt2":  # padded rows: positions counted from the row's start are wrong
            assert float((shifted[i, real] - alone).abs().max()) > 1e-2


def test_toy_takes_padded_probes():
    toy = load_model("toy", device="cpu")
    texts = ["the cat sat on the mat. the cat", "a dog"]
    for padding in PADDINGS:
        probe = TokenProbe.from_texts(toy, texts, padding=padding)
        logits = run_with_reducers(toy, probe.tokens, [], attention_mask=probe.attention_mask)
        for i, t in enumerate(texts):
            alone = run_with_reducers(toy, TokenProbe.from_texts(toy, t).tokens, [])[0]
            torch.testing.assert_close(logits[i, probe.attention_mask[i]], alone, atol=1e-4, rtol=0)


# ---- the pattern engine ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("padding", PADDINGS)
def test_pattern_scores_of_each_text_are_its_own(models, name, padding):
    model = models[name]
    probe = TokenProbe.from_texts(model, TEXTS, padding=padding)
    for queries in ("targets", "all"):
        num, den = attention_scores(model, probe, queries=queries)
        for i in range(3):
            n1, d1 = attention_scores(model, _alone(model, i), queries=queries)
            for score in num:
                torch.testing.assert_close(num[score][i], n1[score][0], atol=1e-5, rtol=0)
                torch.testing.assert_close(den[score][i], d1[score][0], atol=1e-5, rtol=0)
    # the uniform baselines count the keys each text's queries see
    alone = [uniform_baselines(_alone(model, i)) for i in range(3)]
    one_row = [uniform_baselines(probe.select([i])) for i in range(3)]
    for a, b in zip(alone, one_row):
        assert a == pytest.approx(b)


def test_auto_engine_chooses_by_the_budget_for_padded_probes_too(models):
    """Padding no longer steers the engine: a tiny budget streams a padded probe, as an unpadded one."""
    model = models["gpt2"]
    probe = TokenProbe.from_texts(model, TEXTS, padding="left")
    scores = head_scores(model, probe, config=RunConfig(engine="auto", budget=1, n_boot=10), copying=False)
    assert scores.meta["engine"] == "stream"
    pattern = head_scores(model, probe, config=RunConfig(engine="pattern", n_boot=10), copying=False)
    for name in ("prev_token", "duplicate", "induction", "current"):
        torch.testing.assert_close(scores.grid(name), pattern.grid(name), atol=1e-5, rtol=0)
    report = sink_scores(model, probe, config=RunConfig(engine="auto", budget=1, n_boot=10))
    assert report.meta["engine"] == "stream"
    pattern = sink_scores(model, probe, config=RunConfig(engine="pattern", n_boot=10))
    for name in ("first_mass", "confidence"):
        torch.testing.assert_close(report.grid(name), pattern.grid(name), atol=1e-5, rtol=0)


SINK_FIELDS = ("received", "confidence", "confidence_no_first", "value_norm", "resid_max", "resid_median")
SINK_FIELDS += ("resid_top", "resid_seq_median")


def _same_statistics(got, want, i: int, j: int, atol: float = 1e-5) -> float:
    """Row ``i`` of ``got`` equals row ``j`` of ``want`` over ``want``'s positions (NaN where both
    are NaN); past them ``got`` holds 0 (received mass) or NaN. To ``atol`` plus a relative 1e-6:
    the fields are sums over up to 32 queries (up to about 10) and residual magnitudes (about 25),
    where float32 rounding of the fused and the eager paths differs by an ulp or a few. Returns the
    largest error."""
    n = want.received.shape[-1]
    worst = 0.0
    for field in SINK_FIELDS:
        a, b = getattr(got, field)[i], getattr(want, field)[j]
        if field == "value_norm" or field.startswith("resid_m"):  # [layer, pos, ...]
            assert bool(a[:, n:].isnan().all()), field
            a = a[:, :n]
        elif field == "received":
            assert float(a[..., n:].abs().sum()) == 0
            a = a[..., :n]
        torch.testing.assert_close(a, b, atol=atol, rtol=1e-6, equal_nan=True, msg=field)
        worst = max(worst, float((a - b).nan_to_num(0.0).abs().max()))
    return worst


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("padding", PADDINGS)
def test_stream_scores_of_each_text_are_its_own(models, name, padding):
    """The stream engine on a padded batch: head-score numerators and denominators and every sink
    statistic of each text equal the text alone (pattern engine) to 1e-5, and equal the pattern
    engine on the same padded batch."""
    model = models[name]
    probe = TokenProbe.from_texts(model, TEXTS, padding=padding)
    for queries in ("targets", "all"):
        num, den = attention_scores(model, probe, config=RunConfig(engine="stream"), queries=queries)
        pnum, pden = attention_scores(model, probe, config=RunConfig(engine="pattern"), queries=queries)
        for i in range(3):
            n1, d1 = attention_scores(model, _alone(model, i), config=RunConfig(engine="pattern"), queries=queries)
            for score in num:
                torch.testing.assert_close(num[score][i], n1[score][0], atol=1e-5, rtol=0)
                torch.testing.assert_close(den[score][i], d1[score][0], atol=1e-5, rtol=0)
        for score in num:
            torch.testing.assert_close(num[score], pnum[score], atol=1e-5, rtol=0)
            torch.testing.assert_close(den[score], pden[score], atol=1e-5, rtol=0)
    kw = dict(abs_threshold=1e-3, rel_threshold=3.0)
    stats = sink_statistics(model, probe, config=RunConfig(engine="stream"), **kw)
    pattern = sink_statistics(model, probe, config=RunConfig(engine="pattern"), **kw)
    for i in range(3):
        one = sink_statistics(model, _alone(model, i), **kw)
        _same_statistics(stats, one, i, 0)
        mine = sorted((m[0], m[2], m[3]) for m in stats.massive if m[1] == i)
        assert mine == sorted((m[0], m[2], m[3]) for m in one.massive)
    assert any(m[1] == 2 for m in stats.massive)  # the thresholds make the comparison bite
    for field in SINK_FIELDS:
        torch.testing.assert_close(getattr(stats, field), getattr(pattern, field), atol=1e-5, rtol=1e-6, equal_nan=True)
    assert stats.max_row_deviation < 1e-5


@pytest.mark.parametrize("padding", PADDINGS)
def test_stream_on_padded_gpt_oss_is_each_text_alone(padding):
    """Learned sink logits and a sliding window shorter than the texts (a tiny GPT-OSS): per row the
    sink share (stored as the pattern engine stores it: ``T`` x the row's mean over its real
    queries) and every statistic are the text's alone through the stream engine, to 1e-5. Against
    the pattern engine on the padded batch the attention statistics agree to 3e-5 (these sums over
    up to 32 queries differ by 1e-5 between the engines on each text alone, unpadded; the residual
    magnitudes after the MoE blocks differ by 1e-4 between them, unpadded too, so they are compared
    engine to engine only)."""
    from tests.conformance import FAMILIES, build

    hf, tok = build("gpt_oss")
    tok.pad_token = tok.eos_token
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = from_hf_model(hf, tok, name="gpt_oss-pad")
    assert FAMILIES["gpt_oss"].windows[0] < LENGTHS[1]  # the band cuts the longer texts
    texts = [TEXTS[0], TEXTS[2]]
    probe = TokenProbe.from_texts(model, texts, padding=padding)
    T = probe.seq_len
    stats = sink_statistics(model, probe, config=RunConfig(engine="stream"))
    pattern = sink_statistics(model, probe, config=RunConfig(engine="pattern"))
    assert stats.has_sinks
    for field in ("learned_sink", "received", "confidence", "confidence_no_first", "value_norm"):
        torch.testing.assert_close(getattr(stats, field), getattr(pattern, field), atol=3e-5, rtol=0, equal_nan=True)
    for i, text in enumerate(texts):
        alone = TokenProbe.from_texts(model, text)
        one = sink_statistics(model, alone, config=RunConfig(engine="stream"))
        n = alone.seq_len
        torch.testing.assert_close(stats.learned_sink[i] * n / T, one.learned_sink[0], atol=1e-5, rtol=0)
        assert float(one.learned_sink[0].amin()) > 1e-2  # the sinks absorb a share worth checking
        _same_statistics(stats, one, i, 0)
    num, den = attention_scores(model, probe, config=RunConfig(engine="stream"))
    for i, text in enumerate(texts):
        n1, d1 = attention_scores(model, TokenProbe.from_texts(model, text), config=RunConfig(engine="pattern"))
        for score in num:
            torch.testing.assert_close(num[score][i], n1[score][0], atol=1e-5, rtol=0)
            torch.testing.assert_close(den[score][i], d1[score][0], atol=1e-5, rtol=0)


def test_the_stream_guard_checks_a_real_stretch_of_a_padded_probe(models):
    """The pre-flight check runs the first text's real tokens only (not its padding)."""
    from interp.stream.guard import check_stream_conformance

    model = models["llama"]
    probe = TokenProbe.from_texts(model, TEXTS, padding="left")  # row 0, the shortest, padded most
    seen: list[Tensor] = []
    embed = model.original_model.get_input_embeddings()
    handle = embed.register_forward_hook(lambda m, args, out: seen.append(args[0].detach().cpu()))
    try:
        check_stream_conformance(model, probe.tokens, attention_mask=probe.attention_mask, force=True)
    finally:
        handle.remove()
    text = _alone(model, 0).tokens.cpu()
    assert [tuple(t.shape) for t in seen] == [tuple(text.shape)] * 2  # the stream run, then the pattern run
    assert all(torch.equal(t, text) for t in seen)


def test_the_toy_fills_the_key_mask_on_padded_stream_runs():
    toy = load_model("toy", device="cpu")
    texts = ["the cat sat on the mat. the cat", "a dog"]
    for padding in PADDINGS:
        probe = TokenProbe.from_texts(toy, texts, padding=padding)
        num, den = attention_scores(toy, probe, config=RunConfig(engine="stream"), scores=["prev_token"])
        stats = sink_statistics(toy, probe, config=RunConfig(engine="stream"))
        for i, t in enumerate(texts):
            alone = TokenProbe.from_texts(toy, t)
            n1, d1 = attention_scores(toy, alone, scores=["prev_token"])
            torch.testing.assert_close(num["prev_token"][i], n1["prev_token"][0], atol=1e-4, rtol=0)
            _same_statistics(stats, sink_statistics(toy, alone), i, 0, atol=1e-4)


# ---- sinks (pattern engine) -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("padding", PADDINGS)
def test_sink_statistics_of_each_text_are_its_own(models, name, padding):
    """Received mass (first token = each row's first real token, BOS), confidence, value norms,
    residual magnitudes and massive activations: aligned to the text, padded slots left out."""
    model = models[name]
    probe = TokenProbe.from_texts(model, TEXTS, padding=padding)
    stats = sink_statistics(model, probe, abs_threshold=1e-3, rel_threshold=3.0)
    for i in range(3):
        one = sink_statistics(model, _alone(model, i), abs_threshold=1e-3, rel_threshold=3.0)
        n = one.received.shape[-1]
        close = lambda a, b: torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)  # noqa: E731
        close(stats.received[i, ..., :n], one.received[0])
        assert float(stats.received[i, ..., n:].abs().sum()) == 0
        close(stats.confidence[i], one.confidence[0])
        close(stats.confidence_no_first[i], one.confidence_no_first[0])
        close(stats.value_norm[i, :, :n], one.value_norm[0])
        assert bool(stats.value_norm[i, :, n:].isnan().all())
        close(stats.resid_max[i, :, :n], one.resid_max[0])
        close(stats.resid_median[i, :, :n], one.resid_median[0])
        close(stats.resid_top[i], one.resid_top[0])
        close(stats.resid_seq_median[i], one.resid_seq_median[0])
        mine = sorted((m[0], m[2], m[3]) for m in stats.massive if m[1] == i)
        assert mine == sorted((m[0], m[2], m[3]) for m in one.massive)
    assert any(m[1] == 2 for m in stats.massive)  # the thresholds make the comparison bite


@pytest.mark.parametrize("padding", PADDINGS)
def test_sink_report_on_one_padded_text_is_the_text_alone(models, padding):
    """A batch of the longest text and a short one: the short row's report entries are its own."""
    model = models["llama"]
    probe = TokenProbe.from_texts(model, [TEXTS[0], TEXTS[2]], padding=padding)
    report = sink_scores(model, probe, config=RunConfig(n_boot=20))
    alone = [sink_scores(model, _alone(model, i), config=RunConfig(n_boot=20)) for i in (0, 2)]
    # first-token mass is a ratio of sums over sequences: received mass on BOS over its queries
    num = sum(a.grid("first_mass") * (LENGTHS[i] + 1) for a, i in zip(alone, (0, 2)))
    expect = num / (LENGTHS[0] + LENGTHS[2] + 2)
    assert report.grid("first_mass") == pytest.approx(expect, abs=1e-5)
    conf = (alone[0].grid("confidence") + alone[1].grid("confidence")) / 2
    assert report.grid("confidence") == pytest.approx(conf, abs=1e-5)
    short = report.tokens  # the short text's tokens sit at its own positions
    assert short["mean_position"].max() <= LENGTHS[2]


# ---- exact sweep and gradient importance ----------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("replay", ["fast", "loop"])
def test_exact_sweep_deltas_of_each_text_are_its_own(models, name, padding, replay):
    model = models[name]
    probe = TokenProbe.from_texts(model, TEXTS, padding=padding)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fast replay must not fall back to the loop
        sweeper = Sweeper(model, probe, lm_loss(probe), ablation="zero", replay=replay)
    L, H = sweeper.info.n_layers, sweeper.info.n_heads
    masks = torch.eye(L * H, dtype=torch.bool).reshape(L * H, L, H)
    values = sweeper.evaluate(masks)  # [head, batch]
    for i in range(3):
        alone = _alone(model, i)
        one = Sweeper(model, alone, lm_loss(alone), ablation="zero", replay="loop")
        torch.testing.assert_close(sweeper.unpatched[i], one.unpatched[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(
            values[:, i] - sweeper.unpatched[i], one.evaluate(masks)[:, 0] - one.unpatched[0], atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("padding", PADDINGS)
def test_gradient_importance_of_each_text_is_its_own(models, name, padding):
    model = models[name]
    probe = TokenProbe.from_texts(model, TEXTS, padding=padding)
    for per in ("example", "token"):
        got = gradient_importance(model, probe, lm_loss(probe), per=per, config=RunConfig(minibatch=2)).grid(
            "importance"
        )
        ones = [gradient_importance(model, _alone(model, i), lm_loss(_alone(model, i)), per=per) for i in range(3)]
        weights = [1.0] * 3 if per == "example" else [n + 1.0 for n in LENGTHS]  # per token: each real token
        expect = sum(w * o.grid("importance") for w, o in zip(weights, ones)) / sum(weights)
        assert got == pytest.approx(expect, rel=1e-4, abs=1e-7)


# ---- errors ------------------------------------------------------------------------------------


def test_padding_errors(models):
    model = models["gpt2"]
    with pytest.raises(UsageError) as e:
        TokenProbe.from_texts(model, TEXTS, padding="middle")
    assert str(e.value) == "padding must be 'right' or 'left', got 'middle'"
    ids = torch.tensor([[5, 6, 7], [0, 0, 0]])
    with pytest.raises(UsageError) as e:
        TokenProbe.from_tokens(model, ids, attention_mask=torch.tensor([[1, 1, 1], [0, 0, 0]]))
    assert str(e.value) == "row 1 of the attention mask is all padding (no real token): drop it"
    with pytest.raises(UsageError) as e:
        TokenProbe.from_tokens(model, ids, attention_mask=torch.tensor([[1, 0, 1], [1, 1, 1]]))
    assert str(e.value) == "row 0 of the attention mask has padding between real tokens: pad each row on one side"
    with pytest.raises(UsageError) as e:
        TokenProbe.from_tokens(model, ids, attention_mask=torch.tensor([[1, 1, 0], [0, 1, 1]]))
    assert (
        str(e.value)
        == "the attention mask pads some rows on the left and others on the right: pad every row on one side"
    )
    with pytest.raises(UsageError) as e:
        TokenProbe.from_texts(model, [TEXTS[0], ""])
    assert str(e.value) == "text 1 has no tokens: drop it, or give it some text"
    probe = TokenProbe.from_texts(model, TEXTS, padding="left")
    with pytest.raises(AblationError) as e:
        Sweeper(model, probe, lm_loss(probe), ablation="mean")
    assert str(e.value) == (
        "mean ablation does not take padded probes yet (its averages would read padded positions): "
        "use ablation='zero', or texts of one length"
    )


def test_a_model_without_a_pad_token_is_told_what_to_do():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = from_hf_model(gpt2_model(), name="no-pad")  # no tokenizer: no pad token
    with pytest.raises(UsageError) as e:
        TokenProbe.from_texts(model, ["a b c", "a b c d e"])
    assert str(e.value) == (
        "texts of different lengths need padding, but no-pad has no pad token: set one "
        "(model.tokenizer.pad_token = model.tokenizer.eos_token; any id works, padded positions are "
        "never read), or pass seq_len= no longer than the shortest text to cut every text to one length"
    )
