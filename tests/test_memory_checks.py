"""Patching sizes its work before any forward and refuses in one line (as the sweep does), the free
memory it compares with honours the process's own limits, and an allocation that fails anyway is
one line from a command, not a traceback."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from interp import memory
from interp.cli.patch import cli
from interp.errors import UsageError
from interp.models import describe, load_model
from interp.patching import faithfulness_curves, patch_heads, path_patch
from interp.patching.metrics import task_metric
from interp.probes.task import task_probe
from tests.helpers import child_env

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def toy():
    return load_model("toy", device="cpu")


def test_patching_refuses_before_its_baseline_forwards_naming_a_minibatch_that_fits(toy, forwards, monkeypatch):
    task = task_probe(toy, "repeat", n_pairs=8, seed=0)
    metric, _ = task_metric(task, None)
    estimate = memory.forward_memory(toy, describe(toy), 8, task.seq_len, metric, "the baseline pass")
    assert estimate(8).per_forward == 8 * estimate(1).per_forward and estimate(8).kept == 0
    room = 3 * estimate(1).per_forward
    monkeypatch.setattr(memory, "free_bytes", lambda device: room)
    with pytest.raises(UsageError) as e:
        patch_heads(toy, task)
    assert str(e.value) == (
        f"the baseline pass needs about {memory.gib(estimate(8).total)} for a forward of 8 sequence(s), but the "
        f"cpu has {memory.gib(room)} free: pass minibatch=3 (or less) to run fewer sequences per forward"
    )
    assert forwards[0] == 0


def test_path_patching_refuses_before_any_forward_of_its_own(toy, forwards, monkeypatch):
    task = task_probe(toy, "repeat", n_pairs=8, seed=0)
    metric, _ = task_metric(task, None)
    info = describe(toy)
    baseline = memory.forward_memory(toy, info, 8, task.seq_len, metric, "the baseline pass")(8)
    monkeypatch.setattr(memory, "free_bytes", lambda device: baseline.total + 1)  # the baselines fit, the paths not
    with pytest.raises(
        UsageError,
        match=r"^path patching needs about .* for the unpatched pass and every sender's output on both prompts, kept",
    ):
        path_patch(toy, task)
    assert forwards[0] == 2  # the two baseline forwards, nothing of path patching's own
    with pytest.raises(UsageError, match=r"free: use fewer pairs \(n_pairs=\)$"):
        path_patch(toy, task)


def test_path_patching_and_faithfulness_refuse_a_raw_metric_before_any_forward(toy, forwards):
    import dataclasses

    task = task_probe(toy, "repeat", n_pairs=4, seed=0)
    gap = "reports a fraction of the clean-corrupted gap, a normalised metric: metric=raw-logit-diff is raw; use "
    with pytest.raises(UsageError, match=rf"^path patching {gap}logit-diff or prob-diff$"):
        path_patch(toy, task, metric="raw-logit-diff")
    with pytest.raises(UsageError, match=rf"^path patching {gap}"):  # the task's own metric, raw
        path_patch(toy, dataclasses.replace(task, metric="raw-logit-diff"))
    with pytest.raises(UsageError, match=rf"^a faithfulness curve {gap}"):
        faithfulness_curves(toy, task, {}, metric="raw-logit-diff")
    assert forwards[0] == 0


def test_the_free_memory_honours_an_address_space_limit():
    code = (
        "import resource; from interp import memory; "
        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, resource.RLIM_INFINITY)); "
        "print(memory.free_bytes('cpu'))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 0 < int(done.stdout) < 6 << 30  # at most the limit less what the process already maps


def test_a_batch_too_large_for_a_memory_limit_is_one_line_not_a_traceback(tmp_path):
    """Under ``ulimit -v`` (4 GiB), 20,000 pairs are refused before the work (they ended in an
    allocation traceback: the check read only the machine's free memory)."""
    out = tmp_path / "out"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))

    argv = [sys.executable, "-m", "interp.patch", "--batch", "20000", "--no-progress", "--out", str(out)]
    done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m interp.patch: error: the "), lines
    assert " free: pass --minibatch " in lines[0]
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_an_allocation_that_fails_anyway_is_one_line_and_exit_1(toy, tmp_path, capsys, monkeypatch):
    import interp.cli.patch as command

    def short_of_memory(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
            "to allocate 141120000 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr(command, "patch_heads", short_of_memory)
    assert cli(["--model", "toy", "--device", "cpu", "--out", str(tmp_path / "out")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("python -m interp.patch: error: out of memory ([enforce fail at alloc_cpu.cpp:127]")
    assert line.endswith(": run fewer sequences per forward (--minibatch), or fewer of them (--batch)")


def test_a_batch_of_random_tokens_too_large_to_draw_is_refused_before_drawing(tmp_path, capsys, monkeypatch):
    """``--batch 100000000`` ended in a ``bad_alloc`` traceback inside the draw (circuit, patch, qk):
    the probe's own tokens are sized first, in one line naming the flag."""
    from interp.cli.qk import cli as qk

    monkeypatch.setattr(memory, "free_bytes", lambda device: 10 << 20)  # 10 MiB free: one resample fits
    out = tmp_path / "out"
    argv = ["--model", "toy", "--device", "cpu", "--head", "1.2", "--batch", "100000", "--n-boot", "1"]
    with pytest.raises(SystemExit) as e:
        qk([*argv, "--no-progress", "--out", str(out)])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and line == (
        "python -m interp.qk: error: 100000 sequences of 20 random tokens need about 30.5 MiB to draw, but the "
        "cpu has 10 MiB free: pass a smaller --batch"
    )
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_bootstrap_resamples_too_many_to_hold_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """``--n-boot 1000000000`` failed only after the scoring: the resamples are sized from the
    command line, before the model loads (no/such-model is never loaded), and by the bootstrap itself."""
    import torch

    from interp.cli.qk import cli as qk
    from interp.scores import bootstrap_ratio

    monkeypatch.setattr(memory, "free_bytes", lambda device: 1 << 20)  # 1 MiB free
    out = tmp_path / "out"
    argv = ["--model", "no/such-model", "--head", "1.2", "--n-boot", "100000", "--batch", "10", "--out", str(out)]
    with pytest.raises(SystemExit) as e:
        qk(argv)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and line == (
        "python -m interp.qk: error: 100000 bootstrap resamples of 10 units need about 22.9 MiB, but the cpu has "
        "1 MiB free: pass a smaller --n-boot (the default is 1000)"
    )
    with pytest.raises(UsageError) as e:
        bootstrap_ratio(torch.ones(10, 3), torch.ones(10, 3), n_boot=100_000)
    assert e.value.params == ("n_boot",) and str(e.value).startswith("100000 bootstrap resamples of 10 units need")
    assert bootstrap_ratio(torch.ones(10, 3), torch.ones(10, 3), n_boot=1000).n_boot == 1000  # 0.23 MiB: fits
