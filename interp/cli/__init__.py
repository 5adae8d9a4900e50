"""The ``interp`` console command and every analysis command behind it.

``interp induction|sinks|ablate ...`` and ``python -m interp.<name> ...`` run the same code: each
command is a module here with a ``cli(argv, prog)`` function, a thin argparse layer over library
calls; :mod:`interp.cli.common` holds what they share (flags, exit codes, the ranked summary).
Commands are imported only when asked for, so ``interp --help`` loads no model code.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

from interp.registry import Registry

# the commands: name -> what it does (the listing) and the module whose cli() runs it
COMMANDS: Registry[str] = Registry("command")
COMMANDS.add("induction", "score heads as previous-token, duplicate-token and induction heads", "interp.cli.induction")
COMMANDS.add("sinks", "attention sinks: first-token heads, sink tokens, massive activations", "interp.cli.sinks")
COMMANDS.add("ablate", "ablation sweeps: exact, gradient importance, pruning curves, L0 gates", "interp.cli.ablate")
COMMANDS.add("patterns", "every head's attention on your own text, as one self-contained page", "interp.cli.patterns")
COMMANDS.add("retrieval", "retrieval heads, streaming heads and copy distance on needle probes", "interp.cli.retrieval")
COMMANDS.add("patch", "which heads matter for a task: activation patching on clean/corrupted pairs", "interp.cli.patch")
COMMANDS.add(
    "circuit",
    "which edges carry a task: edge attribution and exact edge patching, the circuit extracted and evaluated",
    "interp.cli.circuit",
)
COMMANDS.add(
    "qk", "why a head attends where it does: its score split into (query, key) component pairs", "interp.cli.qk"
)
COMMANDS.add(
    "roles",
    "what heads write and read: composition, copy suppression, successor and encoder heads, logit attribution",
    "interp.cli.roles",
)
COMMANDS.add(
    "checkpoints",
    "heads over training: every head score and the in-context score at each checkpoint",
    "interp.cli.checkpoints",
)
COMMANDS.add(
    "report", "a one-page HTML head atlas: roles, heatmaps, sinks, importance, attention patterns", "interp.cli.report"
)


def import_interruptibly(module: str, prog: str) -> ModuleType:
    """Import a command's module (torch, transformers: seconds) so that Ctrl-C meanwhile ends the
    process with one line, ``prog: interrupted``, and exit 130: no traceback from inside an import.

    The handler is set before the first heavy import and the previous one is back afterwards, when
    :func:`~interp.cli.common.run_cli` takes over Ctrl-C (it keeps what was computed, marks partial
    files, and exits 130 too). Entry points only: it changes the process's SIGINT handler meanwhile.
    """

    def stop(signum: int, frame: object) -> None:
        os.write(2, f"{prog}: interrupted\n".encode())
        os._exit(130)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        return importlib.import_module(module)
    finally:
        signal.signal(signal.SIGINT, previous)


def run_command(module: str, prog: str, argv: Sequence[str] | None = None) -> int:
    """An entry point: import the command's module under :func:`import_interruptibly`, run its ``cli``
    (a Ctrl-C between the two, while the parser is built, is one line and exit 130 as well)."""
    command = import_interruptibly(module, prog)
    try:
        return command.cli(argv, prog=prog)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {COMMANDS.doc(name)}" for name in COMMANDS]
    return (
        "usage: interp <command> [options]\n\n"
        "What does each attention head do, and which heads matter?\n\ncommands:\n" + "\n".join(lines) + "\n\n"
        "'interp <command> --help' shows a command's options; each is also 'python -m interp.<command>'.\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``interp`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    if args[0] == "--version":
        from interp._version import __version__

        print(f"interp {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(usage(), end="", file=sys.stderr)
        print(f"interp: error: unknown command {name!r}: choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return run_command(COMMANDS.get(name), f"interp {name}", rest)


if __name__ == "__main__":
    sys.exit(main())
