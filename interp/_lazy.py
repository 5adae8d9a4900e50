"""One lazy-name mechanism for the package and its subpackages: names load on first use.

A package's ``__init__`` lists its public names and the module each lives in; :func:`lazy` gives it
the module-level ``__getattr__`` and ``__dir__`` (PEP 562) and the ``__all__`` that go with them::

    __getattr__, __dir__, __all__ = lazy(__name__, {"head_scores": "interp.heads", ...})

so ``import interp`` loads neither torch nor the models until a name is asked for. A name, once
loaded, is stored on the package, so later look-ups skip ``__getattr__``. A submodule is a name
too: ``interp.sinks.sink_scores`` works after a bare ``import interp`` (the submodule is imported
when first asked for, as ``import interp.sinks`` would). ``dir()`` lists the public names only, not
the machinery of the ``__init__`` (``lazy``, ``TYPE_CHECKING``, ...).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``, whose public ``names`` map to their modules."""
    where = dict(names)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")  # sets it on the package
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(where)

    return __getattr__, __dir__, sorted(where)


__all__ = ["lazy"]
