"""``interp circuit`` / ``python -m interp.circuit``: which edges carry a task, and the circuit they make.

A thin layer over :func:`interp.edge_scores` and :mod:`interp.circuits.circuit`: it scores every edge
of the model's graph on ``--task`` by ``--method`` (EAP, EAP-IG, clean-corrupted, or exact edge
patching), prints the top edges, evaluates the circuits the scores give at MIB's sizes (the clean
prompt runs, every edge outside a circuit reads its sender's output on the corrupted prompt, or its
mean with ``--evaluate mean``), prints the curve's CPR and CMD and the smallest circuit reaching
faithfulness 0.8, and writes ``edge_scores.{csv,json}``, ``circuit.{csv,json,html}`` (the circuit
``--top``/``--greedy``/``--threshold``/``--nodes`` names, by default that smallest faithful one, drawn
as a graph)
and ``circuit_faithfulness.{csv,json,html}`` under ``--out``; ``--export FILE.json`` writes the
circuit as EAP-IG's graph JSON. ``--by position`` scores each edge at each position (auto-circuit's
position-specific edges) and evaluates circuits of the top (edge, position) pairs at MIB's sizes: it
writes the scores and the curve, and names no circuit of its own. Exact work is journaled: ``--resume``
continues it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from interp._io import ensure_writable_dir
from interp.adapters import HookedModel
from interp.circuits import METHODS, EdgeScores, edge_scores, validate_edge_scores
from interp.circuits.circuit import BY, Circuit, validate_circuit
from interp.circuits.curve import FAITHFUL, FaithfulnessCurve
from interp.circuits.eapig import write_eapig_json
from interp.circuits.figure import DEFAULT_EDGES
from interp.cli import flags
from interp.cli.common import FRAMED_UNREAD, Unread, run_cli, stop_partial
from interp.config import RunConfig
from interp.errors import OutputError, UsageError
from interp.models import describe
from interp.patching import METRICS
from interp.patching.core import refuse_equal
from interp.patching.edge_patch import SOURCES
from interp.plots import save_figure
from interp.probes.task import DEFAULT_DIRECTION, DIRECTIONS, N_PAIRS, TaskProbe, task_probe
from interp.results import few_ci_sequences, few_sequences_note, plural
from interp.scores import with_interval

STEM = "circuit"
SHOWN = 10  # edges printed
ALIASES = {"n_pairs": "batch", "n": "top"}
NO_EVALUATION = "none"


def build_parser(prog: str = "python -m interp.circuit") -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "Which edges between heads, MLPs, the input and the logits carry a task: every edge scored (EAP, EAP-IG "
        "or exact edge patching), the circuits they make evaluated exactly, the faithful one drawn as a graph.",
    )
    flags.add_resume_flags(p)
    flags.add_task_flag(p, "repeat")
    flags.set_help(
        p,
        "batch",
        f"pairs: of a bundled task (default: {N_PAIRS}), or the first n of a task file (default: every pair)",
        batch=None,
    )
    flags.choice(p, "--method", METHODS, "eap")
    p.add_argument(
        "--steps", type=flags.positive_int, default=None, help="eap-ig-*: the integration points m (default: 5)"
    )
    p.add_argument("--direction", choices=DIRECTIONS.names(), default=DEFAULT_DIRECTION, help=DIRECTIONS.help())
    p.add_argument(
        "--by",
        choices=BY,
        default="edge",
        help="edge: a score per edge, summed over positions; position: a score per edge and position (auto-circuit's "
        "position-specific edges), the circuits at MIB's sizes made of the top (edge, position) pairs (default: edge)",
    )
    flags.choice(p, "--metric", METRICS, None, after=" (default: the task's own)")
    which = p.add_mutually_exclusive_group()
    flags.set_help(
        p,
        "top",
        "the circuit: the N edges of largest |score|, pruned to input-to-logits paths (default: the smallest "
        f"circuit found reaching faithfulness {FAITHFUL})",
        top=None,
    )
    which.add_argument(
        "--greedy",
        type=flags.positive_int,
        default=None,
        metavar="N",
        help="the circuit: N edges greedily from the logits down",
    )
    which.add_argument(
        "--threshold", type=float, default=None, metavar="T", help="the circuit: every edge whose |score| is at least T"
    )
    which.add_argument(
        "--nodes",
        type=flags.positive_int,
        default=None,
        metavar="N",
        help="the circuit: every edge out of the N senders of largest |node score| (the sum of their edges'; "
        "EAP-IG's level='node')",
    )
    p.add_argument(
        "--evaluate",
        choices=[*SOURCES.names(), NO_EVALUATION],
        default="patch",
        help="what the edges outside a circuit read: " + SOURCES.help() + f"; {NO_EVALUATION}: no evaluation",
    )
    p.add_argument(
        "--draw",
        type=_drawn,
        default=DEFAULT_EDGES,
        metavar="N|all",
        help=f"the circuit's figure draws its N edges of largest |score| (default: {DEFAULT_EDGES}); all: every one",
    )
    p.add_argument("--export", default=None, metavar="FILE.json", help="also write the circuit as EAP-IG's graph JSON")
    p.add_argument("--n-boot", type=flags.positive_int, default=1000, help="bootstrap resamples over pairs")
    flags.add_minibatch_flag(p, "pairs per forward (default: every pair in one forward)")
    return p


def _drawn(text: str) -> int | None:
    """``--draw``: a number of edges >= 1, or ``all`` (``None``)."""
    if text.strip().lower() == "all":
        return None
    try:
        return flags.positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a number of edges >= 1, or all; got {text!r}") from None


def _by_position(args: argparse.Namespace) -> bool:
    return args.by == "position"


# a circuit of (edge, position) pairs is the curve's: none is named, drawn as a graph or exported
PAIRS = "it applies to --by edge: circuits of (edge, position) pairs are the curve's top pairs"
UNREAD = (
    Unread("--steps", "it applies to --method eap-ig-*", lambda args: not METHODS.info(args.method, "steps")),
    *(
        Unread(flag, PAIRS, _by_position)
        for flag in ("--top", "--greedy", "--threshold", "--nodes", "--draw", "--export")
    ),
    FRAMED_UNREAD,
)


def check(args: argparse.Namespace) -> None:
    """Before the model loads: the library's checks of the scores and the circuit asked for, a circuit
    chosen by faithfulness without an evaluation, an export that is not a .json file, the task."""
    validate_edge_scores(method=args.method, steps=args.steps, metric=args.metric, direction=args.direction, by=args.by)
    named = (("--top", args.top), ("--greedy", args.greedy), ("--threshold", args.threshold), ("--nodes", args.nodes))
    chosen = [flag for flag, value in named if value is not None]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} each choose the circuit: pass one of them")
    how = "greedy" if args.greedy is not None else "threshold" if args.threshold is not None else "top"
    validate_circuit(how=how, source=args.evaluate if args.evaluate != NO_EVALUATION else "patch", by=args.by)
    if args.evaluate == NO_EVALUATION and not chosen and not _by_position(args):
        raise UsageError(
            f"--evaluate {NO_EVALUATION} leaves no faithfulness to choose the circuit by: pass --top N, --greedy N, "
            "--threshold T or --nodes N"
        )
    if args.threshold is not None and not args.threshold >= 0:
        raise UsageError(f"--threshold {args.threshold}: the least |score| an edge keeps, a number >= 0")
    if args.export is not None:
        check_export(Path(args.export))
    flags.check_task(args.task, args.batch)


def check_export(path: Path) -> None:
    """``--export``, before the model loads: a .json file in a folder that exists (none is made
    for it) and takes a file, not a folder itself."""
    if path.suffix.lower() != ".json":
        raise UsageError(f"--export {path}: EAP-IG's graph is a .json file; name one, e.g. circuit.json")
    folder = path.parent
    if path.is_dir():
        raise UsageError(f"--export {path}: that is a folder; name a .json file, e.g. {path / 'circuit.json'}")
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist (none is made for --export)"
        raise UsageError(f"--export {path}: {folder} {what}; name a file in an existing folder")
    try:
        ensure_writable_dir(folder)
    except OutputError:
        raise UsageError(f"--export {path}: {folder} takes no new file; name a file in a writable folder") from None


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    info = describe(model)
    config = dataclasses.replace(flags.run_config(args), n_boot=args.n_boot)
    task = task_probe(model, args.task, n_pairs=args.batch, seed=args.seed, framed=args.framed)
    journals = getattr(args, "journals", None)
    t0 = time.perf_counter()
    journal = journals(f"edges_exact_{args.direction}", task.clean) if journals and args.method == "exact" else None
    scores = edge_scores(
        model,
        task,
        method=args.method,
        steps=args.steps,
        metric=args.metric,
        direction=args.direction,
        by=args.by,
        config=config,
        **({"journal": journal} if journal is not None else {}),
    )
    scores.meta["model_spec"] = args.model
    m = scores.meta
    print(
        f"{info.name}: {m['graph']}; task {task.name}: {flags.task_pairs(task)} of {task.seq_len} tokens, "
        f"{m['metric']} clean {m['clean_metric']:.4f}, corrupted {m['corrupted_metric']:.4f}; {args.method}, "
        f"{args.direction}, {time.perf_counter() - t0:.2f}s"
    )
    if "gap_warning" in m:
        print(m["gap_warning"])
    _print_top(scores)
    if args.evaluate != NO_EVALUATION:  # faithfulness divides by the gap: refused before any file is written
        refuse_equal(torch.tensor([m["clean_metric"]]), torch.tensor([m["corrupted_metric"]]), m["metric"], True)
    if args.nodes is not None and args.nodes > (senders := len(scores.graph.senders)):
        raise UsageError(f"--nodes {args.nodes}: the graph has {senders} senders; ask for at most {senders}")
    written = scores.save(out)
    if m.get("partial"):
        stop_partial(written, journals)
    curve = None
    if args.evaluate != NO_EVALUATION:
        t0 = time.perf_counter()
        journal = journals(f"circuits_{args.evaluate}", task.clean) if journals else None
        curve = scores.faithfulness_curve(
            model, task, how=_how(args), source=args.evaluate, metric=args.metric, config=config, journal=journal
        )
        curve.meta["model_spec"] = args.model
        print(
            f"\ncircuits at MIB's sizes ({_how(args)}; outside each circuit, edges read "
            f"{SOURCES.info(args.evaluate, 'reads')}), "
            f"{time.perf_counter() - t0:.2f}s:"
        )
        for line in curve.summary():
            print(f"  {line}")
        written += curve.save(out)
        if curve.meta.get("partial") or _by_position(args):  # pairs: the curve's circuits are the result
            written += save_figure(curve.figure(), out, curve.KIND)
            if curve.meta.get("partial"):
                stop_partial(written, journals)
    if _by_position(args):
        if journals is not None:
            journals.finish()
        return written
    circuit = _chosen(args, scores, curve)
    if curve is not None and "faithfulness" not in circuit.meta and circuit.n_edges:
        _evaluate_chosen(args, model, task, config, circuit)
    _print_chosen(args, scores, circuit)
    if curve is not None:  # the chosen circuit marked on the curve
        written += save_figure(curve.figure(chosen=circuit), out, curve.KIND)
    written += circuit.save(out) + save_figure(circuit.figure(edges=args.draw), out, STEM)
    if args.export is not None:
        written.append(write_eapig_json(args.export, circuit.to_json(d_model=describe(model).d_model)))
    if journals is not None:
        journals.finish()
    return written


def _how(args: argparse.Namespace) -> str:
    return "greedy" if args.greedy is not None else "top"


def _print_top(scores: EdgeScores) -> None:
    top = scores.top(SHOWN)
    level = int(round(100 * scores.meta.get("ci_level", 0.95)))
    what = plural(len(top), "(edge, position) pair" if scores.by == "position" else "edge")
    print(f"\ntop {what} by |score| ({scores.meta['metric']} units, {level}% CI over pairs):")
    names = [f"{e}@{p}" for e, p in zip(top.edge, top.position)] if scores.by == "position" else list(top.edge)
    width = max(len(e) for e in names)
    few = few_ci_sequences(scores.table, scores.meta)
    for name, row in zip(names, top.itertuples()):
        ci = with_interval(row.score, row.score_lo, row.score_hi, ".4g") + ("!" if few else "")
        print(f"  {name:<{width}}  {ci}  stability {row.stability:.2f}")
    if few:
        print(few_sequences_note(few, "pair"))


def _chosen(args: argparse.Namespace, scores: EdgeScores, curve: FaithfulnessCurve | None) -> Circuit:
    """The circuit the flags name, or the smallest faithful one the curve found (else the whole graph)."""
    if args.nodes is not None:  # not on the curve, whose circuits are edges': evaluated on its own
        return scores.node_circuit(args.nodes)
    if args.threshold is not None:
        circuit = scores.circuit(how="threshold", threshold=args.threshold)
    elif args.greedy is not None or args.top is not None:
        circuit = scores.circuit(args.greedy or args.top, how=_how(args))
    else:
        reach = curve.meta.get("smallest_faithful") if curve is not None else None
        n = reach["size"] if reach else len(scores.table)
        circuit = scores.circuit(n, how="top")
        circuit.meta["chosen"] = (
            f"the smallest circuit found reaching faithfulness {FAITHFUL}" if reach else "no circuit reached it"
        )
    if curve is not None:
        hit = curve.table[curve.table.n_edges == circuit.n_edges]
        if len(hit):
            _faithfulness_of(circuit, hit.iloc[0])
    return circuit


def _faithfulness_of(circuit: Circuit, row: Any) -> None:
    circuit.meta["faithfulness"] = float(row.faithfulness)
    circuit.meta["faithfulness_ci"] = [float(row.faithfulness_lo), float(row.faithfulness_hi)]


def _evaluate_chosen(
    args: argparse.Namespace, model: HookedModel, task: TaskProbe, config: RunConfig, circuit: Circuit
) -> None:
    """The chosen circuit's own faithfulness, where its size is not on the curve (one more pass)."""
    own = circuit.evaluate(model, task, source=args.evaluate, metric=args.metric, config=config)
    _faithfulness_of(circuit, own.table.iloc[0])


def _print_chosen(args: argparse.Namespace, scores: EdgeScores, circuit: Circuit) -> None:
    E = len(scores.table)
    line = (
        f"\ncircuit: {plural(circuit.n_edges, 'edge')} of {E:,} ({circuit.n_edges / E:.2%} of the graph; "
        f"{_named(args)}), {plural(len(circuit.nodes), 'node')}"
    )
    few = few_ci_sequences(scores.table, scores.meta)
    if "faithfulness" in circuit.meta:
        line += f", faithfulness {with_interval(circuit.meta['faithfulness'], *circuit.meta['faithfulness_ci'], '.3f')}"
        line += "!" if few else ""
    print(line)
    if few and "faithfulness" in circuit.meta:
        print(few_sequences_note(few, "pair"))
    if args.draw is not None and circuit.n_edges > args.draw:
        print(f"{STEM}.html draws its {args.draw} edges of largest |score| (--draw all: every one)")
    if not circuit.n_edges:
        print(
            f"! the circuit is empty: no input-to-logits path is left after pruning {_named(args)}; "
            "ask for more edges (--top, --greedy) or a lower --threshold",
            file=sys.stderr,
        )


def _named(args: argparse.Namespace) -> str:
    if args.nodes is not None:
        return f"out of the {plural(args.nodes, 'node')} of largest |node score|"
    if args.threshold is not None:
        return f"|score| >= {args.threshold:g}"
    if args.greedy is not None:
        return f"{args.greedy} greedily from the logits"
    if args.top is not None:
        return f"the top {args.top}, pruned"
    return f"the smallest found reaching faithfulness {FAITHFUL}"


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.circuit") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check, unread=UNREAD, aliases=ALIASES)
