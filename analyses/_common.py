"""What the benchmarks share: the repository on the import path, the models they build, peak memory.

The scripts run as ``python analyses/bench_x.py`` from the repository root, where Python puts
``analyses/`` (not the root) first on ``sys.path``; importing this module puts the root there too,
so ``interp`` is this checkout's and the random-weight model builders come from ``tests/helpers.py``,
the same ones the tests use.

Peak memory is read from Linux's ``/proc/self/status``: ``VmHWM`` is the process's resident-set
high-water mark, ``VmRSS`` its resident set now, and writing ``5`` to ``/proc/self/clear_refs``
resets the mark to the resident set now, so a call's own peak can be told from everything before it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.helpers import GPT2_SMALL, child_env, gpt2_small, llama_model, save_tiny_llama, word_tokenizer  # noqa: E402

__all__ = [
    "ROOT",
    "GPT2_SMALL",
    "child_env",
    "gpt2_small",
    "llama_model",
    "save_tiny_llama",
    "word_tokenizer",
    "can_reset_peak",
    "status_bytes",
    "reset_peak",
    "peak_growth",
    "random_gpt2",
]

T = TypeVar("T")


def can_reset_peak() -> bool:
    """Whether this system lets :func:`reset_peak` and :func:`status_bytes` work (Linux)."""
    return os.path.exists("/proc/self/clear_refs")


def status_bytes(field: str) -> int:
    """One memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ``VmSize``, ...) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the file says kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    """Reset the resident-set high-water mark (``VmHWM``) to the resident set now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_growth(fn: Callable[[], T]) -> tuple[T, int]:
    """``fn()`` and the bytes its peak resident set rose above the resident set just before it."""
    reset_peak()
    before = status_bytes("VmRSS")
    out = fn()
    return out, status_bytes("VmHWM") - before


def random_gpt2(n_layer: int | None = None, tokenizer=None):
    """GPT-2 small's architecture with random weights (seed 0), ``n_layer`` blocks deep (default 12),
    as an ``interp`` model named ``gpt2-small-random``: no download."""
    from interp.models import from_hf_model

    hf = gpt2_small() if n_layer is None else gpt2_small(n_layer)
    return from_hf_model(hf, tokenizer, name="gpt2-small-random")


def run_worker(cmd: list[str], env: dict[str, str], **fields: object) -> dict:
    """Run one measurement in a fresh process (``cmd`` prints its result as JSON on its last line).
    A failure is ``{**fields, "oom": ..., "error": ...}``: out of memory when it hit its cap (a
    memory/allocation error, or killed), else the last line it printed."""
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode == 0:
        return json.loads(done.stdout.strip().splitlines()[-1])
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
    oom = any("memory" in line.lower() or "alloc" in line.lower() for line in tail) or done.returncode in (-9, 137)
    return {**fields, "oom": oom, "error": None if oom else tail}
