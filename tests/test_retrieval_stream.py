"""The stream engine of the retrieval scores, the row argmax, copy distance through a sliding window,
the window ablation and the ``retrieval`` command. Sizes stay at or below 1K tokens."""

from __future__ import annotations

import json
import math

import pytest
import torch

from interp.ablation import WindowAblation, ablated
from interp.adapters import AttentionInputs
from interp.cli import COMMANDS
from interp.config import RunConfig
from interp.errors import AblationError
from interp.hooks import k_hook, q_hook, v_hook, z_hook
from interp.probes.needle import copy_distance_probe, needle_probe
from interp.retrieval import copy_distance_scores, needle_copy_loss, retrieval_counts, retrieval_scores
from interp.retrieval.figures import copy_distance_figure, layer_windows
from interp.stream.blockwise import logits_tile, row_argmax
from interp.toy.model import ToyConfig, ToyTransformer
from interp.toy.planted import RETRIEVAL, STREAMING, planted_model


@pytest.fixture(scope="module")
def planted():
    return planted_model(1025)


def _random_toy(n_ctx: int = 600) -> ToyTransformer:
    cfg = ToyConfig(n_layers=2, d_model=32, n_heads=4, n_ctx=n_ctx, d_vocab=64, init_range=0.5, use_flash=False)
    torch.manual_seed(1)
    return ToyTransformer(cfg).eval()


# ---- the row argmax ----------------------------------------------------------------------------


def _inputs(q: torch.Tensor, k: torch.Tensor, **kw) -> AttentionInputs:
    return AttentionInputs(0, q, k, k, 1.0, True, **kw)


def test_row_argmax_equals_the_full_argmax():
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 70, 8), torch.randn(2, 2, 70, 8)  # grouped: 4 query heads on 2 key heads
    for window in (None, 9):
        a = _inputs(q, k, window=window)
        full = logits_tile(a, 0, 70, 0, 70)
        best, arg = row_argmax(a, 20, 45, block=7)  # tiles of 7 keys: the running max crosses tiles
        assert torch.equal(arg, full[:, :, 20:45].argmax(-1))
        assert torch.allclose(best, full[:, :, 20:45].amax(-1), atol=1e-6, rtol=0)


def test_row_argmax_ties_go_to_the_lowest_key():
    q, k = torch.zeros(1, 1, 40, 4), torch.randn(1, 1, 40, 4)  # every logit 0: all keys tie
    _, arg = row_argmax(_inputs(q, k), 10, 40, block=8)
    assert (arg == 0).all()
    k = torch.zeros(1, 1, 40, 4)
    k[0, 0, [3, 17, 30], 0] = 1.0  # equal maxima in three tiles
    q = torch.ones(1, 1, 40, 4)
    _, arg = row_argmax(_inputs(q, k), 32, 40, block=8)
    assert (arg == 3).all()
    _, arg = row_argmax(_inputs(q, k, window=20), 32, 40, block=8)  # key 3 out of every row's window,
    assert arg.flatten().tolist() == [17] * 5 + [30] * 3  # key 17 out of rows 37.. (keys > q - 20)


# ---- stream engine == pattern engine -----------------------------------------------------------


@pytest.mark.parametrize("which", ["planted", "random", "gpt2"])
def test_stream_engine_equals_pattern_engine(planted, which, request):
    """Every head: the same hits, and mass / induction / streaming share to 1e-6 (the planted model's
    share to 1e-5: its logits are ~125, whose float32 spacing is 7.6e-6, and the row pass and the
    band tiles round them in different orders)."""
    seq_len, window, tol = 512, 32, 1e-6
    if which == "planted":
        model, tol_share = planted, 1e-5
    elif which == "random":
        model, tol_share = _random_toy(), tol
    else:
        model, seq_len, window, tol_share = request.getfixturevalue("gpt2_tiny"), 200, 16, tol
    probe = needle_probe(model, seq_len=seq_len, depths=(0.0, 0.4, 0.95), needle_len=5, batch=2, seed=2)
    pat = retrieval_counts(model, probe, sink=4, window=window, config=RunConfig(engine="pattern"))
    stream = retrieval_counts(model, probe, sink=4, window=window, config=RunConfig(engine="stream", minibatch=1))
    assert torch.equal(pat.hits, stream.hits)
    assert torch.allclose(pat.mass, stream.mass, atol=tol, rtol=0)
    assert torch.allclose(pat.induction, stream.induction, atol=tol, rtol=0)
    share = lambda c: c.stream / c.stream_queries[:, None, None]  # noqa: E731
    assert torch.allclose(share(pat), share(stream), atol=tol_share, rtol=0)
    if which == "planted":
        assert float(stream.hits[:, RETRIEVAL[0], RETRIEVAL[1]].sum()) == probe.n_needles * 4
    else:  # the comparison bites: masses and shares are spread
        assert float(stream.mass.max()) > 0.01 and 0.05 < float(share(stream).min()) < 0.95


def test_auto_engine_and_scores_on_the_stream(planted):
    probe = needle_probe(planted, seq_len=1024, depths=(0.1, 0.6), needle_len=6, batch=1, seed=1)
    scores = retrieval_scores(planted, probe, config=RunConfig(engine="auto", budget=1 << 20, n_boot=100))
    assert scores.meta["engine"] == "stream" and "over the 1 MiB budget" in scores.meta["engine_reason"]
    assert scores.meta["window"] == 256  # min(1024, 1024 // 4)
    t = scores.table.set_index(["layer", "head"])
    assert t.loc[RETRIEVAL, "retrieval"] == 1.0 and t.loc[RETRIEVAL, "role"] == "retrieval"
    assert t.loc[STREAMING, "role"] == "streaming"


# ---- copy distance through a sliding window -----------------------------------------------------


def test_sliding_window_head_falls_to_uniform_past_its_window():
    from interp.models import from_hf_model
    from tests.conformance import WINDOW, build

    hf, tok = build("mistral")
    model = from_hf_model(hf, tok, name="mistral")
    assert layer_windows(model) == [WINDOW, WINDOW]
    inside, outside = (4, 8, 12), (24, 64, 128)
    probe = copy_distance_probe(model, (*inside, *outside), span=3, batch=2, seed=0)
    table = copy_distance_scores(model, probe, config=RunConfig(engine="pattern"))
    for d in outside:  # past the window the earlier copy is masked: no mass, never the argmax
        rows = table[table["distance"] == d]
        assert (rows["induction"] <= rows["uniform"]).all() and (rows["induction"] == 0).all()
        assert (rows["retrieval"] == 0).all()
    for d in inside:  # within it, the heads put well above a uniform head's mass on the copy's key
        rows = table[table["distance"] == d]
        assert rows["induction"].mean() > 3 * rows["uniform"].iloc[0]
    fig = copy_distance_figure(table, windows=layer_windows(model))
    assert {s.x0 for s in fig.layout.shapes} == {WINDOW}
    assert any(t.name == "uniform" for t in fig.data)


# ---- the window ablation -------------------------------------------------------------------------


def test_window_ablation_equals_masked_softmax():
    model = _random_toy()
    tokens = torch.randint(1, 64, (2, 60))
    abl = WindowAblation(sink=2, window=5)
    heads = ["0.1", "1.2"]
    got: dict = {}

    def keep(name):
        def hook(x, hook):
            got[name] = x.detach().clone()

        return hook

    names = [q_hook(1), k_hook(1), v_hook(1), z_hook(1)]
    with ablated(model, heads, ablation=abl):
        model.run_with_hooks(tokens, fwd_hooks=[(n, keep(n)) for n in names])
    q, k, v, z = (got[n] for n in names)  # [batch, pos, head, d_head]; layer 1's inputs under the ablation
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * model.blocks[1].attn.scale
    T = tokens.shape[1]
    qi, ki = torch.arange(T)[:, None], torch.arange(T)[None]
    allowed = (ki <= qi) & ((ki < 2) | (ki > qi - 5))
    full = s.masked_fill(ki > qi, -math.inf).softmax(-1)
    cut = s.masked_fill(~allowed, -math.inf).softmax(-1)
    pattern = torch.where((torch.arange(4) == 2)[None, :, None, None], cut, full)  # head 1.2 restricted
    want = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
    assert torch.allclose(z, want, atol=1e-5)
    assert (z[:, :, 2] - torch.einsum("bhqk,bkhd->bqhd", full, v)[:, :, 2]).abs().max() > 1e-2  # it bites


def test_window_ablation_breaks_retrieval_not_streaming(planted):
    probe = needle_probe(planted, seq_len=1024, depths=(0.1, 0.5), needle_len=6, batch=2, seed=4)
    clean = needle_copy_loss(planted, probe)
    abl = WindowAblation(sink=4, window=64)  # every needle sits more than 64 tokens before its copy
    with ablated(planted, [STREAMING], ablation=abl):
        streaming = needle_copy_loss(planted, probe)
    with ablated(planted, [RETRIEVAL], ablation=abl):
        retrieval = needle_copy_loss(planted, probe)
    assert clean < 1e-3
    assert abs(streaming - clean) < 1e-4
    assert retrieval > 2.0  # ln(63) = 4.1 would be a uniform guess over the ordinary tokens


def test_window_ablation_refuses_the_output_patch():
    with pytest.raises(AblationError) as e:
        WindowAblation().replacement(0)
    assert str(e.value) == (
        "window ablation changes a head's attention pattern, not its output: run it with "
        "interp.ablated(...) or the sweep's replay='loop'"
    )
    with pytest.raises(AblationError, match=r"window ablation: window must be an integer >= 1, got 0"):
        WindowAblation(window=0)


# ---- the command -----------------------------------------------------------------------------------


def test_command(tmp_path, capsys):
    from interp.cli.retrieval import cli

    assert "retrieval" in COMMANDS
    out = tmp_path / "o"
    argv = ["--model", "planted:600", "--seq-len", "512", "--batch", "2", "--out", str(out), "--no-progress"]
    assert cli([*argv, "--engine", "stream", "--distances", "16,64,256", "--window", "32"]) == 0
    text = capsys.readouterr().out
    first = text.split("top ")[1].splitlines()[2].split()
    assert first[0] == "1.0" and first[1] == "1.000" and first[-1] == "retrieval"
    assert "engine: stream (asked for" in text
    assert {p.name for p in out.iterdir()} >= {"retrieval.csv", "retrieval.json", "retrieval_distance.csv"}
    check = text.split("ablation check: ")[1].splitlines()
    assert (
        check[0]
        == "needle-copy loss (nats, 42 copy steps) with a role's heads restricted to the first 4 + last 32 keys:"
    )
    assert check[1] == "  streaming heads (0.0, 0.1): 0.0000 unrestricted -> 0.0000 restricted (+0.0000)"
    assert check[2].startswith("  retrieval heads (1.0): 0.0000 unrestricted -> ")
    assert float(check[2].split("-> ")[1].split()[0]) > 2.0  # the copy breaks without the needle's keys
    saved = json.loads((out / "retrieval.json").read_text())["meta"]["ablation_check"]
    assert saved["retrieval"]["heads"] == ["1.0"] and saved["retrieval"]["loss"] > 2.0
    assert cli(["--model", "planted:bad", "--out", str(out)]) == 1
    assert "write 'planted' or 'planted:N'" in capsys.readouterr().err


def test_command_skips_the_ablation_check_past_the_pattern_budget(tmp_path, capsys, monkeypatch):
    from interp.cli import retrieval

    monkeypatch.setattr(retrieval, "PATTERN_BUDGET", 1000)
    argv = ["--model", "planted:600", "--seq-len", "512", "--batch", "2", "--distances", "none", "--no-progress"]
    assert retrieval.cli([*argv, "--engine", "stream", "--window", "32", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert (
        "\nablation check skipped: restricting heads to the first 4 + last 32 keys edits the attention pattern, "
        "which needs the pattern engine, and one layer's pattern for 2 x 513 tokens takes 8.03 MiB, over the "
        "0.000954 MiB budget; lower --seq-len or --batch to run it\n"
    ) in text
