"""Every text file a user gives is read in ``--encoding`` (utf-8 unless given): a file that is not
valid in it is one line naming the byte and the flag, never a decoder's traceback."""

from __future__ import annotations

import json

import pytest

from interp.cli.ablate import cli as ablate_cli
from interp.cli.sinks import cli as sinks_cli
from interp.errors import DatasetLoadError, UsageError
from interp.models import load_model
from interp.probes import text_probe
from interp.texts import check_encoding, decode_file
from tests.helpers import one_thread

# every character of it has a one-byte latin-1 form that is no valid UTF-8 byte on its own
WORDS = "Café crème, naïve résumé; déjà vu à l'hôtel. " * 40


def _message(path, encoding="utf-8", offset=3, line=1, byte="e9", spelled="encoding="):
    """The library's message; ``spelled="--encoding"``: as a command shows it."""
    return (
        f"{path} is not {encoding} text: byte(s) {byte} at offset {offset} (line {line}) cannot be decoded; pass the "
        f"file's encoding with {spelled}, e.g. latin-1 or cp1252, or save the file as UTF-8"
    )


@pytest.fixture(scope="module")
def toy():
    return load_model("toy", device="cpu")


def test_decode_file_names_the_byte_and_its_line(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"first line\nsecond caf\xe9\n")
    with pytest.raises(DatasetLoadError) as e:
        decode_file(path)
    assert str(e.value) == _message(path, offset=21, line=2)
    assert decode_file(path, "latin-1") == "first line\nsecond café\n"
    with pytest.raises(UsageError, match="unknown text encoding 'klingon'"):
        decode_file(path, "klingon")
    assert check_encoding("latin1") == "iso8859-1"


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".csv"])
def test_a_latin1_data_set_file_is_one_line_and_reads_with_its_encoding(toy, tmp_path, suffix):
    latin, utf8 = tmp_path / f"latin{suffix}", tmp_path / f"utf8{suffix}"
    body = {
        ".txt": WORDS,
        ".jsonl": "\n".join(json.dumps({"text": WORDS}, ensure_ascii=False) for _ in range(3)),
        ".csv": "text\n" + "\n".join(f'"{WORDS}"' for _ in range(3)),
    }[suffix]
    latin.write_bytes(body.encode("latin-1"))
    utf8.write_bytes(body.encode("utf-8"))
    with pytest.raises(DatasetLoadError) as e:
        text_probe(toy, batch=2, seq_len=16, dataset=latin)
    raw = body.encode("latin-1")
    offset = raw.index(b"\xe9")
    assert str(e.value) == _message(latin, offset=offset, line=raw.count(b"\n", 0, offset) + 1)
    read = text_probe(toy, batch=2, seq_len=16, dataset=latin, encoding="latin-1")
    reference = text_probe(toy, batch=2, seq_len=16, dataset=utf8)  # the same text, saved as UTF-8
    assert read.tokens.tolist() == reference.tokens.tolist()


def test_the_commands_that_read_a_data_set_take_encoding(tmp_path, capsys):
    latin = tmp_path / "latin.txt"
    latin.write_bytes(WORDS.encode("latin-1"))
    small = ["--batch", "2", "--seq-len", "16", "--no-progress"]
    with pytest.raises(SystemExit) as e, one_thread():
        sinks_cli(["--dataset", str(latin), *small, "--out", str(tmp_path / "s")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"python -m interp.sinks: error: {_message(latin, spelled='--encoding')}" and "Traceback" not in err
    with one_thread():
        assert sinks_cli(["--dataset", str(latin), "--encoding", "latin-1", *small, "--out", str(tmp_path / "s")]) == 0
    argv = ["--probe", "text", "--dataset", str(latin), "--method", "gradient", *small]
    with pytest.raises(SystemExit) as e, one_thread():
        ablate_cli([*argv, "--out", str(tmp_path / "a")])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"python -m interp.ablate: error: {_message(latin, spelled='--encoding')}"
    with one_thread():
        assert ablate_cli([*argv, "--encoding", "cp1252", "--out", str(tmp_path / "a")]) == 0
