"""Faults a long run meets, injected: each must end in one clear line, the right exit code, and
nothing complete-looking on disk (issue 18).

A full disk, two runs into one --out, a stale lock, a truncated or mis-shaped weights file, a model
whose attention is NaN, and a kill -9 in the middle of an atomic write.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from interp import _io, distributed
from interp.cli import ablate, induction, report, sinks
from interp.errors import OutputError
from interp.lock import out_lock

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--device", "cpu", "--batch", "2", "--seq-len", "8", "--no-progress"]


def _run(cli, argv, capsys):
    """A command in this process: (exit code, stdout, stderr)."""
    try:
        code = cli.cli(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}


def _variant(gpt2_dir: Path, where: Path, edit) -> Path:
    shutil.copytree(gpt2_dir, where)
    edit(where / "model.safetensors")
    return where


# --------------------------------------------------------------------------------------------
# device resolution


def test_rank_device_resolves_every_spelling(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for env in ({}, {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            assert distributed.rank_device("auto") == distributed.rank_device(None) == "cpu"
            assert distributed.rank_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert distributed.rank_device("auto") == "cuda" and distributed.rank_device("cuda:1") == "cuda:1"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.rank_device("auto") == distributed.rank_device("cuda") == "cuda:1"


# --------------------------------------------------------------------------------------------
# a full disk


class _FullDisk:
    """What ``interp._io`` sees as ``os``: every file it opens takes half the data, then ENOSPC."""

    def __getattr__(self, name):
        return getattr(os, name)

    def fdopen(self, fd, *args, **kwargs):
        return _FullFile(os.fdopen(fd, *args, **kwargs))


class _FullFile:
    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        self.f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_is_one_line_and_leaves_the_earlier_files(gpt2_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    argv = ["--model", str(gpt2_dir), *SMALL, "--out", str(out)]
    assert _run(induction, argv, capsys)[0] == 0
    before = _files(out)
    assert "induction.csv" in before
    monkeypatch.setattr(_io, "os", _FullDisk())
    code, _, err = _run(induction, [*argv, "--seed", "3"], capsys)
    assert code == 2
    assert err == (
        f"python -m interp.induction: error: cannot write {out / 'induction.csv'}: no space left on device; "
        "it was not replaced (its previous content, if any, is intact): free some space or pass another output folder (--out)\n"
    )
    assert _files(out) == before  # same names (no temp file, no lock), same bytes


def test_atomic_write_on_a_full_disk_raises_output_error(tmp_path, monkeypatch):
    monkeypatch.setattr(_io, "os", _FullDisk())
    with pytest.raises(OutputError, match="no space left on device"):
        _io.atomic_write(tmp_path / "a.txt", "x" * 1000)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------
# two runs into one --out


def test_a_second_run_into_a_held_out_refuses_naming_the_holder(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "out"
    lock = out / ".interp-induction.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        out.mkdir()
        lock.write_text(f'{{"pid": {holder.pid}, "host": "{os.uname().nodename}", "started": 0}}')
        code, _, err = _run(induction, ["--model", str(gpt2_dir), *SMALL, "--out", str(out)], capsys)
        assert code == 2
        assert err == (
            f"python -m interp.induction: error: {out} is in use by another interp run (pid {holder.pid}): "
            f"wait for it to finish or pass another output folder (--out); if no such run is left, delete {lock}\n"
        )
        assert sorted(p.name for p in out.iterdir()) == [lock.name]  # the holder's lock stays, nothing else
        # another analysis may use the same folder meanwhile
        code, _, _ = _run(sinks, ["--model", str(gpt2_dir), *SMALL, "--out", str(out)], capsys)
        assert code == 0
    finally:
        holder.kill()
        holder.wait()
    # the holder died without removing its lock: the next run takes it over and finishes
    code, _, err = _run(induction, ["--model", str(gpt2_dir), *SMALL, "--out", str(out)], capsys)
    assert code == 0
    assert f"note: taking over the stale lock {lock}: pid {holder.pid} is no longer running\n" in err
    assert not lock.exists() and (out / "induction.csv").exists()


def test_the_lock_in_one_process_and_between_processes(tmp_path):
    out = tmp_path / "new" / "out"
    with out_lock(out) as path:
        assert path == out / ".interp.lock"
        with pytest.raises(OutputError, match=rf"in use by another interp run \(pid {os.getpid()}\)"):
            with out_lock(out):
                pass
        with out_lock(out, take=False) as nothing:  # ranks other than 0
            assert nothing is None
    assert not (tmp_path / "new").exists()  # folders made for the lock go again when empty
    # two processes started together: exactly one holds the folder
    code = (
        "import sys, time\nfrom interp.lock import out_lock\n"
        "try:\n    with out_lock(sys.argv[1]):\n        print('held', flush=True); time.sleep(3)\n"
        "except Exception as e:\n    print('refused', e, flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    said = sorted(p.communicate(timeout=120)[0].split()[0] for p in procs)
    assert said == ["held", "refused"]


# --------------------------------------------------------------------------------------------
# broken weights


def test_a_truncated_safetensors_file_is_named(gpt2_dir, tmp_path, capsys):
    def truncate(f: Path) -> None:
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    model = _variant(gpt2_dir, tmp_path / "model", truncate)
    size = (model / "model.safetensors").stat().st_size
    code, _, err = _run(induction, ["--model", str(model), *SMALL, "--out", str(tmp_path / "out")], capsys)
    assert code == 1
    assert err.startswith(f"python -m interp.induction: error: {model / 'model.safetensors'} is truncated or corrupt: ")
    assert f"the file has {size}. Copy or download it again" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_weights_whose_shapes_do_not_match_the_config_are_named(gpt2_dir, tmp_path, capsys):
    def reshape(f: Path) -> None:
        tensors = load_file(f)
        name = next(k for k in tensors if k.endswith("h.0.attn.c_attn.weight"))
        tensors[name] = torch.zeros(3, 5)
        save_file(tensors, f, metadata={"format": "pt"})

    model = _variant(gpt2_dir, tmp_path / "model", reshape)
    code, _, err = _run(induction, ["--model", str(model), *SMALL, "--out", str(tmp_path / "out")], capsys)
    assert code == 1
    assert err == (
        f"python -m interp.induction: error: the weights in {model / 'model.safetensors'} do not match "
        f"{model / 'config.json'}: a tensor's shape differs from the one the config asks for; save the model "
        "again with model.save_pretrained(dir), or fix the config\n"
    )
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------
# NaN attention


@pytest.mark.parametrize("cli", [induction, sinks, ablate, report], ids=lambda c: c.__name__.split(".")[-1])
def test_nan_weights_end_every_command_with_the_non_finite_error(cli, gpt2_dir, tmp_path, capsys):
    def poison(f: Path) -> None:
        tensors = load_file(f)
        name = next(k for k in tensors if k.endswith("h.0.attn.c_attn.weight"))
        tensors[name][:] = float("nan")
        save_file(tensors, f, metadata={"format": "pt"})

    model = _variant(gpt2_dir, tmp_path / "model", poison)
    code, _, err = _run(cli, ["--model", str(model), *SMALL, "--out", str(tmp_path / "out")], capsys)
    prog = "python -m interp." + cli.__name__.split(".")[-1]
    assert code == 2
    assert err.splitlines()[-1] == (
        f"{prog}: error: layer 0: the attention pattern holds NaN or inf on 4 ordinary tokens; the model's "
        "weights or its dtype make it unstable: check the weights, or load it with --dtype float32"
    )
    assert _files(tmp_path / "out") == {}


# --------------------------------------------------------------------------------------------
# kill -9 during an atomic write

_WRITER = """
import os, sys, time
from interp import _io
target = sys.argv[1]
_io.atomic_write(target, "old " * 1000)
real = os.fsync
def stall(fd):  # the new content is in the temp file, not yet moved into place
    print("writing", flush=True)
    time.sleep(120)
_io.os.fsync = stall
_io.atomic_write(target, "new " * 5_000_000)
"""


def test_kill_9_in_the_middle_of_an_atomic_write_leaves_the_previous_file(tmp_path):
    target = tmp_path / "table.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert target.read_text() == "old " * 1000  # the previous complete content, not a part of the new
    left = sorted(p.name for p in tmp_path.iterdir() if p != target)
    assert len(left) == 1 and left[0].startswith(".table.csv.") and left[0].endswith(".tmp"), left
    # the next write succeeds; the dead writer's hidden temp file is left where it was (see interp._io)
    _io.atomic_write(target, "newer")
    assert target.read_text() == "newer" and sorted(p.name for p in tmp_path.iterdir()) == sorted([*left, target.name])
