"""Benchmark the toy's attention paths.

CPU (always): peak memory and time of one causal attention forward pass, n = 1,024 .. 8,192 tokens,
for the reference path (explicit n x n scores and pattern), the blockwise online softmax, and
torch's scaled_dot_product_attention. Each measurement runs in a fresh subprocess; its peak memory is
the process's peak resident set during the call over its resident set before it (the high-water
mark is reset just before the call, Linux ``/proc/self/clear_refs``), so the inputs, the interpreter
and any earlier transient peak do not count. The blockwise path runs at the tile the toy model uses
(``blockwise_attention``'s default). Expect the reference to grow ~n^2 and the blockwise path ~n.

CUDA (when a GPU is present): our Triton kernel vs SDPA's FlashAttention backend, forward TFLOP/s,
n = 1K .. 16K, head dim 64 and 128, fp16, causal and not.

    python analyses/bench_flash.py --quick    # CPU n = 1K..4K (+ GPU n = 1K..4K): a few minutes
    python analyses/bench_flash.py            # the full sweep
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import subprocess
import sys
import time

from _common import child_env, peak_growth

from interp.toy.flash import blockwise_attention

CPU_SHAPE = dict(batch=1, heads=4, d_head=64)  # fp32
BLOCK = inspect.signature(blockwise_attention).parameters["block_size"].default  # the tile the model uses


def cpu_worker(method: str, n: int, repeats: int, threads: int) -> dict:
    """Runs in its own process: one method at one length; returns time and peak memory growth."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    from interp.toy.attention import reference_attention

    torch.manual_seed(0)
    b, h, d = CPU_SHAPE["batch"], CPU_SHAPE["heads"], CPU_SHAPE["d_head"]
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    run = {
        "reference": lambda: reference_attention(q, k, v, causal=True)[0],
        "blockwise": lambda: blockwise_attention(q, k, v, causal=True)[0],
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }[method]
    with torch.no_grad():
        out, peak = peak_growth(run)  # the first call sets the peak
        times = []
        for _ in range(repeats):
            del out
            start = time.perf_counter()
            out = run()  # noqa: F841 (kept alive until the next del, as a caller would)
            times.append(time.perf_counter() - start)
    return {"method": method, "n": n, "seconds": statistics.median(times), "peak_bytes": peak}


def cpu_sweep(lengths: list[int], repeats: int, threads: int) -> list[dict]:
    rows = []
    for n in lengths:
        for method in ("reference", "blockwise", "sdpa"):
            cmd = [
                sys.executable,
                __file__,
                "--cpu-worker",
                method,
                str(n),
                "--repeats",
                str(repeats),
                "--threads",
                str(threads),
            ]
            result = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), check=True)
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(
                f"  n={n:5d} {method:9s} {rows[-1]['seconds'] * 1e3:9.1f} ms  {rows[-1]['peak_bytes'] / 2**20:8.1f} MiB",
                flush=True,
            )
    return rows


def print_cpu_table(rows: list[dict]) -> None:
    by = {(r["n"], r["method"]): r for r in rows}
    lengths = sorted({r["n"] for r in rows})
    b, h, d = CPU_SHAPE["batch"], CPU_SHAPE["heads"], CPU_SHAPE["d_head"]
    print(f"\nCPU, causal forward, fp32, batch {b}, {h} heads, d_head {d}, blockwise tile {BLOCK}")
    print("     n | peak MiB: reference blockwise   sdpa | ref/blk | time ms: reference blockwise     sdpa | blk/sdpa")
    for n in lengths:
        ref, blk, sdpa = by[n, "reference"], by[n, "blockwise"], by[n, "sdpa"]
        mib = lambda r: r["peak_bytes"] / 2**20  # noqa: E731
        ms = lambda r: r["seconds"] * 1e3  # noqa: E731
        print(
            f"{n:6d} |         {mib(ref):9.1f} {mib(blk):9.1f} {mib(sdpa):6.1f} | {mib(ref) / max(mib(blk), 1e-3):7.1f} |"
            f"          {ms(ref):9.1f} {ms(blk):9.1f} {ms(sdpa):8.1f} | {ms(blk) / ms(sdpa):8.2f}"
        )
    if len(lengths) > 1:
        lo, hi = lengths[0], lengths[-1]
        growth = lambda m: by[hi, m]["peak_bytes"] / max(by[lo, m]["peak_bytes"], 1)  # noqa: E731
        print(
            f"memory growth from n={lo} to n={hi} (x{hi // lo} tokens): reference x{growth('reference'):.1f} "
            f"(n^2 would be x{(hi // lo) ** 2}), blockwise x{growth('blockwise'):.1f} (n would be x{hi // lo})"
        )


def gpu_sweep(lengths: list[int]) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from interp.toy.flash import HAS_TRITON, triton_attention

    if not HAS_TRITON:
        print("\nGPU: Triton is not installed (pip install -e '.[gpu]'); skipping")
        return

    def bench(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    print(f"\nGPU ({torch.cuda.get_device_name()}), forward, fp16, 16 heads, tokens per batch = 16K")
    print("     n | d_head | causal | Triton TFLOP/s | SDPA flash TFLOP/s | Triton/SDPA")
    for d_head in (64, 128):
        for causal in (False, True):
            for n in lengths:
                batch = max(1, 16384 // n)
                q, k, v = (torch.randn(batch, 16, n, d_head, device="cuda", dtype=torch.float16) for _ in range(3))
                flops = 4 * batch * 16 * n * n * d_head * (0.5 if causal else 1.0)
                with torch.no_grad():
                    t_triton = bench(lambda: triton_attention(q, k, v, causal))
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        t_sdpa = bench(
                            lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        )
                tf_triton, tf_sdpa = flops / t_triton / 1e12, flops / t_sdpa / 1e12
                print(
                    f"{n:6d} | {d_head:6d} | {str(causal):6s} | {tf_triton:14.1f} | {tf_sdpa:18.1f} | {tf_triton / tf_sdpa:11.2f}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CPU n up to 4,096 and GPU n up to 4K")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (median)")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch CPU threads per measurement (default 1: on a small shared machine, more threads "
        "make the blockwise path's many small ops wait on each other, and the timings erratic)",
    )  # fmt: skip
    parser.add_argument("--cpu-worker", nargs=2, metavar=("METHOD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.cpu_worker:
        method, n = args.cpu_worker
        print(json.dumps(cpu_worker(method, int(n), args.repeats or 1, args.threads)))
        return

    import torch

    cpu_lengths = [1024, 2048, 4096] if args.quick else [1024, 2048, 4096, 8192]
    repeats = args.repeats or (2 if args.quick else 3)
    print(f"CPU sweep (torch {torch.__version__}, {args.threads} thread(s)): one fresh process per measurement")
    print_cpu_table(cpu_sweep(cpu_lengths, repeats, args.threads))
    if torch.cuda.is_available():
        gpu_sweep([1024, 2048, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384])
    else:
        print("\nno CUDA device: the Triton vs SDPA-flash comparison runs only on a GPU")


if __name__ == "__main__":
    main()
