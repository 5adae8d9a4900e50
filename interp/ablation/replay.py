"""The replay: one executor that evaluates a metric under many interventions at once.

:class:`Sweeper` runs the unpatched pass once, caching the residual stream entering every block and
how each block was called, then evaluates interventions by replaying blocks ``l .. L-1`` on the
cached residual (``replay="fast"``), several batched along the batch axis, or by one plain
``run_with_hooks`` each (``replay="loop"``, the reference). :data:`REPLAYS` registers the choices.
What an intervention is, is its language's (:class:`~interp.ablation.language.Language`): head
sets ablated by a kind (:class:`~interp.ablation.head_sets.HeadSets`, node patching and the
ablation kinds) or edge codes (:class:`~interp.patching.edge_patch.EdgeCodes`: edges, paths,
circuits); the minibatches, the replay, the loop, the rounds, the journal, the ranks and the
memory check are the executor's, the same for both. What touches the model's internals (hooks on its blocks, calling them, its
unembedding, its stacked ``W_O``, the shortcuts' module surgery) is the model's adapter's
(:class:`interp.adapters.Adapter`); this module only calls it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

import interp.distributed as distributed
import interp.memory as memory
from interp.ablation.calls import UnreplayableCall, call_plan, detach_call, expand_call, replay_tolerance
from interp.ablation.head_sets import HeadSets
from interp.ablation.language import Language, Units, UnpatchedBatch
from interp.ablation.metrics import Metric, as_metric
from interp.ablation.modes import HeadAblation
from interp.ablation.settings import checked
from interp.adapters import HookedModel, adapter_for, run_with_reducers
from interp.config import RunConfig
from interp.errors import AblationError
from interp.hooks import resid_post_hook
from interp.journal import Journal
from interp.models import describe
from interp.probes import TokenProbe
from interp.progress import tqdm
from interp.registry import Registry

REPLAYS: Registry[str] = Registry("replay")
REPLAYS.add("auto", "the fast replay where its self-check passes, else the loop (with a warning saying why)")
REPLAYS.add("fast", "replay blocks l..L-1 on the cached clean residual, ablations batched (refused if it cannot)")
REPLAYS.add("loop", "one plain run_with_hooks per head set: the reference")

# Tokens per batched forward of the fast replay, unless told otherwise. On a CPU, batches past a
# couple of thousand tokens run slower per token (elementwise ops leave the caches); GPUs want more.
_TOKEN_BUDGET = {"cpu": 2048, "other": 16384}


class Sweeper:
    """Evaluate a metric under many interventions at once, on one probe: the one executor of node
    and edge interventions alike.

    ``language``: what an intervention is (:class:`~interp.ablation.language.Language`); by default head sets
    (:class:`~interp.ablation.head_sets.HeadSets`) of ``ablation``'s kind over ``base`` heads,
    which stay ablated throughout (used by pruning with re-estimation). With ``replay="auto"`` the
    fast replay is used when replaying the model's blocks reproduces its output, else the plain
    loop; ``"fast"`` insists on the former, ``"loop"`` forces the latter. :attr:`unpatched` is the
    metric per sequence of the unpatched run (with only the ``base`` heads ablated, for head sets).
    ``chunk``: interventions batched into one forward by the fast replay (default: as many as make
    about 2k tokens on a CPU, 16k elsewhere). ``config``: its ``minibatch`` (probe sequences per
    forward, default all), ``seed`` (of a resample ablation fitted here) and ``progress`` (progress
    bars). ``journal`` (an opened :class:`~interp.journal.Journal`): :meth:`evaluate` records every
    intervention it finishes there and takes those already recorded from it (a resumed run).

    Before any forward pass the memory the replay needs (the clean pass of every sequence is kept)
    is estimated and compared with what the device has free (:mod:`interp.memory`): over it, the
    construction refuses with one line saying what to do.
    """

    def __init__(
        self,
        model: HookedModel,
        probe: TokenProbe,
        metric: Metric | Callable,
        *,
        ablation: str | HeadAblation = "zero",
        base: Any = None,
        language: Language | None = None,
        replay: str = "auto",
        chunk: int | None = None,
        config: RunConfig | None = None,
        journal: Journal | None = None,
    ):
        replay = checked(REPLAYS, replay)
        self.config = config = RunConfig.of(config)
        self.model, self.probe, self.metric = model, probe, as_metric(metric)
        self.adapter = adapter_for(model)
        self.info = describe(model)
        self.journal = journal
        self.language: Language = HeadSets(ablation, base) if language is None else language
        if probe.seq_len > self.info.n_ctx:
            raise AblationError(
                f"probe of {probe.seq_len} tokens is longer than the model's context of {self.info.n_ctx}"
            )
        self.language.refuse(self)
        self.minibatch = config.minibatch or probe.batch
        self.chunk = chunk
        memory.check(self.memory_estimate, self.minibatch, self.info.device, fewer=self.language.fewer)
        self.language.prepare(self)  # after the memory check: fitting an ablation runs forwards
        self.progress = config.progress
        self.replay = "loop" if replay == "loop" else "fast"
        self.interrupted = False
        self._plans: list[Any] = []
        self._batches = [
            self.language.capture(self, torch.arange(s, min(s + self.minibatch, probe.batch)))
            for s in range(0, probe.batch, self.minibatch)
        ]
        self.unpatched = torch.cat([self.metric(b.out, b.tokens, b.reference, b.rows) for b in self._batches])
        if self.replay == "fast":
            why = self.language.settle(self)
            if why is not None:
                if replay == "fast":
                    raise AblationError(f"the fast replay cannot run this model: {why}")
                warnings.warn(f"falling back to the run_with_hooks loop: {why}", stacklevel=2)
                self.replay = "loop"
                self.language.to_loop(self)
        self.language.verify(self)

    @property
    def units(self) -> str:
        return self.language.units

    @property
    def ablation(self) -> HeadAblation | None:
        """The head sets' ablation kind (``None`` for a language without one)."""
        return getattr(self.language, "ablation", None)

    @property
    def base(self) -> Tensor | None:
        """The head sets' base heads, ablated throughout (``None`` for a language without them)."""
        return getattr(self.language, "base", None)

    # ---- the unpatched pass, a plain run, the replay --------------------------------------------

    def unpatched_pass(self, rows: Tensor, hooks: list, extra: list, *, keep_attention: bool = False) -> UnpatchedBatch:
        """A plain forward of the probe's ``rows`` under ``hooks`` (and ``extra``, which only read):
        its read-out, and each block's residual, call and (``keep_attention``) attention output;
        ``reference`` is the read-out without ``hooks``."""
        tokens = self.probe.tokens[rows.to(self.probe.tokens.device)]
        L = self.info.n_layers
        with self.adapter.record_blocks(L, keep_attention=keep_attention, detach_call=detach_call) as (calls, attn):
            out = self.run(tokens, rows, hooks + extra)
        resid, kept = [c and c[0] for c in calls], [c and c[1] for c in calls]
        reference = self.run(tokens, rows, []) if hooks else out
        return UnpatchedBatch(rows, tokens, resid, kept, out, reference, [], attn)

    def run(self, tokens: Tensor, rows: Tensor, hooks: list) -> Tensor:
        """One plain forward of ``tokens`` (the probe's ``rows``, padded as the probe is) under ``hooks``;
        the metric's read-out."""
        padding = (
            None
            if self.probe.attention_mask is None
            else self.probe.attention_mask[rows.to(self.probe.attention_mask.device)]
        )
        return read_out(self.model, tokens, self.metric, hooks, self.info.n_layers, attention_mask=padding)

    def replayed(self, batch: UnpatchedBatch, start: int, group: Any) -> Tensor:
        """Blocks ``start .. L-1`` on the cached residual under ``group`` (``rep`` interventions
        batched, the language's hooks installed; it may move the start); the read-out."""
        rep, L, adapter = len(group), self.info.n_layers, self.adapter
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            start = self.language.install(self, stack, batch, start, group)
            hidden = batch.resid[start].repeat(rep, 1, 1)
            calls = [expand_call(batch.calls[l], self._plans[l], rep) for l in range(start, L)]
            picked = self.metric.read(adapter.run_blocks(hidden, start, calls))
            if self.metric.reads == "logits":
                picked = adapter.unembed(picked)
        return picked

    def plan_calls(self) -> tuple[UnpatchedBatch | None, str | None]:
        """The first part of every self-check: two probe sequences captured, and how each block
        argument is expanded for ``rep`` copies (:attr:`_plans`), read off the calls recorded for
        three; the capture, and why the blocks cannot be replayed (``None``: they can)."""
        if self.adapter.block_count() is None:
            return None, "the model has no `blocks` to replay"
        if self.metric.reads == "logits" and not self.adapter.can_unembed():
            return None, "the model has no ln_final/unembed to read logits with"
        B = self.probe.batch
        check = self.language.capture(self, torch.tensor([0, 1]) if B >= 2 else torch.tensor([0, 0]))
        if any(r is None for r in check.resid):
            return check, "the model does not call its `blocks` one after another"
        wider = self.unpatched_pass(torch.tensor([0, 1, 0]) if B >= 2 else torch.tensor([0, 0, 0]), [], [])
        try:
            self._plans = [call_plan(wider.calls[l], check.calls[l], 3, 2) for l in range(self.info.n_layers)]
        except UnreplayableCall as e:
            return check, f"a block argument cannot be replayed: {e}"
        return check, None

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(
        self, interventions: Any, *, desc: str = "ablating heads", scope: str | None = None, named: str | None = None
    ) -> Float[Tensor, "n batch"]:
        """The metric per sequence under each intervention: for head sets, ``[n, layer, head]`` masks
        (added to base), or ``[n, layer, head, pos]`` (``pos`` the probe's length) to ablate each
        head at the positions marked only (activation patching per position); for another
        language, its :class:`~interp.ablation.language.Units`.

        On Ctrl-C the evaluation stops, :attr:`interrupted` is set, and the rows not reached are NaN.

        With a :attr:`journal`, each intervention is a unit keyed ``(scope, *its key)`` (for a head
        set: its base heads and its heads; ``scope`` defaults to ``desc``: give each evaluation its
        own; ``named``: the words a resume's line names it by, ``"exact patching (z, denoise, by
        head)"``, default ``the <scope>``), recorded with its values as soon as its batched forward
        is done; those already recorded are filled in from the journal and not evaluated again.
        The interventions are cut into batched forwards exactly as an uninterrupted run cuts them
        (a forward whose units are all recorded is skipped, one with any missing is evaluated
        whole), so every value is computed by the same forward in both runs: bit for bit the same.

        Under ``torchrun`` each rank evaluates its share (every ``world``-th intervention) one
        batched forward per round; each round's results are gathered on every rank and rank 0
        records them, so the ranks never race on the journal (and what rank 0 found there at the
        start is shared with the others first).
        """
        units = self.language.units_of(self, interventions)
        result = torch.full((len(units), self.probe.batch), float("nan"))
        L = self.info.n_layers
        todo = []  # (the first block an intervention reaches, its index), in the order they are evaluated
        for i in range(len(units)):
            start = units.start(i)
            if start > L:  # nothing changed
                result[i] = self.unpatched
            else:
                todo.append((start, i))
        todo.sort()
        keys: dict[int, Any] = {}
        done: set[int] = set()
        if self.journal is not None and todo:
            keys = {i: (scope or desc, *units.key(i)) for _, i in todo}
            done = self._from_journal(keys, result, named or f"the {scope or desc}")
        self.interrupted = self._rounds(todo, done, units, result, keys, desc)
        return result

    def _from_journal(self, keys: dict[int, Any], result: Tensor, named: str) -> set[int]:
        """The interventions the journal holds, filled into ``result``; said on the resume line."""
        found = distributed.from_main(self.journal.done, "reading the journal")
        done = set()
        for i, key in keys.items():
            if key in found:
                result[i] = torch.tensor(found[key], dtype=result.dtype)
                done.add(i)
        self.journal.resumed(len(done), len(keys), f"{self.units}s of {named}")
        return done

    def _rounds(
        self,
        todo: list[tuple[int, int]],
        done: set[int],
        units: Units,
        result: Tensor,
        keys: dict[int, Any],
        desc: str,
    ) -> bool:
        """Evaluate the head sets of ``todo`` not ``done`` into ``result``, one batched forward per rank
        and round, each round recorded in the journal; whether a Ctrl-C stopped it. An interrupt is
        honoured for good: once one has stopped this sweeper, later evaluations run nothing (their
        rows stay NaN) and report it again, so a multi-pass caller cannot take a half-done pass for
        a finished one."""
        if self.interrupted:
            return True
        # every rank's forwards, cut from its whole share as an uninterrupted run cuts them
        world = distributed.world_size()
        me = distributed.rank() if distributed.active() else 0
        pending = [
            [(start, idx) for start, idx in self._groups(todo[r::world]) if not done.issuperset(idx)]
            for r in range(world)
        ]
        mine = pending[me]
        n_rounds = max(len(p) for p in pending)

        def one_round(k: int) -> tuple[tuple[list[int], Tensor] | None, bool]:
            if k >= len(mine):  # nothing left here: join the exchange with nothing
                return None, False
            start, idx = mine[k]
            try:
                return (idx, self._evaluate_group(start, units[idx])), False
            except KeyboardInterrupt:
                return None, True

        bar = tqdm(
            total=n_rounds,
            desc=desc,
            disable=not (self.progress and distributed.is_main()),
            unit="batch",
            sizes=self._sizes(len(todo), len(todo) - len(done), n_rounds),
        )
        try:
            for k in range(n_rounds):
                parts = distributed.run_sharded(lambda k=k: one_round(k), desc)
                finished = [part for part, _ in parts if part is not None]
                for idx, values in finished:
                    result[idx] = values
                if self.journal is not None and finished:
                    self.journal.extend((keys[i], result[i].tolist()) for idx, _ in finished for i in idx)
                bar.update(1)
                if any(halted for _, halted in parts):
                    return True
        except KeyboardInterrupt:
            if distributed.active():  # the other ranks are told in the next exchange
                raise
            return True
        finally:
            bar.close()
        return False

    def _sizes(self, n_sets: int, n_todo: int, n_rounds: int) -> str:
        """What :meth:`evaluate` is about to do, for its progress line."""
        probe = self.probe
        text = f"{n_sets} {self.units}(s) x {probe.batch} sequences of {probe.seq_len} tokens"
        if n_todo < n_sets:
            text += f", {n_sets - n_todo} already in the journal"
        return text + f", {n_rounds} batched forward(s) ({self.replay} replay)"

    @property
    def shortcuts(self) -> list[str]:
        """The exact shortcuts the fast replay takes on this model (see :mod:`interp.adapters.surgery`)."""
        return list(self.language.shortcuts) if self.replay == "fast" else []

    @property
    def batches(self) -> tuple[UnpatchedBatch, ...]:
        """The unpatched (or base-ablated) pass over each minibatch of the probe, as the replays use it."""
        return tuple(self._batches)

    def memory_estimate(self, minibatch: int | None = None) -> memory.Estimate:
        """What the replay is expected to need with ``minibatch`` sequences per forward (default: this
        sweeper's); see :mod:`interp.memory`. Read before any forward."""
        mb = min(minibatch or self.minibatch, self.probe.batch)
        chunk = self.chunk or self._default_chunk(mb)
        n_read = memory.positions_read(self.metric, self.info, self.probe.seq_len)
        shape = memory.Shape.of(self.model, self.info)
        base = memory.sweep_estimate(shape, self.probe.batch, self.probe.seq_len, mb, chunk, n_read)
        return self.language.memory(self, base, minibatch)

    def _default_chunk(self, minibatch: int) -> int:
        budget = _TOKEN_BUDGET["cpu" if self.info.device.type == "cpu" else "other"]
        return max(1, budget // (minibatch * self.probe.seq_len))

    @property
    def chunk_size(self) -> int:
        """How many ablations the fast replay batches into one forward."""
        return self.chunk or self._default_chunk(self.minibatch)

    def _groups(self, todo: list[tuple[int, int]]) -> list[tuple[int, list[int]]]:
        """Masks grouped by the first layer they touch, cut into chunks of one batched forward."""
        if self.replay == "loop":
            return [(start, [i]) for start, i in todo]
        chunk = self.chunk_size
        groups: list[tuple[int, list[int]]] = []
        for start, i in todo:
            if groups and groups[-1][0] == start and len(groups[-1][1]) < chunk:
                groups[-1][1].append(i)
            else:
                groups.append((start, [i]))
        return groups

    def _evaluate_group(self, start: int, group: Any) -> Tensor:
        rep = len(group)
        values = torch.empty(rep, self.probe.batch)
        for batch in self._batches:
            if self.replay == "loop":
                out = self.language.plain(self, batch, group)
            else:
                out = self.replayed(batch, start, group)
            for r, o in enumerate(out.chunk(rep)):
                values[r, batch.rows] = self.metric(o, batch.tokens, batch.reference, batch.rows).cpu()
        return values


def read_out(
    model: HookedModel,
    tokens: Tensor,
    metric: Metric,
    hooks: list,
    n_layers: int,
    *,
    grad: bool = False,
    attention_mask: Tensor | None = None,
    read_positions: bool = False,
) -> Tensor:
    """Run ``model`` with ``hooks`` (and a padded probe's ``attention_mask``); return the metric's
    read-out (logits or final hidden state). ``read_positions``: a metric that reads the logits at
    given positions gets them from the final residual at those positions alone, unembedded by the
    adapter (as the replay does), not from the model's logits at every position; check first with
    :func:`unembeds_read_positions` that this model gives the same."""
    if metric.reads == "logits" and not (read_positions and metric.positions is not None):
        logits = run_with_reducers(model, tokens, hooks, grad=grad, attention_mask=attention_mask)
        return metric.read(logits)
    seen: dict[str, Tensor] = {}
    last = resid_post_hook(n_layers - 1)

    def grab(x: Tensor, hook: Any) -> None:
        seen["hidden"] = x

    run_with_reducers(model, tokens, [*hooks, (last, grab)], stop_after=last, grad=grad, attention_mask=attention_mask)
    picked = metric.read(seen["hidden"])
    if metric.reads == "hidden":
        return picked
    with torch.set_grad_enabled(grad):
        return adapter_for(model).unembed(picked)


def unembeds_read_positions(model: HookedModel, tokens: Tensor, metric: Metric, n_layers: int) -> bool:
    """May :func:`read_out` unembed the metric's positions alone (``read_positions=True``) on this
    model? Only where the metric reads logits at given positions, the adapter can unembed, and on
    ``tokens`` (one sequence is enough) the result is the model's own logits there, to the replay
    self-check's tolerance (a head the adapter does not reproduce, a missed logit cap, fails it)."""
    if metric.reads != "logits" or metric.positions is None or not adapter_for(model).can_unembed():
        return False
    with torch.no_grad():
        want = read_out(model, tokens, metric, [], n_layers)
        try:
            got = read_out(model, tokens, metric, [], n_layers, read_positions=True)
        except Exception:  # an architecture whose final residual or head the adapter cannot reach
            return False
    if got.shape != want.shape:
        return False
    return float((got - want).abs().max()) <= replay_tolerance(want)[1]
