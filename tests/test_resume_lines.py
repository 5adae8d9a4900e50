"""``--resume`` says what it resumed, and says so when there is nothing to resume (issue 25, item 6)."""

from __future__ import annotations

import time

import pytest

import interp.ablation
from interp.ablate import cli
from interp.journal import _line

SMALL = ["--batch", "3", "--seq-len", "8", "--device", "cpu", "--no-progress"]


def _interrupt_at(monkeypatch, owner, name, n):
    real, calls = getattr(owner, name), []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, stopping)


def _written(path) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))


def test_a_resumed_exact_sweep_says_how_many_heads_it_took_and_how_many_are_left(monkeypatch, tmp_path, capsys):
    out = tmp_path / "o"
    with monkeypatch.context() as m:
        _interrupt_at(m, interp.ablation.Sweeper, "_evaluate_group", 2)  # layer 0's 4 heads done
        assert cli(["--out", str(out), *SMALL]) == 130
    journal = out / ".journal" / "exact.jsonl"
    written = _written(journal)
    capsys.readouterr()
    assert cli(["--out", str(out), *SMALL, "--resume"]) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if line.startswith("resume")]
    assert said == [f"resumed: 4 of 8 head sets of the exact sweep from {journal} (written {written}), 4 to go"]


def test_a_resumed_gate_sweep_counts_lambdas(monkeypatch, tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["--out", str(out), *SMALL, "--method", "gates", "--lambdas", "0.01,0.1,1", "--gate-steps", "2"]
    with monkeypatch.context() as m:
        _interrupt_at(m, interp.ablation.gates, "gate_sample", 2 * 2 + 1)  # during the third lambda
        assert cli(argv) == 130
    journal = out / ".journal" / "gates.jsonl"
    written = _written(journal)
    capsys.readouterr()
    assert cli([*argv, "--resume"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resume")]
    assert said == [f"resumed: 2 of 3 lambdas of the gate sweep from {journal} (written {written}), 1 to go"]


@pytest.mark.parametrize("header_only", [False, True])
def test_resume_without_a_journal_says_it_starts_from_the_beginning(header_only, tmp_path, capsys):
    out = tmp_path / "o"
    journal = out / ".journal" / "exact.jsonl"
    if header_only:  # a run killed before its first unit finished
        journal.parent.mkdir(parents=True)
        journal.write_bytes(_line({"journal": 1, "kind": "exact", "fingerprint": {}}))
    assert cli(["--out", str(out), *SMALL, "--resume"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resume")]
    why = "holds no finished unit" if header_only else "does not exist"
    assert said == [f"resume: {journal} {why}: starting exact from the beginning"]


def test_a_resumed_patching_run_names_it_in_words(monkeypatch, tmp_path, capsys):
    from interp.patch import cli as patch_cli

    out = tmp_path / "o"
    argv = ["--model", "toy", "--device", "cpu", "--batch", "3", "--by", "position", "--out", str(out), "--no-progress"]
    with monkeypatch.context() as m:
        _interrupt_at(m, interp.ablation.Sweeper, "_evaluate_group", 2)
        assert patch_cli(argv) == 130
    capsys.readouterr()
    assert patch_cli([*argv, "--resume"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resume")]
    assert len(said) == 1 and " head sets of exact patching (z, denoise, by position) from " in said[0], said
