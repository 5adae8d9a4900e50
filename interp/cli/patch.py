"""``python -m interp.patch`` / ``interp patch``: which heads matter for a task, by activation patching.

A thin layer over :func:`interp.patching.patch_heads`: ``--task`` is a bundled task (``repeat``,
``ioi``, ``greater-than``: ``--batch`` pairs, default 20, seeded by ``--seed``) or a JSONL/CSV file
with the columns ``clean``, ``corrupted``, ``answer``, ``wrong`` (its first ``--batch`` pairs, default
every pair, the header says which; ``--framed``: its prompts already carry the model's framing); ``--by head|position|path``; ``--direction
denoise|noise``; ``--method exact|attribution|eap-ig|eap-ig-inputs|eap-ig-activations|clean-corrupted``; ``--site z|q|k|v|pattern`` (exact). Writes ``patch_<by>.{csv,json,html}`` and
``patch_<by>_pairs.csv`` (the effect per pair; ``patch_attribution_<by>...`` for attribution) under
``--out``. Every patch finished is journaled there: ``--resume`` continues an
interrupted run.

``--by path`` is exact path patching (:func:`interp.patching.path_patch`): the ``--senders`` x
``--receivers`` grid, the receivers the logits (default) or heads whose ``--site`` (``q``, ``k`` or
``v``; default ``q``) receives the path, each path a row of the edge replay (journaled too);
writes ``path_patching.{csv,json,html}``. ``--faithfulness``
(per head) adds the faithfulness curves of the rankings of the methods it names (default exact,
attribution and eap-ig; the run's own result is one of them): ``faithfulness.{csv,json,html}``, and the smallest
number of heads that reaches 0.8 and 0.9 of the clean metric per ranking.

Bad input (a task file without a column, pairs of different lengths, an answer of several tokens,
clean and corrupted prompts with the same metric, a sender in a later layer than its receiver, a
receiver no sender can reach, more pairs than the task file holds, a flag this run would ignore) is one line and exit 2, with nothing written.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from interp._io import writes_partial
from interp.ablation.modes import SITES
from interp.ablation.replay import REPLAYS
from interp.adapters import HookedModel
from interp.cli import flags
from interp.cli.common import FRAMED_UNREAD, Unread, partial_note, run_cli, stop_partial
from interp.config import RunConfig
from interp.errors import UsageError
from interp.models import describe
from interp.patching import (
    BY,
    FAITHFUL_TO,
    METHODS,
    METRICS,
    PATH_SITES,
    PatchScores,
    faithfulness_curves,
    patch_heads,
    path_patch,
    task_metric,
    validate_faithfulness_curves,
    validate_patch_heads,
    validate_path_patch,
)
from interp.patching.faithfulness import TARGETS
from interp.patching.heads import STEPPED
from interp.patching.paths import LOGITS
from interp.plots import save_figure
from interp.probes.task import DEFAULT_DIRECTION, DIRECTIONS, N_PAIRS, TaskProbe, task_probe
from interp.results import plural
from interp.scores import format_table

STEM = "patch"
PATH = "path"
RANKINGS = ("exact", "attribution", "eap-ig")  # --faithfulness given alone
ALIASES = {"n_pairs": "batch", "to": "faithfulness_to"}  # the library's parameters whose flags have other names


def build_parser(prog: str = "python -m interp.patch") -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "Which heads matter for a task: patch each head's output from one prompt of every clean/corrupted "
        "pair into the other (exact, batched) and measure how much of the answer moves.",
    )
    flags.add_resume_flags(p)
    flags.add_task_flag(p, "repeat")
    flags.set_help(
        p,
        "batch",
        f"pairs: of a bundled task (default: {N_PAIRS}), or the first n of a task file (default: every pair)",
        batch=None,
    )
    flags.choice(p, "--method", METHODS, "exact")
    p.add_argument(
        "--by",
        choices=[*BY.names(), PATH],
        default="head",
        help=BY.help() + f"; {PATH}: exact path patching, a --senders x --receivers grid",
    )
    p.add_argument(
        "--site",
        choices=SITES.names(),
        default=None,
        help="exact: what is patched: " + SITES.help() + " (default: z); with --by path, the receiver heads' "
        f"input the path reaches: {', '.join(PATH_SITES.names())} (default: q)",
    )
    p.add_argument(
        "--senders",
        default=None,
        help="--by path: the sender heads, layer.head comma-separated (default: every head)",
    )
    p.add_argument(
        "--receivers",
        default=None,
        help=f"--by path: '{LOGITS}' or receiver heads, layer.head comma-separated (default: {LOGITS})",
    )
    p.add_argument(
        "--faithfulness",
        type=flags.names_in(METHODS, "method"),
        nargs="?",
        const=list(RANKINGS),
        default=None,
        help="--by head: also the faithfulness curves (the top n heads kept, every other head patched) of the "
        "rankings of these methods, comma-separated (given alone: "
        + ", ".join(RANKINGS)
        + "), and the smallest n reaching "
        + " and ".join(f"{t:g}" for t in TARGETS)
        + " of the clean metric (default: off)",
        metavar="METHODS",
    )
    p.add_argument(
        "--faithfulness-to",
        choices=FAITHFUL_TO.names(),
        default=None,
        help=f"--faithfulness: what the heads outside the top n are patched to: {FAITHFUL_TO.help()} (default: "
        f"{FAITHFUL_TO.names()[0]})",
    )
    p.add_argument(
        "--direction",
        choices=DIRECTIONS.names(),
        default=DEFAULT_DIRECTION,
        help=DIRECTIONS.help(),
    )
    flags.choice(
        p, "--metric", METRICS, None, after=" (default: the task's own: prob-diff for greater-than, else logit-diff)"
    )
    flags.choice(p, "--replay", REPLAYS, None, "exact and --by path: ", " (default: auto)")
    p.add_argument(
        "--steps",
        type=flags.positive_int,
        default=None,
        help=f"{', '.join(STEPPED)}: the integration points (default: 5)",
    )
    flags.add_minibatch_flag(p, "pairs per forward (default: every pair in one forward)")
    return p


def _path(args: argparse.Namespace) -> bool:
    return args.by == PATH


def _head_receivers(args: argparse.Namespace) -> bool:
    return args.receivers is not None and args.receivers.strip() != LOGITS


UNREAD = (
    Unread("--senders", "it applies to --by path", lambda args: not _path(args)),
    Unread("--receivers", "it applies to --by path", lambda args: not _path(args)),
    Unread("--method", "--by path is exact path patching", _path),
    Unread(
        "--site",
        f"the receivers are the {LOGITS}; --site names a receiver head's input",
        lambda args: _path(args) and not _head_receivers(args),
    ),
    Unread("--faithfulness", "it ranks heads: it applies to --by head", lambda args: args.by != "head"),
    Unread("--faithfulness-to", "it applies to --faithfulness", lambda args: args.faithfulness is None),
    FRAMED_UNREAD,
)


def check(args: argparse.Namespace) -> None:
    """Before the model loads: the library's own checks of the run asked for (path patching's, or
    patching's and the faithfulness curves'), faithfulness of something other than head outputs, and
    a task that is neither bundled nor a readable file with every column."""
    if _path(args):
        receivers = args.receivers if args.receivers is not None else LOGITS
        validate_path_patch(
            senders=args.senders,
            receivers=receivers,
            site=args.site or "q",
            direction=args.direction,
            metric=args.metric,
        )
    else:
        validate_patch_heads(
            method=args.method,
            metric=args.metric,
            direction=args.direction,
            by=args.by,
            replay=args.replay,
            site=args.site,
            steps=args.steps,
        )
    if args.faithfulness is not None:
        if args.site not in (None, "z"):  # the command ranks by its own run: of head outputs
            raise UsageError(f"--faithfulness ranks head outputs (site z): drop --site {args.site}, or --faithfulness")
        validate_faithfulness_curves(to=args.faithfulness_to or FAITHFUL_TO.names()[0], metric=args.metric)
    flags.check_task(args.task, args.batch)


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    info = describe(model)
    config = flags.run_config(args)
    task = task_probe(model, args.task, n_pairs=args.batch, seed=args.seed, framed=args.framed)
    metric, normalised = task_metric(task, args.metric)
    exact = args.method == "exact"

    def header(clean: float, corrupted: float) -> None:
        print(
            f"{info.name} ({info.n_layers} layers x {info.n_heads} heads); task {task.name}: {flags.task_pairs(task)} "
            f"of {task.seq_len} tokens, read at position {task.read_position}; {metric.name} clean "
            f"{clean:.4f}, corrupted {corrupted:.4f}; {args.direction} by {args.by}"
        )

    if _path(args):  # every method measures the baselines in its own run: the header is printed after it
        return path_main(args, model, task, config, out, header)
    journals = getattr(args, "journals", None)
    kind = f"patch_{args.site or 'z'}_{args.by}_{args.direction}"
    journal = journals(kind, task.clean) if journals is not None and exact else None
    t0 = time.perf_counter()
    settings = {"replay": args.replay or "auto", "journal": journal, "site": args.site or "z"} if exact else {}
    if args.method in STEPPED:
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
    header(scores.meta["clean_metric"], scores.meta["corrupted_metric"])
    partial = bool(scores.meta.get("partial"))
    what = "fraction of the clean-corrupted gap moved" if normalised else f"change of {metric.name}"
    meta = scores.meta
    plain = " and one of their own" if not exact and meta["forwards"] > meta["backwards"] else ""
    how = (
        f"replay {meta['replay']}"
        if exact
        else f"{meta['passes']} forward(s) and backward(s) per minibatch, after one forward of the donor prompts{plain}"
    )
    print(f"{args.method} patching: {how}, {time.perf_counter() - t0:.2f}s\n")
    ranked = scores.rank("effect", top=args.top).dropna(subset=["effect"])
    label = "label" if args.by == "head" else None
    if label is None:
        ranked = ranked.assign(
            label=[f"{l}.{h}@{p}" for l, h, p in zip(ranked["layer"], ranked["head"], ranked["position"])]
        )
    if "gap_warning" in scores.meta:
        print(scores.meta["gap_warning"])
    units = "heads" if args.by == "head" else "head-positions"
    missing = int(scores.table["effect"].isna().sum()) if partial else 0
    print(f"top {len(ranked)} by effect ({what})" + partial_note(missing, len(scores.table), units) + ":")
    print(format_table(ranked, ["effect", "delta"], ci=["effect"], fmt=".4g", n_sequences=task.n_pairs))
    with writes_partial(partial):  # <stem>.partial.<ext>, every file: the earlier complete files are kept
        written = scores.save(out)
        written += save_figure(scores.figure(), out, scores.kind)
    if partial:
        stop_partial(written, journals)
    if args.faithfulness is not None:
        written += faithfulness_main(args, model, task, config, scores, out)
    if journals is not None:
        journals.finish()
    return written


def path_main(
    args: argparse.Namespace,
    model: HookedModel,
    task: TaskProbe,
    config: RunConfig,
    out: Path,
    header: Callable[[float, float], None],
) -> list[Path]:
    """``--by path``: the sender x receiver grid, its top paths printed, the table and figure written."""
    receivers = LOGITS if not _head_receivers(args) else args.receivers
    site = args.site or "q"
    journals = getattr(args, "journals", None)
    journal = (
        journals(f"path_{site if receivers != LOGITS else LOGITS}_{args.direction}", task.clean) if journals else None
    )
    t0 = time.perf_counter()
    paths = path_patch(
        model,
        task,
        senders=args.senders,
        receivers=receivers,
        site=site,
        direction=args.direction,
        metric=args.metric,
        config=config,
        replay=args.replay or "auto",
        journal=journal,
    )
    paths.meta["model_spec"] = args.model
    header(paths.meta["clean_metric"], paths.meta["corrupted_metric"])
    into = LOGITS if receivers == LOGITS else f"the receivers' {site}"
    print(
        f"path patching into {into}: {plural(len(paths.senders), 'sender')} x {plural(len(paths.receivers), 'receiver')}, "
        f"{time.perf_counter() - t0:.2f}s\n"
    )
    ranked = paths.table.dropna(subset=["effect"])
    ranked = ranked.reindex(ranked["effect"].abs().sort_values(ascending=False, kind="stable").index).head(args.top)
    ranked = ranked.assign(label=[f"{s} -> {r}" for s, r in zip(ranked["sender"], ranked["receiver"])])
    if "gap_warning" in paths.meta:
        print(paths.meta["gap_warning"])
    print(f"top {plural(len(ranked), 'path')} by |effect| (fraction of the clean-corrupted gap the path moves):")
    print(format_table(ranked, ["effect"], ci=["effect"], fmt=".4g", n_sequences=task.n_pairs))
    partial = bool(paths.meta.get("partial"))
    with writes_partial(partial):
        written = paths.save(out)
        written += save_figure(paths.figure(), out, "path_patching")
    if partial:
        stop_partial(written, journals)
    if journals is not None:
        journals.finish()
    return written


def faithfulness_main(
    args: argparse.Namespace, model: HookedModel, task: TaskProbe, config: RunConfig, own: PatchScores, out: Path
) -> list[Path]:
    """``--faithfulness``: each named method's per-head ranking (the run's own result reused), their
    faithfulness curves, and the smallest n reaching each target."""
    rankings = {}
    for method in args.faithfulness:
        if method == args.method:
            rankings[method] = own
        else:
            rankings[method] = patch_heads(
                model, task, method=method, metric=args.metric, direction=args.direction, config=config
            )
    to = args.faithfulness_to or FAITHFUL_TO.names()[0]
    curves = faithfulness_curves(model, task, rankings, to=to, metric=args.metric, config=config)
    curves.meta["model_spec"] = args.model
    what = FAITHFUL_TO.info(to, "printed")
    targets = " / ".join(f"{t:g}" for t in TARGETS)
    print(
        f"\nfaithfulness (the top n heads kept, every other head's output patched to {what}): the smallest n "
        f"reaching {targets} of the clean metric, of {plural(len(own.table), 'head')}:"
    )
    smallest = {t: curves.smallest(t) for t in TARGETS}
    width = max(len(name) for name in rankings)
    for name in rankings:
        cells = " / ".join("never" if smallest[t][name] is None else str(smallest[t][name]) for t in TARGETS)
        print(f"  {name:<{width}}  {cells}")
    return curves.save(out) + save_figure(curves.figure(), out, "faithfulness")


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.patch") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check, unread=UNREAD)
