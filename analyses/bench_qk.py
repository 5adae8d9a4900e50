"""QK attribution's cost: one retrieval head's full decomposition against the model's own forward,
in one process on a tiny Llama (rotary, 4 query heads over 2 key/value heads) on the CPU.

For each length: the peak resident-set growth (``VmHWM`` above the resident set just before the
call, :func:`analyses._common.peak_growth`) and the wall time of (1) the Hugging Face model's own
forward (SDPA attention, ``no_grad``, no cache: the least a user's forward costs) and (2)
``qk_attribution(bridge, needle probe, heads="1.0", at="retrieval")`` (its clean run, the replays of
layer 1's attention on each component at the targets and on each block of keys, the bootstrap), and
their ratios.
Each length runs in a fresh process, so one length's peak is not another's.

    python analyses/bench_qk.py                 # 32K (32768 body tokens), one thread
    python analyses/bench_qk.py 4096 8192       # other lengths
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from _common import ROOT, child_env, llama_model, peak_growth, word_tokenizer

# glibc raises its mmap threshold as large blocks are freed, after which freed tensors stay resident
# and the second call's peak hides in the first's leftovers; a fixed threshold makes each tensor over
# 64 KB its own mapping, returned on free, so the forward's and the attribution's peaks are their own
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def worker(T: int, threads: int) -> dict:
    import torch

    from interp.config import RunConfig
    from interp.models import from_hf_model
    from interp.probes.needle import needle_probe
    from interp.roles.qk import head_totals, qk_attribution

    torch.set_num_threads(threads)
    hf = llama_model(n_positions=T + 64)
    hf.config._attn_implementation = "sdpa"
    bridge = from_hf_model(llama_model(n_positions=T + 64), word_tokenizer(), name="tiny-llama-gqa")
    probe = needle_probe(bridge, seq_len=T, batch=1, seed=0)
    tokens = probe.tokens

    def forward():
        with torch.no_grad():
            return hf(tokens, use_cache=False).logits.shape

    start = time.perf_counter()
    _, forward_peak = peak_growth(forward)
    forward_s = time.perf_counter() - start
    start = time.perf_counter()
    result, qk_peak = peak_growth(
        lambda: qk_attribution(bridge, probe, heads="1.0", at="retrieval", config=RunConfig(n_boot=200))
    )
    qk_s = time.perf_counter() - start
    top = result.top(1).iloc[0]
    return {
        "T": int(tokens.shape[1]),
        "forward_peak": forward_peak,
        "qk_peak": qk_peak,
        "forward_s": forward_s,
        "qk_s": qk_s,
        "top": f"{top['query']} x {top['key']}",
        "contrast": head_totals(result, "1.0")["contrast"],
        "max_error": result.meta["max_error"],
    }


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        print(json.dumps(worker(int(sys.argv[2]), int(sys.argv[3]))))
        return
    lengths = [int(a) for a in sys.argv[1:]] or [32768]
    threads = 1
    print(f"tiny Llama (2 layers, d_model 64, 4 heads over 2 key/value heads), one needle sequence, {threads} thread")
    for T in lengths:
        done = subprocess.run(
            [sys.executable, __file__, "--worker", str(T), str(threads)],
            capture_output=True, text=True, env=child_env(OMP_NUM_THREADS=str(threads), **FIXED_MMAP), cwd=ROOT,
        )  # fmt: skip
        if done.returncode != 0:
            print(f"T={T}: failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{r['T']} tokens: forward {r['forward_peak'] / 2**20:.0f} MiB / {r['forward_s']:.1f} s; "
            f"qk attribution of 1.0 at the needle {r['qk_peak'] / 2**20:.0f} MiB / {r['qk_s']:.1f} s: "
            f"{r['qk_peak'] / max(r['forward_peak'], 1):.2f}x the memory, {r['qk_s'] / r['forward_s']:.1f}x the time "
            f"(contrast {r['contrast']:.3g}, top pair {r['top']}, terms within {r['max_error']:.1g})"
        )


if __name__ == "__main__":
    main()
