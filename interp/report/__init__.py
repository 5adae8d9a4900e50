"""The head atlas: one self-contained HTML page that shows what each head of a model is.

``python -m interp.report`` / ``interp report`` writes it; in a notebook :func:`head_atlas`
computes an :class:`Atlas` and :meth:`Atlas.save` writes it. Names load on first use.

Layers, lowest first: :mod:`~interp.report.roles` (the role registry and table) and
:mod:`~interp.report.patterns`; :mod:`~interp.report.atlas` (the :class:`Atlas` data object);
:mod:`~interp.report.page` (the HTML page drawn from an atlas); :mod:`~interp.report.build`
(:func:`head_atlas`, which runs the analyses, and the registry of atlas ``PARTS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from interp._lazy import lazy

__getattr__, __dir__, __all__ = lazy(
    __name__,
    {
        "Atlas": "interp.report.atlas",
        "PARTS": "interp.report.build",
        "atlas_sizes": "interp.report.build",
        "head_atlas": "interp.report.build",
        "render_atlas": "interp.report.page",
        "attention_patterns": "interp.report.patterns",
        "ROLES": "interp.report.roles",
        "role_table": "interp.report.roles",
        "uniform_baselines": "interp.report.roles",
    },
)

if TYPE_CHECKING:
    from interp.report.atlas import Atlas as Atlas
    from interp.report.build import PARTS as PARTS
    from interp.report.build import atlas_sizes as atlas_sizes
    from interp.report.build import head_atlas as head_atlas
    from interp.report.page import render_atlas as render_atlas
    from interp.report.patterns import attention_patterns as attention_patterns
    from interp.report.roles import ROLES as ROLES
    from interp.report.roles import role_table as role_table
    from interp.report.roles import uniform_baselines as uniform_baselines
