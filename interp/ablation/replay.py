"""The replay: evaluate a metric under many head sets at once.

:class:`Sweeper` runs the clean pass once, caching the residual stream entering every block and how
each block was called, then evaluates head sets by replaying blocks ``l .. L-1`` on the cached
residual (``replay="fast"``), several ablations batched along the batch axis, or by one plain
``run_with_hooks`` per head set (``replay="loop"``, the reference). :data:`REPLAYS` registers the
choices. What touches the model's internals (hooks on its blocks, calling them, its unembedding,
its stacked ``W_O``, the shortcuts' module surgery) is the model's adapter's
(:class:`interp.adapters.Adapter`); this module only calls it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

import interp.distributed as distributed
import interp.memory as memory
from interp.ablation.calls import Call, UnreplayableCall, call_plan, detach_call, expand_call
from interp.ablation.metrics import Metric, as_metric, refuse_padded_ablation
from interp.ablation.modes import HeadAblation, as_ablation, head_labels, head_mask
from interp.ablation.settings import checked
from interp.adapters import HookedModel, adapter_for, run_with_reducers
from interp.adapters.surgery import by_head, head_outputs
from interp.config import RunConfig
from interp.errors import AblationError
from interp.hooks import resid_post_hook, z_hook
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


@dataclass
class UnpatchedBatch:
    """What the unpatched (unablated, or base-ablated) pass over one minibatch leaves for the replays."""

    rows: Tensor
    tokens: Tensor
    resid: list[Tensor]  # the residual stream entering each block
    calls: list[Call]  # how each block was called (besides the residual)
    out: Tensor  # the metric's read-out of this pass
    reference: Tensor  # the unablated read-out (== out without a base ablation)
    z: list[Tensor | None] = field(default_factory=list)  # each layer's hook_z
    attn_out: list[tuple[Tensor, int | None] | None] = field(default_factory=list)  # each attention's output


class Sweeper:
    """Evaluate a metric with many head sets ablated, on one probe.

    ``base`` heads (a mask) stay ablated throughout (used by pruning with re-estimation). With
    ``replay="auto"`` the fast replay is used when replaying the model's blocks reproduces its
    output, else the plain loop; ``"fast"`` insists on the former, ``"loop"`` forces the latter.
    Masks passed to :meth:`evaluate` add to ``base``; :attr:`unpatched` is the metric per sequence with
    only the ``base`` heads ablated (none by default). ``ablation=None``: no head ablation, for a
    subclass that brings interventions of its own (:class:`~interp.patching.edge_patch.EdgeSweeper`'s
    edge codes). ``chunk``: ablations batched into one forward
    by the fast replay (default: as many as make about 2k tokens on a CPU, 16k elsewhere).
    ``config``: its ``minibatch`` (probe sequences per forward, default all), ``seed`` (of a
    resample ablation fitted here) and ``progress`` (progress bars). ``journal`` (an opened
    :class:`~interp.journal.Journal`): :meth:`evaluate` records every head set it finishes there
    and takes those already recorded from it (a resumed run).

    Before any forward pass the memory the replay needs (the clean pass of every sequence is kept)
    is estimated and compared with what the device has free (:mod:`interp.memory`): over it, the
    construction refuses with one line saying what to do.
    """

    units = "head set"  # what one row of :meth:`evaluate` is, in its progress and resume lines
    shortcuts_wanted = True  # the attention shortcut's captures (a subclass that never reuses attention: False)
    fewer = memory.FEWER  # what a refusal for memory asks for, when no smaller minibatch fits

    def __init__(
        self,
        model: HookedModel,
        probe: TokenProbe,
        metric: Metric | Callable,
        *,
        ablation: str | HeadAblation | None = "zero",
        base: Any = None,
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
        if probe.seq_len > self.info.n_ctx:
            raise AblationError(
                f"probe of {probe.seq_len} tokens is longer than the model's context of {self.info.n_ctx}"
            )
        refuse_padded_ablation(probe, ablation)
        self.minibatch = config.minibatch or probe.batch
        self.chunk = chunk
        memory.check(self.memory_estimate, self.minibatch, self.info.device, fewer=self.fewer)  # before any forward
        self.ablation = (  # None: a subclass that brings interventions of its own (edges)
            None
            if ablation is None
            else as_ablation(ablation, model, probe, seed=config.seed, minibatch=config.minibatch)
        )
        self.base = (
            torch.zeros(self.info.n_layers, self.info.n_heads, dtype=torch.bool)
            if base is None
            else head_mask(self.info, base, allow_empty=True)
        )
        self.progress = config.progress
        self.replay = "loop" if replay == "loop" else "fast"
        self.interrupted = False
        self._plans: list[Any] = []
        self._batches = [
            self._capture(torch.arange(s, min(s + self.minibatch, probe.batch)))
            for s in range(0, probe.batch, self.minibatch)
        ]
        self.unpatched = torch.cat([self.metric(b.out, b.tokens, b.reference, b.rows) for b in self._batches])
        # exact shortcuts (interp.adapters.surgery), if the self-check agrees
        self._trim = self.replay == "fast" and self._can_trim()
        # the attention shortcut adds each head's change through W_O: for a kind that replaces hook_z
        self._reuse = self.replay == "fast" and getattr(self.ablation, "site", None) == "z" and self._can_reuse()
        self._head_cache: tuple[Any, int, Any] = (None, -1, None)
        if self.replay == "fast":
            why = self._self_check()
            if why is not None and self._reuse:  # without the shortcuts, one at a time, before giving up
                self._reuse = False
                why = self._self_check()
            if why is not None and self._trim:
                self._trim = False
                why = self._self_check()
            if why is not None:
                if replay == "fast":
                    raise AblationError(f"the fast replay cannot run this model: {why}")
                warnings.warn(f"falling back to the run_with_hooks loop: {why}", stacklevel=2)
                self.replay = "loop"
                for b in self._batches:  # the loop needs none of the shortcuts' captures
                    b.z, b.attn_out = [], []

    # ---- capture and replay -------------------------------------------------------------------

    def _record(self, tokens: Tensor, mask: Tensor | None, rows: Tensor) -> tuple[Tensor, list, list, list, list]:
        """A plain forward with ``mask`` ablated: its read-out, and each block's residual and call,
        ``hook_z`` (after the ablation) and attention output."""
        L, H = self.info.n_layers, self.info.n_heads
        zs: list[Any] = [None] * L
        shortcuts = self.replay == "fast" and self.shortcuts_wanted  # what the attention shortcut needs

        def keep_z(layer: int) -> Callable:
            def hook(z: Tensor, hook: Any) -> None:
                zs[layer] = by_head(z.detach(), H)

            return hook

        layers = self.info.attention_layers
        extra = [(z_hook(l), keep_z(l)) for l in layers] if shortcuts and self.adapter.block_count() == L else []
        with self.adapter.record_blocks(L, keep_attention=shortcuts, detach_call=detach_call) as (calls, attn_out):
            out = self._run(tokens, mask, rows, extra)
        return out, [c and c[0] for c in calls], [c and c[1] for c in calls], zs, attn_out

    def _capture(self, rows: Tensor) -> UnpatchedBatch:
        tokens = self.probe.tokens[rows.to(self.probe.tokens.device)]
        out, resid, calls, zs, attn_out = self._record(tokens, self.base, rows)
        reference = out if not bool(self.base.any()) else self._run(tokens, None, rows)
        return UnpatchedBatch(rows, tokens, resid, calls, out, reference, zs, attn_out)

    def _run(self, tokens: Tensor, mask: Tensor | None, rows: Tensor, extra: list | None = None) -> Tensor:
        """One plain forward with ``mask``'s heads ablated (then ``extra`` hooks); the metric's read-out."""
        hooks = [] if mask is None or self.ablation is None else self.ablation.hooks(mask, rows)
        padding = (
            None
            if self.probe.attention_mask is None
            else self.probe.attention_mask[rows.to(self.probe.attention_mask.device)]
        )
        return read_out(
            self.model, tokens, self.metric, hooks + (extra or []), self.info.n_layers, attention_mask=padding
        )

    def _replay(self, batch: UnpatchedBatch, start: int, masks: Bool[Tensor, "rep layer head *pos"]) -> Tensor:
        """Blocks ``start .. L-1`` on the cached residual, ``rep`` ablations batched; the read-out."""
        rep, model, L, adapter = masks.shape[0], self.model, self.info.n_layers, self.adapter
        hidden = batch.resid[start].repeat(rep, 1, 1)
        reuse = self._reuse and batch.attn_out[start] is not None and batch.z[start] is not None
        hooks = [
            (self.ablation.hook_name(l), self.ablation.layer_hook(l, masks[:, l], batch.rows))
            for l in range(start + 1 if reuse else start, L)
            if bool(masks[:, l].any())
        ]
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(model.hooks(fwd_hooks=hooks))
            if reuse:
                clean, n_out = batch.attn_out[start]
                extra = masks[:, start] & ~_along(self.base, masks)[start]
                stack.enter_context(adapter.reuse_attention(start, clean, n_out, self._per_head(batch, start), extra))
            if self._trim:
                T = hidden.shape[1]
                keep = torch.tensor(sorted({p % T for p in self.metric.positions}))
                stack.enter_context(adapter.trim_mlp(L - 1, keep, T))
            calls = [expand_call(batch.calls[l], self._plans[l], rep) for l in range(start, L)]
            picked = self.metric.read(adapter.run_blocks(hidden, start, calls))
            if self.metric.reads == "logits":
                picked = adapter.unembed(picked)
        return picked

    def _per_head(self, batch: UnpatchedBatch, layer: int) -> Tensor:
        """Each head's change of ``layer``'s attention output on ablation (kept for the last batch and layer)."""
        cached_batch, cached_layer, _ = self._head_cache
        if cached_batch is not batch or cached_layer != layer:
            r = self.ablation.replacement(layer, batch.rows)
            z = batch.z[layer]
            W_O = self.adapter.stacked_W_O()[layer].detach().to(device=z.device)
            self._head_cache = (batch, layer, head_outputs(z, r.to(device=z.device, dtype=z.dtype), W_O))
        return self._head_cache[2]

    def _can_reuse(self) -> bool:
        """Are the stacked ``W_O`` weights readable (not offloaded to the meta device or disk)?"""
        W_O = self.adapter.stacked_W_O()
        shape = (self.info.n_layers, self.info.n_heads)
        return isinstance(W_O, Tensor) and W_O.ndim == 4 and tuple(W_O.shape[:2]) == shape and W_O.device.type != "meta"

    def _can_trim(self) -> bool:
        positions, T = self.metric.positions, self.probe.seq_len
        last = self.info.n_layers - 1
        return positions is not None and self.adapter.can_trim_mlp(last) and len({p % T for p in positions}) < T

    def _self_check(self) -> str | None:
        """Can replaying this model's blocks stand in for running it? ``None`` if so, else why not.

        On two probe sequences: every block argument is classified by recording the calls again for
        three; the replay from block 0 must give the model's own output (two batched copies); and
        replays *under ablation* -- every head of the lowest and the highest layer together, one head
        of the lowest layer alone (batched with it), every head of the highest layer alone -- must
        give what a plain ``run_with_hooks`` with the same heads ablated gives. That error is
        measured against the ablation's own effect on the output, so it means the same in fp32 and in
        bf16: a model whose blocks take inputs computed by earlier blocks (which the replay would
        take from the clean pass) fails it.
        """
        check, why = self._plan_calls()
        if why is not None:
            return why
        try:
            got = self._replay(check, 0, self.base[None].expand(2, -1, -1))
        except Exception as e:  # an architecture whose blocks need more than the recorded call
            return f"replaying its blocks failed ({type(e).__name__}: {e})"
        want = check.out.repeat(2, *[1] * (check.out.ndim - 1))
        if got.shape != want.shape:
            return f"replayed output has shape {list(got.shape)}, the model's {list(want.shape)}"
        scale, bound = _rounding(want)
        noise = float((got - want).abs().max())
        if noise > bound:
            return f"replaying its blocks does not reproduce its output (max error {noise:.2e} of {scale:.2e})"
        rtol = 1e-3 if _eps(want) <= torch.finfo(torch.float32).eps else 0.05
        for start, masks in self._check_masks():
            try:
                got = self._replay(check, start, masks).chunk(masks.shape[0])
            except Exception as e:
                return f"replaying its blocks under ablation failed ({type(e).__name__}: {e})"
            for mask, replayed in zip(masks, got):
                want = self._run(check.tokens, mask, check.rows)
                effect = float((want - check.out).abs().max())
                err = float((replayed - want).abs().max())
                if err > rtol * effect + 2 * noise + 1e-6 * scale:
                    heads = ", ".join(head_labels(mask & ~self.base))
                    return (
                        f"replaying its blocks under {self.ablation.kind} ablation of {heads} does not reproduce "
                        f"a plain run (max error {err:.2e}, the ablation's effect {effect:.2e}): its blocks may "
                        "take inputs computed by earlier blocks, which the replay takes from the clean pass"
                    )
        return None

    def _plan_calls(self) -> tuple[UnpatchedBatch | None, str | None]:
        """The first part of the self-check, which every replay needs: two probe sequences captured,
        and how each block argument is expanded for ``rep`` copies (:attr:`_plans`), read off the
        calls recorded for three; the capture, and why the blocks cannot be replayed (``None``: they can)."""
        if self.adapter.block_count() is None:
            return None, "the model has no `blocks` to replay"
        if self.metric.reads == "logits" and not self.adapter.can_unembed():
            return None, "the model has no ln_final/unembed to read logits with"
        B = self.probe.batch
        check = self._capture(torch.tensor([0, 1]) if B >= 2 else torch.tensor([0, 0]))
        if any(r is None for r in check.resid):
            return check, "the model does not call its `blocks` one after another"
        wider = torch.tensor([0, 1, 0]) if B >= 2 else torch.tensor([0, 0, 0])
        _, _, calls3, _, _ = self._record(self.probe.tokens[wider.to(self.probe.tokens.device)], self.base, wider)
        try:
            self._plans = [call_plan(calls3[l], check.calls[l], 3, 2) for l in range(self.info.n_layers)]
        except UnreplayableCall as e:
            return check, f"a block argument cannot be replayed: {e}"
        return check, None

    def _check_masks(self) -> list[tuple[int, Bool[Tensor, "rep layer head"]]]:
        """Head sets for the self-check, grouped by the block their replay starts at."""
        free = ~self.base
        free[list(self.info.absent_layers)] = False  # layers without attention have no heads to ablate
        layers = free.any(-1).nonzero().squeeze(-1).tolist()
        if not layers:
            return []
        lo, hi = layers[0], layers[-1]
        both, one, top = self.base.clone(), self.base.clone(), self.base.clone()
        both[lo] |= free[lo]
        both[hi] |= free[hi]
        one[lo, int(free[lo].nonzero()[0])] = True
        top[hi] |= free[hi]
        groups = [(lo, torch.stack([both, one]))]
        if hi != lo:
            groups.append((hi, top[None]))
        return groups

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(
        self, masks: Any, *, desc: str = "ablating heads", scope: str | None = None, named: str | None = None
    ) -> Float[Tensor, "n batch"]:
        """The metric per sequence under each head set in ``masks`` (``[n, layer, head]``, added to base).

        ``masks`` may have a position axis, ``[n, layer, head, pos]`` (``pos`` the probe's length): each
        head is then ablated at the positions marked only (activation patching per position).

        On Ctrl-C the evaluation stops, :attr:`interrupted` is set, and the rows not reached are NaN.

        With a :attr:`journal`, each head set is a unit keyed ``(scope, base heads, its heads)``
        (``scope`` defaults to ``desc``: give each evaluation its own; ``named``: the words a
        resume's line names it by, ``"exact patching (z, denoise, by head)"``, default ``the <scope>``), recorded with its
        values as soon as its batched forward is done; head sets already recorded are filled in from
        the journal and not evaluated again. The head sets are cut into batched forwards exactly as
        an uninterrupted run cuts them (a forward whose sets are all recorded is skipped, one with
        any set missing is evaluated whole), so every value is computed by the same forward in both
        runs: bit for bit the same.

        Under ``torchrun`` each rank evaluates its share (every ``world``-th head set) one batched
        forward per round; each round's results are gathered on every rank and rank 0 records
        them, so the ranks never race on the journal (and what rank 0 found there at the start is
        shared with the others first).
        """
        masks = torch.as_tensor(masks, dtype=torch.bool)
        L, H, T = self.info.n_layers, self.info.n_heads, self.probe.seq_len
        if tuple(masks.shape[1:]) not in ((L, H), (L, H, T)):
            raise AblationError(
                f"masks must have shape [n, {L}, {H}] (or [n, {L}, {H}, {T}] per position), got {list(masks.shape)}"
            )
        result = torch.full((masks.shape[0], self.probe.batch), float("nan"))
        base = _along(self.base, masks)
        extra = masks & ~base
        todo = []  # (the first layer a head set touches, its index), in the order they are evaluated
        for i in range(masks.shape[0]):
            if not bool(extra[i].any()):
                result[i] = self.unpatched
            else:
                todo.append((int(extra[i].flatten(1).any(-1).nonzero()[0]), i))
        todo.sort()
        keys: dict[int, Any] = {}
        done: set[int] = set()
        if self.journal is not None and todo:
            keys = self._journal_keys(todo, extra, scope or desc)
            done = self._from_journal(keys, result, named or f"the {scope or desc}")
        self.interrupted = self._rounds(todo, done, masks | base, result, keys, desc)
        return result

    def _journal_keys(self, todo: list[tuple[int, int]], extra: Tensor, where: str) -> dict[int, Any]:
        """Each head set's unit in the journal: ``(scope, base heads, its heads)``."""
        base = tuple(tuple(p) for p in self.base.nonzero().tolist())
        return {i: (where, base, tuple(tuple(p) for p in extra[i].nonzero().tolist())) for _, i in todo}

    def _from_journal(self, keys: dict[int, Any], result: Tensor, named: str) -> set[int]:
        """The head sets the journal holds, filled into ``result``; said on the resume line."""
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
        effective: Tensor,
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
                return (idx, self._evaluate_group(start, effective[idx])), False
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
        if self.replay != "fast":
            return []
        return [name for name, on in (("reused_attention", self._reuse), ("trimmed_mlp", self._trim)) if on]

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
        return memory.sweep_estimate(shape, self.probe.batch, self.probe.seq_len, mb, chunk, n_read)

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

    def _evaluate_group(self, start: int, masks: Bool[Tensor, "rep layer head *pos"]) -> Tensor:
        rep = masks.shape[0]
        values = torch.empty(rep, self.probe.batch)
        for batch in self._batches:
            if self.replay == "loop":
                outs = [self._run(batch.tokens, masks[0], batch.rows)]
            else:
                outs = self._replay(batch, start, masks).chunk(rep)
            for r, out in enumerate(outs):
                values[r, batch.rows] = self.metric(out, batch.tokens, batch.reference, batch.rows).cpu()
        return values


def _along(base: Bool[Tensor, "layer head"], masks: Tensor) -> Tensor:
    """``base`` with a position axis when ``masks`` has one (a base head is ablated everywhere)."""
    return base[..., None] if masks.ndim == 4 else base


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
    return float((got - want).abs().max()) <= _rounding(want)[1]


def _eps(x: Tensor) -> float:
    return torch.finfo(x.dtype).eps if x.is_floating_point() else 0.0


def _rounding(want: Tensor) -> tuple[float, float]:
    """``want``'s scale, and the largest max error a replay of it may show and still reproduce it:
    batched and unbatched matmuls round differently, so that much is allowed, more in low precision."""
    scale = float(want.abs().max()) + 1e-6
    return scale, max(1e-4, 16 * _eps(want)) * scale
