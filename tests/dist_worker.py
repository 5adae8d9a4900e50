"""One rank of the 2-process gloo run that tests/test_distributed.py launches with torchrun.

Every rank runs each analysis on the tiny GPT-2 in ``argv[1]`` and saves what it got (and how many
sequences went through its last block) to ``<argv[2]>/rank<r>.pt``; the parent compares those with a
single-process run. Then every command runs under the same group, writing under ``<argv[2]>/cli``;
finally a rank-1 failure and a rank-1 Ctrl-C are injected and the exit codes recorded.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from interp import distributed  # noqa: E402
from interp.models import load_model  # noqa: E402
from tests.dist_cases import cli_runs, library_results  # noqa: E402


def main(model_dir: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = load_model(model_dir, device="cpu")
    results = library_results(model)
    results["world"] = distributed.world_size()
    results["codes"] = cli_runs(model_dir, Path(out) / "cli", inject=True)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
