"""``python -m interp.retrieval`` / ``interp retrieval``: retrieval heads, streaming heads and copy distance.

A thin layer over :func:`interp.retrieval.retrieval_scores` on a needle probe and
:func:`interp.retrieval.copy_distance_scores` on a copy-distance probe: it prints the heads ranked
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
from interp.ablation import WindowAblation, ablated
from interp.adapters import HookedModel
from interp.cli.common import Unread, add_engine_flag, base_parser, float_in, plural, positive_int, run_cli
from interp.config import RunConfig
from interp.errors import UsageError
from interp.models import describe
from interp.plots import save_figure, short_name
from interp.probes.needle import copy_distance_probe, default_distances, needle_probe
from interp.progress import announcer, forward_work, plan_note, tqdm
from interp.retrieval import (
    DEFAULT_SINK,
    RETRIEVAL_THRESHOLD,
    STREAMING_THRESHOLD,
    copy_distance_scores,
    default_window,
    needle_copy_loss,
    retrieval_scores,
    validate_retrieval_scores,
)
from interp.retrieval.figures import copy_distance_figure, layer_windows, retrieval_figure
from interp.stream.budget import PATTERN_BUDGET, choose_engine
from interp.texts import BYTES_NOTE

STEM = "retrieval"
_SHORTER = "--distances none skips the copy-distance profile, shorter --distances shorten it"


def build_parser(prog: str = "python -m interp.retrieval") -> argparse.ArgumentParser:
    p = base_parser(
        prog,
        "Find retrieval heads (Wu et al. 2024: the most-attended key is the needle token being copied), "
        "streaming heads (attention on the sink + recent window) and how far back each head copies, "
        "on teacher-forced needle-in-a-haystack probes.",
    )
    p.set_defaults(batch=4)
    p.add_argument("--seq-len", type=positive_int, default=None, help="body tokens (default: min(1024, the context))")
    p.add_argument(
        "--depths",
        type=_floats,
        default=[0.1, 0.5, 0.9],
        help="needle depths in [0, 1], comma-separated; one needle per depth (default: 0.1,0.5,0.9)",
    )
    p.add_argument("--needles", type=positive_int, default=None, help="evenly spread needles (overrides --depths)")
    p.add_argument("--needle-len", type=positive_int, default=8, help="tokens per needle")
    p.add_argument(
        "--haystack",
        choices=["random", "text"],
        default="random",
        help=f"haystack tokens: seeded random draws, or the bundled English text ({BYTES_NOTE})",
    )
    p.add_argument("--sink", type=int, default=DEFAULT_SINK, help="streaming share: the first keys kept")
    p.add_argument(
        "--window",
        type=positive_int,
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
    p.add_argument("--ci", type=float_in(0, 1, low_open=True, high_open=True), default=0.95, help="bootstrap CI level")
    p.add_argument(
        "--minibatch",
        type=positive_int,
        default=None,
        help="sequences per forward pass (default: every sequence in one)",
    )
    add_engine_flag(p)
    return p


_depth = float_in(0, 1)


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
    haystack = None if args.haystack == "random" else "text"
    probe = needle_probe(
        model,
        seq_len=args.seq_len,
        depths=depths,
        needle_len=args.needle_len,
        batch=args.batch,
        seed=args.seed,
        haystack=haystack,
    )
    window = default_window(probe.seq_len) if args.window is None else args.window
    span = min(args.needle_len, 8)
    distances = args.distances
    if distances is None:  # what fits the needle probe: the length asked for (or its default)
        distances = default_distances(probe.meta["seq_len"], span)
    plan = _plan(info, probe, distances, span)
    say = announcer("retrieval", plan, args.progress)
    note = plan_note(plan, lambda parts: _SHORTER if "distance" in parts else "")
    if note and args.progress:
        print(note, file=sys.stderr, flush=True)
    say("needle")
    t0 = time.perf_counter()
    scores = retrieval_scores(
        model,
        probe,
        sink=args.sink,
        window=window,
        config=_config(args),
    )
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
    scores.meta["ablation_check"] = _ablation_check(args, model, probe, scores, window)

    written = scores.save(out, STEM)
    written += save_figure(
        retrieval_figure(scores, title=f"{short_name(info.name)}: retrieval and streaming heads"), out, STEM
    )
    if distances != "none":
        say("distance")
        written += _distance_profile(args, model, out, distances, span)
    return written


def _plan(info: Any, probe: Any, distances: Any, span: int) -> dict[str, tuple[str, float]]:
    """The command's parts, ``part -> (what, with its sizes; work)`` (:func:`interp.progress.forward_work`)."""
    L, d = info.n_layers, info.d_model
    T, body = probe.seq_len, probe.meta["seq_len"]  # framed, and as asked
    needle = probe.batch * T
    plan = {
        "needle": (
            f"the needle probe's scores ({probe.batch} x {body} tokens, {probe.n_needles // probe.batch} needle(s) "
            f"of {probe.needle_len} tokens)",
            forward_work(needle, L, d, context=T),
        ),
        # the clean run and one per role, each with its logits
        "check": (
            "the ablation check (up to 3 passes of the needle probe)",
            3 * forward_work(needle, L, d, info.d_vocab, T),
        ),
    }
    if distances != "none":
        n = max(distances) + 2 * span
        what = f"the copy-distance profile ({len(distances)} distance(s) of {', '.join(map(str, distances))} tokens, 2 x {n} tokens each)"
        plan["distance"] = (what, forward_work(2 * len(distances) * (n + T - body), L, d, context=n + T - body))
    return plan


def _ablation_check(args: argparse.Namespace, model: HookedModel, probe: Any, scores: Any, window: int) -> dict:
    """Restrict each role's heads to the sink + window (the ``window`` ablation) and print the
    needle-copy loss against the unrestricted model's: a streaming head should lose nothing, a
    retrieval head should break the copy. The ablation edits the pattern, so it runs only where the
    pattern engine fits (its budget, as ``--engine auto`` decides); a longer probe gets a note instead."""
    n_seqs = min(args.minibatch or probe.batch, probe.batch)
    engine, why = choose_engine("auto", model, n_seqs, probe.seq_len, PATTERN_BUDGET)
    what = f"the first {args.sink} + last {window} keys"
    if engine != "pattern":
        print(
            f"\nablation check skipped: restricting heads to {what} edits the attention pattern, which needs the "
            f"pattern engine, and {why.removeprefix('stream (')[:-1]}; lower --seq-len or --batch to run it"
        )
        return {"skipped": why}
    table = scores.table
    roles = [r for r in ("streaming", "retrieval") if (table["role"] == r).any()]
    bar = tqdm(total=1 + len(roles), desc="ablation check", unit="pass", disable=not args.progress)
    loss_config = RunConfig(minibatch=args.minibatch)
    clean = needle_copy_loss(model, probe, config=loss_config)
    bar.update()
    ablation = WindowAblation(sink=args.sink, window=window)
    print(
        f"\nablation check: needle-copy loss (nats, {len(probe.retrieval_pairs())} copy steps) with a role's heads restricted to {what}:"
    )
    check: dict[str, Any] = {"clean": clean, "sink": args.sink, "window": window}
    for role in ("streaming", "retrieval"):
        heads = table.loc[table["role"] == role, "label"].tolist()
        if not heads:
            print(f"  {role} heads: none")
            continue
        with ablated(model, heads, ablation=ablation):
            loss = needle_copy_loss(model, probe, config=loss_config)
        bar.update()
        shown = ", ".join(heads[:8]) + (f" (+{len(heads) - 8})" if len(heads) > 8 else "")
        print(f"  {role} heads ({shown}): {clean:.4f} unrestricted -> {loss:.4f} restricted ({loss - clean:+.4f})")
        check[role] = {"heads": heads, "loss": loss}
    bar.close()
    return check


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
    probe = copy_distance_probe(model, distances, span=span, batch=2, seed=args.seed)
    table = copy_distance_scores(model, probe, config=_config(args))
    windows = layer_windows(model)
    best = table.groupby(["layer", "head"])["induction"].mean().nlargest(min(args.top, 8))
    print(f"\ncopy distance ({', '.join(str(d) for d in probe.meta['distances'])} tokens): top heads by induction mass")
    wide = table.set_index(["layer", "head", "distance"])["induction"].unstack("distance")
    wide = wide.loc[best.index]
    wide.index = [f"{l}.{h}" for l, h in wide.index]
    print(wide.to_string(float_format=lambda v: f"{v:.3f}"))
    written = [atomic_write(out / f"{STEM}_distance.csv", table.to_csv(index=False))]
    fig = copy_distance_figure(table, windows=windows, title=f"{short_name(describe(model).name)}: copy distance")
    written += save_figure(fig, out, f"{STEM}_distance")
    return written


UNREAD = (Unread("--depths", "--needles spreads the needles instead", lambda args: args.needles is not None),)


def _config(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        level=args.ci, seed=args.seed, minibatch=args.minibatch, progress=args.progress, engine=args.engine
    )


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


if __name__ == "__main__":
    sys.exit(cli())
