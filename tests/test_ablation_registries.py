"""The ablation package's registries, run configuration and result objects: names registered once
(metrics, ablation kinds, pruning orders, replays), the deprecated ``engine=`` / ``--engine``
spellings, ``config=RunConfig(...)`` against the keywords, and the PruningCurves / GateSweep results."""

import json
import warnings

import pandas as pd
import pytest
import torch

import interp
import interp.ablation
import interp.cli.common
from interp.ablate import cli
from interp.ablation import (
    ABLATIONS,
    METRICS,
    ORDERS,
    REPLAYS,
    AblationError,
    HeadAblation,
    MeanAblation,
    PatchAblation,
    PruningCurves,
    ResampleAblation,
    Sweeper,
    WindowAblation,
    ZeroAblation,
    as_ablation,
    builtin_metric,
    exact_sweep,
    heads_prunable,
    incontext_loss,
    logit_diff,
    pruning_curves,
    train_gates,
)
from interp.ablation.modes import derangement
from interp.cli.ablate import build_parser
from interp.config import RunConfig
from interp.probes import repeated_tokens
from tests.helpers import one_thread

SMALL = ["--batch", "3", "--seq-len", "8", "--device", "cpu", "--no-progress"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def probe(gpt2_tiny):
    return repeated_tokens(gpt2_tiny, batch=4, block_len=12, seed=0)


# ---- registries -------------------------------------------------------------------------------


def test_metrics_are_registered_once_with_their_direction_and_flatness(gpt2_tiny, probe):
    assert METRICS.names() == ("incontext", "lm", "logit-diff", "pooled-cos")
    for name in METRICS:
        metric = builtin_metric(name, probe)
        assert metric.higher_is_better is METRICS.info(name, "higher_is_better"), name
        assert metric.flat_at_clean is METRICS.info(name, "flat_at_clean"), name
        assert METRICS.doc(name)
    assert METRICS.info("pooled-cos", "flat_at_clean") and not METRICS.info("incontext", "flat_at_clean")
    with pytest.raises(AblationError, match=r"unknown metric 'nope': choose from \['incontext', 'lm'"):
        builtin_metric("nope", probe)


def test_ablation_kinds_are_small_registered_classes(gpt2_tiny, probe):
    assert ABLATIONS.names() == ("zero", "mean", "resample", "patch", "window")
    assert [ABLATIONS.get(n) for n in ABLATIONS] == [
        ZeroAblation,
        MeanAblation,
        ResampleAblation,
        PatchAblation,
        WindowAblation,
    ]
    mean = HeadAblation.fit(gpt2_tiny, "mean", probe)
    assert isinstance(mean, MeanAblation) and isinstance(mean, HeadAblation) and mean.kind == "mean"
    assert torch.equal(mean.mean, MeanAblation.fit(gpt2_tiny, probe).mean)
    assert mean.replacement(1).shape == mean.mean[1].shape
    assert float(ZeroAblation().replacement(0)) == 0.0
    resample = as_ablation("resample", gpt2_tiny, probe, seed=3)
    assert isinstance(resample, ResampleAblation) and resample.donors == derangement(4, 3).tolist()
    assert as_ablation(mean, gpt2_tiny, probe) is mean  # a fitted ablation is used as it is
    with pytest.raises(
        AblationError, match=r"unknown ablation 'half': choose from \['zero', 'mean', 'resample', 'patch', 'window'\]"
    ):
        as_ablation("half", gpt2_tiny, probe)
    with pytest.raises(AblationError, match="mean ablation needs a probe"):
        HeadAblation.fit(gpt2_tiny, "mean")


def test_orders_and_replays_are_registered_once():
    assert ORDERS.names() == ("gradient", "exact", "random")
    assert [o for o in ORDERS if ORDERS.info(o, "needs_gradient")] == ["gradient"]
    assert REPLAYS.names() == ("auto", "fast", "loop")
    assert all(REPLAYS.doc(n) for n in REPLAYS)


def test_the_cli_takes_its_choices_and_help_from_the_registries():
    actions = {a.dest: a for a in build_parser()._actions}
    # a kind that needs paired prompts (patch: interp patch) is not an ablate choice
    assert list(actions["ablation"].choices) == [n for n in ABLATIONS.names() if n != "patch"]
    assert list(actions["metric"].choices) == list(METRICS.names())
    assert list(actions["replay"].choices) == list(REPLAYS.names())
    assert REPLAYS.help() in actions["replay"].help and ABLATIONS.doc("resample") in actions["ablation"].help
    assert METRICS.help() in actions["metric"].help and ORDERS.help() in actions["orders"].help


def test_public_names_only_in_all():
    public = set(interp.ablation.__all__)
    assert all(hasattr(interp.ablation, n) for n in public)
    assert not {"gate_sample", "derangement", "predictable_mask", "CleanBatch", "ENGINES"} & public
    exposed = {n for n, m in interp._API.items() if m == "interp.ablation"}
    assert exposed <= public


# ---- replay= and the deprecated engine= ---------------------------------------------------------


def test_engine_keyword_still_works_with_a_deprecation_warning(gpt2_tiny, probe):
    metric = incontext_loss(probe)
    want = exact_sweep(gpt2_tiny, probe, metric, replay="loop")
    with pytest.warns(DeprecationWarning, match=r"engine= is deprecated for ablation sweeps: use replay="):
        got = exact_sweep(gpt2_tiny, probe, metric, engine="loop")
    assert got.meta["replay"] == got.meta["engine"] == want.meta["replay"] == "loop"
    pd.testing.assert_frame_equal(got.table, want.table)
    with pytest.warns(DeprecationWarning, match="use replay="):
        sweeper = Sweeper(gpt2_tiny, probe, metric, engine="loop")
    assert sweeper.replay == "loop"
    with pytest.warns(DeprecationWarning, match="use Sweeper.replay"):
        assert sweeper.engine == "loop"
    with pytest.raises(AblationError, match="disagree"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exact_sweep(gpt2_tiny, probe, metric, replay="fast", engine="loop")
    with pytest.raises(AblationError, match=r"unknown replay 'quick': choose from \['auto', 'fast', 'loop'\]"):
        exact_sweep(gpt2_tiny, probe, metric, replay="quick")
    with pytest.warns(DeprecationWarning, match="REPLAYS"):
        assert interp.ablation.ENGINES is REPLAYS


def test_run_config_and_keywords_give_the_same_run(gpt2_tiny, probe):
    metric = incontext_loss(probe)
    by_keyword = exact_sweep(gpt2_tiny, probe, metric, ablation="resample", minibatch=3, seed=3, replay="loop")
    by_config = exact_sweep(
        gpt2_tiny, probe, metric, ablation="resample", config=RunConfig(minibatch=3, seed=3), replay="loop"
    )
    pd.testing.assert_frame_equal(by_keyword.table, by_config.table)
    assert by_config.meta["ablation"] == "resample"
    donors = Sweeper(gpt2_tiny, probe, metric, ablation="resample", config=RunConfig(seed=3), replay="loop")
    assert donors.ablation.donors == derangement(4, 3).tolist() != derangement(4, 0).tolist()  # the config's seed
    sweeper = Sweeper(gpt2_tiny, probe, metric, ablation="resample", config=RunConfig(seed=3), seed=4, replay="loop")
    assert sweeper.ablation.donors == derangement(4, 4).tolist() != derangement(4, 3).tolist()  # the keyword wins
    assert sweeper.config.seed == 4 and sweeper.minibatch == probe.batch


# ---- results ------------------------------------------------------------------------------------


def test_pruning_curves_is_one_result_that_saves_loads_and_draws(gpt2_tiny, probe, tmp_path):
    metric = logit_diff(probe.tokens[:, 5], probe.tokens[:, 6], position=-1)
    curves = pruning_curves(gpt2_tiny, probe, metric, orders=["exact", "random"], random_seeds=(0, 1), step=0.5)
    assert isinstance(curves, PruningCurves)
    assert curves.table["label"].unique().tolist() == ["exact", "random (seed 0)", "random (seed 1)"]
    assert curves.table.attrs["metric"] == curves.meta["metric"] == "logit_diff"
    assert {"model", "n_layers", "n_heads", "causal", "probe", "clean_metric"} <= set(curves.meta)
    assert not curves.partial and curves.meta["partial"] is False
    pd.testing.assert_frame_equal(heads_prunable(curves, 0.2), heads_prunable(curves.table, 0.2))
    written = curves.save(tmp_path, "p", tolerance=0.2, meta={"model_spec": "tiny"})
    assert [p.name for p in written] == ["p.csv", "p.json"]
    blob = json.loads((tmp_path / "p.json").read_text())
    assert blob["meta"]["tolerance"] == 0.2 and blob["meta"]["model_spec"] == "tiny" and len(blob["prunable"]) == 3
    back = PruningCurves.load(tmp_path / "p.json")
    pd.testing.assert_frame_equal(back.table, curves.table, check_dtype=False)
    assert back.table.attrs["clean_metric"] == curves.table.attrs["clean_metric"]
    assert PruningCurves.load(tmp_path, "p").meta == back.meta
    fig = curves.figure()
    assert [t.name for t in fig.data] == ["exact", "random (seed 0)", "random (seed 1)"]
    with pytest.raises(AblationError, match="unknown order 'alphabetical'"):
        pruning_curves(gpt2_tiny, probe, metric, orders=["alphabetical"])


def test_gate_sweep_draws_its_figures(gpt2_tiny, probe):
    sweep = train_gates(gpt2_tiny, probe, incontext_loss(probe), [0.0, 100.0], steps=2, lr=1.0)
    gates = sweep.figure()
    assert gates.data and "Hard-Concrete gates per lambda" in gates.layout.title.text
    pair = sweep.figure("curves")
    assert len(pair.data) == 2 and pair.layout.xaxis.type == "log"
    with pytest.raises(AblationError, match="draws 'gates' or 'curves'"):
        sweep.figure("bars")


# ---- the CLI ------------------------------------------------------------------------------------


@pytest.fixture
def loaded(monkeypatch, gpt2_tiny):
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: gpt2_tiny)
    return gpt2_tiny


def test_replay_flag_and_the_deprecated_engine_flag(loaded, tmp_path, capsys):
    assert cli(["--out", str(tmp_path / "r"), *SMALL, "--replay", "loop"]) == 0
    captured = capsys.readouterr()
    assert "--engine is deprecated" not in captured.err and "replay loop" in captured.out
    assert json.loads((tmp_path / "r" / "ablate_exact.json").read_text())["meta"]["replay"] == "loop"
    assert cli(["--out", str(tmp_path / "e"), *SMALL, "--engine", "loop"]) == 0
    captured = capsys.readouterr()
    line = "--engine is deprecated for ablate: use --replay; --engine will be removed in the next release"
    assert captured.err.splitlines().count(line) == 1
    assert json.loads((tmp_path / "e" / "ablate_exact.json").read_text())["meta"]["replay"] == "loop"
