"""The command shell: what every ``python -m interp.<analysis>`` command runs inside (:class:`Command`).

Parse, the checks before the model, the out-folder lock, threads, Ctrl-C and exit codes live here;
the flags the commands share are in :mod:`interp.cli.flags`. Exit codes: 0 done; 1 the model cannot
be loaded (one clear line on stderr); 2 bad usage or bad input (argparse's convention), with nothing
written; 130 interrupted.
"""

from __future__ import annotations

import argparse
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
from interp._io import ensure_writable_dir, mark_partial, remove_superseded, writes_skipped
from interp.adapters import HookedModel
from interp.errors import InterpError, ModelLoadError, RankFailedError, UsageError
from interp.interrupts import interrupted
from interp.journal import Journals, run_arguments
from interp.lock import out_lock
from interp.memory import check_bootstrap, out_of_memory
from interp.models import load_model, resolve_device, resolve_dtype
from interp.progress import lines as progress_lines
from interp.saving import cli_owned
from interp.threads import choose_threads, count_parameters

EXIT_MODEL = 1
EXIT_USAGE = 2


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


class Command:
    """One run of a command, as a context manager: ``with Command(parser, argv, "induction") as cmd:``.

    Entering parses ``argv`` and checks everything that needs no model (exit 2, nothing loaded,
    nothing written): the flags in ``unread`` that this run would ignore (:class:`Unread`), then
    ``check(args)`` (the library's ``validate_*`` calls, flags that do not go together, inputs that
    are missing or empty), the device and dtype; then ``--out`` is made and its lock taken. The
    body reads ``cmd.args`` and ``cmd.out``, loads the model as a step (:meth:`load_model`, which
    also opens the journals of a command with ``--resume`` as ``args.journals`` and picks the
    threads; a command that loads its models itself calls :meth:`threads`), makes its one library
    call, prints its summary and ends with :meth:`done` and the paths it wrote, printed last (the
    ``.partial`` files they supersede removed). ``cmd.code`` is then the exit code.

    Exit codes: an :class:`~interp.errors.InterpError` is one line on stderr, its parameters shown
    as this command's flags (:func:`in_flags`, ``aliases`` where a flag's dest is not the
    parameter's name): exit 1 when the model cannot be had (or another rank failed), 2 for bad
    usage or input (raised as argparse does); running out of memory is one line and exit 1; any
    other exception is a bug and keeps its traceback. On Ctrl-C, at any moment, what this run wrote
    under ``--out`` is marked partial (:func:`stop_interrupted`; ``stop_note(out)`` adds a line
    first) and the exit is 130. A failure before the body raises :class:`SystemExit` with its code.

    Warnings are one line each; progress is bars on a terminal and lines elsewhere (``--no-progress``:
    lines). Under ``torchrun`` (``ranks``) every rank runs the command and loads a replica, the
    analyses share the work out (:mod:`interp.distributed`), only rank 0 prints, shows progress and
    writes, and a failure on any rank stops every rank with that rank's error.
    """

    def __init__(
        self,
        parser: argparse.ArgumentParser,
        argv: Sequence[str] | None,
        analysis: str,
        *,
        check: Callable[[argparse.Namespace], None] | None = None,
        unread: Sequence[Unread] = (),
        aliases: Mapping[str, str] | None = None,
        stop_note: Callable[[Path | None], str] | None = None,
        ranks: bool = True,
    ) -> None:
        self.parser, self.argv, self.analysis, self.aliases = parser, argv, analysis, aliases
        self._check, self._unread, self._stop_note, self._ranks = check, unread, stop_note, ranks
        self.lead = distributed.is_main() if ranks else True
        self.out: Path | None = None
        self.written: list[Path] = []
        self.code = 0
        self._done = False
        self._held, self._running = ExitStack(), ExitStack()  # the run's setting; its checked work

    def __enter__(self) -> Command:
        self._started = time.time()
        self._stdout = sys.stdout
        sys.stdout = PipeSafe(sys.stdout)  # `| head`: the rest of the output dropped, the run goes on
        try:
            self._open()
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise SystemExit(self.code) from None
        return self

    def _open(self) -> None:
        with _quiet(not self.lead):
            args = self.args = self.parser.parse_args(self.argv)  # --help and usage errors: once, from rank 0
        args.progress = self.lead  # only rank 0 reports progress; --no-progress turns its bars into lines
        refuse_unread(self.parser, args, sys.argv[1:] if self.argv is None else self.argv, self._unread)
        if self._check is not None:
            self._check(args)
        if isinstance(getattr(args, "n_boot", None), int):  # sized before any work, at the batch asked
            check_bootstrap(args.n_boot, getattr(args, "batch", None))
        # the device is resolved once, here, before the process group exists ("auto" -> cpu/cuda:N)
        self.device = resolve_device(distributed.rank_device(args.device))
        resolve_dtype(args.dtype)
        self._placement = _placement(args)
        if self._ranks:
            distributed.start(self.device if self._placement is None else "cpu")
        for setting in (
            distributed.interrupt_once(),
            _quiet(not self.lead, stderr=False),
            writes_skipped(not self.lead),
            one_line_warnings(self.parser.prog),
            progress_lines(bool(getattr(args, "no_progress", False))),  # bars or lines
        ):
            self._held.enter_context(setting)
        with distributed.checked("checking --out"):
            target = args.out or default_out(args.model, self.analysis)
            self.out = ensure_writable_dir(target) if self.lead else Path(target)
            self._held.enter_context(out_lock(self.out, f".interp-{self.analysis}.lock", take=self.lead))
        self._running.enter_context(distributed.checked(f"running {self.analysis}"))
        self._replaced = self._running.enter_context(cli_owned())  # a command owns its --out

    def load_model(self) -> HookedModel:
        """``--model`` on this rank's device (or spread over devices), the journals opened (a command
        with ``--resume``: ``args.journals``, under the lock: one run per journal), the threads set."""
        args = self.args
        with distributed.checked("loading the model"):
            kwargs = {"device": self.device} if self._placement is None else self._placement
            model = load_model(args.model, dtype=args.dtype, **kwargs)
            if hasattr(args, "resume"):  # journaled long work
                journals = Journals(
                    self.out, run_arguments(args), model, args.model, resume=args.resume, fresh=args.fresh
                )
                args.journals = journals
                self._held.callback(journals.close)
        self.threads(count_parameters(model))
        return model

    def threads(self, n_params: int | None, one: str | None = None) -> None:
        """Set torch's CPU threads, ``--threads`` or :func:`~interp.threads.choose_threads` for a model of
        ``n_params`` (``one``: why one thread is right here), and say so in the run's first line."""
        import torch

        given = getattr(self.args, "threads", None)
        n, why = (given, "--threads") if given else (1, one) if one else choose_threads(n_params)
        torch.set_num_threads(n)
        if self.lead:
            print(f"threads: {n} ({why})", flush=True)

    def done(self, written: Sequence[Path]) -> None:
        """The run is complete: ``written`` are its files (a Ctrl-C from here on renames none of them)."""
        self.written, self._done = list(written), True

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> bool:
        try:
            try:
                with self._held:
                    with self._running:  # every rank checks in; the run's earlier outputs are replaced
                        if error is not None:
                            raise error
                    removed = remove_superseded(self.written) if self.lead else []
            finally:
                if self._ranks:
                    distributed.stop()
            if self.lead:
                print_written(self.written, self._replaced, removed)
            self.code = 0
        except BaseException as e:
            self.code = self._failed(e)
        finally:
            sys.stdout.flush()
            sys.stdout = self._stdout
        return True

    def _failed(self, e: BaseException) -> int:
        """The exit code of a run that ``e`` ended (2 raises, as argparse does; a bug re-raises)."""
        if interrupted(e):
            if self._stop_note is not None and self.lead:
                print(f"{self.parser.prog}: {self._stop_note(self.out)}", file=sys.stderr)
            run = {"out": self.out, "done": self._done}
            return stop_interrupted(self.parser.prog, e, run, self._started, self.lead)
        if isinstance(e, InterpError):
            code = EXIT_MODEL if isinstance(e, (ModelLoadError, RankFailedError)) else EXIT_USAGE
        elif out_of_memory(e):  # past the estimates made before the work (they do not count everything)
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            advice = "run fewer sequences per forward (--minibatch), or fewer of them (--batch)"
            if "--minibatch" not in self.parser._option_string_actions:  # a command that runs whole batches
                advice = "run fewer sequences (--batch)"
            code, e = EXIT_MODEL, RuntimeError(f"out of memory ({why[:160]}): {advice}")
        else:
            raise e
        return fail(self.parser, e, code, quiet=not self.lead, aliases=self.aliases)


class PipeSafe:
    """Standard output that a reader closing its end (``| head -3``) does not break: the first
    :class:`BrokenPipeError` points the descriptor at ``os.devnull`` and the rest of the output is
    dropped, while the run goes on to write its files and exit as it would have."""

    def __init__(self, stream: Any) -> None:
        self._stream, self.closed_pipe = stream, False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.closed_pipe = True
        try:  # the interpreter's last flush at exit writes to nowhere instead of failing
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # a stream with no descriptor (a test's capture)
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_cli(
    parser: argparse.ArgumentParser,
    main: Callable[[argparse.Namespace, Any, Path], Sequence[Path]],
    argv: Sequence[str] | None,
    analysis: str,
    **shell: Any,
) -> int:
    """The shell (:class:`Command`, ``shell`` its options) around ``main(args, model, out)``, which
    returns the paths it wrote: a command that loads one model. Returns the exit code."""
    with Command(parser, argv, analysis, **shell) as cmd:
        cmd.done(main(cmd.args, cmd.load_model(), cmd.out))
    return cmd.code


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


def partial_note(missing: int, total: int, units: str) -> str:
    """What a summary of an interrupted run adds to its title: `` (partial: 3 of 8 heads missing, not
    yet computed)``; nothing when no unit is missing."""
    return f" (partial: {missing} of {total} {units} missing, not yet computed)" if missing else ""


def stop_partial(written: Sequence[Path], journals: Journals | None = None) -> None:
    """A run that ends with partial results (a Ctrl-C inside journaled work): list the files just
    written (each named ``.partial``), say whether ``--resume`` can finish it, and raise
    :class:`KeyboardInterrupt` for the shell (:class:`Command`), which says "interrupted" once and exits 130."""
    print("\nwrote the rows computed so far, marked partial:")
    for path in written:
        print(f"  {path}")
    if journals is not None and journals.opened:
        print("the finished units are journaled: run the same command with --resume to finish it")
    raise KeyboardInterrupt


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


@contextmanager
def one_line_warnings(prog: str) -> Iterator[None]:
    """Inside the block, a warning prints as one line, ``prog: warning: message`` (no file or source line)."""

    def show(message: Warning | str, *_: Any, **__: Any) -> None:
        print(f"{prog}: warning: {' '.join(str(message).split())}", file=sys.stderr)

    with warnings.catch_warnings():  # restores the previous showwarning on the way out
        warnings.showwarning = show
        yield


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


# the repeated-token probe's parameters, as every command with flags.add_block_flags names them
BLOCK_ALIASES = {"block_len": "seq_len", "n_repeats": "repeats"}


def in_flags(parser: argparse.ArgumentParser, error: BaseException, aliases: Mapping[str, str] | None = None) -> str:
    """``error``'s message as a command line says it: each parameter it names (``error.params``,
    written ``name=`` in the message) shown as the parser's flag for it, ``minibatch=4`` as
    ``--minibatch 4``, a bare ``minibatch=`` as ``--minibatch``, and an on/off flag's
    ``framed=True`` as ``--framed``, ``engine='pattern'`` as ``--engine pattern``. ``aliases`` maps a parameter to the destination of the flag
    that sets it where their names differ (``{"n_pairs": "batch"}``). A parameter this parser has
    no flag for stays as written."""
    message = " ".join(str(error).split())
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    aliases = {**BLOCK_ALIASES, **(aliases or {})}
    for param in getattr(error, "params", ()):
        action = actions.get(aliases.get(param, param))
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
