"""``interp qk`` / ``python -m interp.qk``: why a head attends where it does.

A thin layer over :func:`interp.roles.qk.qk_attribution`: it builds the probe ``--at`` names (a
repeated-token probe for ``induction``, ``previous`` and ``sink``, a needle probe for ``retrieval``,
``--task`` for ``task``) or reads ``--text`` with one ``--query`` and ``--key`` position, prints each
head's top (query component, key component) pairs of the contrast with their CIs, and writes
``qk_attribution.csv/json`` and one heatmap page per head under ``--out``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from interp.adapters import HookedModel
from interp.cli import flags
from interp.cli.common import Unread, run_cli
from interp.config import RunConfig
from interp.errors import UsageError
from interp.results import few_ci_sequences, few_sequences_note, plural
from interp.roles.qk import (
    GROUPS,
    STEM,
    TARGETS,
    QKAttribution,
    head_totals,
    qk_attribution,
    qk_source,
    validate_qk_attribution,
)
from interp.scores import with_interval
from interp.texts import BYTES_NOTE


def build_parser(prog: str = "python -m interp.qk") -> argparse.ArgumentParser:
    p = flags.base_parser(prog, "Why a head attends where it does: its score split into (query, key) component pairs.")
    flags.set_help(
        p,
        "batch",
        "probe sequences (default: 10; 4 needle sequences for --at retrieval; a task file's every pair, a bundled task's 20)",
        batch=None,
    )
    heads = p.add_mutually_exclusive_group(required=True)
    heads.add_argument("--head", dest="heads", help="the head LAYER.HEAD, e.g. 1.2")
    heads.add_argument("--heads", dest="heads", help="comma-separated heads LAYER.HEAD")
    p.add_argument("--at", choices=TARGETS.names(), default=None, help=TARGETS.help() + " (default: induction)")
    flags.add_task_flag(p, None, "with --at task: ")
    p.add_argument(
        "--text",
        default=None,
        help=f"your own text, read at --query and --key (token positions); {BYTES_NOTE}",
    )
    p.add_argument("--query", type=int, default=None, help="with --text: the query position (default: the last)")
    p.add_argument("--key", type=int, default=None, help="with --text: the key position")
    p.add_argument("--group", choices=GROUPS.names(), default="component", help=GROUPS.help())
    p.add_argument(
        "--keep",
        type=lambda text: [h for h in text.split(",") if h],
        default=[],
        help="with --group layer or kind: heads that stay themselves, comma-separated (default: none)",
    )
    p.add_argument(
        "--seq-len",
        type=flags.positive_int,
        default=None,
        help="body tokens per sequence (default: 20 per repeat, 1024 for needles)",
    )
    p.add_argument("--n-boot", type=flags.positive_int, default=1000, help="bootstrap resamples over sequences")
    return p


# the library's parameter -> the flag that sets it, where their names differ
ALIASES = {"n_pairs": "batch"}
UNREAD = (
    Unread("--query", "it applies to --text", lambda args: args.text is None),
    Unread("--key", "it applies to --text", lambda args: args.text is None),
    Unread("--framed", "it applies to a task file, --task FILE", lambda args: args.task is None),
)


def check(args: argparse.Namespace) -> None:
    if args.text is not None and (args.at is not None or args.task is not None):
        raise UsageError("--text is read at --query and --key: drop --at and --task")
    if args.text is not None and args.key is None:
        raise UsageError("--text needs the key position to decompose: pass --key")
    for flag, pos in (("--query", args.query), ("--key", args.key)):
        if pos is not None and pos < 0:
            raise UsageError(f"{flag} {pos}: a token position of your text, 0 or more (positions do not wrap)")
    if args.task is not None:
        if args.at not in (None, "task"):
            raise UsageError(f"--task is read at its read position: drop --at {args.at}")
        args.at = "task"
        flags.check_task(args.task, args.batch)
    elif args.at == "task":
        raise UsageError("--at task needs --task (a bundled task or a task file)")
    args.at = args.at or ("induction" if args.text is None else None)
    validate_qk_attribution(heads=args.heads, at=args.at or "induction", group=args.group, keep=args.keep)


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    source, at, what = qk_source(
        model,
        at=args.at,
        text=args.text,
        query=args.query,
        key=args.key,
        task=args.task,
        batch=args.batch,
        seq_len=args.seq_len,
        seed=args.seed,
        framed=args.framed,
    )
    config = RunConfig(n_boot=args.n_boot, seed=args.seed, progress=args.progress)
    print(f"qk attribution at {args.at or 'your positions'}: {what}", flush=True)
    result = qk_attribution(model, source, heads=args.heads, at=at, group=args.group, keep=args.keep, config=config)
    level = int(round(100 * config.level))
    few = few_ci_sequences(result.table, result.meta)
    for head in result.heads:
        totals = head_totals(result, head)
        print(
            f"\nhead {head}: contrast {totals['contrast']:.4g} over {plural(totals['n_targets'], 'target')} "
            f"(the terms sum to {totals['contrast_terms']:.4g}); top pairs, {level}% CI over sequences:"
        )
        top = result.top(args.top, head=head)
        shown = pd.DataFrame({"query side": top["query"], "key side": top["key"]})
        shown["contrast"] = [
            with_interval(v, a, b, ".3g") + ("!" if few else "")
            for v, a, b in zip(top["contrast"], top["contrast_lo"], top["contrast_hi"])
        ]
        print(shown.to_string(index=False))
    if few is not None:
        print(few_sequences_note(few))
    if result.meta.get("softcap"):
        print(f"\n{result.meta['softcap']}")
    return _write(result, out)


def _write(result: QKAttribution, out: Path) -> list[Path]:
    from interp.plots import save_figure

    files = result.save(out)
    for head in result.heads:
        files += save_figure(result.figure(head), out, f"{STEM}_{head}")  # HTML, and PNG where a browser is
    return files


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.qk") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check, unread=UNREAD, aliases=ALIASES)
