"""Benchmark: peak memory of the sink pass against ``run_with_cache``, by sequence length.

GPT-2-small architecture (GPT2Config() defaults: 12 layers x 12 heads, d_model 768), random weights
built in-process (no download), eager attention, on the TransformerBridge; one probe of BOS +
random tokens per length. Each call is measured in its own forked process:

- ``sinks``: ``interp.sinks.sink_scores`` (all of it: the hooked pass and the tables);
- ``sinks[1 layer]``: the same on a 1-layer model of the same width: what processing *one layer*
  costs (eager attention builds ``[batch, head, T, T]`` scores and patterns: it grows as ``T^2``);
- ``cache``: ``model.run_with_cache(tokens)`` under ``torch.no_grad()``, the usual way, which keeps
  every activation of every layer, the patterns among them;
- ``bare``: the forward pass the sink pass rides on, with no hook, stopped at the same point. The
  TransformerBridge keeps every layer's pattern on its attention module (``attn._pattern``), so
  this grows as ``layers x T^2`` too; the sink pass drops each one when its layer is done.

``sinks - sinks[1 layer]`` is what the sink pass keeps beyond the one layer being processed: it
must grow at most linearly in ``T`` (the statistics are ``O(layers x heads x T)``).

Peak memory is the process's resident-set high-water mark during the call, over its resident set
just before (Linux ``/proc/self/clear_refs`` resets the mark; ``VmHWM`` reads it), after a warm-up
call on a short probe, with glibc's mmap threshold fixed (see ``main``) so that the allocator's
history does not leak into the peaks. Differences of a MB or two are allocator noise.

    python analyses/bench_sinks.py             # GPT-2 small, T = 128 .. 1024 (about 2 minutes, 2 CPU cores)
    python analyses/bench_sinks.py --quick     # 4 layers, T = 64 .. 256 (under a minute)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys

import torch
from _common import can_reset_peak, peak_growth, random_gpt2

from interp.config import RunConfig

METHODS = ("sinks", "sinks[1 layer]", "cache", "bare")


class _Stop(Exception):
    pass


def _bare(model, tokens, last: str) -> None:
    """A plain forward stopped at ``last`` by one hook that raises: nothing else hooked."""

    def stop(x, hook):
        raise _Stop

    try:
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=[(last, stop)])
    except _Stop:
        pass


def run_method(method: str, model, probe) -> object:
    from interp.hooks import resid_post_hook
    from interp.sinks import sink_scores

    L = model.cfg.n_layers
    if method == "bare":  # no hook of ours (run_with_reducers would add the pattern-release hooks)
        return _bare(model, probe.tokens, resid_post_hook(L - 1))
    if method.startswith("sinks"):
        return sink_scores(model, probe, config=RunConfig(n_boot=100))
    with torch.no_grad():
        return model.run_with_cache(probe.tokens)


def measure(method: str, model, probe, warm) -> float:
    """Peak MB above the pre-call resident set of one call, measured in a forked child process.

    The child starts from the parent's state (model built, nothing run at this length), runs a
    warm-up call on a short probe, resets the high-water mark and makes the call; no measurement
    inherits the allocator's history of another method.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(read)
            run_method(method, model, warm)
            gc.collect()
            result, peak = peak_growth(lambda: run_method(method, model, probe))
            del result
            os.write(write, json.dumps({"peak_mb": peak / 2**20}).encode())
        except BaseException as e:  # report, never fall back into the parent's code
            os.write(write, json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        blob = json.loads(f.read() or '{"error": "the child died without a word"}')
    os.waitpid(pid, 0)
    if "error" in blob:
        raise RuntimeError(f"{method} at T={probe.seq_len} failed: {blob['error']}")
    return blob["peak_mb"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="4 layers, T = 64, 128, 256")
    p.add_argument("--lengths", default=None, help="comma-separated sequence lengths (with BOS)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=None, help="GPT-2 layers (default 12)")
    args = p.parse_args()
    if not can_reset_peak():
        sys.exit("this benchmark reads peak memory from Linux's /proc/self/{clear_refs,status}")
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # glibc raises its mmap threshold as large blocks are freed, after which freed tensors stay
        # resident and every peak depends on what ran before (+-20 MB here); a fixed threshold makes
        # each tensor over 64 KB its own mapping, returned on free. Restart with it set.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)
    # one thread: forked children must not inherit a live OpenMP pool (and the CPUs are shared)
    torch.set_num_threads(1)
    from interp.models import describe
    from interp.probes import random_tokens

    n_layer = args.layers if args.layers is not None else (4 if args.quick else None)
    default = "64,128,256" if args.quick else "128,256,512,1024"
    lengths = [int(t) for t in (args.lengths or default).split(",")]
    models = {"full": random_gpt2(n_layer), "one": random_gpt2(1)}
    for m in models.values():
        describe(m)
    warm = random_tokens(models["full"], batch=args.batch, seq_len=15, seed=1)
    L, H = models["full"].cfg.n_layers, models["full"].cfg.n_heads
    print(
        f"GPT-2 small architecture, {L} layers x {H} heads, random weights, batch {args.batch}; peak MB "
        "above the pre-call resident set, each call in its own forked process\n"
    )
    print(
        f"{'T':>5} {'sinks':>8} {'sinks[1L]':>9} {'beyond':>7} {'cache':>8} {'bare':>8} {'cache/sinks':>11} "
        f"{'1 pattern':>9} {'1 resid':>7}"
    )
    rows = []
    for T in lengths:
        probe = random_tokens(models["full"], batch=args.batch, seq_len=T - 1, seed=0)  # BOS + T - 1
        peaks = {m: measure(m, models["one" if "1 layer" in m else "full"], probe, warm) for m in METHODS}
        beyond = peaks["sinks"] - peaks["sinks[1 layer]"]
        one_pattern = args.batch * H * T * T * 4 / 2**20
        one_resid = args.batch * T * models["full"].cfg.d_model * 4 / 2**20
        rows.append((T, peaks, beyond))
        print(
            f"{T:5d} {peaks['sinks']:8.1f} {peaks['sinks[1 layer]']:9.1f} {beyond:7.1f} {peaks['cache']:8.1f} "
            f"{peaks['bare']:8.1f} {peaks['cache'] / max(peaks['sinks'], 1e-9):10.1f}x {one_pattern:9.1f} "
            f"{one_resid:7.1f}",
            flush=True,
        )
    print(
        "\n(beyond = sinks - sinks[1 layer]: what the sink pass keeps beyond the one layer being processed;"
        "\n 1 pattern = one layer's [batch, head, T, T] float32 pattern, quadratic in T;"
        " 1 resid = one [batch, T, d_model] residual, linear in T)"
    )
    print("growth from one length to the next (k in memory ~ T^k; 1 = linear, 2 = quadratic):")
    for (t0, p0, b0), (t1, p1, b1) in zip(rows, rows[1:]):
        k = lambda a, b: math.log(max(b, 1e-3) / max(a, 1e-3)) / math.log(t1 / t0)  # noqa: E731
        print(
            f"  {t0} -> {t1}: beyond {b0:.1f} -> {b1:.1f} MB (linear: x{t1 / t0:.0f}); k: sinks "
            f"{k(p0['sinks'], p1['sinks']):.2f}, cache {k(p0['cache'], p1['cache']):.2f}, bare "
            f"{k(p0['bare'], p1['bare']):.2f}"
        )
    t_max, p_max, b_max = rows[-1]
    print(
        f"\nat T={t_max}: run_with_cache peaks at {p_max['cache'] / p_max['sinks']:.1f}x the sink pass "
        f"({p_max['cache']:.0f} vs {p_max['sinks']:.0f} MB); the sink pass keeps {b_max:.1f} MB beyond one layer"
    )


if __name__ == "__main__":
    main()
