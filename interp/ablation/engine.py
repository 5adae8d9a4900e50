"""The replay engine: evaluate a metric under many head sets at once."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from interp import distributed
from interp.ablation.metrics import Metric, as_metric
from interp.ablation.modes import HeadAblation, head_mask
from interp.errors import AblationError
from interp.hooks import release_kept_pattern, resid_post_hook, run_with_reducers, z_hook
from interp.models import describe
from interp.probes import TokenProbe

ENGINES = ("auto", "fast", "loop")

# Tokens per batched forward of the fast engine, unless told otherwise. On a CPU, batches past a
# couple of thousand tokens run slower per token (elementwise ops leave the caches); GPUs want more.
_TOKEN_BUDGET = {"cpu": 2048, "other": 16384}


@dataclass
class CleanBatch:
    """What the clean (or base-ablated) pass over one minibatch leaves for the replays."""

    rows: Tensor
    tokens: Tensor
    resid: list[Tensor]  # the residual stream entering each block
    calls: list[tuple[tuple, dict]]  # how each block was called (besides the residual)
    out: Tensor  # the metric's read-out of this pass
    reference: Tensor  # the unablated read-out (== out without a base ablation)


class Sweeper:
    """Evaluate a metric with many head sets ablated, on one probe.

    ``base`` heads (a mask) stay ablated throughout (used by pruning with re-estimation). With
    ``engine="auto"`` the fast replay engine is used when replaying the model's blocks reproduces
    its output, else the plain loop; ``"fast"`` insists on the former, ``"loop"`` forces the latter.
    Masks passed to :meth:`evaluate` add to ``base``; :attr:`clean` is the metric per sequence with
    only the ``base`` heads ablated (none by default). ``minibatch``: probe sequences per forward
    (default all); ``chunk``: ablations batched into one forward by the fast engine (default: as many
    as make about 2k tokens on a CPU, 16k elsewhere).
    """

    def __init__(
        self,
        model: Any,
        probe: TokenProbe,
        metric: Metric | Callable,
        *,
        ablation: str | HeadAblation = "zero",
        base: Any = None,
        engine: str = "auto",
        minibatch: int | None = None,
        chunk: int | None = None,
        seed: int = 0,
        progress: bool = False,
    ):
        if engine not in ENGINES:
            raise AblationError(f"unknown engine {engine!r}: choose from {list(ENGINES)}")
        self.model, self.probe, self.metric = model, probe, as_metric(metric)
        self.info = describe(model)
        if probe.seq_len > self.info.n_ctx:
            raise AblationError(
                f"probe of {probe.seq_len} tokens is longer than the model's context of {self.info.n_ctx}"
            )
        self.ablation = (
            ablation
            if isinstance(ablation, HeadAblation)
            else HeadAblation.fit(model, ablation, probe, seed=seed, minibatch=minibatch)
        )
        self.base = (
            torch.zeros(self.info.n_layers, self.info.n_heads, dtype=torch.bool)
            if base is None
            else head_mask(self.info, base, allow_empty=True)
        )
        self.minibatch = minibatch or probe.batch
        self.chunk, self.progress = chunk, progress
        self.engine = "loop" if engine == "loop" else "fast"
        self.interrupted = False
        self._batches = [
            self._capture(torch.arange(s, min(s + self.minibatch, probe.batch)))
            for s in range(0, probe.batch, self.minibatch)
        ]
        self.clean = torch.cat([self.metric(b.out, b.tokens, b.reference, b.rows) for b in self._batches])
        if self.engine == "fast":
            why = self._self_check()
            if why is not None:
                if engine == "fast":
                    raise AblationError(f"the fast engine cannot run this model: {why}")
                warnings.warn(f"falling back to the run_with_hooks loop: {why}", stacklevel=2)
                self.engine = "loop"

    # ---- capture and replay -------------------------------------------------------------------

    def _capture(self, rows: Tensor) -> CleanBatch:
        model, L = self.model, self.info.n_layers
        tokens = self.probe.tokens[rows.to(self.probe.tokens.device)]
        calls: list[Any] = [None] * L
        blocks = getattr(model, "blocks", None)
        handles = []
        if blocks is not None and len(blocks) == L:

            def record(layer: int) -> Callable:
                def pre(module: Any, args: tuple, kwargs: dict) -> None:
                    calls[layer] = _detach_call(args, kwargs)

                return pre

            handles = [b.register_forward_pre_hook(record(l), with_kwargs=True) for l, b in enumerate(blocks)]
        try:
            out = self._run(tokens, self.base, rows)
        finally:
            for h in handles:
                h.remove()
        reference = out if not bool(self.base.any()) else self._run(tokens, None, rows)
        resid = [c[0][0] if c is not None else None for c in calls]
        return CleanBatch(rows, tokens, resid, [c if c is None else (c[0][1:], c[1]) for c in calls], out, reference)

    def _run(self, tokens: Tensor, mask: Tensor | None, rows: Tensor) -> Tensor:
        """One plain forward with ``mask``'s heads ablated; the metric's read-out."""
        hooks = [] if mask is None else self.ablation.hooks(mask, rows)
        return read_out(self.model, tokens, self.metric, hooks, self.info.n_layers)

    def _replay(self, batch: CleanBatch, start: int, masks: Bool[Tensor, "rep layer head"]) -> Tensor:
        """Blocks ``start .. L-1`` on the cached residual, ``rep`` ablations batched; the read-out."""
        rep, model, L = masks.shape[0], self.model, self.info.n_layers
        hidden = batch.resid[start].repeat(rep, 1, 1)
        hooks = [
            (z_hook(l), self.ablation.layer_hook(l, masks[:, l], batch.rows))
            for l in range(start, L)
            if bool(masks[:, l].any())
        ]
        b = batch.tokens.shape[0]
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            for l in range(start, L):
                args, kwargs = _expand_call(batch.calls[l], b, rep)
                out = model.blocks[l](hidden, *args, **kwargs)
                hidden = out[0] if isinstance(out, (tuple, list)) else out
                release_kept_pattern(model, l)  # the bridge would keep [rep * batch, head, T, T] alive
            picked = self.metric.read(hidden)
            if self.metric.reads == "logits":
                picked = model.unembed(model.ln_final(picked))
        return picked

    def _self_check(self) -> str | None:
        """Replay the first minibatch from block 0 (two copies): does it give the model's own output?"""
        batch = self._batches[0]
        if any(r is None for r in batch.resid):
            return "the model does not call its `blocks` one after another"
        if self.metric.reads == "logits" and not (hasattr(self.model, "ln_final") and hasattr(self.model, "unembed")):
            return "the model has no ln_final/unembed to read logits with"
        try:
            got = self._replay(batch, 0, self.base[None].expand(2, -1, -1))
        except Exception as e:  # an architecture whose blocks need more than the recorded call
            return f"replaying its blocks failed ({type(e).__name__}: {e})"
        want = batch.out.repeat(2, *[1] * (batch.out.ndim - 1))
        if got.shape != want.shape:
            return f"replayed output has shape {list(got.shape)}, the model's {list(want.shape)}"
        scale = float(want.abs().max()) + 1e-6
        err = float((got - want).abs().max())
        # batched and unbatched matmuls round differently: allow that much in low precision
        tol = max(1e-4, 16 * torch.finfo(want.dtype).eps) if want.is_floating_point() else 1e-4
        if err > tol * scale:
            return f"replaying its blocks does not reproduce its output (max error {err:.2e} of {scale:.2e})"
        return None

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(self, masks: Any, *, desc: str = "ablating heads") -> Float[Tensor, "n batch"]:
        """The metric per sequence under each head set in ``masks`` (``[n, layer, head]``, added to base).

        On Ctrl-C the evaluation stops, :attr:`interrupted` is set, and the rows not reached are NaN.
        """
        masks = torch.as_tensor(masks, dtype=torch.bool)
        if masks.ndim != 3 or tuple(masks.shape[1:]) != (self.info.n_layers, self.info.n_heads):
            raise AblationError(
                f"masks must have shape [n, {self.info.n_layers}, {self.info.n_heads}], got {list(masks.shape)}"
            )
        n = masks.shape[0]
        result = torch.full((n, self.probe.batch), float("nan"))
        extra = masks & ~self.base
        effective = masks | self.base
        todo = []
        for i in range(n):
            if not bool(extra[i].any()):
                result[i] = self.clean
            else:
                todo.append((int(extra[i].any(-1).nonzero()[0]), i))
        todo.sort()
        mine = distributed.shard(todo)  # under torchrun: every world-th head set, balanced over layers

        def evaluate_mine() -> tuple[list[int], Tensor, bool]:
            values = torch.full((n, self.probe.batch), float("nan"))
            stopped = False
            bar = tqdm(
                self._groups(mine), desc=desc, disable=not (self.progress and distributed.is_main()), unit="batch"
            )
            try:
                for start, idx in bar:
                    values[idx] = self._evaluate_group(start, effective[idx])
            except KeyboardInterrupt:
                stopped = True
            finally:
                bar.close()
            rows = [i for _, i in mine]
            return rows, values[rows], stopped

        parts = distributed.run_sharded(evaluate_mine, desc)
        for rows, values, _ in parts:
            result[rows] = values
        self.interrupted = any(stopped for _, _, stopped in parts)
        return result

    @property
    def batches(self) -> tuple[CleanBatch, ...]:
        """The clean (or base-ablated) pass over each minibatch of the probe, as the replays use it."""
        return tuple(self._batches)

    @property
    def chunk_size(self) -> int:
        """How many ablations the fast engine batches into one forward."""
        budget = _TOKEN_BUDGET["cpu" if self.info.device.type == "cpu" else "other"]
        return self.chunk or max(1, budget // (self.minibatch * self.probe.seq_len))

    def _groups(self, todo: list[tuple[int, int]]) -> list[tuple[int, list[int]]]:
        """Masks grouped by the first layer they touch, cut into chunks of one batched forward."""
        if self.engine == "loop":
            return [(start, [i]) for start, i in todo]
        chunk = self.chunk_size
        groups: list[tuple[int, list[int]]] = []
        for start, i in todo:
            if groups and groups[-1][0] == start and len(groups[-1][1]) < chunk:
                groups[-1][1].append(i)
            else:
                groups.append((start, [i]))
        return groups

    def _evaluate_group(self, start: int, masks: Bool[Tensor, "rep layer head"]) -> Tensor:
        rep = masks.shape[0]
        values = torch.empty(rep, self.probe.batch)
        for batch in self._batches:
            if self.engine == "loop":
                outs = [self._run(batch.tokens, masks[0], batch.rows)]
            else:
                outs = self._replay(batch, start, masks).chunk(rep)
            for r, out in enumerate(outs):
                values[r, batch.rows] = self.metric(out, batch.tokens, batch.reference, batch.rows).cpu()
        return values


def read_out(model: Any, tokens: Tensor, metric: Metric, hooks: list, n_layers: int, *, grad: bool = False) -> Tensor:
    """Run ``model`` with ``hooks``; return the metric's read-out (logits or final hidden state)."""
    if metric.reads == "logits":
        logits = run_with_reducers(model, tokens, hooks, grad=grad)
        return metric.read(logits)
    seen: dict[str, Tensor] = {}
    last = resid_post_hook(n_layers - 1)

    def grab(x: Tensor, hook: Any) -> None:
        seen["hidden"] = x

    run_with_reducers(model, tokens, [*hooks, (last, grab)], stop_after=last, grad=grad)
    return metric.read(seen["hidden"])


def _is_cache(x: Any) -> bool:
    return type(x).__name__.endswith("Cache")


def _detach_call(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A block call to replay later: the residual first, KV caches dropped, ``use_cache`` off."""
    if args:
        hidden, rest = args[0], args[1:]
    else:
        kwargs = dict(kwargs)
        hidden, rest = kwargs.pop("hidden_states"), ()
    rest = tuple(None if _is_cache(a) else a for a in rest)
    kw = {k: (None if _is_cache(v) else v) for k, v in kwargs.items()}
    if "use_cache" in kw:
        kw["use_cache"] = False
    return (hidden.detach(), *rest), kw


def _expand_call(call: tuple[tuple, dict], batch: int, rep: int) -> tuple[tuple, dict]:
    """Repeat every per-sequence tensor of a recorded block call ``rep`` times along the batch."""

    def grow(x: Any) -> Any:
        if isinstance(x, Tensor) and x.ndim >= 2 and x.shape[0] == batch and batch > 1 and rep > 1:
            return x.repeat(rep, *[1] * (x.ndim - 1))
        if isinstance(x, tuple):
            return tuple(grow(v) for v in x)
        return x

    args, kwargs = call
    return tuple(grow(a) for a in args), {k: grow(v) for k, v in kwargs.items()}
