"""Where a sweep's revisions come from: local checkpoint folders, Hugging Face revisions, the toy trainer.

Every source becomes a list of :class:`Revision`: a label, the training step it stands for, and
what :func:`interp.models.load_model` takes to load it (a folder, or a Hub name and a revision).
All of them load through ``load_model``, one at a time, so a local folder and a Hub revision go
through the same code.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from interp.errors import UsageError
from interp.models import load_model

_DIGITS = re.compile(r"(\d+)(?!.*\d)")


@dataclass(frozen=True)
class Revision:
    """One checkpoint of a sweep: ``label`` (``"step1000"``, a folder's name), its training ``step``,
    and how to load it: ``spec`` (a folder or a Hub name) with ``revision`` (a Hub branch or tag)."""

    label: str
    step: int
    spec: str
    revision: str | None = None

    @property
    def hub(self) -> bool:
        return self.revision is not None

    def load(self, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None) -> Any:
        return load_model(self.spec, device=device, dtype=dtype, revision=self.revision)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "step": self.step, "spec": self.spec, "revision": self.revision}


def step_of(label: str) -> int | None:
    """The training step a name stands for: its last run of digits (``step1000``, ``checkpoint-500``)."""
    found = _DIGITS.search(label)
    return int(found.group(1)) if found else None


def parse_revisions(text: str | Iterable[str | int]) -> list[str]:
    """Hub revision names from ``"step0,step1000"``, a range ``"0:143000:1000"`` (start:stop:stride,
    the stop included; names ``step<N>``), a mix of both, or a list of names or step numbers."""
    items = text.split(",") if isinstance(text, str) else list(text)
    names: list[str] = []
    for item in items:
        if isinstance(item, int):
            names.append(f"step{item}")
            continue
        item = item.strip()
        if not item:
            continue
        if ":" in item:
            parts = item.split(":")
            if len(parts) != 3 or not all(re.fullmatch(r"(step)?\d+", p) for p in parts):
                raise UsageError(
                    f"cannot read the revision range {item!r}: write start:stop:stride in steps, e.g. 0:143000:1000"
                )
            start, stop, stride = (int(p.removeprefix("step")) for p in parts)
            if stride < 1 or stop < start:
                raise UsageError(f"the revision range {item!r} is empty: it needs start <= stop and a stride >= 1")
            names += [f"step{n}" for n in range(start, stop + 1, stride)]
        else:
            names.append(item)
    if not names:
        raise UsageError("no revisions given: name them (step0,step1000) or give a range (0:143000:1000)")
    return list(dict.fromkeys(names))  # each once, in the order given


def hub_revisions(model: str, revisions: str | Iterable[str | int]) -> list[Revision]:
    """A Hub model's revisions (Pythia: ``step0`` .. ``step143000``), in training order."""
    names = parse_revisions(revisions)
    return _ordered([Revision(name, step_of(name), model, name) for name in names])


def local_revisions(checkpoints: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Revision]:
    """Checkpoint folders (a glob such as ``"runs/ckpt-*"``, or a list of folders), in training order:
    by the step in each folder's name, else in the order given."""
    if isinstance(checkpoints, (str, os.PathLike)):
        pattern = os.fspath(checkpoints)
        paths = sorted(glob.glob(os.path.expanduser(pattern))) if glob.has_magic(pattern) else [pattern]
        if not paths:
            raise UsageError(f"no checkpoint folder matches {pattern!r}")
    else:
        paths = [os.fspath(p) for p in checkpoints]
    if not paths:
        raise UsageError("no checkpoint folders given")
    missing = [p for p in paths if not Path(p).expanduser().is_dir()]
    if missing:
        raise UsageError(f"not a checkpoint folder: {missing[0]} (pass folders holding config.json and weights)")
    return _ordered([Revision(Path(p).name, step_of(Path(p).name), str(Path(p).expanduser())) for p in paths])


def _ordered(revisions: list[Revision | Any]) -> list[Revision]:
    """Sorted by step; revisions whose names hold no step keep the order given (their rank is their step)."""
    if any(r.step is None for r in revisions):
        return [Revision(r.label, i, r.spec, r.revision) for i, r in enumerate(revisions)]
    labels = [r.label for r in revisions]
    if len(set(labels)) != len(labels):
        raise UsageError(f"two checkpoints share the name {_first_repeat(labels)!r}: each needs its own label")
    steps = [r.step for r in revisions]
    if len(set(steps)) != len(steps):
        raise UsageError(f"two checkpoints stand for step {_first_repeat(steps)}: give each its own step")
    return sorted(revisions, key=lambda r: r.step)


def _first_repeat(items: list[Any]) -> Any:
    seen: set[Any] = set()
    for x in items:
        if x in seen:
            return x
        seen.add(x)
    return None
