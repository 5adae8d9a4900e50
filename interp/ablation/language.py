"""The words the one executor (:class:`~interp.ablation.replay.Sweeper`) and its languages share:
what the unpatched pass leaves (:class:`UnpatchedBatch`), what an evaluation's interventions are
(:class:`Units`), what a language does (:class:`Language`) and what it may read of the executor
(:class:`Executor`). Head sets (:mod:`~interp.ablation.head_sets`) and edge codes
(:mod:`~interp.patching.edge_patch`) are the languages.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from interp import memory
from interp.ablation.calls import Call
from interp.ablation.metrics import Metric
from interp.adapters import Adapter, HookedModel
from interp.config import RunConfig
from interp.models import ModelInfo
from interp.probes import TokenProbe


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


class Units(Protocol):
    """The interventions :meth:`~interp.ablation.replay.Sweeper.evaluate` runs, in a language's terms: how many; the first
    block each reaches (past the last layer: nothing is changed, the unpatched run stands); each
    one's journal key (after the evaluation's scope); and, for a batched forward, what the
    language's hooks read (``units[index]``: masks, codes)."""

    def __len__(self) -> int: ...

    def start(self, i: int) -> int: ...

    def key(self, i: int) -> tuple: ...

    def __getitem__(self, index: Sequence[int]) -> Any: ...


class Language(Protocol):
    """One kind of intervention, as the executor (:class:`~interp.ablation.replay.Sweeper`) runs it: head sets
    (:class:`~interp.ablation.head_sets.HeadSets`) or edge codes
    (:class:`~interp.patching.edge_patch.EdgeCodes`). The executor owns the probe's minibatches,
    the unpatched pass, the batched replay of blocks, the loop, the rounds, the journal, the ranks
    and the memory check; a language says what it keeps of the unpatched pass (``capture``), what
    hooks a replay from a block and a plain forward run under (``install``, ``plain``), whether
    the replay can stand in for plain forwards on this model (``settle``), what it refuses
    (``refuse`` before any forward, ``verify`` after the captures) and what its interventions are
    (``units_of``)."""

    units: str  # what one row of :meth:`~interp.ablation.replay.Sweeper.evaluate` is, in progress and resume lines
    fewer: str  # what a refusal for memory asks for, when no smaller minibatch fits
    shortcuts: list[str]  # the exact shortcuts its replay takes

    def refuse(self, sw: Executor) -> None: ...

    def memory(self, sw: Executor, base: memory.Estimate, minibatch: int | None) -> memory.Estimate: ...

    def prepare(self, sw: Executor) -> None: ...

    def capture(self, sw: Executor, rows: Tensor) -> UnpatchedBatch: ...

    def install(self, sw: Executor, stack: ExitStack, batch: UnpatchedBatch, start: int, group: Any) -> int: ...

    def plain(self, sw: Executor, batch: UnpatchedBatch, group: Any) -> Tensor: ...

    def settle(self, sw: Executor) -> str | None: ...

    def verify(self, sw: Executor) -> None: ...

    def to_loop(self, sw: Executor) -> None: ...

    def units_of(self, sw: Executor, interventions: Any) -> Units: ...


class Executor(Protocol):
    """What a language reads of the executor it runs on."""

    model: HookedModel
    probe: TokenProbe
    metric: Metric
    info: ModelInfo
    adapter: Adapter
    config: RunConfig
    replay: str  # "fast" or "loop"
    minibatch: int

    @property
    def chunk_size(self) -> int: ...

    @property
    def batches(self) -> tuple[UnpatchedBatch, ...]: ...

    def unpatched_pass(
        self, rows: Tensor, hooks: list, extra: list, *, keep_attention: bool = False
    ) -> UnpatchedBatch: ...

    def run(self, tokens: Tensor, rows: Tensor, hooks: list) -> Tensor: ...

    def replayed(self, batch: UnpatchedBatch, start: int, group: Any) -> Tensor: ...

    def plan_calls(self) -> tuple[UnpatchedBatch | None, str | None]: ...


__all__ = ["Executor", "Language", "UnpatchedBatch", "Units"]
