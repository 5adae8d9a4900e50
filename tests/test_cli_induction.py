import json
import os

import pandas as pd
import pytest

from interp.induction import cli


def test_local_gpt2_end_to_end(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "res"
    assert (
        cli(
            [
                "--model",
                str(gpt2_dir),
                "--out",
                str(out),
                "--batch",
                "4",
                "--seq-len",
                "12",
                "--device",
                "cpu",
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "top 8 heads by induction score" in printed and "wrote:" in printed
    table = pd.read_csv(out / "induction.csv", dtype={"label": str})
    assert len(table) == 8 and {"induction", "induction_lo", "induction_hi", "copying"} <= set(table)
    meta = json.loads((out / "induction.json").read_text())["meta"]
    assert meta["probe"]["block_len"] == 12 and meta["probe"]["batch"] == 4
    html = (out / "induction.html").read_text()
    # self-contained: plotly.js inlined, nothing loaded from beside the file
    assert '<script src="plotly.min.js"' not in html and not (out / "plotly.min.js").exists() and len(html) > 3e6
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def _fails_with(argv, capsys, code, message):
    with pytest.raises(SystemExit) as e:
        cli(argv)
    assert e.value.code == code
    assert message in capsys.readouterr().err


def test_probe_longer_than_context_writes_nothing(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "never"
    _fails_with(
        ["--model", str(gpt2_dir), "--out", str(out), "--seq-len", "200", "--device", "cpu"],
        capsys,
        2,
        "is longer than the model's context of 256 tokens: the longest block for 2 repeats is 127",
    )
    assert not out.exists()


def test_a_refusal_names_the_block_flags(gpt2_dir, tmp_path, capsys):
    # the library's block_len= and n_repeats= as this command's --seq-len and --repeats
    with pytest.raises(SystemExit):
        cli(["--model", str(gpt2_dir), "--out", str(tmp_path / "o"), "--seq-len", "100", "--repeats", "3"])
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("the longest block for 3 repeats is 85; pass --seq-len 85 or less (or lower --repeats)")
    )


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--batch", "0", "argument --batch: must be >= 1, got 0"),
        ("--seq-len", "-3", "argument --seq-len: must be >= 1, got -3"),
        ("--device", "tpu9", "unknown device 'tpu9'"),
    ],
)
def test_bad_usage_exits_2(flag, value, message, tmp_path, capsys):
    _fails_with([flag, value, "--out", str(tmp_path / "o")], capsys, 2, message)
    assert not (tmp_path / "o").exists()


def test_unwritable_out_is_checked_before_loading(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _fails_with(
        ["--model", "no-such-model-xyz", "--out", str(blocker / "sub")],
        capsys,
        2,
        "is a file; pass another output folder (--out)",
    )


def test_unloadable_model_exits_1(tmp_path, capsys):
    assert cli(["--model", "no-such-model-xyz", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not in the local Hugging Face cache" in err
    assert not (tmp_path / "o").exists()


def test_default_run_on_the_bundled_toy(tmp_path, capsys):
    """`python -m interp.induction` with no --model: the trained toy, offline; its heads are known."""
    out = tmp_path / "toy"
    assert cli(["--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out / "induction.csv", dtype={"label": str})
    top_induction = table.sort_values("induction", ascending=False).iloc[0]
    top_prev = table.sort_values("prev_token", ascending=False).iloc[0]
    assert top_induction["layer"] == 1 and top_induction["induction"] > 0.8
    assert top_prev["layer"] == 0
    assert top_prev["label"] == f"L{top_prev['layer']}H{top_prev['head']}"  # labels no spreadsheet reads as numbers
    assert f"top prev_token head: {top_prev['layer']}.{top_prev['head']} (" in printed
    # no duplicate head on the toy: the highest is named as a head, then its score (not "1.0 at 0.012")
    assert (
        "no duplicate head: none has its CI above the uniform baseline (0.014) and a score of at least 0.3 "
        "(highest: head 1.0, 0.012)\n" in printed
    )
    # the induction head's interval excludes the uniform baseline by far
    assert top_induction["induction_lo"] > 0.5
