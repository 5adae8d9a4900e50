"""What every ``python -m interp.<analysis>`` command shares: common flags, checks and exit codes.

Exit codes: 0 done; 1 the model cannot be loaded (one clear line on stderr); 2 bad usage or bad
input (argparse's convention), with nothing written; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import interp.distributed as distributed
from interp._io import PARTIAL, ensure_writable_dir, partial_name, writes_skipped
from interp.adapters import HookedModel
from interp.errors import InterpError, ModelLoadError, RankFailedError, UsageError
from interp.journal import Journals, run_arguments
from interp.lock import out_lock
from interp.models import load_model, resolve_device, resolve_dtype
from interp.saving import cli_owned
from interp.scores import format_table, plural  # noqa: F401  (the commands' summary table; it lives with the results)

EXIT_MODEL = 1
EXIT_USAGE = 2


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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
    """A parser with the flags every analysis takes: model, device, dtype, seed, batch, out, top."""
    p = argparse.ArgumentParser(prog=prog, description=description, formatter_class=_Formatter)
    p.add_argument(
        "--model",
        default="toy",
        help="Hugging Face name (gpt2, EleutherAI/pythia-70m, ...), a local HF model "
        "directory, or 'toy' for the bundled toy model",
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
    add_threads_flag(p)
    return p


def set_batch_help(p: argparse.ArgumentParser, text: str) -> None:
    """``--batch`` given no default (None: the command's own choice, which ``text`` states)."""
    p.set_defaults(batch=None)
    (action,) = [a for a in p._actions if a.dest == "batch"]
    action.help = text


def add_threads_flag(p: argparse.ArgumentParser) -> None:
    """``--threads N``: torch's CPU threads (default: one for small models or a busy machine)."""
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads for torch (default: 1 for a model under 20M parameters or when fewer than 2 CPUs "
        "are free, else the free CPUs; the first line printed says what was picked and why)",
    )


def set_threads(args: argparse.Namespace, model: HookedModel) -> str:
    """Set torch's thread count from ``--threads`` or :func:`interp.threads.choose_threads`; the line to print."""
    import torch

    from interp.threads import choose_threads, count_parameters

    given = getattr(args, "threads", None)
    n, why = (given, "--threads") if given else choose_threads(count_parameters(model))
    torch.set_num_threads(n)
    return f"threads: {n} ({why})"


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

    p.add_argument(
        "--engine",
        choices=ENGINES.names(),
        default="auto",
        help=ENGINES.help() + " (default: auto)",
    )


def add_task_flag(p: argparse.ArgumentParser, default: str | None, what: str = "") -> None:
    """``--task repeat|ioi|greater-than|FILE``: a bundled task of :data:`~interp.probes.task.TASKS`
    (``--batch`` pairs, seeded by ``--seed``) or a task file; :func:`check_task` reads it before
    the model loads, :func:`~interp.probes.task.task_probe` builds it. And ``--framed``: a task
    file's prompts carry the model's framing (refused otherwise: :data:`FRAMED_UNREAD`)."""
    from interp.probes.task import COLUMNS, TASKS

    p.add_argument(
        "--task",
        default=default,
        help=what
        + "a bundled task ("
        + TASKS.help()
        + ") or a .jsonl/.csv file with the columns "
        + ", ".join(COLUMNS),
    )
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


def default_out(model_spec: str, analysis: str) -> Path:
    """``out/<model>`` with the model spec made filesystem-safe (``EleutherAI/pythia-70m`` -> ``EleutherAI__pythia-70m``)."""
    name = Path(model_spec).name if Path(model_spec).exists() else model_spec
    safe = re.sub(r"[^A-Za-z0-9._-]+", "__", name.strip("/")) or "model"
    return Path("out") / safe


@dataclass(frozen=True)
class Unread:
    """A flag that a command does not read, always or in some runs: given on the command line, it is
    refused (exit 2, before the model loads) instead of being silently dropped.

    ``why`` says what would read it ("it applies to --dataset"); ``when(args)`` is True in the runs
    that ignore it (default: every run).
    """

    flag: str
    why: str
    when: Callable[[argparse.Namespace], bool] = lambda args: True


def _bundled(task: str | None) -> bool:
    from interp.probes.task import TASKS

    return task is None or task in TASKS


FRAMED_UNREAD = Unread("--framed", "it applies to a task file, --task FILE", lambda args: _bundled(args.task))


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The destinations of the options written in ``argv`` (abbreviations resolved as argparse
    resolves them), whatever their values: ``--batch 10`` is given even when 10 is the default."""
    by_flag = {flag: action.dest for action in parser._actions for flag in action.option_strings}
    given = set()
    for token in argv:
        if token == "--":
            break
        if not token.startswith("--"):
            continue
        name = token.split("=", 1)[0]
        matches = [name] if name in by_flag else [f for f in by_flag if f.startswith(name)]
        if len(matches) == 1:
            given.add(by_flag[matches[0]])
    return given


def refuse_unread(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str], unread: Sequence[Unread]
) -> None:
    """A :class:`UsageError` naming every flag in ``argv`` that this run would ignore (``unread``)."""
    given = given_flags(parser, argv)
    dest = {flag: action.dest for action in parser._actions for flag in action.option_strings}
    ignored = [f"{u.flag} ({u.why})" for u in unread if dest[u.flag] in given and u.when(args)]
    if ignored:
        them = "it" if len(ignored) == 1 else "them"
        raise UsageError(f"{parser.prog} would ignore {'; '.join(ignored)}: drop {them}")


def run_cli(
    parser: argparse.ArgumentParser,
    main: Callable[[argparse.Namespace, Any, Path], Sequence[Path]],
    argv: Sequence[str] | None,
    analysis: str,
    *,
    check: Callable[[argparse.Namespace], None] | None = None,
    unread: Sequence[Unread] = (),
) -> int:
    """Parse, check the cheap things first (device, dtype, --out), load the model, run ``main``.

    ``main(args, model, out_dir)`` returns the paths it wrote; they are printed last. Every check
    that needs no model runs before the model loads (exit 2, nothing loaded, nothing written): the
    flags in ``unread`` that this run would ignore are refused (:class:`Unread`), then ``check(args)``
    runs (flags that do not go together, inputs that are missing or empty), then ``--out`` is
    checked and its lock taken. A command
    with ``--resume`` (:func:`add_resume_flags`) finds ``args.journals`` (a
    :class:`~interp.journal.Journals`): ``args.journals(kind, probe.tokens)`` opens the journal of one
    kind of long work, and ``args.journals.finish()`` deletes them once the final outputs are written.

    The first line printed says how many CPU threads torch got and why (``--threads``, or
    :func:`interp.threads.choose_threads`). Progress is bars on a terminal and occasional lines
    elsewhere (:mod:`interp.progress`; ``--no-progress`` forces lines). Warnings are one line each,
    ``prog: warning: ...``. On Ctrl-C, at any moment, the files this run had already written under
    ``--out`` are renamed with ``.partial`` before their suffix (:func:`mark_partial`), temporary
    files are removed, and the run exits 130 (an error met while stopping is named in one line, not
    a traceback: :func:`interrupted`). Errors that
    ``interp`` raises on purpose (:class:`~interp.errors.InterpError`) end the run with one line on
    stderr: exit 1 when the model cannot be had (or another rank failed), 2 for bad usage or input
    (nothing written). Any other exception is a bug and keeps its traceback (exit 1).

    Under ``torchrun`` every rank runs this: each loads a replica and runs ``main``, the analyses
    share the work out (:mod:`interp.distributed`), and only rank 0 prints, shows progress and
    writes files; the other ranks skip their writes and keep quiet. A failure on any rank, while
    loading or analysing, stops every rank with that rank's error.
    """
    lead = distributed.is_main()
    started = time.time()
    run: dict[str, Any] = {}  # what the interrupt handler needs: "out" once known, "done" once written
    try:
        with _quiet(not lead):
            args = parser.parse_args(argv)  # --help and usage errors: once, from rank 0
        args.progress = lead  # only rank 0 reports progress; --no-progress turns its bars into lines
        try:
            refuse_unread(parser, args, sys.argv[1:] if argv is None else argv, unread)
            if check is not None:
                check(args)
            # the device is resolved once, here, before the process group exists ("auto" -> cpu/cuda:N)
            device = resolve_device(distributed.rank_device(args.device))
            resolve_dtype(args.dtype)
            placement = _placement(args)
            distributed.start(device if placement is None else "cpu")
            with (
                distributed.interrupt_once(),
                _quiet(not lead, stderr=False),
                writes_skipped(not lead),
                one_line_warnings(parser.prog),
                progress_lines(bool(getattr(args, "no_progress", False))),
                ExitStack() as held,
            ):
                with distributed.checked("checking --out and loading the model"):
                    target = args.out or default_out(args.model, analysis)
                    out = ensure_writable_dir(target) if lead else Path(target)
                    run["out"] = out
                    held.enter_context(out_lock(out, f".interp-{analysis}.lock", take=lead))  # one run per --out
                    kwargs = {"device": device} if placement is None else placement
                    model = load_model(args.model, dtype=args.dtype, **kwargs)
                    if hasattr(args, "resume"):  # journaled long work (under the lock: one run per journal)
                        arguments = run_arguments(args)
                        args.journals = Journals(
                            out, arguments, model, args.model, resume=args.resume, fresh=args.fresh
                        )
                        held.callback(args.journals.close)
                if lead:
                    print(set_threads(args, model), flush=True)
                else:
                    set_threads(args, model)
                with distributed.checked(f"running {analysis}"), cli_owned() as replaced:
                    written = main(args, model, out)  # a command owns its --out: its earlier outputs are replaced
                    run["done"] = True
                removed = remove_superseded(written) if lead else []
        finally:
            distributed.stop()
        if lead:
            print_written(written, replaced, removed)
        return 0
    except BaseException as e:
        if interrupted(e):
            return stop_interrupted(parser.prog, e, run, started, lead)
        if isinstance(e, (ModelLoadError, RankFailedError)):
            return fail(parser, e, EXIT_MODEL, quiet=not lead)
        if isinstance(e, InterpError):
            return fail(parser, e, EXIT_USAGE, quiet=not lead)
        if out_of_memory(e):  # past the estimates made before the work (they do not count everything)
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            advice = "run fewer sequences per forward (--minibatch), or fewer of them (--batch)"
            return fail(parser, RuntimeError(f"out of memory ({why[:160]}): {advice}"), EXIT_MODEL, quiet=not lead)
        raise


def out_of_memory(error: BaseException) -> bool:
    """Was ``error`` an allocation that failed (a CPU or CUDA out-of-memory error)?"""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def print_written(written: Sequence[Path], replaced: Container[Path], removed: Sequence[Path] = ()) -> None:
    """The run's last lines: each path written, ``(replaced)`` where an earlier output was; then the
    partial files of an earlier interrupted run that they supersede, removed (:func:`remove_superseded`)."""
    print("\nwrote:")
    for path in written:
        print(f"  {path}" + (" (replaced)" if Path(path) in replaced else ""))
    if removed:
        print("removed (an interrupted run's partial files, superseded by the complete ones above):")
        for path in removed:
            print(f"  {path}")


def remove_superseded(written: Sequence[Path]) -> list[Path]:
    """Delete the ``.partial`` twin (:func:`~interp._io.partial_name`) of each complete file ``written``:
    what an interrupted run of the same output left, now complete beside it. Nothing else is touched
    (another command's or another output's partial files stay). Returns the paths removed."""
    removed = []
    for path in written:
        twin = partial_name(path)
        if twin != Path(path) and twin.is_file():
            twin.unlink()
            removed.append(twin)
    return removed


def partial_note(missing: int, total: int, units: str) -> str:
    """What a summary of an interrupted run adds to its title: `` (partial: 3 of 8 heads missing, not
    yet computed)``; nothing when no unit is missing."""
    return f" (partial: {missing} of {total} {units} missing, not yet computed)" if missing else ""


def stop_partial(written: Sequence[Path], journals: Journals | None = None) -> None:
    """A run that ends with partial results (a Ctrl-C inside journaled work): list the files just
    written (each named ``.partial``), say whether ``--resume`` can finish it, and raise
    :class:`KeyboardInterrupt` for :func:`run_cli`, which says "interrupted" once and exits 130."""
    print("\nwrote the rows computed so far, marked partial:")
    for path in written:
        print(f"  {path}")
    if journals is not None and journals.opened:
        print("the finished units are journaled: run the same command with --resume to finish it")
    raise KeyboardInterrupt


def interrupted(error: BaseException) -> bool:
    """Was ``error`` a Ctrl-C, or raised while one was being handled (a cleanup that failed on the
    way out of an interrupted step)?"""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def stop_interrupted(prog: str, error: BaseException, run: dict[str, Any], started: float, lead: bool) -> int:
    """Exit 130 after a Ctrl-C: what this run wrote under ``--out`` is marked partial, and a failure
    met while stopping is named in one line. A run that had finished writing (``run["done"]``: the
    interrupt came while its last lines were printed) is complete: its files keep their names and
    the one line says they are complete; the exit is still 130, as the Ctrl-C asked. A second Ctrl-C
    meanwhile is ignored: the marking is not cut in half."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        if not lead:
            return 130
        out = run.get("out")
        marked = mark_partial(out, started) if out is not None and out.is_dir() and not run.get("done") else []
        if marked:
            print(f"{prog}: these files were written before the interrupt, marked partial:")
            for path in marked:
                print(f"  {path}")
        if not isinstance(error, KeyboardInterrupt):
            print(f"{prog}: while stopping: {type(error).__name__}: {' '.join(str(error).split())}", file=sys.stderr)
        if run.get("done"):  # every file was written: the run is complete, only its last lines were cut
            print(f"{prog}: interrupted after every file was written: they are complete", file=sys.stderr)
        else:
            print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)


def mark_partial(out: Path, since: float) -> list[Path]:
    """Rename the files under ``out`` written at or after ``since`` to ``<stem>.partial<suffix>``.

    What an interrupted run wrote may be a mix of new and old results (a figure from this run beside
    a table from the last), so nothing of it may pass for complete: ``sinks_heads.html`` becomes
    ``sinks_heads.partial.html`` (:func:`interp._io.partial_name`). Files already marked, hidden
    files (locks, journals) and older files are left alone. Returns the new paths.
    """
    marked = []
    for path in sorted(out.iterdir()):
        if not path.is_file() or path.name.startswith(".") or PARTIAL in path.name:
            continue
        try:
            if path.stat().st_mtime < since - 1e-3:
                continue
        except OSError:
            continue
        target = partial_name(path)
        os.replace(path, target)
        marked.append(target)
    return marked


@contextmanager
def one_line_warnings(prog: str) -> Iterator[None]:
    """Inside the block, a warning prints as one line, ``prog: warning: message`` (no file or source line)."""

    def show(message: Warning | str, *_: Any, **__: Any) -> None:
        print(f"{prog}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    with warnings.catch_warnings():  # restores the previous showwarning on the way out
        warnings.showwarning = show
        yield


def progress_lines(force: bool) -> Any:
    """Progress as lines (``--no-progress``), or as usual: bars on a terminal, lines elsewhere."""
    from interp.progress import lines

    return lines(force)


def _placement(args: argparse.Namespace) -> dict[str, Any] | None:
    """``load_model`` keywords for a model spread over devices (--device-map / --n-devices), or None."""
    device_map = getattr(args, "device_map", None)
    n_devices = getattr(args, "n_devices", None)
    if device_map is None and (n_devices is None or n_devices == 1):
        return None
    if args.device not in ("auto", None):
        raise UsageError("--device and --device-map/--n-devices are exclusive: a spread model has no one device")
    if distributed.launched() and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        raise UsageError(
            "--device-map/--n-devices with several processes per node would put every rank on the same "
            "devices: run torchrun with --nproc-per-node 1 (one spread replica per node)"
        )
    return {"device_map": device_map, "n_devices": n_devices}


@contextmanager
def _quiet(on: bool, *, stderr: bool = True) -> Iterator[None]:
    """Silence stdout (and stderr) inside the block when ``on``: ranks other than 0 under torchrun."""
    if not on:
        yield
        return
    with open(os.devnull, "w") as sink, redirect_stdout(sink):
        if stderr:
            with redirect_stderr(sink):
                yield
        else:
            yield


def in_flags(parser: argparse.ArgumentParser, error: BaseException, aliases: Mapping[str, str] | None = None) -> str:
    """``error``'s message as a command line says it: each parameter it names (``error.params``,
    written ``name=`` in the message) shown as the parser's flag for it, ``minibatch=4`` as
    ``--minibatch 4``, a bare ``minibatch=`` as ``--minibatch``, and an on/off flag's
    ``framed=True`` as ``--framed``, ``engine='pattern'`` as ``--engine pattern``. ``aliases`` maps a parameter to the destination of the flag
    that sets it where their names differ (``{"n_pairs": "batch"}``). A parameter this parser has
    no flag for stays as written."""
    message = " ".join(str(error).split())
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    for param in getattr(error, "params", ()):
        action = actions.get((aliases or {}).get(param, param))
        if action is None:
            continue
        flag, switch = action.option_strings[-1], action.nargs == 0

        def shown(m: re.Match, flag: str = flag, switch: bool = switch) -> str:
            value = m.group(1)
            if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":  # engine='pattern': --engine pattern
                value = value[1:-1]
            if not value or (switch and value in ("True", "False")):
                return flag
            return f"{flag} {value}"

        message = re.sub(rf"(?<![\w.=-]){re.escape(param)}=([^\s,;:)\]]*)", shown, message)
    return message


def fail(
    parser: argparse.ArgumentParser,
    error: BaseException,
    code: int,
    *,
    quiet: bool = False,
    aliases: Mapping[str, str] | None = None,
) -> int:
    """One line on stderr, ``prog: error: ...`` (its parameters as this command's flags:
    :func:`in_flags`); exit ``code`` (2 raises SystemExit as argparse does).

    ``quiet``: say nothing (the other ranks of a torchrun run: rank 0 reports for all)."""
    message = in_flags(parser, error, aliases)
    if code == EXIT_USAGE:
        if quiet:
            raise SystemExit(code)
        parser.exit(code, f"{parser.prog}: error: {message}\n")
    if not quiet:
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
    return code


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
