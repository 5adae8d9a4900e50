"""``python -m interp.report`` / ``interp report``: the atlas on the toy, bad input, exit codes."""

import json

import pytest

from interp.cli import main as interp_main
from interp.cli.report import cli
from tests.helpers import one_thread


def test_default_atlas_on_the_toy(tmp_path, capsys):
    out = tmp_path / "atlas"
    with one_thread():
        assert cli(["--out", str(out), "--no-progress", "--batch", "6"]) == 0
    printed = capsys.readouterr().out
    assert "induction heads: 1.2, 1.3, 1.0, 1.1" in printed
    assert "previous-token heads: 0.1\n" in printed and "duplicate-token heads: none" in printed
    assert "wrote:" in printed and str(out / "atlas.html") in printed
    meta = json.loads((out / "atlas.json").read_text())["meta"]
    assert meta["model_spec"] == "toy" and meta["ablation"] == "mean" and meta["skipped"] == []


def test_skip_leaves_parts_out(tmp_path, capsys):
    with one_thread():
        code = cli(["--out", str(tmp_path), "--no-progress", "--skip", "exact,gradient,pruning,sinks"])
    assert code == 0
    page = (tmp_path / "atlas.html").read_text()
    assert 'id="ablation"' not in page and 'id="sinks"' not in page and 'id="patterns"' in page
    assert "sink heads" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--skip", "exact,speed"], "unknown part(s) speed: choose from sinks, exact, gradient, pruning, patterns"),
        (["--view-heads", "1-2"], "heads are LAYER.HEAD separated by commas (e.g. 1.2,0.1), got '1-2'"),
        (["--view-heads", "9.9", "--skip", "sinks,exact,gradient,pruning"], "no head 9.9 in this model"),
        (["--threshold", "1.5"], "must be in (0, 1), got 1.5"),
        (
            ["--task-pairs", "5"],
            "would ignore --task-pairs (it applies to the task part, which runs only with --task): drop it",
        ),
        (["--task", "repeat", "--skip", "task"], "would ignore --task (it applies to the task part, skipped): drop it"),
        (
            ["--task", "nope"],
            "unknown task 'nope': choose from ['repeat', 'ioi', 'greater-than'] or give a .jsonl/.csv",
        ),
        (["--task", "no-such-file.csv"], "no-such-file.csv"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e, one_thread():
        cli([*argv, "--out", str(out), "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
    assert not (out / "atlas.html").exists()


def test_interp_report_is_registered(capsys):
    with pytest.raises(SystemExit) as e:
        interp_main(["report", "--help"])
    assert e.value.code == 0
    assert "usage: interp report" in capsys.readouterr().out


def test_help_lists_the_registered_parts_and_ablations(capsys):
    from interp.ablation import ABLATIONS
    from interp.report import PARTS

    with pytest.raises(SystemExit):
        cli(["--help"])

    def flat(s: str) -> str:  # argparse wraps lines after a hyphen too (Jensen-\nShannon)
        return " ".join(s.split()).replace("- ", "-")

    text = flat(capsys.readouterr().out)
    assert all(flat(f"{name}: {PARTS.doc(name)}") in text for name in PARTS)
    assert "{" + ",".join(n for n in ABLATIONS if n != "patch") + "}" in text


def test_task_adds_the_task_part(tmp_path, capsys):
    import pandas as pd

    out = tmp_path / "atlas"
    skip = "sinks,exact,gradient,pruning,patterns,ov,encoder,composition,headmap,cards"
    with one_thread():
        assert cli(["--out", str(out), "--no-progress", "--task", "repeat", "--task-pairs", "6", "--skip", skip]) == 0
    printed = capsys.readouterr().out
    assert "task repeat (6 pairs of 21 tokens, read at position 20; logit-diff clean" in printed
    table = printed.split("heads by exact patching effect (denoising; score [95% CI]):\n")[1].splitlines()
    assert table[0].split() == ["head", "patch_effect", "dla"] and table[1].split()[0] == "0.1"
    roles = pd.read_csv(out / "atlas_roles.csv", dtype={"label": str})
    assert {"patch_effect", "patch_effect_lo", "patch_effect_hi", "dla", "dla_lo", "dla_hi"} <= set(roles)
    meta = json.loads((out / "atlas.json").read_text())["meta"]
    assert meta["task"]["n_pairs"] == 6 and meta["task"]["name"] == "repeat"
    assert 'id="task"' in (out / "atlas.html").read_text()
