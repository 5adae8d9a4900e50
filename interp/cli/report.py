"""``python -m interp.report`` / ``interp report``: a one-page head atlas of a model.

A thin layer over :func:`interp.report.head_atlas`: it prints the heads that earned a role and
writes ``atlas.html`` (self-contained and offline: plotly.js inlined), ``atlas_roles.csv`` (a row
per head) and ``atlas.json`` under ``--out``. The exact sweep and the pruning curves are journaled
(:mod:`interp.journal`): ``--resume`` continues a run that was killed, ``--fresh`` starts over.
``--task repeat|ioi|greater-than|FILE`` adds the task part (``--task-pairs`` pairs, seeded by
``--seed``): exact per-head patching (denoising) and direct logit attribution on the task's pairs,
read before the model loads (a bad task file is one line and exit 2).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from interp.ablation.modes import unpaired_ablations
from interp.adapters import HookedModel
from interp.cli import flags
from interp.cli.common import FRAMED_UNREAD, Unread, run_cli
from interp.config import RunConfig
from interp.models import describe
from interp.parts.roles import QKSizes
from interp.parts.table import THRESHOLD, role_columns
from interp.probes.task import task_probe
from interp.report.atlas import STEM
from interp.report.build import ABLATION_PARTS, PARTS, TASK_PAIRS, atlas_sizes, head_atlas
from interp.results import plural
from interp.scores import format_table


def _heads(text: str) -> list[str]:
    heads = [h.strip() for h in text.split(",") if h.strip()]
    for h in heads:
        layer, dot, head = h.partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            raise argparse.ArgumentTypeError(f"heads are LAYER.HEAD separated by commas (e.g. 1.2,0.1), got {h!r}")
    return heads


def _some_or_all(text: str) -> int | None:
    """``all`` (None: every head) or a whole number of at least 1."""
    if text.strip().lower() == "all":
        return None
    try:
        return flags.positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}, or all") from None


def build_parser(prog: str = "python -m interp.report") -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "Write a one-page head atlas: each head's scores and role, heatmaps, sinks, ablation importance, "
        "pruning curves and an attention-pattern viewer, as one offline HTML file.",
    )
    flags.add_resume_flags(p)
    flags.add_block_flags(p, 50, "tokens per repeated block of the score probe")
    p.add_argument("--sink-seq-len", type=flags.positive_int, default=64, help="random tokens per sink-probe sequence")
    p.add_argument("--ablation", choices=list(unpaired_ablations()), default="mean", help="how heads are ablated")
    p.add_argument(
        "--threshold",
        type=flags.float_in(0, 1, low_open=True, high_open=True),
        default=THRESHOLD,
        help="a role also needs at least this score (besides a CI above the uniform baseline)",
    )
    p.add_argument(
        "--skip",
        type=flags.names_in(PARTS, "part", empty=True),
        default=[],
        help=f"parts to leave out, comma-separated: {', '.join(PARTS)} (e.g. exact,pruning for a large model); "
        + PARTS.help(),
    )
    p.add_argument(
        "--view-heads", type=_heads, default=None, help="heads shown first in the pattern viewer, e.g. 1.2,0.1"
    )
    p.add_argument("--view-len", type=flags.positive_int, default=12, help="tokens per block of the viewer's sequence")
    p.add_argument(
        "--retrieval-len",
        type=flags.positive_int,
        default=None,
        help="needle-probe tokens of the retrieval part (default: min(1024, the context) when the context holds "
        "at least 512, else left out)",
    )
    p.add_argument(
        "--qk-heads",
        type=_some_or_all,
        default=QKSizes.heads,
        help=f"the strongest heads of each role the qk part decomposes (default {QKSizes.heads}; all: every one)",
    )
    flags.add_task_flag(
        p,
        None,
        "add the task part: exact per-head patching (denoising, the task's normalised metric) and direct logit "
        "attribution on the task's pairs (default: no task part); ",
    )
    p.add_argument(
        "--task-pairs",
        type=flags.positive_int,
        default=None,
        help=f"with --task: the pairs of a bundled task (default: {TASK_PAIRS}), or the first n of a task file "
        "(default: every pair)",
    )
    return p


def check(args: argparse.Namespace) -> None:
    """Before the model loads: ``--task`` is a bundled task or a readable task file with every column."""
    if args.task is not None:
        flags.check_task(args.task, args.task_pairs, "--task-pairs")


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    info = describe(model)
    t0 = time.perf_counter()
    sizes = atlas_sizes(
        batch=args.batch,
        seq_len=args.seq_len,
        repeats=args.repeats,
        sink_seq_len=args.sink_seq_len,
        ablation=args.ablation,
        view_len=args.view_len,
        view_heads=args.view_heads,
        retrieval_len=args.retrieval_len,
        qk_heads=args.qk_heads,
    )
    atlas = head_atlas(
        model,
        config=RunConfig(seed=args.seed, progress=args.progress),
        sizes=sizes,
        threshold=args.threshold,
        skip=args.skip,
        journals=getattr(args, "journals", None),
        # --framed: a task file's prompts as they are (the file read here, its pairs cut to --task-pairs)
        task=task_probe(model, args.task, n_pairs=args.task_pairs, seed=args.seed, framed=True)
        if args.framed
        else args.task,
        task_pairs=None if args.framed else args.task_pairs,
    )
    atlas.meta["model_spec"] = args.model
    elapsed = time.perf_counter() - t0
    print(
        f"{info.name} ({'causal' if info.is_causal else 'encoder'}, {info.n_layers} layers x {info.n_heads} heads); "
        f"atlas in {elapsed:.1f}s" + (f"; skipped {', '.join(args.skip)}" if args.skip else "")
    )
    roles = role_columns()
    base = ", ".join(f"{roles[c]} {v:.3f}" for c, v in atlas.baselines.items() if c in roles)
    print(f"uniform baselines: {base}\n")
    for col, role in roles.items():
        if col in atlas.roles:
            named = atlas.named(role)
            print(f"{role} heads: {', '.join(named[: args.top]) if named else 'none'}")
    named = atlas.roles[atlas.roles["role"] != ""]
    if len(named):
        cols = [c for c in roles if c in named]
        print(f"\nheads with a role ({len(named)} of {len(atlas.roles)}; score [{atlas.meta['ci_level']:.0%} CI]):")
        table = format_table(named.head(args.top), cols, ci=cols)
        lines = table.splitlines()
        print("\n".join(f"{line}  {role}" for line, role in zip(lines, ["role", *named["role"].head(args.top)])))
    else:
        print(f"\nno head's CI clears the uniform baseline with a score of at least {args.threshold:g}: no role named")
    if atlas.retrieval is not None:
        by = atlas.roles.set_index("label")["retrieval_role"]
        print(
            "\n"
            + "; ".join(
                f"{r} heads: {', '.join(by.index[by == r][: args.top]) or 'none'}" for r in ("retrieval", "streaming")
            )
        )
    if "task" in atlas.meta:
        _print_task(atlas, args.top)
    for note in atlas.meta.get("notes", []):
        print(f"\n{note}")
    written = atlas.save(out, STEM)
    exact = getattr(atlas, "exact", None)
    partial = exact is not None and bool(exact.meta.get("partial"))
    if getattr(args, "journals", None) is not None and not partial:
        args.journals.finish()  # the atlas is written whole: its journals go
    return written


def _print_task(atlas, top: int) -> None:
    """The task part's summary: the heads of largest patching effect, with their attribution."""
    t = atlas.meta["task"]
    print(
        f"\ntask {t['name']} ({plural(t['n_pairs'], 'pair')} of {t['seq_len']} tokens, read at position {t['read_position']}; "
        f"{t['metric']} clean {t['clean_metric']:.4f}, corrupted {t['corrupted_metric']:.4f}): heads by exact "
        f"patching effect (denoising; score [{atlas.meta['ci_level']:.0%} CI]):"
    )
    cols = [c for c in ("patch_effect", "dla") if c in atlas.roles]
    order = atlas.roles["patch_effect"].abs().sort_values(ascending=False, kind="mergesort").index
    print(format_table(atlas.roles.loc[order].head(top), cols, ci=cols, fmt=".3g", n_sequences=t["n_pairs"]))


def _skipped(*parts: str) -> Callable[[argparse.Namespace], bool]:
    """True in a run whose ``--skip`` leaves out every one of ``parts``."""
    return lambda args: set(parts) <= set(args.skip)


UNREAD = (
    Unread("--sink-seq-len", "it applies to the sinks part, skipped", _skipped("sinks")),
    Unread("--ablation", "it applies to the exact, gradient and pruning parts, all skipped", _skipped(*ABLATION_PARTS)),
    Unread("--view-heads", "it applies to the patterns part, skipped", _skipped("patterns")),
    Unread("--view-len", "it applies to the patterns part, skipped", _skipped("patterns")),
    Unread("--retrieval-len", "it applies to the retrieval part, skipped", _skipped("retrieval")),
    Unread("--qk-heads", "it applies to the qk part, skipped", _skipped("qk")),
    Unread("--task", "it applies to the task part, skipped", _skipped("task")),
    FRAMED_UNREAD,
    Unread("--task-pairs", "it applies to the task part, which runs only with --task", lambda a: a.task is None),
)


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.report") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check, unread=UNREAD)
