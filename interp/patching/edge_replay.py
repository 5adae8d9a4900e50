"""The batched replay of edge patching (:mod:`~interp.patching.edge_patch`): the hooks of one forward
under ``rep`` interventions' codes, which keep each sender's actual output as the forward makes it
and shift each receiver's input by the senders it reads otherwise.

A receiver's input is the residual it would read plus, for each sender coded otherwise, that
sender's chosen output minus its actual one; each sender's difference is projected into the
residual once per forward and stacked per code. A receiver sums the fewer of the two sets: the
senders it reads under a code, or that code's running total over every upstream sender minus the
ones it does not (a circuit's cost follows its size, not the graph's; :meth:`Replay._shift`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor

from interp.ablation.replay import UnpatchedBatch
from interp.adapters.info import ModelInfo
from interp.adapters.receivers import ReceiverNorms
from interp.adapters.surgery import by_head
from interp.adapters.weights import NormSite
from interp.errors import AblationError
from interp.hooks import mlp_out_hook, qkv_hook, z_hook
from interp.patching.graph import Graph
from interp.patching.post_norm import scaled

ACTUAL, SOURCE, OWN = 0, 1, 2  # a receiver reads a sender as this run computes it, at the source's, at its own run's


@dataclass
class SenderValues:
    """Every sender's output on one minibatch, compactly: the stream entering block 0 (``input``),
    each layer's ``hook_z`` (a head's output is its slice times ``W_O``; where the layer's attention
    output passes through a norm, divided by its scale, :mod:`~interp.patching.post_norm`) and each
    MLP's output."""

    input: Float[Tensor, "batch pos d_model"]
    z: list[Float[Tensor, "batch pos head d_head"]]
    mlp: dict[int, Float[Tensor, "batch pos d_model"]]

    @staticmethod
    def mean(parts: list[SenderValues], sizes: list[int]) -> SenderValues:
        """The position-wise mean over every sequence of ``parts`` (minibatches of ``sizes`` rows)."""
        n = sum(sizes)

        def avg(xs: list[Tensor]) -> Tensor:
            return (sum(x.double().sum(0) for x in xs) / n).to(xs[0].dtype)[None]

        return SenderValues(
            avg([p.input for p in parts]),
            [avg([p.z[l] for p in parts]) for l in range(len(parts[0].z))],
            {l: avg([p.mlp[l] for p in parts]) for l in parts[0].mlp},
        )


@dataclass
class EdgeBatch(UnpatchedBatch):
    """A minibatch's unpatched pass, with every sender's output on its own prompts and on the source."""

    own: SenderValues | None = None
    source: SenderValues | None = None


class Patcher(Protocol):
    """What the replay reads of its sweeper (:class:`~interp.patching.edge_patch.EdgeSweeper`)."""

    model: Any
    info: ModelInfo
    graph: Graph
    layout: Layout
    norms: ReceiverNorms
    W: dict[str, Tensor]  # the q, k and v weights, one per key/value head for k and v
    W_O: Tensor  # [layer, head, d_head, d_model], a post-norm's gain folded in
    posts: dict[int, NormSite]  # the layers whose attention output passes through a norm
    metric: Any

    def sources(self, batch: EdgeBatch) -> SenderValues: ...


class Layout:
    """Where each sender and receiver sits: the senders of each node layer (a slice of
    :attr:`Graph.senders`), and each layer's receivers by site."""

    def __init__(self, graph: Graph):
        self.graph = graph
        s = graph.shape
        self.heads: dict[int, slice] = {}
        self.mlp: dict[int, int] = {}
        for i, node in enumerate(graph.senders):
            if node.kind == "head":
                cur = self.heads.get(node.layer)
                self.heads[node.layer] = slice(i if cur is None else cur.start, i + 1)
            elif node.kind == "mlp":
                self.mlp[node.layer] = i
        self.sites: dict[int, dict[str, list[int]]] = {}
        for l in range(s.n_layers + 1):
            by_site: dict[str, list[int]] = {}
            for r in graph.receivers_of(l):
                by_site.setdefault(graph.receivers[r].site, []).append(r)
            self.sites[l] = by_site


class Replay:
    """The hooks of one batched forward under ``codes`` (``rep`` interventions x the minibatch): they
    keep each sender's actual output as the forward makes it and shift each receiver's input."""

    def __init__(self, sweeper: Patcher, batch: EdgeBatch, codes: Tensor, start: int):
        self.sw, self.batch, self.start = sweeper, batch, start
        self.rep = codes.shape[0]
        self.b, self.T = batch.tokens.shape
        self.codes = codes.to(sweeper.info.device)
        self.own: SenderValues = batch.own
        self.source = sweeper.sources(batch)
        L = sweeper.info.n_layers
        # actual outputs: below the replay's first block they are the own run's
        self.z: list[Tensor | None] = [self._rep(self.own.z[l]) if l < start else None for l in range(L)]
        self.mlp: dict[int, Tensor | None] = {l: self._rep(v) if l < start else None for l, v in self.own.mlp.items()}
        self.x: dict[str, Tensor] = {}  # each norm's input, as the forward hands it
        self.stacked: dict[int, Tensor] = {}  # per code: every sender's difference (see _fill)
        self.filled: dict[int, set[int]] = {}  # per code: the sender groups filled so far
        self.totals: dict[int, tuple[int, Tensor]] = {}  # per code: n, the sum of the first n senders' differences
        self.inside = False
        self.hooks: list[tuple[str, Callable]] = []
        self._build()

    def _rep(self, x: Tensor) -> Tensor:
        return x.reshape(1, *x.shape).expand(self.rep, *x.shape)

    # ---- the hooks ----

    def _build(self) -> None:
        sw, L = self.sw, self.sw.info.n_layers
        touched = (self.codes != ACTUAL).any(0).any(0).cpu()  # [receiver]
        self.active = {l: any(bool(touched[r]) for r in sw.graph.receivers_of(l)) for l in range(L + 1)}
        for l in range(self.start, L):
            self.hooks.append((z_hook(l), self._keep_z(l)))
            if l in sw.posts:
                self.hooks.append((sw.posts[l].scale, self._scale_z(l)))
            if l in sw.graph.shape.mlp_layers:
                self.hooks.append((mlp_out_hook(l), self._keep_mlp(l)))
            if self.active[l]:
                self.hooks += [(qkv_hook(l, site), self._shift_head(l, site)) for site in "qkv"]

    def install(self, stack: ExitStack) -> None:
        sw, L, norms = self.sw, self.sw.info.n_layers, self.sw.norms
        mlp_hooks = []
        for l in range(self.start, L):
            if not self.active[l]:
                continue
            norms.watch(stack, norms.heads[l], self._norm_input(l, "ln1"))
            if l in norms.mlps and "mlp" in self.sw.layout.sites[l]:
                if not norms.shared(l):
                    norms.watch(stack, norms.mlps[l], self._norm_input(l, "ln2"))
                mlp_hooks += norms.mlp_input(stack, l, self._shift_mlp(l))
        if self.active[L]:
            norms.watch(stack, norms.final, self._shift_logits)
        stack.enter_context(sw.model.hooks(fwd_hooks=self.hooks + mlp_hooks))

    def _keep_z(self, l: int) -> Callable:
        def hook(z: Tensor, hook: Any) -> None:
            zz = by_head(z, self.sw.info.n_heads)
            self.z[l] = zz.reshape(self.rep, self.b, *zz.shape[1:])

        return hook

    def _scale_z(self, l: int) -> Callable:
        def hook(s: Tensor, hook: Any) -> None:  # the norm runs after the layer's heads: z is kept
            self.z[l] = scaled(self.z[l], s.reshape(self.rep, self.b, self.T, 1))

        return hook

    def _keep_mlp(self, l: int) -> Callable:
        def hook(m: Tensor, hook: Any) -> None:
            self.mlp[l] = m.reshape(self.rep, self.b, self.T, -1)

        return hook

    def _norm_input(self, l: int, which: str) -> Callable[[Tensor], None]:
        def keep(x: Tensor) -> None:
            if not self.inside:
                self.x[f"{which}.{l}"] = x

        return keep

    def _norm_of(self, norm: torch.nn.Module, x: Tensor, D: Tensor) -> Tensor:
        """``norm(x + D) - norm(x)`` per receiver, ``[rep, C, b, T, d]``: ``D`` is ``[rep, C, b, T, d]``,
        ``x`` ``[rep * b, T, d]`` (its norm formed once, not once per receiver)."""
        rep, C, b, T, d = D.shape
        moved = (x.reshape(rep, 1, b, T, d) + D).reshape(rep * C * b, T, d)
        self.inside = True
        try:
            return norm(moved).reshape(rep, C, b, T, d) - norm(x).reshape(rep, 1, b, T, d)
        finally:
            self.inside = False

    def _shift(self, receivers: list[int]) -> tuple[Tensor, Tensor] | None:
        """``(D, live)``: ``live``, the receivers (indices into ``receivers``) that some intervention
        shifts, and ``D``, ``[rep, C_live, b, T, d_model]``, for each of them the sum over its senders
        coded otherwise of (chosen output - actual output); ``None`` when nothing is.

        By corrections: where a receiver reads more than half its upstream senders under one code
        (a small circuit's receivers read nearly every sender at the source), its sum is that code's
        total over every upstream sender minus the senders it reads otherwise, so each receiver
        costs ``min(k, n_up - k)`` differences, not ``n_up``. Each code is one product per
        intervention of a ``[C, n_up]`` matrix of +-1 (sparse where few entries are set) with every
        upstream sender's difference, each difference and each total formed once per forward
        (:meth:`_fill`, :meth:`_total`)."""
        codes = self.codes[:, :, receivers]  # [rep, sender, C]
        if not bool((codes != ACTUAL).any()):
            return None
        n_up = self.sw.graph.upstream(receivers[0])
        live = (codes[:, :n_up] != ACTUAL).any(1).any(0).nonzero()[:, 0]  # receivers some intervention shifts
        codes = codes[:, :n_up, live]
        D = None
        for code in (SOURCE, OWN):
            m = codes == code  # [rep, n_up, C_live]
            k = m.sum(1)  # [rep, C_live]: the senders each receiver reads under this code
            if not bool(k.any()):
                continue
            flip = 2 * k > n_up  # cheaper as the total minus the rest
            summed = m ^ flip[:, None, :]  # the senders summed, with sign -1 where flipped
            used = summed.any(0).any(-1) | bool(flip.any())
            P = self._fill(code, used.cpu().numpy())  # [rep, sender, b * T * d]
            sign = torch.where(flip, -1.0, 1.0).to(P.dtype)  # [rep, C_live]
            weights = summed.transpose(1, 2).to(P.dtype) * sign[:, :, None]  # [rep, C_live, n_up]
            term = _products(weights, P[:, :n_up])  # [rep, C_live, b * T * d]
            if bool(flip.any()):
                term = term + flip[:, :, None].to(P.dtype) * self._total(code, n_up)[:, None]
            D = term if D is None else D + term
        rep, C = D.shape[:2]
        return D.reshape(rep, C, self.b, self.T, -1), live.to(D.device)

    def _total(self, code: int, n_up: int) -> Float[Tensor, "rep btd"]:
        """The sum of the first ``n_up`` senders' differences under ``code`` (every one filled),
        grown from the last sum formed this forward (receivers come in layer order, so ``n_up`` only
        grows; one sum is kept per code)."""
        P = self.stacked[code]
        below, total = self.totals.get(code, (0, None))
        if total is None or below > n_up:
            below, total = 0, torch.zeros_like(P[:, 0])
        if below < n_up:
            total = total + P[:, below:n_up].sum(1)
        self.totals[code] = (n_up, total)
        return total

    def _groups(self) -> Iterator[tuple[slice, Tensor | None, Tensor, Tensor, Tensor | None]]:
        """Each sender group (the input, one layer's heads, one MLP): its senders, their actual,
        source and own outputs and the heads' ``W_O``."""
        sw, lay, own, src = self.sw, self.sw.layout, self.own, self.source
        yield slice(0, 1), self._rep(own.input), src.input, own.input, None
        for l in range(sw.info.n_layers):
            yield lay.heads[l], self.z[l], src.z[l], own.z[l], sw.W_O[l]
            if l in lay.mlp:
                i = lay.mlp[l]
                yield slice(i, i + 1), self.mlp[l], src.mlp[l], own.mlp[l], None

    def _fill(self, code: int, used: np.ndarray) -> Tensor:
        """The differences (chosen - actual) of every sender as it enters the residual stream
        (through ``W_O`` for heads), ``[rep, sender, b * T * d_model]``, filled for the ``used``
        senders not yet filled: a sender's actual output is fixed once its layer has run, and every
        later receiver reads it, so each is computed once per forward. Below the replay's first
        block every copy holds the own run: one copy's difference stands for them all."""
        P = self.stacked.get(code)
        if P is None:
            d = self.sw.info.d_model
            dtype = self.own.input.dtype
            P = torch.zeros(
                self.rep, len(self.sw.graph.senders), self.b * self.T * d, dtype=dtype, device=self.codes.device
            )
            self.stacked[code] = P
        filled = self.filled.setdefault(code, set())
        for sl, actual, source, own_value, W_O in self._groups():
            if sl.start >= len(used):
                break
            if sl.start in filled or not used[sl].any():
                continue
            if actual is None:
                raise AblationError("edge patching read a sender before the forward computed it")
            chosen = source if code == SOURCE else own_value
            a = actual[:1] if actual.stride(0) == 0 else actual
            diff = chosen.to(a.dtype).expand(self.b, *chosen.shape[1:])[None] - a
            if W_O is None:  # [rep, b, T, d]: one sender
                diff = diff[..., None, :]
            else:
                diff = einsum(diff, W_O.to(a.dtype), "r b t h e, h e d -> r b t h d")
            P[:, sl] = diff.permute(0, 3, 1, 2, 4).reshape(diff.shape[0], diff.shape[3], -1).to(P.dtype)
            filled.add(sl.start)
        return P

    def _shift_head(self, l: int, site: str) -> Callable:
        receivers = self.sw.layout.sites[l].get(site, [])

        def hook(y: Tensor, hook: Any) -> Tensor:
            shifted = self._shift(receivers)
            if shifted is None:
                return y
            D, live = shifted
            x = self.x[f"ln1.{l}"]
            moved = self._norm_of(self.sw.norms.heads[l], x, D)  # [rep, C_live, b, T, d]
            W = self.sw.W[site][l][live.to(self.sw.W[site].device)].to(moved.dtype)
            change = einsum(moved, W, "r c b t d, c d e -> r b t c e")
            yy = by_head(y, len(receivers))
            change = change.reshape(yy.shape[0], *yy.shape[1:-2], len(live), yy.shape[-1]).to(yy.dtype)
            return yy.index_add(-2, live, change).reshape(y.shape)

        return hook

    def _shift_mlp(self, l: int) -> Callable:
        receivers = self.sw.layout.sites[l]["mlp"]

        def hook(y: Tensor, hook: Any) -> Tensor:
            if self.inside:
                return y
            shifted = self._shift(receivers)
            if shifted is None:
                return y
            norm = self.sw.norms.mlps[l]
            x = self.x.get(f"ln2.{l}", self.x.get(f"ln1.{l}"))
            moved = self._norm_of(norm, x.reshape(self.rep * self.b, self.T, -1), shifted[0])[:, 0]
            return y + moved.reshape(y.shape).to(y.dtype)

        return hook

    def _shift_logits(self, x: Tensor) -> Tensor | None:
        if self.inside:
            return None
        L = self.sw.info.n_layers
        shifted = self._shift(self.sw.layout.sites[L]["logits"])
        if shifted is None:
            return None
        d = shifted[0][:, 0].reshape(self.rep * self.b, self.T, -1)
        if x.shape[1] != self.T:  # the replay reads the metric's positions only
            d = self.sw.metric.read(d)
        return x + d.to(x.dtype)


DENSE_ROWS = 4  # a dense product costs about min(C, 4) sparse entries' work per sender (measured on CPUs)


def _products(weights: Float[Tensor, "rep C n"], P: Float[Tensor, "rep n btd"]) -> Float[Tensor, "rep C btd"]:
    """``weights @ P`` per intervention: sparse where that reads fewer of ``P``'s rows than the
    dense product's cost (a small circuit's receivers, or a large one's by its complement; always
    for one receiver), dense otherwise."""
    rep, C, n = weights.shape
    if weights.dtype not in (torch.float32, torch.float64) or weights.device.type != "cpu":
        return torch.bmm(weights, P)
    out = []
    for w, p in zip(weights, P):
        sparse = int(w.count_nonzero()) < n * min(C, DENSE_ROWS)
        out.append(torch.sparse.mm(w.to_sparse_coo(), p) if sparse else w @ p)
    return torch.stack(out)


__all__ = [
    "ACTUAL",
    "OWN",
    "SOURCE",
    "EdgeBatch",
    "Layout",
    "Patcher",
    "Replay",
    "SenderValues",
]
