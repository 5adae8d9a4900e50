"""The errors ``interp`` raises on purpose, under one base class.

Every error here means "the input or the environment is not what the analysis needs", and its
message says what was wrong and what to do. The CLIs map them to exit codes (:mod:`interp.cli`):
:class:`ModelLoadError` exits 1, every other :class:`InterpError` exits 2 with nothing written. Any
other exception is a bug and keeps its traceback.

The subclasses that have always been ``ValueError``s still are, so ``except ValueError`` code keeps
working.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class InterpError(Exception):
    """Base class of every error ``interp`` raises on purpose.

    ``params``: the parameters the message names, each written ``name=`` in it (``"pass minibatch=4
    or less"``), as a Python caller passes them. The message never spells a command-line flag: a
    command shows each named parameter as its own flag (``--minibatch 4``), read from its parser
    (:func:`interp.cli.common.in_flags`).
    """

    def __init__(self, *args: Any, params: str | Sequence[str] = ()) -> None:
        super().__init__(*args)
        self.params: tuple[str, ...] = (params,) if isinstance(params, str) else tuple(params)

    def __reduce__(self) -> Any:  # pickled with its params (errors cross process boundaries under torchrun)
        return _rebuilt, (type(self), self.args, self.params)


def _rebuilt(cls: type[InterpError], args: tuple, params: tuple[str, ...]) -> InterpError:
    return cls(*args, params=params)


class UsageError(InterpError, ValueError):
    """Bad input found after parsing (e.g. a probe too long for the model): exit 2, nothing written."""


class UnknownNameError(UsageError, KeyError):
    """A name (a score, a column, a role) that is not there; still a ``KeyError`` for old ``except`` code."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ModelLoadError(InterpError, RuntimeError):
    """The model could not be had; the message says why and what to do."""


class OutputError(InterpError, ValueError):
    """The output location cannot be used."""


class DatasetLoadError(InterpError, ValueError):
    """A text data set could not be read; the message says why and what to do."""


class NonFiniteAttentionError(InterpError, ValueError):
    """A pattern held NaN or inf (e.g. fp16 overflow): the scores would be meaningless."""


class AblationError(InterpError, ValueError):
    """An ablation, sweep or gate request that cannot be carried out as asked."""


class MetricError(AblationError):
    """A metric that cannot be used here (wrong probe, wrong model kind, vanishing gradient)."""


class RankFailedError(InterpError, RuntimeError):
    """Another rank of a ``torchrun`` run failed; the message names it and its error (exit 1)."""
