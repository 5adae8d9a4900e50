"""Patching edges, exactly: every receiver input of the graph reads every sender at a value chosen for it.

An intervention is a code per (sender, receiver) of the graph (:mod:`~interp.patching.graph`):

- ``ACTUAL`` (0): the receiver reads the sender's output as this run computes it (nothing changed);
- ``SOURCE`` (1): it reads the sender's output on the source (each pair's paired prompt, or their mean);
- ``OWN`` (2): it reads the sender's output on the unpatched run of its own prompt (frozen).

A receiver's input is the residual it would read plus, for each sender coded otherwise, that sender's
chosen output minus its actual one: a head's queries, keys or values are recomputed from its norm of
that input (``q + (norm(x + D) - norm(x)) W_Q``, one per key/value head on GQA/MQA), an MLP's input
from its norm, the logits' from the final norm's input. Exact patching of a node, a path and an edge
are all such codes: an edge alone is one ``SOURCE`` entry; a circuit is ``SOURCE`` on every edge
outside it; Wang et al.'s path from a sender to a receiver is ``SOURCE`` on the sender's edges into
the receiver and the MLPs between, ``OWN`` everywhere else below the receiver's layer (every other head
frozen), so one run stands for their two.

:class:`EdgeSweeper` evaluates many interventions as rows of the ablation sweep's batched replay
(:class:`~interp.ablation.replay.Sweeper`): blocks from the lowest layer an intervention reaches up,
``rep`` interventions batched, journaled, split over ``torchrun`` ranks, with its own self-check:
before any work the replay and a plain forward must give the model's own output with nothing
patched, the source's output with every edge patched (the run then reads the source alone), and the
same output as each other with one edge patched; a model where they differ is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from einops import einsum
from jaxtyping import Float, Int8
from torch import Tensor

from interp import memory
from interp.ablation.calls import expand_call
from interp.ablation.replay import CleanBatch, Sweeper, _rounding, read_out
from interp.adapters.surgery import by_head
from interp.adapters.weights import read_head_weights
from interp.errors import AblationError, UsageError
from interp.hooks import k_hook, q_hook, v_hook, z_hook
from interp.journal import Journal
from interp.patching.core import FEWER_PAIRS, Setup
from interp.patching.graph import Graph
from interp.patching.post_norm import fold, layer_write, post_norms, scaled
from interp.registry import Registry

ACTUAL, SOURCE, OWN = 0, 1, 2

SOURCES: Registry[str] = Registry("edge patching source")
SOURCES.add("patch", "each pair's paired prompt: the sender's output there (EAP-IG's 'patching')")
SOURCES.add("mean", "the sender's output averaged over every pair's paired prompt, position by position")


class Units:
    """The interventions :meth:`EdgeSweeper.evaluate` runs: how many, each one's codes (built when
    its batched forward comes, never all at once), the lowest layer it reaches and its journal key."""

    def __len__(self) -> int:
        raise NotImplementedError

    def codes(self, index: Sequence[int]) -> Int8[Tensor, "rep sender receiver"]:
        raise NotImplementedError

    def start(self, i: int) -> int:
        raise NotImplementedError

    def key(self, i: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, index: Sequence[int]) -> Tensor:  # what the sweep's rounds index
        return self.codes(list(index))


class CodeUnits(Units):
    """Interventions given as a ``[n, sender, receiver]`` code tensor (keys: a digest of each one's codes)."""

    def __init__(self, graph: Graph, codes: Int8[Tensor, "n sender receiver"]):
        self.graph, self.all = graph, codes.to(torch.int8)
        layers = torch.tensor([n.layer for n in graph.receivers])
        touched = (self.all != ACTUAL).any(1)  # [n, receiver]
        big = graph.shape.n_layers + 1
        self.starts = torch.where(touched, layers[None], torch.full_like(layers[None], big)).min(1).values

    def __len__(self) -> int:
        return self.all.shape[0]

    def codes(self, index: Sequence[int]) -> Tensor:
        return self.all[list(index)]

    def start(self, i: int) -> int:
        return int(self.starts[i])

    def key(self, i: int) -> Any:
        nz = self.all[i].nonzero()
        blob = torch.cat([nz, self.all[i][nz[:, 0], nz[:, 1]][:, None].long()], 1).numpy().tobytes()
        return hashlib.sha1(blob).hexdigest()


class EdgeUnits(Units):
    """Single edges, each patched alone (``SOURCE`` on that edge only), keyed by the edge's name."""

    def __init__(self, graph: Graph, edges: Sequence[tuple[int, int]]):
        self.graph, self.edges = graph, list(edges)

    def __len__(self) -> int:
        return len(self.edges)

    def codes(self, index: Sequence[int]) -> Tensor:
        out = torch.zeros(len(index), len(self.graph.senders), len(self.graph.receivers), dtype=torch.int8)
        for row, i in enumerate(index):
            s, r = self.edges[i]
            out[row, s, r] = SOURCE
        return out

    def start(self, i: int) -> int:
        return self.graph.receivers[self.edges[i][1]].layer

    def key(self, i: int) -> Any:
        s, r = self.edges[i]
        return f"{self.graph.senders[s].name}->{self.graph.receivers[r].name}"


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
class EdgeBatch(CleanBatch):
    """A minibatch's clean pass, with every sender's output on its own prompts and on the source."""

    own: SenderValues | None = None
    source: SenderValues | None = None


class EdgeSweeper(Sweeper):
    """Evaluate the metric under many edge interventions at once, on a task's pairs (``run``).

    ``source``: what a ``SOURCE`` code reads (:data:`SOURCES`); ``what``: the work's name in its
    messages (a refusal for memory says it). ``replay``, ``chunk`` and ``journal``
    as for :class:`~interp.ablation.replay.Sweeper`; its clean pass is the run's own prompts. A model
    whose patched runs cannot be reproduced (see the module docstring) is refused before any work:
    with ``replay="auto"`` the plain forward stands in where only the replay fails."""

    units = "intervention"
    shortcuts_wanted = False
    fewer = FEWER_PAIRS

    def __init__(
        self,
        run: Setup,
        graph: Graph,
        *,
        source: str = "patch",
        what: str = "edge patching",
        replay: str = "auto",
        chunk: int | None = None,
        journal: Journal | None = None,
    ):
        SOURCES.check(source)
        if run.metric.reads != "logits":
            raise UsageError(
                f"edge patching reads the metric from the logits (a receiver); {run.metric.name} reads the final "
                "hidden state: use a task metric (metric=)"
            )
        self.run, self.graph, self.source, self.what = run, graph, source, what
        info = run.info
        w = read_head_weights(run.model, info, "edge patching")
        dtype = next(iter(run.model.parameters())).dtype
        g = graph.shape.group
        self.W = {"q": w.W_Q.to(dtype), "k": w.W_K[:, ::g].to(dtype), "v": w.W_V[:, ::g].to(dtype)}
        self.posts = post_norms(run.model, info.n_layers)  # a post-norm's gain folded into W_O
        self.W_O = fold(run.model, w.W_O.to(dtype), run.probe.tokens[:2], self.posts)  # [layer, head, d_head, d_model]
        self.layout = _Layout(graph)
        self.mlp_norms = _mlp_norms(run.model, graph)
        self._mean: SenderValues | None = None
        super().__init__(
            run.model,
            run.probe,
            run.metric,
            ablation="zero",
            replay=replay,
            chunk=chunk,
            config=run.config,
            journal=journal,
        )
        self._reproduces()

    # ---- what the interventions read --------------------------------------------------------

    def _capture(self, rows: Tensor) -> EdgeBatch:
        batch = super()._capture(rows)
        donor = self.probe.donor[rows.to(self.probe.donor.device)]
        fields = {f: getattr(batch, f) for f in CleanBatch.__dataclass_fields__}
        return EdgeBatch(**fields, own=self._senders(batch.tokens), source=self._senders(donor))

    def _senders(self, tokens: Tensor) -> SenderValues:
        """Every sender's output on a plain forward of ``tokens``."""
        keep: dict[str, Tensor] = {}

        def grab(key: str) -> Callable:
            def hook(x: Tensor, hook: Any) -> None:
                keep[key] = x.detach()

            return hook

        L = self.info.n_layers
        hooks = [("blocks.0.hook_resid_pre", grab("input"))]
        hooks += [(z_hook(l), grab(f"z{l}")) for l in range(L)]
        hooks += [(f"blocks.{l}.hook_mlp_out", grab(f"m{l}")) for l in self.graph.shape.mlp_layers]
        hooks += [(site.scale, grab(f"s{l}")) for l, site in self.posts.items()]
        with torch.no_grad():
            read_out(self.model, tokens, self.metric, hooks, L)
        z = [by_head(keep[f"z{l}"], self.info.n_heads) for l in range(L)]
        return SenderValues(
            keep["input"],
            [scaled(z[l], keep[f"s{l}"]) if l in self.posts else z[l] for l in range(L)],
            {l: keep[f"m{l}"].reshape(keep["input"].shape) for l in self.graph.shape.mlp_layers},
        )

    def _sources(self, batch: EdgeBatch) -> SenderValues:
        """What a ``SOURCE`` code reads on ``batch``: its paired prompts, or their mean over every pair."""
        if self.source == "patch":
            return batch.source
        if self._mean is None:
            batches = self._batches
            self._mean = SenderValues.mean([b.source for b in batches], [len(b.rows) for b in batches])
        return self._mean

    def _can_reuse(self) -> bool:
        return False

    def _can_trim(self) -> bool:
        return False

    # ---- the replay and the plain forward under an intervention ----------------------------

    def _replay(self, batch: EdgeBatch, start: int, codes: Int8[Tensor, "rep sender receiver"]) -> Tensor:
        rep, L, adapter = codes.shape[0], self.info.n_layers, self.adapter
        start = min(start, L - 1)  # the logits alone: the last block is replayed
        hidden = batch.resid[start].repeat(rep, 1, 1)
        state = _Replay(self, batch, codes, start)
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            state.install(stack)
            calls = [expand_call(batch.calls[l], self._plans[l], rep) for l in range(start, L)]
            picked = self.metric.read(adapter.run_blocks(hidden, start, calls))
            return adapter.unembed(picked)

    def _plain(self, batch: EdgeBatch, codes: Int8[Tensor, "rep sender receiver"]) -> Tensor:
        """The reference: one plain forward of ``rep`` copies of the minibatch under ``codes``."""
        rep = codes.shape[0]
        state = _Replay(self, batch, codes, 0)
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            state.install(stack)
            return read_out(self.model, batch.tokens.repeat(rep, 1), self.metric, [], self.info.n_layers)

    def _evaluate_group(self, start: int, codes: Tensor) -> Tensor:
        rep = codes.shape[0]
        values = torch.empty(rep, self.probe.batch)
        for batch in self._batches:
            out = self._plain(batch, codes) if self.replay == "loop" else self._replay(batch, start, codes)
            for r, o in enumerate(out.chunk(rep)):
                values[r, batch.rows] = self.metric(o, batch.tokens, batch.reference, batch.rows).cpu()
        return values

    def _probe_codes(self) -> Tensor:
        """Three interventions for the checks: nothing patched, every edge patched, and the input's
        edge into the last layer's first receiver alone."""
        g = self.graph
        none = torch.zeros(1, len(g.senders), len(g.receivers), dtype=torch.int8)
        every = (g.edges.to(torch.int8) * SOURCE)[None]
        one = none.clone()
        one[0, 0, (g.receivers_of(g.shape.n_layers - 1) or g.receivers_of(g.shape.n_layers))[0]] = SOURCE
        return torch.cat([none, every, one])

    def _reproduces(self) -> None:
        """Refuse, before any work, a model whose plain forward under the codes does not give its own
        output with nothing patched and the source's with every edge patched."""
        B = self.probe.batch
        check = self._capture(torch.tensor([0, 1]) if B >= 2 else torch.tensor([0, 0]))
        got = self._plain(check, self._probe_codes()[:2]).chunk(2)
        own, source = check.out, self._plain_source(check)
        scale, bound = _rounding(torch.stack([own, source]))
        for value, want, what, run in (
            (got[0], own, "nothing", "its own"),
            (got[1], source, "every edge", "the source's"),
        ):
            err = float((value - want).abs().max())
            if err > 4 * bound:
                raise UsageError(
                    f"exact edge patching cannot reproduce {self.info.name}: with {what} patched a forward should give "
                    f"{run} output, off by {err:.2e} (of {scale:.2e}); its receivers may read inputs the graph does not name"
                )

    def _self_check(self) -> str | None:
        """Can the replay stand in for a plain forward under interventions? Replayed from block 0,
        the three of :meth:`_probe_codes` must give what plain forwards give, and the last (the last
        layer's edge) too, replayed from its own layer."""
        check, why = self._plan_calls()
        if why is not None:
            return why
        codes = self._probe_codes()
        plain = self._plain(check, codes).chunk(3)
        _, bound = _rounding(torch.stack(plain))
        L = self.info.n_layers
        for start, rows, want in ((0, codes, plain), (L - 1, codes[2:], plain[2:])):
            try:
                replayed = self._replay(check, start, rows).chunk(rows.shape[0])
            except Exception as e:  # an architecture whose blocks need more than the recorded call
                return f"replaying its blocks under edge patching failed ({type(e).__name__}: {e})"
            for got, reference in zip(replayed, want):
                err = float((got - reference).abs().max())
                if err > 4 * bound:
                    return f"replaying its blocks under edge patching does not reproduce a plain forward (max error {err:.2e})"
        return None

    def _plain_source(self, batch: EdgeBatch) -> Tensor:
        """The read-out of a plain forward of the source (the paired prompts; their mean: the input held at it)."""
        probe = self.probe
        donor = probe.donor[batch.rows.to(probe.donor.device)]
        if self.source == "patch":
            with torch.no_grad():
                return read_out(self.model, donor, self.metric, [], self.info.n_layers)
        mean = self._sources(batch)
        hooks = [("blocks.0.hook_resid_pre", lambda x, hook: mean.input.to(x.dtype).expand_as(x))]
        for l in range(self.info.n_layers):  # a post-normed layer: its write, which its heads' scaled outputs sum to
            site = self.posts.get(l)
            hooks.append(
                (z_hook(l), _fixed(mean.z[l])) if site is None else (site.output, _fixed(self._write(mean, l)))
            )
        hooks += [(f"blocks.{l}.hook_mlp_out", _fixed(m)) for l, m in mean.mlp.items()]
        with torch.no_grad():
            return read_out(self.model, batch.tokens, self.metric, hooks, self.info.n_layers)

    def _write(self, values: SenderValues, l: int) -> Tensor:
        return layer_write(values.z[l], self.W_O[l])

    # ---- evaluation ------------------------------------------------------------------------

    def evaluate(  # type: ignore[override]
        self, units: Units, *, desc: str = "patching edges", scope: str | None = None, named: str | None = None
    ) -> Float[Tensor, "n batch"]:
        """The metric per pair under each intervention of ``units``, as :meth:`Sweeper.evaluate`
        does for head sets (journaled by each unit's key, Ctrl-C leaves NaN rows and sets
        :attr:`interrupted`, shared out over ``torchrun`` ranks)."""
        n = len(units)
        result = torch.full((n, self.probe.batch), float("nan"))
        todo = sorted((units.start(i), i) for i in range(n))
        L = self.info.n_layers
        for start, i in todo:
            if start > L:  # nothing patched
                result[i] = self.clean
        todo = [(s, i) for s, i in todo if s <= L]
        keys: dict[int, Any] = {}
        done: set[int] = set()
        if self.journal is not None and todo:
            keys = {i: (scope or desc, units.key(i)) for _, i in todo}
            done = self._from_journal(keys, result, named or f"the {scope or desc}")
        self.interrupted = self._rounds(todo, done, units, result, keys, desc)
        return result

    def memory_estimate(self, minibatch: int | None = None) -> memory.Estimate:
        """The replay's estimate, plus every sender's output on both prompts kept for every pair and,
        per batched forward, the shifted inputs of the widest layer's receivers and every sender's
        projected difference for each of the two codes (:meth:`_Replay._fill`)."""
        base = super().memory_estimate(minibatch)
        info, T = self.info, self.probe.seq_len
        item = memory.Shape.of(self.model, info).itemsize
        senders = 2 * (info.d_model * (1 + info.n_layers) + info.n_layers * info.n_heads * info.d_head)
        g = self.graph
        widest = max(len(g.receivers_of(l)) for l in range(g.shape.n_layers + 1))
        b = min(minibatch or self.minibatch, self.probe.batch)
        kept = base.kept + item * self.probe.batch * T * senders
        per_forward = base.per_forward + item * self.chunk_size * b * T * info.d_model * (3 * widest + 2)
        per_forward += item * self.chunk_size * b * T * info.d_model * 2 * len(g.senders)
        kept_is = "the clean pass and every sender's output on both prompts, kept"
        return memory.Estimate(self.what, kept, per_forward, base.minibatch, kept_is)


def _fixed(value: Tensor) -> Callable:
    def hook(x: Tensor, hook: Any) -> Tensor:
        return value.to(x.dtype).expand(x.shape[0], *value.shape[1:]).reshape(x.shape)

    return hook


def _mlp_norms(model: Any, graph: Graph) -> dict[int, torch.nn.Module]:
    """The norm each MLP's input comes out of: its own (``ln2``), or attention's where a parallel
    block shares one (GPT-J)."""
    out = {}
    for l in graph.shape.mlp_layers:
        block = model.blocks[l]
        norm = getattr(block, "ln2", None)
        out[l] = norm if isinstance(norm, torch.nn.Module) else block.ln1
    return out


class _Layout:
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


class _Replay:
    """The hooks of one batched forward under ``codes`` (``rep`` interventions x the minibatch): they
    keep each sender's actual output as the forward makes it and shift each receiver's input."""

    def __init__(self, sweeper: EdgeSweeper, batch: EdgeBatch, codes: Tensor, start: int):
        self.sw, self.batch, self.start = sweeper, batch, start
        self.rep = codes.shape[0]
        self.b, self.T = batch.tokens.shape
        self.codes = codes.to(sweeper.info.device)
        self.own: SenderValues = batch.own
        self.source = sweeper._sources(batch)
        L = sweeper.info.n_layers
        # actual outputs: below the replay's first block they are the own run's
        self.z: list[Tensor | None] = [self._rep(self.own.z[l]) if l < start else None for l in range(L)]
        self.mlp: dict[int, Tensor | None] = {l: self._rep(v) if l < start else None for l, v in self.own.mlp.items()}
        self.x: dict[str, Tensor] = {}  # each norm's input, as the forward hands it
        self.stacked: dict[int, Tensor] = {}  # per code: every sender's difference (see _fill)
        self.filled: dict[int, set[int]] = {}  # per code: the sender groups filled so far
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
                self.hooks.append((f"blocks.{l}.hook_mlp_out", self._keep_mlp(l)))
            if self.active[l]:
                for site, name in (("q", q_hook(l)), ("k", k_hook(l)), ("v", v_hook(l))):
                    self.hooks.append((name, self._shift_head(l, site)))

    def install(self, stack: ExitStack) -> None:
        sw, L, blocks = self.sw, self.sw.info.n_layers, self.sw.model.blocks
        model = sw.model
        handles = []
        mlp_hooks = []
        for l in range(self.start, L):
            if not self.active[l]:
                continue
            handles.append(blocks[l].ln1.register_forward_pre_hook(self._norm_input(l, "ln1")))
            if l in sw.mlp_norms and "mlp" in self.sw.layout.sites[l]:
                norm = sw.mlp_norms[l]
                if norm is not blocks[l].ln1:
                    handles.append(norm.register_forward_pre_hook(self._norm_input(l, "ln2")))
                name = f"blocks.{l}.mlp.hook_in"
                if name in model.hook_dict:
                    mlp_hooks.append((name, self._shift_mlp(l)))
                else:
                    handles.append(blocks[l].mlp.register_forward_pre_hook(on_input(self._shift_mlp(l))))
        if self.active[L]:
            handles.append(model.ln_final.register_forward_pre_hook(self._shift_logits))
        for h in handles:
            stack.callback(h.remove)
        stack.enter_context(model.hooks(fwd_hooks=self.hooks + mlp_hooks))

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

    def _norm_input(self, l: int, which: str) -> Callable:
        def pre(module: Any, args: tuple) -> None:
            if not self.inside:
                self.x[f"{which}.{l}"] = args[0]

        return pre

    def _norm_of(self, norm: torch.nn.Module, x: Tensor, D: Tensor) -> Tensor:
        """``norm(x + D) - norm(x)`` per receiver: ``D`` is ``[rep, b, T, C, d]``, ``x`` ``[rep * b, T, d]``."""
        rep, b, T, C, d = D.shape
        xs = x.reshape(rep, b, T, 1, d)
        moved = (xs + D).permute(0, 1, 3, 2, 4).reshape(rep * b * C, T, d)
        self.inside = True
        try:
            out = norm(moved) - norm(x).reshape(rep, b, 1, T, d).expand(rep, b, C, T, d).reshape(rep * b * C, T, d)
        finally:
            self.inside = False
        return out.reshape(rep, b, C, T, d).permute(0, 1, 3, 2, 4)

    def _shift(self, receivers: list[int]) -> Tensor | None:
        """``D``, ``[rep, b, T, C, d_model]``: for each receiver, the sum over its senders coded
        otherwise of (chosen output - actual output); ``None`` when nothing is. One batched product
        per code of the receivers' codes with every upstream sender's difference, each difference
        computed once per forward (:meth:`_fill`)."""
        codes = self.codes[:, :, receivers]  # [rep, sender, C]
        if not bool((codes != ACTUAL).any()):
            return None
        n_up = self.sw.graph.upstream(receivers[0])
        D = None
        for code in (SOURCE, OWN):
            m = codes[:, :n_up] == code  # [rep, n_up, C]
            used = m.any(0).any(-1).cpu().numpy()
            if not used.any():
                continue
            P = self._fill(code, used)  # [rep, sender, b * T * d]
            term = torch.bmm(m.transpose(1, 2).to(P.dtype), P[:, :n_up])  # [rep, C, b * T * d]
            D = term if D is None else D + term
        rep, C = D.shape[:2]
        return D.reshape(rep, C, self.b, self.T, -1).permute(0, 2, 3, 1, 4)

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
            D = self._shift(receivers)
            if D is None:
                return y
            x = self.x[f"ln1.{l}"]
            moved = self._norm_of(self.sw.model.blocks[l].ln1, x, D)  # [rep, b, T, C, d]
            change = einsum(moved, self.sw.W[site][l].to(moved.dtype), "r b t c d, c d e -> r b t c e")
            yy = by_head(y, change.shape[3])
            return (yy + change.reshape(yy.shape).to(yy.dtype)).reshape(y.shape)

        return hook

    def _shift_mlp(self, l: int) -> Callable:
        receivers = self.sw.layout.sites[l]["mlp"]

        def hook(y: Tensor, hook: Any) -> Tensor:
            if self.inside:
                return y
            D = self._shift(receivers)
            if D is None:
                return y
            norm = self.sw.mlp_norms[l]
            x = self.x.get(f"ln2.{l}", self.x.get(f"ln1.{l}"))
            moved = self._norm_of(norm, x.reshape(self.rep * self.b, self.T, -1), D)[:, :, :, 0]
            return y + moved.reshape(y.shape).to(y.dtype)

        return hook

    def _shift_logits(self, module: Any, args: tuple) -> tuple | None:
        if self.inside:
            return None
        L = self.sw.info.n_layers
        D = self._shift(self.sw.layout.sites[L]["logits"])
        if D is None:
            return None
        x = args[0]
        d = D[:, :, :, 0].reshape(self.rep * self.b, self.T, -1)
        if x.shape[1] != self.T:  # the replay reads the metric's positions only
            d = self.sw.metric.read(d)
        return (x + d.to(x.dtype), *args[1:])


def on_input(hook: Callable) -> Callable:
    """``hook`` as a module's forward pre-hook, on its first argument."""

    def pre(module: Any, args: tuple) -> tuple:
        return (hook(args[0], None), *args[1:])

    return pre
