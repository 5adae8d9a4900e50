"""The ablation package's registries, run configuration and result objects: names registered once
(metrics, ablation kinds, pruning orders, replays), ``replay=`` and the deprecated ``--engine`` flag,
run settings as ``config=RunConfig(...)`` only, the model-free checks of each analysis' options, and
the PruningCurves / GateSweep results."""

import json
import re

import pandas as pd
import pytest
import torch

import interp
import interp.ablation
import interp.ablation.gradient
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
    gradient_importance,
    heads_prunable,
    incontext_loss,
    logit_diff,
    pruning_curve,
    pruning_curves,
    train_gates,
    validate_exact_sweep,
    validate_gradient_importance,
    validate_pruning_curve,
    validate_pruning_curves,
    validate_train_gates,
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
    assert not {"gate_sample", "derangement", "predictable_mask", "UnpatchedBatch", "ENGINES"} & public
    exposed = {n for n, m in interp._API.items() if m == "interp.ablation"}
    assert exposed <= public


# ---- replay=, config= and the model-free checks ------------------------------------------------


def test_replay_is_the_sweeps_only_fast_loop_choice(gpt2_tiny, probe):
    """The sweep's fast/loop choice is replay=; engine= (pattern/stream) is no keyword of the sweeps."""
    metric = incontext_loss(probe)
    for call in (
        lambda: exact_sweep(gpt2_tiny, probe, metric, engine="loop"),
        lambda: Sweeper(gpt2_tiny, probe, metric, engine="loop"),
        lambda: train_gates(gpt2_tiny, probe, metric, [0.0], engine="loop"),
        lambda: pruning_curves(gpt2_tiny, probe, metric, engine="loop"),
    ):
        with pytest.raises(TypeError, match="unexpected keyword argument 'engine'"):
            call()
    assert not hasattr(interp.ablation, "ENGINES") and not hasattr(Sweeper, "engine")
    with pytest.raises(AblationError, match=r"unknown replay 'quick': choose from \['auto', 'fast', 'loop'\]"):
        exact_sweep(gpt2_tiny, probe, metric, replay="quick")


def test_run_settings_come_as_config_only(gpt2_tiny, probe):
    metric = incontext_loss(probe)
    donors = Sweeper(gpt2_tiny, probe, metric, ablation="resample", config=RunConfig(seed=3), replay="loop")
    assert donors.ablation.donors == derangement(4, 3).tolist() != derangement(4, 0).tolist()  # the config's seed
    assert donors.config.seed == 3 and donors.minibatch == probe.batch
    for keyword in ("minibatch", "seed", "progress"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
            exact_sweep(gpt2_tiny, probe, metric, **{keyword: 1})


@pytest.mark.parametrize(
    ("check", "message", "param"),
    [
        (lambda: validate_exact_sweep(replay="quick"), "unknown replay 'quick': choose from ['auto', 'fast', 'loop']", ()),
        (lambda: validate_gradient_importance(per="word"), "per must be 'example' or 'token', got per='word'", ("per",)),
        (lambda: validate_pruning_curve(step=0), "step must be a fraction in (0, 1], got step=0", ("step",)),
        (lambda: validate_pruning_curve(order="alphabetical"), "unknown order 'alphabetical': choose from ['gradient', 'exact', 'random']", ()),
        (lambda: validate_pruning_curves(orders=[]), "give at least one pruning order (orders=)", ("orders",)),
        (lambda: validate_train_gates(lambdas=[]), "give at least one lambda (lambdas=)", ("lambdas",)),
        (lambda: validate_train_gates(lambdas=[0.1, float("nan")]), "lambda must be a finite number >= 0, got nan (in lambdas=)", ("lambdas",)),
        (lambda: validate_train_gates(lambdas=[0.1], steps=0), "steps must be >= 1, got steps=0", ("steps",)),
        (lambda: validate_train_gates(lambdas=[0.1], replay="quick"), "unknown replay 'quick': choose from ['auto', 'fast', 'loop']", ()),
        (lambda: heads_prunable(pd.DataFrame(), -0.5), "tolerance must be >= 0, got tolerance=-0.5", ("tolerance",)),
    ],
)  # fmt: skip
def test_each_analysis_checks_its_options_without_a_model(check, message, param):
    with pytest.raises(AblationError) as e:
        check()
    assert str(e.value) == message and e.value.params == param


def test_the_analyses_check_their_options_before_any_forward(monkeypatch, gpt2_tiny, probe):
    """Each analysis runs its check first: a bad option is refused before the model runs at all."""
    metric = incontext_loss(probe)
    monkeypatch.setattr(Sweeper, "__init__", lambda *a, **k: pytest.fail("the sweep was built"))
    monkeypatch.setattr(interp.ablation.gradient, "describe", lambda *a, **k: pytest.fail("the model was read"))
    for call, message in (
        (lambda: gradient_importance(gpt2_tiny, probe, metric, per="word"), "got per='word'"),
        (lambda: pruning_curve(gpt2_tiny, probe, metric, step=2.0), "got step=2.0"),
        (lambda: pruning_curves(gpt2_tiny, probe, metric, orders=["exact"], step=0), "got step=0"),
        (lambda: train_gates(gpt2_tiny, probe, metric, [0.1], steps=0), "got steps=0"),
    ):
        with pytest.raises(AblationError, match=re.escape(message)):
            call()


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


def test_replay_flag_and_no_engine_flag(loaded, tmp_path, capsys):
    assert cli(["--out", str(tmp_path / "r"), *SMALL, "--replay", "loop"]) == 0
    assert "replay loop" in capsys.readouterr().out
    assert json.loads((tmp_path / "r" / "ablate_exact.json").read_text())["meta"]["replay"] == "loop"
    with pytest.raises(SystemExit) as e:  # the deprecated spelling went with the library's engine=
        cli(["--out", str(tmp_path / "e"), *SMALL, "--engine", "loop"])
    assert e.value.code == 2 and "unrecognized arguments: --engine loop" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()
