"""Head sets: the node interventions the replay runs (:class:`~interp.ablation.replay.Sweeper`).

An intervention is a mask of heads (``[layer, head]``, or ``[layer, head, pos]`` to ablate each head
at the marked positions alone), each head's output replaced as a :class:`~interp.ablation.modes.HeadAblation`
kind says (zero, mean, resample, the paired prompt's), over ``base`` heads ablated throughout.
:class:`HeadSets` is how the executor captures, replays and checks them; it is the language
:class:`~interp.ablation.replay.Sweeper` speaks unless given another (edge codes,
:class:`~interp.patching.edge_patch.EdgeCodes`). Where the model allows, its replay takes two
exact shortcuts (:mod:`interp.adapters.surgery`): the lowest replayed layer's attention is reused
and only each head's change added, and the last MLP runs at the positions the metric reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from interp import memory
from interp.ablation.calls import eps_of, replay_tolerance
from interp.ablation.language import Executor, UnpatchedBatch
from interp.ablation.metrics import refuse_padded_ablation
from interp.ablation.modes import HeadAblation, as_ablation, head_labels, head_mask
from interp.adapters.surgery import by_head, head_outputs
from interp.errors import AblationError
from interp.hooks import z_hook


class HeadSetUnits:
    """Head sets as the executor's units: each mask added to ``base``; a set is keyed in the
    journal by ``(base heads, its heads)`` and starts at the first layer it touches beyond ``base``."""

    def __init__(self, masks: Bool[Tensor, "n layer head *pos"], base: Bool[Tensor, "layer head"], n_layers: int):
        self.base = _along(base, masks)
        self.extra = masks & ~self.base
        self.effective = masks | self.base
        self.n_layers = n_layers
        self._base_key = tuple(tuple(p) for p in base.nonzero().tolist())

    def __len__(self) -> int:
        return self.extra.shape[0]

    def start(self, i: int) -> int:
        touched = self.extra[i].flatten(1).any(-1).nonzero()
        return int(touched[0]) if len(touched) else self.n_layers + 1

    def key(self, i: int) -> tuple:
        return (self._base_key, tuple(tuple(p) for p in self.extra[i].nonzero().tolist()))

    def __getitem__(self, index: Sequence[int]) -> Tensor:
        return self.effective[list(index)]


class HeadSets:
    """The head-set language: ``ablation`` (a kind's name or a :class:`HeadAblation`) replaces each
    head ablated; ``base`` heads (anything :func:`head_mask` reads; default none) stay ablated in
    every run, the unpatched one included."""

    units = "head set"
    fewer = memory.FEWER

    def __init__(self, ablation: str | HeadAblation = "zero", base: Any = None):
        self.spec, self.base_spec = ablation, base
        self.ablation: HeadAblation | None = None
        self.base: Tensor | None = None
        self.reuse = self.trim = False
        self._head_cache: tuple[Any, int, Any] = (None, -1, None)

    # ---- before any forward, and after the memory check -----------------------------------------

    def refuse(self, sw: Executor) -> None:
        refuse_padded_ablation(sw.probe, self.spec)

    def prepare(self, sw: Executor) -> None:
        """The ablation fitted (a mean or resample kind runs forwards) and the base mask read."""
        cfg = sw.config
        self.ablation = as_ablation(self.spec, sw.model, sw.probe, seed=cfg.seed, minibatch=cfg.minibatch)
        info = sw.info
        self.base = (
            torch.zeros(info.n_layers, info.n_heads, dtype=torch.bool)
            if self.base_spec is None
            else head_mask(info, self.base_spec, allow_empty=True)
        )

    def memory(self, sw: Executor, base: memory.Estimate, minibatch: int | None) -> memory.Estimate:
        return base

    # ---- the unpatched pass, a plain run, the replay ----------------------------------------

    def hooks(self, mask: Tensor | None, rows: Tensor) -> list:
        return [] if mask is None else self.ablation.hooks(mask, rows)

    def capture(self, sw: Executor, rows: Tensor) -> UnpatchedBatch:
        """The base-ablated pass over ``rows``, with what the attention shortcut reads (each layer's
        ``hook_z`` and attention output) where the fast replay may take it."""
        H = sw.info.n_heads
        shortcuts = sw.replay == "fast"  # the attention shortcut's captures
        zs: list[Any] = [None] * sw.info.n_layers

        def keep_z(layer: int) -> Any:
            def hook(z: Tensor, hook: Any) -> None:
                zs[layer] = by_head(z.detach(), H)

            return hook

        extra = []
        if shortcuts and sw.adapter.block_count() == sw.info.n_layers:
            extra = [(z_hook(l), keep_z(l)) for l in sw.info.attention_layers]
        batch = sw.unpatched_pass(rows, self.hooks(self.base, rows), extra, keep_attention=shortcuts)
        batch.z = zs
        return batch

    def plain(self, sw: Executor, batch: UnpatchedBatch, masks: Tensor) -> Tensor:
        """The reference: one plain forward per head set (the loop's groups hold one)."""
        return torch.cat([sw.run(batch.tokens, batch.rows, self.hooks(m, batch.rows)) for m in masks])

    def install(self, sw: Executor, stack: ExitStack, batch: UnpatchedBatch, start: int, masks: Tensor) -> int:
        """The hooks of a replay of blocks ``start ..`` under ``masks`` (``[rep, layer, head *pos]``):
        each touched layer's ablation, the attention shortcut at ``start``, the trimmed last MLP."""
        L = sw.info.n_layers
        reuse = self.reuse and batch.attn_out[start] is not None and batch.z[start] is not None
        hooks = [
            (self.ablation.hook_name(l), self.ablation.layer_hook(l, masks[:, l], batch.rows))
            for l in range(start + 1 if reuse else start, L)
            if bool(masks[:, l].any())
        ]
        stack.enter_context(sw.model.hooks(fwd_hooks=hooks))
        if reuse:
            clean, n_out = batch.attn_out[start]
            extra = masks[:, start] & ~_along(self.base, masks)[start]
            stack.enter_context(
                sw.adapter.reuse_attention(start, clean, n_out, self._per_head(sw, batch, start), extra)
            )
        if self.trim:
            T = batch.resid[start].shape[1]
            keep = torch.tensor(sorted({p % T for p in sw.metric.positions}))
            stack.enter_context(sw.adapter.trim_mlp(L - 1, keep, T))
        return start

    def _per_head(self, sw: Executor, batch: UnpatchedBatch, layer: int) -> Tensor:
        """Each head's change of ``layer``'s attention output on ablation (kept for the last batch and layer)."""
        cached_batch, cached_layer, _ = self._head_cache
        if cached_batch is not batch or cached_layer != layer:
            r = self.ablation.replacement(layer, batch.rows)
            z = batch.z[layer]
            W_O = sw.adapter.stacked_W_O()[layer].detach().to(device=z.device)
            self._head_cache = (batch, layer, head_outputs(z, r.to(device=z.device, dtype=z.dtype), W_O))
        return self._head_cache[2]

    # ---- units -------------------------------------------------------------------------------

    def units_of(self, sw: Executor, masks: Any) -> HeadSetUnits:
        masks = torch.as_tensor(masks, dtype=torch.bool)
        L, H, T = sw.info.n_layers, sw.info.n_heads, sw.probe.seq_len
        if tuple(masks.shape[1:]) not in ((L, H), (L, H, T)):
            raise AblationError(
                f"masks must have shape [n, {L}, {H}] (or [n, {L}, {H}, {T}] per position), got {list(masks.shape)}"
            )
        return HeadSetUnits(masks, self.base, L)

    # ---- can the replay stand in for a plain run? -------------------------------------------------

    def settle(self, sw: Executor) -> str | None:
        """Which exact shortcuts the replay takes, and why it cannot run at all (``None``: it can).
        Each shortcut the self-check faults is dropped, one at a time, before giving up."""
        self.trim = self._can_trim(sw)
        self.reuse = getattr(self.ablation, "site", None) == "z" and self._can_reuse(sw)
        why = self.check(sw)
        if why is not None and self.reuse:
            self.reuse = False
            why = self.check(sw)
        if why is not None and self.trim:
            self.trim = False
            why = self.check(sw)
        return why

    def verify(self, sw: Executor) -> None:
        """Nothing to refuse: a head's ablation is what its kind defines on any model."""

    def to_loop(self, sw: Executor) -> None:
        """Falling back to the loop: it needs none of the shortcuts' captures."""
        self.reuse = self.trim = False
        for b in sw.batches:
            b.z, b.attn_out = [], []

    @property
    def shortcuts(self) -> list[str]:
        return [name for name, on in (("reused_attention", self.reuse), ("trimmed_mlp", self.trim)) if on]

    def _can_reuse(self, sw: Executor) -> bool:
        """Are the stacked ``W_O`` weights readable (not offloaded to the meta device or disk)?"""
        W_O = sw.adapter.stacked_W_O()
        shape = (sw.info.n_layers, sw.info.n_heads)
        return isinstance(W_O, Tensor) and W_O.ndim == 4 and tuple(W_O.shape[:2]) == shape and W_O.device.type != "meta"

    def _can_trim(self, sw: Executor) -> bool:
        positions, T = sw.metric.positions, sw.probe.seq_len
        last = sw.info.n_layers - 1
        return positions is not None and sw.adapter.can_trim_mlp(last) and len({p % T for p in positions}) < T

    def check(self, sw: Executor) -> str | None:
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
        check, why = sw.plan_calls()
        if why is not None:
            return why
        try:
            got = sw.replayed(check, 0, self.base[None].expand(2, -1, -1))
        except Exception as e:  # an architecture whose blocks need more than the recorded call
            return f"replaying its blocks failed ({type(e).__name__}: {e})"
        want = check.out.repeat(2, *[1] * (check.out.ndim - 1))
        if got.shape != want.shape:
            return f"replayed output has shape {list(got.shape)}, the model's {list(want.shape)}"
        scale, bound = replay_tolerance(want)
        noise = float((got - want).abs().max())
        if noise > bound:
            return f"replaying its blocks does not reproduce its output (max error {noise:.2e} of {scale:.2e})"
        rtol = 1e-3 if eps_of(want) <= torch.finfo(torch.float32).eps else 0.05
        for start, masks in self._check_masks(sw):
            try:
                got = sw.replayed(check, start, masks).chunk(masks.shape[0])
            except Exception as e:
                return f"replaying its blocks under ablation failed ({type(e).__name__}: {e})"
            for mask, replayed in zip(masks, got):
                want = sw.run(check.tokens, check.rows, self.hooks(mask, check.rows))
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

    def _check_masks(self, sw: Executor) -> list[tuple[int, Bool[Tensor, "rep layer head"]]]:
        """Head sets for the self-check, grouped by the block their replay starts at."""
        free = ~self.base
        free[list(sw.info.absent_layers)] = False  # layers without attention have no heads to ablate
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


def _along(base: Bool[Tensor, "layer head"], masks: Tensor) -> Tensor:
    """``base`` with a position axis when ``masks`` has one (a base head is ablated everywhere)."""
    return base[..., None] if masks.ndim == 4 else base


__all__ = ["HeadSetUnits", "HeadSets"]
