"""Benchmark: the OV roles' copy suppression against the whole product it was first computed from.

GPT-2-small architecture (GPT2Config() defaults: 12 layers x 12 heads, d_model 768, d_head 64, vocab
50257), random weights built in-process (no download), at the atlas's sizes: 500 sampled tokens,
k = 10. Methods, in the same run, on one CPU thread by default:

- ``reference``: the score as it was first computed, written plainly: the effective embedding of the
  whole vocabulary (block 0's MLP on every token), then each head's ``[tokens, vocab]`` product
  ``F = W_EE W_V W_O W_U`` formed whole, a few rows at a time, and the own logit's count of others
  as low or lower;
- ``ours``: :func:`interp.roles.ov_scores` (copy suppression only), end to end: the effective
  embedding of the scored tokens only, ``F`` a block of vocabulary columns at a time through the
  factors or from ``x W_V W_O``, each row dropped once ``k`` other logits are found as low as its own.

How fast rows are decided depends on the weights, so ``ours`` also runs on a *planted* model whose
every head writes minus what it reads (``W_V = Q``, ``W_O = -Q^T``): every head a weak copy
suppressor, whose rows stay undecided longer (the reference's cost does not depend on the weights;
``--planted-reference`` measures it there too). The worst case, every row undecided to the last
column, costs ``d_head x (d_model + tokens)`` multiply-adds a column and head, a fifth of the
reference's ``tokens x d_model``. The scores are compared head by head: they are shares of tokens, so they
agree exactly unless a product's rounding (a few ulps, the products are associated differently)
moves a logit across the own one.

    python analyses/bench_ov.py            # full size (about 3 minutes on one CPU thread)
    python analyses/bench_ov.py --quick    # 2 layers, for a smoke run
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import GPT2_SMALL, gpt2_small, word_tokenizer


def model(n_layer: int, planted: bool):
    from interp.models import from_hf_model

    hf = gpt2_small(n_layer)
    if planted:  # every head writes minus what it reads: a copy suppressor of its own subspace
        d, H = GPT2_SMALL["n_embd"], GPT2_SMALL["n_head"]
        dh = d // H
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for block in hf.transformer.h:
                for h in range(H):
                    Q, _ = torch.linalg.qr(torch.randn(d, dh, generator=g))
                    block.attn.c_attn.weight[:, 2 * d + h * dh : 2 * d + (h + 1) * dh] = Q
                    block.attn.c_proj.weight[h * dh : (h + 1) * dh, :] = -Q.T
    vocab = GPT2_SMALL["vocab"]
    return from_hf_model(hf, word_tokenizer(vocab, special_id=vocab - 1), name="gpt2-small-random")


def reference(m, k: int = 10, max_tokens: int = 500, seed: int = 0, budget: int = 1 << 28) -> torch.Tensor:
    """``[layer, head]`` copy suppression from the whole product (float32), a few rows a pass."""
    from interp.adapters import describe
    from interp.adapters.weights import first_mlp, read_head_weights
    from interp.probes import ordinary_vocab

    info = describe(m)
    w = read_head_weights(m, info, "the reference")
    mlp, _ = first_mlp(m, w.W_E)
    embedding = w.W_E if mlp is None else w.W_E + mlp
    ordinary = ordinary_vocab(info)
    pick = torch.randperm(len(ordinary), generator=torch.Generator().manual_seed(seed))[:max_tokens]
    tokens = ordinary[pick.sort().values]
    L, H = w.W_V.shape[:2]
    rows = max(1, min(256, budget // (4 * L * H * info.d_vocab)))
    hits = []
    with torch.no_grad():
        for start in range(0, len(tokens), rows):
            t = tokens[start : start + rows]
            xv = torch.einsum("nd,lhde->lhne", embedding[t].float(), w.W_V.float())
            F = torch.einsum("lhne,lhem->lhnm", xv, w.W_O.float()) @ w.W_U.float()  # [layer, head, n, vocab]
            own = F.gather(-1, t[None, None, :, None].expand(L, H, len(t), 1))
            hits.append(((F <= own).sum(-1) - 1 < k).float())
    return torch.cat(hits, dim=-1).mean(-1)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 layers instead of 12")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--planted-reference", action="store_true", help="time the reference on the planted model too")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from interp.roles import ov_scores

    n_layer = 2 if args.quick else GPT2_SMALL["n_layer"]
    print(
        f"GPT-2 small's shape, random weights: {n_layer} layers x {GPT2_SMALL['n_head']} heads, d_model "
        f"{GPT2_SMALL['n_embd']}, d_head {GPT2_SMALL['n_embd'] // GPT2_SMALL['n_head']}, vocab "
        f"{GPT2_SMALL['vocab']}; copy suppression over 500 tokens, k = 10; {args.threads} thread(s)"
    )
    print(f"{'model':<10}{'method':<12}{'time s':>9}{'x ours':>9}{'score':>9}{'heads differing':>17}")
    for planted in (False, True):
        m = model(n_layer, planted)
        ours, t_ours = timed(lambda m=m: ov_scores(m, ["copy_suppression"], n_boot=1000))
        grid = torch.as_tensor(ours.grid("copy_suppression"))
        name = "planted" if planted else "random"
        print(f"{name:<10}{'ours':<12}{t_ours:>9.1f}{1:>9.2f}{grid.mean():>9.4f}{'':>17}")
        if planted and not args.planted_reference:
            continue
        want, t_ref = timed(lambda m=m: reference(m))
        differ = int(((grid - want).abs() > 1e-6).sum())
        print(f"{name:<10}{'reference':<12}{t_ref:>9.1f}{t_ref / t_ours:>9.2f}{want.mean():>9.4f}{differ:>17}")
        print(f"  largest score difference: {(grid - want).abs().max():.2e} (one token is {1 / 500:.0e})")


if __name__ == "__main__":
    main()
