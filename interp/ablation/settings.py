"""What a caller chooses for an ablation run: registered names checked, run settings merged.

- :func:`checked`: a name from one of the package's registries (:data:`~interp.ablation.metrics.METRICS`,
  :data:`~interp.ablation.modes.ABLATIONS`, :data:`~interp.ablation.replay.REPLAYS`,
  :data:`~interp.ablation.pruning.ORDERS`). The registry refuses an unknown name with a
  :class:`~interp.errors.UsageError`; the ablation functions have always raised
  :class:`~interp.errors.AblationError` for it, and still do, with the registry's message.
- :func:`run_config`: the :class:`~interp.config.RunConfig` (seed, minibatch, progress) a public
  function runs with, from its ``config=`` and the same settings given as keywords.
- :func:`replay_choice`: the replay asked for, reading the deprecated ``engine=`` keyword.
"""

from __future__ import annotations

import warnings
from typing import Any

from interp.config import RunConfig
from interp.errors import AblationError, UsageError
from interp.registry import Registry

ENGINE_DEPRECATED = (
    "engine= is deprecated for ablation sweeps: use replay= (engine= will be removed in the next release)"
)


def checked(registry: Registry, name: Any) -> str:
    """``name`` if ``registry`` has it, else :class:`AblationError` naming the choices."""
    try:
        return registry.check(name)
    except UsageError as e:
        raise AblationError(str(e)) from None


def run_config(config: RunConfig | None = None, **given: Any) -> RunConfig:
    """``config`` (or the defaults) with the settings ``given`` as keywords; ``None`` means not given."""
    return RunConfig.of(config, **{k: v for k, v in given.items() if v is not None})


def replay_choice(replay: str, engine: str | None, *, stacklevel: int = 3) -> str:
    """``replay``, or the deprecated ``engine=`` (fast/loop/auto) with a :class:`DeprecationWarning`."""
    if engine is None:
        return replay
    warnings.warn(ENGINE_DEPRECATED, DeprecationWarning, stacklevel=stacklevel)
    if replay != "auto" and replay != engine:
        raise AblationError(f"replay={replay!r} and the deprecated engine={engine!r} disagree: give replay= only")
    return engine
