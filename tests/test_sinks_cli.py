"""`python -m interp.sinks`: summary, files, and the bad-input rules of the head-scoring CLI."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from interp.cli.sinks import cli


def _run(argv, capsys):
    code = cli(argv)
    return code, capsys.readouterr()


def test_causal_random_probe_end_to_end(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "res"
    code, io = _run(
        [
            "--model",
            str(gpt2_dir),
            "--out",
            str(out),
            "--batch",
            "3",
            "--seq-len",
            "16",
            "--device",
            "cpu",
            "--no-progress",
            "--top",
            "3",
        ],
        capsys,
    )
    assert code == 0
    printed = io.out
    for section in (
        "probe: 3 x (BOS+16) tokens of random tokens",
        "Sink_0^eps (eps = 0.3)",
        "top 3 sink heads by first-token (BOS) mass",
        "sink token",  # "top n sink tokens (attention x uniform ...": tokens seen < 3 times are left out
        "no massive activations",
        "outlier ratio",
        "wrote:",
    ):
        assert section in printed, section
    heads = pd.read_csv(out / "sinks.csv", dtype={"label": str})
    assert len(heads) == 8 and {
        "first_mass",
        "first_mass_lo",
        "confidence",
        "confidence_no_first",
        "value_norm_ratio",
        "first_mass_by_norm",
    } <= set(heads)
    layers = pd.read_csv(out / "sinks_layers.csv")
    assert layers["layer"].tolist() == [0, 1] and "sink_share" in layers
    summary = json.loads((out / "sinks_summary.json").read_text())
    assert summary["meta"]["first_token"] == "BOS" and summary["meta"]["probe"]["kind"] == "random_tokens"
    for stem in ("sinks_heatmap", "sinks_layers", "sinks_residual"):
        assert '<script src="plotly.min.js"' not in (out / f"{stem}.html").read_text()  # plotly.js inlined
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def test_encoder_text_probe_says_cls_and_sep(bert_dir, tmp_path, capsys):
    out = tmp_path / "enc"
    code, io = _run(
        [
            "--model",
            str(bert_dir),
            "--out",
            str(out),
            "--probe",
            "text",
            "--batch",
            "2",
            "--seq-len",
            "12",
            "--epsilon",
            "0.2",
            "--device",
            "cpu",
            "--no-progress",
        ],
        capsys,
    )
    assert code == 0
    assert "probe: 2 x ([CLS]+12+[SEP]) tokens of text from data/text/sentences.txt" in io.out
    assert "first token = [CLS]; [SEP] at position 13" in io.out and "on [SEP]" in io.out
    heads = pd.read_csv(out / "sinks.csv")
    assert {"sep_mass", "sep_value_norm_ratio"} <= set(heads)
    assert "[SEP]" in (out / "sinks_layers.html").read_text()
    assert json.loads((out / "sinks.json").read_text())["meta"]["epsilon"] == 0.2


def _fails_with(argv, capsys, code, message):
    with pytest.raises(SystemExit) as e:
        cli(argv)
    assert e.value.code == code
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--epsilon", "1.5", "argument --epsilon: must be in (0, 1), got 1.5"),
        ("--epsilon", "x", "argument --epsilon: expected a number, got 'x'"),
        ("--abs-threshold", "-1", "argument --abs-threshold: must be > 0, got -1"),
        ("--rel-threshold", "inf", "argument --rel-threshold: must be > 0, got inf"),
        ("--probe", "images", "argument --probe: invalid choice: 'images'"),
        ("--seq-len", "0", "argument --seq-len: must be >= 1, got 0"),
        ("--batch", "0", "argument --batch: must be >= 1, got 0"),
    ],
)
def test_bad_usage_exits_2_and_writes_nothing(flag, value, message, tmp_path, capsys):
    _fails_with([flag, value, "--out", str(tmp_path / "o")], capsys, 2, message)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--seq-len", "300"], "is longer than the model's context of 256 tokens: the longest body is 255"),
        (["--probe", "random", "--dataset", "x.txt"], "--dataset needs --probe text"),
        (["--dataset", "wikitext:wikitext-2-raw-v1"], "could not load the data set 'wikitext'"),
    ],
)
def test_bad_input_after_loading_exits_2_and_writes_nothing(gpt2_dir, tmp_path, capsys, extra, message):
    out = tmp_path / "never"
    _fails_with(["--model", str(gpt2_dir), "--out", str(out), "--device", "cpu", *extra], capsys, 2, message)
    assert not out.exists()


def test_unloadable_model_exits_1(tmp_path, capsys):
    assert cli(["--model", "no-such-model-xyz", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not in the local Hugging Face cache" in err
    assert not (tmp_path / "o").exists()


def test_runs_as_a_module():
    done = subprocess.run(
        [sys.executable, "-m", "interp.sinks", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert done.returncode == 0
    for flag in ("--model", "--probe", "--dataset", "--epsilon", "--batch", "--seq-len", "--seed", "--out"):
        assert flag in done.stdout


def test_no_token_seen_often_enough_is_one_line(tmp_path, capsys):
    """One short random sequence: no token occurs 3 times, so none is ranked; one line says so
    (issue 25: it printed a bare ``Empty DataFrame / Columns: [...]``)."""
    code, printed = _run(["--batch", "1", "--seq-len", "16", "--out", str(tmp_path / "o"), "--no-progress"], capsys)
    assert code == 0, printed.err
    assert "Empty DataFrame" not in printed.out and "Columns:" not in printed.out
    rare = len(pd.read_csv(tmp_path / "o" / "sinks_tokens.csv"))
    assert rare >= 5
    line = (
        f"no sink tokens ranked: none of the {rare} tokens occurs at least 3 times (a token seen fewer times is "
        "never called a sink; more or longer sequences give more repeats)\n"
    )
    assert line in printed.out
