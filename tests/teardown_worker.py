"""One rank of a torchrun launch in the teardown stress test (tests/test_teardown.py).

    python -m torch.distributed.run --nproc-per-node 2 -m tests.teardown_worker OUT RUNS

Each run is one whole life of a rank as a command lives it: join the group
(:func:`interp.distributed.start`), exchange a few times, reach :func:`interp.distributed.stop` out
of step with the other rank (run ``i`` makes rank ``LATE[i][0]`` arrive ``LATE[i][1]`` seconds
late), and exit through the interpreter's normal shutdown. To have many runs for the price of one
launch, each rank forks ``RUNS`` children one after another (torch is imported once; no thread is
running when they fork): the ranks' ``i``-th children form the ``i``-th group, under its own keys
on torchrun's store, as a restarted group would. Then the rank itself runs once more, as a group of
the launch's own processes. Each child's exit status goes to ``OUT/rank<r>-exits.json``.

Each run writes what it saw while leaving to ``OUT/run<i>/rank<r>.json``: on rank 0, whether every
other rank had already left the group when rank 0 began to destroy its end (rank r writes
``left-<r>`` once its end is destroyed); on every rank, the threads left in the process after
``stop()`` (by name, from ``/proc``) and the Python threads still running.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist

from interp import distributed

LATE = [(1, 0.3), (0, 0.3), (1, 0.0)]  # (the rank that reaches stop() late, by how many seconds)


def thread_names() -> list[str]:
    """The names of this process's threads (Linux; empty elsewhere)."""
    task = Path("/proc/self/task")
    if not task.is_dir():
        return []
    return sorted((t / "comm").read_text().strip() for t in task.iterdir())


def one_run(out: Path, run: int) -> None:
    """One life of a rank in group ``run``: start, exchange, stop out of step, record."""
    os.environ["TORCHELASTIC_RESTART_COUNT"] = f"stress-{run}"  # this group's own keys on the store
    out.mkdir(parents=True, exist_ok=True)
    late, delay = LATE[run % len(LATE)]
    distributed.start("cpu")
    me, world = distributed.rank(), distributed.world_size()
    for i in range(3):
        distributed.check_in(f"exchange {i}")
    seen: dict[str, object] = {}
    destroy = dist.destroy_process_group

    def recorded(*args: object, **kwargs: object) -> None:
        if me == 0:
            seen["others_had_left"] = all((out / f"left-{r}").exists() for r in range(1, world))
        destroy(*args, **kwargs)
        if me != 0:
            (out / f"left-{me}").touch()

    dist.destroy_process_group = recorded
    try:
        if me == late:
            time.sleep(delay)
        distributed.stop()
    finally:
        dist.destroy_process_group = destroy
    seen["threads_after_stop"] = thread_names()
    seen["python_threads"] = threading.active_count()
    (out / f"rank{me}.json").write_text(json.dumps(seen))


def fork_runs(out: Path, runs: int) -> int | None:
    """Fork ``runs`` children one after another; in a child, its run number (it goes on to live that
    run and exit), in this process ``None`` once every child has exited (their statuses written)."""
    exits = []
    for run in range(runs):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return run
        exits.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    (out / f"rank{distributed.rank()}-exits.json").write_text(json.dumps(exits))
    return None


if __name__ == "__main__":
    folder, runs = Path(sys.argv[1]), int(sys.argv[2])
    child = fork_runs(folder, runs)
    one_run(folder / f"run{runs if child is None else child}", runs if child is None else child)
    # every process, children included, now ends through the interpreter's normal shutdown
