"""``interp roles`` end to end on the toy: every analysis writes its files, the toy's induction heads
read the previous-token head, token-id prompts get a logit attribution, bad input exits 2 with one
line and nothing written."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from interp.cli.roles import cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_toy_end_to_end(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"tokens": [0, 7, 9, 11, 7], "answer": 9, "wrong": 11}, {"tokens": [0, 5, 6, 5], "answer": 6, "wrong": 3}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "res"
    argv = ["--out", str(out), "--batch", "2", "--seq-len", "12", "--n-random", "20", "--device", "cpu"]
    code = cli([*argv, "--prompts", str(prompts), "--sequences", str(_seq(tmp_path)), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "K: 0.1->1.0" in printed  # the strongest K-composition: the previous-token head into an induction head
    assert "direct logit attribution (answer - wrong, 2 prompts; parts add up" in printed
    names = {p.name for p in out.iterdir()}
    want = {"composition.csv", "composition.json", "composition.html", "ov_scores.csv", "encoder_heads.csv",
            "head_map.json", "head_map.html", "logit_attribution_heads.csv", "logit_attribution_parts.csv", "roles.csv"}  # fmt: skip
    assert want <= names
    roles = pd.read_csv(out / "roles.csv", dtype={"label": str})
    assert len(roles) == 8 and {"copy_suppression", "successor", "sep", "entropy", "positional", "role"} <= set(roles)
    assert roles["label"].tolist()[:5] == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"]  # no reader takes it for 0.1
    parts = pd.read_csv(out / "logit_attribution_parts.csv")
    assert (parts["total"] - parts["model"]).abs().max() < 1e-4


def _seq(tmp_path):
    path = tmp_path / "seq.json"
    path.write_text(json.dumps({"ids": list(range(20, 40))}))
    return path


def test_successor_is_skipped_saying_why_without_sequences(tmp_path, capsys):
    out = tmp_path / "res"
    assert cli(["--out", str(out), "--analyses", "ov", "--device", "cpu", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert (
        "skipped successor: the successor score needs ordinal sequences of tokens, and toy has no tokenizer" in printed
    )
    assert "copy_suppression" in pd.read_csv(out / "ov_scores.csv").columns


def test_bad_prompts_file_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps([{"answer": 3}]))
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(out), "--prompts", str(bad), "--device", "cpu"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith('--prompts: prompt 0 needs "answer" and one of "prompt" (text) or "tokens" (ids)')
    assert not out.exists()


def test_unknown_analysis_is_refused():
    with pytest.raises(SystemExit) as e:
        cli(["--analyses", "nope"])
    assert e.value.code == 2


def test_prompt_ids_outside_the_vocabulary_exit_2_before_anything_is_written(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps([{"tokens": [0, 1, 2], "answer": 100000}]))
    out = tmp_path / "res"
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(out), "--prompts", str(bad), "--device", "cpu", "--no-progress"])
    assert e.value.code == 2
    assert "answers: token id 100000 is outside the model's vocabulary of 512" in capsys.readouterr().err
    written = [p.name for p in out.iterdir() if not p.name.startswith(".")] if out.exists() else []
    assert written == []  # the lock file aside


def test_text_attributes_its_last_tokens_logit(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "res"
    argv = ["--model", str(gpt2_dir), "--out", str(out), "--analyses", "dla", "--device", "cpu", "--no-progress"]
    assert cli([*argv, "--text", "w5 w6 w7 w8", "--text", "w9 w10 w11"]) == 0
    assert "direct logit attribution (answer, 2 prompts; parts add up" in capsys.readouterr().out
    parts = pd.read_csv(out / "logit_attribution_parts.csv")
    assert len(parts) == 2 and (parts["total"] - parts["model"]).abs().max() < 1e-4


def test_task_repeat_attributes_the_toys_induction_heads(tmp_path, capsys):
    out = tmp_path / "res"
    argv = ["--out", str(out), "--analyses", "dla", "--task", "repeat", "--batch", "6", "--device", "cpu"]
    assert cli([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert (
        "direct logit attribution (task repeat, read at position 20; answer - wrong, 6 prompts; parts add up" in printed
    )
    heads = pd.read_csv(out / "logit_attribution_heads.csv", dtype={"label": str})
    assert heads.loc[heads["dla"].abs().idxmax(), "layer"] == 1  # an induction head carries the most
    parts = pd.read_csv(out / "logit_attribution_parts.csv")
    assert len(parts) == 6 and (parts["total"] - parts["model"]).abs().max() < 1e-4


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--task", "nope"],
            "unknown task 'nope': choose from ['repeat', 'ioi', 'greater-than'] or give a .jsonl/.csv file",
        ),
        (["--task", "repeat", "--text", "a b"], "give one of --prompts, --text or --task, not --text and --task"),
        (["--task", "ioi"], "the ioi task is made of words: it needs a model with a tokenizer (the toy has none)"),
    ],
)
def test_bad_task_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, argv, said):
    out = tmp_path / "res"
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(out), "--device", "cpu", "--no-progress", *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(said)
    written = [p.name for p in out.iterdir() if not p.name.startswith(".")] if out.exists() else []
    assert written == []


def _refused(capsys, tmp_path, argv):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(out), "--device", "cpu", "--no-progress", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    written = [p.name for p in out.iterdir() if not p.name.startswith(".")] if out.exists() else []
    assert written == []
    return err[0]


def test_a_prompts_file_not_in_utf8_is_one_line(tmp_path, capsys):
    bad = tmp_path / "p.jsonl"
    bad.write_bytes('{"prompt": "Jos\u00e9", "answer": 3}\n'.encode("latin-1"))
    line = _refused(capsys, tmp_path, ["--model", "no/such-model", "--prompts", str(bad)])
    assert line.endswith(
        f"{bad} is not UTF-8 text: byte(s) e9 at offset 15 (line 1) cannot be decoded; save the --prompts file as UTF-8"
    )


def test_a_one_line_prompts_file_is_read_and_its_defects_named(tmp_path, capsys):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"prompt": "abcab", "answer": "c", "wrong": "d"}) + "\n")
    out = tmp_path / "res"
    assert cli(["--out", str(out), "--analyses", "dla", "--prompts", str(one), "--device", "cpu", "--no-progress"]) == 0
    assert "direct logit attribution (answer - wrong, 1 prompt; parts add up" in capsys.readouterr().out
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"prompt": "abc"}) + "\n")
    line = _refused(capsys, tmp_path, ["--model", "no/such-model", "--prompts", str(missing)])
    assert line.endswith('--prompts: prompt 0 needs "answer" and one of "prompt" (text) or "tokens" (ids)')
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "abc", "answer": "cd"}) + "\n")
    line = _refused(capsys, tmp_path, ["--prompts", str(long), "--analyses", "dla"])
    assert line.endswith("--prompts: prompt 0's answer 'cd' is 2 tokens; give a single-token answer")
