"""Benchmark: the exact single-head sweep sharded over processes vs one process with threads.

GPT-2-small architecture (12 layers x 12 heads, d_model 768, vocab 50257; ``--layers`` for fewer),
random weights built in-process with one seed (every process builds the same model), one probe of
BOS + a block of random tokens repeated twice (the CLI's defaults: 10 sequences, blocks of 50),
zero ablation, in-context loss, the fast replay engine. In one run, each in a fresh process:

- ``1 proc x 1 thread``: ``exact_sweep`` in one process, ``torch.set_num_threads(1)``;
- ``1 proc x N threads``: the same with N intra-op threads;
- ``N procs x 1 thread``: ``torchrun --nproc-per-node N``, gloo: each rank replays its share of the
  heads and the rows are gathered.

Printed: wall-clock time of the sweep (from a barrier after the model is built to the gathered
result; the clean pass, the replay self-check and the gathering are inside) and the ratio to one
process on one thread, the CPU time of all processes, the load average, and the sizes; the sharded importance is checked against one process's
(max abs difference). Run it on a machine with N idle cores: the processes share nothing but the
cores, so other jobs on them move the figures.

    python analyses/bench_distributed.py              # GPT-2 small, 2 processes (minutes on 2 cores)
    python analyses/bench_distributed.py --quick      # 2 layers, 4 sequences: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import random_gpt2


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    from interp import distributed
    from interp.ablation import exact_sweep, incontext_loss
    from interp.probes import repeated_tokens

    distributed.start("cpu")
    model = random_gpt2(args.layers)
    probe = repeated_tokens(model, batch=args.batch, block_len=args.seq_len, n_repeats=2, seed=0)
    metric = incontext_loss(probe)
    distributed.check_in("building the model")  # a barrier: every rank starts the clock together
    t0, c0 = time.perf_counter(), time.process_time()
    scores = exact_sweep(model, probe, metric, ablation="zero")
    wall = time.perf_counter() - t0
    cpu = sum(distributed.run_sharded(lambda: time.process_time() - c0, "timing"))
    if distributed.is_main():
        grid = scores.grid("importance").tolist()
        blob = {"wall": wall, "cpu": cpu, "importance": grid, "engine": scores.meta["engine"]}
        Path(args.result).write_text(json.dumps(blob))
    distributed.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: argparse.Namespace, procs: int, threads: int, tmp: Path) -> dict:
    result = tmp / f"p{procs}t{threads}.json"
    own = [__file__, "--worker", "--threads", str(threads), "--result", str(result)]
    own += ["--layers", str(args.layers), "--batch", str(args.batch), "--seq-len", str(args.seq_len)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if procs == 1:
        cmd = [sys.executable, *own]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs)]
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *own]
    subprocess.run(cmd, check=True, env=env)
    return json.loads(result.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=2, help="processes (and threads of the threaded run)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--seq-len", type=int, default=50, help="tokens per repeated block")
    p.add_argument("--quick", action="store_true", help="2 layers, 4 sequences of 2 x 20 tokens")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.quick:
        args.layers, args.batch, args.seq_len = 2, 4, 20
    n = args.procs
    print(
        f"exact sweep, zero ablation, in-context loss: GPT-2-small architecture with {args.layers} layers x 12 heads "
        f"(d_model 768, vocab 50257), random weights; probe {args.batch} x (BOS + 2 x {args.seq_len}) tokens; "
        f"{os.cpu_count()} CPU cores on this machine"
    )
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        runs = {
            "1 proc x 1 thread": run(args, 1, 1, Path(tmp)),
            f"1 proc x {n} threads": run(args, 1, n, Path(tmp)),
            f"{n} procs x 1 thread": run(args, n, 1, Path(tmp)),
        }
    base = runs["1 proc x 1 thread"]
    print(f"\nload average (1 min) before / after: {load:.1f} / {os.getloadavg()[0]:.1f}")
    print(f"{'run':<22}{'wall s':>9}{'vs 1x1':>9}{'cpu s (all procs)':>19}")
    for name, r in runs.items():
        print(f"{name:<22}{r['wall']:>9.2f}{r['wall'] / base['wall']:>9.2f}{r['cpu']:>19.2f}")
    sharded = runs[f"{n} procs x 1 thread"]
    diff = max(abs(a - b) for ra, rb in zip(sharded["importance"], base["importance"]) for a, b in zip(ra, rb))
    print(f"\nengine: {base['engine']}; sharded importance vs one process: max abs difference {diff:.2e}")


if __name__ == "__main__":
    main()
