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
from jaxtyping import Float
from torch import Tensor

from interp.ablation.language import UnpatchedBatch
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
    scratch: dict[Any, Tensor]  # buffers each forward reuses (see _zeroed)

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
        touched = (self.codes != ACTUAL).any(0).any(0)  # [receiver], or [receiver, pos] by position
        touched = touched.reshape(touched.shape[0], -1).any(1).cpu()
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

    def _norm_of(self, norm: Callable[[Tensor], Tensor], x: Tensor, D: Tensor) -> Tensor:
        """``norm(x + D) - norm(x)`` for one intervention's receivers, ``[C, b, T, d]``: ``D`` is
        ``[C, b, T, d]``, ``x`` ``[b, T, d]``. Formed one intervention at a time, so the norm's passes
        run over a block the caches hold, not over every intervention's at once."""
        C, b, T, d = D.shape
        moved = (x[None] + D).reshape(C * b, T, d)
        self.inside = True
        try:
            return norm(moved).reshape(C, b, T, d) - norm(x)[None]
        finally:
            self.inside = False

    def _shift(self, receivers: list[int]) -> Shift | None:
        """The shift of ``receivers``' inputs: ``live``, the receivers (indices into ``receivers``)
        that some intervention shifts, and per intervention (:meth:`Shift.of`), for each of them the
        sum over its senders coded otherwise of (chosen output - actual output); ``None`` when
        nothing is.

        By corrections: where a receiver reads more than half its upstream senders under one code
        (a small circuit's receivers read nearly every sender at the source), its sum is that code's
        total over every upstream sender minus the senders it reads otherwise, so each receiver
        costs ``min(k, n_up - k)`` differences, not ``n_up``. Each code is one product per
        intervention of a ``[C, n_up]`` matrix of +-1 (sparse where few entries are set) with every
        upstream sender's difference, each difference and each total formed once per forward
        (:meth:`_fill`, :meth:`_total`). Codes by position (``[rep, sender, receiver, pos]``, edges
        that hold at some positions only) choose the set per receiver and position."""
        codes = self.codes[:, :, receivers]  # [rep, sender, C] (, pos)
        if not bool((codes != ACTUAL).any()):
            return None
        n_up = self.sw.graph.upstream(receivers[0])
        live = (codes[:, :n_up] != ACTUAL).any(1).any(0)  # receivers some intervention shifts
        live = live.reshape(live.shape[0], -1).any(1).nonzero()[:, 0]
        codes = codes[:, :n_up, live]
        terms = []
        for code in (SOURCE, OWN):
            m = codes == code  # [rep, n_up, C_live] (, pos)
            k = m.sum(1)  # [rep, C_live] (, pos): the senders each receiver reads under this code
            if not bool(k.any()):
                continue
            flip = 2 * k > n_up  # cheaper as the total minus the rest
            summed = m ^ flip[:, None]  # the senders summed, with sign -1 where flipped
            used = summed.transpose(0, 1).reshape(n_up, -1).any(1) | bool(flip.any())
            P = self._fill(code, used.cpu().numpy())[:, :n_up]  # [rep, n_up, b * T * d]
            sign = torch.where(flip, -1.0, 1.0).to(P.dtype)  # [rep, C_live] (, pos)
            weights = summed.movedim(1, -1).to(P.dtype) * sign[..., None]  # [rep, C_live, (pos,) n_up]
            total = self._total(code, n_up) if bool(flip.any()) else None
            terms.append((weights, P, flip.to(P.dtype), total))
        return Shift(live.to(self.codes.device), terms, (self.b, self.T))

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
            shape = (self.rep, len(self.sw.graph.senders), self.b * self.T * self.sw.info.d_model)
            P = self.stacked[code] = _zeroed(self.sw.scratch, code, shape, self.own.input.dtype, self.codes.device)
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
                P[:, sl] = diff.reshape(diff.shape[0], 1, -1).to(P.dtype)
            else:  # each head's difference through its W_O, written in place
                _through(diff, W_O.to(P.dtype), P[:, sl])
            filled.add(sl.start)
        return P

    def _shift_head(self, l: int, site: str) -> Callable:
        receivers = self.sw.layout.sites[l].get(site, [])

        def hook(y: Tensor, hook: Any) -> Tensor:
            shift = self._shift(receivers)
            if shift is None:
                return y
            live = shift.live
            x = self.x[f"ln1.{l}"].reshape(self.rep, self.b, self.T, -1)
            norm = self.sw.norms.computed(self.sw.norms.heads[l])
            W = self.sw.W[site][l][live.to(self.sw.W[site].device)]
            yy = by_head(y, len(receivers))
            out = yy.reshape(self.rep, self.b, *yy.shape[1:]).clone()
            for r in range(self.rep):
                moved = self._norm_of(norm, x[r], shift.of(r))  # [C_live, b, T, d]
                C, b, T, d = moved.shape
                change = torch.bmm(moved.reshape(C, b * T, d), W.to(moved.dtype))  # [C_live, b * T, d_head]
                out[r].index_add_(-2, live, change.reshape(C, b, T, -1).permute(1, 2, 0, 3).to(out.dtype))
            return out.reshape(y.shape)

        return hook

    def _shift_mlp(self, l: int) -> Callable:
        receivers = self.sw.layout.sites[l]["mlp"]

        def hook(y: Tensor, hook: Any) -> Tensor:
            if self.inside:
                return y
            shift = self._shift(receivers)
            if shift is None:
                return y
            norm = self.sw.norms.computed(self.sw.norms.mlps[l])
            x = self.x.get(f"ln2.{l}", self.x.get(f"ln1.{l}")).reshape(self.rep, self.b, self.T, -1)
            out = y.reshape(self.rep, self.b, self.T, -1).clone()
            for r in range(self.rep):
                out[r] += self._norm_of(norm, x[r], shift.of(r))[0].to(out.dtype)
            return out.reshape(y.shape)

        return hook

    def _shift_logits(self, x: Tensor) -> Tensor | None:
        if self.inside:
            return None
        L = self.sw.info.n_layers
        shift = self._shift(self.sw.layout.sites[L]["logits"])
        if shift is None:
            return None
        d = torch.stack([shift.of(r)[0] for r in range(self.rep)]).reshape(self.rep * self.b, self.T, -1)
        if x.shape[1] != self.T:  # the replay reads the metric's positions only
            d = self.sw.metric.read(d)
        return x + d.to(x.dtype)


@dataclass
class Shift:
    """What :meth:`Replay._shift` leaves for one site: the receivers shifted (``live``) and, per code
    read, the ``[rep, C_live, n_up]`` weights (+-1; ``[rep, C_live, T, n_up]`` for codes by position)
    on the upstream senders' differences ``P`` (``[rep, n_up, b * T * d]``), which receivers take the
    code's total (``flip``) and that total."""

    live: Tensor
    terms: list[tuple[Tensor, Tensor, Tensor, Tensor | None]]
    shape: tuple[int, int]  # (b, T)

    def of(self, r: int) -> Float[Tensor, "C b T d"]:
        """Intervention ``r``'s shift of each live receiver's input."""
        b, T = self.shape
        D = None
        for weights, P, flip, total in self.terms:
            if weights.ndim == 4:  # by position: each position's own weights on the senders there
                term = _product_by_position(weights[r], P[r].reshape(P.shape[1], b, T, -1))
                if total is not None:
                    term = term + flip[r][:, None, :, None] * total[r].reshape(b, T, -1)[None]
            else:
                term = _product(weights[r], P[r])
                if total is not None:
                    term = term + flip[r][:, None] * total[r][None]
            D = term if D is None else D + term
        return D.reshape(D.shape[0], b, T, -1)


def _through(
    diff: Float[Tensor, "r b T head d_head"], W_O: Float[Tensor, "head d_head d"], into: Float[Tensor, "rep head btd"]
) -> None:
    """Each head's ``diff`` through its ``W_O``, written into ``into`` (one copy's, ``r == 1``, for
    every copy). ``diff`` is first laid out head by head: ``hook_z`` can come as a transposed view,
    on which a batched product would run several times slower."""
    r, b, T, h, e = diff.shape
    by_head = diff.permute(3, 0, 1, 2, 4).to(into.dtype).contiguous().reshape(h, r, b * T, e)
    rows = into[:r]
    for k in range(h):
        torch.bmm(by_head[k], W_O[k].expand(r, *W_O.shape[1:]), out=rows[:, k].view(r, b * T, -1))
    if r < into.shape[0]:
        into[r:] = rows


def _zeroed(scratch: dict, key: Any, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A zeroed ``shape`` tensor, kept in ``scratch`` under ``key`` for the next forward to zero again
    (each forward's differences are over a gigabyte on a real model: allocated afresh, their pages
    cost more than the products that read them)."""
    n = int(np.prod(shape))
    buf = scratch.get(key)
    if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
        scratch[key] = buf = torch.empty(n, dtype=dtype, device=device)
    return buf[:n].view(shape).zero_()


def _product_by_position(w: Float[Tensor, "C T n"], p: Float[Tensor, "n b T d"]) -> Float[Tensor, "C b T d"]:
    """Each position's ``w[:, t] @ p[:, :, t]``, read in place: one product per position batched over
    the sequences (an einsum lays ``p`` out afresh first, several times slower)."""
    C, T, _ = w.shape
    out = p.new_empty(C, p.shape[1], T, p.shape[3])
    for t in range(T):
        out[:, :, t] = torch.matmul(w[:, t], p[:, :, t].transpose(0, 1)).transpose(0, 1)
    return out


DENSE_ROWS = 2  # a dense product costs about min(C, 2) sparse entries' work per sender (measured on CPUs)


def _product(w: Float[Tensor, "C n"], p: Float[Tensor, "n btd"]) -> Float[Tensor, "C btd"]:
    """``w @ p``: sparse where that reads fewer of ``p``'s rows than the dense product's cost (a
    small circuit's receivers, or a large one's by its complement; always for one receiver), dense
    otherwise (and always off the CPU)."""
    C, n = w.shape
    if w.dtype not in (torch.float32, torch.float64) or w.device.type != "cpu":
        return w @ p
    sparse = int(w.count_nonzero()) < n * min(C, DENSE_ROWS)
    return torch.sparse.mm(w.to_sparse_coo(), p) if sparse else w @ p


__all__ = [
    "ACTUAL",
    "OWN",
    "SOURCE",
    "EdgeBatch",
    "Layout",
    "Patcher",
    "Replay",
    "SenderValues",
    "Shift",
]
