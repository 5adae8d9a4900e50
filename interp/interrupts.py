"""Ctrl-C at any moment: the few steps that must not be cut in half, and cleaning up after a child.

A ``KeyboardInterrupt`` can arrive between any two bytecodes of the main thread. Most code is
safe to stop anywhere (results are written atomically, see :mod:`interp._io`), but a few steps are
not: creating a temporary folder and remembering its name, starting a browser and remembering its
process, and the cleanup itself. :func:`deferred` holds a Ctrl-C that arrives inside such a step
and delivers it when the step is done; :func:`end_process_group` stops a child started in its own
process group together with every helper process it spawned; :func:`remove_tree` removes a
folder that such a child may have been writing into a moment ago.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SETTLE_S = 5.0
"""How long :func:`end_process_group` and :func:`remove_tree` wait for killed processes to let go."""


@contextmanager
def deferred() -> Iterator[None]:
    """Inside the block, a Ctrl-C (SIGINT) is held; when the block ends it is delivered as the
    handler that was in place would have delivered it (usually ``KeyboardInterrupt``).

    Only the main thread receives signals in Python; elsewhere (and where the handler in place was
    not set from Python) the block is a plain block.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    held: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(signal.SIGINT, held[0])
            elif previous == signal.SIG_DFL:  # what the default would have done, short of ending here
                raise KeyboardInterrupt


def end_process_group(proc: subprocess.Popen) -> None:
    """Kill ``proc`` (started with ``start_new_session=True``) and every process in its group, and
    reap it. Helpers that left the group on their own are not reached."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=SETTLE_S)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()


def remove_tree(path: str | os.PathLike) -> bool:
    """Remove the folder ``path``; retry for up to :data:`SETTLE_S` while processes that were just
    killed finish dying (a file created after the listing makes ``rmtree`` fail with "Directory not
    empty"). Never raises: returns whether the folder is gone."""
    path = Path(path)
    deadline = time.monotonic() + SETTLE_S
    while True:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return not path.exists()
            time.sleep(0.05)
            continue
        return True


def interrupted(error: BaseException) -> bool:
    """Was ``error`` a Ctrl-C, or raised while one was being handled (a cleanup that failed on the
    way out of an interrupted step)?"""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


__all__ = ["deferred", "end_process_group", "interrupted", "remove_tree"]
