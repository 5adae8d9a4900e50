"""QK attribution: known answers on the planted induction pair and the bundled trained toy, the result's
shape (table, grid, top, figure, save/load), and its checks.

The planted model (:mod:`interp.toy.planted`, no LayerNorm) is a hand-set induction pair: head 0.0
writes the previous token into a subspace that head 1.0's keys read, and 1.0's queries read the
current token from the embedding. So the whole of 1.0's contrast at its induction targets is the
pair (query: embed, key: 0.0); 0.0's own contrast at the previous token is (pos_embed, pos_embed),
and the streaming head 0.1's contrast at the first token comes from the first position's sink flag
(pos_embed) on the key side.
"""

from __future__ import annotations

import pytest
import torch

from interp.config import RunConfig
from interp.errors import UsageError
from interp.models import load_model
from interp.probes import repeated_tokens
from interp.roles.qk import QKAttribution, head_totals, qk_attribution, validate_qk_attribution
from interp.toy.planted import planted_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FAST = RunConfig(n_boot=200)


@pytest.fixture(scope="module")
def planted():
    return planted_model(n_ctx=129, n_heads=2)


@pytest.fixture(scope="module")
def toy():
    return load_model("toy")


def test_planted_induction_head_key_side_is_the_previous_token_head_query_side_the_embedding(planted):
    probe = repeated_tokens(planted, batch=6, block_len=30, n_repeats=2, seed=1)
    r = qk_attribution(planted, probe, heads="1.0", at="induction", config=FAST)
    top = r.top(1).iloc[0]
    assert (top["query"], top["key"]) == ("embed", "0.0")
    totals = head_totals(r, "1.0")
    assert totals["contrast"] > 50  # the planted gap: a hard softmax
    assert top["contrast"] == pytest.approx(totals["contrast"], rel=1e-4)  # almost all of it
    assert top["contrast_lo"] <= top["contrast"] <= top["contrast_hi"]
    assert totals["contrast_terms"] == pytest.approx(totals["contrast"], rel=1e-5)  # the terms add up


def test_planted_previous_token_and_sink_heads(planted):
    probe = repeated_tokens(planted, batch=4, block_len=30, n_repeats=2, seed=2)
    prev = qk_attribution(planted, probe, heads="0.0", at="previous", config=FAST).top(1).iloc[0]
    assert (prev["query"], prev["key"]) == ("pos_embed", "pos_embed")
    sink = qk_attribution(planted, probe, heads="0.1", at="sink", config=FAST)
    grid = sink.grid("0.1")
    assert grid["pos_embed"].sum() == pytest.approx(head_totals(sink, "0.1")["contrast"], rel=1e-4)
    assert grid["embed"].abs().max() < 1e-6  # the first token's identity plays no part: its position does


def test_trained_toy_induction_heads_read_the_previous_token_head_on_the_key_side(toy):
    """What the trained toy does: each induction head 1.x takes its key side from 0.1, the
    previous-token head (at least 0.6 of the contrast), and its query side from the current token,
    read from the embedding directly and through 0.3, a head that attends to its own position (79%
    of its mass) and so re-writes the current token: together at least 0.7 of the contrast."""
    probe = repeated_tokens(toy, batch=10, block_len=20, n_repeats=2, seed=0)
    r = qk_attribution(toy, probe, heads="1.0,1.1,1.2,1.3", at="induction", config=FAST)
    for head in r.heads:
        grid, total = r.grid(head), head_totals(r, head)["contrast"]
        assert total > 5
        assert grid["0.1"].sum() > 0.6 * total
        assert grid.loc[["embed", "0.3"]].sum().sum() > 0.7 * total
        assert (grid.loc["embed", "0.1"] > 0.2 * total) and grid.loc["embed", "0.1"] == grid.loc["embed"].max()
        assert r.top(2, head=head)[["query", "key"]].values.tolist() == [["0.3", "0.1"], ["embed", "0.1"]]
    # why 0.3 stands for the current token on the query side: it attends to its own position
    from interp.report import attention_patterns

    own = torch.stack([attention_patterns(toy, t)[0, 3].diagonal()[1:].mean() for t in probe.tokens])
    assert own.mean() > 0.75  # 0.797 measured; a uniform head gives about 1/20 here
    grouped = qk_attribution(toy, probe, heads="1.2", at="induction", group="kind", keep=["0.1"], config=FAST)
    assert grouped.top(1).iloc[0][["query", "key"]].tolist() == ["heads", "0.1"]


def test_trained_toy_previous_token_head_is_positional_on_both_sides(toy):
    probe = repeated_tokens(toy, batch=6, block_len=20, n_repeats=2, seed=0)
    r = qk_attribution(toy, probe, heads="0.1", at="previous", config=FAST)
    top = r.top(1).iloc[0]
    assert (top["query"], top["key"]) == ("pos_embed", "pos_embed")
    assert top["contrast"] > 0.9 * head_totals(r, "0.1")["contrast"]


def test_result_shape_and_round_trip(toy, tmp_path):
    probe = repeated_tokens(toy, batch=4, block_len=10, n_repeats=2, seed=0)
    r = qk_attribution(toy, probe, heads="1.2", at="induction", group="layer", config=FAST)
    assert r.meta["model"] == "toy" and r.meta["kind"] == "qk_attribution" and r.meta["n_heads"] == 4
    assert list(r.grid().index) == list(r.grid().columns) == ["embed", "pos_embed", "layer.0", "norm_bias"]
    assert r.meta["max_error"] < 1e-4
    fig = r.figure()
    assert [t.type for t in fig.data] == ["heatmap", "bar", "bar"]
    assert list(fig.data[1].y) == pytest.approx(r.grid().sum(0).tolist())  # key-side totals on the margin
    back = QKAttribution.load(r.save(tmp_path)[-1])
    assert back.meta == r.meta
    assert back.grid("1.2").equals(r.grid("1.2"))


def test_explicit_rows_decompose_one_target(toy):
    tokens = torch.tensor([[0, 5, 9, 7, 5, 9]])
    one = qk_attribution(toy, tokens, heads="1.2", at=torch.tensor([[0, 4, 2]]), config=FAST)
    assert one.meta["n_targets"] == 1 and one.meta["totals"]["1.2"]["n_targets"] == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"heads": "x"}, "heads= names each head as layer.head (1.2) or (layer, head), got 'x'"),
        ({"heads": "1.2", "keep": ["9"]}, "keep= names each head as layer.head (1.2) or (layer, head), got '9'"),
        (
            {"heads": "1.2", "at": "nope"},
            "unknown target at='nope': choose from ['induction', 'previous', 'sink', 'retrieval', 'task'], or pass (batch, query, key) rows",
        ),
        (
            {"heads": "1.2", "group": "nope"},
            "unknown grouping group='nope': choose from ['component', 'layer', 'kind']",
        ),
        (
            {"heads": "1.2", "at": torch.zeros(2, 2)},
            "at= rows are (batch, query, key) positions, [n, 3] with n >= 1, got shape [2, 2]",
        ),
        ({"heads": "1.2", "top": 0}, "top= keeps each head's top pairs: a whole number of at least 1 (or None), got 0"),
    ],
)
def test_bad_options_are_refused_without_a_model(kwargs, message):
    with pytest.raises(UsageError) as e:
        validate_qk_attribution(**kwargs)
    assert str(e.value) == message


def test_a_head_outside_the_model_and_a_probe_without_repeats_are_refused(toy):
    tokens = torch.tensor([[0, 5, 9, 7]])
    with pytest.raises(UsageError, match=r"head\(s\) \['5.0'\] are not in toy"):
        qk_attribution(toy, tokens, heads="5.0", at="previous")
    with pytest.raises(UsageError, match="reads the structure of a probe"):
        qk_attribution(toy, tokens, heads="1.2", at="induction")
    with pytest.raises(UsageError) as e:  # the target named, not a tensor's repr
        qk_attribution(toy, tokens, heads="1.2", at=torch.tensor([[0, 0, 0]]))
    assert str(e.value) == (
        "none of the 1 target given is a key its query sees beside another in layer 1 (target [0, 0, 0]: query 0 "
        "of sequence 0 does not see key 0 beside another: a padded key, one outside the layer's window, or a query "
        "with one key to see)"
    )


def test_frozen_norm_fitted_on_a_sample_of_positions_is_the_norm_itself():
    """A long run's norm is fitted on a few thousand positions, not copied to float64 whole: a
    LayerNorm's own gain and bias come back from 7 of its 2 x 300 rows."""
    from interp.adapters.weights import NormSite, gain_and_bias

    gen = torch.Generator().manual_seed(0)
    norm = torch.nn.LayerNorm(8)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8, generator=gen)), norm.bias.copy_(torch.randn(8, generator=gen))
    x = torch.randn(2, 300, 8, generator=gen)
    grabbed = {
        "in": x,
        "scale": (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt(),
        "out": norm(x).detach(),
    }
    w, b = gain_and_bias(NormSite("in", "scale", "out", centered=True), grabbed, max_rows=7)
    assert torch.allclose(w, norm.weight.double(), atol=1e-5) and torch.allclose(b, norm.bias.double(), atol=1e-5)


def test_top_keeps_each_heads_largest_pairs_with_the_full_tables_values_and_cis(toy):
    probe = repeated_tokens(toy, batch=6, block_len=10, n_repeats=2, seed=1)
    full = qk_attribution(toy, probe, heads="1.0,1.2,0.1", at="induction", config=FAST)
    top = qk_attribution(toy, probe, heads="1.0,1.2,0.1", at="induction", top=4, config=FAST)
    want = full.top(4)
    assert len(full.table) > 3 * 4 and len(top.table) == 3 * 4 and top.meta["top"] == 4
    got = top.top(4)
    assert got[["head", "query", "key"]].equals(want[["head", "query", "key"]])
    for c in ("contrast", "contrast_lo", "contrast_hi", "score", "score_lo", "score_hi"):
        assert got[c].to_numpy() == pytest.approx(want[c].to_numpy(), rel=1e-6, abs=1e-7), c
    assert top.meta["totals"] == full.meta["totals"]  # each head's own, whatever is kept
    grid = top.grid("1.0")  # the pairs held, NaN elsewhere: the figure draws what the table holds
    assert int(grid.notna().sum().sum()) == 4 and len(top.figure("1.0").data) == 3


def test_the_layers_show_progress_after_saying_their_sizes(toy, capsys):
    from interp.progress import lines

    probe = repeated_tokens(toy, batch=4, block_len=10, n_repeats=2, seed=0)
    with lines():
        qk_attribution(toy, probe, heads="1.0,0.1", at="previous", top=2, config=RunConfig(n_boot=50, progress=True))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "QK attribution: 2 heads in 2 layers, 4 sequences of 21 tokens, 80 targets, every upstream block's parts "
        "replayed through each layer"
    )
    assert err[-1].startswith("QK attribution: 3/3 (100%)")  # layer 0 reads the embeddings, layer 1 one block more
