"""``python -m interp.retrieval`` / ``interp retrieval``: retrieval heads, streaming heads and copy distance.

A thin layer over :func:`interp.retrieval.retrieval_scores` on a needle probe, the window-ablation
check of the roles and the copy-distance profile (:mod:`interp.retrieval.check`): it prints the heads ranked
by retrieval score with their role, and writes ``retrieval.{csv,json,html}``,
``retrieval_distance.{csv,html}`` under ``--out``. The defaults fit the model: ``--seq-len``
defaults to ``min(1024, the context)`` (255 on the bundled toy), ``--window`` to
``min(1024, seq_len // 4)``, the distances to the powers of 4 from 16 that fit the needle probe's
``--seq-len`` (16, 64, 256 at 1024 tokens).

Each part (the needle probe's scores, the ablation check, the copy-distance profile) says its sizes
on stderr before it starts and shows its progress; when one will clearly take much longer than the
needle probe's scores (from the work sizes: :func:`interp.progress.long_parts`), a note says so
before any work.

After the table it checks the roles by ablation: each role's heads (streaming, then retrieval) are
restricted to the first ``--sink`` + last ``--window`` keys (:class:`interp.ablation.WindowAblation`)
and the needle-copy loss is printed against the unrestricted model's (a streaming head should cost
nothing, a retrieval head should break the copy). The restriction edits the attention pattern, so the
check runs where the pattern engine fits its budget and is skipped with a note beyond. Under
``torchrun`` the sequences are split between the ranks, per-needle counts are gathered in the
probe's needle order (so the bootstrap over needles is the one-process one), and rank 0 prints and
writes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from interp._io import atomic_write
from interp.adapters import HookedModel
from interp.cli import flags
from interp.cli.common import Unread, run_cli
from interp.errors import UsageError
from interp.models import describe
from interp.plots import save_figure, short_name
from interp.probes.needle import HAYSTACKS, default_distances, needle_probe
from interp.progress import announcer, plan_note
from interp.results import plural
from interp.retrieval import (
    DEFAULT_SINK,
    RETRIEVAL_THRESHOLD,
    STREAMING_THRESHOLD,
    default_window,
    retrieval_scores,
    validate_retrieval_scores,
)
from interp.retrieval.check import CHECKED, copy_distance_profile, distance_leaders, retrieval_plan, window_check
from interp.retrieval.figures import copy_distance_figure, layer_windows, retrieval_figure

STEM = "retrieval"
_SHORTER = "--distances none skips the copy-distance profile, shorter --distances shorten it"


def build_parser(prog: str = "python -m interp.retrieval") -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "Find retrieval heads (Wu et al. 2024: the most-attended key is the needle token being copied), "
        "streaming heads (attention on the sink + recent window) and how far back each head copies, "
        "on teacher-forced needle-in-a-haystack probes.",
    )
    p.set_defaults(batch=4)
    p.add_argument(
        "--seq-len", type=flags.positive_int, default=None, help="body tokens (default: min(1024, the context))"
    )
    p.add_argument(
        "--depths",
        type=_floats,
        default=[0.1, 0.5, 0.9],
        help="needle depths in [0, 1], comma-separated; one needle per depth (default: 0.1,0.5,0.9)",
    )
    p.add_argument(
        "--needles", type=flags.positive_int, default=None, help="evenly spread needles (overrides --depths)"
    )
    p.add_argument("--needle-len", type=flags.positive_int, default=8, help="tokens per needle")
    flags.choice(p, "--haystack", HAYSTACKS, "random", "haystack tokens: ")
    p.add_argument("--sink", type=int, default=DEFAULT_SINK, help="streaming share: the first keys kept")
    p.add_argument(
        "--window",
        type=flags.positive_int,
        default=None,
        help="streaming share: recent keys kept (default: min(1024, seq_len // 4))",
    )
    p.add_argument(
        "--distances",
        type=_ints,
        default=None,
        help="copy distances, comma-separated (default: the powers of 4 from 16 that fit --seq-len); "
        "'none' skips the profile",
    )
    flags.add_ci_flag(p)
    flags.add_minibatch_flag(p, "sequences per forward pass (default: every sequence in one)")
    flags.add_engine_flag(p)
    return p


_depth = flags.float_in(0, 1)


def _floats(text: str) -> list[float]:
    """Needle depths: comma-separated numbers in [0, 1] (checked here, before the model loads)."""
    try:
        return [_depth(t) for t in text.split(",") if t.strip()]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"depths are comma-separated numbers in [0, 1]: {e}") from None


def _ints(text: str) -> list[int] | str:
    if text.strip().lower() == "none":
        return "none"
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers or 'none', got {text!r}") from None


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    info = describe(model)
    depths = args.depths if args.needles is None else [(i + 0.5) / args.needles for i in range(args.needles)]
    probe = needle_probe(
        model,
        seq_len=args.seq_len,
        depths=depths,
        needle_len=args.needle_len,
        batch=args.batch,
        seed=args.seed,
        haystack=args.haystack,
    )
    window = default_window(probe.seq_len) if args.window is None else args.window
    span = min(args.needle_len, 8)
    distances = args.distances
    if distances is None:  # what fits the needle probe: the length asked for (or its default)
        distances = default_distances(probe.meta["seq_len"], span)
    plan = retrieval_plan(info, probe, distances, span)
    say = announcer("retrieval", plan, args.progress)
    note = plan_note(plan, lambda parts: _SHORTER if "distance" in parts else "")
    if note and args.progress:
        print(note, file=sys.stderr, flush=True)
    say("needle")
    t0 = time.perf_counter()
    config = flags.run_config(args)
    scores = retrieval_scores(model, probe, sink=args.sink, window=window, config=config)
    elapsed = time.perf_counter() - t0
    scores.meta["model_spec"] = args.model
    print(
        f"{info.name} ({info.n_layers} layers x {info.n_heads} heads); needle probe: {args.batch} x "
        f"{probe.seq_len} tokens, {len(depths)} needle(s) of {args.needle_len} tokens at depths "
        f"{', '.join(f'{d:g}' for d in depths)}, seed {args.seed}; scored in {elapsed:.2f}s"
    )
    print(f"engine: {scores.meta['engine_reason']}")
    print(
        f"roles: retrieval if retrieval >= {RETRIEVAL_THRESHOLD} (Wu et al.), else streaming if the share on "
        f"the first {args.sink} + last {window} keys >= {STREAMING_THRESHOLD}, else neither\n"
    )
    ranked = scores.rank("retrieval", top=args.top)
    print(f"top {plural(len(ranked), 'head')} by retrieval score ({args.ci:.0%} bootstrap CI over needles):")
    print(summary_table(ranked))
    counts = scores.table["role"].value_counts()
    print("heads per role: " + ", ".join(f"{r} {int(counts.get(r, 0))}" for r in ("retrieval", "streaming", "neither")))
    say("check")
    check = window_check(model, probe, scores.table, sink=args.sink, window=window, config=config)
    _print_check(check, probe, args.sink, window)
    scores.meta["ablation_check"] = check

    written = scores.save(out, STEM)
    written += save_figure(
        retrieval_figure(scores, title=f"{short_name(info.name)}: retrieval and streaming heads"), out, STEM
    )
    if distances != "none":
        say("distance")
        written += _distance_profile(args, model, out, distances, span)
    return written


def _print_check(check: dict, probe: Any, sink: int, window: int) -> None:
    """The ablation check's lines (:func:`~interp.retrieval.check.window_check`): each role's
    needle-copy loss restricted against unrestricted, or why it was skipped."""
    what = f"the first {sink} + last {window} keys"
    if "skipped" in check:
        why = check["skipped"].removeprefix("stream (")[:-1]
        print(
            f"\nablation check skipped: restricting heads to {what} edits the attention pattern, which needs the "
            f"pattern engine, and {why}; lower --seq-len or --batch to run it"
        )
        return
    n = len(probe.retrieval_pairs())
    print(f"\nablation check: needle-copy loss (nats, {n} copy steps) with a role's heads restricted to {what}:")
    clean = check["clean"]
    for role in CHECKED:
        if role not in check:
            print(f"  {role} heads: none")
            continue
        heads, loss = check[role]["heads"], check[role]["loss"]
        shown = ", ".join(heads[:8]) + (f" (+{len(heads) - 8})" if len(heads) > 8 else "")
        print(f"  {role} heads ({shown}): {clean:.4f} unrestricted -> {loss:.4f} restricted ({loss - clean:+.4f})")


def summary_table(frame: pd.DataFrame) -> str:
    """head, retrieval [CI], mass, streaming share, role: the printed table."""
    shown = pd.DataFrame(
        {
            "head": frame["label"].astype(str),
            "retrieval": [
                f"{v:.3f} [{a:.3f}, {b:.3f}]"
                for v, a, b in zip(frame["retrieval"], frame["retrieval_lo"], frame["retrieval_hi"])
            ],
            "mass": [f"{v:.3f}" for v in frame["retrieval_mass"]],
            "streaming": [f"{v:.3f}" for v in frame["streaming"]],
            "role": frame["role"],
        }
    )
    return shown.to_string(index=False)


def _distance_profile(
    args: argparse.Namespace, model: HookedModel, out: Path, distances: list[int], span: int
) -> list[Path]:
    table, probe = copy_distance_profile(model, distances, span=span, config=flags.run_config(args))
    print(f"\ncopy distance ({', '.join(str(d) for d in probe.meta['distances'])} tokens): top heads by induction mass")
    print(distance_leaders(table, min(args.top, 8)).to_string(float_format=lambda v: f"{v:.3f}"))
    written = [atomic_write(out / f"{STEM}_distance.csv", table.to_csv(index=False))]
    title = f"{short_name(describe(model).name)}: copy distance"
    written += save_figure(
        copy_distance_figure(table, windows=layer_windows(model), title=title), out, f"{STEM}_distance"
    )
    return written


UNREAD = (Unread("--depths", "--needles spreads the needles instead", lambda args: args.needles is not None),)


def check(args: argparse.Namespace) -> None:
    """Before the model loads."""
    validate_retrieval_scores(sink=args.sink, window=args.window)
    if args.needle_len < 2:
        raise UsageError(
            f"--needle-len must be at least 2 (a copy step is scored when the token before it is a needle token), "
            f"got {args.needle_len}"
        )


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.retrieval") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check, unread=UNREAD)
