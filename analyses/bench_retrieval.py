"""Retrieval scores at long context: the stream engine vs TransformerLens's cache, per T.

The job: every head's retrieval score (Wu et al.: is the most-attended key the needle token being
copied) and the mass on that token, on one needle-in-a-haystack sequence of T tokens (batch 1,
needles at depths 0.1 / 0.5 / 0.9, 8 tokens each, random haystack), on two models built in-process:

- ``planted``: :func:`interp.toy.planted.planted_model` (retrieval head 1.0 planted; known answer 1.0);
- ``llama``: the tiny random Llama-style model of ``bench_longcontext.py`` (2 layers, 4 heads, 2 K/V
  heads, rotary, 64K positions), through a TransformerLens bridge.

Methods, each (model, method, T) in a fresh subprocess:

- ``stream``: ``retrieval_scores(engine="stream")``: row pass, row argmax at the copy queries only,
  sink + band tiles for the streaming share; no pattern anywhere;
- ``tl-cache``: what a TransformerLens user would do: ``run_with_cache`` with ``names_filter`` on
  ``hook_pattern`` under ``no_grad``, then the argmax at the copy queries (on ``llama`` the
  TransformerLens bridge's ``run_with_cache``; on ``planted``, a toy model, its TransformerLens-style
  ``run_with_cache``: the same hook names and cache). The last column is the largest difference
  between the two methods' retrieval scores over every head, where both ran.

After setup each worker caps its address space at its current size plus ``--mem-limit-gib``
(default 8), so a method that needs more fails with an allocation error, reported as OOM. Reported:
the process's peak resident set (``VmHWM``, the whole process: Python, torch, the model) and the
wall time of the call.

    python analyses/bench_retrieval.py --lengths 8192 32768        # what fits a small CPU in minutes
    python analyses/bench_retrieval.py                             # T = 8K, 32K, 64K, 128K (planted)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from _common import child_env, llama_model, run_worker, status_bytes

from interp.config import RunConfig

METHODS = ("stream", "tl-cache")
MODELS = ("planted", "llama")
LLAMA = dict(n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, n_positions=65536, vocab=32000)
DEPTHS = (0.1, 0.5, 0.9)


def build(name: str, T: int):
    from interp.models import from_hf_model
    from interp.toy.planted import planted_model

    if name == "planted":
        return planted_model(T + 1)
    return from_hf_model(llama_model(**LLAMA, seed=0), name="llama-tiny-64k")


def worker(model_name: str, method: str, T: int, threads: int, mem_limit: int) -> dict:
    """Runs in its own process: one method on one model at one length."""
    import torch

    torch.set_num_threads(threads)
    from interp.probes.needle import needle_probe
    from interp.retrieval import retrieval_scores

    model = build(model_name, T)
    probe = needle_probe(model, seq_len=T - 1, depths=DEPTHS, needle_len=8, batch=1, seed=0)  # BOS + T - 1
    before = status_bytes("VmHWM")
    resource.setrlimit(resource.RLIMIT_AS, (status_bytes("VmSize") + mem_limit, resource.RLIM_INFINITY))
    start = time.perf_counter()
    try:
        if method == "tl-cache":
            with torch.no_grad():
                _, cache = model.run_with_cache(probe.tokens, names_filter=lambda n: n.endswith("hook_pattern"))
                b, q, k = probe.retrieval_pairs().unbind(-1)
                grid = torch.stack(
                    [
                        (cache[f"blocks.{l}.attn.hook_pattern"][b, :, q].argmax(-1) == k[:, None]).float().mean(0)
                        for l in range(len(model.blocks))
                    ]
                )
        else:
            scores = retrieval_scores(model, probe, config=RunConfig(engine="stream", n_boot=100))
            grid = torch.as_tensor(scores.grid("retrieval"))
    except (MemoryError, RuntimeError) as e:
        if "memory" not in str(e).lower() and "alloc" not in str(e).lower() and not isinstance(e, MemoryError):
            raise
        return {"model": model_name, "method": method, "T": T, "oom": True, "base_rss": before}
    seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    flat = grid.flatten()
    top = int(flat.argmax())
    return {
        "model": model_name,
        "method": method,
        "T": T,
        "oom": False,
        "seconds": seconds,
        "peak_rss": peak,
        "growth": peak - before,
        "top_head": f"{top // grid.shape[1]}.{top % grid.shape[1]}",
        "top_retrieval": float(flat[top]),
        "grid": grid.tolist(),
    }


def run_one(model: str, method: str, T: int, threads: int, mem_limit: int) -> dict:
    env = child_env(OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--worker", model, method, str(T), "--threads", str(threads)]
    cmd += ["--mem-limit-gib", str(mem_limit / 2**30)]
    return run_worker(cmd, env, model=model, method=method, T=T)


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if r.get("oom"):
        return "OOM"
    if "seconds" not in r:
        return "failed"
    return f"{r['peak_rss'] / 2**20:.0f} MiB / {r['seconds']:.1f} s ({r['top_head']}: {r['top_retrieval']:.2f})"


def table(rows: list[dict]) -> str:
    by = {(r["model"], r["method"], r["T"]): r for r in rows}
    keys = sorted({(r["model"], r["T"]) for r in rows}, key=lambda x: (MODELS.index(x[0]), x[1]))
    head = f"{'model':>8} {'T':>7} | " + " | ".join(f"{m:>36}" for m in METHODS)
    head += f" | {'stream vs tl-cache':>22} | max |retrieval diff|"
    lines = [head, "-" * len(head)]
    for model, T in keys:
        cells = [by.get((model, m, T)) for m in METHODS]
        s, tl = cells
        ratio, diff = "-", "-"
        if s and "peak_rss" in s:
            if tl and "peak_rss" in tl:
                ratio = f"{tl['peak_rss'] / s['peak_rss']:.1f}x less RSS, {s['seconds'] / tl['seconds']:.2f}x the time"
                gap = max(abs(a - b) for ra, rb in zip(s["grid"], tl["grid"]) for a, b in zip(ra, rb))
                diff = f"{gap:.1e}"
            elif tl and tl.get("oom"):
                ratio = "peer OOM"
        row = f"{model:>8} {T:>7} | " + " | ".join(f"{_cell(c):>36}" for c in cells)
        lines.append(row + f" | {ratio:>22} | {diff}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="*", default=[8192, 32768, 65536, 131072])
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    p.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mem-limit-gib", type=float, default=8.0, help="per worker, beyond its size after setup")
    p.add_argument("--out", default="out/bench_retrieval")
    p.add_argument("--worker", nargs=3, metavar=("MODEL", "METHOD", "T"), help=argparse.SUPPRESS)
    args = p.parse_args()
    limit = int(args.mem_limit_gib * 2**30)
    if args.worker:
        model, method, T = args.worker
        print(json.dumps(worker(model, method, int(T), args.threads, limit)))
        return
    print(
        f"retrieval scores of 1 needle sequence of T tokens ({len(DEPTHS)} needles x 8 tokens); models: "
        f"planted (32K+ learned positions), llama {LLAMA}; {args.threads} threads; memory limit "
        f"{args.mem_limit_gib:g} GiB per worker beyond its setup"
    )
    rows = []
    for T in args.lengths:
        for model in args.models:
            if model == "llama" and T > LLAMA["n_positions"]:
                continue
            for method in args.methods:
                row = run_one(model, method, T, args.threads, limit)
                rows.append(row)
                print(f"{model:>8} {method:>8} T={T:>6}: {_cell(row)}", flush=True)
    print("\npeak RSS of the whole process / wall time of the call (top head: its retrieval score):")
    print(table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from interp._io import atomic_write_json

    path = atomic_write_json(out / "bench_retrieval.json", {"llama": LLAMA, "depths": DEPTHS, "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
