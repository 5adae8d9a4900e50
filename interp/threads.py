"""How many CPU threads torch should use: never more than the machine has free.

torch starts one intra-op thread per core. On a small model each op is too small to split, and
on a machine that other jobs keep busy the threads wait on one another (an op ends when its
slowest thread does): a run can take ten times longer than on one thread. :func:`choose_threads`
picks one thread for small models and busy machines, and the free cores otherwise; it says why.
"""

from __future__ import annotations

import os

SMALL = 20_000_000  # parameters: below this one thread is as fast as several


def machine_load() -> float | None:
    """The 1-minute load average (runnable processes), or None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def choose_threads(
    n_params: int | None = None, *, cpus: int | None = None, load: float | None = None
) -> tuple[int, str]:
    """``(threads, why)`` for a model of ``n_params`` parameters on this machine.

    One thread when the model is small (below :data:`SMALL` parameters) or when fewer than two
    CPUs are free (``cpus`` minus the load average); else the free CPUs, rounded down. ``why`` calls
    the machine busy only when the load is above half its CPUs (a load of 0.6 on 2 CPUs leaves one
    free: that is what it says), and reads without nested parentheses inside ``threads: n (why)``.
    """
    cpus = cpus or os.cpu_count() or 1
    load = machine_load() if load is None else load
    if n_params is not None and n_params < SMALL:
        return 1, f"a small model, {n_params / 1e6:.2g}M parameters, runs as fast on one thread"
    if cpus < 2:
        return 1, "this machine has one CPU"
    if load is None:
        return cpus, f"{cpus} CPUs, the load unknown here"
    free = max(int(cpus - load), 0)
    n = free if free >= 2 else 1
    if load > cpus / 2:
        return n, f"the machine is busy: load {load:.1f} on {cpus} CPUs, {free} free"
    return n, f"{free} of {cpus} CPUs free, load {load:.1f}"


def count_parameters(model: object) -> int | None:
    """The model's parameter count, or None when it has no ``parameters()``."""
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    try:
        return sum(p.numel() for p in params())
    except Exception:  # a wrapper whose parameters cannot be listed: decide by the machine alone
        return None


__all__ = ["SMALL", "choose_threads", "count_parameters", "machine_load"]
