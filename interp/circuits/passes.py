"""The readout of edge attribution (:mod:`~interp.circuits.edges`) on the one gradient path
(:class:`interp.patching.attribution.Passes`: the methods' points and passes, node attribution's
too): where it reads the receivers' gradients, and the contraction of those gradients with the
senders' output differences into per-pair edge scores.

Memory stays O(T). The gradients are read at the receivers' own inputs, not at per-head copies of
the residual: an MLP's and the logits' at their input after the norm, a head's at its queries, keys
and values (``hook_q``, ``hook_k``, ``hook_v``, one per key/value head on GQA/MQA); each is carried
back to the residual before the norm through the head's ``W_Q``/``W_K``/``W_V`` and the norm's own
Jacobian (a vector-Jacobian product of the model's norm module, per chunk of positions), which is
what TransformerLens's ``use_split_qkv_input`` would give. Scores are accumulated over chunks of
positions as ``[pair, sender, receiver]`` sums; no per-edge per-position tensor is stored and no
pattern is asked for where the attention runs fused (:func:`fused_attention`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor

from interp import memory
from interp.ablation.gradient import frozen
from interp.ablation.replay import read_out
from interp.adapters import HookedModel, is_toy, run_with_reducers
from interp.adapters.receivers import ReceiverNorms
from interp.adapters.weights import read_head_weights
from interp.config import RunConfig
from interp.errors import UsageError
from interp.hooks import qkv_hook, resid_pre_hook, z_hook
from interp.patching.attribution import GRADIENT_METHODS, Passes, Point, begin, toward, watch
from interp.patching.core import Setup
from interp.patching.graph import Graph
from interp.patching.post_norm import fold, layer_write, post_norms
from interp.progress import tqdm
from interp.registry import Registry
from interp.results import plural
from interp.stream.capture import check_streamable, streamed_attention

CHUNK = 128  # positions per contraction

METHODS: Registry[str] = Registry("edge attribution method")
for _name in GRADIENT_METHODS:  # edge attribution's: every gradient method, defined once (Passes.points)
    METHODS.add(_name, GRADIENT_METHODS.doc(_name), steps=GRADIENT_METHODS.info(_name, "steps"))
METHODS.add(
    "exact",
    "every edge patched alone (its receiver reads the sender's donor output), one row of the batched replay each",
    steps=False,
)


def edge_memory(
    run: Setup, graph: Graph, steps: int, fused: bool = False, by_position: bool = False
) -> Callable[[int], memory.Estimate]:
    """Bytes edge attribution needs beyond the model: per minibatch, the model's forward and backward
    (the gradient pass; ``fused``: no ``[T, T]`` pattern in it), the donor's and the own sender outputs
    and every norm's input kept for the contraction, the receiver gradients, and one chunk's
    contraction; the per-pair scores for the run (``by_position``: per position too)."""
    info, n, T = run.info, run.task.n_pairs, run.task.seq_len
    shape = memory.Shape.of(run.model, info)
    n_read = memory.positions_read(run.metric, info, T)
    S, R, d = len(graph.senders), len(graph.receivers), info.d_model
    L, H = info.n_layers, info.n_heads
    per_token = d * (2 * (1 + 2 * L) + 2 * L + 1) + 3 * L * H * info.d_head  # outputs x2, norm inputs, q/k/v grads
    c = min(CHUNK, T)
    pos = T if by_position else 1

    def estimate(minibatch: int) -> memory.Estimate:
        b = min(minibatch, n)
        grad = memory.gradient_estimate(shape, T, b, n_read, fused=fused).per_forward
        work = shape.itemsize * b * (T * per_token + c * d * (S + 2 * 3 * H) + pos * S * R)
        kept = 8 * n * graph.n_edges * pos
        return memory.Estimate("edge attribution", kept, grad + work, b, "the per-pair edge scores")

    return estimate


class GradientPasses(Passes):
    """One method's passes (:class:`~interp.patching.attribution.Passes`) read at every receiver's
    input, and the contraction of those gradients with the senders' output differences into
    per-pair edge scores."""

    def __init__(
        self, run: Setup, graph: Graph, method: str, steps: int, fused: bool = False, by_position: bool = False
    ):
        posts = post_norms(run.model, run.info.n_layers)  # their gains folded into W_O
        super().__init__(run, method, steps, range(run.info.n_layers), graph.shape.mlp_layers, posts)
        self.graph = graph
        self.by_position = by_position  # a score per edge and position, not summed over positions
        w = read_head_weights(run.model, run.info, "edge attribution")
        dtype = next(iter(run.model.parameters())).dtype
        g = graph.shape.group
        self.W_Q = w.W_Q.to(dtype)  # [layer, head, d_model, d]
        self.W_O = fold(run.model, w.W_O.to(dtype), run.probe.tokens[:2], self.posts)
        self.W_K, self.W_V = w.W_K[:, ::g].to(dtype), w.W_V[:, ::g].to(dtype)  # one per key/value head
        self.norms = ReceiverNorms.of(run.model, graph.shape.mlp_layers)
        self.fused = fused  # the attention runs fused (fused_attention)

    def all_pairs(self, step: int) -> tuple[Float[Tensor, "pair edge"], Tensor, Tensor]:
        """Per-pair edge scores (in :meth:`Graph.table` order; :attr:`by_position`: each edge's
        positions in turn, ``[pair, edge * pos]``) and the metric of the own and donor prompts."""
        n = self.run.task.n_pairs
        parts, own, donor = [], [], []
        mask = self.graph.edges.T  # receiver-major, as the table
        starts = range(0, n, step)
        sizes = (
            f"{self.graph.describe()}; {plural(n, 'pair')} of {self.run.task.seq_len} tokens, {len(starts)} minibatch(es) "
            f"of {self.passes():,} forward and backward pass(es) each"
        )
        desc, on = f"edge attribution ({self.method})", self.run.config.progress
        with tqdm(total=len(starts) * self.passes(), desc=desc, disable=not on, sizes=sizes, unit="pass") as bar:
            for start in starts:  # the bar counts gradient passes: an integration's steps show as they go
                scores, o, d = self.block(torch.arange(start, min(start + step, n)), bar.update)
                if self.by_position:  # [b, pos, sender, receiver] -> [b, edge, pos]
                    parts.append(scores.transpose(2, 3)[:, :, mask].transpose(1, 2).reshape(len(o), -1))
                else:
                    parts.append(scores.transpose(1, 2)[:, mask])
                own.append(o)
                donor.append(d)
        return torch.cat(parts), torch.cat(own).float(), torch.cat(donor).float()

    def _toward(self, donor: dict[str, Tensor], key: str, alpha: float) -> tuple[str, Callable]:
        """The hook moving sender ``key``'s output to ``donor + alpha (own - donor)``: a post-normed
        layer's heads move together, as the norm's output (what the layer adds)."""
        l = int(key[1:]) if key[0] == "z" else -1
        if l in self.posts:
            return self.posts[l].output, toward(layer_write(donor[key], self.W_O[l]), alpha)
        return super()._toward(donor, key, alpha)

    def _attention(self) -> AbstractContextManager[list]:
        """Where :attr:`fused`, the model's attention runs fused (no ``[T, T]`` pattern is formed, its
        backward neither); the hooks the run must add."""
        return streamed_attention(self.model, lambda seen: None) if self.fused else nullcontext([])

    def _gradient_pass(
        self, point: Point, rows: Tensor, donor: dict[str, Tensor], minus: dict[str, Tensor] | None = None
    ) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """One forward and backward: the senders' outputs (``minus``: subtracted from its tensors in
        place), the metric, the gradient at every receiver's input after its norm (``q{l}``, ``k{l}``,
        ``v{l}``, ``m{l}``, ``logits``) and every norm's input."""
        keep: dict[str, Tensor] = {}
        hooks = self._sender_hooks(keep, minus)
        hooks += self._moves(donor, point)  # the moved senders' outputs at donor + alpha (own - donor)
        start: list[Tensor] = []  # the stream entering block 0, where the backward stops
        hooks.append((resid_pre_hook(0), begin(start)))
        grads: dict[str, Tensor] = {}
        seen: set[str] = set()
        for l in range(self.info.n_layers):
            hooks += [(qkv_hook(l, s), watch(grads, seen, f"{s}{l}")) for s in "qkv"]
        norm_in: dict[str, Tensor] = {}
        norms = self.norms
        with ExitStack() as stack:
            for l in range(self.info.n_layers):
                norms.watch(stack, norms.heads[l], _grab_input(norm_in, f"ln1.{l}"))
            for l in norms.mlps:
                if not norms.shared(l):
                    norms.watch(stack, norms.mlps[l], _grab_input(norm_in, f"norm.m{l}"))
                hooks += norms.mlp_input(stack, l, watch(grads, seen, f"m{l}"))
            hooks += norms.logits_input(stack, watch(grads, seen, "logits"))
            norms.watch(stack, norms.final, _grab_input(norm_in, "ln_final"))
            with self._attention() as extra:
                out = read_out(self.model, point.tokens, self.run.metric, hooks + extra, self.info.n_layers, grad=True)
            value = self.run.metric(out, point.tokens, None, rows)
        names = self._expected(seen, norm_in)
        torch.autograd.grad(value.sum(), start)  # the receivers' tensor hooks keep their gradients
        unreached = [k for k in names if k not in grads]
        if unreached:
            raise UsageError(
                f"edge attribution cannot read {self.info.name}'s receiver inputs {unreached}: the metric does not "
                "depend on them through the hooks where they were read; this architecture is not supported yet"
            )
        b, T = point.tokens.shape  # OPT's blocks run their MLP (and its norm) on [batch * pos, d_model]
        found = {k: _by_position(grads[k], b, T) for k in names}
        norm_in = {k: _by_position(x, b, T) for k, x in norm_in.items()}
        for l in self.graph.shape.mlp_layers:
            key = f"ln1.{l}" if self.norms.shared(l) else f"norm.m{l}"
            norm_in[f"norm.m{l}"] = norm_in[key]
        return keep, value, found, norm_in

    def _expected(self, seen: set[str], norm_in: dict[str, Tensor]) -> list[str]:
        """The receiver inputs a pass must have seen, refused by name where one never ran."""
        L = self.info.n_layers
        want = [f"{s}{l}" for l in range(L) for s in "qkv"] + [f"m{l}" for l in self.graph.shape.mlp_layers]
        norms = [f"ln1.{l}" for l in range(L)] + ["ln_final"]
        norms += [f"norm.m{l}" for l in self.norms.mlps if not self.norms.shared(l)]
        missing = [k for k in [*want, "logits"] if k not in seen] + [k for k in norms if k not in norm_in]
        if missing:
            raise UsageError(
                f"edge attribution cannot read {self.info.name}'s receiver inputs: {missing} never ran in its "
                "forward; this architecture is not supported yet"
            )
        return [*want, "logits"]

    def _contract(
        self, delta: dict[str, Tensor], grads: dict[str, Tensor], norm_in: dict[str, Tensor]
    ) -> Float[Tensor, "pair *pos sender receiver"]:
        """``sum over positions of delta_sender . dM/d(receiver input)`` for every (sender, receiver),
        in chunks of positions (:attr:`by_position`: each position's term apart)."""
        b, T = delta["input"].shape[:2]
        graph, norms = self.graph, self.norms
        total = self._zeros(b)
        for s in range(0, T, CHUNK):
            c = slice(s, min(s + CHUNK, T))
            into = total[:, c] if self.by_position else total
            D = self._sender_deltas(delta, c)  # [b, sender, c * d_model], in float64
            for l in range(self.info.n_layers):
                heads = self._head_cotangents(grads, l, c)  # [receiver, b, c, d_model]
                G = _through_norm(norms.heads[l], norm_in[f"ln1.{l}"][:, c], heads)
                self._add(into, D, G, graph.receivers_of(l)[: len(heads)])
                if l in norms.mlps:
                    G = _through_norm(norms.mlps[l], norm_in[f"norm.m{l}"][:, c], grads[f"m{l}"][None, :, c])
                    self._add(into, D, G, [graph.receivers_of(l)[-1]])
            G = _through_norm(norms.final, norm_in["ln_final"][:, c], grads["logits"][None, :, c])
            self._add(into, D, G, graph.receivers_of(self.info.n_layers))
        return total

    def _zeros(self, b: int) -> Float[Tensor, "pair *pos sender receiver"]:
        """A minibatch's scores, zero: ``[b, sender, receiver]``, with the positions after ``b`` where
        :attr:`by_position`."""
        pos = (self.run.task.seq_len,) if self.by_position else ()
        return torch.zeros(b, *pos, len(self.graph.senders), len(self.graph.receivers), dtype=torch.float64)

    def _add(
        self,
        total: Tensor,
        D: Float[Tensor, "pair sender cd"],
        G: Float[Tensor, "receiver pair c d"],
        receivers: list[int],
    ) -> None:
        """``total[:, s, r] += D[:, s] . G[r]`` for the senders upstream of ``receivers``: one batched
        product over the pairs, the senders a prefix of ``D``'s rows (no copy of them per group)."""
        n = self.graph.upstream(receivers[0])  # the receivers of one group read the same senders
        b = D.shape[0]
        if total.ndim == 4:  # [b, c, sender, receiver]: one product per pair and position
            r, _, c, d = G.shape
            by_position = D[:, :n].reshape(b, n, c, d).transpose(1, 2)  # [b, c, n, d]
            total[:, :, :n, receivers] += torch.matmul(by_position, G.double().permute(1, 2, 3, 0)).cpu()
            return
        by_pair = G.double().permute(1, 0, 2, 3).reshape(b, G.shape[0], -1)  # [b, receiver, c * d]
        total[:, :n, receivers] += torch.bmm(D[:, :n], by_pair.transpose(1, 2)).cpu()

    def _sender_deltas(self, delta: dict[str, Tensor], c: slice) -> Float[Tensor, "pair sender cd"]:
        """Each sender's output difference (donor - own) at positions ``c``, in :attr:`Graph.senders`
        order, as float64 rows of ``c * d_model`` (laid out once for every receiver group's product)."""
        cols = [delta["input"][:, None, c]]
        for l in range(self.info.n_layers):
            cols.append(einsum(delta[f"z{l}"][:, c], self.W_O[l], "b c h e, h e d -> b h c d"))
            if f"m{l}" in delta:
                cols.append(delta[f"m{l}"][:, None, c])
        D = torch.cat([x.double() for x in cols], dim=1)  # [b, sender, c, d]
        return D.reshape(*D.shape[:2], -1)

    def _head_cotangents(
        self, grads: dict[str, Tensor], l: int, c: slice
    ) -> Float[Tensor, "receiver pair pos d_model"]:
        """The gradient at layer ``l``'s norm output as each head's queries, keys and values read it:
        ``dM/dq_h W_Q_h^T`` and the same for keys and values (per key/value head), in receiver order."""
        q = einsum(grads[f"q{l}"][:, c], self.W_Q[l], "b c h e, h d e -> h b c d")
        k = einsum(grads[f"k{l}"][:, c], self.W_K[l], "b c h e, h d e -> h b c d")
        v = einsum(grads[f"v{l}"][:, c], self.W_V[l], "b c h e, h d e -> h b c d")
        return torch.cat([q, k, v])


def fused_attention(model: HookedModel, config: RunConfig, tokens: Tensor, graph: Graph) -> bool:
    """Does edge attribution run ``model``'s attention fused (the stream engine's capture: no
    ``[T, T]`` pattern, forward or backward, memory linear in ``T``)? Not where ``config.engine`` is
    ``"pattern"``, nor on the toy (its own fused path runs either way). Elsewhere only where a short
    forward and backward of ``tokens`` under the capture reaches every receiver's hook (a bridge that
    splits a joint q/k/v projection itself does not) and gives the model's own logits; else the
    model's own attention runs."""
    if config.engine == "pattern" or is_toy(model):
        return False
    try:
        check_streamable(model)
    except UsageError:
        return False
    L = graph.shape.n_layers
    names = [qkv_hook(l, s) for l in range(L) for s in "qkv"] + [z_hook(l) for l in range(L)]
    seen: set[str] = set()
    hooks = [(name, lambda x, hook, name=name: seen.add(name)) for name in names]  # hook.name: the bridge's own
    start: list[Tensor] = []
    hooks.append((resid_pre_hook(0), begin(start)))
    try:
        with torch.no_grad():
            want = run_with_reducers(model, tokens, [])
        with frozen(model), streamed_attention(model, lambda seen: None) as extra:
            got = run_with_reducers(model, tokens, hooks + extra, grad=True)
            torch.autograd.grad(got.float().sum(), start)
    except Exception:  # an attention the capture runs differently, or cannot differentiate
        return False
    scale = float(want.abs().max()) + 1e-6
    return seen >= set(names) and float((got.detach() - want).abs().max()) <= 1e-4 * scale


def _by_position(x: Tensor, b: int, T: int) -> Tensor:
    """``x`` as ``[batch, pos, ...]`` where a model flattened it to ``[batch * pos, d]``."""
    return x.reshape(b, T, *x.shape[1:]) if x.ndim == 2 and x.shape[0] == b * T else x


def _grab_input(keep: dict[str, Tensor], key: str) -> Callable[[Tensor], None]:
    def grab(x: Tensor) -> None:
        keep[key] = x.detach()

    return grab


def _through_norm(
    norm: torch.nn.Module, x: Float[Tensor, "pair pos d_model"], cotangents: Float[Tensor, "receiver pair pos d_model"]
) -> Float[Tensor, "receiver pair pos d_model"]:
    """The cotangents at ``norm``'s output carried to its input ``x``: the norm's own vector-Jacobian
    product, one per receiver (batched over receivers, the residual not copied)."""
    with torch.no_grad():  # the transform differentiates in x alone; the norm's weights stay out
        _, vjp = torch.func.vjp(norm, x)
        return torch.func.vmap(vjp)(cotangents.to(x.dtype))[0]


__all__ = ["CHUNK", "METHODS", "GradientPasses", "edge_memory", "fused_attention"]
