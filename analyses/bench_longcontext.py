"""Long-context head statistics: the pattern engine vs the stream engine vs TransformerLens's cache.

The job: the sink statistics of one random-token sequence of T tokens (batch 1) on a tiny random
Llama-style model built in-process (2 layers, d_model 128, 4 heads, 2 K/V heads, rotary positions,
64K positions, vocabulary 32K): every head's received mass per key, confidence and value norms.

- ``pattern``: ``sink_statistics(engine="pattern")``, each layer's pattern reduced in its hook;
- ``stream``: ``sink_statistics(engine="stream")``, no pattern formed anywhere;
- ``tl-cache``: the way a TransformerLens user would get the patterns: ``run_with_cache`` with
  ``names_filter`` on ``hook_pattern`` under ``no_grad``, then the received mass per key.

Each (method, T) runs in a fresh subprocess. After the model and probe are built the worker caps its
own address space at its current size plus ``--mem-limit-gib`` (default 8), so a method that needs
more fails with an allocation error, reported as OOM, instead of swapping the machine. Reported: the
process's peak resident set (``VmHWM``), its growth over the call, and the wall time of the call.
A table is printed and written with a plot (memory and time against T) under ``--out``.

    python analyses/bench_longcontext.py --quick          # T = 1K .. 8K
    python analyses/bench_longcontext.py                  # T = 1K .. 64K (long on a small CPU)
    python analyses/bench_longcontext.py --save-model DIR # the same model as a HF directory, for the CLIs
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from _common import child_env, llama_model, run_worker, save_tiny_llama, status_bytes

from interp.config import RunConfig

METHODS = ("pattern", "stream", "tl-cache")
SHAPE = dict(n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, n_positions=65536, vocab=32000)


def build_model(seed: int = 0):
    """The tiny random Llama-style model, as an ``transformers`` model (random weights, no download)."""
    return llama_model(**SHAPE, seed=seed)


def save_model(directory: Path) -> Path:
    """The model and a word-level tokenizer (``w1 .. w31999``), saved for ``--model DIR``."""
    return save_tiny_llama(directory, **SHAPE)


def _cap_address_space(extra_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (status_bytes("VmSize") + extra_bytes, resource.RLIM_INFINITY))


def worker(method: str, T: int, threads: int, mem_limit: int) -> dict:
    """Runs in its own process: one method at one length."""
    import torch

    torch.set_num_threads(threads)
    from interp.models import from_hf_model
    from interp.probes import random_tokens
    from interp.sinks.stats import sink_statistics

    model = from_hf_model(build_model(), name="llama-tiny-64k")
    probe = random_tokens(model, batch=1, seq_len=T - 1)  # BOS + T - 1
    before = status_bytes("VmHWM")
    _cap_address_space(mem_limit)
    start = time.perf_counter()
    try:
        if method == "tl-cache":
            with torch.no_grad():
                _, cache = model.run_with_cache(probe.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
                received = [cache[f"blocks.{l}.attn.hook_pattern"].sum(-2) for l in range(SHAPE["n_layers"])]
            first = float(received[0][0, :, 0].mean()) / T
        else:
            stats = sink_statistics(model, probe, config=RunConfig(engine=method))
            first = float(stats.received[0, 0, :, 0].mean()) / T
    except (MemoryError, RuntimeError) as e:
        if "memory" not in str(e).lower() and not isinstance(e, MemoryError):
            raise
        return {"method": method, "T": T, "oom": True, "base_rss": before}
    seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    return {
        "method": method,
        "T": T,
        "oom": False,
        "seconds": seconds,
        "peak_rss": peak,
        "growth": peak - before,
        "base_rss": before,
        "layer0_first_mass": first,
    }


def sweep(lengths: list[int], methods: list[str], threads: int, mem_limit: int) -> list[dict]:
    rows = []
    env = child_env(OMP_NUM_THREADS=str(threads))
    for T in lengths:
        for method in methods:
            cmd = [sys.executable, __file__, "--worker", method, str(T), "--threads", str(threads)]
            cmd += ["--mem-limit-gib", str(mem_limit / 2**30)]
            row = run_worker(cmd, env, method=method, T=T)
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _line(r: dict) -> str:
    if r.get("oom"):
        return f"{r['method']:>9} T={r['T']:>6}: OOM (over the memory limit)"
    if "seconds" not in r:
        return f"{r['method']:>9} T={r['T']:>6}: failed: {r.get('error')}"
    return (
        f"{r['method']:>9} T={r['T']:>6}: peak RSS {r['peak_rss'] / 2**20:8.0f} MiB "
        f"(+{r['growth'] / 2**20:7.0f} over the call), {r['seconds']:7.2f} s"
    )


def table(rows: list[dict], lengths: list[int], methods: list[str]) -> str:
    def cell(r: dict | None) -> str:
        if r is None:
            return "-"
        if r.get("oom"):
            return "OOM"
        if "seconds" not in r:
            return "failed"
        return f"{r['peak_rss'] / 2**20:.0f} MiB / {r['seconds']:.1f} s"

    by = {(r["method"], r["T"]): r for r in rows}
    head = f"{'T':>7} | " + " | ".join(f"{m:>20}" for m in methods)
    lines = [head, "-" * len(head)]
    for T in lengths:
        lines.append(f"{T:>7} | " + " | ".join(f"{cell(by.get((m, T))):>20}" for m in methods))
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> list[Path]:
    from plotly.subplots import make_subplots

    from interp.plots import save_figure

    fig = make_subplots(rows=1, cols=2, subplot_titles=("peak RSS (MiB)", "time (s)"))
    for method in METHODS:
        ok = [r for r in rows if r["method"] == method and "seconds" in r]
        if not ok:
            continue
        T = [r["T"] for r in ok]
        fig.add_scatter(x=T, y=[r["peak_rss"] / 2**20 for r in ok], name=method, row=1, col=1, legendgroup=method)
        fig.add_scatter(
            x=T, y=[r["seconds"] for r in ok], name=method, row=1, col=2, legendgroup=method, showlegend=False
        )
    fig.update_xaxes(type="log", title="T (tokens)")
    fig.update_yaxes(type="log")
    fig.update_layout(title="sink statistics at long context, tiny rotary GQA model, batch 1 (CPU)")
    return save_figure(fig, out, "bench_longcontext")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="T = 1K .. 8K")
    p.add_argument("--lengths", type=int, nargs="*", default=None, help="T values (default 1K .. 64K)")
    p.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mem-limit-gib", type=float, default=8.0, help="per worker, beyond its size after setup")
    p.add_argument("--out", default="out/bench_longcontext")
    p.add_argument("--save-model", default=None, help="write the model and a tokenizer to this folder and exit")
    p.add_argument("--worker", nargs=2, metavar=("METHOD", "T"), help=argparse.SUPPRESS)
    args = p.parse_args()
    limit = int(args.mem_limit_gib * 2**30)
    if args.save_model:
        print(save_model(Path(args.save_model)))
        return
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.threads, limit)))
        return
    lengths = args.lengths or [1024 * 2**i for i in range(4 if args.quick else 7)]
    print(
        f"tiny Llama-style model {SHAPE}; sink statistics of 1 sequence of T tokens; {args.threads} threads; "
        f"memory limit {args.mem_limit_gib:g} GiB per worker beyond its setup"
    )
    rows = sweep(lengths, args.methods, args.threads, limit)
    print("\npeak RSS of the whole process / wall time of the call:\n" + table(rows, lengths, args.methods))
    stream = {r["T"]: r for r in rows if r["method"] == "stream" and "seconds" in r}
    growth = [(a, b) for a, b in zip(lengths, lengths[1:]) if a in stream and b in stream]
    if growth:
        print("\nstream engine, peak RSS growth per step in T:")
        for a, b in growth:
            print(f"  {a} -> {b} ({b / a:g}x T): {stream[b]['peak_rss'] / stream[a]['peak_rss']:.2f}x peak RSS, "
                  f"{stream[b]['growth'] / max(stream[a]['growth'], 1):.2f}x growth over the call")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from interp._io import atomic_write_json

    written = [atomic_write_json(out / "bench_longcontext.json", {"shape": SHAPE, "rows": rows})]
    written += plot(rows, out)
    print("\nwrote:\n" + "\n".join(f"  {w}" for w in written))


if __name__ == "__main__":
    main()
