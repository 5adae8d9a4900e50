"""The head atlas: one self-contained HTML page that shows what each head of a model is.

``python -m interp.report`` / ``interp report`` writes it; in a notebook
:func:`head_atlas` computes it and :meth:`Atlas.save` writes it. Names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Atlas": "interp.report.atlas",
    "head_atlas": "interp.report.atlas",
    "render_atlas": "interp.report.page",
    "attention_patterns": "interp.report.patterns",
    "ROLES": "interp.report.roles",
    "role_table": "interp.report.roles",
    "uniform_baselines": "interp.report.roles",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'interp.report' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
