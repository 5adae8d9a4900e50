"""2 gloo processes under torchrun on CPU give what one process gives, and write once.

One launch (tests/dist_worker.py) runs every sharded analysis and every command on both ranks;
the tests here compare each rank's results with the same code run here without a process group.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp import distributed
from tests.dist_cases import BATCH, CIRCUITS, EDGES, cli_runs, library_results, tensor_of
from tests.helpers import one_thread

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def launched(gpt2_dir, tmp_path_factory):
    """Both ranks' results and the torchrun output (one launch for the whole module)."""
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(_free_port()), "-m", "tests.dist_worker", str(gpt2_dir), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    return {"ranks": ranks, "stdout": proc.stdout, "out": out}


@pytest.fixture(scope="module")
def single(gpt2_tiny, gpt2_dir, tmp_path_factory):
    """The same analyses and commands in this process (no process group)."""
    assert not distributed.active()
    out = tmp_path_factory.mktemp("single")
    with one_thread():
        return {"lib": library_results(gpt2_tiny), "codes": cli_runs(gpt2_dir, out / "cli"), "out": out}


def _assert_same(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    assert list(a.columns) == list(b.columns), what
    assert len(a) == len(b) and len(a) > 0, what
    text = [c for c in a.columns if c not in a.select_dtypes("number").columns]
    pd.testing.assert_frame_equal(a[text].reset_index(drop=True), b[text].reset_index(drop=True), obj=what)
    x, y = tensor_of(a), tensor_of(b)
    assert torch.equal(x.isnan(), y.isnan()), what
    assert float((x - y).nan_to_num().abs().max()) <= TOL, what


def test_every_analysis_on_two_ranks_equals_one_process(launched, single):
    """Head scores (with CIs), sinks (every table, massive activations renumbered), the exact sweep
    in each ablation mode and gradient importance: each rank's result equals the one-process one."""
    assert [r["world"] for r in launched["ranks"]] == [2, 2]
    want = single["lib"]["tables"]
    massive = want["sinks_massive"]  # the merge renumbers rank 1's sequences and re-caps per layer
    assert len(massive) == 10 and massive["sequence"].max() >= BATCH // 2
    for r, rank in enumerate(launched["ranks"]):
        for name, table in want.items():
            _assert_same(rank["tables"][name], table, f"{name} on rank {r}")
        for kind in ("zero", "mean"):
            assert abs(rank[f"gradient_{kind}_metric"] - single["lib"][f"gradient_{kind}_metric"]) <= TOL


def test_each_rank_does_its_share(launched, single):
    """The work is split, not repeated: count the sequences through the last block on each rank."""
    one = single["lib"]["rows"]
    for name, total in one.items():
        per_rank = [r["rows"][name] for r in launched["ranks"]]
        if name in ("heads", "sinks"):  # contiguous blocks of the probe's sequences
            assert per_rank == [BATCH // 2, BATCH - BATCH // 2] and total == BATCH, (name, per_rank)
        elif name.startswith("gradient"):  # blocks of sequences (mean ablation: each rank fits the means)
            assert max(per_rank) < total and sum(per_rank) - total == (0 if name.endswith("zero") else BATCH)
        elif name in ("edges_exact", "circuits"):  # each intervention's replay runs every sequence through
            # the last block once; the ranks take turns, and the empty circuit (its own pass) falls to rank 0
            n = EDGES if name == "edges_exact" else CIRCUITS
            share = [(n + 1) // 2 + (name == "circuits"), n // 2]
            assert [total - r for r in per_rank] == [share[1] * BATCH, share[0] * BATCH], (name, per_rank, total)
        else:  # exact sweeps: a clean pass and a self-check on every rank; of the 8 heads' replays
            # (each runs all sequences through the last block) each rank skips the other's 4
            assert [total - r for r in per_rank] == [4 * BATCH, 4 * BATCH], (name, per_rank, total)


def test_commands_under_torchrun_write_once_and_match(launched, single):
    """Every command exits 0 on both ranks; only rank 0 writes files and prints the summary; the
    files equal the one-process command's."""
    ranks = [r["codes"] for r in launched["ranks"]]
    for name in ("induction", "sinks", "ablate", "gradient", "report", "circuit"):
        assert [c[name] for c in ranks] == [0, 0] and single["codes"][name] == 0, name
    assert ranks[0]["files_written"] == single["codes"]["files_written"] > 0
    assert ranks[1]["files_written"] == 0
    assert launched["stdout"].count("\nwrote:") == 6
    cli = launched["out"] / "cli"
    pairs = {"induction": "induction.csv", "sinks": "sinks.csv", "ablate": "ablate_exact.csv"}
    pairs.update(gradient="ablate_gradient.csv", report="atlas_roles.csv", circuit="circuit_faithfulness.csv")
    for folder, name in pairs.items():
        got = pd.read_csv(cli / folder / name, dtype={"label": str})
        want = pd.read_csv(single["out"] / "cli" / folder / name, dtype={"label": str})
        _assert_same(got, want, f"{folder}/{name}")


def test_a_failing_rank_stops_every_rank_and_nothing_is_written(launched):
    codes = [r["codes"] for r in launched["ranks"]]
    assert codes[1]["failed"] == "raised injected failure"
    assert codes[0]["failed"] == 1
    assert codes[0]["failed_stderr"].strip() == (
        "python -m interp.induction: error: rank 1 of 2 failed while scoring heads: RuntimeError: injected "
        "failure; its traceback is on that rank's stderr. Nothing was written as complete."
    )
    failed = launched["out"] / "cli" / "failed"
    assert not failed.exists() or not any(failed.iterdir())


def test_a_rank_that_cannot_load_the_model_stops_every_rank(launched):
    codes = [r["codes"] for r in launched["ranks"]]
    assert [c["unloadable"] for c in codes] == [1, 1]
    assert codes[0]["unloadable_stderr"].strip() == (
        "python -m interp.sinks: error: rank 1: injected: no weights on this node"
    )
    assert codes[1]["unloadable_stderr"] == ""  # rank 0 speaks for all
    assert not (launched["out"] / "cli" / "unloadable").exists()


def test_ctrl_c_on_one_rank_keeps_every_rank_s_finished_rows(launched, single):
    """Rank 1 is interrupted after its first group of heads: both ranks exit 130 and rank 0 writes
    the rows both had finished, marked partial, equal to the one-process rows."""
    assert [r["codes"]["interrupted"] for r in launched["ranks"]] == [130, 130]
    folder = launched["out"] / "cli" / "interrupted"
    assert not (folder / "ablate_exact.csv").exists()
    got = pd.read_csv(folder / "ablate_exact.partial.csv", dtype={"label": str})
    want = pd.read_csv(single["out"] / "cli" / "ablate" / "ablate_exact.csv", dtype={"label": str})
    assert 0 < len(got) < len(want)
    assert len(got) == len(want) - 2  # rank 1's layer-1 heads were not reached
    _assert_same(got, want[want["label"].isin(got["label"])].reset_index(drop=True), "partial rows")
