"""Which engine scores a probe: the pattern engine (hooks on ``hook_pattern``) or the stream engine.

``"auto"`` keeps the pattern engine, the reference, while one layer's pattern for a forward pass
(``sequences x heads x T x T`` float32 weights) fits the budget, 1 GiB by default, and streams
beyond it. The model's own attention needs about as much again, so the budget is about half of
what the pattern engine really takes.
"""

from __future__ import annotations

import dataclasses

from interp import distributed
from interp.adapters import HookedModel, describe
from interp.config import PATTERN_BUDGET, RunConfig
from interp.registry import Registry

ENGINES: Registry[str] = Registry("engine")
ENGINES.add(
    "auto",
    f"stream when one layer's pattern for a forward pass would exceed the budget ({PATTERN_BUDGET >> 30} GiB by default), else pattern",
)
ENGINES.add("pattern", "reduce each layer's attention pattern in its hook (the reference)")
ENGINES.add("stream", "never form the T x T pattern: memory linear in T, for long probes")


def pattern_bytes(n_seqs: int, n_heads: int, seq_len: int) -> int:
    """Bytes of one layer's float32 pattern for ``n_seqs`` sequences."""
    return 4 * n_seqs * n_heads * seq_len * seq_len


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.5g} GiB" if n_bytes >= 2**27 else f"{n_bytes / 2**20:.3g} MiB"


def choose_engine(
    engine: str,
    model: HookedModel,
    n_seqs: int,
    seq_len: int,
    budget: int = PATTERN_BUDGET,
) -> tuple[str, str]:
    """``(engine, why)``: resolve ``"auto"`` for ``n_seqs`` sequences per forward pass of ``seq_len``."""
    ENGINES.check(engine)
    size = pattern_bytes(n_seqs, describe(model).n_heads, seq_len)
    what = f"one layer's pattern for {n_seqs} x {seq_len} tokens takes {gib(size)}"
    if engine != "auto":
        return engine, f"{engine} (asked for; {what})"
    if size > budget:
        return "stream", f"stream ({what}, over the {gib(budget)} budget)"
    return "pattern", f"pattern ({what}, within the {gib(budget)} budget)"


def engine_run(config: RunConfig, model: HookedModel, n_seqs: int, seq_len: int) -> tuple[RunConfig, str]:
    """The run settings each forward of an analysis gets, its engine resolved (:func:`choose_engine`
    for ``n_seqs`` sequences of ``seq_len`` tokens, at most ``config.minibatch`` per pass) and its
    progress on rank 0 only; and why that engine."""
    n = min(config.minibatch or n_seqs, n_seqs)
    engine, why = choose_engine(config.engine, model, n, seq_len, config.budget)
    return dataclasses.replace(config, engine=engine, progress=config.progress and distributed.is_main()), why
