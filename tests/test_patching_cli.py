"""``interp patch``: the files it writes, the result round trip, and bad input refused (exit 2,
one line, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import interp
from interp.cli.patch import cli
from interp.errors import ModelLoadError
from interp.models import load_model
from interp.patching import PatchScores

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def toy_or_skip():
    try:
        load_model("toy", device="cpu")
    except ModelLoadError as e:
        pytest.skip(f"no trained toy: {e}")


def _refused(capsys, argv, out):
    with pytest.raises(SystemExit) as e:
        cli(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    results = [p for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")] if out.exists() else []
    assert results == []
    return err[0]


def test_patch_by_head_writes_the_result_and_it_loads_back(toy_or_skip, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["--model", "toy", "--device", "cpu", "--task", "repeat", "--batch", "6", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "task repeat: 6 pairs of 21 tokens, read at position 20" in text
    assert "top 8 by effect (fraction of the clean-corrupted gap moved)" in text
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert names == ["patch_head.csv", "patch_head.html", "patch_head.json", "patch_head_pairs.csv"]
    scores = PatchScores.load(out / "patch_head.json")
    axis = scores.figure().layout.coloraxis
    assert axis.cmin == -axis.cmax and axis.cmax > 0  # diverging, centred on 0
    assert scores.grid("effect").shape == (2, 4) and scores.meta["direction"] == "denoise"
    assert len(scores.pairs) == 6 * 8 and set(scores.pairs["label"]) == set(scores.table["label"])
    # the pooled effect is the ratio of the pairs' sums, so it lies within the per-pair range
    per_head = scores.pairs.groupby("label")["effect"]
    row = scores.table.set_index("label")
    assert ((row["effect_lo"] <= row["effect"]) & (row["effect"] <= row["effect_hi"])).all()
    assert (per_head.min() <= row["effect"] + 1e-6).all() and (row["effect"] <= per_head.max() + 1e-6).all()
    blob = json.loads((out / "patch_head.json").read_text())
    assert blob["kind"] == "patch_head" and blob["meta"]["task"] == "repeat"


def test_the_api_and_the_command_agree(toy_or_skip, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--batch", "4", "--by", "position", "--direction", "noise"]
    assert cli([*argv, "--out", str(out)]) == 0
    saved = PatchScores.load(out / "patch_position.json", stem="patch_position")
    model = interp.load_model("toy", device="cpu")
    direct = interp.patch_heads(model, "repeat", n_pairs=4, by="position", direction="noise")
    np.testing.assert_allclose(saved.grid("effect"), direct.grid("effect"), atol=1e-6)
    assert saved.grid("effect").shape == (2, 4, 21) and saved.tokens()[0] == "0"
    coloured = [t for t in direct.figure().data if t.name != "noise"][0]
    assert (coloured.zmin, coloured.zmid, coloured.zmax) == (-1.0, 0.0, 1.0)  # the fixed scale of effects


def test_a_task_file_without_a_column_is_refused_before_the_model_loads(tmp_path, capsys):
    bad = tmp_path / "task.csv"
    bad.write_text("clean,corrupted,answer\na,b,c\n")
    out = tmp_path / "out"
    line = _refused(capsys, ["--model", "no/such-model", "--task", str(bad), "--out", str(out)], out)
    assert line.endswith(
        "task.csv: the header lacks the column wrong: a task file needs clean, corrupted, answer, wrong"
    )


def test_a_task_file_not_in_utf8_is_one_line_before_the_model_loads(tmp_path, capsys):
    bad = tmp_path / "task.csv"
    bad.write_bytes("clean,corrupted,answer,wrong\nJos\u00e9 went,Ana went,home,away\n".encode("latin-1"))
    out = tmp_path / "out"
    line = _refused(capsys, ["--model", "no/such-model", "--task", str(bad), "--out", str(out)], out)
    assert line.endswith(
        "task.csv is not UTF-8 text: byte(s) e9 at offset 32 (line 2) cannot be decoded; save the task file as UTF-8"
    )


def test_pairs_of_different_lengths_are_refused(toy_or_skip, tmp_path, capsys):
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"clean": [1, 2, 3], "corrupted": [4, 2, 3], "answer": 5, "wrong": 6}\n'
        '{"clean": [1, 2, 3], "corrupted": [4, 2, 3, 7], "answer": 5, "wrong": 6}\n'
    )
    out = tmp_path / "out"
    line = _refused(capsys, ["--model", "toy", "--device", "cpu", "--task", str(f), "--out", str(out)], out)
    assert "pair 1: the clean prompt is 3 tokens and the corrupted one 4" in line


@pytest.mark.parametrize("method", ["exact", "attribution"])  # attribution measures them on its own passes
def test_clean_equal_to_corrupted_is_refused_with_both_values(toy_or_skip, tmp_path, capsys, method):
    f = tmp_path / "t.jsonl"
    f.write_text('{"clean": [1, 2, 3], "corrupted": [1, 2, 3], "answer": 5, "wrong": 6}\n')
    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--task", str(f), "--method", method, "--out", str(out)]
    line = _refused(capsys, argv, out)
    assert "the clean and corrupted prompts give the same logit-diff (clean " in line
    assert "the normalised effect is undefined" in line


def test_a_multi_token_answer_is_refused(gpt2_dir, tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text("clean,corrupted,answer,wrong\nw1 w2,w5 w2,w3 w4,w6\n")
    out = tmp_path / "out"
    line = _refused(capsys, ["--model", str(gpt2_dir), "--device", "cpu", "--task", str(f), "--out", str(out)], out)
    assert "pair 0: the answer 'w3 w4' is 2 tokens, not one: the tokenizer splits it as ['w3', 'w4']" in line


def test_attribution_and_eap_ig_from_the_command(toy_or_skip, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--batch", "4", "--method", "attribution", "--out", str(out)]
    assert cli(argv) == 0
    assert "attribution patching: 1 forward(s) and backward(s) per minibatch" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert names == [f"patch_attribution_head{s}" for s in (".csv", ".html", ".json", "_pairs.csv")]
    argv = ["--model", "toy", "--device", "cpu", "--batch", "4", "--method", "eap-ig", "--steps", "3"]
    assert cli([*argv, "--out", str(tmp_path / "ig")]) == 0
    assert "eap-ig patching: 3 forward(s) and backward(s) per minibatch" in capsys.readouterr().out
    assert (tmp_path / "ig" / "patch_eap_ig_head.csv").is_file()


def test_a_flag_the_method_ignores_is_refused_before_the_model_loads(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--model", "no/such-model", "--method", "attribution", "--replay", "loop", "--out", str(out)]
    line = _refused(capsys, argv, out)
    assert line.endswith("--method attribution does not read --replay (it applies to --method exact): drop it")
    line = _refused(capsys, ["--model", "no/such-model", "--steps", "3", "--out", str(out)], out)
    stepped = "--method eap-ig, eap-ig-inputs or eap-ig-activations"
    assert line.endswith(f"--method exact does not read --steps (it applies to {stepped}): drop it")
    line = _refused(capsys, [*argv, "--site", "k"], out)
    assert line.endswith("does not read --replay or --site (it applies to --method exact): drop them")


def test_patching_keys_from_the_command(toy_or_skip, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["--model", "toy", "--device", "cpu", "--batch", "3", "--site", "k", "--out", str(out)]) == 0
    scores = PatchScores.load(out / "patch_k_head.json", stem="patch_k_head")
    assert scores.meta["site"] == "k" and list(scores.table["query_heads"])[:2] == ["0", "1"]


@pytest.mark.slow
def test_under_torchrun_two_ranks_write_what_one_process_writes(toy_or_skip, tmp_path, capsys):
    import subprocess
    import sys

    import pandas as pd

    from tests.helpers import child_env
    from tests.test_distributed import _free_port

    argv = ["--model", "toy", "--device", "cpu", "--batch", "4", "--by", "position", "--no-progress"]
    assert cli([*argv, "--out", str(tmp_path / "one")]) == 0
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    launch += ["--master-port", str(_free_port()), "-m", "interp.patch", *argv, "--out", str(tmp_path / "two")]
    done = subprocess.run(launch, env=child_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("\nwrote:") == 1  # rank 0 alone speaks and writes
    one = pd.read_csv(tmp_path / "one" / "patch_position.csv")
    two = pd.read_csv(tmp_path / "two" / "patch_position.csv")
    pd.testing.assert_frame_equal(one, two)


def _written(out):
    return sorted(p.name for p in out.iterdir() if not p.name.startswith(".") and p.suffix != ".png")


def test_path_patching_from_the_command_equals_the_api(toy_or_skip, tmp_path, capsys):
    from interp.patching import PathScores, path_patch
    from interp.probes.task import task_probe

    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--batch", "4", "--by", "path", "--site", "k"]
    assert cli([*argv, "--receivers", "1.0,1.1,1.2,1.3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "path patching into the receivers' k: 8 senders x 4 receivers" in text
    assert _written(out) == ["path_patching.csv", "path_patching.html", "path_patching.json"]
    saved = PathScores.load(out)
    model = interp.load_model("toy", device="cpu")
    task = task_probe(model, "repeat", n_pairs=4, seed=0)
    direct = path_patch(model, task, receivers="1.0,1.1,1.2,1.3", site="k", direction="denoise")
    np.testing.assert_allclose(saved.grid(), direct.grid(), atol=1e-6)
    grid = saved.grid()
    assert np.isnan(grid[4:]).all() and np.isfinite(grid[:4]).all()  # layer-1 senders have no later receiver
    # the previous-token head feeding the induction heads' keys carries the largest path
    best = saved.table.dropna().sort_values("effect").iloc[-1]
    assert best["sender"] == "0.1" and best["effect"] > 0.1
    assert "0.1 -> 1.2" in text.split("top ")[1].splitlines()[2]  # the first row printed
    assert cli([*argv, "--senders", "0.1", "--receivers", "1.2", "--out", str(tmp_path / "one")]) == 0
    text = capsys.readouterr().out  # one of each: singular, as the words are
    assert "path patching into the receivers' k: 1 sender x 1 receiver," in text
    assert "top 1 path by |effect|" in text


def test_a_last_layer_path_to_the_logits_is_the_heads_own_patch(toy_or_skip, tmp_path, capsys):
    from interp.patching import PathScores

    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--batch", "4"]
    assert cli([*argv, "--by", "path", "--out", str(out / "path")]) == 0
    assert cli([*argv, "--out", str(out / "head")]) == 0
    paths = PathScores.load(out / "path")
    heads = PatchScores.load(out / "head" / "patch_head.json")
    assert paths.receivers == ["logits"] and paths.grid().shape == (8, 1)
    # no head downstream of layer 1 to freeze: the path to the logits is the plain patch
    np.testing.assert_allclose(paths.grid()[4:, 0], heads.grid("effect")[1], atol=1e-5)
    assert np.abs(heads.grid("effect")[1]).max() > 0.05  # well above the tolerance
    assert not np.allclose(paths.grid()[:4, 0], heads.grid("effect")[0], atol=1e-3)  # layer 0: frozen downstream


def test_faithfulness_from_the_command_equals_the_api(toy_or_skip, tmp_path, capsys):
    from interp.patching import FaithfulnessCurves, faithfulness_curves
    from interp.probes.task import task_probe

    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--batch", "4", "--faithfulness", "exact,attribution"]
    assert cli([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    faithfulness = [f"faithfulness.{s}" for s in ("csv", "html", "json")]
    assert _written(out) == [*faithfulness, *(f"patch_head{s}" for s in (".csv", ".html", ".json", "_pairs.csv"))]
    saved = FaithfulnessCurves.load(out)
    model = interp.load_model("toy", device="cpu")
    task = task_probe(model, "repeat", n_pairs=4, seed=0)
    rankings = {m: interp.patch_heads(model, task, method=m) for m in ("exact", "attribution")}
    direct = faithfulness_curves(model, task, rankings)
    np.testing.assert_allclose(saved.table["faithfulness"], direct.table["faithfulness"], atol=1e-6)
    assert list(saved.table["ranking"].unique()) == ["exact", "attribution"] and len(saved.table) == 2 * 9
    lines = text.split("the smallest n reaching 0.8 / 0.9 of the clean metric, of 8 heads:\n")[1].splitlines()
    for line, name in zip(lines, ("exact", "attribution")):
        low, high = ("never" if n is None else str(n) for n in (direct.smallest(t)[name] for t in (0.8, 0.9)))
        assert line.split() == [name, low, "/", high]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--by", "path", "--senders", "1.0", "--receivers", "0.2"],
            "sender 1.0 is not in an earlier layer than receiver 0.2: a path runs from a head to the heads of later "
            "layers: choose --senders in earlier layers than --receivers",
        ),
        (["--senders", "0.1"], "would ignore --senders (it applies to --by path): drop it"),
        (["--by", "path", "--method", "attribution"], "would ignore --method (--by path is exact path patching)"),
        (["--by", "path", "--site", "k"], "would ignore --site (the receivers are the logits; --site names"),
        (["--by", "path", "--receivers", "1.0", "--site", "z"], "--site q, k or v, not z"),
        (
            ["--by", "position", "--faithfulness"],
            "would ignore --faithfulness (it ranks heads: it applies to --by head)",
        ),
        (["--faithfulness-to", "mean"], "would ignore --faithfulness-to (it applies to --faithfulness): drop it"),
        (
            ["--faithfulness", "--metric", "raw-logit-diff"],
            "--metric raw-logit-diff is raw; use logit-diff or prob-diff",
        ),
        (["--faithfulness", "--site", "k"], "--faithfulness ranks head outputs (site z): drop --site k"),
        (["--by", "path", "--senders", "0.x"], "--senders: cannot read head '0.x': write heads as 'layer.head'"),
    ],
)
def test_path_and_faithfulness_flags_are_checked_before_the_model_loads(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    line = _refused(capsys, ["--model", "no/such-model", *argv, "--out", str(out)], out)
    assert message in line


def test_a_gap_within_the_noise_is_said_before_the_table_in_meta_and_on_the_figure(toy_or_skip, tmp_path, capsys):
    """Half of the toy's repeat pairs swapped: the clean-corrupted gap's interval holds 0, so the
    fractions of it are not meaningful, and the run says so (it goes on: the raw change stays useful)."""
    from interp.probes.task import task_probe

    toy = load_model("toy", device="cpu")
    task = task_probe(toy, "repeat", n_pairs=20, seed=0)
    lines = []
    for i, (c, k, a, w) in enumerate(zip(task.clean, task.corrupted, task.answer, task.wrong)):
        c, k = (k, c) if i % 2 else (c, k)  # the BOS comes back from the file's framing
        lines.append(
            json.dumps(
                {"clean": c[1:].tolist(), "corrupted": k[1:].tolist(), "answer": a.tolist(), "wrong": w.tolist()}
            )
        )
    noisy = tmp_path / "noisy.jsonl"
    noisy.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert cli(["--model", "toy", "--device", "cpu", "--task", str(noisy), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    scores = PatchScores.load(out / "patch_head.json")
    warning = scores.meta["gap_warning"]
    assert scores.meta["gap_lo"] <= 0 <= scores.meta["gap_hi"]
    assert (
        warning.startswith("! the clean-corrupted gap of logit-diff, ")
        and "has a 95% interval over the 20 pairs" in warning
    )
    assert "the normalised effects (fractions of that gap) are not meaningful" in warning
    before, table = text.split("top 8 by effect", 1)
    assert before.rstrip().splitlines()[-1] == warning
    assert "not meaningful" in scores.figure().layout.title.text
    # the task as drawn: a gap well clear of 0, and no warning
    assert cli(["--model", "toy", "--device", "cpu", "--task", "repeat", "--out", str(tmp_path / "fine")]) == 0
    fine = PatchScores.load(tmp_path / "fine" / "patch_head.json")
    assert "gap_warning" not in fine.meta and fine.meta["gap_lo"] > 0.5
    assert "not meaningful" not in capsys.readouterr().out


def _pairs_file(tmp_path, n=3):
    f = tmp_path / "t.jsonl"
    rows = [
        f'{{"clean": [{i}, 7, 9, 11, 7], "corrupted": [{i}, 8, 9, 11, 7], "answer": 9, "wrong": 11}}' for i in (1, 4, 5)
    ]
    f.write_text("\n".join(rows[:n]) + "\n")
    return f


def test_batch_takes_the_first_n_pairs_of_a_task_file_and_the_header_says_so(toy_or_skip, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--task", str(_pairs_file(tmp_path)), "--out", str(out)]
    assert cli([*argv, "--batch", "2"]) == 0
    assert "task t: the first 2 of 3 pairs of 6 tokens, read at position 5" in capsys.readouterr().out
    assert len(PatchScores.load(out / "patch_head.json").pairs) == 2 * 8
    assert cli([*argv]) == 0
    assert "task t: 3 pairs of 6 tokens, read at position 5" in capsys.readouterr().out


def test_more_pairs_than_the_task_file_holds_is_refused_before_the_model_loads(tmp_path, capsys):
    f = _pairs_file(tmp_path)
    out = tmp_path / "out"
    line = _refused(capsys, ["--model", "no/such-model", "--task", str(f), "--batch", "5", "--out", str(out)], out)
    assert line.endswith(
        f"{f} holds 3 pairs, fewer than the 5 asked for (--batch): ask for at most 3, or leave --batch out to use "
        "every pair"
    )


def test_framed_takes_an_id_files_prompts_as_they_are(toy_or_skip, tmp_path, capsys):
    f = tmp_path / "t.jsonl"
    f.write_text('{"clean": [0, 7, 9, 11, 7], "corrupted": [0, 8, 9, 11, 7], "answer": 9, "wrong": 11}\n')
    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--task", str(f), "--out", str(out), "--batch", "1"]
    assert cli(argv) == 0  # the BOS the file carries is not added again: 5 tokens, not 6
    said = capsys.readouterr()
    assert "task t: 1 pair of 5 tokens" in said.out
    assert "warning: every prompt already starts with the model's BOS: it is not added again" in said.err
    assert cli([*argv, "--framed"]) == 0
    said = capsys.readouterr()
    assert "task t: 1 pair of 5 tokens" in said.out and "warning" not in said.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--by", "path", "--receivers", "0.1"],
            "--receivers 0.1: receiver 0.1 is in layer 0, and no sender is in an earlier layer: no path reaches it; "
            "choose receivers in layer 1 or later, or --receivers logits",
        ),
        (["--framed"], "would ignore --framed (it applies to a task file, --task FILE): drop it"),
    ],
)
def test_a_path_nothing_reaches_and_framed_on_a_bundled_task_are_refused_before_the_model_loads(
    tmp_path, capsys, argv, message
):
    out = tmp_path / "out"
    line = _refused(capsys, ["--model", "no/such-model", *argv, "--out", str(out)], out)
    assert line.endswith(message)


@pytest.mark.parametrize("command", ["patch", "ablate", "sinks", "retrieval"])
def test_minibatch_help_says_what_no_value_means_and_batch_counts_pairs(command, capsys):
    import importlib

    run = importlib.import_module(f"interp.cli.{command}").cli
    with pytest.raises(SystemExit):
        run(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # the help, its line breaks undone
    minibatch = text.split("--minibatch MINIBATCH ")[1].split(" --")[0]
    assert "(default: every " in minibatch and "None" not in minibatch
    if command == "patch":
        assert "--batch BATCH pairs: of a bundled task" in text and "probe sequences" not in text
        assert "--minibatch MINIBATCH pairs per forward (default: every pair in one forward)" in text


@pytest.mark.parametrize(
    ("argv", "call"),
    [
        (
            ["--method", "attribution", "--replay", "loop", "--site", "k"],
            dict(method="attribution", replay="loop", site="k"),
        ),
        (["--steps", "3"], dict(steps=3)),
        (["--by", "path", "--senders", "1.0", "--receivers", "0.2"], dict(senders="1.0", receivers="0.2")),
        (["--by", "path", "--receivers", "0.1"], dict(receivers="0.1")),
        (["--by", "path", "--metric", "raw-logit-diff"], dict(metric="raw-logit-diff")),
        (["--faithfulness", "--metric", "raw-logit-diff"], dict(metric="raw-logit-diff")),
    ],
)
def test_the_command_refuses_what_the_library_refuses_shown_in_its_flags(tmp_path, capsys, argv, call):
    """One check, in the library (no model): the command says its refusal with each parameter as its flag."""
    from interp.cli.common import in_flags
    from interp.cli.patch import build_parser
    from interp.errors import UsageError
    from interp.patching import validate_faithfulness_curves, validate_patch_heads, validate_path_patch

    validate = (
        validate_path_patch
        if "path" in argv
        else validate_faithfulness_curves
        if "--faithfulness" in argv
        else validate_patch_heads
    )
    with pytest.raises(UsageError) as e:
        validate(**call)
    assert "--" not in str(e.value) and e.value.params  # the library names parameters, never flags
    out = tmp_path / "out"
    line = _refused(capsys, ["--model", "no/such-model", *argv, "--out", str(out)], out)
    assert line == f"python -m interp.patch: error: {in_flags(build_parser(), e.value)}".strip()
