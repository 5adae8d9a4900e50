"""Models spread over devices by a Hugging Face device map (through TransformerLens 4 and accelerate).

A CPU machine has one device, so the map here puts block 1 of a tiny GPT-2 on "disk": accelerate
then keeps its weights off the module and moves them in for each call through the same hooks that
move activations between GPUs. Every analysis (the replay engine calling that block directly
included) must give what the one-device model gives.
"""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
import torch

from interp.ablation import Sweeper, exact_sweep, gradient_importance, incontext_loss
from interp.cli import sinks as sinks_cli
from interp.errors import UsageError
from interp.heads import head_scores
from interp.models import describe, load_model
from interp.probes import random_tokens, repeated_tokens
from interp.sinks import sink_scores
from tests.helpers import one_thread

MAP = {
    "transformer.wte": "cpu",
    "transformer.wpe": "cpu",
    "transformer.h.0": "cpu",
    "transformer.h.1": "disk",
    "transformer.ln_f": "cpu",
    "lm_head": "cpu",
}


@pytest.fixture(scope="module")
def spread(gpt2_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # accelerate says some parameters are on the meta device
        return load_model(gpt2_dir, device_map=MAP)


def _numbers(frame: pd.DataFrame) -> torch.Tensor:
    return torch.tensor(frame.select_dtypes("number").to_numpy(dtype=float))


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    x, y = _numbers(a), _numbers(b)
    assert x.shape == y.shape and x.numel() > 0
    assert float((x - y).nan_to_num().abs().max()) <= 1e-6


def test_the_map_is_applied(spread):
    assert spread.original_model.hf_device_map == MAP
    assert spread.cfg.n_devices == 2
    assert describe(spread).device == torch.device("cpu")  # inputs go where the embedding is
    block = spread.original_model.transformer.h[1]
    assert block.attn.c_attn.weight.device.type == "meta"  # its weights really are elsewhere


def test_every_analysis_on_a_spread_model_equals_one_device(spread, gpt2_tiny):
    with one_thread():
        probe = repeated_tokens(gpt2_tiny, batch=3, block_len=8, n_repeats=2, seed=0)
        _same(head_scores(spread, probe, copying=False).table, head_scores(gpt2_tiny, probe, copying=False).table)
        rand = random_tokens(gpt2_tiny, batch=3, seq_len=16, seed=0)
        _same(sink_scores(spread, rand).heads.table, sink_scores(gpt2_tiny, rand).heads.table)
        metric = incontext_loss(probe)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to the loop: the replay reproduces the model
            assert Sweeper(spread, probe, metric, ablation="mean").replay == "fast"
        for kind in ("zero", "mean"):
            _same(
                exact_sweep(spread, probe, metric, ablation=kind).table,
                exact_sweep(gpt2_tiny, probe, metric, ablation=kind).table,
            )
            _same(
                gradient_importance(spread, probe, metric, ablation=kind).table,
                gradient_importance(gpt2_tiny, probe, metric, ablation=kind).table,
            )


def test_copying_scores_on_offloaded_weights_say_what_to_do(spread):
    probe = repeated_tokens(spread, batch=2, block_len=8, n_repeats=2, seed=0)
    with pytest.raises(UsageError, match=r"the copying score reads W_E, W_U, W_V and W_O, and this model's are "):
        head_scores(spread, probe)


def test_cli_device_map_flag(gpt2_dir, tmp_path, capsys):
    argv = ["--model", str(gpt2_dir), "--batch", "2", "--no-progress", "--out", str(tmp_path / "o")]
    with one_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sinks_cli.cli([*argv, "--device-map", json.dumps(MAP)]) == 0
    assert (tmp_path / "o" / "sinks.csv").exists()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        sinks_cli.cli([*argv, "--device", "cpu", "--device-map", json.dumps(MAP)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "python -m interp.sinks: error: --device and --device-map/--n-devices are exclusive: "
        "a spread model has no one device"
    )
    with pytest.raises(SystemExit):
        sinks_cli.cli([*argv, "--device-map", "{not json"])
    assert "argument --device-map: not valid JSON" in capsys.readouterr().err


def test_placement_errors():
    if torch.cuda.device_count() < 64:
        with pytest.raises(UsageError, match=r"^n_devices=64 asked for, but this machine has \d+ CUDA device\(s\)"):
            load_model("toy", n_devices=64)
    with pytest.raises(UsageError, match=r"^the toy model runs on one device: pass device=\.\.\., not device_map"):
        load_model("toy", device_map={"blocks.0": "cpu"})
    with pytest.raises(UsageError, match=r"^device and device_map/n_devices are exclusive"):
        load_model("toy", device="cpu", device_map="auto")


def test_spread_replicas_under_torchrun_take_one_process_per_node(gpt2_dir, tmp_path, capsys, monkeypatch):
    """Several processes per node would all spread over the same devices: refused before any group."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as e:
        sinks_cli.cli(["--model", str(gpt2_dir), "--out", str(tmp_path), "--device-map", "auto"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "python -m interp.sinks: error: --device-map/--n-devices with several processes per node would put "
        "every rank on the same devices: run torchrun with --nproc-per-node 1 (one spread replica per node)"
    )
