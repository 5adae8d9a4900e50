"""The README's torchrun and device-map commands, read from README.md itself and run as written.

Every command in a ```bash block that mentions ``torchrun``, ``--device-map`` or ``--n-devices`` is
collected (so an edit of the README is what gets tested). The ones this CPU machine can run (the
bundled toy model, at most 2 processes, one node, no spread over GPUs) run verbatim with three
changes, all outside the command's own flags: ``torchrun`` is spelled ``python -m
torch.distributed.run`` (the same entry point, this interpreter), ``--master-addr 127.0.0.1
--master-port <free port>`` is added so that test runs in parallel do not meet on port 29500, and
``--out <tmp>`` is appended (the README's default, ``out/toy``, would land in the checkout). No
size is reduced: the README's CPU command takes a few seconds. The others are skipped, each saying
why (GPUs, the Hub, several nodes).

Each run must exit 0, and every table it writes must equal the one a single process writes for the
same flags. The README's CPU command also runs without its ``--device cpu``: ``auto`` must resolve
to the CPU on every rank before the process group starts (issue 18: it used to die in
``torch.device("auto")``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.readme import ROOT, shell_commands
from tests.test_distributed import _free_port

TOL = 1e-6  # as tests/test_distributed.py; the runs seen so far agree exactly


def is_scale_out(words: tuple[str, ...] | list[str]) -> bool:
    """A torchrun or device-map command: this file runs it, ``tests/test_readme.py`` leaves it here."""
    return any(w == "torchrun" or w in ("--device-map", "--n-devices") for w in words)


def readme_commands() -> list[str]:
    """The scale-out commands of README.md, continuation lines joined, comments dropped."""
    return [c.text for c in shell_commands() if is_scale_out(c.words)]


def _flag(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def why_not_here(command: str) -> str | None:
    """None when this CPU machine can run ``command``; else the reason it cannot."""
    words = shlex.split(command)
    model = _flag(words, "--model")
    if model not in (None, "toy"):
        return f"needs the Hub model {model} (tests never touch the network)"
    if _flag(words, "--device-map") is not None or _flag(words, "--n-devices") is not None:
        return "spreads a model over CUDA devices"
    if int(_flag(words, "--nnodes") or 1) > 1:
        return "needs several nodes"
    procs = int(_flag(words, "--nproc-per-node") or 1)
    if procs > 2:
        return f"{procs} processes per node are meant for GPUs"
    if (_flag(words, "--device") or "auto").startswith("cuda"):
        return "needs CUDA"
    return None


def split(command: str) -> tuple[dict[str, str], list[str], list[str]]:
    """``(environment, launcher words, module and flags)`` of ``VAR=x torchrun ... -m mod flags``."""
    words = shlex.split(command)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    at = words.index("-m")
    return env, words[:at], words[at:]


def run(command: str, out: Path, *, single: bool = False) -> subprocess.CompletedProcess:
    """Run a README command (``single``: its module and flags in one plain process) into ``out``."""
    env_vars, launcher, module = split(command)
    if single:
        argv = [sys.executable, *module]
    else:
        assert launcher[0] == "torchrun", command
        port = ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
        argv = [sys.executable, "-m", "torch.distributed.run", *port, *launcher[1:], *module]
    env = {**os.environ, **env_vars, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([*argv, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


COMMANDS = readme_commands()
RUNNABLE = [c for c in COMMANDS if why_not_here(c) is None]


def test_the_readme_shows_a_cpu_torchrun_command():
    """The extraction found the scale-out section (and at least one command a CPU can run)."""
    assert any("torchrun" in c for c in COMMANDS) and any("--device-map" in c for c in COMMANDS), COMMANDS
    assert RUNNABLE, COMMANDS


def _without_device(command: str) -> str:
    words = shlex.split(command)
    at = words.index("--device")
    return shlex.join(words[:at] + words[at + 2 :])


def _cases() -> list:
    cases = []
    for c in COMMANDS:
        reason = why_not_here(c)
        cases.append(pytest.param(c, id=c, marks=pytest.mark.skip(reason) if reason else ()))
        if reason is None and "--device" in shlex.split(c):
            cases.append(pytest.param(_without_device(c), id=f"{c} [without --device]"))
    return cases


@pytest.mark.parametrize("command", _cases())
def test_readme_command_runs_and_equals_one_process(command, tmp_path):
    if "--device" not in shlex.split(command) and torch.cuda.device_count() == 1:
        pytest.skip("auto on a 1-GPU machine puts the second rank on cuda:1, which does not exist")
    proc = run(command, tmp_path / "ranks")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "RuntimeError" not in proc.stderr and proc.stdout.count("\nwrote:") == 1
    ref = run(command, tmp_path / "single", single=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    tables = sorted(p.name for p in (tmp_path / "single").glob("*.csv"))
    assert tables and tables == sorted(p.name for p in (tmp_path / "ranks").glob("*.csv"))
    for name in tables:
        got = pd.read_csv(tmp_path / "ranks" / name, dtype={"label": str})
        want = pd.read_csv(tmp_path / "single" / name, dtype={"label": str})
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=0, atol=TOL, obj=name)
