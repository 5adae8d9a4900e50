"""Sharded runs under ``torchrun``: every rank holds a replica and takes its share of the work.

``torchrun --nproc-per-node N -m interp.ablate ...`` starts N processes with ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and a rendezvous address in their environment. :func:`start` joins
them into one process group (gloo on CPU; on CUDA, nccl for CUDA tensors and gloo for the small CPU
results, chosen automatically), and each analysis splits its work at one seam:

- :func:`map_sequences` runs a per-sequence computation on this rank's contiguous block of the
  probe's sequences and returns every sequence's result, in probe order, on every rank (head
  scores, sinks, gradient importance);
- the exact sweep (:class:`~interp.ablation.replay.Sweeper`) hands each rank every ``world``-th
  head set of its sorted work (later layers replay fewer blocks, so striding balances the work), a
  round of forwards at a time, and :func:`run_sharded` gathers what each rank made.

Every exchange is one ``all_gather_object`` of ``(status, payload)``: a rank that raised takes part
in the next exchange with its error instead of a result, and then *every* rank raises (the failing
rank its own exception, the others a :class:`~interp.errors.RankFailedError`, or the same
:class:`~interp.errors.InterpError` subclass when the failure was one). Nobody waits forever on a
rank that is gone, and nothing is written as complete. Results are identical on every rank, so the
code after an analysis runs unchanged; :func:`is_main` says who prints, shows progress and writes.

Without a process group (no ``torchrun``, or ``WORLD_SIZE=1``) every function here is the identity
of the single-process run: no group, no copies, no overhead.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

import interp.errors as errors
from interp.errors import InterpError, RankFailedError

T = TypeVar("T")
_STARTED_HERE = False
_STORE: dist.Store | None = None  # the launcher's store (this group's keys), kept for stop()
_GROUPS = 0  # groups this process has started (each keeps its keys apart on the store)


# --------------------------------------------------------------------------------------------
# who am I


def launched() -> bool:
    """Was this process started by ``torchrun`` (or anything that sets its variables) with >1 ranks?"""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def active() -> bool:
    """Is there a process group of more than one rank to share work with?"""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 without a group; the launcher's ``RANK`` before the group exists)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """Ranks sharing the work (1 without a process group)."""
    return dist.get_world_size() if active() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """Rank 0: the one process that prints, shows progress bars and writes files."""
    return rank() == 0


# --------------------------------------------------------------------------------------------
# start and stop


def rank_device(device: str | torch.device | None) -> str | torch.device:
    """The one device this rank computes on, every spelling resolved once (before the group starts).

    ``None``/``"auto"``: ``cuda:LOCAL_RANK`` under torchrun (``cuda`` alone) when CUDA is there, else
    ``cpu``; ``"cuda"`` under torchrun: ``cuda:LOCAL_RANK`` (each rank its own GPU). Anything else is
    returned as given (``cpu``, ``cuda:N``, ``mps``; :func:`interp.models.resolve_device` checks it).
    """
    if device is None or str(device) == "auto":
        if not torch.cuda.is_available():
            return "cpu"
        return f"cuda:{local_rank()}" if launched() else "cuda"
    if launched() and str(device) == "cuda":
        return f"cuda:{local_rank()}"
    return device


def start(device: str | torch.device | None = None) -> bool:
    """Join the ranks ``torchrun`` started into one process group; ``False`` (and nothing done) when
    this process was not launched as one of several ranks, or a group already exists.

    The backend follows ``device``: ``"cpu:gloo,cuda:nccl"`` when this rank computes on CUDA (CUDA
    tensors over nccl, the CPU-side results over gloo), plain ``gloo`` otherwise.
    """
    global _STARTED_HERE, _STORE, _GROUPS
    if not launched() or (dist.is_available() and dist.is_initialized()):
        return False
    if not dist.is_available():
        raise RankFailedError("torch was built without torch.distributed: run without torchrun")
    dev = rank_device(device)
    on_cuda = dev is not None and torch.device(dev).type == "cuda"
    if on_cuda:
        torch.cuda.set_device(torch.device(dev))
    backend = "cpu:gloo,cuda:nccl" if on_cuda else "gloo"
    # torchrun's store outlives a restart (--max-restarts): keys of this attempt (and of this
    # process's n-th group) under their own prefix, or a rank may read a dead rank's address left
    # by the attempt before. The store is kept: :func:`stop` meets the other ranks on it to leave
    # the group in order.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    _GROUPS += 1
    store, r, w = next(dist.rendezvous("env://"))
    _STORE = dist.PrefixStore(f"interp/attempt-{attempt}/group-{_GROUPS}/", store)
    dist.init_process_group(backend=backend, store=_STORE, rank=r, world_size=w)
    _STARTED_HERE = True
    return True


def stop() -> None:
    """Leave the process group :func:`start` made (a group made by someone else is left alone).

    The ranks leave in a fixed order, and only once every one is done with the group: they meet at
    a barrier on the launcher's store (not on the group, so it holds for any backend), then every
    rank but 0 destroys its end of the group and says so on the store, and rank 0 destroys its end
    last, once all the others have. No rank closes its connections while another is still inside a
    collective or tearing its own end down, and the group's threads (gloo's I/O loop and workers)
    are joined here, before the interpreter's own shutdown. A rank that is gone (killed) costs the
    others at most :data:`LEAVE_TIMEOUT` before they leave anyway.
    """
    global _STARTED_HERE, _STORE
    started, store = _STARTED_HERE, _STORE
    _STARTED_HERE, _STORE = False, None
    if not (started and dist.is_initialized()):
        return
    try:
        if store is not None and active():
            _leave_in_order(store, dist.get_rank(), dist.get_world_size())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


LEAVE_TIMEOUT = timedelta(seconds=60)


def _leave_in_order(store: dist.Store, me: int, world: int) -> None:
    """Every rank but 0 leaves the group once all have arrived here; rank 0 waits for them to have left."""
    try:
        if store.add("leave/arrived", 1) == world:  # the last to arrive lets everyone go
            store.set("leave/all-arrived", "1")
        store.wait(["leave/all-arrived"], LEAVE_TIMEOUT)
        if me == 0:
            store.wait([f"leave/left-{r}" for r in range(1, world)], LEAVE_TIMEOUT)
            return
        try:
            dist.destroy_process_group()
        finally:
            store.set(f"leave/left-{me}", "1")
    except RuntimeError:  # the store's timeout or a lost store: a rank is gone, leave anyway
        pass


@contextmanager
def interrupt_once() -> Iterator[None]:
    """Ctrl-C raises ``KeyboardInterrupt`` once; later SIGINTs are ignored until the block ends.

    A terminal's Ctrl-C reaches every rank, and ``torchrun`` then forwards a second SIGINT and
    waits (``--shutdown-timeout``, 30 s by default) before killing the ranks: ignoring the second one
    lets the ranks gather the rows computed so far and rank 0 write them, marked partial.
    """
    if not active() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# --------------------------------------------------------------------------------------------
# exchanging results and failures


def _status(error: BaseException | None) -> tuple[str, Any]:
    if error is None:
        return ("ok", None)
    if isinstance(error, KeyboardInterrupt):
        return ("interrupted", None)
    return ("error", (type(error).__name__, " ".join(str(error).split())))


def _reported(error: BaseException) -> BaseException:
    """Mark an error that every rank has heard of: it must not be exchanged again on the way out."""
    error._interp_reported = True  # type: ignore[attr-defined]
    return error


def _already_reported(error: BaseException) -> bool:
    return bool(getattr(error, "_interp_reported", False))


def _raise_for(statuses: Sequence[tuple[str, Any]], what: str) -> None:
    """Raise on this rank if any rank failed (the lowest failing rank's error is reported)."""
    failed = [(r, s) for r, s in enumerate(statuses) if s[0] == "error"]
    if failed:
        r, (_, (kind, message)) = failed[0]
        others = [str(o) for o, _ in failed[1:]]
        also = f" (rank{'s' if len(others) > 1 else ''} {', '.join(others)} failed too)" if others else ""
        cls = getattr(errors, kind, None)
        if isinstance(cls, type) and issubclass(cls, InterpError):
            raise _reported(cls(f"rank {r}: {message}{also}"))
        raise _reported(
            RankFailedError(
                f"rank {r} of {len(statuses)} failed while {what}: {kind}: {message}{also}; "
                "its traceback is on that rank's stderr. Nothing was written as complete."
            )
        )
    if any(s[0] == "interrupted" for s in statuses):
        raise _reported(KeyboardInterrupt())


def _exchange(status: tuple[str, Any], payload: Any) -> list[Any]:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (status, payload))
    return gathered


def run_sharded(fn: Callable[[], T], what: str) -> list[T]:
    """Run ``fn()`` on every rank; every rank's result, in rank order, on every rank.

    If ``fn`` raised on any rank, every rank raises once all have reported (see the module
    docstring). Without a process group: ``[fn()]``.
    """
    if not active():
        return [fn()]
    error: BaseException | None = None
    result: Any = None
    try:
        result = fn()
    except BaseException as e:  # noqa: B036 -- every failure, Ctrl-C included, is reported to the others
        if _already_reported(e):
            raise
        error = e
    gathered = _exchange(_status(error), result)
    if error is not None:
        raise _reported(error)
    _raise_for([g[0] for g in gathered], what)
    return [g[1] for g in gathered]


def from_main(fn: Callable[[], T], what: str) -> T:
    """``fn()`` as rank 0 computes it, on every rank (the other ranks do not call ``fn``).

    What only rank 0 may know (the journal it alone reads, see :mod:`interp.journal`) reaches every
    rank this way; a failure on rank 0 stops every rank as :func:`run_sharded` does. Without a
    process group: ``fn()``."""
    if not active():
        return fn()
    return run_sharded(lambda: fn() if is_main() else None, what)[0]


def check_in(what: str, error: BaseException | None = None) -> None:
    """Every rank reports whether its part of ``what`` went well; all raise if one did not."""
    if not active():
        if error is not None:
            raise error
        return
    if error is not None and _already_reported(error):
        raise error
    gathered = _exchange(_status(error), None)
    if error is not None:
        raise _reported(error)
    _raise_for([g[0] for g in gathered], what)


@contextmanager
def checked(what: str) -> Iterator[None]:
    """Run the block on every rank, then :func:`check_in` its outcome (a failure stops every rank).

    A rank that fails in the block joins the next exchange any other rank makes (inside an
    analysis, or this check-in) with its error, so the others stop there too."""
    try:
        yield
    except BaseException as e:  # noqa: B036
        check_in(what, e)
        raise
    check_in(what)


# --------------------------------------------------------------------------------------------
# splitting work


def row_block(n: int) -> range:
    """This rank's contiguous block of ``range(n)`` (sizes differ by at most one between ranks)."""
    w, r = world_size(), rank() if active() else 0
    return range(r * n // w, (r + 1) * n // w)


def concat_rows(parts: Sequence[Any]) -> Any:
    """Concatenate per-sequence results along dim 0: tensors, and dicts / tuples / lists of them."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(parts))
    if isinstance(first, dict):
        return {k: concat_rows([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(concat_rows([p[i] for p in parts]) for i in range(len(first)))
    raise TypeError(f"cannot concatenate per-sequence results of type {type(first).__name__}")


def map_sequences(
    fn: Callable[[Any], T],
    probe: Any,
    *,
    merge: Callable[[list[T]], T] = concat_rows,
    what: str = "scoring the probe",
) -> T:
    """``fn(probe)``, computed as ``fn`` on each rank's block of sequences and merged in probe order.

    ``fn`` must treat sequences independently (its result per sequence must not depend on the
    others); ``merge`` joins the blocks' results in rank order (default: :func:`concat_rows`). A rank
    with no sequences (more ranks than sequences) contributes nothing. Every rank gets the result.
    """
    if not active():
        return fn(probe)
    rows = row_block(probe.batch)
    parts = run_sharded(lambda: fn(probe.select(rows)) if len(rows) else None, what)
    return merge([p for p in parts if p is not None])
