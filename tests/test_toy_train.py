"""Training data, scores and determinism of `interp.toy.train` (tiny sizes), and the bundled toy."""

import json

import pytest
import torch

from interp.toy import ToyConfig, ToyTransformer, load_toy, toy_dir
from interp.toy.train import (
    TrainConfig,
    circuit_scores,
    induction_probe,
    induction_targets,
    repeated_blocks,
    second_repeat_loss,
    train,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_repeated_blocks_repeat_by_content_with_random_periods():
    tokens, periods = repeated_blocks(64, 120, 50, 5, 40, torch.Generator().manual_seed(0))
    assert tokens.shape == (64, 120) and (tokens[:, 0] == 0).all()
    assert tokens[:, 1:].min() >= 1 and tokens.max() <= 49
    assert periods.min() >= 5 and periods.max() <= 40 and len(set(periods.tolist())) > 10
    for row, period in zip(tokens, periods.tolist()):
        body = row[1:]
        assert torch.equal(body[period:], body[:-period])  # every token repeats the one a period back


def test_induction_targets_mark_what_copying_can_predict():
    mask = induction_targets(torch.tensor([3]), n_ctx=10)[0]
    # tokens: BOS a b c a b c a b c; index i predicts token i + 1. "a" at 4 follows "c", whose only
    # earlier occurrence is itself: unpredictable. "b" at 5 follows the second "a": predictable.
    assert mask.tolist() == [False, False, False, False, True, True, True, True, True]


def test_probe_is_bos_then_a_block_twice():
    probe = induction_probe(4, 7, 30, torch.Generator().manual_seed(0))
    assert probe.shape == (4, 15) and (probe[:, 0] == 0).all()
    assert torch.equal(probe[:, 1:8], probe[:, 8:])


def test_head_scores_read_the_pattern():
    """Hand-set patterns: one head attends one back, another does induction; scores say so."""
    model = ToyTransformer(ToyConfig(n_layers=2, d_model=16, n_heads=2, n_ctx=32, d_vocab=20)).eval()
    half = 6
    n = 1 + 2 * half

    def set_pattern(pattern, hook):
        new = torch.zeros_like(pattern)
        q = torch.arange(n)
        new[:, :, q, q] = 1.0  # default: attend to self
        new[:, 0, q[1:], q[1:] - 1] = 1.0  # head 0: previous token
        new[:, 0, q[1:], q[1:]] = 0.0
        second = torch.arange(1 + half, n)
        new[:, 1, second, second] = 0.0
        new[:, 1, second, second - half + 1] = 1.0  # head 1: induction
        return new

    for hp in (model.blocks[0].attn.hook_pattern, model.blocks[1].attn.hook_pattern):
        hp.add_hook(set_pattern, is_permanent=True)
    scores = circuit_scores(model, induction_probe(2, half, 20, torch.Generator().manual_seed(0)), half)
    torch.testing.assert_close(scores["previous_token"][:, 0], torch.ones(2))
    torch.testing.assert_close(scores["induction"][:, 1], torch.ones(2))
    assert scores["induction"][:, 0].max() < 0.2 and scores["previous_token"][:, 1].max() < 0.5


def test_training_is_deterministic_for_a_seed():
    cfg = ToyConfig(n_layers=2, d_model=16, n_heads=2, n_ctx=32, d_vocab=20)
    tc = TrainConfig(
        seed=3, steps=3, batch_size=4, eval_every=3, probe_half=8, probe_batch=4, min_period=3, max_period=10
    )
    (a, history_a), (b, history_b) = train(cfg, tc, progress=False), train(cfg, tc, progress=False)
    assert history_a == history_b and [r["step"] for r in history_a] == [0, 3]
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    c, _ = train(cfg, TrainConfig(**{**tc.__dict__, "seed": 4}), progress=False)
    assert not torch.equal(a.W_Q, c.W_Q)
    assert not torch.are_deterministic_algorithms_enabled()  # the global switch is restored


# -------------------------------------------------------------------------------------------
# the bundled checkpoint in data/toy/
# -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy():
    return load_toy()


def test_bundled_toy_has_induction_and_previous_token_heads(toy):
    half = 50
    probe = induction_probe(16, half, toy.cfg.d_vocab, torch.Generator().manual_seed(12345))
    scores = circuit_scores(toy, probe, half)
    assert scores["induction"][1].max() > 0.8
    layer, _head = divmod(scores["previous_token"].argmax().item(), toy.cfg.n_heads)
    assert layer == 0
    assert scores["previous_token"][0].max() > 0.5


def test_ablating_the_top_induction_head_breaks_in_context_copying(toy):
    half = 50
    probe = induction_probe(16, half, toy.cfg.d_vocab, torch.Generator().manual_seed(54321))
    head = circuit_scores(toy, probe, half)["induction"][1].argmax().item()
    clean = second_repeat_loss(toy, probe, half)
    ablated = second_repeat_loss(toy, probe, half, silence=(1, head))
    assert ablated >= 3 * clean, (clean, ablated)
    # the induction head needs the layer-0 previous-token head (K-composition): zeroing that breaks it too
    prev_head = circuit_scores(toy, probe, half)["previous_token"][0].argmax().item()
    assert second_repeat_loss(toy, probe, half, silence=(0, prev_head)) >= 3 * clean


def test_second_repeat_loss_silences_exactly_one_head():
    model = ToyTransformer(ToyConfig(n_layers=1, d_model=16, n_heads=2, n_ctx=32, d_vocab=20)).eval()
    probe = induction_probe(2, 6, 20, torch.Generator().manual_seed(0))
    seen = []
    model.blocks[0].attn.hook_result.add_hook(lambda r, hook: seen.append(r), is_permanent=True)
    second_repeat_loss(model, probe, 6, silence=(0, 1))
    assert seen[-1][:, :, 1].abs().max() == 0 and seen[-1][:, :, 0].abs().max() > 0


def test_bundled_card_describes_the_checkpoint(toy):
    card = json.loads((toy_dir() / "card.json").read_text())
    assert ToyConfig.from_dict(card["config"]) == toy.cfg
    assert card["induction_heads"][0]["layer"] == 1 and card["induction_heads"][0]["score"] > 0.8
    assert card["previous_token_heads"][0]["layer"] == 0
    assert card["final"]["in_context_loss"] < card["history"][0]["in_context_loss"] / 5
    total = sum(p.stat().st_size for p in toy_dir().iterdir() if p.is_file())
    assert total < 2 * 2**20


def test_zeroing_the_top_induction_head_multiplies_the_second_repeat_loss(toy):
    """Computed from the checkpoint, not read from the card: on a fresh probe the best layer-1
    induction head carries the copying (zeroing it alone multiplies the loss by > 3), and the card's
    stored figures are what the checkpoint gives on the card's own probe."""
    tc = TrainConfig()
    probe = induction_probe(tc.probe_batch, tc.probe_half, toy.cfg.d_vocab, torch.Generator().manual_seed(7))
    induction = circuit_scores(toy, probe, tc.probe_half)["induction"]
    top = divmod(int(induction.argmax()), induction.shape[1])
    clean = second_repeat_loss(toy, probe, tc.probe_half)
    assert top[0] == 1 and second_repeat_loss(toy, probe, tc.probe_half, top) > 3 * clean
    card = json.loads((toy_dir() / "card.json").read_text())["ablation"]
    own = induction_probe(tc.probe_batch, tc.probe_half, toy.cfg.d_vocab, torch.Generator().manual_seed(1000))
    head = (card["head"]["layer"], card["head"]["head"])
    assert second_repeat_loss(toy, own, tc.probe_half) == pytest.approx(card["second_repeat_loss"], abs=1e-4)
    assert second_repeat_loss(toy, own, tc.probe_half, head) == pytest.approx(
        card["second_repeat_loss_head_zeroed"], abs=1e-4
    )
    total = sum(p.stat().st_size for p in toy_dir().iterdir() if p.is_file())
    assert total < 2 * 2**20


def test_load_toy_explains_a_missing_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_DATA_DIR", str(tmp_path))
    assert toy_dir() == tmp_path / "toy"
    with pytest.raises(FileNotFoundError, match="python -m interp.toy.train"):
        load_toy()
