"""``python -m interp.roles`` / ``interp roles``: what each head writes and reads.

A thin layer over :mod:`interp.roles`: Q/K/V composition between heads (with z-scores against
random heads), OV roles from weights (copy suppression, successor), encoder-head and entropy scores
and Voita's positional / rare-word heads on a text probe, the Jensen-Shannon map of heads, and,
given ``--prompts``, ``--text`` or ``--task``, direct logit attribution (run first: prompts it cannot
attribute end the run with exit 2 before anything is written). It prints each analysis's strongest heads and the
heads named for a role, and writes under ``--out``:

- ``composition.{csv,json,html}``; ``ov_scores.{csv,json}``; ``encoder_heads.{csv,json}``;
  ``head_map.{json,html}``; ``logit_attribution*.{csv,json}`` (with ``--prompts``, ``--text`` or ``--task``);
- ``roles.csv``: the per-head scores of the weight and pattern analyses and each head's roles
  (:func:`interp.parts.table.role_table`).

An analysis a model cannot have (latent attention's composition, a tokenizer without ordinals for
the successor score) is skipped with its reason printed; the rest run.

``--prompts FILE`` is JSON (a list) or JSON lines, one object per prompt: ``{"prompt": "...",
"answer": " Mary", "wrong": " John"}`` (answer and wrong single tokens of the model's tokenizer;
``wrong`` optional) or ``{"tokens": [ids], "answer": id, "wrong": id}``. ``--text "..."`` (repeatable)
attributes a text's last token's logit at the position before it. ``--task repeat|ioi|greater-than|FILE``
(as ``interp patch`` reads it; ``--batch`` pairs, default 8 of a bundled task, every pair of a
file; ``--framed`` as there) attributes the task's clean prompts at its read
position: the answer's logit minus the wrong answer's, or, with several of either (greater-than),
the mean answer logit minus the mean wrong one.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from interp._io import atomic_write
from interp.adapters import HookedModel, ModelInfo
from interp.cli import flags
from interp.cli.common import FRAMED_UNREAD, in_flags, run_cli
from interp.config import RunConfig
from interp.errors import UsageError
from interp.models import describe
from interp.parts import PARTS, Given, NotApplicable, run_part
from interp.parts.roles import CompositionSizes, EncoderSizes, OVSizes, TextSizes
from interp.parts.table import THRESHOLD, role_columns, role_table
from interp.plots import save_figure, short_name
from interp.probes.prompts import check_prompt_rows, prompt_ids
from interp.probes.task import TASKS, task_probe
from interp.progress import announcer, forward_work
from interp.registry import Registry
from interp.results import file_frame
from interp.roles import logit_attribution
from interp.roles.composition import N_RANDOM
from interp.roles.ov import K_LOWEST
from interp.scores import HeadScores, format_table, join_scores
from interp.texts import BYTES_NOTE, decode_file

STEM = "roles"
BATCH = 8  # text-probe sequences and a bundled task's pairs unless --batch says otherwise
ANALYSES: Registry[str] = Registry("roles analysis")
ANALYSES.add("composition", "Q/K/V composition between every pair of heads, with z-scores")
ANALYSES.add("ov", "OV roles from weights: copy suppression and successor heads")
ANALYSES.add("encoder", "attention on [CLS]/[SEP]/punctuation/neighbours, entropy, positional and rare-word heads")
ANALYSES.add("map", "the Jensen-Shannon map of heads by their patterns")
ANALYSES.add("dla", "direct logit attribution on --prompts, --text or --task")


def build_parser(prog: str = "python -m interp.roles") -> argparse.ArgumentParser:
    p = flags.base_parser(
        prog,
        "What each head writes and reads: composition between heads, copy suppression and successor heads "
        "(weights), encoder heads, entropy, positional and rare-word heads (patterns), and direct logit "
        "attribution on your prompts.",
    )
    flags.set_help(
        p,
        "batch",
        f"text-probe sequences (default: {BATCH}), and a task's pairs: a bundled task's (default: {BATCH}), or the "
        "first n of a task file (default: every pair)",
        batch=None,
    )
    p.add_argument(
        "--analyses",
        type=flags.names_in(ANALYSES, "analysis", empty=True),
        default=list(ANALYSES.names()),
        help=f"comma-separated, from: {ANALYSES.help()} (default: all; dla runs only with --prompts, --text or --task)",
    )
    p.add_argument("--seq-len", type=flags.positive_int, default=32, help="body tokens per text-probe sequence")
    p.add_argument("--k", type=flags.positive_int, default=K_LOWEST, help="copy suppression: the lowest k logits")
    p.add_argument(
        "--n-random", type=flags.positive_int, default=N_RANDOM, help="composition: random heads per baseline"
    )
    p.add_argument(
        "--sequences",
        default=None,
        help="successor: JSON {name: [token ids in order]} instead of the tokenizer's ordinals",
    )
    p.add_argument(
        "--frequencies", default=None, help="rare-word: JSON {token id: count} (default: the bundled text's counts)"
    )
    p.add_argument(
        "--prompts", default=None, help="direct logit attribution: JSON or JSON lines of prompts (see the module help)"
    )
    p.add_argument(
        "--text",
        action="append",
        default=None,
        help="direct logit attribution of a text's last token (its logit, at the position before it); repeatable; "
        f"{BYTES_NOTE}",
    )
    flags.add_task_flag(p, None, "direct logit attribution on a task's clean prompts (--batch pairs): ")
    flags.add_ci_flag(p)
    p.add_argument(
        "--threshold", type=flags.float_in(0, 1), default=THRESHOLD, help="the least score a named role needs"
    )
    return p


def _read_json(path: str | None, what: str) -> Any:
    if path is None:
        return None
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{what}: no such file {path}")
    text = decode_file(file, kind=f"{what} file")  # JSON is UTF-8
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise UsageError(f"{what}: {path} is neither JSON nor JSON lines ({e.msg}, line {e.lineno})") from None


def check(args: argparse.Namespace) -> None:
    """Read the JSON inputs before the model loads: a bad file ends the run with nothing written."""
    args.sequence_ids = _read_json(args.sequences, "--sequences")
    if args.sequence_ids is not None and not (
        isinstance(args.sequence_ids, dict) and all(isinstance(v, list) for v in args.sequence_ids.values())
    ):
        raise UsageError('--sequences must be a JSON object {"name": [token ids in order], ...}')
    freq = _read_json(args.frequencies, "--frequencies")
    try:
        args.frequency_table = None if freq is None else {int(k): float(v) for k, v in dict(freq).items()}
    except (TypeError, ValueError):
        raise UsageError('--frequencies must be a JSON object {"token id": count, ...}') from None
    given = [f for f, v in (("--prompts", args.prompts), ("--text", args.text), ("--task", args.task)) if v]
    if len(given) > 1:
        raise UsageError(f"give one of --prompts, --text or --task, not {' and '.join(given)}")
    if args.task is not None:
        flags.check_task(args.task, args.batch)
    args.prompt_rows = _read_json(args.prompts, "--prompts")
    if isinstance(args.prompt_rows, dict):  # one object: a JSON-lines file of one line
        args.prompt_rows = [args.prompt_rows]
    if args.text:
        args.prompt_rows = [{"text": t} for t in args.text]
    if args.prompt_rows is not None:
        check_prompt_rows(args.prompt_rows)


# this command's analyses, each a part of interp.parts (its name there)
PARTS_OF = {"composition": "composition", "ov": "ov", "encoder": "encoder", "map": "headmap"}


def main(args: argparse.Namespace, model: HookedModel, out: Path) -> list[Path]:
    info = describe(model)
    prompts = prompt_ids(model, args.prompt_rows) if args.prompt_rows is not None else None
    task = None
    if "dla" in args.analyses and args.task is not None:
        n_pairs = args.batch if args.batch is not None or args.task not in TASKS else BATCH
        task = task_probe(model, args.task, n_pairs=n_pairs, seed=args.seed, framed=args.framed)
    sizes = _sizes(args)
    todo = [a for a in args.analyses if a in PARTS_OF]
    plan = {**_dla_plan(args, info, prompts, task), **{a: PARTS.get(PARTS_OF[a]).work(info, sizes[a]) for a in todo}}
    say = announcer(STEM, plan, args.progress)
    config = RunConfig(level=args.ci, seed=args.seed, progress=args.progress)
    dla = None
    if "dla" in plan:  # first: bad prompts end the run before any write
        say("dla")
        given = (task,) if task is not None else prompts
        dla = logit_attribution(model, *given, config=config)
    print(f"{info.name} ({'causal' if info.is_causal else 'encoder'}, {info.n_layers} layers x {info.n_heads} heads)")
    written: list[Path] = []
    tables: list[HeadScores] = []
    baselines: dict[str, float] = {}
    skipped: dict[str, str] = {}
    given_parts = Given()
    for name in todo:
        say(name)
        got = run_part(PARTS_OF[name], model, info, sizes[name], config, given_parts)
        if isinstance(got, NotApplicable):
            skipped[name] = _why(got)
            continue
        skipped.update({what: _why(why) for what, why in got.left_out.items()})
        if got.result is None:
            continue
        if name in ("ov", "encoder"):
            tables.append(got.result)
            baselines.update(got.result.meta["baselines"])
        written += SHOW[name](got.result, args, info, out)
    if dla is not None:
        print(dla.summary(args.top))
        written += dla.save(out)
    if tables:
        written.append(_print_roles(join_scores(tables), baselines, args, out))
    for what, why in skipped.items():
        print(f"\nskipped {what}: {why}")
    return written


def _sizes(args: argparse.Namespace) -> dict[str, Any]:
    """Each analysis's sizes from the flags (the text probe: --batch windows of --seq-len tokens)."""
    text = dict(batch=args.batch or BATCH, seq_len=args.seq_len)
    return {
        "composition": CompositionSizes(n_random=args.n_random),
        "ov": OVSizes(k=args.k, sequences=args.sequence_ids),
        "encoder": EncoderSizes(**text, frequencies=args.frequency_table),
        "map": TextSizes(**text),
    }


def _why(why: NotApplicable) -> str:
    """A part's reason as this command says it: its remedy's parameters as the flags that set them."""
    text = f"{why.reason}: {why.remedy}" if why.remedy else why.reason
    return in_flags(build_parser(), UsageError(text, params=why.params))


def _show_composition(comp: Any, args: argparse.Namespace, info: ModelInfo, out: Path) -> list[Path]:
    written = comp.save(out)
    written += save_figure(comp.figure(title=f"{short_name(info.name)}: composition scores"), out, "composition")
    print(f"\ncomposition (z against {args.n_random} random head pairs of the same shapes):")
    for kind in ("Q", "K", "V"):
        top = comp.table[comp.table["kind"] == kind].nlargest(min(args.top, 5), "z")
        shown = ", ".join(
            f"{s}->{d} {v:.3f} (z {z:.1f})" for s, d, v, z in zip(top["src"], top["dst"], top["score"], top["z"])
        )
        print(f"  {kind}: {shown}")
    for note in comp.meta["notes"]:
        print(f"  note: {note}")
    return written


def _show_map(m: Any, args: argparse.Namespace, info: ModelInfo, out: Path) -> list[Path]:
    return m.save(out) + save_figure(m.figure(), out, "head_map")


SHOW = {
    "composition": _show_composition,
    "ov": lambda ov, args, info, out: ov.save(out, "ov_scores"),
    "encoder": lambda enc, args, info, out: enc.save(out, "encoder_heads"),
    "map": _show_map,
}


def _print_roles(merged: HeadScores, baselines: dict[str, float], args: argparse.Namespace, out: Path) -> Path:
    """``roles.csv`` written, the chance levels and the heads with a role printed."""
    roles = role_table(merged, baselines, threshold=args.threshold)
    path = atomic_write(out / f"{STEM}.csv", file_frame(roles).to_csv(index=False))
    cols = [c for c in role_columns() if c in roles and roles[c].notna().any()]
    print("\nchance levels: " + ", ".join(f"{c} {baselines[c]:.3f}" for c in cols if c in baselines))
    named = roles[roles["role"] != ""]
    if len(named):
        print(f"heads with a role ({len(named)} of {len(roles)}; score [{args.ci:.0%} CI]):")
        table = format_table(named.head(args.top), cols, ci=[c for c in cols if f"{c}_lo" in roles])
        lines = table.splitlines()
        print("\n".join(f"{line}  {role}" for line, role in zip(lines, ["role", *named["role"].head(args.top)])))
    else:
        print(f"no head's CI clears its chance level with a score of at least {args.threshold:g}: no role named")
    return path


def _dla_plan(args: argparse.Namespace, info: ModelInfo, prompts: Any, task: Any) -> dict[str, tuple[str, float]]:
    """Direct logit attribution's entry of the plan, first, when it runs."""
    work = lambda n: forward_work(n, info.n_layers, info.d_model, info.d_vocab)  # noqa: E731
    if task is not None:  # built only when dla runs
        what = f"direct logit attribution (task {task.name}: {task.n_pairs} prompts of {task.seq_len} tokens)"
        return {"dla": (what, work(task.n_pairs * task.seq_len))}
    if prompts is not None and "dla" in args.analyses:
        n = sum(len(t) for t in prompts[0])
        return {"dla": (f"direct logit attribution ({len(prompts[0])} prompts, {n} tokens)", work(n))}
    return {}


def cli(argv: Sequence[str] | None = None, prog: str = "python -m interp.roles") -> int:
    return run_cli(build_parser(prog), main, argv, STEM, check=check, unread=(FRAMED_UNREAD,))
