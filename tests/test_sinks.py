"""Attention sinks and massive activations: planted known answers, and invariants on real passes."""

import dataclasses

import pytest
import torch

from interp.config import RunConfig
from interp.models import describe, load_model
from interp.probes import TokenProbe, random_tokens, text_probe
from interp.sinks import SinkStatistics, queries_per_key, sink_scores, sink_statistics, uniform_mass
from tests.helpers import gpt2_model, word_tokenizer

D, DH = 64, 16  # tiny GPT-2 width and head width
MARK_FIRST, MARK_TOKEN = 5, 6  # residual dimensions that flag position 0 / token "w7"
SINK = (1, 2)  # head that parks on the first token
DELIM = (1, 3)  # head that attends to token "w7" wherever it is
UNIFORM = (1, 1)  # head with zero queries and keys: uniform attention
MASSIVE_DIM, MASSIVE_SCALE = 17, 1000.0
PLANT_TOKEN, PLANT_POS = 7, 12


def _qk_reads(attn, head: int, dim: int | None, gain: float = 4.0) -> None:
    """Make ``head`` score key ``k`` by ``ln(x_k)[dim]`` for every query (``None``: uniform)."""
    w, b = attn.c_attn.weight, attn.c_attn.bias  # Conv1D: [d, 3d], columns q | k | v
    q, k = slice(head * DH, (head + 1) * DH), slice(D + head * DH, D + (head + 1) * DH)
    w[:, q] = 0
    w[:, k] = 0
    b[q] = 0
    b[k] = 0
    if dim is not None:
        b[head * DH] = gain  # constant query along the head's first dimension
        w[dim, D + head * DH] = gain  # the key's first dimension reads the marker


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny GPT-2 with hand-set weights:

    - position 0 carries a marker (60 in dimension 5); layer 1 head 2 keys on it, so every query
      attends to position 0, and its value ignores the marker (it parks on a near-zero value);
    - token "w7" carries a marker in dimension 6; layer 1 head 3 keys on it (a delimiter-like sink);
    - layer 1 head 1 has zero queries and keys: exactly uniform attention (not a sink);
    - one hidden unit of layer 1's MLP fires only on the position-0 marker and writes 1000 x its
      activation into residual dimension 17: a massive activation at (layer 1, position 0, dim 17).
    """
    hf = gpt2_model(n_layer=2, n_head=4, n_embd=D)
    with torch.no_grad():
        t = hf.transformer
        t.wpe.weight[0, MARK_FIRST] += 60.0
        t.wte.weight[PLANT_TOKEN, MARK_TOKEN] += 60.0
        attn = t.h[1].attn
        _qk_reads(attn, SINK[1], MARK_FIRST)
        _qk_reads(attn, DELIM[1], MARK_TOKEN)
        _qk_reads(attn, UNIFORM[1], None)
        attn.c_attn.weight[MARK_FIRST, 2 * D + SINK[1] * DH : 2 * D + (SINK[1] + 1) * DH] = 0  # v ignores marker
        mlp = t.h[1].mlp
        mlp.c_fc.weight[:, 0] = 0
        mlp.c_fc.weight[MARK_FIRST, 0] = 2.0
        mlp.c_fc.bias[0] = -8.0
        mlp.c_proj.weight[0, :] = 0
        mlp.c_proj.weight[0, MASSIVE_DIM] = MASSIVE_SCALE
    d = tmp_path_factory.mktemp("gpt2-planted")
    hf.save_pretrained(d)
    word_tokenizer().save_pretrained(d)
    return load_model(d, device="cpu")


@pytest.fixture(scope="module")
def planted_report(planted):
    probe = random_tokens(planted, batch=6, seq_len=32, seed=0)
    tokens = probe.tokens.clone()
    tokens[tokens == PLANT_TOKEN] = 8 if PLANT_TOKEN != 8 else 9  # "w7" only where we put it
    tokens[:, PLANT_POS] = PLANT_TOKEN
    probe = dataclasses.replace(probe, tokens=tokens)
    return sink_scores(planted, probe, config=RunConfig(n_boot=200))


def test_planted_sink_head_is_found_and_uniform_head_is_not(planted_report):
    r = planted_report
    first = r.heads.grid("first_mass")
    assert first[SINK] > 0.99
    assert r.heads.top("first_mass") == SINK
    uniform = r.meta["uniform_first_mass"]
    assert first[UNIFORM] == pytest.approx(uniform, abs=1e-5) and first[UNIFORM] < r.meta["epsilon"]
    # the sink head is confident, but not about anything else; the uniform head is not confident
    assert r.heads.grid("confidence")[SINK] > 0.99 and r.heads.grid("confidence_no_first")[SINK] < 0.01
    # it parks: a near-zero value at the first position, so the first token hardly shapes its output
    assert r.heads.grid("value_norm_ratio")[SINK] < 0.3
    assert r.heads.grid("first_mass_by_norm")[SINK] < 0.3
    # Sink^eps counts it in layer 1 only
    assert r.layers.loc[1, "sink_heads"] >= 1 and r.layers.loc[0, "sink_heads"] == 0
    assert r.sink_rate == pytest.approx(float((first > 0.3).mean()))


def test_planted_token_sink_is_discovered(planted_report):
    r = planted_report
    delim = r.heads.grid("top_other_pos")[DELIM], r.heads.grid("top_other_mass")[DELIM]
    assert delim[0] == PLANT_POS and delim[1] > 0.9
    tokens = r.tokens[r.tokens["role"] != "first"]
    top = tokens.iloc[0]
    assert (top["token"], top["token_id"], top["role"]) == ("w7", PLANT_TOKEN, "word")
    assert top["is_sink"] and top["occurrences"] == 6 and top["mean_position"] == PLANT_POS
    assert top["attention_ratio"] > 2 * tokens.iloc[1]["attention_ratio"]
    first = r.tokens[r.tokens["role"] == "first"].iloc[0]
    assert first["token"] == "<|endoftext|>" and first["is_sink"]


def test_planted_massive_activation_is_reported_where_it_is(planted_report):
    m = planted_report.massive
    assert len(m) == 6  # one per sequence
    assert set(m["layer"]) == {1} and set(m["position"]) == {0} and set(m["dim"]) == {MASSIVE_DIM}
    assert (m["value"] > 1000).all() and (m["magnitude_ratio"] > 1000).all() and m["on_sink"].all()
    layers = planted_report.layers
    assert layers["n_massive"].tolist() == [0, 6]
    assert layers.loc[1, "resid_top1"] > 1000 and layers.loc[0, "resid_top1"] < 100
    assert layers.loc[1, "outlier_ratio_sink"] > 100 * layers.loc[1, "outlier_ratio_other"]


def test_thresholds_are_options(planted):
    probe = random_tokens(planted, batch=2, seq_len=16, seed=1)
    assert len(sink_scores(planted, probe, abs_threshold=1e6, config=RunConfig(n_boot=10)).massive) == 0
    low = sink_scores(planted, probe, abs_threshold=50, rel_threshold=100, config=RunConfig(n_boot=10)).massive
    assert len(low) >= 2 and set(low["layer"]) == {0, 1}  # now the 60 of the position marker counts too
    assert low["token"].notna().all() and low["role"].eq("first").all()


BOS_LOUD, BOS_OUTLIER = 50.0, 20000.0  # every dimension of position 0 at +-50, one at 20,000


@pytest.fixture(scope="module")
def loud_bos(tmp_path_factory):
    """A tiny GPT-2 whose position 0 carries +-50 in every residual dimension and 20,000 in dimension
    17 (through the position embedding, so every layer's output holds them): the BOS state of a
    trained model, whose own median |x| (50) is far above the layer's (the random weights' ~0.05)."""
    hf = gpt2_model(n_layer=2, n_head=4, n_embd=D)
    with torch.no_grad():
        signs = torch.tensor([1.0, -1.0]).repeat(D // 2)
        hf.transformer.wpe.weight[0] = BOS_LOUD * signs
        hf.transformer.wpe.weight[0, MASSIVE_DIM] = BOS_OUTLIER
    d = tmp_path_factory.mktemp("gpt2-loud-bos")
    hf.save_pretrained(d)
    word_tokenizer().save_pretrained(d)
    return load_model(d, device="cpu")


def test_massive_activations_are_measured_against_the_layer_median(loud_bos):
    """Sun et al.'s criterion: |x| over the median of the sequence's whole layer output. Against the
    BOS's own hidden state the outlier is only 400x its median and would go unreported."""
    probe = random_tokens(loud_bos, batch=3, seq_len=16, seed=0)
    r = sink_scores(loud_bos, probe, config=RunConfig(n_boot=10))
    m = r.massive
    assert len(m) == 6  # one per sequence, in both layers' outputs
    assert set(m["layer"]) == {0, 1} and set(m["position"]) == {0} and set(m["dim"]) == {MASSIVE_DIM}
    assert (m["value"] > 0.99 * BOS_OUTLIER).all() and (m["magnitude_ratio"] > 1e4).all()
    assert r.layers["n_massive"].tolist() == [3, 3]
    assert (r.layers["outlier_ratio_sink"] > 1e4).all()  # position 0 is a sink position
    # what the BOS's own median would have said: far under 1000x, so no massive activation
    stats = sink_statistics(loud_bos, probe)
    own = stats.resid_max[:, :, 0] / stats.resid_median[:, :, 0]
    assert (own < 500).all() and (stats.resid_median[:, :, 0] > 0.9 * BOS_LOUD).all()
    assert (stats.resid_seq_median < 1).all()


def test_massive_ratio_leaves_padded_slots_out():
    """The layer median is over real positions only: padding (NaN here) neither counts nor ranks."""
    from interp.sinks.stats import empty_statistics, reduce_residual

    stats = empty_statistics(1, 1, 1, 4)
    x = torch.full((1, 4, 8), float("nan"))
    x[0, :2] = 1.0
    x[0, 0, 3] = 5000.0  # 16 real entries, median 1
    reduce_residual(stats, x, 0, slice(0, 1), 100.0, 1000.0, 10)
    assert float(stats.resid_seq_median[0, 0]) == 1.0
    assert stats.massive == [(0, 0, 0, 3, 5000.0, 5000.0)]


# --------------------------------------------------------------------------------------------
# invariants, checked against the full patterns


def _patterns(model, probe):
    info = describe(model)
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(info.n_layers)]
    _, cache = model.run_with_cache(probe.tokens, names_filter=lambda n: n in names)
    return torch.stack([cache[n].float() for n in names], 1)  # [batch, layer, head, q, k]


def _check_invariants(model, probe):
    info = describe(model)
    A = _patterns(model, probe)
    T = probe.seq_len
    rows = A.sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-4)  # each query's row sums to 1
    alpha0 = (A[..., 0].sum(-1) / T).mean(0)  # [layer, head]: every query sees position 0
    # an epsilon between the heads' masses, so that the count is not trivially zero
    eps = float(alpha0.flatten().sort().values[alpha0.numel() // 2 - 1 : alpha0.numel() // 2 + 1].mean())
    r = sink_scores(model, probe, epsilon=eps, config=RunConfig(n_boot=50))
    t = r.heads.table
    for col in ("first_mass", "confidence", "confidence_no_first", "top_other_mass"):
        assert t[col].between(0, 1).all(), col
    assert r.positions["mean_mass"].between(0, 1).all() and r.positions["max_mass"].between(0, 1).all()
    assert r.meta["max_row_sum_deviation"] < 1e-4
    assert torch.allclose(torch.tensor(r.heads.grid("first_mass")).float(), alpha0, atol=1e-5)
    direct = (alpha0 > eps).sum(1)
    assert r.layers["sink_heads"].tolist() == direct.tolist()
    assert r.sink_rate == pytest.approx(float((alpha0 > eps).float().mean()))
    # alpha_k per position, and Voita confidence, against the full patterns
    n_k = queries_per_key(T, info.is_causal)
    alpha = (A.sum(-2) / n_k).mean(0)  # [layer, head, k]
    pos = r.positions
    assert torch.allclose(torch.tensor(pos["mean_mass"].to_numpy()).float(), alpha.mean(1).flatten(), atol=1e-5)
    scored = A[..., 1:, :] if info.is_causal else A
    assert torch.allclose(torch.tensor(r.heads.grid("confidence")).float(), scored.amax(-1).mean((0, -1)), atol=1e-5)
    # a uniform head's alpha_k, by its definition
    u = uniform_mass(T, info.is_causal)
    if info.is_causal:
        want = torch.tensor([sum(1 / (i + 1) for i in range(k, T)) / (T - k) for k in range(T)])
        assert torch.allclose(u, want.float(), atol=1e-6)
    return r


def test_invariants_on_gpt2(gpt2_tiny):
    r = _check_invariants(gpt2_tiny, random_tokens(gpt2_tiny, batch=3, seq_len=20))
    assert r.meta["first_token"] == "BOS" and "sep_mass" not in r.heads.table


def test_invariants_on_encoder(bert_tiny):
    probe = random_tokens(bert_tiny, batch=3, seq_len=20)
    r = _check_invariants(bert_tiny, probe)
    assert r.meta["first_token"] == "[CLS]" and r.meta["sep_position"] == 21
    assert {"sep_mass", "sep_value_norm_ratio"} <= set(r.heads.table)
    assert {"sep_sink_heads", "sep_sink_share"} <= set(r.layers)
    roles = set(r.tokens["role"])
    assert {"first", "[SEP]", "word"} <= roles
    assert r.positions.loc[r.positions["position"] == 21, "role"].eq("[SEP]").all()


@pytest.fixture(scope="module", params=["causal", "encoder"])
def toy_model(request):
    toy = pytest.importorskip("interp.toy")
    torch.manual_seed(0)
    cfg = toy.ToyConfig(
        n_layers=2, d_model=32, n_heads=4, d_vocab=300, n_ctx=128, attn_only=False, causal=request.param == "causal"
    )
    return toy.ToyTransformer(cfg).eval()


def test_invariants_on_toy_with_text(toy_model):
    probe = text_probe(toy_model, batch=3, seq_len=48, seed=2)
    r = _check_invariants(toy_model, probe)
    assert set(r.tokens["role"]) >= {"first", "word", "space"}
    assert {"punctuation", "newline"} & set(r.tokens["role"])  # bytes of '.', ',' and '\n' are named
    assert r.heads.table["value_norm_ratio"].notna().all()  # the toy's hook_v fired


def test_bundled_toy_end_to_end():
    try:
        model = load_model("toy", device="cpu")
    except Exception as e:  # the checkpoint is grown by interp.toy.train; not every checkout has it
        pytest.skip(f"no bundled toy: {e}")
    r = sink_scores(model, random_tokens(model, batch=4, seq_len=32), config=RunConfig(n_boot=50))
    assert r.heads.table["first_mass"].between(0, 1).all() and r.meta["max_row_sum_deviation"] < 1e-4


def test_nothing_quadratic_is_kept(gpt2_tiny):
    """Everything the pass keeps across layers is linear in the sequence length."""
    info = describe(gpt2_tiny)
    B, T = 2, 40
    stats = sink_statistics(gpt2_tiny, random_tokens(gpt2_tiny, batch=B, seq_len=T - 1))
    twice = sink_statistics(gpt2_tiny, random_tokens(gpt2_tiny, batch=B, seq_len=2 * T - 1))
    for f in dataclasses.fields(SinkStatistics):
        value = getattr(stats, f.name)
        if isinstance(value, torch.Tensor):
            assert value.numel() <= B * info.n_layers * max(info.n_heads, 3) * T, f.name
            # doubling the length at most doubles what is kept (a [T, T] field would quadruple)
            assert getattr(twice, f.name).numel() <= 2 * value.numel(), f.name
    # nor does the bridge hold on to a pattern once the pass is done
    kept = [n for n, m in gpt2_tiny.named_modules() if isinstance(getattr(m, "_pattern", None), torch.Tensor)]
    assert kept == []


def test_bad_arguments(gpt2_tiny):
    probe = random_tokens(gpt2_tiny, batch=1, seq_len=4)
    with pytest.raises(ValueError, match="epsilon= must be between 0 and 1, got 1.5"):
        sink_scores(gpt2_tiny, probe, epsilon=1.5)
    with pytest.raises(ValueError, match="abs_threshold= must be > 0"):
        sink_scores(gpt2_tiny, probe, abs_threshold=0)
    long = TokenProbe(tokens=torch.zeros(1, 300, dtype=torch.long), body_start=1, body_end=300, causal=True)
    with pytest.raises(ValueError, match="longer than the model's context of 256"):
        sink_scores(gpt2_tiny, long)


def test_sink_scores_options_are_checked_without_a_model():
    from interp.errors import UsageError
    from interp.sinks import validate_sink_scores

    for kw, message, param in (
        (dict(epsilon=1.5), "epsilon= must be between 0 and 1, got 1.5", "epsilon"),
        (dict(sink_ratio=0), "sink_ratio= must be > 0, got 0", "sink_ratio"),
        (dict(min_queries=0), "min_queries= must be an integer >= 1, got 0", "min_queries"),
        (dict(max_massive=-1), "max_massive= must be an integer >= 0, got -1", "max_massive"),
    ):
        with pytest.raises(UsageError) as e:
            validate_sink_scores(**kw)
        assert str(e.value) == message and e.value.params == (param,)
    validate_sink_scores()
