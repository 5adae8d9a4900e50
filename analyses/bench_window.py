"""A sliding window makes the stream pass cheaper: a windowed model against the same model with full
attention, at long context, on the stream engine.

The job: the sink statistics of one random-token sequence of T tokens (batch 1),
``sink_statistics(engine="stream")``: every head's received mass per key, confidence and value norms.
The models: a tiny random Mistral-style decoder built in-process (2 layers, d_model 128, 4 heads,
2 K/V heads, rotary positions, 64K positions, vocabulary 32K), once with ``sliding_window`` (4096 by
default) and once with the same weights and full attention. On the windowed model the stream
engine reads only the key tiles inside each query block's band (``O(T x window)``) and computes the
model's own attention output with its banded online softmax; on the full model the passes read the
causal triangle and the output comes from torch's fused SDPA.

Each model runs in a fresh subprocess; reported: wall time of the call, the process's peak resident
set (``VmHWM``) and its growth over the call, and the ratios full / windowed, with the sizes.

    python analyses/bench_window.py                      # T = 32K, window 4096
    python analyses/bench_window.py --seq-len 16384      # a shorter run (label it so)
    python analyses/bench_window.py --save-model DIR     # the windowed model as a HF directory, for the CLIs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import child_env, status_bytes, word_tokenizer

from interp.config import RunConfig

SHAPE = dict(n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, n_positions=65536, vocab=32000)


def mistral_model(window: int | None, seed: int = 0):
    """The tiny random Mistral-style model (``window=None``: full attention, the same weights)."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(
        num_hidden_layers=SHAPE["n_layers"],
        hidden_size=SHAPE["d_model"],
        num_attention_heads=SHAPE["n_heads"],
        num_key_value_heads=SHAPE["n_kv_heads"],
        head_dim=SHAPE["d_model"] // SHAPE["n_heads"],
        intermediate_size=2 * SHAPE["d_model"],
        max_position_embeddings=SHAPE["n_positions"],
        vocab_size=SHAPE["vocab"],
        sliding_window=window,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
    )
    return MistralForCausalLM(cfg).eval()


def save_model(directory: Path, window: int) -> Path:
    """The windowed model and a word-level tokenizer (``w1 .. w31999``), saved for ``--model DIR``."""
    mistral_model(window).save_pretrained(directory)
    word_tokenizer(SHAPE["vocab"]).save_pretrained(directory)
    return Path(directory)


def worker(window: int | None, T: int, threads: int) -> dict:
    """Runs in its own process: one model at one length."""
    import torch

    torch.set_num_threads(threads)
    from interp.models import from_hf_model
    from interp.probes import random_tokens
    from interp.sinks.stats import sink_statistics

    model = from_hf_model(mistral_model(window), name="mistral-window" if window else "mistral-full")
    probe = random_tokens(model, batch=1, seq_len=T, seed=0)
    before = status_bytes("VmRSS")
    t0 = time.perf_counter()
    with torch.no_grad():
        stats = sink_statistics(model, probe, config=RunConfig(engine="stream"))
    elapsed = time.perf_counter() - t0
    return dict(
        window=window,
        T=probe.seq_len,
        seconds=elapsed,
        peak_gib=status_bytes("VmHWM") / 2**30,
        growth_gib=(status_bytes("VmHWM") - before) / 2**30,
        first_mass=float(stats.received[..., 0].mean() / probe.seq_len),
    )


def run(window: int | None, T: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", str(window or 0), "--seq-len", str(T), "--threads", str(threads)]
    out = subprocess.run(cmd, env=child_env(), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=32768)
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-model", default=None, help="write the windowed model and a tokenizer here and exit")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.save_model:
        print(save_model(Path(args.save_model), args.window))
        return
    if args.worker is not None:
        print(json.dumps(worker(args.worker or None, args.seq_len, args.threads)))
        return
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    print(f"stream sink pass, batch 1, T = {args.seq_len}, {args.threads} threads; model: {shape}")
    rows = {name: run(w, args.seq_len, args.threads) for name, w in (("window", args.window), ("full", None))}
    for name, r in rows.items():
        label = f"window {args.window}" if name == "window" else "full attention"
        print(
            f"  {label:>15}: {r['seconds']:8.1f} s   peak RSS {r['peak_gib']:.2f} GiB "
            f"(+{r['growth_gib']:.2f} GiB in the call)"
        )
    w, f = rows["window"], rows["full"]
    print(
        f"full / window: time x{f['seconds'] / w['seconds']:.2f}, peak RSS x{f['peak_gib'] / w['peak_gib']:.2f}, "
        f"growth x{f['growth_gib'] / max(w['growth_gib'], 1e-9):.2f}"
    )


if __name__ == "__main__":
    main()
