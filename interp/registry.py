"""Registries: every name a user chooses (a score, a metric, an ablation kind, an engine, an order, a
role) is registered once, with a one-line description; CLI choices and help text are read from here.

::

    SCORES = Registry("head score")

    @SCORES.register("prev_token", "attention on the previous position")
    def prev_pairs(probe): ...

    ENGINES = Registry("engine")
    ENGINES.add("pattern", "reduce each layer's pattern in its hook")   # the value is the name

    SCORES.get("prev_token")       # the registered object
    SCORES.names()                 # ("prev_token", ...), in registration order
    SCORES.check("nope")           # UsageError: unknown head score 'nope': choose from [...]
    SCORES.help()                  # "prev_token: attention on the previous position; ..."
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from interp.errors import UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered name: the object, what it means in one line, and any facts a caller reads."""

    name: str
    value: T
    doc: str = ""
    info: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """Names of one kind (``kind`` is how errors and help call them), in registration order."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, doc: str = "", **info: Any) -> Callable[[T], T]:
        """A decorator: ``@REG.register(name, doc)`` registers the function or class it decorates."""

        def decorate(obj: T) -> T:
            self.add(name, doc, obj, **info)
            return obj

        return decorate

    def add(self, name: str, doc: str = "", value: Any = None, **info: Any) -> T:
        """Register ``value`` under ``name`` (``value=None``: the name itself, for plain choices)."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        obj = name if value is None else value
        self._entries[name] = Entry(name, obj, doc, dict(info))
        return obj

    # ---- reading --------------------------------------------------------------------------------

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, name: Any) -> str:
        """``name`` if registered, else :class:`UsageError` naming the choices."""
        if not isinstance(name, str) or name not in self._entries:
            raise UsageError(f"unknown {self.kind} {name!r}: choose from {list(self._entries)}")
        return name

    def check_all(self, names: Iterable[Any]) -> list[str]:
        """Every name of ``names`` registered (a bare string is refused: it is not a list of names)."""
        if isinstance(names, str):
            raise UsageError(f"expected a list of {self.kind} names, got the string {names!r}: write [{names!r}]")
        names = list(names)
        unknown = [n for n in names if n not in self._entries]
        if unknown:
            raise UsageError(f"unknown {self.kind}(s) {unknown}: choose from {list(self._entries)}")
        return names

    def entry(self, name: str) -> Entry[T]:
        return self._entries[self.check(name)]

    def get(self, name: str) -> T:
        return self.entry(name).value

    def doc(self, name: str) -> str:
        return self.entry(name).doc

    def info(self, name: str, key: str, default: Any = None) -> Any:
        return self.entry(name).info.get(key, default)

    def select(self, predicate: Callable[[Entry[T]], bool]) -> tuple[str, ...]:
        """Names whose entry satisfies ``predicate``."""
        return tuple(n for n, e in self._entries.items() if predicate(e))

    def help(self, sep: str = "; ", only: Iterable[str] | None = None) -> str:
        """``"name: doc; name: doc"``: help text for a CLI flag (``only``: of these names, in this order)."""
        entries = [self.entry(n) for n in (self._entries if only is None else only)]
        return sep.join(f"{e.name}: {e.doc}" if e.doc else e.name for e in entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


__all__ = ["Entry", "Registry"]
