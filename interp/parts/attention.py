"""The parts read from attention on seeded probes of random tokens: the head scores and the sink report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from interp.adapters import HookedModel, ModelInfo
from interp.config import RunConfig
from interp.parts.base import Given, PartResult, part
from interp.parts.shape import body_room, default_block_len, frame, info_of, n_heads
from interp.progress import forward_work

# ---- the head scores ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreSizes:
    """The repeated-token probe of the head scores: ``batch`` sequences of ``repeats`` x a block of
    ``seq_len`` random tokens (None: :func:`default_block_len`)."""

    batch: int = 10
    seq_len: int | None = 50
    repeats: int = 2

    def block(self, info: ModelInfo) -> int:
        return self.seq_len or default_block_len(body_room(info), self.repeats)

    def tokens(self, info: ModelInfo) -> tuple[int, str]:
        """Tokens of the probe in all, and the probe in words."""
        T = self.block(info) * self.repeats + frame(info)
        return self.batch * T, f"{self.batch} sequences of {T} tokens"

    def probe(self, model: HookedModel, info: ModelInfo, seed: int) -> Any:
        from interp.probes import repeated_tokens

        return repeated_tokens(model, batch=self.batch, block_len=self.block(info), n_repeats=self.repeats, seed=seed)


def _scores_work(info: ModelInfo, sizes: ScoreSizes) -> tuple[str, float]:
    tokens, probe = sizes.tokens(info)
    return f"the head scores ({n_heads(info)} heads x {probe})", forward_work(tokens, info.n_layers, info.d_model)


@part(
    "scores",
    "the head scores with their CIs on repeated random tokens",
    ScoreSizes,
    work=_scores_work,
    order=0,
    place=0,
    base=True,
)
def _scores(model: HookedModel, sizes: ScoreSizes, cfg: RunConfig, given: Given) -> PartResult:
    from interp.heads import head_scores, uniform_baselines

    probe = sizes.probe(model, info_of(model), cfg.seed)
    scores = head_scores(model, probe, config=cfg)
    return PartResult(scores.table, uniform_baselines(probe), result=scores, probe=probe)


# ---- the sink report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkSizes:
    """The sink probe: ``batch`` sequences of ``seq_len`` random tokens (at most what the context holds)."""

    batch: int = 16
    seq_len: int = 64

    def length(self, info: ModelInfo) -> int:
        return min(self.seq_len, body_room(info))


def _sinks_work(info: ModelInfo, sizes: SinkSizes) -> tuple[str, float]:
    T = sizes.length(info) + frame(info)
    return f"the sink report ({sizes.batch} x {T} tokens)", forward_work(sizes.batch * T, info.n_layers, info.d_model)


@part(
    "sinks",
    "the sink report on random tokens (first-token mass, Sink^eps per layer)",
    SinkSizes,
    work=_sinks_work,
    order=2,
    atlas="sinks",
    place=1,
)
def _sinks(model: HookedModel, sizes: SinkSizes, cfg: RunConfig, given: Given) -> PartResult:
    from interp.probes import random_tokens
    from interp.sinks import sink_scores

    probe = random_tokens(model, batch=sizes.batch, seq_len=sizes.length(info_of(model)), seed=cfg.seed)
    report = sink_scores(model, probe, config=cfg)
    columns = report.heads.table[["layer", "head", "first_mass", "first_mass_lo", "first_mass_hi"]]
    meta = dict(sink_probe=probe.meta, epsilon=report.meta["epsilon"], sink_rate=report.sink_rate)
    return PartResult(columns, {"first_mass": float(report.meta["uniform_first_mass"])}, meta=meta, result=report)


__all__ = ["ScoreSizes", "SinkSizes"]
