"""Names a caller chooses for an ablation run, checked against the package's registries.

:func:`checked`: a name from one of the package's registries (:data:`~interp.ablation.metrics.METRICS`,
:data:`~interp.ablation.modes.ABLATIONS`, :data:`~interp.ablation.replay.REPLAYS`,
:data:`~interp.ablation.pruning.ORDERS`). The registry refuses an unknown name with a
:class:`~interp.errors.UsageError`; the ablation functions have always raised
:class:`~interp.errors.AblationError` for it, and still do, with the registry's message.
Run settings come as ``config=RunConfig(...)`` only (:meth:`interp.config.RunConfig.of`).
"""

from __future__ import annotations

from typing import Any

from interp.errors import AblationError, UsageError
from interp.registry import Registry


def checked(registry: Registry, name: Any) -> str:
    """``name`` if ``registry`` has it, else :class:`AblationError` naming the choices."""
    try:
        return registry.check(name)
    except UsageError as e:
        raise AblationError(str(e), params=e.params) from None
