"""Saving results without losing any: refusals over earlier results, and what every JSON records.

In the library, :func:`claim` refuses to write over a result already saved under the same names
unless ``overwrite=True``. A command owns its ``--out`` folder: inside :func:`cli_owned` (which
:class:`interp.cli.common.Command`, the command shell, enters) its own earlier outputs are replaced, and :func:`replaced`
says which files were. :func:`provenance` is what every saved JSON carries beside its meta: the
versions of interp, torch, transformers and TransformerLens, and the command line.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from interp.errors import OutputError

_OWNED: ContextVar[list[Path] | None] = ContextVar("interp_cli_owned", default=None)


@contextmanager
def cli_owned() -> Iterator[list[Path]]:
    """Inside the block saving replaces earlier files; the list yielded collects those replaced."""
    seen: list[Path] = []
    token = _OWNED.set(seen)
    try:
        yield seen
    finally:
        _OWNED.reset(token)


def exists_message(path: Path) -> str:
    return (
        f"{path} already holds a saved result: pass overwrite=True to replace it, or save under another stem= or folder"
    )


def claim(out: Path, names: Sequence[str], *, overwrite: bool = False) -> list[Path]:
    """The paths ``out/<name>`` to write; an :class:`~interp.errors.OutputError` when one exists and
    neither ``overwrite`` nor a command owns the folder."""
    paths = [Path(out) / n for n in names]
    owned = _OWNED.get()
    taken = [p for p in paths if p.exists()]
    if taken and not overwrite and owned is None:
        raise OutputError(exists_message(taken[0]))
    if owned is not None:
        owned.extend(p for p in taken if p not in owned)
    return paths


def versions() -> dict[str, str | None]:
    """The versions of the packages a result depends on (``None`` for one not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    from interp._version import __version__

    found: dict[str, str | None] = {"interp": __version__}
    for name in ("torch", "transformers", "transformer_lens"):
        try:
            found[name] = version(name.replace("_", "-"))
        except PackageNotFoundError:
            found[name] = None
    return found


def provenance() -> dict[str, Any]:
    """``{"versions": ..., "command": ...}``: what every saved JSON records beside its meta."""
    argv = [Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
    return {"versions": versions(), "command": shlex.join(argv)}


__all__ = ["claim", "cli_owned", "exists_message", "provenance", "versions"]
