"""Progress: bars on a terminal (and in a notebook), occasional whole lines anywhere else.

Every analysis reports progress through :func:`tqdm` here, a drop-in for ``tqdm.auto.tqdm`` as
the analyses use it (an iterable, or ``total=`` with ``update()``, then ``close()``). Where stderr
is a terminal or the code runs in a notebook it is tqdm's own bar. Elsewhere (a log file, a pipe, a
batch job) a bar would be a stream of carriage returns, so it prints a line instead, at most every
:data:`EVERY` seconds or each tenth of the way, and one when it ends::

    gates: 1/3 (33%), 41s elapsed, about 82s left

:func:`lines` forces the line form (the CLIs' ``--no-progress``: no bars, but never silent for
minutes). A bar given ``sizes=`` says them in one line before it starts, so that a long part is
never a surprise::

    exact sweep: 144 heads x 10 sequences of 101 tokens, 144 batches
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
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
        self._shown: float | None = None  # the count the last line showed

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
        if not self.disable and self.n and self.n != self._shown:  # the last line may have said it already
            self._print(time.monotonic(), done=True)

    def _print(self, now: float, done: bool = False) -> None:
        self._shown = self.n
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


def tqdm(iterable: Iterable | None = None, *, sizes: str | None = None, **kwargs: Any) -> Any:
    """A progress bar where one reads well (a terminal, a notebook), else :class:`Lines`.

    ``sizes``: the work's sizes, said as ``desc: sizes`` on a line of their own before the bar
    (unless it is disabled)."""
    if sizes and not kwargs.get("disable"):
        print(f"{kwargs.get('desc') or 'progress'}: {sizes}", file=kwargs.get("file") or sys.stderr, flush=True)
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


# ---------------------------------------------------------------------------------------------
# work sizes: a command says up front when a part will clearly take much longer than its main part

LONG_RATIO = 10.0  # a part with this many times the main part's work is clearly much longer...
LONG_WORK = 1e12  # ...when it is also at least this much work (multiply-adds; about a minute on one CPU thread)


def forward_work(tokens: float, n_layers: float, d_model: int, d_vocab: int = 0, context: int = 0) -> float:
    """Multiply-adds of a forward pass over ``tokens`` tokens through ``n_layers`` blocks: about
    ``12 d_model^2`` per token and block (attention and MLP weights), plus ``context x d_model`` per
    token and block for the attention itself when the sequences are ``context`` tokens long (causal:
    half the keys, for scores and for values), plus the unembedding (``d_model x d_vocab`` per token)
    when ``d_vocab`` is given. An estimate to compare parts of a run by, not a timing."""
    return float(tokens) * (n_layers * (12.0 * d_model**2 + context * d_model) + d_model * d_vocab)


def long_parts(main_work: float, work: Mapping[str, float]) -> dict[str, float]:
    """The parts of ``work`` (name -> work) that will clearly take much longer than a main part of
    ``main_work``: at least :data:`LONG_RATIO` times its work and at least :data:`LONG_WORK`; each
    with how many times the main part's work it is."""
    return {k: w / max(main_work, 1.0) for k, w in work.items() if w >= LONG_RATIO * main_work and w >= LONG_WORK}


def long_parts_note(main: str, ratios: Mapping[str, float], hint: str = "") -> str | None:
    """The up-front line of :func:`long_parts`'s ``ratios`` (what -> times), or None when there is none.

    >>> long_parts_note("the head scores", {"the exact sweep (144 heads)": 145.2}, "--skip exact leaves it out")
    'note: the exact sweep (144 heads) is about 145x the work of the head scores: it will take much longer; --skip exact leaves it out'
    """
    if not ratios:
        return None
    (what, times), *rest = ratios.items()
    named = f"{what} is about {times:.0f}x the work of {main}" + "".join(f", and {w} about {r:.0f}x" for w, r in rest)
    return f"note: {named}: {'it' if not rest else 'they'} will take much longer" + (f"; {hint}" if hint else "")


# part -> (what it is, with its sizes; its work): the main part first
Plan = Mapping[str, tuple[str, float]]


def plan_note(plan: Plan, hint: Callable[[list[str]], str] = lambda parts: "") -> str | None:
    """:func:`long_parts_note` for the parts of ``plan`` that will clearly take much longer than its
    first (main) part; ``hint(names of those parts)`` says how to leave them out."""
    (main, (what, work)), *rest = plan.items()
    ratios = long_parts(work, {k: w for k, (_, w) in rest})
    return long_parts_note(what, {plan[k][0]: r for k, r in ratios.items()}, hint(list(ratios)) if ratios else "")


class Announcer:
    """``say(part)``: ``command k/n: what (sizes)`` on stderr as part ``k`` of the ``n`` in ``plan``
    starts; ``timed``: also ``command: part k/n took Ns`` as the part before it ends (``say.finish()``
    ends the last). Silent unless ``on``, and for a part the plan does not hold."""

    def __init__(self, command: str, plan: Plan, on: bool, timed: bool = False) -> None:
        self.command, self.plan, self.on, self.timed, self.order = command, plan, on, timed, list(plan)
        self.current: tuple[str, float] | None = None

    def __call__(self, part: str) -> None:
        self.finish()
        if self.on and part in self.plan:
            print(f"{self.command} {self._number(part)}: {self.plan[part][0]}", file=sys.stderr, flush=True)
            self.current = (part, time.monotonic()) if self.timed else None

    def finish(self) -> None:
        if self.current is not None:
            part, start = self.current
            took = time.monotonic() - start
            print(f"{self.command}: part {self._number(part)} took {took:.0f}s", file=sys.stderr, flush=True)
            self.current = None

    def _number(self, part: str) -> str:
        return f"{self.order.index(part) + 1}/{len(self.order)}"


def announcer(command: str, plan: Plan, on: bool, timed: bool = False) -> Announcer:
    """The :class:`Announcer` of ``plan``'s parts."""
    return Announcer(command, plan, on, timed)


__all__ = [
    "EVERY",
    "LONG_RATIO",
    "LONG_WORK",
    "Announcer",
    "Lines",
    "Plan",
    "announcer",
    "plan_note",
    "forward_work",
    "lines",
    "long_parts",
    "long_parts_note",
    "tqdm",
    "use_lines",
]
