"""The gradient path of attribution, nodes and edges alike, and attribution patching per head.

:class:`Passes` runs one gradient method over a minibatch: a forward of the donor prompts keeping
every sender's output, then the method's points (:meth:`Passes.points`, the one definition of each
method), each a forward and backward whose readout is contracted with the outputs' differences
(donor - own) and averaged over the points. The readout is what differs: edge attribution
(:class:`interp.circuits.passes.GradientPasses`) reads the gradient at every receiver's input,
attribution patching (:class:`HeadPasses`, here) at each head's output.

Attribution patching estimates patching a head (its output ``z`` replaced by the donor prompt's
``r``) as ``(r - z) . dM/dz``, kept signed: ``-dM/dg`` for a gate ``g`` on ``r + g (z - r)``, ``g =
1`` being the unpatched run. Per position it keeps each position's term apart. Exact where the
metric is linear in the head's output (a last-layer head whose output reaches the logits without a
normalisation in between), an approximation elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from interp.ablation.gradient import frozen
from interp.ablation.replay import read_out, unembeds_read_positions
from interp.adapters.surgery import by_head
from interp.adapters.weights import NormSite
from interp.hooks import mlp_out_hook, resid_pre_hook, z_hook
from interp.patching.core import Setup, refuse_equal
from interp.patching.graph import shape_of
from interp.patching.post_norm import sender_hooks
from interp.progress import tqdm
from interp.registry import Registry
from interp.results import plural

# the gradient methods whose points (Passes.points) edge attribution and patching's heads share
GRADIENT_METHODS: Registry[str] = Registry("gradient method")
GRADIENT_METHODS.add(
    "eap", "the gradient at the run's own prompts: one forward of each prompt and one backward", steps=False
)
GRADIENT_METHODS.add(
    "eap-ig-inputs",
    "the gradient averaged over m points on the line from the donor's input embeddings to the run's own (k/m, k=0..m-1)",
    steps=True,
)
GRADIENT_METHODS.add(
    "eap-ig-activations",
    "the gradient averaged over each node layer's output moved alone from the donor's value to its own (k/m, k=1..m)",
    steps=True,
)
GRADIENT_METHODS.add("clean-corrupted", "the gradient averaged over the two prompts of each pair", steps=False)


@dataclass(frozen=True)
class Point:
    """One point a method's gradient is taken at: the prompts run, how far the moved senders' outputs
    are from the donor's toward the own (``None``: nothing moved), and which senders are moved."""

    tokens: Tensor
    alpha: float | None = None
    moved: tuple[str, ...] = ()


# the methods whose first point is the own prompts, unmoved: it gives the own outputs in place
OWN_FIRST = ("eap", "clean-corrupted", "eap-ig")


class Passes:
    """One gradient method's passes over a minibatch of pairs, for a readout given by a subclass:
    :meth:`_sender_hooks` (every sender's output), :meth:`_gradient_pass` (one forward and
    backward, and what it reads), :meth:`_contract` (that readout with the outputs' differences)
    and :meth:`_zeros` (a minibatch's scores, zero)."""

    read_positions = False  # the passes unembed the metric's positions alone (read_out)

    def __init__(
        self,
        run: Setup,
        method: str,
        steps: int,
        layers: Sequence[int],
        mlps: Sequence[int],
        posts: dict[int, NormSite] | None = None,
    ):
        self.run, self.method, self.steps = run, method, steps
        self.model, self.info = run.model, run.info
        # the senders kept: the input, the heads of ``layers`` (divided by a post-norm's scale where
        # ``posts`` has one), the MLPs of ``mlps``
        self.layers, self.mlps, self.posts = list(layers), tuple(mlps), dict(posts or {})

    def passes(self) -> int:
        """Forwards and backwards per minibatch (each with a forward of the donor prompts)."""
        moved_alone = 1 + len(self.layers) + len(self.mlps) if self.method == "eap-ig-activations" else 1
        return {"eap": 1, "clean-corrupted": 2}.get(self.method, self.steps * moved_alone)

    def block(self, rows: Tensor, done: Callable[[], Any]) -> tuple[Tensor, Tensor, Tensor]:
        """The scores of pairs ``rows`` averaged over the points, and the metric of their own and
        donor prompts; ``done()`` after each point."""
        probe = self.run.probe
        tokens = probe.tokens[rows.to(probe.tokens.device)]
        donor_tokens = probe.donor[rows.to(probe.donor.device)]
        with torch.no_grad():
            donor_out, donor_value = self._forward(donor_tokens, rows)
        total = self._zeros(len(rows))
        points = self.points(tokens, donor_tokens, list(donor_out))
        delta, own_value = None, None
        if self.method not in OWN_FIRST:  # no point is the own run unmoved: one plain forward of it
            with torch.no_grad():
                own_out, own_value = self._forward(tokens, rows)
            delta = {k: donor_out[k] - own_out[k] for k in donor_out}
        gates = self.method == "eap-ig"  # each point's own outputs: the gates' gradient
        # else the first point is the own run unmoved: its outputs serve the difference alone, taken in
        # place (one set of sender outputs kept, not two)
        for point in points:
            minus = donor_out if delta is None and not gates else None
            with frozen(self.model):
                keep, value, *readout = self._gradient_pass(point, rows, donor_out, minus)
            if own_value is None:
                own_value = value.detach()
            if gates:
                total += self._contract({k: donor_out[k] - keep[k] for k in keep}, *readout)
            else:
                delta = donor_out if delta is None else delta
                total += self._contract(delta, *readout)
            done()
        return total / self.passes(), own_value.cpu(), donor_value.cpu()

    def points(self, tokens: Tensor, donor_tokens: Tensor, nodes: list[str]) -> Iterator[Point]:
        """The :meth:`passes` points the gradient is averaged over, as EAP-IG takes them, one at a
        time (``steps`` may be large). ``eap``: the own prompts; ``clean-corrupted``: both prompts;
        ``eap-ig-inputs``: the input at ``k / m`` for ``k = 0 .. m - 1``; ``eap-ig-activations``: each
        of the senders in ``nodes`` (the input, a layer's heads, a layer's MLP) alone at ``k / m`` for
        ``k = 1 .. m``; ``eap-ig`` (patching's, at head granularity): every head at ``k / m``
        together, ``k = m .. 1``, the output each point's own (the gates' gradient, :class:`HeadPasses`)."""
        m = self.steps
        if self.method == "eap":
            yield Point(tokens)
        elif self.method == "clean-corrupted":
            yield from (Point(tokens), Point(donor_tokens))
        elif self.method == "eap-ig-inputs":
            yield from (Point(tokens, k / m, ("input",)) for k in range(m))
        elif self.method == "eap-ig":
            heads = tuple(n for n in nodes if n[0] == "z")
            yield Point(tokens)
            yield from (Point(tokens, k / m, heads) for k in range(m - 1, 0, -1))
        else:
            yield from (Point(tokens, k / m, (node,)) for node in nodes for k in range(1, m + 1))

    def _forward(self, tokens: Tensor, rows: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        """A plain forward: every sender's output, and the metric per pair."""
        keep: dict[str, Tensor] = {}
        metric = self.run.metric
        with self._attention() as extra:
            hooks = self._sender_hooks(keep) + extra
            out = read_out(self.model, tokens, metric, hooks, self.info.n_layers, read_positions=self.read_positions)
        return keep, metric(out, tokens, None, rows)

    def _attention(self) -> AbstractContextManager[list]:
        """The context the model's forwards run in, and the hooks they must add (none here)."""
        return nullcontext([])

    def _moves(self, donor: dict[str, Tensor], point: Point) -> list:
        """The hooks moving the point's senders to ``donor + alpha (own - donor)`` (none unmoved)."""
        return [] if point.alpha is None else [self._toward(donor, k, point.alpha) for k in point.moved]

    def _toward(self, donor: dict[str, Tensor], key: str, alpha: float) -> tuple[str, Callable]:
        """The hook moving sender ``key``'s output toward the donor's."""
        return hook_name(key), toward(donor[key], alpha)

    def _sender_hooks(self, keep: dict[str, Tensor], minus: dict[str, Tensor] | None = None) -> list:
        """Hooks keeping each sender's output in ``keep`` (:func:`~interp.patching.post_norm.sender_hooks`);
        with ``minus``, subtracting it from ``minus``'s tensor in place instead (``keep`` then holds
        those differences)."""

        def put(key: str, x: Tensor) -> None:
            keep[key] = x if minus is None else minus[key].sub_(x.reshape(minus[key].shape))

        L, H = self.info.n_layers, self.info.n_heads
        return sender_hooks(self.posts, L, H, self.mlps, put, layers=self.layers)

    def _gradient_pass(
        self, point: Point, rows: Tensor, donor: dict[str, Tensor], minus: dict[str, Tensor] | None = None
    ) -> tuple[Any, ...]:
        raise NotImplementedError

    def _contract(self, delta: dict[str, Tensor], *readout: Any) -> Tensor:
        raise NotImplementedError

    def _zeros(self, b: int) -> Tensor:
        raise NotImplementedError


class HeadPasses(Passes):
    """The readout of attribution patching: the gradient at each head's output (``hook_z``),
    contracted per head (and per position where :attr:`Setup.by` says) with its difference."""

    def __init__(self, run: Setup, method: str, steps: int, read_positions: bool):
        # a layer without attention has no hook_z; eap-ig-activations moves each MLP alone too, as for edges
        mlps = shape_of(run.model, run.info).mlp_layers if method == "eap-ig-activations" else ()
        super().__init__(run, method, steps, run.info.attention_layers, mlps)
        self.read_positions = read_positions

    def _gradient_pass(
        self, point: Point, rows: Tensor, donor: dict[str, Tensor], minus: dict[str, Tensor] | None = None
    ) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]:
        """One forward and backward: every head's output (``minus``: subtracted from its tensors in
        place), the metric, and the gradient at every head's output (``z{l}``, as the head reads it
        after any move)."""
        keep: dict[str, Tensor] = {}
        start: list[Tensor] = []
        grads: dict[str, Tensor] = {}
        hooks = [*self._sender_hooks(keep, minus), *self._moves(donor, point), (resid_pre_hook(0), begin(start))]
        hooks += [(z_hook(l), watch(grads, set(), f"z{l}")) for l in self.layers]
        n_layers, metric = self.info.n_layers, self.run.metric
        out = read_out(self.model, point.tokens, metric, hooks, n_layers, grad=True, read_positions=self.read_positions)
        value = metric(out, point.tokens, None, rows)
        torch.autograd.grad(value.sum(), start, allow_unused=True)
        return keep, value, {k: by_head(g, self.info.n_heads) for k, g in grads.items()}

    def _contract(self, delta: dict[str, Tensor], grads: dict[str, Tensor]) -> Tensor:
        """``delta_head . dM/dz_head`` per pair, layer and head, summed over positions unless by
        position (``[b, layer, head]`` or ``[b, layer, pos, head]``)."""
        b = delta[f"z{self.layers[0]}"].shape[0]
        total = self._zeros(b)
        for l in self.layers:
            if f"z{l}" in grads:  # else the metric does not depend on the layer's heads
                term = (delta[f"z{l}"].double() * grads[f"z{l}"].double()).sum(-1)  # [b, pos, head]
                total[:, l] = term if self.run.by == "position" else term.sum(1)
        return total

    def _zeros(self, b: int) -> Tensor:
        pos = (self.run.task.seq_len,) if self.run.by == "position" else ()
        return torch.zeros(b, self.info.n_layers, *pos, self.info.n_heads, dtype=torch.float64)


def attribution_values(
    run: Setup, *, method: str = "eap", steps: int = 1
) -> tuple[Float[Tensor, "unit pair"], dict[str, Any]]:
    """The estimated patched metric per unit (head, or head and position) and pair, by the gradient
    method ``method`` of :meth:`Passes.points` at ``steps`` points where it integrates.

    ``eap``: attribution patching, the gradient at the unpatched run (every gate 1). ``eap-ig``: EAP-IG
    at head granularity, the gradient averaged over every gate at ``k / m`` for ``k = 1 .. m`` (every
    head's output moved together along the straight line from its donor value to its own: integrated
    gradients of the head gates, whose sum over heads nears the effect of patching them all);
    ``eap-ig-inputs``, ``eap-ig-activations``, ``clean-corrupted``: edge attribution's methods, read at
    the heads (a head's score is the sum of its edges' where no norm rescales its output).

    The passes are :class:`Passes`' (the one gradient path, edges' too) with :class:`HeadPasses`'
    readout: per minibatch one forward of the donor prompts (their head outputs, and their metric) and
    the forwards and backwards of the method's points (the own prompts' metric from the first where it
    runs them unmoved, else from a plain forward of them). The run's baselines (``run.clean``,
    ``run.corrupted``) are set from them, refused when they agree
    (:func:`~interp.patching.core.refuse_equal`). Where the metric reads the logits at given positions
    only those are unembedded, once a sequence has shown that this gives the model's own logits
    (:func:`~interp.ablation.replay.unembeds_read_positions`)."""
    metric, probe = run.metric, run.probe
    read_positions = unembeds_read_positions(run.model, probe.tokens[:1], metric, run.info.n_layers)
    passes = HeadPasses(run, method, steps, read_positions)
    n, per = run.task.n_pairs, passes.passes()
    step = run.config.minibatch or n
    parts, own_values, donor_values = [], [], []
    starts = range(0, n, step)
    sizes = f"{plural(n, 'pair')}, {len(starts)} minibatch(es) of {per:,} forward and backward pass(es) each"
    named = "" if method == "eap" else f" ({method}{f', {steps} steps' if method.startswith('eap-ig') else ''})"
    bar = tqdm(
        total=len(starts) * per,
        desc=f"attribution patching{named}",
        disable=not run.config.progress or per == 1,
        sizes=sizes,
        unit="pass",
    )
    for start in starts:  # the bar counts passes: an integration's steps show as they go (one pass: no bar)
        delta, own, donor = passes.block(torch.arange(start, min(start + step, n)), bar.update)
        parts.append(delta.float())  # [b, L, H] or [b, L, T, H]
        own_values.append(own)
        donor_values.append(donor)
    bar.close()
    own, donor = torch.cat(own_values).float(), torch.cat(donor_values).float()
    run.clean, run.corrupted = (donor, own) if run.direction == "denoise" else (own, donor)
    refuse_equal(run.clean, run.corrupted, metric, run.normalised)
    delta = torch.cat(parts)
    if run.by == "position":
        delta = rearrange(delta, "b l t h -> b l h t")
    units = [delta[:, l, h] if p is None else delta[:, l, h, p] for l, h in run.heads for p in run.positions]
    values = run.unpatched[None] + torch.stack(units)
    minibatches = len(starts)
    plain = 0 if method in OWN_FIRST else minibatches  # a plain forward of the own prompts
    facts = {
        "forwards": per * minibatches + plain,
        "backwards": per * minibatches,
        "donor_forwards": minibatches,
        "passes": per,
        "unembedded": _unembedded(run, read_positions),
    }
    return values, {**facts, **({"steps": steps} if method.startswith("eap-ig") else {})}


def _unembedded(run: Setup, read_positions: bool) -> str:
    """Which positions the passes unembedded, for the result's meta."""
    return f"positions {list(run.metric.positions)}" if read_positions else "every position"


def hook_name(key: str) -> str:
    """The hook where sender ``key`` (``input``, ``z{l}``, ``m{l}``) writes its output."""
    if key == "input":
        return resid_pre_hook(0)
    layer = key[1:]
    return z_hook(layer) if key[0] == "z" else mlp_out_hook(layer)


def toward(donor: Tensor, alpha: float) -> Callable:
    """A hook putting its activation at ``donor + alpha (own - donor)``."""

    def hook(x: Tensor, hook: Any) -> Tensor:
        d = donor.to(x.dtype).reshape(x.shape)
        return d + alpha * (x - d)

    return hook


def begin(start: list[Tensor]) -> Callable:
    """A hook making the stream entering block 0 the one tensor that requires grad (the weights are
    frozen): every activation after it is in the graph, and the backward stops there."""

    def hook(x: Tensor, hook: Any) -> Tensor:
        start.append(x.detach().requires_grad_(True))
        return start[-1]

    return hook


def watch(grads: dict[str, Tensor], seen: set[str], key: str) -> Callable:
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


__all__ = [
    "GRADIENT_METHODS",
    "OWN_FIRST",
    "HeadPasses",
    "Passes",
    "Point",
    "attribution_values",
    "begin",
    "hook_name",
    "toward",
    "watch",
]
