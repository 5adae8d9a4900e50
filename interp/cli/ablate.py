"""``python -m interp.ablate``: which heads matter for a metric, and how many can go.

A thin layer over :mod:`interp.ablation`. Methods:

- ``exact``: ablate every head alone (the fast replay), rank heads by how much the metric
  worsens; writes ``ablate_exact.{csv,json,html}``;
- ``gradient``: Michel et al.'s gradient importance, one forward and backward per batch;
  ``ablate_gradient.{csv,json,html}``;
- ``prune``: pruning curves in increasing order of importance (gradient, exact and seeded random
  orders on one plot) and how many heads can go within ``--tolerance``; ``ablate_prune.{csv,json,html}``;
- ``gates``: Voita et al.'s Hard-Concrete gates for a sweep of lambda; ``ablate_gates.csv`` (a row per
  lambda), ``ablate_gates_heads.csv`` (a row per lambda and head), ``ablate_gates.json``, a gates
  heatmap ``ablate_gates.html`` and ``ablate_gates_curves.html``.

Every choice (``--ablation``, ``--metric``, ``--orders``, ``--replay``) and its help comes from the
registries in :mod:`interp.ablation`; the sweep's fast/loop choice is ``--replay``.

Ctrl-C during a long sweep keeps the rows already computed: they are written with ``.partial`` in
the file name (and ``"partial": true`` in the JSON), and the command exits with 130.

The exact sweep, the pruning curves and the gate sweep record every finished unit (a head, a
pruning step, a lambda) in a journal under ``--out`` (:mod:`interp.journal`): after a crash, a
``kill -9`` or Ctrl-C, the same command with ``--resume`` computes only what is missing, and writes
what an uninterrupted run writes, bit for bit. ``--fresh`` discards the journal and starts over.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from interp._io import writes_partial
from interp.ablation import (
    ABLATIONS,
    GATE_UNITS,
    METHODS,
    METRICS,
    ORDERS,
    REPLAYS,
    AblationError,
    GateSweep,
    PruningCurves,
    builtin_metric,
    exact_sweep,
    gradient_importance,
    head_mask,
    largest_lambda_within,
    pruning_curves,
    train_gates,
)
from interp.ablation.modes import unpaired_ablations
from interp.adapters import HookedModel
from interp.cli import flags
from interp.cli.common import Unread, partial_note, run_cli, stop_partial
from interp.models import describe
from interp.plots import heatmap, save_figure, short_name
from interp.probes import PROBES, TokenProbe, repeated_tokens, text_probe
from interp.results import plural
from interp.scores import HeadScores, format_table
from interp.texts import BYTES_NOTE, check_dataset

STEM = "ablate"

_PROBES = ("repeated", "text")  # the probes a head's ablation is measured on
_fraction = flags.float_in(0, 1, low_open=True)
_non_negative = flags.float_in(0)


def _lambdas(text: str) -> list[float]:
    try:
        return [_non_negative(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"lambda {e}") from None


def build_parser(prog: str = "python -m interp.ablate") -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "Ablate attention heads (zero, mean or resample) to find which matter for a metric and "
        "how many can go: exact sweeps, Michel gradient importance, pruning curves, Voita gates.",
    )
    flags.add_resume_flags(p)
    flags.choice(p, "--method", METHODS, "exact", "what to compute: ")
    what = "what an ablated head outputs: "
    flags.choice(p, "--ablation", ABLATIONS, "mean", what, " (default: mean, as interp report)", unpaired_ablations())
    flags.choice(
        p,
        "--metric",
        METRICS,
        None,
        after="; default: incontext for decoders (lm with --probe text), pooled-cos for encoders",
    )
    flags.choice(p, "--probe", PROBES, None, after="; None: text for --metric lm, else repeated", only=_PROBES)
    flags.add_block_flags(p, 50, "tokens per repeated block, or per text window")
    p.add_argument("--dataset", default=None, help=f"text probe source; None: the bundled data/text; {BYTES_NOTE}")
    flags.add_encoding_flag(p, "--dataset file")
    flags.add_minibatch_flag(p, "sequences per forward (default: every sequence in one)")
    for flag, (methods, default, settings) in METHOD_FLAGS.items():
        shown = "" if default in (None, False) else f" (default: {_shown(default)})"
        p.add_argument(flag, default=None, **{**settings, "help": f"{'/'.join(methods)}: {settings['help']}{shown}"})
    return p


# the flags that only some methods read: flag -> (those methods, its default, how it parses and its help)
METHOD_FLAGS: dict[str, tuple[tuple[str, ...], Any, dict[str, Any]]] = {
    "--normalize": (
        ("gradient",),
        False,
        {"action": "store_true", "help": "divide each layer's scores by their L2 norm"},
    ),
    "--per": (
        ("gradient",),
        "example",
        {"choices": GATE_UNITS.names(), "help": GATE_UNITS.help()},
    ),
    "--step": (("prune",), 0.1, {"type": _fraction, "help": "fraction of heads removed per step"}),
    "--reestimate": (("prune",), False, {"action": "store_true", "help": "re-estimate importance after every step"}),
    "--orders": (
        ("prune",),
        None,
        {
            "type": flags.names_in(ORDERS, "order"),
            "help": f"comma-separated orders to compare ({ORDERS.help()}); default: all of them (without gradient "
            "for a metric with no gradient at the clean point, e.g. pooled-cos)",
        },
    ),
    "--random-seeds": (("prune",), 3, {"type": flags.positive_int, "help": "random orders (seeds 0..n-1)"}),
    "--tolerance": (
        ("prune", "gates"),
        0.1,
        {"type": _non_negative, "help": "the metric may degrade by this fraction"},
    ),
    "--lambdas": (
        ("gates",),
        [0.001, 0.003, 0.01, 0.03, 0.1, 0.3],
        {"type": _lambdas, "help": "comma-separated L0 penalty weights"},
    ),
    "--gate-steps": (("gates",), 200, {"type": flags.positive_int, "help": "optimisation steps per lambda"}),
    "--gate-lr": (("gates",), 0.05, {"type": float, "help": "Adam learning rate"}),
    "--replay": (
        ("exact", "prune", "gates"),
        "auto",
        {"choices": REPLAYS.names(), "help": "how head sets are evaluated: " + REPLAYS.help()},
    ),
    "--ablated": (
        ("exact", "gradient"),
        None,
        {"help": "heads kept ablated throughout, e.g. '1.2,0.3' (the sweep then asks what matters without them)"},
    ),
}


def _shown(default: Any) -> str:
    return ",".join(map(str, default)) if isinstance(default, list) else str(default)


def check_flags(args: argparse.Namespace) -> None:
    """Refuse flags the chosen ``--method`` would ignore (exit 2, before the model loads), then fill
    in the defaults of the ones it reads."""
    ignored = []
    for flag, (methods, _, _) in METHOD_FLAGS.items():
        if getattr(args, _dest(flag)) not in (None, False) and args.method not in methods:
            ignored.append(f"{flag} (it applies to --method {' or '.join(methods)})")
    if ignored:
        raise AblationError(
            f"--method {args.method} does not read {'; '.join(ignored)}: drop "
            f"{'it' if len(ignored) == 1 else 'them'}, or choose the method that reads "
            f"{'it' if len(ignored) == 1 else 'them'}"
        )
    for flag, (_, default, _) in METHOD_FLAGS.items():
        if getattr(args, _dest(flag)) is None:
            setattr(args, _dest(flag), default)
    if probe_kind(args) == "text":
        check_dataset(args.dataset)


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def probe_kind(args: argparse.Namespace) -> str:
    """``text`` or ``repeated``: ``--probe``, else text for ``--metric lm`` (the model is not needed to tell)."""
    return args.probe or ("text" if args.metric == "lm" else "repeated")


UNREAD = (
    Unread("--dataset", "it applies to the text probe", lambda args: probe_kind(args) != "text"),
    Unread("--repeats", "it applies to the repeated probe", lambda args: probe_kind(args) != "repeated"),
)


def make_probe(args: argparse.Namespace, model: HookedModel) -> tuple[TokenProbe, str]:
    """The probe and the metric name the flags ask for (defaults depend on the model)."""
    info = describe(model)
    metric = args.metric or ("pooled-cos" if info.is_encoder else "lm" if args.probe == "text" else "incontext")
    kind = probe_kind(args)
    if kind == "text":
        probe = text_probe(
            model, batch=args.batch, seq_len=args.seq_len, seed=args.seed, dataset=args.dataset, encoding=args.encoding
        )
    else:
        probe = repeated_tokens(model, batch=args.batch, block_len=args.seq_len, n_repeats=args.repeats, seed=args.seed)
    return probe, metric


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    info = describe(model)
    base = None
    if args.ablated is not None:
        base = head_mask(info, args.ablated)
        if bool(base.all()):
            raise AblationError(
                f"--ablated names every head ({base.numel()}): nothing would be left to rank; "
                "keep at least one head out of it"
            )
    probe, metric_name = make_probe(args, model)
    metric = builtin_metric(metric_name, probe)
    config = flags.run_config(args)
    common = dict(ablation=args.ablation, config=config)
    kind = "causal" if info.is_causal else "encoder"
    print(
        f"{info.name} ({kind}, {info.n_layers} layers x {info.n_heads} heads); probe: {probe.batch} x "
        f"{probe.seq_len} tokens ({probe.meta.get('kind', 'probe')}), seed {args.seed}; metric {metric.name} "
        f"({'higher' if metric.higher_is_better else 'lower'} is better); {args.ablation} ablation"
    )
    journals = getattr(args, "journals", None)
    journal = journals(args.method, probe.tokens) if journals is not None and args.method != "gradient" else None
    t0 = time.perf_counter()
    if args.method in ("exact", "gradient"):
        if args.method == "exact":
            scores = exact_sweep(model, probe, metric, base=base, replay=args.replay, journal=journal, **common)
        else:
            scores = gradient_importance(
                model, probe, metric, base=base, normalize=args.normalize, per=args.per, **common
            )
        scores.meta["model_spec"] = args.model
        return _write_scores(args, scores, out, time.perf_counter() - t0)
    if args.method == "prune":
        orders = args.orders
        if orders is None:
            orders = [o for o in ORDERS if not (ORDERS.info(o, "needs_gradient") and metric.flat_at_clean)]
            if len(orders) < len(ORDERS):
                print(f"orders: {', '.join(orders)} ({metric.name} has no gradient at the clean point)")
        result = pruning_curves(
            model,
            probe,
            metric,
            orders=orders,
            random_seeds=range(args.random_seeds),
            step=args.step,
            reestimate=args.reestimate,
            replay=args.replay,
            journal=journal,
            **common,
        )
        return _write_prune(args, result, out, metric.name, time.perf_counter() - t0, info.n_layers * info.n_heads)
    sweep = train_gates(
        model,
        probe,
        metric,
        args.lambdas,
        steps=args.gate_steps,
        lr=args.gate_lr,
        replay=args.replay,
        journal=journal,
        **common,
    )
    return _write_gates(args, sweep, out, time.perf_counter() - t0)


def _finish(written: list[Path], partial: bool, args: argparse.Namespace | None = None) -> list[Path]:
    """Partial results are written, listed, and the run ends as interrupted (exit 130), its journal
    kept for ``--resume``; complete results are written, and the journal goes (the command shell
    removes the partial files they supersede)."""
    journals = getattr(args, "journals", None)
    if partial:
        stop_partial(written, journals)
    if journals is not None:
        journals.finish()
    return written


def _write_scores(args: argparse.Namespace, scores: HeadScores, out: Path, elapsed: float) -> list[Path]:
    partial = bool(scores.meta.get("partial"))
    meta = scores.meta
    how = f"replay {meta['replay']}, " if "replay" in meta else ""
    clean = meta.get("clean_metric", meta.get("metric_value"))
    print(
        f"{args.method}: {how}{elapsed:.2f}s; unablated {meta['metric']} = {clean:.4f}"
        + (f"; kept ablated: {', '.join(meta['base'])}" if meta.get("base") else "")
        + "\n"
    )
    ranked = scores.rank("importance", top=args.top).dropna(subset=["importance"])
    missing = meta["heads_total"] - meta["heads_done"] if partial and "heads_total" in meta else 0
    note = partial_note(missing, meta.get("heads_total", 0), "heads")
    print(f"top {plural(len(ranked), 'head')} by {args.method} importance (larger = ablating it hurts more){note}:")
    columns = [c for c in ("importance", "metric_ablated", "delta") if c in scores.table]
    print(format_table(ranked, columns, fmt=".4g"))
    stem = f"{STEM}_{args.method}"
    title = f"{short_name(meta['model'])}: {args.method} importance of each head ({meta['metric']}, {meta['ablation']} ablation)"
    with writes_partial(partial):  # <stem>.partial.<ext>: the earlier complete files are kept
        written = scores.save(out, stem)
        written += save_figure(heatmap(scores, columns[:2], title=title), out, stem)
    return _finish(written, partial, args)


def _write_prune(
    args: argparse.Namespace, result: PruningCurves, out: Path, metric: str, elapsed: float, n_total: int
) -> list[Path]:
    partial = result.partial
    prunable = result.prunable(args.tolerance)
    print(
        f"prune: {elapsed:.2f}s; unpruned {metric} = {result.meta['clean_metric']:.4f}; steps of "
        f"{args.step:.0%}{', importance re-estimated after each step' if args.reestimate else ''}\n"
    )
    print(f"heads that can go before {metric} degrades by more than {args.tolerance:.0%} (of {n_total}):")
    print(prunable[["label", "n_prunable", "frac_prunable"]].to_string(index=False))
    stem = f"{STEM}_prune"
    with writes_partial(partial):
        written = result.save(out, stem, tolerance=args.tolerance, meta={"model_spec": args.model})
        written += save_figure(result.figure(), out, stem)
    return _finish(written, partial, args)


def _write_gates(args: argparse.Namespace, sweep: GateSweep, out: Path, elapsed: float) -> list[Path]:
    partial = bool(sweep.meta.get("partial"))
    meta = sweep.meta
    print(
        f"gates: {elapsed:.2f}s; unpruned {meta['metric']} = {meta['clean_metric']:.4f}; {meta['steps']} steps "
        f"per lambda\n"
    )
    shown = sweep.summary.copy()
    shown["kept"] = [" ".join(sweep.kept(lam)) for lam in shown["lambda"]]
    print(shown[["lambda", "heads_kept", "metric", "degradation", "kept"]].to_string(index=False))
    best = largest_lambda_within(sweep, args.tolerance)
    if best is not None:
        print(f"\nlargest lambda within {args.tolerance:.0%}: {best:g}, keeping {', '.join(sweep.kept(best))}")
    stem = f"{STEM}_gates"
    with writes_partial(partial):
        written = sweep.save(out, stem, meta={"model_spec": args.model, "largest_lambda_within_tolerance": best})
        if len(sweep.summary):
            written += save_figure(sweep.figure("gates"), out, stem)
            written += save_figure(sweep.figure("curves"), out, f"{stem}_curves")
    return _finish(written, partial, args)


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.ablate") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check_flags, unread=UNREAD)
