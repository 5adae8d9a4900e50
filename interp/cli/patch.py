"""``python -m interp.patch`` / ``interp patch``: which heads matter for a task, by activation patching.

A thin layer over :func:`interp.patching.patch_heads`: ``--task`` is a bundled task (``repeat``,
``ioi``, ``greater-than``: ``--batch`` pairs, seeded by ``--seed``) or a JSONL/CSV file with the
columns ``clean``, ``corrupted``, ``answer``, ``wrong``; ``--by head|position``; ``--direction
denoise|noise``; ``--method exact|attribution|eap-ig``; ``--site z|q|k|v|pattern`` (exact). Writes ``patch_<by>.{csv,json,html}`` and
``patch_<by>_pairs.csv`` (the effect per pair; ``patch_attribution_<by>...`` for attribution) under
``--out``. Every patch finished is journaled there: ``--resume`` continues an
interrupted run. Bad input (a task file without a column, pairs of different lengths, an answer of
several tokens, clean and corrupted prompts with the same metric) is one line and exit 2, with
nothing written.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from interp.ablation.modes import SITES
from interp.ablation.replay import REPLAYS
from interp.adapters import HookedModel
from interp.cli.common import (
    add_resume_flags,
    add_task_flag,
    base_parser,
    check_task,
    format_table,
    positive_int,
    run_cli,
)
from interp.config import RunConfig
from interp.errors import UsageError
from interp.models import describe
from interp.patching import BY, DIRECTION_HELP, METHODS, METRICS, baselines, patch_heads, task_metric
from interp.plots import save_figure
from interp.probes.task import DIRECTIONS, task_probe

STEM = "patch"


def build_parser(prog: str = "python -m interp.patch") -> argparse.ArgumentParser:
    p = base_parser(
        prog,
        "Which heads matter for a task: patch each head's output from one prompt of every clean/corrupted "
        "pair into the other (exact, batched) and measure how much of the answer moves.",
    )
    p.set_defaults(batch=20)
    add_resume_flags(p)
    add_task_flag(p, "repeat")
    p.add_argument("--method", choices=METHODS.names(), default="exact", help=METHODS.help())
    p.add_argument("--by", choices=BY.names(), default="head", help=BY.help())
    p.add_argument(
        "--site", choices=SITES.names(), default=None, help="exact: what is patched: " + SITES.help() + " (default: z)"
    )
    p.add_argument(
        "--direction",
        choices=DIRECTIONS,
        default="denoise",
        help="; ".join(f"{d}: {DIRECTION_HELP[d]}" for d in DIRECTIONS),
    )
    p.add_argument(
        "--metric",
        choices=METRICS.names(),
        default=None,
        help=METRICS.help() + " (default: the task's own: prob-diff for greater-than, else logit-diff)",
    )
    p.add_argument(
        "--replay", choices=REPLAYS.names(), default=None, help="exact: " + REPLAYS.help() + " (default: auto)"
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="eap-ig: integration steps between the activations (default: 5)",
    )
    p.add_argument("--minibatch", type=positive_int, default=None, help="pairs per forward")
    return p


def check(args: argparse.Namespace) -> None:
    """Before the model loads: a flag the method ignores; a task that is neither bundled nor a readable
    file with every column."""
    ignored = [flag for flag, value in (("--replay", args.replay), ("--site", args.site)) if value is not None]
    if args.method != "exact" and ignored:
        raise UsageError(
            f"--method {args.method} does not read {' or '.join(ignored)} (it applies to --method exact): drop "
            f"{'it' if len(ignored) == 1 else 'them'}"
        )
    if args.steps is not None and args.method != "eap-ig":
        raise UsageError(f"--method {args.method} does not read --steps (it applies to --method eap-ig): drop it")
    check_task(args.task)


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    info = describe(model)
    config = RunConfig(seed=args.seed, minibatch=args.minibatch, progress=args.progress)
    task = task_probe(model, args.task, n_pairs=args.batch, seed=args.seed)
    metric, normalised = task_metric(task, args.metric)
    clean, corrupted = baselines(model, task.to(info.device), metric, normalised=normalised, minibatch=args.minibatch)
    print(
        f"{info.name} ({info.n_layers} layers x {info.n_heads} heads); task {task.name}: {task.n_pairs} pairs of "
        f"{task.seq_len} tokens, read at position {task.read_position}; {metric.name} clean "
        f"{float(clean.mean()):.4f}, corrupted {float(corrupted.mean()):.4f}; {args.direction} by {args.by}"
    )
    journals = getattr(args, "journals", None)
    exact = args.method == "exact"
    kind = f"patch_{args.site or 'z'}_{args.by}_{args.direction}"
    journal = journals(kind, task.clean) if journals is not None and exact else None
    t0 = time.perf_counter()
    settings = {"replay": args.replay or "auto", "journal": journal, "site": args.site or "z"} if exact else {}
    if args.method == "eap-ig":
        settings["steps"] = args.steps
    scores = patch_heads(
        model,
        task,
        method=args.method,
        metric=args.metric,
        direction=args.direction,
        by=args.by,
        config=config,
        **settings,
    )
    scores.meta["model_spec"] = args.model
    partial = bool(scores.meta.get("partial"))
    what = "fraction of the clean-corrupted gap moved" if normalised else f"change of {metric.name}"
    passes = scores.meta.get("steps", 1)
    how = f"replay {scores.meta['replay']}" if exact else f"{passes} forward(s) and backward(s) per minibatch"
    print(f"{args.method} patching: {how}, {time.perf_counter() - t0:.2f}s\n")
    ranked = scores.rank("effect", top=args.top).dropna(subset=["effect"])
    label = "label" if args.by == "head" else None
    if label is None:
        ranked = ranked.assign(
            label=[f"{l}.{h}@{p}" for l, h, p in zip(ranked["layer"], ranked["head"], ranked["position"])]
        )
    print(f"top {len(ranked)} by effect ({what}):")
    print(format_table(ranked, ["effect", "delta"], ci=["effect"], fmt=".4g", n_sequences=task.n_pairs))
    stem = scores.kind + (".partial" if partial else "")
    written = scores.save(out, stem)
    written += save_figure(scores.figure(), out, stem)
    if partial:
        print("\ninterrupted: wrote the rows computed so far:")
        for path in written:
            print(f"  {path}")
        raise KeyboardInterrupt
    if journals is not None:
        journals.finish()
    return written


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.patch") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check)


if __name__ == "__main__":
    sys.exit(cli())
