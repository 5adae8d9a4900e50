"""A long-context toy with known answers: hand-set weights, planted heads, learned positions.

:func:`planted_model` builds a 2-layer attention-only :class:`~interp.toy.model.ToyTransformer`
(no LayerNorm, so every weight means exactly what it says) whose heads are, at any length up to
``n_ctx`` (default 32769 = 32K + BOS):

====== ================== ============================================================================
head   planted as         pattern
====== ================== ============================================================================
0.0    previous-token     query ``p`` attends to key ``p - 1`` (essentially all its mass); it copies
                          the previous token's identity into the *prev* subspace of the residual
0.1    streaming          sink + recent window: half the mass on the first position (BOS), half on
                          the query itself (a window of one key); writes nothing
1.0    retrieval          induction / retrieval: query token ``t`` attends to the keys whose previous
                          token is ``t`` (the position right after an earlier occurrence of ``t``), i.e.
                          to the needle token being copied; it writes that token into the *copy*
                          subspace, which the unembedding reads, so the model predicts the copy
others silent             zero weights: uniform attention over the visible keys, no output
====== ================== ============================================================================

How it stays exact at 32K:

- **Token identity** is one-hot: the vocabulary is small (``d_vocab`` tokens, 64 by default, token
  0 is BOS) and the residual holds three ``d_vocab``-wide one-hot subspaces (current token, previous
  token, copied token).
- **Positions** (learned, set by hand): each position ``p`` carries a code ``P_p`` of ``n_freqs``
  (cos, sin) pairs at fixed incommensurate frequencies ``w_f`` in (0, pi), so
  ``P_q . P_k = sum_f cos(w_f (q - k))``; this is ``n_freqs`` when ``q = k`` and at most
  ``pos_overlap * n_freqs`` for any other pair within the context (``pos_overlap`` ~ 0.52 for 32
  frequencies over 64K offsets; computed, not assumed, and stored on the model). The previous-token
  query is the code rotated back by one step, ``P_{p-1}``, a linear map of ``P_p``. Every position
  also carries a constant 1 and position 0 a *sink* flag.
- **Hard softmax**: every planted head's scores put its targets at least ``gap`` logits above every
  other key (60 by default; ``log(32768)`` is only 10.4), so the mass off target is below
  ``T * exp(-gap)``. :func:`planted_model` refuses a context where the position codes cannot give
  that margin.

The streaming head's score is ``beta`` on BOS and on the query itself, and at most
``beta * pos_overlap`` elsewhere: the BOS term is ``beta * (1 - code(p) . P_0 / n_freqs)`` from a
query coordinate read off the constant and the code, plus the code's own ``beta * P_p . P_0 /
n_freqs``, so it is exactly ``beta`` at every ``p``.

Note for classification: the previous-token head also keeps all its mass on the sink + recent window
(its one key, ``p - 1``, is always recent), so by the s + w definition it is a streaming head too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from interp.toy.model import ToyConfig, ToyTransformer

PREV_TOKEN = (0, 0)
STREAMING = (0, 1)
RETRIEVAL = (1, 0)


@dataclass(frozen=True)
class Layout:
    """Where each subspace lives in the residual stream."""

    d_vocab: int
    n_freqs: int

    @property
    def token(self) -> slice:
        return slice(0, self.d_vocab)

    @property
    def prev(self) -> slice:
        return slice(self.d_vocab, 2 * self.d_vocab)

    @property
    def copy(self) -> slice:
        return slice(2 * self.d_vocab, 3 * self.d_vocab)

    @property
    def pos(self) -> slice:
        start = 3 * self.d_vocab
        return slice(start, start + 2 * self.n_freqs)

    @property
    def const(self) -> int:
        return 3 * self.d_vocab + 2 * self.n_freqs

    @property
    def sink(self) -> int:
        return self.const + 1

    @property
    def d_model(self) -> int:
        return self.sink + 1


def position_frequencies(n_freqs: int, seed: int = 0) -> torch.Tensor:
    """``n_freqs`` frequencies spread over (0, pi) with a seeded jitter (float64)."""
    gen = torch.Generator().manual_seed(seed)
    f = torch.arange(n_freqs, dtype=torch.float64)
    return math.pi * (f + 0.5) / n_freqs * 0.9 + 0.05 * torch.rand(n_freqs, generator=gen, dtype=torch.float64)


def position_codes(n_ctx: int, freqs: torch.Tensor) -> torch.Tensor:
    """``[n_ctx, 2 * n_freqs]``: (cos, sin) of ``w_f * p`` for each frequency, interleaved."""
    angle = torch.arange(n_ctx, dtype=torch.float64)[:, None] * freqs[None]
    return torch.stack([angle.cos(), angle.sin()], dim=-1).flatten(1)


def position_overlap(n_ctx: int, freqs: torch.Tensor, chunk: int = 8192) -> float:
    """``max over 0 < |d| < n_ctx of mean_f cos(w_f d)``: how alike two different position codes get."""
    worst = -1.0
    for start in range(1, n_ctx, chunk):
        d = torch.arange(start, min(start + chunk, n_ctx), dtype=torch.float64)
        worst = max(worst, float(torch.cos(d[:, None] * freqs[None]).mean(1).max()))
    return worst


def planted_model(
    n_ctx: int = 32768 + 1,
    *,
    d_vocab: int = 64,
    n_heads: int = 4,
    n_freqs: int = 32,
    gap: float = 60.0,
    seed: int = 0,
    use_flash: bool = True,
    flash_impl: str = "sdpa",
) -> ToyTransformer:
    """The known-answer model described in the module docstring, in eval mode, float32 on CPU.

    Heads 0.0 (previous-token), 0.1 (streaming: sink + self) and 1.0 (retrieval / induction) are
    planted; every other head (``n_heads >= 2``) is silent. ``gap`` is the least logit margin of
    each planted head's targets over every other key. ``model.planted`` maps head -> role and
    ``model.pos_overlap`` holds the measured position-code overlap. ``flash_impl`` is the toy's
    fused attention when nothing hooks the pattern: torch's ``sdpa`` by default (linear memory, and
    on a CPU about 8x faster at 4K tokens than the blockwise reference, which matters at 32K).
    """
    if n_heads < 2:
        raise ValueError(f"the planted model needs n_heads >= 2, got {n_heads}")
    if d_vocab < 4:
        raise ValueError(f"d_vocab must be >= 4, got {d_vocab}")
    lay = Layout(d_vocab, n_freqs)
    freqs = position_frequencies(n_freqs, seed)
    overlap = position_overlap(n_ctx, freqs)
    if overlap > 0.8:
        raise ValueError(
            f"{n_freqs} position frequencies cannot keep {n_ctx} positions apart (overlap {overlap:.2f}): raise n_freqs"
        )
    d_head = max(d_vocab, 2 * n_freqs + 1)
    cfg = ToyConfig(
        n_layers=2,
        d_model=lay.d_model,
        n_heads=n_heads,
        d_head=d_head,
        n_ctx=n_ctx,
        d_vocab=d_vocab,
        attn_only=True,
        normalization_type=None,
        use_flash=use_flash,
        flash_impl=flash_impl,
        model_name="planted",
    )
    model = ToyTransformer(cfg)
    alpha = gap / (1.0 - overlap)  # code match n_freqs vs at most overlap * n_freqs elsewhere
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.weight[:, lay.token] = torch.eye(d_vocab)
        pos = torch.zeros(n_ctx, lay.d_model, dtype=torch.float64)
        pos[:, lay.pos] = position_codes(n_ctx, freqs)
        pos[:, lay.const] = 1.0
        pos[0, lay.sink] = 1.0
        model.pos_embed.weight.copy_(pos.float())
        root = d_head**0.5  # undo the 1 / sqrt(d_head) the attention applies
        _plant_previous(model, lay, freqs, alpha * root)
        _plant_streaming(model, lay, alpha * root)  # beta = alpha: the same margin over the codes
        _plant_retrieval(model, lay, gap * root)  # one-hot match 1 vs 0
        model.unembed.weight[:, lay.copy] = torch.eye(d_vocab) * gap
    model.planted = {PREV_TOKEN: "prev_token", STREAMING: "streaming", RETRIEVAL: "retrieval"}
    model.pos_overlap = overlap
    model.layout = lay
    return model.eval()


def _blank(model: ToyTransformer, layer: int, head: int) -> tuple[torch.Tensor, ...]:
    """Writable ``[d_model, d_head]`` views of one head's W_Q, W_K, W_V and its ``[d_head, d_model]`` W_O.

    The fused ``W_qkv`` (rows ``[q heads | k heads | v heads]``, each ``d_head`` rows per head) and
    ``W_out`` (columns per head) are sliced, so writing into the views sets the model's weights.
    """
    attn = model.blocks[layer].attn
    n, d = attn.n_heads, attn.d_head
    rows = lambda block: slice((block * n + head) * d, (block * n + head + 1) * d)
    w = attn.W_qkv.weight  # [3 * n * d, d_model]
    q, k, v = (w[rows(i)].T for i in range(3))  # transposes of slices: views into the weight
    o = attn.W_out.weight[:, head * d : (head + 1) * d].T
    return q, k, v, o


def _plant_previous(model: ToyTransformer, lay: Layout, freqs: torch.Tensor, scale: float) -> None:
    """Head 0.0, previous-token: q = P_{p-1} (the code rotated back one step), k = P_k; v = token,
    o -> prev. ``scale``: the logit margin per code match, times sqrt(d_head)."""
    n_freqs, d_vocab = lay.n_freqs, lay.d_vocab
    q, k, v, o = _blank(model, 0, PREV_TOKEN[1])
    cos, sin = freqs.cos(), freqs.sin()
    back = torch.zeros(2 * n_freqs, 2 * n_freqs, dtype=torch.float64)  # code(p) @ back = code(p - 1)
    for f in range(n_freqs):
        c, s = 2 * f, 2 * f + 1
        back[c, c], back[s, c] = cos[f], sin[f]  # cos(a - w) = cos a cos w + sin a sin w
        back[c, s], back[s, s] = -sin[f], cos[f]  # sin(a - w) = sin a cos w - cos a sin w
    q[lay.pos, : 2 * n_freqs] = (back * scale / n_freqs).float()
    k[lay.pos, : 2 * n_freqs] = torch.eye(2 * n_freqs)
    v[lay.token, :d_vocab] = torch.eye(d_vocab)
    o[:d_vocab, lay.prev] = torch.eye(d_vocab)


def _plant_streaming(model: ToyTransformer, lay: Layout, scale: float) -> None:
    """Head 0.1, streaming: ``beta`` on BOS and on the query itself, at most ``beta * overlap``
    elsewhere (``scale``: beta times sqrt(d_head)); writes nothing."""
    n_freqs = lay.n_freqs
    q, k, _, _ = _blank(model, 0, STREAMING[1])
    q[lay.pos, : 2 * n_freqs] = torch.eye(2 * n_freqs) * scale / n_freqs
    k[lay.pos, : 2 * n_freqs] = torch.eye(2 * n_freqs)
    sink_col = 2 * n_freqs
    q[lay.const, sink_col] = scale
    q[lay.pos.start : lay.pos.stop : 2, sink_col] = -scale / n_freqs  # minus code(p) . P_0
    k[lay.sink, sink_col] = 1.0


def _plant_retrieval(model: ToyTransformer, lay: Layout, scale: float) -> None:
    """Head 1.0, retrieval: q = current token, k = previous token; v = token, o -> copy (which the
    unembedding reads). ``scale``: the one-hot match's logit, times sqrt(d_head)."""
    d_vocab = lay.d_vocab
    q, k, v, o = _blank(model, 1, RETRIEVAL[1])
    q[lay.token, :d_vocab] = torch.eye(d_vocab) * scale
    k[lay.prev, :d_vocab] = torch.eye(d_vocab)
    v[lay.token, :d_vocab] = torch.eye(d_vocab)
    o[:d_vocab, lay.copy] = torch.eye(d_vocab)
