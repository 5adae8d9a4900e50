"""What a part is, and the one registry of parts.

A *part* is one analysis as the orchestrators compose it (the atlas, the checkpoint sweep,
``interp roles``): a name and a line of help, a frozen *sizes* dataclass (its defaults are the
atlas's; :func:`fingerprint` of it is what a journal records of the part), ``work(info, sizes)``
(what it is, with its sizes, and its multiply-adds: :func:`interp.progress.forward_work`'s unit), and
``run(model, sizes, config, given)`` returning a :class:`PartResult` or a typed
:class:`NotApplicable` with its reason. ``validate(sizes)`` checks the sizes without a model, and
``applicable(info, sizes, given)`` says, from the model's shape alone, whether the part can run.

``given`` (a :class:`Given`) carries what a part reads besides the model: the journals, the task's
pairs, the results of the parts run before it, and the role table so far. An orchestrator is a loop
over chosen parts; what it does with a part that does not apply is its own policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from interp.adapters import HookedModel, ModelInfo
from interp.config import RunConfig
from interp.errors import UsageError
from interp.registry import Registry


@dataclass(frozen=True)
class NotApplicable:
    """A part this model cannot have (or this run cannot hold), and why: the orchestrator decides
    whether that is a note or a refusal. ``remedy``: what would let it run, in the library's words
    (``"pass sequences=..."``), naming ``params``."""

    reason: str
    remedy: str = ""
    params: tuple[str, ...] = ()


@dataclass
class PartResult:
    """What a part found: ``columns`` for the role table (``layer``, ``head``, then its scores; None:
    it adds none), ``baselines`` of those scores, ``notes`` (each a full line: ``"what: ..."``),
    ``meta`` (merged into the orchestrator's meta in order), ``result``, the analysis's own result
    object (for a page or a command to show), and ``left_out``: what of the part could not run here,
    each with its :class:`NotApplicable`."""

    columns: pd.DataFrame | None = None
    baselines: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    left_out: dict[str, NotApplicable] = field(default_factory=dict)
    probe: Any = None  # the tokens it read (a sweep checks every revision reads the same)


@dataclass
class Given:
    """What a part reads besides the model, its sizes and the run settings.

    ``journals`` (a :class:`~interp.journal.Journals`): where the exact sweep, the pruning curves and
    the task's patching record their finished units; ``task``: the task part's pairs; ``done``: the
    results of the parts run before, by name; ``roles``: the role table of the parts run so far (set
    by an orchestrator that builds one); ``label``: what to call the model in a reason (a revision's
    label; None: "the model")."""

    journals: Any = None
    task: Any = None
    done: dict[str, PartResult | NotApplicable] = field(default_factory=dict)
    roles: Callable[[], pd.DataFrame] | None = None
    label: str | None = None

    def result(self, name: str) -> Any:
        """The result object of part ``name`` if it ran (None otherwise)."""
        got = self.done.get(name)
        return got.result if isinstance(got, PartResult) else None


Work = tuple[str, float]


@dataclass(frozen=True)
class Part:
    """One registered analysis part (see the module docstring)."""

    name: str
    sizes: type
    work: Callable[[ModelInfo, Any], Work]
    run: Callable[[HookedModel, Any, RunConfig, Given], PartResult | NotApplicable]
    validate: Callable[[Any], None] | None = None
    applicable: Callable[[ModelInfo, Any, Given], NotApplicable | None] | None = None
    tracked: tuple[str, ...] = ()  # the columns a sweep over revisions follows (default: all of them)


PARTS: Registry[Part] = Registry("part")


def part(name: str, doc: str, sizes: type, **info: Any) -> Callable[[Callable], Callable]:
    """A decorator over a part's ``run``: ``@part(name, doc, Sizes, work=..., atlas=True)`` registers
    it; ``info`` holds the :class:`Part`'s other fields (``work``, ``validate``, ``applicable``,
    ``tracked``) and the facts orchestrators read (``atlas``: one of the atlas's parts)."""
    fields = {f.name for f in dataclasses.fields(Part)}

    def decorate(run: Callable) -> Callable:
        own = {k: v for k, v in info.items() if k in fields}
        facts = {k: v for k, v in info.items() if k not in fields}
        PARTS.add(name, doc, Part(name=name, sizes=sizes, run=run, **own), **facts)
        return run

    return decorate


def sizes_of(name: str, given: Mapping[str, Any] | None = None) -> Any:
    """Part ``name``'s sizes: ``given[name]`` when there, else its defaults (the atlas's); a
    :class:`UsageError` for sizes of another part's type."""
    p = PARTS.get(name)
    got = (given or {}).get(name)
    if got is None:
        return p.sizes()
    if not isinstance(got, p.sizes):
        raise UsageError(
            f"sizes={{{name!r}: ...}} must be a {p.sizes.__name__}, got {type(got).__name__}", params="sizes"
        )
    return got


def check_sizes(sizes: Mapping[str, Any] | None, known: Any = None) -> None:
    """Every key of ``sizes`` names a part (of ``known`` when given), and each part's sizes pass
    its model-free ``validate``."""
    names = tuple(known) if known is not None else PARTS.names()
    unknown = sorted(set(sizes or {}) - set(names))
    if unknown:
        raise UsageError(f"sizes= names no part {', '.join(unknown)}: choose from {', '.join(names)}", params="sizes")
    for name in sizes or {}:
        check = PARTS.get(name).validate
        if check is not None:
            check(sizes_of(name, sizes))


def fingerprint(sizes: Any) -> dict[str, Any]:
    """What a journal records of a part's sizes: the dataclass as a dict."""
    return dataclasses.asdict(sizes)


def run_part(name: str, model: HookedModel, info: ModelInfo, sizes: Any, config: RunConfig, given: Given) -> Any:
    """Part ``name`` run once: its applicability first (from the model's shape), then its ``run``;
    the outcome is recorded in ``given.done``."""
    p = PARTS.get(name)
    got = p.applicable(info, sizes, given) if p.applicable is not None else None
    if got is None:
        got = p.run(model, sizes, config, given)
    given.done[name] = got
    return got


def in_order(names: Iterable[str]) -> list[str]:
    """``names`` (parts) in the order they run."""
    return sorted(names, key=lambda n: PARTS.info(n, "order"))


def in_place(names: Iterable[str]) -> list[str]:
    """``names`` (parts with columns) in the order their columns go in the role table."""
    return sorted(names, key=lambda n: (PARTS.info(n, "place", 3), PARTS.info(n, "order")))


def left_out(name: str, reason: str) -> str:
    """The note of a part left out: ``"name: left out: reason"``."""
    return f"{name}: left out: {reason}"


__all__ = [
    "PARTS",
    "Given",
    "NotApplicable",
    "Part",
    "PartResult",
    "Work",
    "check_sizes",
    "fingerprint",
    "in_order",
    "in_place",
    "left_out",
    "part",
    "run_part",
    "sizes_of",
]
