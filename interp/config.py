"""One run configuration for every analysis, and the one run header every result records.

:class:`RunConfig` holds what every analysis takes beyond the model and the probe: the bootstrap
(size, level), the seed, the minibatch, progress, and the engine with its memory budget. Every
public analysis takes them one way, ``config=RunConfig(...)`` (``head_scores(model, probe,
config=RunConfig(n_boot=200))``), and no analysis takes them as keywords of its own;
:meth:`RunConfig.of` gives the defaults for ``config=None``.

:func:`run_header` writes the facts of a run (model, shape, causality, probe, configuration) that
the ``meta`` of every result starts with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from interp.errors import UsageError

if TYPE_CHECKING:
    from interp.models import ModelInfo
    from interp.probes import TokenProbe

PATTERN_BUDGET = 1 << 30  # bytes: engine="auto" streams when one layer's pattern would exceed this


@dataclass(frozen=True)
class RunConfig:
    """What every analysis takes besides the model and the probe."""

    n_boot: int = 1000  # bootstrap resamples over probe sequences
    level: float = 0.95  # confidence level of the intervals
    seed: int = 0  # probes, bootstrap, resampling donors
    minibatch: int | None = None  # sequences per forward pass (None: the whole probe)
    progress: bool = False  # progress bars / lines
    engine: str = "auto"  # "pattern", "stream" or "auto" (see interp.stream.budget)
    budget: int = PATTERN_BUDGET  # bytes of one layer's pattern above which "auto" streams

    def __post_init__(self) -> None:
        if not isinstance(self.n_boot, int) or self.n_boot < 1:
            raise UsageError(f"n_boot must be an integer >= 1, got {self.n_boot!r}")
        if not 0.0 < float(self.level) < 1.0:
            raise UsageError(f"level must be in (0, 1), got {self.level!r}")
        if self.minibatch is not None and (not isinstance(self.minibatch, int) or self.minibatch < 1):
            raise UsageError(f"minibatch must be an integer >= 1 or None, got {self.minibatch!r}")
        if not isinstance(self.budget, int) or self.budget < 1:
            raise UsageError(f"budget must be a positive number of bytes, got {self.budget!r}")

    @classmethod
    def of(cls, config: RunConfig | None = None) -> RunConfig:
        """``config``, or the defaults when it is None; anything else is refused."""
        if config is None:
            return cls()
        if not isinstance(config, RunConfig):
            raise UsageError(f"config must be an interp.RunConfig, got {type(config).__name__}")
        return config

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def run_header(info: ModelInfo, probe: TokenProbe | None = None, **extra: Any) -> dict[str, Any]:
    """The facts every result's ``meta`` starts with: the model, its shape and causality, the probe,
    then ``extra`` (settings of this run, e.g. ``**config.as_dict()``) in the order given."""
    header: dict[str, Any] = {
        "model": info.name,
        "n_layers": info.n_layers,
        "n_heads": info.n_heads,
        "causal": info.is_causal,
    }
    if probe is not None:
        header["probe"] = probe.meta
    header.update(extra)
    return header


__all__ = ["PATTERN_BUDGET", "RunConfig", "run_header"]
