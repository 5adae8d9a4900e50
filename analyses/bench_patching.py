"""Benchmark: exact activation patching and attribution patching per head, against TransformerLens.

GPT-2-small architecture (12 layers x 12 heads, d_model 768, vocab 50257; ``--layers`` fewer for a
reduced run), random weights built in-process (no download), on 50 IOI-shaped pairs (``--pairs``):
BOS + "Then, B and A went to the PLACE. B gave a OBJECT to" as token ids (16 tokens), the names,
place and object drawn per pair, the corrupted prompt three other names (Wang et al.'s ABC); the
metric is the logit difference answer (A) minus wrong answer (B) at the last position, denoising
(run corrupted, patch in clean). Side by side, in one run, on those pairs:

- ``tl_all_pos`` / ``tl_by_pos``: TransformerLens's ``get_act_patch_attn_head_out_all_pos`` /
  ``get_act_patch_attn_head_out_by_pos`` (one forward of the whole batch per patched index), after a
  clean ``run_with_cache`` that keeps ``hook_z`` only, under ``no_grad``. TransformerLens 4 has no
  ``HookedTransformer``: its patching functions take the ``TransformerBridge``, which is the model
  ``interp`` itself runs, so both read the very same weights;
- ``ours_all_pos`` / ``ours_by_pos``: ``interp.patch_heads(method="exact", by="head"|"position")``
  (every patch one row of the batched replay; with the baselines and the bootstrap CIs);
- ``tl_attribution``: TransformerLens's attribution-patching recipe written as a skilled user would:
  a clean cache of ``hook_z`` only (``no_grad``), a corrupted forward with forward and backward
  hooks on ``hook_z`` only, one backward of the summed metric; then ``(clean - corrupted) . grad``
  summed per head (all positions) and per head and position (both from the same pass);
- ``ours_attribution_all_pos`` / ``ours_attribution_by_pos``: ``interp.patch_heads(method="attribution")``.

Each method runs once in a fresh process (the model built, one warm-up forward, then the method):
wall and CPU seconds, and the peak resident-set growth above the loaded model (``VmHWM``, reset
just before the method: :func:`_common.peak_growth`). The numbers compared are the mean patched
logit difference per patch (exact: ours against TransformerLens's loop; attribution: ours against
the recipe's), largest absolute difference printed.

    OMP_NUM_THREADS=1 python analyses/bench_patching.py                   # the full size (long on a shared CPU)
    python analyses/bench_patching.py --layers 2 --pairs 10               # a reduced run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import child_env, peak_growth, random_gpt2

METHODS = (
    "tl_all_pos",
    "ours_all_pos",
    "tl_by_pos",
    "ours_by_pos",
    "tl_attribution",
    "ours_attribution_all_pos",
    "ours_attribution_by_pos",
)
TARGETS = {"exact per head / TransformerLens loop": 0.5, "attribution / exact": 1 / 20}
# BOS + "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to" with GPT-2's ids for the fixed words
TEMPLATE = ["BOS", 6423, 11, "B", 290, "A", 1816, 284, 262, "PLACE", 13, "B", 2921, 257, "OBJECT", 284]


def ioi_shaped(model, n_pairs: int, seed: int = 0):
    """``n_pairs`` IOI-shaped pairs as token ids: names, places and objects drawn from disjoint id
    ranges; the corrupted prompt puts three other names in (A, B, B -> C, D, E)."""
    from interp.probes.task import TaskProbe

    gen = torch.Generator().manual_seed(seed)
    names, places, objects = range(1000, 1100), range(2000, 2050), range(3000, 3050)
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(n_pairs):
        a, b, c, d, e = (names[i] for i in torch.randperm(len(names), generator=gen)[:5].tolist())
        place = places[int(torch.randint(len(places), (1,), generator=gen))]
        obj = objects[int(torch.randint(len(objects), (1,), generator=gen))]

        def fill(first_b: int, a_: int, second_b: int) -> list[int]:
            seen = {"A": a_, "PLACE": place, "OBJECT": obj}
            out, bs = [], iter((first_b, second_b))
            for w in TEMPLATE[1:]:
                out.append(next(bs) if w == "B" else seen.get(w, w))
            return out

        clean.append(fill(b, a, b))
        corrupted.append(fill(d, c, e))
        answer.append(a)
        wrong.append(b)
    return TaskProbe.from_pairs(model, clean, corrupted, answer, wrong, name="ioi-shaped", seed=seed)


def logit_diff(task):
    """The peer's metric: the mean over pairs of answer logit minus wrong logit at the last position."""
    rows = torch.arange(task.n_pairs)

    def metric(logits):
        last = logits[:, -1]
        return (last[rows, task.answer[:, 0]] - last[rows, task.wrong[:, 0]]).mean()

    return metric


def runners(model, task):
    """Each method: a function returning its numbers, ``{name: tensor}`` of mean patched metrics."""
    from transformer_lens.patching import get_act_patch_attn_head_out_all_pos, get_act_patch_attn_head_out_by_pos

    import interp

    metric = logit_diff(task)
    is_z = lambda name: name.endswith("attn.hook_z")  # noqa: E731

    def clean_cache():
        with torch.no_grad():
            return model.run_with_cache(task.clean, names_filter=is_z)[1]

    def tl_all_pos():
        cache = clean_cache()
        with torch.no_grad():
            out = get_act_patch_attn_head_out_all_pos(model, task.corrupted, cache, metric)
        return {"all_pos": out}  # [layer, head]

    def tl_by_pos():
        cache = clean_cache()
        with torch.no_grad():
            out = get_act_patch_attn_head_out_by_pos(model, task.corrupted, cache, metric)
        return {"by_pos": out.permute(0, 2, 1)}  # [layer, pos, head] -> [layer, head, pos]

    def tl_attribution():
        cache = clean_cache()
        acts, grads = {}, {}

        layer = lambda hook: int(hook.name.split(".")[1])  # noqa: E731  (the bridge names hook_z attn.o.hook_in)

        def keep_act(act, hook):
            acts[layer(hook)] = act.detach()

        def keep_grad(grad, hook):
            grads[layer(hook)] = grad.detach()

        model.reset_hooks()
        model.add_hook(is_z, keep_act, "fwd")
        model.add_hook(is_z, keep_grad, "bwd")
        try:
            value = metric(model(task.corrupted))
            value.backward()
        finally:
            model.reset_hooks()
            model.zero_grad(set_to_none=True)
        L = model.cfg.n_layers
        # (clean - corrupted) . d metric / d z: [layer, batch, pos, head]
        attr = torch.stack(
            [((cache[f"blocks.{l}.attn.hook_z"] - acts[l]) * grads[l]).sum(-1).sum(0) for l in range(L)]
        )  # [layer, pos, head]
        base = float(value)
        return {"all_pos": base + attr.sum(1), "by_pos": base + attr.permute(0, 2, 1)}

    def ours(method: str, by: str):
        def run():
            scores = interp.patch_heads(model, task, method=method, by=by)
            return {"all_pos" if by == "head" else "by_pos": torch.as_tensor(scores.grid("metric_patched"))}

        return run

    return {
        "tl_all_pos": tl_all_pos,
        "ours_all_pos": ours("exact", "head"),
        "tl_by_pos": tl_by_pos,
        "ours_by_pos": ours("exact", "position"),
        "tl_attribution": tl_attribution,
        "ours_attribution_all_pos": ours("attribution", "head"),
        "ours_attribution_by_pos": ours("attribution", "position"),
    }


def build(args):
    model = random_gpt2(args.layers)
    task = ioi_shaped(model, args.pairs, args.seed)
    return model, task


def measure(args) -> None:
    """Child process: build the model, warm up, run one method; print its times and peak, save its numbers."""
    torch.set_num_threads(args.threads)
    model, task = build(args)
    run = runners(model, task)[args._method]
    with torch.no_grad():  # lazy initialisation is nobody's cost
        model(task.clean)
    wall, cpu = time.perf_counter(), time.process_time()
    out, peak = peak_growth(run)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    torch.save({k: v.detach().float().cpu() for k, v in out.items()}, args._save)
    print(json.dumps({"method": args._method, "seconds": wall, "cpu_seconds": cpu, "peak_mb": peak / 2**20}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=12, help="blocks of the GPT-2-small architecture (12: the full model)")
    p.add_argument("--pairs", type=int, default=50, help="IOI-shaped clean/corrupted pairs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--methods", default=",".join(METHODS), help="which methods to run (comma-separated)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--_method", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_save", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._method:
        measure(args)
        return
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        p.error(f"unknown methods {unknown}: choose from {list(METHODS)}")

    torch.set_num_threads(args.threads)
    model, task = build(args)
    L, H, T = model.cfg.n_layers, model.cfg.n_heads, task.seq_len
    full = args.layers == 12 and args.pairs == 50
    print(
        f"GPT-2-small architecture, random weights: {L} layers x {H} heads, d_model {model.cfg.d_model}, vocab "
        f"{model.cfg.d_vocab}; {task.n_pairs} IOI-shaped pairs of {T} tokens; {args.threads} CPU thread(s); "
        f"denoising, logit difference at the last position"
        + ("" if full else "\nREDUCED setting (the full one is --layers 12 --pairs 50)")
    )
    print(f"patches: {L * H} per head (all positions), {L * H * T} per head and position")
    del model
    load_before = os.getloadavg()[0]
    rows, numbers = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-patching-") as tmp:
        for m in methods:
            save = str(Path(tmp) / f"{m}.pt")
            cmd = [sys.executable, __file__, "--_method", m, "--_save", save]
            cmd += ["--layers", str(args.layers), "--pairs", str(args.pairs), "--seed", str(args.seed)]
            cmd += ["--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(OMP_NUM_THREADS=str(args.threads)))
            if done.returncode != 0:
                print(f"{m}: failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
                continue
            rows[m] = json.loads(done.stdout.strip().splitlines()[-1])
            numbers[m] = torch.load(save)
            print(f"  {m}: {rows[m]['seconds']:.2f}s wall, {rows[m]['peak_mb']:.0f} MB peak", flush=True)

    print(f"\n{'method':<26}{'wall (s)':>10}{'cpu (s)':>10}{'peak MB':>10}")
    for m, r in rows.items():
        print(f"{m:<26}{r['seconds']:>10.2f}{r['cpu_seconds']:>10.2f}{r['peak_mb']:>10.1f}")

    comparisons = [
        ("exact per head / TransformerLens loop", "ours_all_pos", "tl_all_pos", "all_pos"),
        ("exact per position / TransformerLens loop", "ours_by_pos", "tl_by_pos", "by_pos"),
        ("attribution / exact", "ours_attribution_all_pos", "ours_all_pos", None),
        ("attribution per position / exact", "ours_attribution_by_pos", "ours_by_pos", None),
        ("attribution / TransformerLens recipe", "ours_attribution_all_pos", "tl_attribution", "all_pos"),
        ("attribution per position / TransformerLens recipe", "ours_attribution_by_pos", "tl_attribution", "by_pos"),
    ]
    print(f"\n{'ratio':<50}{'wall':>8}{'cpu':>8}{'peak':>8}{'target':>10}{'max |diff|':>12}")
    results = []
    for label, a, b, key in comparisons:
        if a not in rows or b not in rows:
            continue
        ra, rb = rows[a], rows[b]
        wall, cpu = ra["seconds"] / rb["seconds"], ra["cpu_seconds"] / rb["cpu_seconds"]
        peak = ra["peak_mb"] / max(rb["peak_mb"], 1e-9)
        diff = None
        if key is not None:
            mine, theirs = numbers[a][key], numbers[b][key]
            if key == "by_pos":  # ours leaves positions after the read position unrun (0); IOI reads the last
                theirs = theirs[..., : mine.shape[-1]]
            diff = float((mine - theirs).abs().max())
        target = TARGETS.get(label)
        print(
            f"{label:<50}{wall:>8.3f}{cpu:>8.3f}{peak:>8.2f}{'' if target is None else f'<= {target:.3f}':>10}"
            f"{'' if diff is None else f'{diff:.1e}':>12}"
        )
        results.append({"ratio": label, "wall": wall, "cpu": cpu, "peak": peak, "target": target, "max_abs_diff": diff})
    print(
        f"\n(max |diff|: the mean patched logit difference per patch; the metric's scale here: clean-corrupted "
        f"values of order 1)\n1-minute load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after "
        "(other work on the machine skews wall times; CPU times much less)"
    )
    for r in results:
        if r["target"] is not None:
            print(f"{r['ratio']}: target {'met' if r['cpu'] <= r['target'] else 'NOT met'} on CPU time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "layers": L,
                    "heads": H,
                    "pairs": task.n_pairs,
                    "seq_len": T,
                    "threads": args.threads,
                    "full": full,
                    "methods": rows,
                    "ratios": results,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
