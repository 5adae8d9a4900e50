"""Progress: bars on a terminal (and in a notebook), occasional whole lines anywhere else.

Every analysis reports progress through :func:`tqdm` here, a drop-in for ``tqdm.auto.tqdm`` as
the analyses use it (an iterable, or ``total=`` with ``update()``, then ``close()``). Where stderr
is a terminal or the code runs in a notebook it is tqdm's own bar. Elsewhere (a log file, a pipe, a
batch job) a bar would be a stream of carriage returns, so it prints a line instead, at most every
:data:`EVERY` seconds or each tenth of the way, and one when it ends::

    gates: 1/3 (33%), 41s elapsed, about 82s left

:func:`lines` forces the line form (the CLIs' ``--no-progress``: no bars, but never silent for
minutes).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm.std import tqdm as _text_bar

EVERY = 10.0  # seconds between lines, at most
_force_lines = False


@contextmanager
def lines(on: bool = True) -> Iterator[None]:
    """Inside the block, progress is printed as occasional lines, never bars (``on=False``: as usual)."""
    global _force_lines
    saved, _force_lines = _force_lines, on
    try:
        yield
    finally:
        _force_lines = saved


def _in_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def _terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def use_lines(stream: Any = None) -> bool:
    """Would progress be printed as lines here (not bars)?"""
    return _force_lines or not (_terminal(stream or sys.stderr) or _in_notebook())


class Lines:
    """The line form of a progress bar: ``desc: n/total (p%), Ns elapsed, about Ms left``."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        desc: str | None = None,
        total: float | None = None,
        disable: bool = False,
        unit: str = "it",
        file: Any = None,
        every: float = EVERY,
        **_: Any,
    ) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable, self.desc, self.total, self.disable, self.unit = (
            iterable,
            desc or "progress",
            total,
            disable,
            unit,
        )
        self.file, self.every = file, every
        self.n, self.start = 0, time.monotonic()
        self._last_time, self._last_tenth, self._closed = self.start, 0, False

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update()
        self.close()

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        if self.disable:
            return
        now = time.monotonic()
        tenth = int(10 * self.n / self.total) if self.total else 0
        if now - self._last_time >= self.every or (tenth > self._last_tenth and self.n < (self.total or 0)):
            self._print(now)
            self._last_time, self._last_tenth = now, tenth

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.disable and self.n:
            self._print(time.monotonic(), done=True)

    def _print(self, now: float, done: bool = False) -> None:
        elapsed = now - self.start
        text = f"{self.desc}: {self.n:g}"
        if self.total:
            text += f"/{self.total:g} ({self.n / self.total:.0%})"
        else:
            text += f" {self.unit}"
        text += f", {elapsed:.0f}s elapsed"
        if self.total and 0 < self.n < self.total and not done:
            text += f", about {elapsed * (self.total - self.n) / self.n:.0f}s left"
        print(text, file=self.file or sys.stderr, flush=True)


def tqdm(iterable: Iterable | None = None, **kwargs: Any) -> Any:
    """A progress bar where one reads well (a terminal, a notebook), else :class:`Lines`."""
    if use_lines(kwargs.get("file")):
        return Lines(iterable, **kwargs)
    if _in_notebook():
        try:
            import ipywidgets  # noqa: F401  (tqdm's notebook bar needs it; without, the text bar)
            from tqdm.notebook import tqdm as widget_bar

            return widget_bar(iterable, **kwargs)
        except ImportError:
            pass
    return _text_bar(iterable, **kwargs)


__all__ = ["EVERY", "Lines", "lines", "tqdm", "use_lines"]
