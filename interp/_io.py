"""Files: where the bundled data lives, atomic output files, and early checks on output folders.

Every file the toolkit writes goes through :func:`atomic_write`: the content is written to a
temporary file in the same folder and moved into place with :func:`os.replace`, so a reader never
sees a half-written result, and a crash leaves the previous file (or nothing) behind. A failed write
(a full disk) removes its temporary file and raises :class:`~interp.errors.OutputError`; a
``kill -9`` mid-write leaves a hidden ``.<name>.<random>.tmp`` beside the target, never the target's
name. Those are not swept away by later runs: another analysis may be writing into the same folder
at that moment.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import resources
from pathlib import Path
from typing import Any

from interp.errors import OutputError
from interp.interrupts import deferred

DATA_ENV = "INTERP_DATA_DIR"
_FULL = (errno.ENOSPC, errno.EDQUOT)


def bundled(name: str) -> Path:
    """A folder of the bundled data (``"toy"``, ``"text"``): ``$INTERP_DATA_DIR/<name>`` when set, else
    the copy installed with the package (``interp.data``), else ``data/<name>`` of a source checkout."""
    override = os.environ.get(DATA_ENV)
    if override:
        return Path(override) / name
    try:
        installed = Path(str(resources.files("interp.data") / name))
    except ModuleNotFoundError:
        installed = None
    if installed is not None and installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[1] / "data" / name


_WRITING: ContextVar[bool] = ContextVar("interp_writing", default=True)


def writing() -> bool:
    """Does :func:`atomic_write` write here (False inside :func:`writes_skipped`)?"""
    return _WRITING.get()


@contextmanager
def writes_skipped(skip: bool = True) -> Iterator[None]:
    """Inside the block (when ``skip``), :func:`atomic_write` writes nothing and returns the path it
    would have written: the ranks of a ``torchrun`` run other than rank 0 compute the same results
    and leave the files to rank 0."""
    token = _WRITING.set(not skip and _WRITING.get())
    try:
        yield
    finally:
        _WRITING.reset(token)


PARTIAL = ".partial"
_PARTIAL: ContextVar[bool] = ContextVar("interp_partial", default=False)


def partial_name(path: str | os.PathLike) -> Path:
    """``<stem>.partial<suffix>``: the name of an interrupted run's file (``sinks_heads.html`` ->
    ``sinks_heads.partial.html``); a name already marked is returned as it is."""
    path = Path(path)
    return path if PARTIAL in path.name else path.with_name(f"{path.stem}{PARTIAL}{path.suffix}")


@contextmanager
def writes_partial(on: bool = True) -> Iterator[None]:
    """Inside the block (when ``on``), :func:`atomic_write` writes each file under its
    :func:`partial_name`: the results of an interrupted run, every file of them marked, and the
    complete files of an earlier run left as they were."""
    token = _PARTIAL.set(on or _PARTIAL.get())
    try:
        yield
    finally:
        _PARTIAL.reset(token)


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, then rename); inside
    :func:`writes_partial`, to its :func:`partial_name`. Returns the path written."""
    path = partial_name(path) if _PARTIAL.get() else Path(path)
    if not _WRITING.get():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    tmp: str | None = None
    try:
        with deferred():  # made and remembered, or not made (a Ctrl-C waits for this line)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the usual mode
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):  # a full disk, a quota, a folder gone: one line, not a traceback
            raise OutputError(_cannot_write(path, e), params="out") from None
        raise
    return path


def _cannot_write(path: Path, error: OSError) -> str:
    why = (error.strerror or type(error).__name__).lower()
    return f"cannot write {path}: {why}; it was not replaced (its previous content, if any, is intact): " + (
        "free some space or pass another output folder (out=)"
        if error.errno in _FULL
        else "pass a writable output folder (out=)"
    )


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def ensure_writable_dir(out: str | os.PathLike) -> Path:
    """Prove that a file can be written under ``out``, and leave nothing behind.

    Called by every CLI *before* any model is loaded, so that a bad ``--out`` costs nothing. Permission
    bits are not enough (root passes every ``access`` check, and ``/proc`` refuses writes that its
    bits allow): the folders are made and a probe file is written, then both are removed again. The
    output folder itself is created by the first :func:`atomic_write`.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a directory: pass a folder path (out=)", params="out")
    made: list[Path] = []
    try:
        for parent in reversed([out, *out.parents]):
            if parent.exists():
                if not parent.is_dir():
                    raise OutputError(
                        f"cannot create output folder {out}: {parent} is a file; pass another output folder (out=)",
                        params="out",
                    )
                continue
            with deferred():  # made and remembered, or not made
                parent.mkdir()
                made.append(parent)
        with deferred():  # the probe file never outlives this line
            fd, probe = tempfile.mkstemp(prefix=".interp-probe.", dir=out)
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise OutputError(
            f"cannot write to output folder {out}: {why}; pass a writable output folder (out=)", params="out"
        ) from None
    finally:
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
    return out


def remove_superseded(written: Sequence[Path]) -> list[Path]:
    """Delete the ``.partial`` twin (:func:`~interp._io.partial_name`) of each complete file ``written``:
    what an interrupted run of the same output left, now complete beside it. Nothing else is touched
    (another command's or another output's partial files stay). Returns the paths removed."""
    removed = []
    for path in written:
        twin = partial_name(path)
        if twin != Path(path) and twin.is_file():
            twin.unlink()
            removed.append(twin)
    return removed


def mark_partial(out: Path, since: float) -> list[Path]:
    """Rename the files under ``out`` written at or after ``since`` to ``<stem>.partial<suffix>``.

    What an interrupted run wrote may be a mix of new and old results (a figure from this run beside
    a table from the last), so nothing of it may pass for complete: ``sinks_heads.html`` becomes
    ``sinks_heads.partial.html`` (:func:`interp._io.partial_name`). Files already marked, hidden
    files (locks, journals) and older files are left alone. Returns the new paths.
    """
    marked = []
    for path in sorted(out.iterdir()):
        if not path.is_file() or path.name.startswith(".") or PARTIAL in path.name:
            continue
        try:
            if path.stat().st_mtime < since - 1e-3:
                continue
        except OSError:
            continue
        target = partial_name(path)
        os.replace(path, target)
        marked.append(target)
    return marked
