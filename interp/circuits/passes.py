"""The gradient passes of edge attribution (:mod:`~interp.circuits.edges`): the forwards and
backwards each method takes, where it reads the receivers' gradients, and the contraction of those
gradients with the senders' output differences into per-pair edge scores.

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

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

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
from interp.hooks import mlp_out_hook, qkv_hook, resid_pre_hook, z_hook
from interp.patching.core import Setup
from interp.patching.graph import Graph
from interp.patching.post_norm import fold, layer_write, post_norms, sender_hooks
from interp.progress import tqdm
from interp.registry import Registry
from interp.results import plural
from interp.stream.capture import check_streamable, streamed_attention

CHUNK = 128  # positions per contraction

METHODS: Registry[str] = Registry("edge attribution method")
METHODS.add("eap", "the gradient at the run's own prompts: one forward of each prompt and one backward", steps=False)
METHODS.add(
    "eap-ig-inputs",
    "the gradient averaged over m points on the line from the donor's input embeddings to the run's own (k/m, k=0..m-1)",
    steps=True,
)
METHODS.add(
    "eap-ig-activations",
    "the gradient averaged over each node layer's output moved alone from the donor's value to its own (k/m, k=1..m)",
    steps=True,
)
METHODS.add("clean-corrupted", "the gradient averaged over the two prompts of each pair", steps=False)
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


class GradientPasses:
    """The forwards and backwards of one method, and the contraction of their gradients with the
    senders' output differences into per-pair edge scores."""

    def __init__(
        self, run: Setup, graph: Graph, method: str, steps: int, fused: bool = False, by_position: bool = False
    ):
        self.run, self.graph, self.method, self.steps = run, graph, method, steps
        self.by_position = by_position  # a score per edge and position, not summed over positions
        self.model, self.info = run.model, run.info
        w = read_head_weights(run.model, run.info, "edge attribution")
        dtype = next(iter(run.model.parameters())).dtype
        g = graph.shape.group
        self.posts = post_norms(run.model, run.info.n_layers)  # their gains folded into W_O
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
                scores, o, d = self._block(torch.arange(start, min(start + step, n)), bar.update)
                if self.by_position:  # [b, pos, sender, receiver] -> [b, edge, pos]
                    parts.append(scores.transpose(2, 3)[:, :, mask].transpose(1, 2).reshape(len(o), -1))
                else:
                    parts.append(scores.transpose(1, 2)[:, mask])
                own.append(o)
                donor.append(d)
        return torch.cat(parts), torch.cat(own).float(), torch.cat(donor).float()

    def passes(self) -> int:
        """Forwards and backwards per minibatch (each with a forward of the donor prompts)."""
        nodes = 1 + self.info.n_layers + len(self.graph.shape.mlp_layers)
        return {"eap": 1, "clean-corrupted": 2, "eap-ig-inputs": self.steps}.get(self.method, nodes * self.steps)

    def _block(self, rows: Tensor, done: Callable[[], Any]) -> tuple[Tensor, Tensor, Tensor]:
        probe = self.run.probe
        tokens = probe.tokens[rows.to(probe.tokens.device)]
        donor_tokens = probe.donor[rows.to(probe.donor.device)]
        with torch.no_grad():
            donor_out, donor_value = self._forward(donor_tokens, rows)
        total = self._zeros(len(rows))
        points = self._points(tokens, donor_tokens, list(donor_out))
        delta, own_value = None, None
        if METHODS.info(self.method, "steps"):  # no point is the own run unmoved: one plain forward of it
            with torch.no_grad():
                own_out, own_value = self._forward(tokens, rows)
            delta = {k: donor_out[k] - own_out[k] for k in donor_out}
        # else no point moves a sender toward the donor: its outputs serve the difference alone, which
        # the first pass (the own run, unmoved) takes in place (one set of sender outputs kept, not two)
        for toks, alpha, moved in points:
            minus = donor_out if delta is None else None
            with frozen(self.model):
                _, value, grads, norm_in = self._gradient_pass(toks, rows, donor_out, alpha, moved, minus)
            if delta is None:
                own_value, delta = value.detach(), donor_out
            total += self._contract(delta, grads, norm_in)
            done()
        return total / self.passes(), own_value.cpu(), donor_value.cpu()

    def _points(
        self, tokens: Tensor, donor_tokens: Tensor, nodes: list[str]
    ) -> Iterator[tuple[Tensor, float | None, tuple[str, ...]]]:
        """The :meth:`passes` points the gradient is averaged over, as EAP-IG takes them, one at a
        time (``steps`` may be large): (the prompts run, how far from the donor's value toward the own,
        which senders are moved). ``eap-ig-inputs``: the input at ``k / m`` for ``k = 0 .. m - 1``;
        ``eap-ig-activations``: each of the input, a layer's heads and a layer's MLP alone at ``k / m``
        for ``k = 1 .. m``. The eap-ig points never run the own prompts unmoved; the others do first."""
        m = self.steps
        if self.method == "eap":
            yield tokens, None, ()
        elif self.method == "clean-corrupted":
            yield from ((tokens, None, ()), (donor_tokens, None, ()))
        elif self.method == "eap-ig-inputs":
            yield from ((tokens, k / m, ("input",)) for k in range(m))
        else:
            yield from ((tokens, k / m, (node,)) for node in nodes for k in range(1, m + 1))

    def _sender_hooks(
        self, keep: dict[str, Tensor], minus: dict[str, Tensor] | None = None
    ) -> list[tuple[str, Callable]]:
        """Hooks keeping each sender's output in ``keep``; with ``minus``, subtracting it from
        ``minus``'s tensor in place instead (``keep`` then holds those differences)."""

        def put(key: str, x: Tensor) -> None:
            keep[key] = x if minus is None else minus[key].sub_(x.reshape(minus[key].shape))

        info = self.info
        return sender_hooks(self.posts, info.n_layers, info.n_heads, self.graph.shape.mlp_layers, put)

    def _toward(self, donor: dict[str, Tensor], key: str, alpha: float) -> tuple[str, Callable]:
        """The hook moving sender ``key``'s output to ``donor + alpha (own - donor)``: a post-normed
        layer's heads move together, as the norm's output (what the layer adds)."""
        l = int(key[1:]) if key[0] == "z" else -1
        if l in self.posts:
            return self.posts[l].output, _toward(layer_write(donor[key], self.W_O[l]), alpha)
        return _hook_name(key), _toward(donor[key], alpha)

    def _forward(self, tokens: Tensor, rows: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """A plain forward: every sender's output, and the metric per pair."""
        keep: dict[str, Tensor] = {}
        metric = self.run.metric
        with self._attention() as extra:
            out = read_out(self.model, tokens, metric, self._sender_hooks(keep) + extra, self.info.n_layers)
        return keep, metric(out, tokens, None, rows)

    def _attention(self) -> AbstractContextManager[list]:
        """Where :attr:`fused`, the model's attention runs fused (no ``[T, T]`` pattern is formed, its
        backward neither); the hooks the run must add."""
        return streamed_attention(self.model, lambda seen: None) if self.fused else nullcontext([])

    def _gradient_pass(
        self,
        tokens: Tensor,
        rows: Tensor,
        donor: dict[str, Tensor],
        alpha: float | None,
        moved: tuple[str, ...],
        minus: dict[str, Tensor] | None = None,
    ) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """One forward and backward: the senders' outputs (``minus``: subtracted from its tensors in
        place), the metric, the gradient at every receiver's input after its norm (``q{l}``, ``k{l}``,
        ``v{l}``, ``m{l}``, ``logits``) and every norm's input."""
        keep: dict[str, Tensor] = {}
        hooks = self._sender_hooks(keep, minus)
        if alpha is not None:  # the moved senders' outputs at donor + alpha (own - donor)
            hooks = [*hooks, *[self._toward(donor, k, alpha) for k in moved]]
        start: list[Tensor] = []  # the stream entering block 0, where the backward stops
        hooks.append((resid_pre_hook(0), _start(start)))
        grads: dict[str, Tensor] = {}
        seen: set[str] = set()
        for l in range(self.info.n_layers):
            hooks += [(qkv_hook(l, s), _watch(grads, seen, f"{s}{l}")) for s in "qkv"]
        norm_in: dict[str, Tensor] = {}
        norms = self.norms
        with ExitStack() as stack:
            for l in range(self.info.n_layers):
                norms.watch(stack, norms.heads[l], _grab_input(norm_in, f"ln1.{l}"))
            for l in norms.mlps:
                if not norms.shared(l):
                    norms.watch(stack, norms.mlps[l], _grab_input(norm_in, f"norm.m{l}"))
                hooks += norms.mlp_input(stack, l, _watch(grads, seen, f"m{l}"))
            hooks += norms.logits_input(stack, _watch(grads, seen, "logits"))
            norms.watch(stack, norms.final, _grab_input(norm_in, "ln_final"))
            with self._attention() as extra:
                out = read_out(self.model, tokens, self.run.metric, hooks + extra, self.info.n_layers, grad=True)
            value = self.run.metric(out, tokens, None, rows)
        names = self._expected(seen, norm_in)
        torch.autograd.grad(value.sum(), start)  # the receivers' tensor hooks keep their gradients
        unreached = [k for k in names if k not in grads]
        if unreached:
            raise UsageError(
                f"edge attribution cannot read {self.info.name}'s receiver inputs {unreached}: the metric does not "
                "depend on them through the hooks where they were read; this architecture is not supported yet"
            )
        b, T = tokens.shape  # OPT's blocks run their MLP (and its norm) on [batch * pos, d_model]
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
    hooks.append((resid_pre_hook(0), _start(start)))
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


def _hook_name(key: str) -> str:
    if key == "input":
        return resid_pre_hook(0)
    layer = key[1:]
    return z_hook(layer) if key[0] == "z" else mlp_out_hook(layer)


def _toward(donor: Tensor, alpha: float) -> Callable:
    """A hook putting its activation at ``donor + alpha (own - donor)``."""

    def hook(x: Tensor, hook: Any) -> Tensor:
        return donor.to(x.dtype) + alpha * (x - donor.to(x.dtype))

    return hook


def _start(start: list[Tensor]) -> Callable:
    """A hook making the stream entering block 0 the one tensor that requires grad (the weights are
    frozen): every activation after it is in the graph, and the backward stops there."""

    def hook(x: Tensor, hook: Any) -> Tensor:
        start.append(x.detach().requires_grad_(True))
        return start[-1]

    return hook


def _watch(grads: dict[str, Tensor], seen: set[str], key: str) -> Callable:
    """A hook that keeps its activation's gradient, when the backward reaches it, under ``key``
    (a tensor hook: the activation is not copied, nothing is added to the graph)."""

    def hook(x: Tensor, hook: Any) -> Tensor:
        seen.add(key)
        if not x.requires_grad:
            return x
        # a view of its own (no copy): where the model hands one tensor to attention and the MLP
        # (GPT-J's shared norm), the gradient kept is this reader's alone
        x = x.view_as(x)
        x.register_hook(lambda g: grads.__setitem__(key, g.detach()))
        return x

    return hook


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
