"""Q-, K- and V-composition between every pair of heads in different layers (Elhage et al. 2021).

A head's OV circuit ``W_OV = W_V W_O`` (``d_model x d_model``, row-vector convention: ``x W_V W_O``
is what it writes) feeds a later head through one of three inputs:

- **Q-composition**: into its queries, ``right = W_QK = W_Q W_K^T``;
- **K-composition**: into its keys, ``right = W_QK^T = W_K W_Q^T``;
- **V-composition**: into its values, ``right = W_OV`` of the later head.

The score of a pair is ``||W_OV(earlier) @ right(later)||_F / (||W_OV(earlier)||_F ||right(later)||_F)``,
exactly TransformerLens's ``all_composition_scores`` (``utils.composition_scores``), computed in
float64 from the factors without forming a ``d_model x d_model`` product per pair: with thin QR
factorisations ``A = Q_A R_A`` of the left factor and ``D^T = Q_D R_D`` of the right one,
``||A B C D||_F = ||R_A (B C) R_D^T||_F``. Pairs whose earlier head is not in an earlier layer are
not scored (TransformerLens writes 0 there; this table leaves them out).

**Baseline.** The score of random matrices of the same shapes: independent Gaussian factors
``W_V, W_O, W_Q, W_K`` shaped as the model's (the score is invariant to each factor's scale, so
matching their norms changes nothing), ``n_random`` draws per kind. Each pair's ``z`` is
``(score - mean) / sd`` of those draws, so a reader knows what "high" means.

What the score ignores: LayerNorm scales and biases (fold them first, as TransformerLens's
``fold_ln`` does, if they matter), the attention biases, and on rotary models the position-dependent
rotation between queries and keys (``W_Q W_K^T`` is the map at relative offset 0). Grouped
keys/values (GQA) are read per query head: the heads of a group share their ``W_K`` and ``W_V``.
Multi-head latent attention is refused (no per-head ``W_K``/``W_V``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.adapters import HookedModel, ModelInfo, describe
from interp.adapters.weights import HeadWeights, read_head_weights
from interp.config import RunConfig
from interp.errors import UsageError
from interp.progress import tqdm
from interp.registry import Registry
from interp.scores import Shown, load_table, save_table

if TYPE_CHECKING:
    import plotly.graph_objects as go

# the three kinds: which input of the later head the earlier head's output feeds
KINDS: Registry[str] = Registry("composition kind")
KINDS.add("Q", "the earlier head's output feeds the later head's queries (W_OV @ W_Q W_K^T)")
KINDS.add("K", "the earlier head's output feeds the later head's keys (W_OV @ W_K W_Q^T)")
KINDS.add("V", "the earlier head's output feeds the later head's values (W_OV @ W_OV)")
N_RANDOM = 200
STEM = "composition"


def _right_factors(w: HeadWeights, kind: str) -> tuple[Tensor, Tensor]:
    """The later head's matrix as two factors ``(C, D)``, ``C D`` of ``d_model x d_model``."""
    if kind == "Q":
        return w.W_Q, w.W_K.transpose(-1, -2)
    if kind == "K":
        return w.W_K, w.W_Q.transpose(-1, -2)
    return w.W_V, w.W_O


def _r(x: Float[Tensor, "... n d"]) -> Float[Tensor, "... d d"]:
    """``R`` of the thin QR factorisation: ``||x M||_F = ||R M||_F`` for ``x`` tall (``n >= d``)."""
    return torch.linalg.qr(x, mode="r").R


def pair_scores(
    A: Float[Tensor, "*left d_model d1"],
    B: Float[Tensor, "*left d1 d_model"],
    C: Float[Tensor, "*right d_model d2"],
    D: Float[Tensor, "*right d2 d_model"],
    *,
    budget: int = 1 << 28,
) -> Float[Tensor, "*left *right"]:
    """``||A B C D||_F / (||A B||_F ||C D||_F)`` for every (left, right) pair of leading indices;
    the ``[left, right, d1, d2]`` products are formed a block of right heads at a time, each within
    ``budget`` bytes."""
    RA, RD = _r(A), _r(D.transpose(-1, -2))
    left = RA @ B  # [*left, d1, d_model]
    right = C @ RD.transpose(-1, -2)  # [*right, d_model, d2]
    nl, nr = left.shape[:-2], right.shape[:-2]
    Lf = left.reshape(-1, *left.shape[-2:])
    Rf = right.reshape(-1, *right.shape[-2:])
    step = max(1, budget // (Lf.element_size() * Lf.shape[0] * Lf.shape[1] * Rf.shape[-1]))
    norms = []
    for start in range(0, Rf.shape[0], step):  # one batched GEMM over all pairs of this block
        norms.append(torch.einsum("aim,bmj->abij", Lf, Rf[start : start + step]).flatten(-2).norm(dim=-1))
    prod = torch.cat(norms, dim=1)
    score = prod / Lf.flatten(-2).norm(dim=-1)[:, None] / Rf.flatten(-2).norm(dim=-1)[None]
    return score.reshape(*nl, *nr)


def random_baseline(
    d_model: int, d_left: int, d_right: int, kind: str, *, n_random: int = N_RANDOM, seed: int = 0, chunk: int = 16
) -> Float[Tensor, " n_random"]:
    """The composition score of ``n_random`` pairs of random Gaussian heads of the given shapes
    (drawn ``chunk`` pairs at a time)."""
    g = torch.Generator().manual_seed(seed + "QKV".index(kind))
    d2 = d_left if kind == "V" else d_right
    out = []
    for start in range(0, n_random, chunk):
        n = min(chunk, n_random - start)
        draw = lambda *s: torch.randn(n, *s, generator=g, dtype=torch.float64)  # noqa: E731
        A, B, C, D = draw(d_model, d_left), draw(d_left, d_model), draw(d_model, d2), draw(d2, d_model)
        RA, RD = _r(A), _r(D.transpose(-1, -2))
        left, right = RA @ B, C @ RD.transpose(-1, -2)
        out.append(
            (left @ right).flatten(-2).norm(dim=-1) / left.flatten(-2).norm(dim=-1) / right.flatten(-2).norm(dim=-1)
        )
    return torch.cat(out)


def composition_grid(w: HeadWeights, kind: str) -> Float[Tensor, "layer head layer head"]:
    """Every head against every head (``[src layer, src head, dst layer, dst head]``), all layers;
    :func:`composition_scores` keeps the pairs whose source is in an earlier layer."""
    KINDS.check(kind)
    C, D = _right_factors(w, kind)
    return pair_scores(w.W_V, w.W_O, C, D)


@dataclass(repr=False)
class Compositions(Shown):
    """A row per (kind, earlier head, later head): score, baseline mean and sd, z-score."""

    table: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    shown_by = "score"

    def grid(self, kind: str) -> np.ndarray:
        """``[layer * head, layer * head]`` of one kind (rows: earlier head; NaN where not scored)."""
        KINDS.check(kind)
        n = int(self.meta["n_layers"]) * int(self.meta["n_heads"])
        H = int(self.meta["n_heads"])
        out = np.full((n, n), np.nan)
        t = self.table[self.table["kind"] == kind]
        out[t["src_layer"] * H + t["src_head"], t["dst_layer"] * H + t["dst_head"]] = t["score"]
        return out

    def strongest(self, kind: str, dst: tuple[int, int] | None = None, top: int = 5) -> pd.DataFrame:
        """The ``top`` pairs of ``kind`` by score (into head ``dst`` when given)."""
        t = self.table[self.table["kind"] == KINDS.check(kind)]
        if dst is not None:
            t = t[(t["dst_layer"] == dst[0]) & (t["dst_head"] == dst[1])]
        return t.sort_values("score", ascending=False, kind="mergesort").head(top)

    def figure(self, kinds: Sequence[str] = ("Q", "K", "V"), title: str | None = None) -> go.Figure:
        """One heatmap per kind: earlier head (rows) against later head (columns)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        H, L = int(self.meta["n_heads"]), int(self.meta["n_layers"])
        labels = [f"{l}.{h}" for l in range(L) for h in range(H)]
        fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[f"{k}-composition" for k in kinds])
        for i, kind in enumerate(kinds, start=1):
            fig.add_trace(
                go.Heatmap(z=self.grid(kind), x=labels, y=labels, coloraxis="coloraxis", name=kind), row=1, col=i
            )
            # heads are labels ("0.1" and "0.10" two ticks), never numbers on a linear axis
            fig.update_xaxes(title_text="later head", type="category", row=1, col=i)
            fig.update_yaxes(title_text="earlier head", type="category", autorange="reversed", row=1, col=i)
        fig.update_layout(title=title or f"composition scores: {self.meta.get('model', '')}", coloraxis={})
        return fig

    def save(self, out_dir: str | Path, stem: str = STEM, *, overwrite: bool = False) -> list[Path]:
        """``<stem>.csv`` and ``<stem>.json`` (rows and meta), each written atomically."""
        return save_table(out_dir, stem, STEM, self.table, self.meta, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | Path, stem: str = STEM) -> Compositions:
        return cls(*load_table(path, stem, "composition scores"))


def composition_scores(
    model: HookedModel,
    *,
    kinds: Sequence[str] = ("Q", "K", "V"),
    n_random: int = N_RANDOM,
    config: RunConfig | None = None,
) -> Compositions:
    """Q-, K- and V-composition of every pair of heads in different layers, each with its z-score
    against random heads of the same shapes (see the module docstring). ``progress``: say the
    sizes on stderr and show the progress a kind at a time (``config``: the seed and progress)."""
    cfg = RunConfig.of(config)
    seed, progress = cfg.seed, cfg.progress
    kinds = KINDS.check_all(kinds)
    if n_random < 2:
        raise UsageError(f"n_random must be at least 2 (a baseline needs a spread), got {n_random}")
    info = describe(model)
    w = read_head_weights(model, info, "the composition score")
    L, H = info.n_layers, info.n_heads
    layer = torch.arange(L)
    later = (layer[:, None] < layer[None, :])[:, None, :, None].expand(L, H, L, H)
    present = torch.zeros(L, dtype=torch.bool)
    present[list(info.attention_layers)] = True
    keep = later & present[:, None, None, None] & present[None, None, :, None]
    src_l, src_h, dst_l, dst_h = keep.nonzero().unbind(-1)
    frames, baselines = [], {}
    with torch.no_grad():
        n_heads = H * len(info.attention_layers)
        sizes = f"{n_heads} x {n_heads} head pairs x {len(kinds)} kind(s), {n_random} random pairs per baseline"
        for kind in tqdm(kinds, desc="composition", disable=not progress, unit="kind", sizes=sizes):
            grid = composition_grid(w, kind).cpu()
            base = random_baseline(info.d_model, w.W_V.shape[-1], w.W_Q.shape[-1], kind, n_random=n_random, seed=seed)
            mean, sd = float(base.mean()), float(base.std())
            baselines[kind] = {"mean": mean, "sd": sd}
            score = grid[keep].numpy()
            frames.append(
                pd.DataFrame(
                    {
                        "kind": kind,
                        "src_layer": src_l.numpy(),
                        "src_head": src_h.numpy(),
                        "dst_layer": dst_l.numpy(),
                        "dst_head": dst_h.numpy(),
                        "src": [f"{a}.{b}" for a, b in zip(src_l.tolist(), src_h.tolist())],
                        "dst": [f"{a}.{b}" for a, b in zip(dst_l.tolist(), dst_h.tolist())],
                        "score": score,
                        "baseline": mean,
                        "baseline_sd": sd,
                        "z": (score - mean) / sd,
                    }
                )
            )
    meta = {
        "kind": STEM,
        "model": info.name,
        "n_layers": L,
        "n_heads": H,
        "n_random": n_random,
        "seed": seed,
        "baselines": baselines,
        "notes": [
            "LayerNorm scales/biases and attention biases are not in the score (fold them first if they matter)",
            *w.notes(),
        ],
    }
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return Compositions(table, meta)


def composition_work(info: ModelInfo, kinds: Sequence[str] = ("Q", "K", "V")) -> tuple[str, float]:
    """What the composition scores are, with their sizes, and their work (multiply-adds, about
    ``d_head^2 x d_model`` a pair of heads and kind): an estimate to compare parts by, not a timing."""
    n_heads = info.n_heads * len(info.attention_layers)
    what = f"the composition scores ({n_heads} x {n_heads} head pairs, {'/'.join(kinds)})"
    return what, len(kinds) * n_heads * n_heads * info.d_head * info.d_head * info.d_model


__all__ = [
    "KINDS",
    "Compositions",
    "composition_grid",
    "composition_scores",
    "composition_work",
    "pair_scores",
    "random_baseline",
]
