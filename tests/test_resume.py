"""Resumable long work (issue 18): a run stopped anywhere and resumed with ``--resume`` writes what
an uninterrupted run writes, bit for bit; and memory is checked before the work starts.

Faults: Ctrl-C and a crash (an exception) inside the library's sweeps, pruning curves, gate sweeps
and the atlas; ``kill -9`` of ``python -m interp.ablate`` in the middle of a sweep; ``kill -9`` of
one rank under ``torchrun --max-restarts 1``; too little free memory (the reader patched).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
import torch

from interp import memory
from interp.ablation import Sweeper, exact_sweep, gradient_importance, incontext_loss, pruning_curves, train_gates
from interp.ablation import gates as gates_module
from interp.cli import ablate
from interp.config import RunConfig
from interp.errors import UsageError
from interp.journal import Journal, Journals
from interp.models import load_model
from interp.probes import repeated_tokens
from interp.report import head_atlas
from interp.report.build import atlas_sizes
from tests.helpers import child_env
from tests.test_distributed import _free_port

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m interp.ablate"
SMALL = ["--model", "toy", "--device", "cpu", "--batch", "4", "--seq-len", "8", "--no-progress"]
ARGS = {"batch": 4, "seq_len": 8, "seed": 0}  # what the library tests' fingerprints hold

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def toy():
    return load_model("toy", device="cpu")


@pytest.fixture(scope="module")
def probe(toy):
    return repeated_tokens(toy, batch=4, block_len=8, n_repeats=2, seed=0)


def _journals(out: Path, model, *, resume: bool = False) -> Journals:
    return Journals(out, ARGS, model, "toy", resume=resume)


class _Stop:
    """Replace ``owner.name`` so that its ``n``-th call raises ``error`` (the calls before run as usual)."""

    def __init__(self, owner, name: str, n: int, error: BaseException):
        self.owner, self.name, self.n, self.error = owner, name, n, error
        self.calls = 0

    def __enter__(self):
        real = getattr(self.owner, self.name)

        def wrapped(*args, **kwargs):
            self.calls += 1
            if self.calls == self.n:
                raise self.error
            return real(*args, **kwargs)

        self.patch = mock.patch.object(self.owner, self.name, wrapped)
        self.patch.start()
        return self

    def __exit__(self, *exc):
        self.patch.stop()


def _count(owner, name: str) -> _Stop:
    return _Stop(owner, name, 0, RuntimeError("never"))


def _units(journal: Path) -> int:
    return len(journal.read_bytes().splitlines()) - 1


# --------------------------------------------------------------------------------------------
# the library: Ctrl-C or a crash, then resume


def test_an_exact_sweep_resumed_after_ctrl_c_equals_an_uninterrupted_one(toy, probe, tmp_path):
    metric = incontext_loss(probe)
    kw = dict(
        ablation="mean", chunk=3, config=RunConfig(minibatch=3)
    )  # 8 heads: forwards of 3, 1 | 3, 1 (two minibatches each)
    whole = exact_sweep(toy, probe, metric, **kw)
    with _Stop(Sweeper, "_evaluate_group", 3, KeyboardInterrupt()):
        partial = exact_sweep(toy, probe, metric, journal=_journals(tmp_path, toy)("exact", probe.tokens), **kw)
    assert partial.meta["partial"] and partial.meta["heads_done"] == 4
    path = tmp_path / ".journal" / "exact.jsonl"
    assert _units(path) == 4
    with pytest.raises(UsageError, match="pass --resume to continue it, or --fresh to start over"):
        _journals(tmp_path, toy)("exact", probe.tokens)  # not without --resume
    with _count(Sweeper, "_evaluate_group") as evaluated:
        journal = _journals(tmp_path, toy, resume=True)("exact", probe.tokens)
        resumed = exact_sweep(toy, probe, metric, journal=journal, **kw)
    assert evaluated.calls == 2  # only the two forwards not journaled
    assert "partial" not in resumed.meta
    pd.testing.assert_frame_equal(resumed.table, whole.table, check_exact=True)
    assert torch.equal(torch.tensor(resumed.grid("metric_ablated")), torch.tensor(whole.grid("metric_ablated")))
    journal.finish()
    assert not path.exists() and not path.parent.exists()


def test_pruning_curves_resumed_after_a_crash_equal_uninterrupted_ones(toy, probe, tmp_path):
    metric = incontext_loss(probe)
    kw = dict(orders=["exact", "random"], random_seeds=(0, 1), step=0.25, ablation="resample")
    whole = pruning_curves(toy, probe, metric, **kw).table
    with _Stop(Sweeper, "_evaluate_group", 5, RuntimeError("out of memory")), pytest.raises(RuntimeError):
        pruning_curves(toy, probe, metric, journal=_journals(tmp_path, toy)("prune", probe.tokens), **kw)
    journaled = _units(tmp_path / ".journal" / "prune.jsonl")
    assert journaled >= 4
    with _count(Sweeper, "_evaluate_group") as evaluated:
        journal = _journals(tmp_path, toy, resume=True)("prune", probe.tokens)
        resumed = pruning_curves(toy, probe, metric, journal=journal, **kw).table
    with _count(Sweeper, "_evaluate_group") as plain:
        pruning_curves(toy, probe, metric, **kw)
    assert 0 < evaluated.calls < plain.calls  # the journaled forwards were skipped
    assert not resumed.attrs["partial"]
    pd.testing.assert_frame_equal(resumed, whole, check_exact=True)


def test_a_gate_sweep_resumed_trains_only_the_lambdas_left_and_equals_an_uninterrupted_one(toy, probe, tmp_path):
    metric = incontext_loss(probe)
    kw = dict(steps=4, ablation="zero")
    lambdas = [0.001, 0.1, 1.0]
    whole = train_gates(toy, probe, metric, lambdas, **kw)
    with _Stop(gates_module, "gate_sample", 4 * 2 + 1, KeyboardInterrupt()):  # during the third lambda
        partial = train_gates(
            toy, probe, metric, lambdas, journal=_journals(tmp_path, toy)("gates", probe.tokens), **kw
        )
    assert partial.meta["partial"] and list(partial.summary["lambda"]) == lambdas[:2]
    with _count(gates_module, "gate_sample") as sampled:
        journal = _journals(tmp_path, toy, resume=True)("gates", probe.tokens)
        resumed = train_gates(toy, probe, metric, lambdas, journal=journal, **kw)
    assert sampled.calls == 4  # one lambda trained, two read back
    pd.testing.assert_frame_equal(resumed.summary, whole.summary, check_exact=True)
    pd.testing.assert_frame_equal(resumed.gates, whole.gates, check_exact=True)


def test_the_atlas_ablation_parts_resume_after_a_crash(toy, tmp_path):
    kw = dict(sizes=atlas_sizes(batch=4, seq_len=8), skip=["sinks", "gradient", "patterns"], config=RunConfig(seed=0))
    with _count(Sweeper, "_evaluate_group") as plain:
        whole = head_atlas(toy, **kw)
    journals = Journals(tmp_path, ARGS, toy, "toy")
    with _Stop(Sweeper, "_evaluate_group", 4, RuntimeError("node lost")), pytest.raises(RuntimeError):
        head_atlas(toy, journals=journals, **kw)
    journals.close()
    assert sorted(p.name for p in (tmp_path / ".journal").iterdir()) == ["atlas-exact.jsonl", "atlas-pruning.jsonl"]
    with _count(Sweeper, "_evaluate_group") as evaluated:
        resumed = head_atlas(toy, journals=Journals(tmp_path, ARGS, toy, "toy", resume=True), **kw)
    assert evaluated.calls == plain.calls - 3  # the 3 forwards journaled before the crash were not redone
    pd.testing.assert_frame_equal(resumed.exact.table, whole.exact.table, check_exact=True)
    pd.testing.assert_frame_equal(resumed.pruning, whole.pruning, check_exact=True)
    pd.testing.assert_frame_equal(resumed.roles, whole.roles, check_exact=True)


# --------------------------------------------------------------------------------------------
# the command: kill -9 in the middle of a sweep, then --resume


def _cli(argv, capsys):
    try:
        code = ablate.cli(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_kill_9_in_the_middle_of_a_sweep_then_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    whole, out = tmp_path / "whole", tmp_path / "out"
    flags = [*SMALL, "--method", "exact", "--ablation", "mean"]
    assert _cli([*flags, "--out", str(whole)], capsys)[0] == 0
    journal = out / ".journal" / "exact.jsonl"
    cmd = [sys.executable, "-m", "tests.resume_worker", "block", str(journal), *flags, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the command's header first, then the worker's word
            if line.startswith("blocked"):
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert line.endswith(" unit(s) journaled\n") and 0 < _units(journal) < 8, line
    lock = out / ".interp-ablate.lock"
    # what the kill left: the journal and the dead run's lock, nothing complete-looking
    assert sorted(p.name for p in out.iterdir()) == [".interp-ablate.lock", ".journal"]
    kept = journal.read_bytes()

    code, _, err = _cli([*flags, "--out", str(out)], capsys)  # without --resume: refused, nothing touched
    assert code == 2
    assert err.splitlines()[0] == f"note: taking over the stale lock {lock}: pid {proc.pid} is no longer running"
    assert len(err.splitlines()) == 2 and err.splitlines()[-1] == (
        f"{PROG}: error: {journal} holds {_units(journal)} finished unit(s) of an unfinished run with the same "
        "arguments, model and probe: pass --resume to continue it, or --fresh to start over"
    )
    code, _, err = _cli([*flags, "--seed", "1", "--out", str(out), "--resume"], capsys)  # another probe
    assert code == 2
    assert err.splitlines()[-1] == (
        f"{PROG}: error: {journal} belongs to another run: the arguments differ (--seed 0 then, 1 now); the "
        "probe's tokens differ. Cannot resume it: use another --out, or delete the journal (or pass --fresh) "
        "to start over"
    )
    assert journal.read_bytes() == kept and not (out / "ablate_exact.csv").exists()

    code, _, err = _cli([*flags, "--out", str(out), "--resume"], capsys)
    assert code == 0, err
    for name in ("ablate_exact.csv",):
        assert (out / name).read_bytes() == (whole / name).read_bytes()
    assert not lock.exists() and not (out / ".journal").exists()  # a finished folder holds no journal


# --------------------------------------------------------------------------------------------
# torchrun: one rank killed, the group restarted, resumed by itself


def test_kill_9_of_one_rank_under_torchrun_restarts_resumes_and_equals_one_process(tmp_path, capsys):
    single, out = tmp_path / "single", tmp_path / "out"
    flags = [*SMALL, "--method", "exact", "--ablation", "mean", "--seed", "2"]
    assert _cli([*flags, "--out", str(single)], capsys)[0] == 0
    journal = out / ".journal" / "exact.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    cmd += ["-m", "tests.resume_worker", "kill-rank-1", str(journal), *flags, "--out", str(out), "--resume"]
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(OMP_NUM_THREADS="1"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    killed = Path(f"{journal}.killed")
    assert int(killed.read_text()) == 4  # rank 1 died after round 1 (2 heads a rank) was journaled
    assert "failed (exitcode: -9) local_rank: 1" in proc.stderr  # torchrun saw the kill, and restarted
    forwards = [int(Path(f"{journal}.forwards{r}").read_text()) for r in range(2)]
    assert forwards == [1, 1]  # the restarted ranks evaluated their layer-1 heads only: resumed by themselves
    assert proc.stdout.count("\nwrote:") == 1  # the restarted group finished, once
    got = pd.read_csv(out / "ablate_exact.csv", dtype={"label": str})
    want = pd.read_csv(single / "ablate_exact.csv", dtype={"label": str})
    assert list(got["label"]) == list(want["label"])
    numbers = got.select_dtypes("number").columns
    assert float((got[numbers] - want[numbers]).abs().max().max()) <= 1e-6  # as tests/test_distributed.py
    for marker in journal.parent.iterdir():
        marker.unlink()
    journal.parent.rmdir()
    assert (
        sorted(p.name for p in out.iterdir() if not p.name.startswith("ablate_exact")) == []
    )  # pages are self-contained


# --------------------------------------------------------------------------------------------
# memory: refused before any forward


def test_too_little_free_memory_refuses_the_sweep_before_any_forward(toy, probe, forwards, monkeypatch):
    metric = incontext_loss(probe)
    sweeper = Sweeper(toy, probe, metric, chunk=2)
    whole, half = sweeper.memory_estimate(), sweeper.memory_estimate(2)
    assert whole.kept == half.kept and whole.per_forward == 2 * half.per_forward  # 4 sequences a forward, then 2
    forwards[0] = 0
    room = half.total + 1  # room for the kept clean pass and forwards of 2 sequences, not 4
    asked = []
    monkeypatch.setattr(memory, "free_bytes", lambda device: asked.append(device) or room)
    with pytest.raises(UsageError) as e:
        Sweeper(toy, probe, metric, ablation="mean", chunk=2)
    assert str(e.value) == (
        f"the exact sweep needs about {memory.gib(whole.total)} ({memory.gib(whole.kept)} for the clean pass "
        f"of every sequence, kept, {memory.gib(whole.per_forward)} per forward of 4 sequence(s)), but "
        f"the cpu has {memory.gib(room)} free: pass minibatch=2 (or less) to run fewer sequences per forward"
    )
    assert forwards[0] == 0 and asked == [torch.device("cpu")]  # not even the mean ablation's fit ran
    Sweeper(toy, probe, metric, ablation="mean", chunk=2, config=RunConfig(minibatch=2))  # what it said: fits
    assert forwards[0] > 0
    forwards[0] = 0
    monkeypatch.setattr(memory, "free_bytes", lambda device: whole.kept // 2)
    with pytest.raises(
        UsageError, match=r"free: use fewer or shorter probe sequences \(batch=, seq_len=\)$"
    ):
        Sweeper(toy, probe, metric)
    assert forwards[0] == 0


def test_too_little_free_memory_refuses_the_commands_with_one_line(tmp_path, capsys, monkeypatch, forwards):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1 << 10)
    for method, what in (("exact", "the exact sweep"), ("gradient", "the gradient pass")):
        out = tmp_path / method
        forwards[0] = 0
        code, _, err = _cli([*SMALL, "--method", method, "--out", str(out)], capsys)
        assert code == 2
        assert err.count("\n") == 1 and err.startswith(f"{PROG}: error: {what} needs about ")
        assert err.endswith(
            ", but the cpu has 1 KiB free: use fewer or shorter probe sequences (--batch, --seq-len)\n"
        )
        assert not out.exists() or not any(out.iterdir())  # nothing written (not even a journal)
        assert forwards[0] == 0  # loading the toy runs no forward; neither did the analysis


def test_the_gradient_pass_refuses_before_its_forward_naming_a_minibatch_that_fits(toy, probe, monkeypatch, forwards):
    from interp.models import describe

    metric = incontext_loss(probe)
    estimate = memory.gradient_memory(toy, describe(toy), probe, metric)
    one = estimate(1)
    assert one.kept == 0 and estimate(4).per_forward == 4 * one.per_forward
    monkeypatch.setattr(memory, "free_bytes", lambda device: 3 * one.per_forward)
    forwards[0] = 0
    with pytest.raises(UsageError) as e:
        gradient_importance(toy, probe, metric)
    assert str(e.value) == (
        f"the gradient pass needs about {memory.gib(4 * one.per_forward)} for a forward and backward of 4 "
        f"sequence(s), but the cpu has {memory.gib(3 * one.per_forward)} free: pass minibatch=3 (or less) to "
        "run fewer sequences per forward"
    )
    assert forwards[0] == 0
    gradient_importance(toy, probe, metric, config=RunConfig(minibatch=3))
    assert forwards[0] > 0


def test_journal_records_rows_as_the_sweep_computed_them(tmp_path):
    j = Journal(tmp_path, "exact", {"arguments": {}, "model": "m", "probe": "p"})
    j.open()
    values = torch.randn(5, dtype=torch.float32)
    j.extend([(("exact sweep", (), ((0, 1),)), values.tolist())])
    j.close()
    back = Journal(tmp_path, "exact", {"arguments": {}, "model": "m", "probe": "p"}).open(resume=True)
    assert torch.equal(torch.tensor(back[("exact sweep", (), ((0, 1),))], dtype=torch.float32), values)
