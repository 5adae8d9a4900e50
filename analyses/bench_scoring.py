"""Benchmark: scoring heads vs one plain forward, TransformerLens ``detect_head`` and ``run_with_cache``.

GPT-2-small architecture (GPT2Config() defaults: 12 layers x 12 heads, d_model 768, vocab 50257),
random weights built in-process (no download), at ARENA's defaults: 10 sequences of BOS + 50 random
tokens repeated twice. Methods, all on the same probe, in the same run:

- ``forward``: one plain forward pass to logits (the yardstick);
- ``ours``: previous-token, duplicate-token and induction scores together (``interp.heads``):
  only ``hook_pattern`` captured, reduced inside the hook, forward stopped after the last pattern;
- ``detect_head``: TransformerLens ``detect_head`` for the same three patterns (it runs
  ``run_with_cache`` once per sequence and per pattern);
- ``run_with_cache``: one full ``run_with_cache`` of the batch, then the scores from the cache;
- ``run_with_cache[patterns]``: the same with ``names_filter`` keeping only the patterns;
- ``run_with_cache[fair]``: the fairest way a skilled TransformerLens user would write it:
  ``names_filter`` on the patterns and ``stop_at_layer=n_layers``, under ``no_grad`` (on the
  TransformerBridge ``stop_at_layer=n_layers`` still runs the unembedding: measured as it is).

Times are medians of ``--repeats`` runs in this process; peak memory is measured per method in a
fresh subprocess (peak RSS growth over the model-loaded baseline; Linux only), so methods cannot share peaks.

    python analyses/bench_scoring.py            # full size (a few minutes on 2 CPU cores)
    python analyses/bench_scoring.py --quick    # 4-layer model, for a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from _common import GPT2_SMALL, peak_growth, random_gpt2, word_tokenizer

from interp.config import RunConfig

METHODS = ["forward", "ours", "detect_head", "run_with_cache", "run_with_cache[patterns]", "run_with_cache[fair]"]
HEADS = ["previous_token_head", "duplicate_token_head", "induction_head"]


def build(quick: bool):
    from transformers import AutoTokenizer

    # A word-level tokenizer over the full vocabulary ("w123" -> 123), so detect_head can run on text.
    vocab = GPT2_SMALL["vocab"]
    tmp = tempfile.mkdtemp(prefix="bench-tok-")
    word_tokenizer(vocab, special_id=vocab - 1).save_pretrained(tmp)
    return random_gpt2(4 if quick else None, AutoTokenizer.from_pretrained(tmp))


def runners(model):
    from transformer_lens.head_detector import detect_head

    from interp.heads import head_scores
    from interp.hooks import pattern_hook
    from interp.probes import repeated_tokens

    probe = repeated_tokens(model, batch=10, block_len=50, n_repeats=2, seed=0)
    texts = [" ".join(f"w{t}" for t in row[1:].tolist()) for row in probe.tokens]
    L = model.cfg.n_layers

    def forward():
        with torch.no_grad():
            model(probe.tokens)

    def ours():
        head_scores(model, probe, copying=False, config=RunConfig(n_boot=1000))

    def detect():
        for name in HEADS:
            detect_head(model, texts, name, error_measure="mul")

    def from_cache(names_filter=None, stop_at_layer=None):
        with torch.no_grad():
            _, cache = model.run_with_cache(probe.tokens, names_filter=names_filter, stop_at_layer=stop_at_layer)
        dup, ind = probe.duplicate_mask().float(), probe.induction_mask().float()
        for layer in range(L):
            pattern = cache[pattern_hook(layer)]
            pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)
            torch.einsum("bhqk,bqk->bh", pattern, dup)
            torch.einsum("bhqk,bqk->bh", pattern, ind)
        del cache

    return {
        "forward": forward,
        "ours": ours,
        "detect_head": detect,
        "run_with_cache": from_cache,
        "run_with_cache[patterns]": lambda: from_cache(lambda n: n.endswith("hook_pattern")),
        "run_with_cache[fair]": lambda: from_cache(lambda n: n.endswith("hook_pattern"), stop_at_layer=L),
    }


def measure_memory(method: str, quick: bool) -> None:
    """Child process: build the model, reset the peak-RSS mark, run one method, print the growth.

    Writing 5 to /proc/self/clear_refs resets VmHWM (Linux), so model construction's own peak is
    forgotten and the figure is what the method itself needed above the loaded model.
    """
    model = build(quick)
    run = runners(model)[method]
    with torch.no_grad():  # one-time lazy initialisation (threads, describe()) is not the method's
        model(torch.tensor([[1, 2, 3, 4]]))
    _, peak = peak_growth(run)
    print(json.dumps({"method": method, "peak_mb": peak / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 layers instead of 12")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--_memory", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._memory:
        torch.set_num_threads(args.threads)
        measure_memory(args._memory, args.quick)
        return

    torch.set_num_threads(args.threads)
    model = build(args.quick)
    run = runners(model)
    for fn in run.values():  # warm-up: allocator, lazy init
        fn()
    times = {m: [] for m in METHODS}
    for _ in range(args.repeats):  # interleaved, so drift hits every method alike
        for m in METHODS:
            t0 = time.perf_counter()
            run[m]()
            times[m].append(time.perf_counter() - t0)
    med = {m: statistics.median(v) for m, v in times.items()}

    mem = {}
    for m in METHODS:
        cmd = [sys.executable, __file__, "--_memory", m, "--threads", str(args.threads)]
        cmd += ["--quick"] if args.quick else []
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        mem[m] = json.loads(out.strip().splitlines()[-1])["peak_mb"]

    cfg = model.cfg
    print(
        f"model: GPT-2-small architecture, random weights ({cfg.n_layers} layers x {cfg.n_heads} heads, "
        f"d_model {cfg.d_model}, vocab {cfg.d_vocab}); probe: 10 x (BOS + 2 x 50) tokens; "
        f"{torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print(f"{'method':<26}{'time s':>9}{'x forward':>11}{'peak MB':>10}{'x forward':>11}")
    for m in METHODS:
        print(
            f"{m:<26}{med[m]:>9.3f}{med[m] / med['forward']:>11.2f}{mem[m]:>10.1f}"
            f"{mem[m] / max(mem['forward'], 1e-9):>11.2f}"
        )
    print()
    print(f"ours / forward time:          {med['ours'] / med['forward']:.2f}x   (target <= 1.00x)")
    print(f"ours / detect_head time:      {med['ours'] / med['detect_head']:.3f}x")
    fair = "run_with_cache[fair]"
    print(
        f"ours / fairest TransformerLens (patterns only, stop_at_layer, no_grad): "
        f"{med['ours'] / med[fair]:.2f}x time, {mem['ours'] / max(mem[fair], 1e-9):.2f}x peak memory"
    )
    print(
        f"ours / run_with_cache memory: {mem['ours'] / max(mem['run_with_cache'], 1e-9):.2f}x  "
        f"(target < 1.00x); vs patterns-only cache: "
        f"{mem['ours'] / max(mem['run_with_cache[patterns]'], 1e-9):.2f}x"
    )


if __name__ == "__main__":
    main()
