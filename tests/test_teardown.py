"""torchrun runs end cleanly every time: many short 2-rank runs on a loaded machine.

Each run (tests/teardown_worker.py) is one life of the ranks as a command lives it: join the
group, exchange, reach :func:`interp.distributed.stop` out of step (rank 1 late, as when rank 0 has
written every output first; rank 0 late; or neither), and exit through the interpreter's normal
shutdown. Two torchrun launches go at once, each with ``RUNS`` forked runs and one of its own,
while busy loops keep the CPUs loaded. Every run must exit 0 with no abort on any rank, rank 0
must leave the group only after every other rank has, and no thread of the group may outlive
``stop()``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCHES = 2  # torchrun launches at once
RUNS = 9  # forked runs per launch, plus the launch's own: 20 runs in all
GROUP_THREADS = ("gloo", "pt_gloo")  # gloo's I/O loop and the process group's workers, by name


@pytest.fixture
def loaded_machine():
    """A busy loop on every CPU, two at most (the launches load the machine too), while the test runs."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(min(os.cpu_count() or 1, 2))]
    yield
    for loop in loops:
        loop.kill()
        loop.wait()


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (held open together while they are picked)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _launch(out: Path, port: int) -> subprocess.Popen:
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    cmd += ["-m", "tests.teardown_worker", str(out), str(RUNS)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _problems(out: Path, code: int, output: str) -> dict[str, str]:
    """What went wrong in one launch, by run (nothing when every run ended cleanly)."""
    problems = {}
    if code != 0 or "terminate called" in output or "Fatal Python error" in output:
        problems["launch"] = f"exit {code}:\n{output[-3000:]}"
    for r in range(2):
        exits = out / f"rank{r}-exits.json"
        codes = json.loads(exits.read_text()) if exits.is_file() else None
        if codes != [0] * RUNS:
            problems[f"rank {r}'s forked runs"] = f"exit statuses {codes}"
    for run in range(RUNS + 1):
        ranks = {r: out / f"run{run}" / f"rank{r}.json" for r in range(2)}
        seen = {r: json.loads(p.read_text()) for r, p in ranks.items() if p.is_file()}
        said = [f"rank {r} wrote nothing" for r in ranks if r not in seen]
        for r, s in seen.items():
            if [t for t in s["threads_after_stop"] if t.startswith(GROUP_THREADS)]:
                said.append(f"rank {r}: threads of the group alive after stop(): {s['threads_after_stop']}")
            if s["python_threads"] != 1:
                said.append(f"rank {r}: {s['python_threads']} Python threads after stop()")
        if 0 in seen and seen[0]["others_had_left"] is not True:
            said.append("rank 0 destroyed its end of the group before rank 1 had left it")
        if said:
            problems[f"run {run}"] = "; ".join(said)
    return problems


@pytest.mark.slow
def test_many_short_torchrun_runs_on_a_loaded_machine_all_end_cleanly(tmp_path, loaded_machine):
    launches = [_launch(tmp_path / f"launch{i}", port) for i, port in enumerate(_free_ports(LAUNCHES))]
    failed = {}
    for i, proc in enumerate(launches):
        output, _ = proc.communicate(timeout=600)
        failed.update(
            {f"launch {i}, {k}": v for k, v in _problems(tmp_path / f"launch{i}", proc.returncode, output).items()}
        )
    assert not failed, f"{len(failed)} of {LAUNCHES * (RUNS + 1)} runs did not end cleanly: {failed}"
