"""The fast engine's self-check: replays under ablation must equal plain hooked runs, or the engine
falls back to the loop (``auto``) or refuses (``fast``)."""

import warnings

import pytest
import torch

from interp.ablation import AblationError, Sweeper, exact_sweep, incontext_loss, loop_sweep
from interp.ablation.calls import UnreplayableCall, call_plan, expand_call
from interp.probes import repeated_tokens
from interp.toy import ToyConfig, ToyTransformer
from interp.toy.model import TransformerBlock


class SkipBlock(TransformerBlock):
    """A toy block that also adds an input handed to it by the model (``skip``)."""

    def forward(self, resid, skip=None):
        return super().forward(resid if skip is None else resid + skip)


class CrossBlockToy(ToyTransformer):
    """The toy with block 1 also receiving half of block 0's output (a DenseFormer-style skip)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.blocks = torch.nn.ModuleList([SkipBlock(cfg) for _ in range(cfg.n_layers)])
        self._init_weights()
        self.to(device=cfg.device, dtype=cfg.dtype)
        self.setup()

    def forward(self, tokens, return_type="logits"):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        resid = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(positions)[None])
        out0 = self.blocks[0](resid)
        resid = self.blocks[1](out0, skip=0.5 * out0)
        for block in self.blocks[2:]:
            resid = block(resid)
        return self.unembed(self.ln_final(resid))


def _cfg(**kw):
    return ToyConfig(n_layers=3, d_model=32, n_heads=4, d_vocab=64, n_ctx=64, attn_only=False, **kw)


@pytest.fixture(scope="module")
def cross_block():
    torch.manual_seed(0)
    return CrossBlockToy(_cfg()).eval()


@pytest.mark.parametrize("ablation", ["zero", "mean", "resample"])
def test_cross_block_model_falls_back_and_equals_the_loop(cross_block, ablation):
    p = repeated_tokens(cross_block, batch=3, block_len=8, seed=0)
    metric = incontext_loss(p)
    with pytest.warns(UserWarning, match=f"under {ablation} ablation of 0.0, 0.1, 0.2, 0.3, 2.0, 2.1, 2.2, 2.3 does"):
        auto = exact_sweep(cross_block, p, metric, ablation=ablation)
    loop = loop_sweep(cross_block, p, metric, ablation=ablation)
    assert auto.meta["engine"] == "loop"
    assert torch.equal(torch.tensor(auto.grid("metric_ablated")), torch.tensor(loop.grid("metric_ablated")))
    with pytest.raises(AblationError, match="the fast replay cannot run this model: replaying its blocks under"):
        exact_sweep(cross_block, p, metric, ablation=ablation, replay="fast")


def test_the_replay_would_be_wrong_on_the_cross_block_model(cross_block):
    """What the check guards: the replay takes block 1's skip input from the clean pass, so layer-0
    heads come out wrong by far more than the fast-vs-loop tolerance (1e-4)."""
    p = repeated_tokens(cross_block, batch=3, block_len=8, seed=0)
    metric = incontext_loss(p)
    sweeper = Sweeper(cross_block, p, metric, replay="loop")
    sweeper.plan_calls()  # classifies the block arguments (the self-check's first part); no verdict
    sweeper.replay = "fast"
    fast = exact_sweep(cross_block, p, metric, replay="loop")  # reference
    masks = torch.zeros(4, 3, 4, dtype=torch.bool)
    masks[torch.arange(4), 0, torch.arange(4)] = True
    replayed = sweeper.evaluate(masks).mean(1)
    want = torch.tensor(fast.grid("metric_ablated")[0], dtype=torch.float32)
    assert (replayed - want).abs().max() > 30 * 1e-4 * want.abs().max()  # 30x the fast-vs-loop tolerance


def test_a_plain_toy_keeps_the_fast_engine_without_a_warning():
    torch.manual_seed(0)
    model = ToyTransformer(_cfg()).eval()
    p = repeated_tokens(model, batch=3, block_len=8, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast = exact_sweep(model, p, incontext_loss(p), ablation="mean")
    assert fast.meta["engine"] == "fast"


def test_block_arguments_are_expanded_by_what_they_are():
    b3 = (
        (torch.ones(3, 1, 5, 5), [torch.zeros(1, 5, 2), torch.zeros(3, 5, 2)]),
        {"ids": torch.arange(5)[None], "n": 4},
    )
    b2 = (
        (torch.ones(2, 1, 5, 5), [torch.zeros(1, 5, 2), torch.zeros(2, 5, 2)]),
        {"ids": torch.arange(5)[None], "n": 4},
    )
    plan = call_plan(b3, b2, 3, 2)
    assert plan == (["seq", ["shared", "seq"]], {"ids": "shared", "n": None})
    args, kwargs = expand_call(b2, plan, rep=4)
    assert args[0].shape == (8, 1, 5, 5) and isinstance(args[1], list)
    assert args[1][0].shape == (1, 5, 2) and args[1][1].shape == (8, 5, 2)
    assert kwargs["ids"].shape == (1, 5) and kwargs["n"] == 4
    with pytest.raises(UnreplayableCall, match=r"argument\[0\] has shape \[3, 7\] for 3 sequences and \[2, 5\] for 2"):
        call_plan(((torch.ones(3, 7),), {}), ((torch.ones(2, 5),), {}), 3, 2)
    with pytest.raises(UnreplayableCall, match=r"keyword argument\['x'\] is a object, which the replay cannot copy"):
        call_plan(((), {"x": object()}), ((), {"x": object()}), 3, 2)


def test_cross_block_model_is_refused_in_bf16_too():
    """The check's tolerance follows the ablation's effect, not the largest logit: in bf16 it still bites."""
    torch.manual_seed(0)
    model = CrossBlockToy(_cfg(dtype=torch.bfloat16)).eval()
    p = repeated_tokens(model, batch=3, block_len=8, seed=0)
    with pytest.raises(AblationError, match=r"under zero ablation of 0.0, .*\(max error .*, the ablation.s effect"):
        exact_sweep(model, p, incontext_loss(p), replay="fast")


def test_head_sets_given_as_the_language_are_the_default_sweeper_and_edges_share_its_executor():
    """The Sweeper is the one executor: head sets passed as its language give what its default
    gives (a mean ablation over a base head, per head and per position), and the edge executor
    overrides none of its capture, replay, loop or evaluation, only its constructor."""
    from interp.ablation import HeadSets
    from interp.patching.edge_patch import EdgeCodes, EdgeSweeper

    torch.manual_seed(0)
    model = ToyTransformer(_cfg()).eval()
    p = repeated_tokens(model, batch=3, block_len=8, seed=0)
    metric = incontext_loss(p)
    default = Sweeper(model, p, metric, ablation="mean", base=["2.1"])
    given = Sweeper(model, p, metric, language=HeadSets("mean", ["2.1"]))
    masks = torch.zeros(3, 3, 4, dtype=torch.bool)
    masks[0, 0, 1] = masks[1, 1, 2] = masks[2, 2, 0] = True
    per_pos = torch.zeros(1, 3, 4, p.seq_len, dtype=torch.bool)
    per_pos[0, 1, 3, 5:] = True
    for sets in (masks, per_pos):
        want = default.evaluate(sets)
        assert torch.equal(given.evaluate(sets), want)
        assert (want - default.unpatched).abs().max() > 1e-3  # the head sets move the metric
    assert given.shortcuts == default.shortcuts and given.base[2, 1] and given.ablation.kind == "mean"
    overridden = {k for k in vars(EdgeSweeper) if callable(vars(EdgeSweeper)[k])}
    assert overridden == {"__init__"}
    assert {"capture", "install", "plain", "settle", "verify"} <= set(vars(EdgeCodes))
