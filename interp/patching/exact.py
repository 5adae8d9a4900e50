"""Exact activation patching per head and per head x position, on the ablation sweep's replay.

Patching is an ablation whose replacement comes from the paired run
(:class:`~interp.ablation.modes.PatchAblation`): each sequence's head output is replaced by that
head's output on the other prompt of its pair. The :class:`~interp.ablation.replay.Sweeper` then
evaluates every patch as one row of a batched replay of the blocks from the patched layer up
(self-checked against plain hooked runs; the plain loop where that check fails), journaled.
"""

from __future__ import annotations

from typing import Any

from jaxtyping import Float
from torch import Tensor

from interp.ablation.modes import PatchAblation
from interp.ablation.replay import Sweeper
from interp.journal import Journal
from interp.patching.core import Setup, masks_of


def exact_values(
    run: Setup, *, replay: str = "auto", chunk: int | None = None, journal: Journal | None = None
) -> tuple[Float[Tensor, "unit pair"], dict[str, Any]]:
    """The patched metric per unit and pair, each patch one row of a batched replay; and the facts
    of the replay (which, its shortcuts, whether Ctrl-C stopped it) for the result's meta."""
    info, T = run.info, run.task.seq_len
    ablation = PatchAblation.fit(run.model, run.probe, minibatch=run.config.minibatch, site=run.site)
    sweeper = Sweeper(
        run.model,
        run.probe,
        run.metric,
        ablation=ablation,
        replay=replay,
        chunk=chunk,
        config=run.config,
        journal=journal,
    )
    masks = masks_of(run.heads, run.positions, info.n_layers, info.n_heads, T, run.group)
    desc = f"patching heads ({run.site}, {run.direction}, by {run.by})"
    values = sweeper.evaluate(
        masks,
        desc=desc,
        scope=f"patch-{run.site}-{run.direction}-{run.by}",  # the journal's key: kept as journals hold it
        named=f"exact patching ({run.site}, {run.direction}, by {run.by})",
    )
    facts: dict[str, Any] = {"replay": sweeper.replay, "shortcuts": sweeper.shortcuts}
    if sweeper.interrupted:
        facts["partial"] = True
    return values, facts
