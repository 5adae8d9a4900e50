"""``interp qk`` on the toy: the top pair and its CI as printed are the saved table's and the
library's, the files it writes, refusals before the model loads (exit 2, one line, nothing
written), and a help derived from the registries of targets and groupings."""

from __future__ import annotations

import pytest

from interp.cli.qk import cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_toy_induction_head_prints_its_top_pairs_with_cis_and_writes_its_files(tmp_path, capsys):
    from interp.config import RunConfig
    from interp.models import load_model
    from interp.probes import repeated_tokens
    from interp.roles.qk import QKAttribution, qk_attribution
    from interp.scores import with_interval

    out = tmp_path / "qk"
    code = cli(
        ["--head", "1.2", "--at", "induction", "--top", "3", "--n-boot", "300", "--out", str(out)]
        + ["--no-progress", "--device", "cpu"]
    )
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert "qk attribution at induction: 10 sequences of a 20-token block repeated twice" in lines
    assert not [line for line in lines if line.startswith("! CIs from")]  # 10 sequences: no flag
    at = next(i for i, line in enumerate(lines) if line.startswith("head 1.2: contrast "))
    assert lines[at].endswith("top pairs, 95% CI over sequences:") and " over 200 targets " in lines[at]
    printed = [line.split(maxsplit=2) for line in lines[at + 2 : at + 5]]
    assert {p.name for p in out.iterdir()} == {"qk_attribution.csv", "qk_attribution.json", "qk_attribution_1.2.html"}
    saved = QKAttribution.load(out)
    # the library on the same probe: the same pairs and numbers the command printed and saved
    probe = repeated_tokens(load_model("toy"), batch=10, block_len=20, n_repeats=2, seed=0)
    own = qk_attribution(load_model("toy"), probe, heads="1.2", at="induction", config=RunConfig(n_boot=300))
    for result in (saved, own):
        top = result.top(3)
        want = [
            [q, k, with_interval(v, a, b, ".3g")]
            for q, k, v, a, b in top[["query", "key", "contrast", "contrast_lo", "contrast_hi"]].itertuples(index=False)
        ]
        assert printed == want
    assert printed[0][:2] == ["0.3", "0.1"] and printed[1][:2] == ["embed", "0.1"]  # see the README's QK section
    lo, hi = (float(x) for x in printed[0][2].split("[")[1].rstrip("]").split(","))
    assert lo < float(printed[0][2].split()[0]) < hi
    page = (out / "qk_attribution_1.2.html").read_text()
    assert "plotly" in page and "why 1.2 attends" in page


def _refused(capsys, tmp_path, argv):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(out), "--no-progress", "--model", "no/such-model", *argv])  # loading it would fail otherwise
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]
    return err[0]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--head", "1.x"], "--heads names each head as layer.head (1.2) or (layer, head), got '1.x'"),
        (["--head", "1.2", "--group", "kind", "--keep", "9"], "--keep names each head as layer.head (1.2) or (layer, head), got '9'"),
        (["--head", "1.2", "--text", "a b"], "--text needs the key position to decompose: pass --key"),
        (["--head", "1.2", "--text", "a b", "--key", "0", "--at", "sink"], "--text is read at --query and --key: drop --at and --task"),
        (["--head", "1.2", "--at", "task"], "--at task needs --task (a bundled task or a task file)"),
        (["--head", "1.2", "--task", "repeat", "--at", "sink"], "--task is read at its read position: drop --at sink"),
        (["--head", "1.2", "--query", "3"], "python -m interp.qk would ignore --query (it applies to --text): drop it"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line_before_the_model_loads(tmp_path, capsys, argv, said):
    assert _refused(capsys, tmp_path, argv) == f"python -m interp.qk: error: {said}"


def test_help_lists_every_target_and_grouping_from_their_registries(capsys):
    from interp.roles.qk import GROUPS, TARGETS

    with pytest.raises(SystemExit) as e:
        cli(["--help"])
    assert e.value.code == 0

    def flat(s: str) -> str:  # argparse wraps lines after a hyphen too
        return " ".join(s.split()).replace("- ", "-")

    text = flat(capsys.readouterr().out)
    assert f"--at {{{','.join(TARGETS)}}}" in text and f"--group {{{','.join(GROUPS)}}}" in text
    assert all(flat(f"{name}: {TARGETS.doc(name)}") in text for name in TARGETS)
    assert all(flat(f"{name}: {GROUPS.doc(name)}") in text for name in GROUPS)


def test_a_task_file_gives_every_pair_and_errors_name_the_flags(tmp_path, capsys):
    """``--at task`` takes a task file whole (as patch and circuit do), not 20 pairs of it; a
    refusal from the library names this command's flags, not the library's parameters."""
    f = tmp_path / "two.csv"
    f.write_text("clean,corrupted,answer,wrong\nab a,cb a,b,c\nab d,cb d,b,c\n")
    base = ["--head", "1.2", "--n-boot", "50", "--no-progress", "--device", "cpu"]
    assert cli([*base, "--at", "task", "--task", str(f), "--out", str(tmp_path / "a")]) == 0
    assert "qk attribution at task: the two task (2 pairs), read at position 4" in capsys.readouterr().out.splitlines()
    with pytest.raises(SystemExit):
        cli([*base, "--seq-len", "300", "--out", str(tmp_path / "b")])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "python -m interp.qk: error: probe of 601 tokens (BOS + 2 x 300) is longer than the model's context of 256 "
        "tokens: the longest block for 2 repeats is 127; pass --seq-len 127 or less"
    )


def test_cis_over_one_text_are_flagged(tmp_path, capsys):
    """One text is one sequence: its CIs have zero width, flagged as every command flags CIs over
    fewer than 5 sequences (printed and in the JSON)."""
    import json

    out = tmp_path / "qk"
    argv = ["--head", "1.2", "--text", "abcabcabc", "--key", "2", "--top", "2", "--no-progress", "--device", "cpu"]
    assert cli([*argv, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    note = "! CIs from 1 sequence: fewer than 5, so an interval says little about the spread; use a larger batch"
    at = lines.index(note)
    assert lines[at - 1].endswith("]!") and lines[at - 2].endswith("]!")  # the two pairs shown, each flagged
    assert json.loads((out / "qk_attribution.json").read_text())["ci_warning"] == note
