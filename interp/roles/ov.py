"""OV circuit roles from weights: copy suppression and successor heads.

Both read a head's *effective* OV circuit, from a token to the logits the head writes when it
attends to that token: ``F = W_EE W_V W_O W_U`` (``d_vocab x d_vocab``), where ``W_EE`` is the
effective embedding of McDougall et al. 2023, ``W_E + MLP0(W_E)`` (block 0's MLP after its own
norm, attention left out; ``W_E`` alone for an attention-only model). LayerNorm centering and gains
at the head's input and before the unembedding are not folded in (as in the copying score); a
row's positive scale never changes a rank, and the unembedding bias adds the same to every row.

- **copy suppression** (McDougall et al. 2023): the share of tokens whose own logit is among the
  ``k`` lowest of their row of ``F`` (the head, attending to a token, pushes that token down).
  Baseline: a random OV circuit ranks a token's own logit uniformly, so it scores ``k / V``.
- **successor** (Gould et al. 2023): over ordinal sequences the tokenizer holds as single tokens
  (numbers 1-100, days, months, letters, each with and without a leading space), the share of
  tokens whose row of ``F``, restricted to the tokens of their sequence, ranks the successor
  first. Baseline: a random ranking picks the successor ``1 / n`` of the time for a sequence of
  ``n`` single tokens, averaged over the scored pairs. Refused, saying so, when the tokenizer holds
  fewer than :data:`MIN_SUCCESSOR_PAIRS` such pairs (pass ``sequences`` of token ids instead).

Ties never count: a token's own logit is among the ``k`` lowest only when fewer than ``k`` other
tokens score as low or lower, and the successor ranks first only when it beats every other
candidate (a row of zeros is neither).

Each is registered in :data:`OV_SCORES`; :func:`ov_scores` computes any of them as a
:class:`~interp.scores.HeadScores` with a bootstrap interval over tokens and the baselines in
``meta["baselines"]``. Tokens are sampled (``max_tokens``, seeded) when the vocabulary is larger.
"""

from __future__ import annotations

import calendar
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.adapters import HookedModel, ModelInfo, describe
from interp.adapters.weights import HeadWeights, first_mlp, read_head_weights
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.probes import ordinary_vocab
from interp.progress import forward_work, tqdm
from interp.registry import Registry
from interp.scores import HeadScores, bootstrap_mean

K_LOWEST = 10
COLUMN_BLOCK = 1024  # vocabulary columns copy suppression reads per pass
MAX_TOKENS = 500
MIN_SUCCESSOR_PAIRS = 10
ORDINALS: dict[str, list[str]] = {
    "numbers": [str(i) for i in range(1, 101)],
    "days": list(calendar.day_name),
    "months": list(calendar.month_name)[1:],
    "letters": list(string.ascii_uppercase),
}


@dataclass(frozen=True)
class OVScore:
    """A head role read from the effective OV circuit: per (unit, head) hits, and the chance level."""

    hits: Callable[[OVContext], Float[Tensor, "unit layer head"]]
    baseline: Callable[[OVContext], float]
    unit: str  # what the score averages over (the bootstrap resamples these)


OV_SCORES: Registry[OVScore] = Registry("OV score")


@dataclass
class OVContext:
    """What the OV scores share: the weights, the effective embedding of the rows they read, the settings."""

    info: ModelInfo
    weights: HeadWeights
    model: HookedModel
    tokenizer: Any
    k: int
    tokens: Int[Tensor, " n"]  # the tokens copy suppression scores
    sequences: Mapping[str, Sequence[int]] | None
    progress: bool = False
    how: str | None = None  # which effective embedding the rows got (set by the first :meth:`embed`)

    def embed(self, rows: Int[Tensor, " n"]) -> Float[Tensor, "n d_model"]:
        """The effective embedding of ``rows`` only (:func:`effective_embedding`): a score never
        needs the whole vocabulary's."""
        x, self.how = effective_embedding(self.model, self.weights, rows)
        return x

    def image(self, rows: Int[Tensor, " n"], columns: Int[Tensor, " m"] | None = None) -> Tensor:
        """``F[rows][:, columns]`` for every head: ``[layer, head, n, m]`` (NaN for absent layers)."""
        w = self.weights
        x = self.embed(rows).float()  # [n, d_model]
        U = w.W_U.float() if columns is None else w.W_U[:, columns].float()
        xv = torch.einsum("nd,lhde->lhne", x, w.W_V.float())
        return torch.einsum("lhne,lhem,mv->lhnv", xv, w.W_O.float(), U)


def effective_embedding(
    model: HookedModel, w: HeadWeights, rows: Int[Tensor, " n"] | None = None
) -> tuple[Float[Tensor, "n d_model"], str]:
    """``W_E + MLP0(W_E)`` (McDougall et al.), or ``W_E`` for a model whose block 0 has no MLP;
    with a line saying which. ``rows``: of those tokens only (default: the whole vocabulary); the
    MLP reads each row alone, so a row's embedding does not depend on which others come with it."""
    E = w.W_E if rows is None else w.W_E[rows.to(w.W_E.device)]
    mlp, how = first_mlp(model, E)
    if mlp is None:
        return E, f"effective embedding: W_E ({how})"
    return E + mlp, f"effective embedding: W_E + MLP0(W_E) ({how}, attention left out)"


# --------------------------------------------------------------------------------------------
# copy suppression


def _copy_suppression_hits(ctx: OVContext, block: int | None = None) -> Tensor:
    """Per (token, layer, head): is the token's own logit among the ``k`` lowest of its row of ``F``?

    ``F = W_EE W_V W_O W_U`` has rank ``d_head``, and a row is decided as soon as ``k`` other logits
    are found as low as its own, so no ``[tokens, vocab]`` product is formed: each layer's rows
    (``C = x W_V W_O``, and the own logits ``C W_U[:, token]``) meet the vocabulary a block of
    columns at a time, and only the rows still undecided go on to the next block. A head with many
    such rows computes its block of ``F`` through the factors, ``(x W_V) (W_O W_U[:, block])``
    (``d_head x (d_model + rows)`` multiply-adds a column), one with few as ``C W_U[:, block]``
    (``d_model x rows``). The columns are visited in a fixed shuffled order (a vocabulary's own
    order sorts tokens by kind); the counts, and so the hits, do not depend on it (nor on ``block``,
    default :data:`COLUMN_BLOCK`)."""
    block = block or COLUMN_BLOCK
    w = ctx.weights
    L, H, d_model, d_head = w.W_V.shape
    n, V = len(ctx.tokens), w.W_U.shape[1]
    dev = w.W_U.device
    order = torch.randperm(V, generator=torch.Generator().manual_seed(0)).to(dev)
    place = torch.empty_like(order)
    place[order] = torch.arange(V, device=dev)  # column -> its place in the order
    U = w.W_U[:, order].float()  # [d_model, V], columns in the order visited
    tokens = ctx.tokens.to(dev)
    own_place = place[tokens]
    x = ctx.embed(tokens).float()  # [n, d_model]
    absent = torch.isnan(w.W_V).flatten(2).any(-1)  # [layer, head]: no softmax attention there
    hits = torch.full((L, H, n), float("nan"))
    sizes = f"{H * (~absent.all(-1)).sum()} heads x {n} tokens x {V} vocabulary, in blocks of {block}"
    for layer in tqdm(range(L), desc="copy suppression", disable=not ctx.progress, unit="layer", sizes=sizes):
        if absent[layer].all():
            continue
        A = torch.einsum("nd,hde->hne", x, w.W_V[layer].float())  # [head, n, d_head]
        W_O = w.W_O[layer].float()  # [head, d_head, d_model]
        C = torch.bmm(A, W_O).reshape(H * n, d_model)  # row h * n + t: token t through head h
        own = (C.view(H, n, d_model) * U[:, own_place].T).sum(-1).reshape(H * n)  # each row's own logit
        below = torch.zeros(H * n, dtype=torch.long, device=dev)  # other logits as low as the own one, or lower
        alive = torch.arange(H * n, device=dev)  # rows not yet decided
        for start in range(0, V, block):
            if not len(alive):
                break
            F = _logit_block(A, W_O, C, alive, U[:, start : start + block])
            at = own_place[alive % n] - start  # a row's own column is not one of the others
            inside = ((at >= 0) & (at < F.shape[1])).nonzero().squeeze(-1)
            F[inside, at[inside]] = float("inf")
            below[alive] += (F <= own[alive, None]).sum(-1)
            alive = alive[below[alive] < ctx.k]
        hits[layer] = (below < ctx.k).float().view(H, n).cpu()
    hits[absent.cpu()] = float("nan")
    return hits.permute(2, 0, 1)


def _logit_block(
    A: Float[Tensor, "head n d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
    C: Float[Tensor, "rows d_model"],
    alive: Int[Tensor, " alive"],
    U: Float[Tensor, "d_model block"],
) -> Float[Tensor, "alive block"]:
    """``F`` on the rows ``alive`` (sorted; row ``h * n + t``) and one block of columns, each head by
    the cheaper route: through the factors, or from its rows of ``C = A W_O``."""
    H, n, d_head = A.shape
    d_model = W_O.shape[-1]
    heads = alive // n
    counts = torch.bincount(heads, minlength=H).tolist()
    factor = [h for h in range(H) if counts[h] * (d_model - d_head) > d_head * d_model]
    F = U.new_empty(len(alive), U.shape[1])
    if len(factor) < sum(c > 0 for c in counts):  # the heads with few rows left: one product for them all
        mask = ~torch.isin(heads, torch.tensor(factor, dtype=heads.dtype, device=heads.device))
        F[mask] = C[alive[mask]] @ U
    if factor:
        OU = (W_O[factor].reshape(-1, d_model) @ U).view(len(factor), d_head, -1)  # [head, d_head, block]
        ends = torch.tensor(counts).cumsum(0).tolist()
        for i, h in enumerate(factor):
            lo, hi = ends[h] - counts[h], ends[h]
            F[lo:hi] = A[h, alive[lo:hi] % n] @ OU[i]
    return F


OV_SCORES.add(
    "copy_suppression",
    "share of tokens whose own logit is among the k lowest of the head's effective OV row (McDougall et al.)",
    OVScore(hits=_copy_suppression_hits, baseline=lambda ctx: ctx.k / ctx.info.d_vocab, unit="token"),
)


# --------------------------------------------------------------------------------------------
# successor heads


def ordinal_sequences(tokenizer: Any, d_vocab: int) -> dict[str, list[int]]:
    """The ordinal sequences of :data:`ORDINALS` as token ids, one per spelling (with and without a
    leading space); an item the tokenizer splits, or reads as a special (unknown) token, is ``-1``
    (its neighbours then do not pair)."""
    special = {int(t) for t in (getattr(tokenizer, "all_special_ids", None) or [])}
    found: dict[str, list[int]] = {}
    for name, words in ORDINALS.items():
        for prefix in ("", " "):
            ids = []
            for word in words:
                enc = tokenizer.encode(prefix + word, add_special_tokens=False)
                single = len(enc) == 1 and 0 <= int(enc[0]) < d_vocab and int(enc[0]) not in special
                ids.append(int(enc[0]) if single else -1)
            found[f"{name}{' (leading space)' if prefix else ''}"] = ids
    return found


def successor_pairs(
    sequences: Mapping[str, Sequence[int]],
) -> tuple[Int[Tensor, " n"], Int[Tensor, " n"], Bool[Tensor, "n d_vocab"] | list[list[int]]]:
    """``(token, successor, candidates)`` for every consecutive pair of single tokens (``-1``: not
    a single token); the candidates are the single tokens of the pair's sequence."""
    src, dst, cands = [], [], []
    seen = set()
    for ids in sequences.values():
        members = sorted({int(t) for t in ids if int(t) >= 0})
        for a, b in zip(ids, ids[1:]):
            if int(a) < 0 or int(b) < 0 or (int(a), int(b)) in seen or a == b:
                continue
            seen.add((int(a), int(b)))
            src.append(int(a))
            dst.append(int(b))
            cands.append(members)
    return torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long), cands


SEQUENCES_REMEDY = "pass sequences={name: [token ids in order]}"


def successor_refusal(
    info: ModelInfo, tokenizer: Any, sequences: Mapping[str, Sequence[int]] | None = None
) -> tuple[str, str] | None:
    """Why the successor score cannot be read here, and what would let it (None: it can): a model
    without a tokenizer and no ``sequences``, or a tokenizer with too few ordinal pairs. No weights
    are read."""
    if sequences is None and tokenizer is None:
        why = f"the successor score needs ordinal sequences of tokens, and {info.name} has no tokenizer"
        return why, SEQUENCES_REMEDY
    src, _, _ = successor_pairs(sequences if sequences is not None else ordinal_sequences(tokenizer, info.d_vocab))
    if len(src) < MIN_SUCCESSOR_PAIRS:
        why = (
            f"the successor score needs at least {MIN_SUCCESSOR_PAIRS} ordinal tokens whose successor is also a "
            f"single token (numbers 1-100, days, months, letters), and this tokenizer holds {len(src)}"
        )
        return why, f"{SEQUENCES_REMEDY} of your own"
    return None


def _successor_setup(ctx: OVContext) -> tuple[Tensor, Tensor, list[list[int]]]:
    refused = successor_refusal(ctx.info, ctx.tokenizer, ctx.sequences)
    if refused is not None:
        raise UsageError(": ".join(refused), params="sequences")
    sequences = ctx.sequences if ctx.sequences is not None else ordinal_sequences(ctx.tokenizer, ctx.info.d_vocab)
    return successor_pairs(sequences)


def _successor_hits(ctx: OVContext) -> Tensor:
    src, dst, cands = _successor_setup(ctx)
    out = []
    for a, b, members in zip(src.tolist(), dst.tolist(), cands):
        F = ctx.image(torch.tensor([a]), torch.tensor(members))[:, :, 0].cpu()  # [layer, head, m]
        succ = F[..., members.index(b)]
        hit = ((F >= succ[..., None]).sum(-1) == 1).float()  # strictly first: a tie is no hit
        hit[torch.isnan(F[..., 0]).cpu()] = float("nan")
        out.append(hit)
    return torch.stack(out)


def _successor_baseline(ctx: OVContext) -> float:
    _, _, cands = _successor_setup(ctx)
    return float(sum(1 / len(m) for m in cands) / len(cands))


OV_SCORES.add(
    "successor",
    "share of ordinal tokens whose effective OV row ranks their successor first in their sequence (Gould et al.)",
    OVScore(hits=_successor_hits, baseline=_successor_baseline, unit="ordinal pair"),
)


# --------------------------------------------------------------------------------------------
# together


def ov_work(info: ModelInfo, max_tokens: int = MAX_TOKENS) -> tuple[str, float]:
    """What the OV roles are, with their sizes, and their work at most (multiply-adds,
    :func:`interp.progress.forward_work`'s unit): the scored tokens through block 0, and each head's
    block of ``F`` through the factors for every row and column; a row decided early (most, on most
    heads) costs far less. An estimate to compare parts by, not a timing."""
    n_heads = info.n_heads * len(info.attention_layers)
    n = min(max_tokens, info.d_vocab)
    work = forward_work(n, 1, info.d_model) + n_heads * info.d_head * (info.d_model + n) * info.d_vocab
    return f"the OV roles ({n_heads} heads x {n} tokens x the vocabulary)", work


def ov_scores(
    model: HookedModel,
    scores: Sequence[str] = ("copy_suppression", "successor"),
    *,
    k: int = K_LOWEST,
    max_tokens: int = MAX_TOKENS,
    sequences: Mapping[str, Sequence[int]] | None = None,
    config: RunConfig | None = None,
) -> HeadScores:
    """The registered OV scores of every head, each with a bootstrap CI over its units (tokens,
    ordinal pairs) and its chance level in ``meta["baselines"]`` (see the module docstring).

    ``sequences``: ``{name: [token ids in order]}`` to score successors on instead of the
    tokenizer's ordinals (``-1`` marks an item that is not one token). ``progress``: copy
    suppression says its sizes on stderr and shows its progress a layer at a time (``config``: the
    bootstrap, seed and progress)."""
    cfg = RunConfig.of(config)
    n_boot, level, seed, progress = cfg.n_boot, cfg.level, cfg.seed, cfg.progress
    scores = OV_SCORES.check_all(scores)
    info = describe(model)
    if not 1 <= k < info.d_vocab:
        raise UsageError(f"k must be between 1 and the vocabulary size - 1 ({info.d_vocab - 1}), got {k}")
    w = read_head_weights(model, info, "the OV scores")
    ordinary = ordinary_vocab(info)
    gen = torch.Generator().manual_seed(seed)
    sampled = len(ordinary) > max_tokens
    tokens = ordinary[torch.randperm(len(ordinary), generator=gen)[:max_tokens].sort().values] if sampled else ordinary
    ctx = OVContext(info, w, model, getattr(model, "tokenizer", None), k, tokens, sequences, progress)
    grids: dict[str, Tensor] = {}
    baselines: dict[str, float] = {}
    units: dict[str, int] = {}
    with torch.no_grad():
        for name in scores:
            reg = OV_SCORES.get(name)
            hits = reg.hits(ctx)
            point, lo, hi = bootstrap_mean(hits, n_boot=n_boot, level=level, seed=seed)
            grids.update({name: point, f"{name}_lo": lo, f"{name}_hi": hi})
            baselines[name] = reg.baseline(ctx)
            units[name] = int(hits.shape[0])
    notes = [ctx.how, "LayerNorm centering and gains are not folded in", *w.notes()]
    if sampled:
        notes.append(f"copy suppression over {len(tokens)} tokens sampled (seed {seed}) of {len(ordinary)}")
    meta = run_header(info, kind="ov_scores", k=k, n_boot=n_boot, ci_level=level, seed=seed)
    meta.update(baselines=baselines, ci_units=units, notes=notes)
    return HeadScores.from_grids(grids, meta)


__all__ = [
    "COLUMN_BLOCK",
    "K_LOWEST",
    "MIN_SUCCESSOR_PAIRS",
    "ORDINALS",
    "OVScore",
    "OV_SCORES",
    "effective_embedding",
    "ordinal_sequences",
    "ov_scores",
    "ov_work",
    "successor_pairs",
    "successor_refusal",
]
