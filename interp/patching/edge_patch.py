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

:class:`EdgeCodes` is the language the executor (:class:`~interp.ablation.replay.Sweeper`, the one
that runs head sets too) speaks for them, and :class:`EdgeSweeper` that executor speaking it: blocks
from the lowest layer an intervention reaches up, ``rep`` interventions batched, journaled, split
over ``torchrun`` ranks, with the language's own self-check: before any work the replay and a plain
forward must give the model's own output with nothing patched, the source's output with every edge
patched (the run then reads the source alone), and the same output as each other with one edge
patched; a model where they differ is refused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from jaxtyping import Int8
from torch import Tensor

from interp import memory
from interp.ablation.calls import replay_tolerance
from interp.ablation.language import Executor, UnpatchedBatch
from interp.ablation.modes import derangement
from interp.ablation.replay import Sweeper, read_out
from interp.adapters.receivers import ReceiverNorms
from interp.adapters.weights import read_head_weights
from interp.errors import UsageError
from interp.hooks import mlp_out_hook, resid_pre_hook, z_hook
from interp.journal import Journal
from interp.patching.core import FEWER_PAIRS, Setup
from interp.patching.edge_replay import ACTUAL, SOURCE, EdgeBatch, Layout, Replay, SenderValues
from interp.patching.graph import Graph
from interp.patching.post_norm import fold, layer_write, post_norms, sender_hooks
from interp.registry import Registry
from interp.results import plural

SOURCES: Registry[str] = Registry("edge patching source")
SOURCES.add(
    "patch", "each pair's paired prompt: the sender's output there (EAP-IG's 'patching')", reads="the corrupted prompt"
)
SOURCES.add(
    "mean",
    "the sender's output averaged over every pair's paired prompt, position by position",
    reads="the mean over the corrupted prompts",
)
SOURCES.add(
    "zero", "the sender's output (the input's embedding too) set to 0: a zero ablation", reads="zero, a zero ablation"
)
SOURCES.add(
    "resample",
    "the sender's output on another pair's own prompt (a seeded derangement of the pairs): a resample ablation",
    reads="another pair's prompt, a resample ablation",
)


class CodedUnits:
    """Interventions given as edge codes (the executor's :class:`~interp.ablation.language.Units`):
    how many, each one's codes (built when its batched forward comes, never all at once), the
    lowest layer it reaches and its label in the journal."""

    def __len__(self) -> int:
        raise NotImplementedError

    def codes(self, index: Sequence[int]) -> Int8[Tensor, "rep sender receiver"]:
        raise NotImplementedError

    def start(self, i: int) -> int:
        raise NotImplementedError

    def label(self, i: int) -> str:
        raise NotImplementedError

    def key(self, i: int) -> tuple:
        return (self.label(i),)

    def __getitem__(self, index: Sequence[int]) -> Tensor:  # what a batched forward's hooks read
        return self.codes(list(index))


class CodeUnits(CodedUnits):
    """Interventions given as a ``[n, sender, receiver]`` code tensor, or ``[n, sender, receiver,
    pos]`` for edges coded position by position (keys: a digest of each one's codes)."""

    def __init__(self, graph: Graph, codes: Int8[Tensor, "n sender receiver *pos"]):
        self.graph, self.all = graph, codes.to(torch.int8)
        layers = torch.tensor([n.layer for n in graph.receivers])
        touched = (self.all != ACTUAL).any(1)  # [n, receiver] (, pos)
        touched = touched.reshape(*touched.shape[:2], -1).any(-1)
        big = graph.shape.n_layers + 1
        self.starts = torch.where(touched, layers[None], torch.full_like(layers[None], big)).min(1).values

    def __len__(self) -> int:
        return self.all.shape[0]

    def codes(self, index: Sequence[int]) -> Tensor:
        return self.all[list(index)]

    def start(self, i: int) -> int:
        return int(self.starts[i])

    def label(self, i: int) -> str:
        nz = self.all[i].nonzero()
        blob = torch.cat([nz, self.all[i][tuple(nz.T)][:, None].long()], 1).numpy().tobytes()
        return hashlib.sha1(blob).hexdigest()


class EdgeUnits(CodedUnits):
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

    def label(self, i: int) -> str:
        s, r = self.edges[i]
        return f"{self.graph.senders[s].name}->{self.graph.receivers[r].name}"


class EdgeCodes:
    """The edge-code language of the executor (:class:`~interp.ablation.replay.Sweeper`): each
    intervention a code per (sender, receiver) of ``graph``, on a task's pairs (``run``);
    ``source``: what a ``SOURCE`` code reads (:data:`SOURCES`); ``what``: the work's name in its
    messages (a refusal for memory says it). Its unpatched pass is the run's own prompts, with every
    sender's output kept on them and on the source; a model whose patched runs cannot be
    reproduced (see the module docstring) is refused before any work. It is also what the edge
    replay reads (:class:`~interp.patching.edge_replay.Patcher`)."""

    units = "intervention"
    fewer = FEWER_PAIRS
    shortcuts: list[str] = []  # the head sets' shortcuts reuse a head's attention: never here

    def __init__(self, run: Setup, graph: Graph, *, source: str = "patch", what: str = "edge patching"):
        SOURCES.check(source)
        if run.metric.reads != "logits":
            raise UsageError(
                f"edge patching reads the metric from the logits (a receiver); {run.metric.name} reads the final "
                "hidden state: use a task metric (metric=)"
            )
        self.graph, self.source, self.what = graph, source, what
        self.model, self.info, self.metric = run.model, run.info, run.metric
        w = read_head_weights(run.model, run.info, "edge patching")
        dtype = next(iter(run.model.parameters())).dtype
        g = graph.shape.group
        self.W = {"q": w.W_Q.to(dtype), "k": w.W_K[:, ::g].to(dtype), "v": w.W_V[:, ::g].to(dtype)}
        self.posts = post_norms(run.model, run.info.n_layers)  # a post-norm's gain folded into W_O
        self.W_O = fold(run.model, w.W_O.to(dtype), run.probe.tokens[:2], self.posts)  # [layer, head, d_head, d_model]
        self.layout = Layout(graph)
        self.norms = ReceiverNorms.of(run.model, graph.shape.mlp_layers)
        self.scratch: dict[Any, Tensor] = {}  # the replay's buffers, reused forward after forward
        self.donors = _donors(run, source)
        self._mean: SenderValues | None = None
        self.sweeper: Executor | None = None  # the executor it is bound to (the mean source reads its batches)

    # ---- the language's part of the executor's construction ------------------------------------

    def refuse(self, sw: Executor) -> None:
        """Refused in the constructor already (a metric that does not read the logits)."""

    def prepare(self, sw: Executor) -> None:
        """Bound to its executor (every weight was read in the constructor)."""
        self.sweeper = sw

    def memory(self, sw: Executor, base: memory.Estimate, minibatch: int | None) -> memory.Estimate:
        """The replay's estimate, plus every sender's output on both prompts kept for every pair and,
        per batched forward, every sender's projected difference and their running total for each
        of the two codes (:meth:`Replay._fill`, :meth:`Replay._total`) and the shifted inputs of
        the widest layer's receivers, one intervention's at a time (:meth:`Replay._norm_of`)."""
        info, T = sw.info, sw.probe.seq_len
        item = memory.Shape.of(sw.model, info).itemsize
        senders = 2 * (info.d_model * (1 + info.n_layers) + info.n_layers * info.n_heads * info.d_head)
        g = self.graph
        widest = max(len(g.receivers_of(l)) for l in range(g.shape.n_layers + 1))
        b = min(minibatch or sw.minibatch, sw.probe.batch)
        kept = base.kept + item * sw.probe.batch * T * senders
        per_forward = base.per_forward + item * b * T * info.d_model * (3 * widest + 2)
        per_forward += item * sw.chunk_size * b * T * info.d_model * 2 * (len(g.senders) + 1)  # + each code's total
        kept_is = "the unpatched pass and every sender's output on both prompts, kept"
        return memory.Estimate(self.what, kept, per_forward, base.minibatch, kept_is)

    def units_of(self, sw: Executor, units: CodedUnits) -> CodedUnits:
        return units

    def to_loop(self, sw: Executor) -> None:
        """The loop keeps every capture: its plain forwards read the senders' outputs too."""

    # ---- what the interventions read --------------------------------------------------------

    def capture(self, sw: Executor, rows: Tensor) -> EdgeBatch:
        batch = sw.unpatched_pass(rows, [], [])
        fields = {f: getattr(batch, f) for f in UnpatchedBatch.__dataclass_fields__}
        return EdgeBatch(**fields, own=self._senders(batch.tokens), source=self._senders(self._donor(rows)))

    def _donor(self, rows: Tensor) -> Tensor:
        """The prompts the senders' source values come from: each pair's paired prompt, or (resampled)
        another pair's own prompt."""
        return self.donors[rows.to(self.donors.device)]

    def _senders(self, tokens: Tensor) -> SenderValues:
        """Every sender's output on a plain forward of ``tokens``."""
        keep: dict[str, Tensor] = {}
        L, mlps = self.info.n_layers, self.graph.shape.mlp_layers
        with torch.no_grad():
            read_out(
                self.model,
                tokens,
                self.metric,
                sender_hooks(self.posts, L, self.info.n_heads, mlps, keep.__setitem__),
                L,
            )
        shape = keep["input"].shape
        return SenderValues(
            keep["input"], [keep[f"z{l}"] for l in range(L)], {l: keep[f"m{l}"].reshape(shape) for l in mlps}
        )

    def sources(self, batch: EdgeBatch) -> SenderValues:
        """What a ``SOURCE`` code reads on ``batch``: its paired prompts (or, resampled, other pairs'
        own prompts), their mean over every pair, or zero (one row each for the last two, read by
        every sequence)."""
        if self.source in ("patch", "resample"):
            return batch.source
        if self.source == "zero":
            own = batch.own
            return SenderValues(
                torch.zeros_like(own.input[:1]),
                [torch.zeros_like(z[:1]) for z in own.z],
                {l: torch.zeros_like(m[:1]) for l, m in own.mlp.items()},
            )
        if self._mean is None:
            batches = self.sweeper.batches
            self._mean = SenderValues.mean([b.source for b in batches], [len(b.rows) for b in batches])
        return self._mean

    # ---- the replay and the plain forward under an intervention ----------------------------

    def install(self, sw: Executor, stack: ExitStack, batch: EdgeBatch, start: int, codes: Tensor) -> int:
        """The edge replay's hooks (:class:`~interp.patching.edge_replay.Replay`) from block ``start``
        (the last block where only the logits are reached)."""
        start = min(start, self.info.n_layers - 1)
        Replay(self, batch, codes, start).install(stack)
        return start

    def plain(self, sw: Executor, batch: EdgeBatch, codes: Int8[Tensor, "rep sender receiver"]) -> Tensor:
        """The reference: one plain forward of ``rep`` copies of the minibatch under ``codes``."""
        rep = codes.shape[0]
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            Replay(self, batch, codes, 0).install(stack)
            return read_out(self.model, batch.tokens.repeat(rep, 1), self.metric, [], self.info.n_layers)

    def _probe_codes(self) -> Tensor:
        """Three interventions for the checks: nothing patched, every edge patched, and the input's
        edge into the last layer's first receiver alone."""
        g = self.graph
        none = torch.zeros(1, len(g.senders), len(g.receivers), dtype=torch.int8)
        every = (g.edges.to(torch.int8) * SOURCE)[None]
        one = none.clone()
        one[0, 0, (g.receivers_of(g.shape.n_layers - 1) or g.receivers_of(g.shape.n_layers))[0]] = SOURCE
        return torch.cat([none, every, one])

    def verify(self, sw: Executor) -> None:
        """Refuse, before any work, a model whose plain forward under the codes does not give its own
        output with nothing patched and the source's with every edge patched."""
        B = sw.probe.batch
        check = self.capture(sw, torch.tensor([0, 1]) if B >= 2 else torch.tensor([0, 0]))
        got = self.plain(sw, check, self._probe_codes()[:2]).chunk(2)
        own, source = check.out, self._plain_source(check)
        scale, bound = replay_tolerance(torch.stack([own, source]))
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

    def settle(self, sw: Executor) -> str | None:
        """Can the replay stand in for a plain forward under interventions? Replayed from block 0,
        the three of :meth:`_probe_codes` must give what plain forwards give, and the last (the last
        layer's edge) too, replayed from its own layer."""
        check, why = sw.plan_calls()
        if why is not None:
            return why
        codes = self._probe_codes()
        plain = self.plain(sw, check, codes).chunk(3)
        _, bound = replay_tolerance(torch.stack(plain))
        L = self.info.n_layers
        for start, rows, want in ((0, codes, plain), (L - 1, codes[2:], plain[2:])):
            try:
                replayed = sw.replayed(check, start, rows).chunk(rows.shape[0])
            except Exception as e:  # an architecture whose blocks need more than the recorded call
                return f"replaying its blocks under edge patching failed ({type(e).__name__}: {e})"
            for got, reference in zip(replayed, want):
                err = float((got - reference).abs().max())
                if err > 4 * bound:
                    return f"replaying its blocks under edge patching does not reproduce a plain forward (max error {err:.2e})"
        return None

    def _plain_source(self, batch: EdgeBatch) -> Tensor:
        """The read-out of a plain forward of the source: the paired (or resampled) prompts; for the
        mean (or zero), the run's own prompts with the input and every sender's write held at it."""
        if self.source in ("patch", "resample"):
            with torch.no_grad():
                return read_out(self.model, self._donor(batch.rows), self.metric, [], self.info.n_layers)
        held = self.sources(batch)
        hooks = [(resid_pre_hook(0), lambda x, hook: held.input.to(x.dtype).expand_as(x))]
        for l in range(self.info.n_layers):  # a post-normed layer: its write, which its heads' scaled outputs sum to
            site = self.posts.get(l)
            hooks.append(
                (z_hook(l), _fixed(held.z[l])) if site is None else (site.output, _fixed(self._write(held, l)))
            )
        hooks += [(mlp_out_hook(l), _fixed(m)) for l, m in held.mlp.items()]
        with torch.no_grad():
            return read_out(self.model, batch.tokens, self.metric, hooks, self.info.n_layers)

    def _write(self, values: SenderValues, l: int) -> Tensor:
        return layer_write(values.z[l], self.W_O[l])


class EdgeSweeper(Sweeper):
    """The executor speaking edge codes (:class:`EdgeCodes`): the metric under many edge
    interventions at once, on a task's pairs (``run``). ``source`` and ``what`` as for
    :class:`EdgeCodes`; ``replay``, ``chunk`` and ``journal`` as for
    :class:`~interp.ablation.replay.Sweeper` (with ``replay="auto"`` the plain forward stands in
    where only the replay fails). :meth:`evaluate` takes :class:`CodedUnits`."""

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
        self.codes = EdgeCodes(run, graph, source=source, what=what)
        super().__init__(
            run.model,
            run.probe,
            run.metric,
            language=self.codes,
            replay=replay,
            chunk=chunk,
            config=run.config,
            journal=journal,
        )


def _donors(run: Setup, source: str) -> Tensor:
    """Each pair's donor prompt: its paired prompt, or for ``resample`` the own prompt of the pair a
    seeded derangement (the run's seed) assigns it, so that no pair reads itself."""
    probe = run.probe
    if source != "resample":
        return probe.donor
    n = probe.tokens.shape[0]
    if n < 2:
        raise UsageError(
            f"source=resample reads each pair's senders on another pair's prompt: {plural(n, 'pair')} cannot; "
            "use more pairs, or another source",
            params="source",
        )
    return probe.tokens[derangement(n, run.config.seed).to(probe.tokens.device)]


def _fixed(value: Tensor) -> Callable:
    def hook(x: Tensor, hook: Any) -> Tensor:
        return value.to(x.dtype).expand(x.shape[0], *value.shape[1:]).reshape(x.shape)

    return hook
