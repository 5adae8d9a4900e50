"""Memory estimates made before the work starts: refuse up front instead of being killed half-way.

The pattern engine's budget (:mod:`interp.stream.budget`) already sizes attention. This module
sizes the two other large consumers, from the model's shape and the probe's size alone (no forward
pass):

- the exact sweep's replay (:class:`~interp.ablation.replay.Sweeper`): the clean pass of *every*
  probe sequence is kept (the residual entering each block, each layer's ``hook_z`` and attention
  output, and the metric's read-out), plus one batched replay forward at a time (``chunk`` ablations
  of a minibatch through one block: attention scores and weights, the MLP's hidden layer, the
  logits read);
- the gradient pass (:func:`~interp.ablation.gradient.gradient_importance`): one minibatch's
  activations kept for backward (per layer: the residual and norms, q/k/v, z, scores and weights,
  the MLP's hidden layer; then the logits read, with their log-softmax and gradient).

Both are estimates (the model's own temporaries, the allocator's slack and the library's caches are
not counted) of what the work needs *beyond the loaded model*, compared with what the device has
free when the work starts: ``MemAvailable`` of ``/proc/meminfo`` on a CPU,
``torch.cuda.mem_get_info`` on CUDA (elsewhere, or where that cannot be read, nothing is checked).
Over it, :func:`check` refuses with one line (a :class:`~interp.errors.UsageError`, exit 2, nothing
written) giving the estimate, what is free, and what to do: the minibatch that would fit when a
smaller one would (``minibatch=``), else a smaller probe. (The replay batches as many ablations
into one forward as make about 2k tokens on a CPU, 16k elsewhere, so its forwards shrink with the
minibatch only once one minibatch is past that; what it keeps grows with the whole probe.) It never picks a smaller minibatch by
itself: a minibatch changes how sums are rounded, and a resumed run (:mod:`interp.journal`) must
compute exactly what the run it continues computed, whatever memory happens to be free.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from interp.errors import UsageError

if TYPE_CHECKING:  # annotations only: the adapters sit above this module
    from interp.adapters import HookedModel

MEMINFO = "/proc/meminfo"


def gib(n_bytes: float) -> str:
    """``n_bytes`` in GiB, MiB or KiB, three significant digits."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n_bytes >= size:
            return f"{n_bytes / size:.3g} {unit}"
    return f"{n_bytes / 2**10:.3g} KiB"


def free_bytes(device: torch.device | str) -> int | None:
    """Bytes free on ``device`` now: on a CPU the least of ``MemAvailable``, the room left under this
    process's memory cgroup limit and under its address-space limit (``ulimit -v``); free CUDA memory;
    None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.type == "cpu":
        room = [n for n in (_meminfo_available(), _cgroup_room(), _address_space_room()) if n is not None]
        return min(room) if room else None
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def _meminfo_available() -> int | None:
    for line in (_read(MEMINFO) or "").splitlines():
        if line.startswith("MemAvailable:"):
            try:
                return int(line.split()[1]) * 1024
            except (ValueError, IndexError):
                return None
    return None


def _cgroup_room() -> int | None:
    """The memory cgroup's limit less its usage (cgroup v2, else v1); None where there is no limit."""
    groups = dict(
        line.split(":", 2)[1:] for line in (_read("/proc/self/cgroup") or "").splitlines() if line.count(":") >= 2
    )
    v2, v1 = groups.get("", "/").rstrip("/"), groups.get("memory", "/").rstrip("/")
    candidates = [
        (f"/sys/fs/cgroup{v2}/memory.max", f"/sys/fs/cgroup{v2}/memory.current"),
        (f"/sys/fs/cgroup/memory{v1}/memory.limit_in_bytes", f"/sys/fs/cgroup/memory{v1}/memory.usage_in_bytes"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ]
    for limit, usage in candidates:
        lim, used = _read(limit), _read(usage)
        if lim is None or used is None:
            continue
        lim = lim.strip()
        if lim == "max" or not lim.isdigit() or int(lim) >= 1 << 60:  # v1 writes "no limit" as a huge number
            return None
        try:
            return max(0, int(lim) - int(used.strip()))
        except ValueError:
            return None
    return None


def _address_space_room() -> int | None:
    """The address-space limit (``ulimit -v``) less this process's virtual size; None where unlimited."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    for line in (_read("/proc/self/status") or "").splitlines():
        if line.startswith("VmSize:"):
            try:
                return max(0, soft - int(line.split()[1]) * 1024)
            except (ValueError, IndexError):
                return None
    return None


@dataclass(frozen=True)
class Shape:
    """What the estimates read of a model: its ``describe`` facts, its MLP width and its dtype."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    d_vocab: int
    itemsize: int

    @classmethod
    def of(cls, model: HookedModel, info: Any) -> Shape:
        cfg = getattr(model, "cfg", None)
        d_mlp = getattr(cfg, "d_mlp", None) or 4 * info.d_model
        try:
            itemsize = next(p for p in model.parameters()).element_size()
        except (StopIteration, AttributeError):
            itemsize = 4
        return cls(info.n_layers, info.n_heads, info.d_model, info.d_head, int(d_mlp), info.d_vocab, itemsize)


@dataclass(frozen=True)
class Estimate:
    """Bytes a piece of work needs: ``kept`` for its whole length, ``per_forward`` for one forward
    of ``minibatch`` sequences (``pass_is``: what that pass is, said where nothing is kept)."""

    what: str
    kept: int
    per_forward: int
    minibatch: int
    kept_is: str
    pass_is: str = "a forward"

    @property
    def total(self) -> int:
        return self.kept + self.per_forward


def sweep_estimate(shape: Shape, batch: int, seq_len: int, minibatch: int, chunk: int, n_read: int) -> Estimate:
    """The replay's clean cache of ``batch`` sequences of ``seq_len`` tokens, and one forward of
    ``chunk`` ablations of a ``minibatch`` (``n_read`` positions read; the vocabulary when the
    metric reads logits, counted as read)."""
    s, L, T = shape, shape.n_layers, seq_len
    width = s.n_heads * s.d_head
    per_token_layer = 3 * s.d_model + width  # residual in, the call's extras, attention out; hook_z
    read = 2 * n_read * s.d_vocab  # the read-out and the unablated reference
    kept = s.itemsize * batch * (T * L * per_token_layer + read)
    # one replay forward, per sequence of the minibatch: `chunk` copies through one block at a time
    block = T * (4 * s.d_model + 3 * width + 2 * s.n_heads * T + 2 * s.d_mlp)
    per_forward = s.itemsize * minibatch * chunk * (T * s.d_model + block + 2 * n_read * s.d_vocab)
    return Estimate("the exact sweep", kept, per_forward, minibatch, "the clean pass of every sequence, kept")


def gradient_estimate(shape: Shape, seq_len: int, minibatch: int, n_read: int, *, fused: bool = False) -> Estimate:
    """One minibatch's forward with every activation kept for backward (see the module docstring);
    ``fused``: the attention runs fused, forming no ``[T, T]`` pattern (its backward keeps a row
    statistic per query instead)."""
    s, T = shape, seq_len
    width = s.n_heads * s.d_head
    pattern = 2 * s.n_heads * (1 if fused else T)
    per_layer = T * (6 * s.d_model + 4 * width + pattern + 2 * s.d_mlp)
    per_forward = s.itemsize * minibatch * (s.n_layers * per_layer + 3 * n_read * s.d_vocab)
    return Estimate("the gradient pass", 0, per_forward, minibatch, "", "a forward and backward")


def forward_estimate(
    shape: Shape, seq_len: int, minibatch: int, n_read: int, what: str, kept: int = 0, kept_is: str = ""
) -> Estimate:
    """One forward without gradients of ``minibatch`` sequences (one block's temporaries at a time,
    and the read-out of ``n_read`` vocabulary-wide rows), beside ``kept`` bytes held for the whole work."""
    s, T = shape, seq_len
    width = s.n_heads * s.d_head
    block = T * (4 * s.d_model + 3 * width + 2 * s.n_heads * T + 2 * s.d_mlp)
    per_forward = s.itemsize * minibatch * (T * s.d_model + block + 2 * n_read * s.d_vocab)
    return Estimate(what, kept, per_forward, minibatch, kept_is)


def forward_memory(
    model: HookedModel,
    info: Any,
    batch: int,
    seq_len: int,
    metric: Any,
    what: str,
    kept: int = 0,
    kept_is: str = "",
) -> Callable[[int], Estimate]:
    """:func:`forward_estimate` for ``model`` on ``batch`` sequences of ``seq_len`` tokens read by
    ``metric``, as a function of the minibatch."""
    n_read = positions_read(metric, info, seq_len)
    shape = Shape.of(model, info)
    return lambda minibatch: forward_estimate(shape, seq_len, min(minibatch, batch), n_read, what, kept, kept_is)


FEWER = "use fewer or shorter probe sequences (batch=, seq_len=)"  # what check says when no minibatch fits


def check(
    estimate_for: Callable[[int], Estimate],
    minibatch: int,
    device: torch.device | str,
    fewer: str = FEWER,
) -> None:
    """Refuse (:class:`~interp.errors.UsageError`) when ``estimate_for(minibatch)`` is above what
    ``device`` has free (:func:`free_bytes`, read when called); the message names the largest
    smaller minibatch that would fit, if one does, else says ``fewer``: what else to pass, each
    parameter written ``name=`` in it (:data:`FEWER`), which the error carries as its ``params``."""
    device = torch.device(device)
    available = free_bytes(device)
    estimate = estimate_for(minibatch)
    if available is None or estimate.total <= available:
        return
    fits = next((m for m in range(minibatch - 1, 0, -1) if estimate_for(m).total <= available), 0)
    need = f"{estimate.what} needs about {gib(estimate.total)}"
    if estimate.kept:
        need += f" ({gib(estimate.kept)} for {estimate.kept_is}, {gib(estimate.per_forward)} per forward"
        need += f" of {estimate.minibatch} sequence(s))"
    else:
        need += f" for {estimate.pass_is} of {estimate.minibatch} sequence(s)"
    if fits:
        todo = f"pass minibatch={fits} (or less) to run fewer sequences per forward"
    else:
        todo = fewer
    raise UsageError(f"{need}, but the {device.type} has {gib(available)} free: {todo}", params=named(todo))


def check_bootstrap(n_boot: int, n_units: int | None = None) -> None:
    """Refuse, before the work, ``n_boot`` resamples of ``n_units`` units (None: not known yet, so at
    least one) that cannot fit in what the CPU has free: a resample's indices, the values they gather
    and its statistic (8 bytes each)."""
    need, room = 3 * 8 * n_boot * max(n_units or 1, 1), free_bytes("cpu")
    if room is not None and need > room:
        of = f" of {n_units} units" if n_units else ""
        raise UsageError(
            f"{n_boot} bootstrap resamples{of} need {'about' if n_units else 'at least'} {gib(need)}, but the cpu "
            f"has {gib(room)} free: pass a smaller n_boot= (the default is 1000)",
            params="n_boot",
        )


def named(text: str) -> tuple[str, ...]:
    """The parameters a message names, each written ``name=`` in it (``"pass minibatch=2"``: minibatch)."""
    return tuple(dict.fromkeys(re.findall(r"(?<![\w.=-])([a-z_][a-z0-9_]*)=", text)))


def positions_read(metric: Any, info: Any, seq_len: int) -> int:
    """How many vocabulary-wide rows a metric's read-out takes per sequence (its positions; a
    metric that reads the final residual instead counts as that much of a vocabulary row)."""
    positions = getattr(metric, "positions", None)
    n = seq_len if positions is None else len(positions)
    if getattr(metric, "reads", "logits") != "logits":
        n = max(1, n * info.d_model // max(1, info.d_vocab))
    return n


def gradient_memory(model: HookedModel, info: Any, probe: Any, metric: Any) -> Callable[[int], Estimate]:
    """:func:`gradient_estimate` for ``model`` on ``probe``, as a function of the minibatch."""
    n_read = positions_read(metric, info, probe.seq_len)
    shape = Shape.of(model, info)
    return lambda minibatch: gradient_estimate(shape, probe.seq_len, min(minibatch, probe.batch), n_read)


def out_of_memory(error: BaseException) -> bool:
    """Was ``error`` an allocation that failed (a CPU or CUDA out-of-memory error)?"""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)
