"""A run journal: long work records each finished unit under ``--out``, so a crash loses one unit.

An exact sweep, a pruning curve or a gate sweep is a list of units (a head, a pruning step, a
lambda) whose results do not depend on the order they are computed in. :class:`Journal` appends
each finished unit as one line of ``<out>/.journal/<kind>.jsonl``, written through to the operating
system before :meth:`Journal.append` returns, so a ``kill -9``, an out-of-memory kill or a lost
process leaves every unit finished before it on disk; the file is also ``fsync``-ed at most every
:data:`SYNC_EVERY_S` seconds (and when closed), so a machine that loses power loses at most the
units of the last few seconds, and a run of many short units does not wait on the disk for each. A
run started again with ``--resume`` reads them back (:meth:`Journal.open`), computes only the rest,
and its numbers equal an uninterrupted run's: payloads are JSON, whose floats are written with
``repr`` and read back bit for bit (infinities included; a NaN comes back as NaN).

The file::

    <crc32 of the JSON, 8 hex digits> {"journal": 1, "kind": ..., "fingerprint": {...}}
    <crc32> {"unit": ..., "payload": ...}
    ...

Every line carries the CRC-32 of its own text: a line torn by a kill in the middle of a write (no
newline, or a checksum that does not match) ends the valid part; it and anything after it are
dropped on reading, and cut off the file before the next append.

The first line is the run's fingerprint (:func:`fingerprint`): the arguments that affect the
results, the model's identity (name, parameter names and shapes, each parameter's sum) and the probe's tokens. What :meth:`Journal.open` does with a journal already there:

==========================  ===================================  =============================
journal under --out         without ``--resume``                 with ``--resume``
==========================  ===================================  =============================
none (or only a header:     start                                start (nothing to resume:
no unit finished)                                                a first attempt may pass it)
same fingerprint            refuse: ``--resume`` or ``--fresh``  continue with the units done
another fingerprint         refuse, naming what differs          refuse, naming what differs
==========================  ===================================  =============================

``fresh=True`` (``--fresh``) deletes a journal of either kind and starts over. A refusal is a
:class:`~interp.errors.UsageError` (exit 2, nothing written). :meth:`Journal.finish` deletes the
journal once the final outputs are written (atomically), so a finished folder holds no journal.

Under ``torchrun`` only rank 0 opens and appends (from the results gathered from every rank), so
the ranks never race on the file; appends are skipped where :func:`interp._io.writing` is off.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from interp._io import _json_default, writing
from interp.errors import UsageError

if TYPE_CHECKING:  # annotations only: the adapters sit above this module
    from interp.adapters import HookedModel

VERSION = 1
FOLDER = ".journal"
SYNC_EVERY_S = 2.0
"""Appends are flushed to the operating system at once (a killed process loses nothing); they are
``fsync``-ed to the disk when this much time has passed since the last ``fsync``."""
NOT_RESULTS = ("out", "top", "no_progress", "resume", "fresh", "journals")
"""Flags that change where and how a run reports, never its numbers: left out of the fingerprint."""


# --------------------------------------------------------------------------------------------
# fingerprints


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def run_arguments(args: Any, ignore: Iterable[str] = NOT_RESULTS) -> dict[str, Any]:
    """The arguments that affect results: an argparse namespace (or a mapping) minus ``ignore``,
    as JSON-ready values (so they can be shown when they differ)."""
    values = dict(vars(args) if not isinstance(args, Mapping) else args)
    skip = set(ignore)
    return json.loads(json.dumps({k: v for k, v in sorted(values.items()) if k not in skip}, default=str))


def model_identity(model: HookedModel, name: str) -> str:
    """A hash of the model's name, its parameters' names, shapes and dtypes, and each parameter's
    float64 sum: one read of the weights, where they live (milliseconds on a GPU, seconds for a
    7B model on a CPU), against runs of hours."""
    params = list(model.named_parameters())
    layout = ";".join(f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in params)
    with torch.no_grad():
        sums = [float(p.detach().sum(dtype=torch.float64)).hex() for _, p in params if p.device.type != "meta"]
    return _sha(f"{name}|{layout}|{','.join(sums)}")


def tokens_hash(tokens: torch.Tensor) -> str:
    """A hash of a probe's token ids (shape and values)."""
    t = tokens.detach().to("cpu", torch.int64).contiguous()
    return _sha(f"{tuple(t.shape)}|".encode() + t.numpy().tobytes())


def fingerprint(arguments: Mapping[str, Any], model: str, probe: str) -> dict[str, Any]:
    """What a resumed run must share with the run it continues: ``run_arguments(args)``,
    ``model_identity(model, name)`` and ``tokens_hash(probe.tokens)``."""
    return {"arguments": dict(arguments), "model": model, "probe": probe}


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    said = []
    a, b = old.get("arguments", {}), new.get("arguments", {})
    changed = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if changed:
        shown = ", ".join(f"--{k.replace('_', '-')} {a.get(k)!r} then, {b.get(k)!r} now" for k in changed)
        said.append(f"the arguments differ ({shown})")
    if old.get("model") != new.get("model"):
        said.append("the model differs (another name, shape or weights)")
    if old.get("probe") != new.get("probe"):
        said.append("the probe's tokens differ")
    return said


# --------------------------------------------------------------------------------------------
# lines


def _line(obj: Any) -> bytes:
    text = json.dumps(obj, default=_json_default, separators=(",", ":"), sort_keys=True)
    data = text.encode()
    return b"%08x %s\n" % (zlib.crc32(data), data)


def _read_lines(path: Path) -> tuple[list[Any], int]:
    """The valid lines' objects and the byte length of the valid prefix (a torn tail is left out)."""
    objects: list[Any] = []
    good = 0
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n") or len(raw) < 10 or raw[8:9] != b" ":
                break
            data = raw[9:-1]
            try:
                if int(raw[:8], 16) != zlib.crc32(data):
                    break
                objects.append(json.loads(data))
            except ValueError:
                break
            good += len(raw)
    return objects, good


def _unit(value: Any) -> Any:
    """JSON gives lists back; units such as ``(layer, head)`` are tuples again."""
    return tuple(_unit(v) for v in value) if isinstance(value, list) else value


def finished_units(out: str | os.PathLike, kind: str) -> int:
    """How many finished units the journal of ``kind`` under ``out`` holds (0: none, or no journal),
    read without opening it: for what a command says and checks before its journaled work starts."""
    path = Path(out) / FOLDER / f"{kind}.jsonl"
    return max(0, len(_read_lines(path)[0]) - 1) if path.is_file() else 0


def refuse_unfinished(out: str | os.PathLike, kind: str, resume: bool, fresh: bool) -> None:
    """The refusal of :meth:`Journal.open` for an unfinished run's journal without ``--resume`` or
    ``--fresh``, given before work that comes ahead of the journaled part (the toy's training ahead
    of its checkpoint sweep), so that it is not done first and refused after."""
    n = finished_units(out, kind)
    if n and not (resume or fresh):
        raise UsageError(
            f"{Path(out) / FOLDER / f'{kind}.jsonl'} holds {n} finished unit(s) of an unfinished run: pass --resume "
            "to continue it, or --fresh to start over"
        )


# --------------------------------------------------------------------------------------------
# the journal


class Journal:
    """The journal of one kind of long work (``"exact"``, ``"prune"``, ``"gates"``, ...) under ``out``.

    >>> j = Journal(out, "exact", fingerprint(run_arguments(args), model_identity(m, spec), tokens_hash(t)))
    >>> done = j.open(resume=args.resume)          # {unit: payload} of the units already finished
    >>> for unit in todo: j.append(unit, compute(unit))
    >>> write_final_outputs(...); j.finish()
    """

    def __init__(self, out: str | os.PathLike, kind: str, fingerprint: Mapping[str, Any]) -> None:
        self.path = Path(out) / FOLDER / f"{kind}.jsonl"
        self.kind = kind
        self.fingerprint = json.loads(json.dumps(dict(fingerprint), default=str))
        self._done: dict[Any, Any] = {}
        self._file: Any = None
        self._synced = 0.0
        self._resume = False
        self._written: float | None = None  # when the journal read back was last appended to
        self._said: set[str] = set()

    def open(self, resume: bool = False, *, fresh: bool = False) -> dict[Any, Any]:
        """Start or continue the journal (see the module docstring); the units already done.

        Where :func:`interp._io.writing` is off (the ranks of a ``torchrun`` run other than rank 0)
        nothing is read or written and nothing is done: rank 0's journal is the one, and the
        analyses share what it holds (:func:`interp.distributed.from_main`)."""
        self._done = {}
        self._resume = resume
        if not writing():
            return {}
        if fresh:
            self.path.unlink(missing_ok=True)
        existed = self.path.exists()
        objects, good = _read_lines(self.path) if existed else ([], 0)
        self._written = self.path.stat().st_mtime if existed else None
        if len(objects) == 1:  # a header and no unit: nothing was done, nothing to keep
            objects, good = [], 0
        if resume and len(objects) < 2:
            why = "holds no finished unit" if existed else "does not exist"
            print(f"resume: {self.path} {why}: starting {self.kind} from the beginning", flush=True)
        if objects:
            header = objects[0]
            differs = _differences(header.get("fingerprint", {}), self.fingerprint)
            if header.get("journal") != VERSION or header.get("kind") != self.kind:
                differs = differs or ["it is not a journal this version of interp can read"]
            if differs:
                raise UsageError(
                    f"{self.path} belongs to another run: {'; '.join(differs)}. "
                    f"{'Cannot resume it: ' if resume else ''}"
                    "use another --out, or delete the journal (or pass --fresh) to start over"
                )
            units = {_unit(o["unit"]): o["payload"] for o in objects[1:]}
            if not resume:
                raise UsageError(
                    f"{self.path} holds {len(units)} finished unit(s) of an unfinished run with the same "
                    "arguments, model and probe: pass --resume to continue it, or --fresh to start over"
                )
            self._done = units
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if objects:
            with open(self.path, "r+b") as f:  # drop a torn tail before appending after it
                f.truncate(good)
            self._file = open(self.path, "ab")
        else:
            self._file = open(self.path, "wb")
            self._write(_line({"journal": VERSION, "kind": self.kind, "fingerprint": self.fingerprint}), sync=True)
            self._synced = 0.0  # the first units are synced as soon as they come
        return dict(self._done)

    def _write(self, data: bytes, *, sync: bool = False) -> None:
        self._file.write(data)
        self._file.flush()  # in the operating system's hands: a killed process loses nothing
        now = time.monotonic()
        if sync or now - self._synced >= SYNC_EVERY_S:
            os.fsync(self._file.fileno())
            self._synced = now

    def append(self, unit: Any, payload: Any) -> None:
        """Record one finished unit (one line, in the file before this returns)."""
        self.extend([(unit, payload)])

    def extend(self, items: Iterable[tuple[Any, Any]]) -> None:
        """Record several finished units at once (one line each, one write)."""
        lines = []
        for unit, payload in items:
            self._done[_unit(json.loads(json.dumps(unit)))] = payload
            lines.append(_line({"unit": unit, "payload": payload}))
        if self._file is not None and lines:
            self._write(b"".join(lines))

    def resumed(self, found: int, total: int, what: str = "units") -> str | None:
        """Say (on stdout, once per ``what``) what a ``--resume`` took from the journal: ``found`` of
        ``total`` units, the file, when it was last written, and how many are left to compute. The
        line said, or None (no resume asked, nothing found, said already, or not rank 0)."""
        if not (self._resume and found and writing()) or what in self._said:
            return None
        self._said.add(what)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._written)) if self._written else "?"
        line = f"resumed: {found} of {total} {what} from {self.path} (written {when}), {total - found} to go"
        print(line, flush=True)
        return line

    def done(self) -> dict[Any, Any]:
        """``{unit: payload}`` of every unit finished so far (read back, then appended)."""
        return dict(self._done)

    def close(self, *, sync: bool = True) -> None:
        """Close the file; a journal that holds no finished unit is deleted (a run that failed
        before finishing anything leaves nothing behind)."""
        if self._file is not None:
            self._file.flush()
            if sync and self._done:
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            if not self._done:
                self._remove()

    def _remove(self) -> None:
        self.path.unlink(missing_ok=True)
        try:
            self.path.parent.rmdir()
        except OSError:
            pass

    def finish(self) -> None:
        """The run's outputs are written: delete the journal (and its folder when empty)."""
        self.close(sync=False)
        if writing():
            self._remove()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Journals:
    """The journals of one command run, opened as its ``--resume`` / ``--fresh`` say.

    ``journals(kind, tokens)`` opens the journal of ``kind`` under ``out`` with the fingerprint of
    ``arguments`` (:func:`run_arguments` of the command line), ``model`` (named ``name``; hashed
    once, on first use) and ``tokens`` (the probe); :meth:`finish` deletes every journal opened, once
    the command's final outputs are written; :meth:`close` closes them (an interrupted or failed
    run: the journals stay for ``--resume``).
    """

    def __init__(
        self,
        out: str | os.PathLike,
        arguments: Mapping[str, Any],
        model: HookedModel,
        name: str,
        *,
        resume: bool = False,
        fresh: bool = False,
    ) -> None:
        self.out, self.arguments, self.model, self.name = Path(out), dict(arguments), model, name
        self.resume, self.fresh = resume, fresh
        self.opened: list[Journal] = []
        self._identity: str | None = None

    def __call__(self, kind: str, tokens: torch.Tensor) -> Journal:
        if self._identity is None:
            self._identity = model_identity(self.model, self.name) if writing() else ""
        journal = Journal(self.out, kind, fingerprint(self.arguments, self._identity, tokens_hash(tokens)))
        journal.open(self.resume, fresh=self.fresh)
        self.opened.append(journal)
        return journal

    def finish(self) -> None:
        for journal in self.opened:
            journal.finish()

    def close(self) -> None:
        for journal in self.opened:
            journal.close()
