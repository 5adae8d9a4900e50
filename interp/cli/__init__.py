"""The ``interp`` console command and every analysis command behind it.

``interp induction|sinks|ablate ...`` and ``python -m interp.<name> ...`` run the same code: each
command is a module here with a ``cli(argv, prog)`` function, a thin argparse layer over library
calls; :mod:`interp.cli.common` holds what they share (flags, exit codes, the ranked summary).
Commands are imported only when asked for, so ``interp --help`` loads no model code.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from interp.registry import Registry

# the commands: name -> what it does (the listing) and the module whose cli() runs it
COMMANDS: Registry[str] = Registry("command")
COMMANDS.add("induction", "score heads as previous-token, duplicate-token and induction heads", "interp.cli.induction")
COMMANDS.add("sinks", "attention sinks: first-token heads, sink tokens, massive activations", "interp.cli.sinks")
COMMANDS.add("ablate", "ablation sweeps: exact, gradient importance, pruning curves, L0 gates", "interp.cli.ablate")
COMMANDS.add("patterns", "every head's attention on your own text, as one self-contained page", "interp.cli.patterns")
COMMANDS.add("retrieval", "retrieval heads, streaming heads and copy distance on needle probes", "interp.cli.retrieval")
COMMANDS.add(
    "report", "a one-page HTML head atlas: roles, heatmaps, sinks, importance, attention patterns", "interp.cli.report"
)


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
        from interp import __version__

        print(f"interp {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(usage(), end="", file=sys.stderr)
        print(f"interp: error: unknown command {name!r}: choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    command = importlib.import_module(COMMANDS.get(name))
    return command.cli(rest, prog=f"interp {name}")


if __name__ == "__main__":
    sys.exit(main())
