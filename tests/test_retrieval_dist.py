"""``interp retrieval`` and the retrieval scores under torchrun (2 gloo CPU ranks) give the numbers
of one process, bootstrap intervals over needles included.

The bundled toy is used, not the planted model: its heads hit some needles and miss others, so the
needle bootstrap's intervals depend on which needle is which. The library case scores a probe whose
needles are listed out of row order, so per-needle counts gathered block by block must be put back
in the probe's needle order for the intervals to match. This file is also the worker that torchrun
launches (``python -m torch.distributed.run ... -m tests.test_retrieval_dist OUT``).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from interp.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6
CLI_ARGS = ["--model", "toy", "--device", "cpu", "--seq-len", "200", "--batch", "3", "--needles", "3"]
CLI_ARGS += ["--distances", "16,64", "--no-progress", "--seed", "1"]


def library_results() -> dict[str, Any]:
    """The scores (pattern and stream engines), copy distance and needle-copy losses on the toy."""
    from interp.ablation import WindowAblation, ablated
    from interp.models import load_model
    from interp.probes.needle import copy_distance_probe, needle_probe
    from interp.retrieval import copy_distance_scores, needle_copy_loss, retrieval_scores

    model = load_model("toy", device="cpu")
    probe = needle_probe(model, seq_len=200, depths=(0.1, 0.4, 0.6, 0.9), needle_len=6, batch=3, seed=2)
    perm = torch.randperm(probe.n_needles, generator=torch.Generator().manual_seed(0))
    shuffled = replace(
        probe, needle_row=probe.needle_row[perm], needle_pos=probe.needle_pos[perm], copy_pos=probe.copy_pos[perm]
    )
    out: dict[str, Any] = {}
    for engine in ("pattern", "stream"):
        out[f"scores_{engine}"] = retrieval_scores(
            model, shuffled, window=32, config=RunConfig(engine=engine, n_boot=300)
        ).table
    dist = copy_distance_probe(model, [16, 64], span=6, batch=3, seed=2)
    out["distance"] = copy_distance_scores(model, dist, config=RunConfig(engine="pattern"))
    out["loss"] = needle_copy_loss(model, shuffled)
    with ablated(model, ["1.0", "1.1"], ablation=WindowAblation(sink=4, window=16)):
        out["loss_restricted"] = needle_copy_loss(model, shuffled)
    return out


def cli_run(out: Path) -> dict[str, Any]:
    from interp.cli.retrieval import cli

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = cli([*CLI_ARGS, "--out", str(out)])
    return {"code": code, "stdout": text.getvalue()}


def _worker(out: str) -> None:
    import torch.distributed as dist

    from interp import distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {"world": distributed.world_size(), "lib": library_results(), "cli": cli_run(Path(out) / "cli")}
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


# ---- the tests ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = tmp_path_factory.mktemp("retrieval-dist")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(_free_port()), "-m", "tests.test_retrieval_dist", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"ranks": [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)], "out": out}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    from tests.helpers import one_thread

    out = tmp_path_factory.mktemp("retrieval-single")
    with one_thread():
        return {"lib": library_results(), "cli": cli_run(out / "cli"), "out": out}


def _assert_same(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0, what
    num = a.select_dtypes("number").columns
    pd.testing.assert_frame_equal(a.drop(columns=num), b.drop(columns=num), obj=what)
    diff = (a[num].to_numpy(float) - b[num].to_numpy(float)).__abs__().max()
    assert diff <= TOL, (what, diff)


def test_scores_and_intervals_on_two_ranks_equal_one_process(launched, single):
    want = single["lib"]
    scores = want["scores_pattern"]
    assert (scores["retrieval_hi"] > scores["retrieval_lo"]).any()  # intervals that depend on the needles
    for r, rank in enumerate(launched["ranks"]):
        assert rank["world"] == 2
        for name in ("scores_pattern", "scores_stream", "distance"):
            _assert_same(rank["lib"][name], want[name], f"{name} on rank {r}")
        for name in ("loss", "loss_restricted"):
            assert abs(rank["lib"][name] - want[name]) <= TOL, (name, r)
    assert want["loss_restricted"] > want["loss"] + 0.1  # the restricted heads matter: the check can fail


def test_command_on_two_ranks_prints_and_writes_once_what_one_process_does(launched, single):
    codes = [r["cli"]["code"] for r in launched["ranks"]]
    assert codes == [0, 0] and single["cli"]["code"] == 0
    assert launched["ranks"][1]["cli"]["stdout"] == ""  # rank 0 speaks for all

    def numbers(stdout: str) -> str:  # the report without its timing and file paths
        lines = stdout.split("\nwrote:")[0].splitlines()
        return "\n".join(line.split("; scored in")[0] for line in lines if not line.startswith("threads:"))

    assert numbers(launched["ranks"][0]["cli"]["stdout"]) == numbers(single["cli"]["stdout"])
    assert "ablation check: needle-copy loss" in single["cli"]["stdout"]
    for name in ("retrieval.csv", "retrieval_distance.csv"):
        got = pd.read_csv(launched["out"] / "cli" / name, dtype={"label": str})
        want = pd.read_csv(single["out"] / "cli" / name, dtype={"label": str})
        _assert_same(got, want, name)


if __name__ == "__main__":
    _worker(sys.argv[1])
