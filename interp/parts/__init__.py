"""The analyses as parts: one registry (:data:`PARTS`) that the atlas, the checkpoint sweep and
``interp roles`` loop over (see :mod:`interp.parts.base`).

Adding an analysis to all three is one registration: ``@part(name, help, Sizes, work=..., order=...)``
over its ``run`` in a module imported here. ``order`` is when it runs (the task first, so that a task
the model cannot run stops a run before the long parts; the parts that read the role table last);
``place`` is where its columns go in the role table (1: beside the head scores, the role scores;
2: the ablations' importances; 3: after them); ``atlas`` names the :class:`~interp.report.Atlas`
field its result fills. The modules register in the order the atlas lists its parts.
"""

from __future__ import annotations

from interp.parts import ablation, attention, probing, roles, task  # noqa: F401, I001  (each registers its parts, in this order)
from interp.parts.base import *  # noqa: F403  (the registry and what a part is)
from interp.parts.base import __all__ as __all__
