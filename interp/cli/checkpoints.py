"""``python -m interp.checkpoints``: every head score and the in-context learning score over training.

Revisions come from a Hub model (``--model EleutherAI/pythia-70m --revisions 0:143000:10000``),
from checkpoint folders (``--checkpoints 'runs/step*'``), or from ``--model toy-training``, which
trains the toy from scratch on the CPU (seeded) with a checkpoint every ``--every`` steps and sweeps
those. One model is loaded at a time; each finished revision is journaled under ``--out`` so
``--resume`` continues a stopped run. It prints each revision as it is scored, then the duplicates,
each role's holders, the handoffs and the phase-change window, and writes ``checkpoints.csv``,
``checkpoints_revisions.csv``, ``checkpoints.json``, ``checkpoints.html`` (``.png`` when an
exporter is available) and ``checkpoints_atlas.html``, one self-contained page over the revisions
(:mod:`interp.checkpoints.page`). ``--retrieval`` adds each head's retrieval score on a needle probe.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from interp._io import ensure_writable_dir
from interp.checkpoints import CheckpointScores, ToyTraining, checkpoint_scores, train_checkpoints
from interp.checkpoints.icl import ICL_DATA
from interp.checkpoints.result import fmt_steps
from interp.checkpoints.roles import holder_runs
from interp.checkpoints.sweep import BLOCK_LENS, KIND, SweepOut, retrieval_fits, sweep_sizes
from interp.checkpoints.toy import NAME as TOY_TRAINING
from interp.checkpoints.toy import trained
from interp.cli.common import (
    EXIT_MODEL,
    EXIT_USAGE,
    add_resume_flags,
    base_parser,
    default_out,
    fail,
    float_in,
    interrupted,
    one_line_warnings,
    positive_int,
    print_written,
    progress_lines,
    stop_interrupted,
)
from interp.errors import InterpError, ModelLoadError, UsageError
from interp.journal import FOLDER, finished_units, refuse_unfinished, run_arguments
from interp.lock import out_lock
from interp.models import resolve_device, resolve_dtype
from interp.saving import cli_owned
from interp.texts import BYTES_NOTE
from interp.threads import choose_threads

STEM = "checkpoints"
PROG = "python -m interp.checkpoints"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = base_parser(
        prog,
        "Every head score (with bootstrap CIs) and Olsson et al.'s in-context learning score at each "
        "checkpoint of a training run: roles over time, handoffs and the induction-head phase change.",
    )
    p.set_defaults(model=TOY_TRAINING)
    for action in p._actions:
        if action.dest == "model":
            action.help = (
                f"'{TOY_TRAINING}' (default: train the toy from scratch here and sweep its checkpoints), or a "
                "Hugging Face name whose --revisions to sweep (EleutherAI/pythia-70m)"
            )
    p.add_argument(
        "--revisions",
        default=None,
        help="Hub revisions: step0,step1000,... or a range start:stop:stride in steps, stop included "
        "(0:143000:1000 gives step0, step1000, ..., step143000)",
    )
    p.add_argument(
        "--checkpoints",
        nargs="+",
        default=None,
        help="checkpoint folders (each a Hugging Face or toy model folder), or one quoted glob ('runs/step*'); "
        "ordered by the step in their names",
    )
    p.add_argument(
        "--seq-len",
        type=positive_int,
        default=None,
        help=f"tokens per repeated block of the head-score probe (default: {BLOCK_LENS[0]}, or {BLOCK_LENS[1]} where "
        f"the context cannot hold --repeats blocks of {BLOCK_LENS[0]}, as {TOY_TRAINING}'s "
        f"{ToyTraining().model.n_ctx} tokens, else the longest block that fits)",
    )
    p.add_argument("--repeats", type=positive_int, default=2, help="times the block is repeated")
    p.add_argument(
        "--ci",
        type=float_in(0, 1, low_open=True, high_open=True),
        default=0.95,
        help="confidence level of the bootstrap CIs",
    )
    p.add_argument(
        "--icl-data",
        choices=ICL_DATA.names(),
        default=None,
        help="what the in-context score is read on: "
        + ICL_DATA.help()
        + " (default: text for a model with a tokenizer, repeated for the toy); "
        + BYTES_NOTE,
    )
    p.add_argument(
        "--icl-len",
        type=positive_int,
        default=None,
        help="context of the in-context score in tokens (default: the model's, at most 512)",
    )
    p.add_argument("--icl-batch", type=positive_int, default=16, help="sequences the in-context score averages")
    p.add_argument(
        "--no-sinks",
        action="store_true",
        help="leave out each head's first-token mass (the sink role), read on 16 x 64 random tokens as the atlas does",
    )
    p.add_argument(
        "--retrieval",
        action="store_true",
        help="add each head's retrieval score (Wu et al. 2024, with its CI), retrieval mass and streaming share, "
        "read on one needle probe for every revision (3 needles of 8 tokens in 2 sequences; see --retrieval-len)",
    )
    p.add_argument(
        "--retrieval-len",
        type=positive_int,
        default=None,
        help="--retrieval only: tokens of the needle probe (default: min(1024, the context))",
    )
    p.add_argument(
        "--train-steps",
        type=positive_int,
        default=None,
        help=f"{TOY_TRAINING} only: training steps (default {ToyTraining().train.steps})",
    )
    p.add_argument(
        "--every",
        type=positive_int,
        default=None,
        help=f"{TOY_TRAINING} only: a checkpoint every this many steps (default {ToyTraining().every})",
    )
    p.add_argument(
        "--evict",
        action="store_true",
        help="Hub revisions only: delete each revision's downloaded files once it is scored (a revision "
        "that was already cached stays); the free disk is checked before each download",
    )
    add_resume_flags(p)
    return p


def check(args: argparse.Namespace) -> None:
    """Flags that do not go together: exit 2 before anything is trained or loaded."""
    toy = args.model == TOY_TRAINING
    if args.n_devices is not None or args.device_map is not None:
        raise UsageError("a checkpoint sweep loads one revision at a time on one device: drop --n-devices/--device-map")
    if args.checkpoints is not None and args.revisions is not None:
        raise UsageError("--checkpoints (folders) and --revisions (of a Hub model) exclude each other: pick one")
    if args.checkpoints is not None and not toy:
        raise UsageError(f"--checkpoints are folders: drop --model {args.model}")
    if args.checkpoints is None and not toy and args.revisions is None:
        raise UsageError(
            f"which revisions of {args.model}? pass --revisions (step0,step1000 or 0:143000:1000), "
            f"or --checkpoints folders, or --model {TOY_TRAINING}"
        )
    if args.revisions is not None and toy:
        raise UsageError(f"--revisions name versions of a Hub model: pass --model NAME (not {TOY_TRAINING})")
    trains = toy and args.checkpoints is None
    for flag, value in (("--train-steps", args.train_steps), ("--every", args.every)):
        if value is not None and not trains:
            raise UsageError(f"{flag} sets how {TOY_TRAINING} trains: it does nothing for other revisions")
    if args.retrieval_len is not None and not args.retrieval:
        raise UsageError("--retrieval-len sets the needle probe of --retrieval: pass --retrieval too")
    if args.retrieval and trains:  # the toy's context is known before it is trained
        retrieval_fits(TOY_TRAINING, ToyTraining().model.n_ctx - 1, args.retrieval_len)  # its BOS takes one
    if args.evict and args.revisions is None:
        raise UsageError("--evict deletes downloaded Hub revisions: it does nothing for local folders")


def plan_of(args: argparse.Namespace) -> ToyTraining:
    plan = ToyTraining()
    train = replace(plan.train, seed=args.seed, steps=args.train_steps or plan.train.steps)
    return replace(plan, train=train, every=args.every or plan.every)


def main(args: argparse.Namespace, out: Path) -> list[Path]:
    import torch

    device = resolve_device(args.device)
    trains = args.model == TOY_TRAINING and args.checkpoints is None
    if args.threads:
        threads, why = args.threads, "--threads"
    elif trains:
        threads, why = 1, "the toy trains deterministically and as fast on one thread"
    else:  # the size of the models to come is unknown here: the machine decides
        threads, why = choose_threads(None)
    torch.set_num_threads(threads)
    print(f"threads: {threads} ({why})", flush=True)
    checkpoints = args.checkpoints
    if trains:
        refuse_unfinished(out, KIND, args.resume, args.fresh)  # before the training, not after it
        plan = plan_of(args)
        how = f"seed {plan.train.seed}, {plan.train.steps} steps, a checkpoint every {plan.every}"
        if trained(out / "training", plan):
            print(f"reusing the toy's checkpoints trained earlier ({how}) in {out / 'training'}", flush=True)
            checkpoints = train_checkpoints(out / "training", plan)
        else:
            print(f"training the toy from scratch ({how}) into {out / 'training'}", flush=True)
            t0 = time.perf_counter()
            checkpoints = train_checkpoints(out / "training", plan)
            print(f"trained in {time.perf_counter() - t0:.0f} s", flush=True)
    elif checkpoints is not None and len(checkpoints) == 1:
        checkpoints = checkpoints[0]  # a glob, or one folder
    t0 = time.perf_counter()
    sizes = sweep_sizes(
        batch=args.batch,
        seq_len=args.seq_len,
        repeats=args.repeats,
        icl_data=args.icl_data,
        icl_len=args.icl_len,
        icl_batch=args.icl_batch,
        retrieval_len=args.retrieval_len,
    )
    arguments = run_arguments(args, ignore=(*_NOT_RESULTS, "evict", "threads", "device"))
    result = checkpoint_scores(
        checkpoints,
        model=None if args.revisions is None else args.model,
        revisions=args.revisions,
        config=_config(args),
        sizes=sizes,
        parts=[p for p, on in (("sinks", not args.no_sinks), ("retrieval", args.retrieval)) if on],
        device=device,
        dtype=args.dtype,
        evict=args.evict,
        out=SweepOut(out, resume=args.resume, fresh=args.fresh, arguments=arguments),
        name=args.model if trains or args.revisions else None,
        log=lambda line: print(line, flush=True),
    )
    print(f"\nswept {len(result.revisions)} revision(s) in {time.perf_counter() - t0:.0f} s")
    print(summary(result, args.top))
    return result.written


_NOT_RESULTS = ("out", "top", "no_progress", "resume", "fresh", "journals", "progress")


def _config(args: argparse.Namespace):
    from interp.config import RunConfig

    return RunConfig(seed=args.seed, level=args.ci)


def summary(result: CheckpointScores, top: int = 10) -> str:
    """What the sweep found, in a few lines."""
    lines = [f"in-context learning score: {result.meta['icl']['description']}"]
    dup = result.duplicates
    for row in dup.itertuples():
        lines.append(
            f"duplicate: {row.revision} has the weights of {row.duplicate_of} (fingerprint {row.weights}); "
            "left out of the roles and the figure"
        )
    held = result.holders()
    for role, seq in held.groupby("role", sort=False):
        runs = holder_runs(seq)
        if any(h for h, _, _ in runs):
            lines.append(f"{role}: " + "; ".join(f"{h or 'none'} (steps {a}-{b})" for h, a, b in runs[-top:]))
    for row in result.handoffs().head(top).itertuples():
        lines.append(
            f"handoff: {row.role} moves from {row.from_head} to {row.to_head} between steps {row.from_step} and "
            f"{row.to_step} ({row.from_head} {row.from_head_before:.3f} -> {row.from_head_after:.3f}, "
            f"{row.to_head} {row.to_head_before:.3f} -> {row.to_head_after:.3f})"
        )
    firsts = result.first_passes()
    for role, group in firsts.groupby("role", sort=False):
        lines.append(
            f"first passes the {role} rule: " + ", ".join(f"{r.head} at step {r.step}" for r in group.itertuples())
        )
    if "retrieval" in result.kept:
        lines.append(_retrieval_line(result.kept))
    window = result.phase_change()
    if window is None:
        steps = sorted(result.kept["step"].unique())
        lines.append(
            f"no phase change: the best induction score never rises from < 0.1 to > 0.5 over steps {fmt_steps(steps)}"
        )
    else:
        lines.append(
            f"phase change: steps {window['start']}-{window['end']}, the best induction score rises "
            f"{window['score_start']:.3f} -> {window['score_end']:.3f} while the in-context score goes "
            f"{window['icl_start']:.3f} -> {window['icl_end']:.3f} nats ({window['icl_fraction']:.0%} of its final "
            f"{window['icl_final']:.3f})"
        )
    return "\n".join(lines)


def _retrieval_line(kept) -> str:
    """The best head's retrieval score at the first and the last step kept."""
    ends = []
    for step in sorted(kept["step"].unique())[:: max(1, kept["step"].nunique() - 1)]:
        at = kept[kept["step"] == step].sort_values(["retrieval", "layer", "head"], ascending=[False, True, True])
        ends.append(f"{at['retrieval'].iloc[0]:.3f} at step {step} (head {at['label'].iloc[0]})")
    return "retrieval score of the best head: " + ", ".join(ends)


def _journaled(out: Path | None) -> str:
    """What an interrupted sweep leaves for ``--resume``: the revisions its journal holds, or none."""
    n = finished_units(out, KIND) if out is not None else 0
    if n:
        return f"{n} revision(s) scored so far are journaled in {out / FOLDER}: --resume continues"
    return "no revision was scored yet: nothing is journaled, and a rerun starts the sweep over"


def cli(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    run: dict[str, Any] = {}  # what stop_interrupted needs: the --out folder, whether the run finished
    started = time.time()
    try:
        check(args)
        resolve_device(args.device)
        resolve_dtype(args.dtype)
        with (
            one_line_warnings(parser.prog),
            progress_lines(bool(args.no_progress)),
            ExitStack() as held,
        ):
            out = run["out"] = ensure_writable_dir(args.out or default_out(args.model, STEM))
            held.enter_context(out_lock(out, f".interp-{STEM}.lock"))
            with cli_owned() as replaced:
                written = main(args, out)
            run["done"] = True
    except ModelLoadError as e:
        return fail(parser, e, EXIT_MODEL)
    except InterpError as e:
        return fail(parser, e, EXIT_USAGE)
    except BaseException as e:  # Ctrl-C at any moment: what was written is marked partial, exit 130
        if not interrupted(e):
            raise
        print(f"{parser.prog}: {_journaled(run.get('out'))}", file=sys.stderr)
        return stop_interrupted(parser.prog, e, run, started, lead=True)
    print_written(written, replaced)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
