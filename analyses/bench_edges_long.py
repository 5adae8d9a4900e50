"""Edge attribution at long context: EAP's peak memory and time against the model's own forward and
backward at the same length, in one process per measurement, on a tiny Llama (rotary, RMSNorm, gated
MLP, 4 query heads over 2 key/value heads) on the CPU.

For each length ``T``: one pair of the ``repeat`` task (a random block of ``T/2`` tokens repeated, the
corrupted prompt's second copy redrawn; ``T + 1`` tokens with BOS), batch 1, and

1. the model's own forward and backward: the Hugging Face model (SDPA attention, no cache, weights
   frozen), the logit difference at the last position, backward to the input embeddings: the least a
   gradient through the model costs;
2. ``interp.edge_scores(bridge, task, method="eap")`` on the same weights (TransformerLens 4 bridge):
   a forward of the donor prompt, a forward and a backward of the own one, every edge's score
   accumulated over chunks of positions (its bootstrap over the one pair included).

Each in a fresh process, so one peak is not another's; the peak is the resident set's growth above
the loaded model (``VmHWM``; glibc's mmap threshold fixed so freed tensors leave the resident set).

    python analyses/bench_edges_long.py                  # 2K, 8K and 32K tokens, one thread
    python analyses/bench_edges_long.py 4096             # other lengths
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from _common import ROOT, child_env, llama_model, peak_growth, word_tokenizer

FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # as bench_qk.py: each call's peak its own


def worker(T: int, what: str, threads: int) -> dict:
    import torch

    import interp
    from interp.models import from_hf_model
    from interp.patching.metrics import task_metric
    from interp.probes.task import task_probe

    torch.set_num_threads(threads)
    bridge = from_hf_model(llama_model(n_positions=T + 64), word_tokenizer(), name="tiny-llama-gqa")
    task = task_probe(bridge, "repeat", n_pairs=1, seed=0, block_len=T // 2)
    if what == "own":
        hf = llama_model(n_positions=T + 64)
        hf.config._attn_implementation = "sdpa"
        for p in hf.parameters():
            p.requires_grad_(False)
        metric, _ = task_metric(task, "raw-logit-diff")

        def run():
            emb = hf.model.embed_tokens(task.clean).detach().requires_grad_(True)
            logits = hf(inputs_embeds=emb, use_cache=False).logits
            metric(metric.read(logits), task.clean, None, None).sum().backward()
            return emb.grad.shape

    else:

        def run():
            config = interp.RunConfig(n_boot=100, progress=False)
            return interp.edge_scores(bridge, task, method="eap", metric="raw-logit-diff", config=config).meta

    start = time.perf_counter()
    out, peak = peak_growth(run)
    seconds = time.perf_counter() - start
    facts = {"T": task.seq_len, "what": what, "peak": peak, "seconds": seconds}
    if what == "eap":
        facts.update(edges=out["n_edges"], attention=out["attention"])
    return facts


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))))
        return
    lengths = [int(a) for a in sys.argv[1:]] or [2048, 8192, 32768]
    threads = 1
    print(
        f"tiny Llama (2 layers, d_model 64, 4 query heads over 2 key/value heads, gated MLP), one pair of the "
        f"repeat task, batch 1, {threads} thread; peak = resident-set growth above the loaded model"
    )
    print(
        f"{'tokens':>7} {'edges':>6} {'own MiB':>8} {'EAP MiB':>8} {'x mem':>6} {'own s':>7} {'EAP s':>7} {'x time':>7}"
    )
    for T in lengths:
        got = {}
        for what in ("own", "eap"):
            done = subprocess.run(
                [sys.executable, __file__, "--worker", str(T), what, str(threads)],
                capture_output=True,
                text=True,
                env=child_env(OMP_NUM_THREADS=str(threads), **FIXED_MMAP),
                cwd=ROOT,
            )
            if done.returncode:
                sys.exit(f"{what} at {T} tokens failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
            got[what] = json.loads(done.stdout.strip().splitlines()[-1])
        own, eap = got["own"], got["eap"]
        print(
            f"{eap['T']:>7} {eap['edges']:>6} {own['peak'] / 2**20:>8.1f} {eap['peak'] / 2**20:>8.1f} "
            f"{eap['peak'] / own['peak']:>6.2f} {own['seconds']:>7.2f} {eap['seconds']:>7.2f} "
            f"{eap['seconds'] / own['seconds']:>7.2f}",
            flush=True,
        )
    print(f"EAP's attention: {eap['attention']}")


if __name__ == "__main__":
    main()
