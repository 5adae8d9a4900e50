"""Every check that needs no model runs before the model loads, and flags a command would ignore are
refused, in every command (issue 25, item 5).

Each test replaces the model loader with one that fails the test: the error must arrive without it.
"""

from __future__ import annotations

import json
import os
import socket

import pytest

import interp.cli.common
from interp.cli import main
from interp.cli.common import given_flags
from interp.cli.patterns import build_parser as patterns_parser


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def _refused(argv, capsys, *, usage: bool = False) -> str:
    """The error line of a refused command line (after argparse's usage lines when ``usage``)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert usage or err.count("\n") == 1, err  # one line
    return err.strip().splitlines()[-1]


def test_an_empty_text_file_is_named(tmp_path, capsys):
    empty = tmp_path / "notes.txt"
    empty.write_text("\n\n  \n")
    err = _refused(["patterns", "--text-file", str(empty), "--out", str(tmp_path / "o")], capsys)
    assert err == (
        f"interp patterns: error: {empty} is empty: put some text in it (paragraphs separated by blank lines), "
        "or pass another --text-file"
    )
    assert not (tmp_path / "o").exists()


def test_a_ci_level_outside_0_1_is_refused_by_the_parser(tmp_path, capsys):
    err = _refused(["induction", "--ci", "2", "--out", str(tmp_path / "o")], capsys, usage=True)
    assert err.endswith("error: argument --ci: must be in (0, 1), got 2")


def test_a_held_out_lock_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    lock = out / ".interp-induction.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    err = _refused(["induction", "--out", str(out)], capsys)
    assert f"is in use by another interp run (pid {os.getpid()})" in err


def test_a_negative_sink_is_refused(tmp_path, capsys):
    err = _refused(["retrieval", "--sink", "-1", "--out", str(tmp_path / "o")], capsys)
    assert err == "interp retrieval: error: --sink must be >= 0, got -1"


def test_bad_needles_are_refused(tmp_path, capsys):
    err = _refused(["retrieval", "--needle-len", "1", "--out", str(tmp_path / "o")], capsys)
    assert err.startswith("interp retrieval: error: --needle-len must be at least 2")
    err = _refused(["retrieval", "--depths", "0.5,1.5", "--out", str(tmp_path / "o")], capsys, usage=True)
    assert err.endswith("argument --depths: depths are comma-separated numbers in [0, 1]: must be in [0, 1], got 1.5")


def test_a_dataset_with_the_random_probe_is_refused(tmp_path, capsys):
    err = _refused(["sinks", "--probe", "random", "--dataset", "x.txt", "--out", str(tmp_path / "o")], capsys)
    assert err == "interp sinks: error: --dataset needs --probe text"


def test_a_missing_or_empty_dataset_file_is_refused(tmp_path, capsys):
    err = _refused(["sinks", "--probe", "text", "--dataset", "missing.txt", "--out", str(tmp_path / "o")], capsys)
    assert err == "interp sinks: error: data set missing.txt: no such file"
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    err = _refused(["ablate", "--metric", "lm", "--dataset", str(empty), "--out", str(tmp_path / "o")], capsys)
    assert (
        err == f"interp ablate: error: {empty} is empty: put some text in it (one or more lines), or pass another file"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["patterns", "--text", "hello", "--batch", "5", "--seed", "4"],
            "interp patterns would ignore --batch (it shows the texts given, up to --max-texts); --seed (nothing in it "
            "is drawn at random): drop them",
        ),
        (  # given at its default value, and abbreviated, it is still given
            ["patterns", "--text", "hello", "--bat", "10"],
            "interp patterns would ignore --batch (it shows the texts given, up to --max-texts): drop it",
        ),
        (["sinks", "--split", "test"], "interp sinks would ignore --split (it applies to --dataset): drop it"),
        (
            ["retrieval", "--needles", "2", "--depths", "0.5"],
            "interp retrieval would ignore --depths (--needles spreads the needles instead): drop it",
        ),
        (
            ["report", "--skip", "sinks,patterns", "--sink-seq-len", "32", "--view-len", "4"],
            "interp report would ignore --sink-seq-len (it applies to the sinks part, skipped); --view-len (it "
            "applies to the patterns part, skipped): drop them",
        ),
        (
            ["report", "--skip", "exact,gradient,pruning", "--ablation", "zero"],
            "interp report would ignore --ablation (it applies to the exact, gradient and pruning parts, all "
            "skipped): drop it",
        ),
        (
            ["ablate", "--probe", "text", "--repeats", "3"],
            "interp ablate would ignore --repeats (it applies to the repeated probe): drop it",
        ),
        (
            ["ablate", "--dataset", "x.txt"],
            "interp ablate would ignore --dataset (it applies to the text probe): drop it",
        ),
    ],
)
def test_flags_a_command_would_ignore_are_refused(argv, message, tmp_path, capsys):
    err = _refused([*argv, "--out", str(tmp_path / "o")], capsys)
    assert err == f"interp {argv[0]}: error: {message}"


def test_given_flags_reads_what_was_written():
    p = patterns_parser()
    assert given_flags(p, ["--text", "a", "--batch=3", "--se", "1", "--", "--top"]) == {"text", "batch", "seed"}
    assert given_flags(p, ["--text", "--batch"]) == {"text", "batch"}  # argparse refuses this line anyway
    assert given_flags(p, []) == set()


def test_in_flags_shows_each_named_parameter_as_the_commands_flag() -> None:
    """A library message names parameters as ``name=``; the command line shows its own flags: a value
    after its flag, a bare name as the flag, an on/off flag alone, an alias's flag, and a parameter
    the parser has no flag for as written."""
    import argparse

    from interp.cli.common import in_flags
    from interp.errors import UsageError

    p = argparse.ArgumentParser()
    p.add_argument("--minibatch", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--framed", action="store_true")
    p.add_argument("--engine")
    error = UsageError(
        "pass minibatch=4 or less; lower seq_len= (or n_pairs=3, k=2); pass framed=True; fewer pairs (n_pairs=); "
        "use engine='pattern'",
        params=("minibatch", "seq_len", "n_pairs", "k", "framed", "engine"),
    )
    assert in_flags(p, error, {"n_pairs": "batch"}) == (
        "pass --minibatch 4 or less; lower --seq-len (or --batch 3, k=2); pass --framed; fewer pairs (--batch); "
        "use --engine pattern"
    )
    assert in_flags(p, UsageError("pass minibatch=4")) == "pass minibatch=4"  # names no parameter: as written
