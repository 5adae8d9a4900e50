"""What tests/test_distributed.py computes twice: once in one process, once on each of 2 gloo ranks.

The same functions run in both places; without a process group they are the single-process run.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from interp import _io, distributed, heads
from interp.ablation import Sweeper, exact_sweep, gradient_importance, incontext_loss
from interp.circuits import edge_scores, evaluate_circuits, graph_of
from interp.cli import ablate, circuit, common, induction, report, sinks
from interp.config import RunConfig
from interp.errors import ModelLoadError
from interp.heads import head_scores
from interp.probes import random_tokens, repeated_tokens
from interp.probes.task import task_probe
from interp.sinks import sink_scores

BATCH = 5  # odd: the ranks' blocks of sequences differ in size
EDGES, CIRCUITS = 6, 4  # exact edges and circuits evaluated (each rank evaluates half of them)


@contextlib.contextmanager
def rows_through_last_block(model: Any) -> Iterator[list[int]]:
    """Count the sequences that pass through the model's last block (plain forwards and replays)."""
    seen = [0]

    def count(module: Any, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        seen[0] += hidden.shape[0]

    handle = model.blocks[-1].register_forward_pre_hook(count, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def library_results(model: Any) -> dict[str, Any]:
    """Every sharded analysis on one small probe; tables as pandas frames, plus the work each did."""
    probe = repeated_tokens(model, batch=BATCH, block_len=8, n_repeats=2, seed=0)
    metric = incontext_loss(probe)
    out: dict[str, Any] = {"tables": {}, "rows": {}}

    def run(name: str, fn: Any) -> Any:
        with rows_through_last_block(model) as seen:
            result = fn()
        out["rows"][name] = seen[0]
        return result

    out["tables"]["heads"] = run("heads", lambda: head_scores(model, probe, config=RunConfig(n_boot=200))).table
    report = run(
        "sinks",
        lambda: sink_scores(
            model,
            random_tokens(model, batch=BATCH, seq_len=16, seed=0),
            abs_threshold=0.1,
            rel_threshold=4.0,
            max_massive=5,
        ),
    )
    for name in ("layers", "positions", "tokens", "massive"):
        out["tables"][f"sinks_{name}"] = getattr(report, name)
    out["tables"]["sinks_heads"] = report.heads.table
    for kind in ("zero", "mean", "resample"):
        out["tables"][f"exact_{kind}"] = run(
            f"exact_{kind}", lambda: exact_sweep(model, probe, metric, ablation=kind, config=RunConfig(minibatch=2))
        ).table
    task = task_probe(model, "repeat", n_pairs=BATCH, seed=0)
    config = RunConfig(minibatch=2, n_boot=200)
    graph = graph_of(model)
    names = graph.table()["edge"].tolist()
    picked = names[-2 * EDGES :: 2]  # into the last layer's MLP and the logits: effects well above rounding
    out["tables"]["edges_exact"] = run(
        "edges_exact", lambda: edge_scores(model, task, method="exact", edges=picked, config=config)
    ).table
    sizes = [len(names) * k // (CIRCUITS + 1) for k in range(1, CIRCUITS + 1)]
    masks = [np.arange(len(names)) >= len(names) - n for n in sizes]  # the last n edges: into the logits first
    curve = run("circuits", lambda: evaluate_circuits(model, task, masks, config=config))
    # the metric per circuit (a random model's gap is small: its faithfulness magnifies rounding)
    out["tables"]["circuits"] = curve.table[["size", "n_edges", "metric"]]
    for kind in ("zero", "mean"):
        scores = run(
            f"gradient_{kind}",
            lambda: gradient_importance(model, probe, metric, ablation=kind, config=RunConfig(minibatch=2)),
        )
        out["tables"][f"gradient_{kind}"] = scores.table
        out[f"gradient_{kind}_metric"] = scores.meta["metric_value"]
    return out


def cli_runs(model_dir: str | os.PathLike, out: Path, *, inject: bool = False) -> dict[str, Any]:
    """Each command once (exit codes and files written by this process); with ``inject``, also a
    failure and a Ctrl-C on rank 1 only."""
    common_args = ["--model", str(model_dir), "--device", "cpu", "--batch", "4", "--no-progress", "--seed", "1"]
    codes: dict[str, Any] = {}
    replace = os.replace
    written: list[str] = []

    def spy(src: Any, dst: Any) -> None:
        written.append(str(dst))
        replace(src, dst)

    with mock.patch.object(_io.os, "replace", spy):
        codes["induction"] = induction.cli([*common_args, "--seq-len", "8", "--out", str(out / "induction")])
        codes["sinks"] = sinks.cli(
            [*common_args, "--seq-len", "16", "--abs-threshold", "0.5", "--out", str(out / "sinks")]
        )
        codes["ablate"] = ablate.cli([*common_args, "--seq-len", "8", "--out", str(out / "ablate")])
        codes["gradient"] = ablate.cli(
            [
                *common_args,
                "--seq-len",
                "8",
                "--method",
                "gradient",
                "--ablation",
                "mean",
                "--out",
                str(out / "gradient"),
            ]
        )
        codes["report"] = report.cli([*common_args, "--seq-len", "8", "--out", str(out / "report")])
        codes["circuit"] = circuit.cli([*common_args, "--task", "repeat", "--out", str(out / "circuit")])
    codes["files_written"] = len(written)
    if not inject:
        return codes
    one = distributed.rank() == 1

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected failure")

    err = io.StringIO()
    with contextlib.redirect_stderr(err), mock.patch.object(heads, "attention_scores", broken) if one else _nothing():
        try:
            codes["failed"] = induction.cli([*common_args, "--seq-len", "8", "--out", str(out / "failed")])
        except RuntimeError as e:
            codes["failed"] = f"raised {e}"
    codes["failed_stderr"] = err.getvalue()

    def unloadable(*args: Any, **kwargs: Any) -> Any:
        raise ModelLoadError("injected: no weights on this node")

    err = io.StringIO()
    with contextlib.redirect_stderr(err), mock.patch.object(common, "load_model", unloadable) if one else _nothing():
        codes["unloadable"] = sinks.cli([*common_args, "--out", str(out / "unloadable")])
    codes["unloadable_stderr"] = err.getvalue()

    real = Sweeper._evaluate_group
    calls = [0]

    def stopped_on_second(self: Any, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real(self, *args)

    with mock.patch.object(Sweeper, "_evaluate_group", stopped_on_second) if one else _nothing():
        codes["interrupted"] = ablate.cli([*common_args, "--seq-len", "8", "--out", str(out / "interrupted")])
    return codes


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def tensor_of(frame: Any) -> torch.Tensor:
    """The numeric columns of a table as one float64 tensor (NaN kept)."""
    return torch.tensor(frame.select_dtypes("number").to_numpy(dtype=float))
