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
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from interp.checkpoints import ToyTraining, checkpoint_scores, train_checkpoints
from interp.checkpoints.icl import ICL_DATA
from interp.checkpoints.sweep import BLOCK_LENS, KIND, SweepOut, retrieval_fits, sweep_sizes
from interp.checkpoints.toy import NAME as TOY_TRAINING
from interp.checkpoints.toy import trained
from interp.cli import flags
from interp.cli.common import Command
from interp.errors import UsageError
from interp.journal import FOLDER, finished_units, refuse_unfinished, run_arguments
from interp.models import resolve_device
from interp.texts import BYTES_NOTE

STEM = "checkpoints"
PROG = "python -m interp.checkpoints"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "Every head score (with bootstrap CIs) and Olsson et al.'s in-context learning score at each "
        "checkpoint of a training run: roles over time, handoffs and the induction-head phase change.",
    )
    _revision_flags(p)
    flags.add_block_flags(
        p,
        None,
        f"tokens per repeated block of the head-score probe (default: {BLOCK_LENS[0]}, or {BLOCK_LENS[1]} where "
        f"the context cannot hold --repeats blocks of {BLOCK_LENS[0]}, as {TOY_TRAINING}'s "
        f"{ToyTraining().model.n_ctx} tokens, else the longest block that fits)",
    )
    flags.add_ci_flag(p, "confidence level of the bootstrap CIs")
    what = "what the in-context score is read on: "
    flags.choice(
        p,
        "--icl-data",
        ICL_DATA,
        None,
        what,
        f" (default: text for a model with a tokenizer, repeated for the toy); {BYTES_NOTE}",
    )
    p.add_argument(
        "--icl-len",
        type=flags.positive_int,
        default=None,
        help="context of the in-context score in tokens (default: the model's, at most 512)",
    )
    p.add_argument("--icl-batch", type=flags.positive_int, default=16, help="sequences the in-context score averages")
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
        type=flags.positive_int,
        default=None,
        help="--retrieval only: tokens of the needle probe (default: min(1024, the context))",
    )
    flags.add_resume_flags(p)
    return p


def _revision_flags(p: argparse.ArgumentParser) -> None:
    """Where the revisions come from: a Hub model's, checkpoint folders, or the toy trained here."""
    flags.set_help(
        p,
        "model",
        f"'{TOY_TRAINING}' (default: train the toy from scratch here and sweep its checkpoints), or a "
        "Hugging Face name whose --revisions to sweep (EleutherAI/pythia-70m)",
        model=TOY_TRAINING,
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
        "--train-steps",
        type=flags.positive_int,
        default=None,
        help=f"{TOY_TRAINING} only: training steps (default {ToyTraining().train.steps})",
    )
    p.add_argument(
        "--every",
        type=flags.positive_int,
        default=None,
        help=f"{TOY_TRAINING} only: a checkpoint every this many steps (default {ToyTraining().every})",
    )
    p.add_argument(
        "--evict",
        action="store_true",
        help="Hub revisions only: delete each revision's downloaded files once it is scored (a revision "
        "that was already cached stays); the free disk is checked before each download",
    )


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
    trains = _trains(args)
    for flag, value in (("--train-steps", args.train_steps), ("--every", args.every)):
        if value is not None and not trains:
            raise UsageError(f"{flag} sets how {TOY_TRAINING} trains: it does nothing for other revisions")
    if args.retrieval_len is not None and not args.retrieval:
        raise UsageError("--retrieval-len sets the needle probe of --retrieval: pass --retrieval too")
    if args.retrieval and trains:  # the toy's context is known before it is trained
        retrieval_fits(TOY_TRAINING, ToyTraining().model.n_ctx - 1, args.retrieval_len)  # its BOS takes one
    if args.evict and args.revisions is None:
        raise UsageError("--evict deletes downloaded Hub revisions: it does nothing for local folders")


def _trains(args: argparse.Namespace) -> bool:
    return args.model == TOY_TRAINING and args.checkpoints is None


def plan_of(args: argparse.Namespace) -> ToyTraining:
    plan = ToyTraining()
    train = replace(plan.train, seed=args.seed, steps=args.train_steps or plan.train.steps)
    return replace(plan, train=train, every=args.every or plan.every)


def main(args: argparse.Namespace, out: Path) -> list[Path]:
    trains = _trains(args)
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
        config=flags.run_config(args),
        sizes=sizes,
        parts=[p for p, on in (("sinks", not args.no_sinks), ("retrieval", args.retrieval)) if on],
        device=resolve_device(args.device),
        dtype=args.dtype,
        evict=args.evict,
        out=SweepOut(out, resume=args.resume, fresh=args.fresh, arguments=arguments),
        name=args.model if trains or args.revisions else None,
        log=lambda line: print(line, flush=True),
    )
    print(f"\nswept {len(result.revisions)} revision(s) in {time.perf_counter() - t0:.0f} s")
    print(result.summary(args.top))
    return result.written


_NOT_RESULTS = ("out", "top", "no_progress", "resume", "fresh", "journals", "progress")


def _journaled(out: Path | None) -> str:
    """What an interrupted sweep leaves for ``--resume``: the revisions its journal holds, or none."""
    n = finished_units(out, KIND) if out is not None else 0
    if n:
        return f"{n} revision(s) scored so far are journaled in {out / FOLDER}: --resume continues"
    return "no revision was scored yet: nothing is journaled, and a rerun starts the sweep over"


def cli(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    with Command(build_parser(prog), argv, STEM, check=check, stop_note=_journaled, ranks=False) as cmd:
        # it loads each revision itself, of a size unknown here: the machine decides, unless the toy trains
        cmd.threads(None, "the toy trains deterministically and as fast on one thread" if _trains(cmd.args) else None)
        cmd.done(main(cmd.args, cmd.out))
    return cmd.code
