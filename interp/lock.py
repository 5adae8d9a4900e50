"""One run at a time per output folder: a lock file holding the owner's pid and host.

:func:`out_lock` creates ``<out>/<name>`` with ``O_CREAT | O_EXCL`` (atomic on local filesystems
and on NFSv3+): of two runs started into one ``--out`` at once, exactly one gets it and the other
refuses with one line naming the holder. A lock left behind by a process that is gone (a
``kill -9``, a crash, a lost node restarted on the same host) is taken over, with a note on stderr;
a lock held on another host cannot be checked from here and is respected. The lock is removed when
the block ends, however it ends (a ``kill -9`` is the one exception, and the next run takes it over).

The commands take ``.interp-<analysis>.lock``: two different analyses of one model share the
default ``out/<model>`` folder and write different files, so they may run side by side; two runs
of the same analysis would overwrite each other's files (and journals), so the second refuses.
Under ``torchrun`` only rank 0 takes the lock (the other ranks do not write).

Not guarded: a pid reused by an unrelated process after the holder died makes the lock look held
(the message says which file to delete), and two runs taking over one stale lock in the same
millisecond may both proceed.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from interp.errors import OutputError
from interp.interrupts import deferred

NAME = ".interp.lock"
UNREADABLE_GRACE_S = 10.0
"""A lock file with no readable owner (its writer was killed between creating and filling it) is
stale once it is this old."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _holder(path: Path) -> dict[str, Any] | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None
    except (OSError, ValueError):
        return None


def _stale(path: Path, holder: dict[str, Any] | None) -> str | None:
    """Why the lock at ``path`` can be taken over, or None when its holder may still be running."""
    if holder is None:
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return "it was just removed"
        return f"it names no owner and is {age:.0f} s old" if age > UNREADABLE_GRACE_S else None
    if holder.get("host") != socket.gethostname():
        return None
    return None if _alive(holder["pid"]) else f"pid {holder['pid']} is no longer running"


def _in_use(out: Path, path: Path, holder: dict[str, Any] | None) -> OutputError:
    if holder is None:
        who = "an owner that has not written its pid yet"
    else:
        who = f"pid {holder['pid']}"
        if holder.get("host") != socket.gethostname():
            who += f" on host {holder.get('host')}"
    return OutputError(
        f"{out} is in use by another interp run ({who}): wait for it to finish or pass another output folder (out=); "
        f"if no such run is left, delete {path}",
        params="out",
    )


@contextmanager
def out_lock(out: str | os.PathLike, name: str = NAME, *, take: bool = True) -> Iterator[Path | None]:
    """Hold ``<out>/<name>`` for the block; raise :class:`~interp.errors.OutputError` (exit 2) when another live run
    holds it. Folders made for the lock are removed again if they are empty at the end (a run that
    fails leaves nothing). ``take=False`` (the ranks other than 0): do nothing."""
    if not take:
        yield None
        return
    out = Path(out)
    made = [p for p in reversed([out, *out.parents]) if not p.exists()]
    path = out / name
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    created = False
    try:
        out.mkdir(parents=True, exist_ok=True)
        for _attempt in range(3):
            try:
                with deferred():  # created and remembered, or not created (a Ctrl-C waits for this line)
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                    created = True
            except FileExistsError:
                holder = _holder(path)
                why = _stale(path, holder)
                if why is None:
                    raise _in_use(out, path, holder) from None
                print(f"note: taking over the stale lock {path}: {why}", file=sys.stderr)
                path.unlink(missing_ok=True)
                continue
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(mine, f)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:  # a full disk: no half-written lock left behind
                path.unlink(missing_ok=True)
                why = (e.strerror or type(e).__name__).lower()
                raise OutputError(
                    f"cannot create the lock file {path}: {why}; pass a writable output folder (out=)",
                    params="out",
                ) from None
            break
        else:
            raise _in_use(out, path, _holder(path))
    except BaseException:  # a refusal, a full disk, Ctrl-C: no lock of ours is left behind
        if created:
            path.unlink(missing_ok=True)
        _remove_empty(made)
        raise
    try:
        yield path
    finally:
        if (_holder(path) or {}).get("pid") == mine["pid"]:
            path.unlink(missing_ok=True)
        _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass
