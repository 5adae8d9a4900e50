"""``python -m interp.ablate``: files written, bad input refused with nothing written, Ctrl-C keeps
the rows computed (as a ``.partial`` file)."""

import json
import os

import pandas as pd
import pytest

import interp.ablation
import interp.cli.common
from interp.ablate import cli

SMALL = ["--batch", "3", "--seq-len", "8", "--device", "cpu", "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture
def loaded(monkeypatch, gpt2_tiny):
    """Skip the model load (tens of seconds for a bridge): hand the CLI the session's tiny GPT-2."""
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: gpt2_tiny)
    return gpt2_tiny


def test_exact_end_to_end_from_a_model_directory(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "res"
    assert cli(["--model", str(gpt2_dir), "--out", str(out), *SMALL, "--ablation", "mean"]) == 0
    printed = capsys.readouterr().out
    assert "top 8 heads by exact importance" in printed and "incontext_loss" in printed
    table = pd.read_csv(out / "ablate_exact.csv", dtype={"label": str})
    assert len(table) == 8 and {"importance", "metric_ablated", "delta"} <= set(table)
    meta = json.loads((out / "ablate_exact.json").read_text())["meta"]
    assert meta["ablation"] == "mean" and meta["engine"] == "fast" and meta["probe"]["block_len"] == 8
    assert "hovertemplate" in (out / "ablate_exact.html").read_text()
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def test_gradient_and_lm_metric_on_text(loaded, tmp_path, capsys):
    out = tmp_path / "g"
    assert cli(["--out", str(out), *SMALL, "--method", "gradient", "--metric", "lm", "--normalize"]) == 0
    meta = json.loads((out / "ablate_gradient.json").read_text())["meta"]
    assert meta["metric"] == "lm_loss" and meta["probe"]["kind"] == "text" and meta["normalized"]
    assert "top 8 heads by gradient importance" in capsys.readouterr().out


def test_prune_writes_curves_and_prunable_counts(loaded, tmp_path, capsys):
    out = tmp_path / "p"
    assert (
        cli(
            [
                "--out",
                str(out),
                *SMALL,
                "--method",
                "prune",
                "--orders",
                "gradient,random",
                "--random-seeds",
                "2",
                "--step",
                "0.5",
                "--metric",
                "logit-diff",
            ]
        )
        == 0
    )
    frame = pd.read_csv(out / "ablate_prune.csv")
    assert set(frame["label"]) == {"gradient", "random (seed 0)", "random (seed 1)"}
    assert frame.groupby("label")["n_pruned"].apply(list).map(tuple).unique().tolist() == [(0, 4, 8)]
    blob = json.loads((out / "ablate_prune.json").read_text())
    assert len(blob["prunable"]) == 3 and blob["meta"]["metric"] == "logit_diff"
    assert "heads that can go before logit_diff degrades by more than 10%" in capsys.readouterr().out
    assert (out / "ablate_prune.html").exists()


def test_gates_write_summary_heads_and_figures(loaded, tmp_path, capsys):
    out = tmp_path / "gates"
    assert (
        cli(
            [
                "--out",
                str(out),
                *SMALL,
                "--method",
                "gates",
                "--lambdas",
                "0,100",
                "--gate-steps",
                "3",
                "--gate-lr",
                "1",
            ]
        )
        == 0
    )
    summary = pd.read_csv(out / "ablate_gates.csv")
    heads = pd.read_csv(out / "ablate_gates_heads.csv")
    assert summary["lambda"].tolist() == [0, 100] and len(heads) == 16
    for name in ("ablate_gates.json", "ablate_gates.html", "ablate_gates_curves.html"):
        assert (out / name).exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lambdas", "0.1,-0.5"], "lambda must be >= 0, got -0.5"),
        (["--step", "0"], "argument --step: must be in (0, 1], got 0"),
        (["--tolerance", "nan"], "argument --tolerance: must be >= 0, got nan"),
        (["--orders", "gradient,alphabetical"], "orders are a comma-separated subset"),
    ],
)
def test_bad_flags_exit_2_before_loading(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ablated", "0.9"], "head 0.9 is out of range: the model has 2 layers x 4 heads"),
        (["--ablated", ","], "the head set is empty"),
        (
            ["--ablated", "1.1", "--method", "prune"],
            "--method prune does not read --ablated (it applies to --method exact or gradient)",
        ),
    ],
)
def test_bad_input_exits_2_with_nothing_written(loaded, argv, message, tmp_path, capsys):
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(out), *SMALL, *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_causal_metric_on_an_encoder_exits_2(monkeypatch, bert_tiny, tmp_path, capsys):
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: bert_tiny)
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(tmp_path / "o"), *SMALL, "--metric", "incontext"])
    assert e.value.code == 2 and "needs a causal (decoder) model" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_ctrl_c_keeps_the_rows_computed(loaded, monkeypatch, tmp_path, capsys):
    real = interp.ablation.Sweeper._evaluate_group
    calls = []

    def interrupted_on_second(self, start, masks):
        calls.append(start)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, start, masks)

    monkeypatch.setattr(interp.ablation.Sweeper, "_evaluate_group", interrupted_on_second)
    out = tmp_path / "c"
    assert cli(["--out", str(out), *SMALL]) == 130
    captured = capsys.readouterr()
    assert "wrote the rows computed so far, marked partial:" in captured.out
    assert (
        "top 4 heads by exact importance (larger = ablating it hurts more) (partial: 4 of 8 heads missing"
        in captured.out
    )
    assert captured.err.endswith("\npython -m interp.ablate: interrupted\n")  # said once, on stderr
    table = pd.read_csv(out / "ablate_exact.partial.csv", dtype={"label": str})
    assert table["label"].tolist() == ["L0H0", "L0H1", "L0H2", "L0H3"]  # layer 0 done, layer 1 not
    meta = json.loads((out / "ablate_exact.partial.json").read_text())["meta"]
    assert meta["partial"] and meta["heads_done"] == 4 and meta["heads_total"] == 8
    assert not (out / "ablate_exact.csv").exists()


def test_gradient_on_an_encoder_is_refused_with_the_reason(monkeypatch, bert_tiny, tmp_path, capsys):
    """The encoder default metric (pooled cosine to the clean output) is at its maximum on the clean
    run: its gradient is zero there, and a ranking from it would be noise."""
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: bert_tiny)
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(tmp_path / "o"), *SMALL, "--method", "gradient"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "gradient importance cannot rank heads by metric 'pooled_cosine' at the unablated run" in err
    assert "Use the exact sweep (exact_sweep), or a metric with a gradient there" in err
    assert not (tmp_path / "o").exists()


def test_prune_on_an_encoder_leaves_the_gradient_order_out(monkeypatch, bert_tiny, tmp_path, capsys):
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: bert_tiny)
    out = tmp_path / "p"
    assert cli(["--out", str(out), *SMALL, "--method", "prune", "--step", "0.5", "--random-seeds", "1"]) == 0
    assert "orders: exact, random (pooled_cosine has no gradient at the clean point)" in capsys.readouterr().out
    assert set(pd.read_csv(out / "ablate_prune.csv")["label"]) == {"exact", "random (seed 0)"}
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(tmp_path / "q"), *SMALL, "--method", "prune", "--orders", "gradient"])
    assert e.value.code == 2 and "cannot rank heads by metric 'pooled_cosine'" in capsys.readouterr().err


def test_gradient_per_token_is_an_option(loaded, tmp_path):
    out = tmp_path / "g"
    assert cli(["--out", str(out), *SMALL, "--method", "gradient", "--per", "token"]) == 0
    assert json.loads((out / "ablate_gradient.json").read_text())["meta"]["per"] == "token"
