"""Head ablation: masks, metrics, the fast sweep against the plain loop, gradient importance,
pruning curves and Hard-Concrete gates, on tiny GPT-2 / BERT models built in-process."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from interp.ablation import (
    AblationError,
    Metric,
    MetricError,
    Sweeper,
    ablated,
    as_metric,
    exact_sweep,
    gradient_importance,
    head_mask,
    heads_prunable,
    incontext_logit_diff,
    incontext_loss,
    lm_loss,
    logit_diff,
    loop_sweep,
    pooled_cosine,
    pruning_curve,
    train_gates,
)
from interp.ablation.gates import gate_open_probability, gate_sample, gate_value
from interp.ablation.modes import derangement
from interp.ablation.pruning import spearman
from interp.config import RunConfig
from interp.hooks import z_hook
from interp.models import describe, from_hf_model
from interp.probes import repeated_tokens
from tests.helpers import bert_model, gpt2_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def probe(gpt2_tiny):
    return repeated_tokens(gpt2_tiny, batch=4, block_len=12, seed=0)


@pytest.fixture(scope="module")
def gpt2_loud():
    """A tiny GPT-2 with large random weights (init std 0.4): every head's ablation moves every
    built-in metric by at least 4e-4 of its value, forty times the fast-vs-loop tolerance."""
    return from_hf_model(gpt2_model(initializer_range=0.4), name="gpt2-loud")


@pytest.fixture(scope="module")
def bert_loud():
    """A tiny BERT with init std 0.2: each head's ablation moves the pooled cosine by >= 1e-2."""
    return from_hf_model(bert_model(initializer_range=0.2), name="bert-loud")


def _close(fast, loop, rtol=1e-5, margin=20):
    """The fast engine's numbers equal the loop's, and every head's effect stands ``margin`` times
    above that tolerance (else a sweep that ablated nothing would pass too)."""
    a, b = fast.grid("metric_ablated"), loop.grid("metric_ablated")
    tol = rtol * np.abs(b).max() + 1e-7
    assert np.isfinite(a).all()
    assert np.abs(a - b).max() <= tol, np.abs(a - b).max()
    assert np.abs(fast.grid("delta") - loop.grid("delta")).max() <= tol
    effects = np.abs(loop.grid("delta"))
    assert np.nanmin(effects) > margin * tol, (np.nanmin(effects), tol)


# ---- head sets and bad input ----------------------------------------------------------------


def test_head_mask_reads_pairs_strings_and_masks(gpt2_tiny):
    m = head_mask(gpt2_tiny, [(1, 2), "0.3"])
    assert m.shape == (2, 4) and m.sum() == 2 and m[1, 2] and m[0, 3]
    assert torch.equal(head_mask(gpt2_tiny, "1.2, 0.3"), m)
    assert torch.equal(head_mask(gpt2_tiny, m), m)


@pytest.mark.parametrize(
    "heads, message",
    [
        ([(2, 0)], "head 2.0 is out of range: the model has 2 layers x 4 heads"),
        (["0.4"], "head 0.4 is out of range"),
        ([(-1, 0)], "head -1.0 is out of range"),
        ([], "the head set is empty"),
        (["one.two"], "cannot read head 'one.two'"),
        (torch.zeros(3, 4, dtype=torch.bool), "must have shape [2, 4]"),
    ],
)
def test_bad_heads_are_clear_errors(gpt2_tiny, heads, message):
    with pytest.raises(AblationError, match=None) as e:
        head_mask(gpt2_tiny, heads)
    assert message in str(e.value)


def test_bad_metrics_are_clear_errors(gpt2_tiny, probe):
    per_position = as_metric(lambda logits, tokens: logits[..., 0], name="per_position", higher_is_better=False)
    with pytest.raises(MetricError, match=r"one number per sequence \(shape \[4\]\), got shape \[4, 25\]"):
        exact_sweep(gpt2_tiny, probe, per_position)
    batch_mean = as_metric(lambda logits, tokens: logits.mean(), name="batch_mean", higher_is_better=False)
    with pytest.raises(MetricError, match="got shape \\[\\]"):
        exact_sweep(gpt2_tiny, probe, batch_mean)
    nan = as_metric(lambda logits, tokens: logits[:, 0, 0] * float("nan"), name="nan", higher_is_better=False)
    with pytest.raises(MetricError, match="non-finite"):
        gradient_importance(gpt2_tiny, probe, nan)


def test_negative_lambda_is_refused_before_any_work(gpt2_tiny, probe):
    with pytest.raises(AblationError, match="lambda must be a finite number >= 0, got -0.1"):
        train_gates(gpt2_tiny, probe, incontext_loss(probe), [0.1, -0.1])


def test_causal_metrics_refuse_encoders(bert_tiny):
    p = repeated_tokens(bert_tiny, batch=2, block_len=6)
    with pytest.raises(AblationError, match="needs a causal"):
        incontext_loss(p)


# ---- metrics ----------------------------------------------------------------------------------


def test_incontext_loss_reads_only_the_predictable_tokens(probe, gpt2_tiny):
    m = incontext_loss(probe)
    # BOS + 12 + 12: tokens 14..24 follow a pair seen before, read at positions 13..23; token 13 (the
    # first of the second repeat) follows b_12, which was never followed by anything: left out
    assert m.positions == tuple(range(13, 24))
    logits = torch.zeros(4, len(m.positions), 300)
    assert torch.allclose(m(logits, probe.tokens), torch.full((4,), math.log(300)))
    # with a third repeat its first token is predictable (b_12 was followed by b_1 at the boundary)
    three = incontext_loss(repeated_tokens(gpt2_tiny, batch=2, block_len=5, n_repeats=3, seed=0))
    assert three.positions == (6, 7, 8, 9, *range(10, 15))


def test_logit_diff_answers_are_the_incontext_continuation(probe):
    m = incontext_logit_diff(probe)
    assert m.positions == (24,) and m.higher_is_better
    logits = torch.zeros(4, 1, 300)
    first = probe.tokens[:, 1]  # the last token b_12 was first followed by b_1
    logits[torch.arange(4), 0, first] = 2.0
    assert torch.allclose(m(logits, probe.tokens), torch.full((4,), 2.0))
    fixed = logit_diff(5, 6, position=-1)
    logits = torch.zeros(2, 1, 300)
    logits[:, 0, 6] = 1.0
    assert torch.equal(fixed(logits, probe.tokens[:2]), torch.tensor([-1.0, -1.0]))


# ---- the engine: fast replay equals the plain loop --------------------------------------------


@pytest.mark.parametrize("ablation", ["zero", "mean", "resample"])
@pytest.mark.parametrize("which", ["incontext", "logit-diff", "lm"])
def test_fast_sweep_equals_loop_on_gpt2(gpt2_loud, which, ablation):
    probe = repeated_tokens(gpt2_loud, batch=4, block_len=12, seed=0)
    metric = {"incontext": incontext_loss, "logit-diff": incontext_logit_diff, "lm": lm_loss}[which](probe)
    fast = exact_sweep(gpt2_loud, probe, metric, ablation=ablation, replay="fast", chunk=3)
    loop = loop_sweep(gpt2_loud, probe, metric, ablation=ablation)
    assert fast.meta["engine"] == "fast" and loop.meta["engine"] == "loop"
    assert fast.meta["shortcuts"] == ["reused_attention", "trimmed_mlp"]  # both exact shortcuts in play
    _close(fast, loop)
    assert fast.meta["clean_metric"] == pytest.approx(loop.meta["clean_metric"], rel=1e-6)


@pytest.mark.parametrize("ablation", ["zero", "mean", "resample"])
def test_fast_sweep_equals_loop_on_bert_with_pooled_cosine(bert_loud, ablation):
    p = repeated_tokens(bert_loud, batch=3, block_len=8, seed=1)
    metric = pooled_cosine(p)
    fast = exact_sweep(bert_loud, p, metric, ablation=ablation, replay="fast")
    loop = loop_sweep(bert_loud, p, metric, ablation=ablation)
    assert fast.meta["engine"] == "fast"
    # BERT's attention module adds the residual and normalises: not linear in hook_z, so the
    # self-check turns the attention shortcut down (and the pooled metric reads every position)
    assert fast.meta["shortcuts"] == []
    _close(fast, loop)
    assert fast.meta["clean_metric"] == pytest.approx(1.0, abs=1e-6)
    assert (fast.table["importance"] > 0).all()  # any change moves the pooled output


def _zeroed(model, tokens, heads):
    """Logits with ``heads`` zeroed at hook_z, by hand (independent of HeadAblation)."""
    by_layer = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)

    def zero(z, hook, hs):
        z = z.clone()
        z[:, :, hs] = 0
        return z

    hooks = [(z_hook(l), lambda z, hook, hs=hs: zero(z, hook, hs)) for l, hs in by_layer.items()]
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=hooks)


def test_several_heads_of_one_layer_and_a_base_in_the_ablated_layer(gpt2_loud):
    probe = repeated_tokens(gpt2_loud, batch=3, block_len=10, seed=3)
    metric = incontext_loss(probe)
    sets = [[(0, 0), (0, 2)], [(1, 1), (1, 2), (1, 3)], [(0, 1), (1, 0), (1, 3)], [(0, 0), (0, 1), (0, 2), (0, 3)]]
    masks = torch.stack([head_mask(gpt2_loud, s) for s in sets])
    got = Sweeper(gpt2_loud, probe, metric, replay="fast", chunk=2).evaluate(masks)
    for s, values in zip(sets, got):
        want = metric(metric.read(_zeroed(gpt2_loud, probe.tokens, s)), probe.tokens)
        assert torch.allclose(values, want, rtol=1e-5), (s, values, want)
    # a base head in the layer being swept: 1.0 stays zeroed while each other head of layer 1 goes too
    swept = exact_sweep(gpt2_loud, probe, metric, base=["1.0"], replay="fast")
    assert swept.meta["engine"] == "fast" and math.isnan(swept.grid("metric_ablated")[1, 0])
    for h in (1, 2, 3):
        want = metric(metric.read(_zeroed(gpt2_loud, probe.tokens, [(1, 0), (1, h)])), probe.tokens).mean()
        assert swept.grid("metric_ablated")[1, h] == pytest.approx(float(want), rel=1e-5)
    base_only = metric(metric.read(_zeroed(gpt2_loud, probe.tokens, [(1, 0)])), probe.tokens).mean()
    assert swept.meta["clean_metric"] == pytest.approx(float(base_only), rel=1e-6)
    assert np.abs(swept.grid("delta")[1, 1:]).min() > 1e-3  # the heads matter beside the base


def test_a_model_the_replay_cannot_reproduce_falls_back_to_the_loop(bert_tiny, monkeypatch):
    """BERT's MLM logits pass a head transform (dense + gelu) before the final norm: the replay runs
    the model's own head and is exact; read out without it (the replay's former read-out), the
    self-check sees the difference and the sweep falls back to the loop."""
    from interp.adapters import HookedAdapter

    p = repeated_tokens(bert_tiny, batch=2, block_len=6, seed=0)
    metric = as_metric(lambda logits, tokens: logits[:, 1].logsumexp(-1), name="mlm_logsumexp", higher_is_better=False)
    fast = exact_sweep(bert_tiny, p, metric, replay="fast")
    loop = exact_sweep(bert_tiny, p, metric, replay="loop")
    assert fast.meta["engine"] == "fast"
    assert np.allclose(fast.grid("delta"), loop.grid("delta"), rtol=1e-3, atol=1e-6)
    assert np.abs(loop.grid("delta")).max() > 1e-4  # well above the tolerance
    monkeypatch.setattr(HookedAdapter, "unembed", lambda self, x: self.model.unembed(self.model.ln_final(x)))
    with pytest.warns(
        UserWarning, match="falling back to the run_with_hooks loop: replaying its blocks does not reproduce its output"
    ):
        auto = exact_sweep(bert_tiny, p, metric)
    assert auto.meta["engine"] == "loop"
    with pytest.raises(AblationError, match="the fast replay cannot run this model"):
        exact_sweep(bert_tiny, p, metric, replay="fast")


def test_minibatches_give_the_same_numbers(gpt2_tiny, probe):
    metric = incontext_loss(probe)
    whole = exact_sweep(gpt2_tiny, probe, metric, ablation="resample")
    parts = exact_sweep(gpt2_tiny, probe, metric, ablation="resample", config=RunConfig(minibatch=3))
    assert np.allclose(whole.grid("metric_ablated"), parts.grid("metric_ablated"), rtol=1e-5)


def test_context_manager_and_sweeper_agree(gpt2_tiny, probe):
    metric = incontext_loss(probe)
    heads = ["0.1", "1.2"]
    with ablated(gpt2_tiny, heads, ablation="mean", probe=probe), torch.no_grad():
        logits = gpt2_tiny(probe.tokens)
    direct = metric(metric.read(logits), probe.tokens)
    sweeper = Sweeper(gpt2_tiny, probe, metric, ablation="mean")
    via_engine = sweeper.evaluate(head_mask(gpt2_tiny, heads)[None])[0]
    assert torch.allclose(direct, via_engine, rtol=1e-5)
    with torch.no_grad():  # hooks are gone after the block
        assert torch.allclose(metric(metric.read(gpt2_tiny(probe.tokens)), probe.tokens), sweeper.unpatched, rtol=1e-6)


def test_base_heads_stay_ablated(gpt2_tiny, probe):
    metric = incontext_loss(probe)
    swept = exact_sweep(gpt2_tiny, probe, metric, base=["0.0"])
    assert math.isnan(swept.grid("metric_ablated")[0, 0])
    sweeper = Sweeper(gpt2_tiny, probe, metric, replay="loop")
    both = sweeper.evaluate(head_mask(gpt2_tiny, ["0.0", "1.3"])[None]).mean()
    assert swept.grid("metric_ablated")[1, 3] == pytest.approx(float(both), rel=1e-5)


def test_resample_donors_are_a_derangement():
    for n in (2, 3, 7):
        d = derangement(n, seed=n)
        assert sorted(d.tolist()) == list(range(n)) and (d != torch.arange(n)).all()
    assert torch.equal(derangement(5, 1), derangement(5, 1))


# ---- mean and resample ablation where they should differ from zero ablation -----------------


@pytest.fixture
def planted_constant(gpt2_tiny):
    """The tiny GPT-2 with head 0.1 made to output one large constant vector everywhere (value
    weights 0, value bias large): zeroing it moves the residual stream; its mean is itself.
    The weights are put back afterwards."""
    d, dh = 64, 16
    attn = gpt2_tiny.original_model.transformer.h[0].attn
    v = slice(2 * d + dh, 2 * d + 2 * dh)  # head 1's value columns in the fused c_attn
    saved = attn.c_attn.weight[:, v].clone(), attn.c_attn.bias[v].clone()
    with torch.no_grad():
        attn.c_attn.weight[:, v] = 0
        attn.c_attn.bias[v] = torch.linspace(-6, 6, dh)
    yield gpt2_tiny
    with torch.no_grad():
        attn.c_attn.weight[:, v], attn.c_attn.bias[v] = saved


def test_planted_constant_head_zero_hurts_mean_does_not(planted_constant):
    model = planted_constant
    p = repeated_tokens(model, batch=4, block_len=10, seed=0)
    metric = pooled_cosine(p)
    zero = exact_sweep(model, p, metric, ablation="zero")
    mean = exact_sweep(model, p, metric, ablation="mean")
    resample = exact_sweep(model, p, metric, ablation="resample")
    assert zero.top("importance") == (0, 1)
    assert zero.grid("importance")[0, 1] > 0.05
    assert abs(mean.grid("importance")[0, 1]) < 1e-5
    assert abs(resample.grid("importance")[0, 1]) < 1e-5


# ---- Michel gradient importance ---------------------------------------------------------------


def test_gradient_importance_is_the_per_token_product(gpt2_tiny, probe):
    """Against a hand computation: keep every hook_z, backprop the summed loss, reduce per token."""
    metric = incontext_loss(probe)
    got = gradient_importance(gpt2_tiny, probe, metric, config=RunConfig(minibatch=3), per="token")
    info = describe(gpt2_tiny)
    zs = {}

    def keep(z, hook, layer):
        z.retain_grad()
        zs[layer] = z
        return z

    want = torch.zeros(info.n_layers, info.n_heads)
    hooks = [(z_hook(l), lambda z, hook, l=l: keep(z, hook, l)) for l in range(info.n_layers)]
    for p in gpt2_tiny.parameters():
        p.requires_grad_(True)
    logits = gpt2_tiny.run_with_hooks(probe.tokens, fwd_hooks=hooks)
    metric(metric.read(logits), probe.tokens).sum().backward()
    for l, z in zs.items():
        want[l] = (z * z.grad).sum(-1).abs().mean((0, 1)).detach()
    gpt2_tiny.zero_grad(set_to_none=True)
    assert np.allclose(got.grid("importance"), want.numpy(), rtol=1e-4, atol=1e-9)
    assert all(p.requires_grad for p in gpt2_tiny.parameters())  # the freeze was undone
    # Michel et al.'s default: the product summed over each sequence, absolute value per sequence
    per_example = torch.zeros(info.n_layers, info.n_heads)
    for l, z in zs.items():
        per_example[l] = (z * z.grad).sum((1, 3)).abs().mean(0).detach()
    default = gradient_importance(gpt2_tiny, probe, metric, config=RunConfig(minibatch=3))
    assert np.allclose(default.grid("importance"), per_example.numpy(), rtol=1e-4, atol=1e-9)
    # |sum over tokens| <= T x mean |per token|; signs cancel within a sequence, far beyond the tolerance
    T = probe.seq_len
    assert (per_example <= T * want * (1 + 1e-4)).all() and (per_example < 0.5 * T * want).any()


def test_gradient_importance_refuses_a_metric_flat_at_the_clean_point(bert_tiny):
    p = repeated_tokens(bert_tiny, batch=2, block_len=6, seed=0)
    with pytest.raises(
        MetricError,
        match=r"gradient importance cannot rank heads by metric 'pooled_cosine' at the unablated run: it is at "
        r"its optimum on the unablated run, so the ranking would be rounding noise. Use the exact sweep",
    ):
        gradient_importance(bert_tiny, p, pooled_cosine(p))
    # a user metric that does not say so is caught by its gradient: squared distance to the clean output
    dist = Metric(
        "dist", lambda out, tokens, clean, rows: (out - clean).pow(2).sum((1, 2)), reads="hidden", needs_clean=True
    )
    with pytest.raises(MetricError, match=r"metric 'dist' at the unablated run: its gradient vanishes there \(largest"):
        gradient_importance(bert_tiny, p, dist)


def test_gradient_importance_normalises_per_layer(gpt2_tiny, probe):
    g = gradient_importance(gpt2_tiny, probe, incontext_loss(probe), normalize=True)
    assert np.allclose(np.linalg.norm(g.grid("importance"), axis=1), 1.0, atol=1e-5)


# ---- pruning curves ---------------------------------------------------------------------------


def test_pruning_curve_steps_and_orders(gpt2_tiny, probe):
    metric = incontext_loss(probe)
    curve = pruning_curve(gpt2_tiny, probe, metric, "exact", step=0.25)
    assert curve["n_pruned"].tolist() == [0, 2, 4, 6, 8]
    assert curve["frac_pruned"].iloc[-1] == 1.0 and curve["degradation"].iloc[0] == 0.0
    exact = exact_sweep(gpt2_tiny, probe, metric)
    first = curve["removed"].iloc[1].split()
    assert first == exact.rank("importance", ascending=True)["label"].head(2).tolist()
    everything = [(l, h) for l in range(2) for h in range(4)]
    want = metric(metric.read(_zeroed(gpt2_tiny, probe.tokens, everything)), probe.tokens).mean()
    assert curve["metric"].iloc[-1] == pytest.approx(float(want), rel=1e-5)
    assert abs(float(want) - curve["metric"].iloc[0]) > 1e-3 * abs(float(want))
    r1 = pruning_curve(gpt2_tiny, probe, metric, "random", step=0.25, config=RunConfig(seed=1))
    assert r1.equals(pruning_curve(gpt2_tiny, probe, metric, "random", step=0.25, config=RunConfig(seed=1)))
    again = pruning_curve(gpt2_tiny, probe, metric, "gradient", step=0.5, reestimate=True)
    assert again.attrs["reestimate"] and again["n_pruned"].tolist() == [0, 4, 8]


def test_heads_prunable_reads_the_last_step_within_tolerance():
    curve = pd.DataFrame(
        {
            "label": "x",
            "step": range(5),
            "n_pruned": [0, 2, 4, 6, 8],
            "frac_pruned": [0, 0.25, 0.5, 0.75, 1],
            "degradation": [0, 0.02, 0.15, 0.05, 0.9],
        }
    )
    out = heads_prunable(curve, tolerance=0.1)
    assert out["n_prunable"].tolist() == [2]  # the dip back under 10% after 4 heads does not count
    assert heads_prunable(curve, tolerance=0.2)["n_prunable"].tolist() == [6]


def test_spearman_matches_rank_formula():
    a, b = [1, 2, 3, 4, 5], [5, 6, 7, 8, 7]
    assert spearman(a, a) == pytest.approx(1.0)
    assert spearman(a, [-x for x in a]) == pytest.approx(-1.0)
    assert spearman(a, b) == pytest.approx(0.8207826816681233)  # average ranks for the tie


# ---- Hard-Concrete gates ------------------------------------------------------------------------


def test_hard_concrete_gate_statistics():
    log_alpha = torch.tensor([-3.0, 0.0, 2.0])
    samples = gate_sample(log_alpha, (20000,), torch.Generator().manual_seed(0))
    assert samples.min() >= 0 and samples.max() <= 1
    open_rate = (samples > 0).float().mean(0)
    assert torch.allclose(open_rate, gate_open_probability(log_alpha), atol=0.01)
    assert gate_value(torch.tensor(-10.0)) == 0 and gate_value(torch.tensor(10.0)) == 1
    assert gate_value(torch.tensor(0.0)) == pytest.approx(0.5)


def test_gates_prune_everything_at_huge_lambda_and_nothing_at_zero(gpt2_tiny, probe):
    metric = incontext_loss(probe)
    sweep = train_gates(gpt2_tiny, probe, metric, [0.0, 50.0], steps=20, lr=0.4)
    kept = dict(zip(sweep.summary["lambda"], sweep.summary["heads_kept"]))
    assert kept == {0.0: 8, 50.0: 0}
    assert sweep.summary["degradation"].iloc[0] == 0.0
    assert len(sweep.gates) == 16 and set(sweep.gates.columns) >= {"log_alpha", "p_open", "gate", "kept"}
    assert sweep.grids().grid("lambda=50").max() < 0.5


@pytest.mark.slow
def test_fast_sweep_equals_loop_on_a_rotary_gqa_model():
    """Llama-style blocks: rotary position embeddings and grouped key/value heads, passed by the
    model to each block as extra arguments, which the replay must hand on."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from interp.models import from_hf_model

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=300,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=0,
        initializer_range=0.2,  # large weights: every head's effect stands well above the tolerance
    )
    model = from_hf_model(LlamaForCausalLM(cfg).eval(), name="tiny-llama")
    p = repeated_tokens(model, batch=3, block_len=8, seed=2)
    metric = incontext_loss(p)
    fast = exact_sweep(model, p, metric, ablation="resample", replay="fast")
    _close(fast, loop_sweep(model, p, metric, ablation="resample"))
