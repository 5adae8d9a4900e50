"""README.md as the tests read it: its code blocks, the shell commands in them and its inline code.

Not a test file: ``tests/test_readme.py`` (every snippet, command, number and name) and
``tests/test_readme_commands.py`` (the torchrun commands) read the README through it. Everything is
read from README.md when asked for, never from a copy, so the tests follow every edit.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def code_blocks(language: str) -> list[tuple[int, str]]:
    """``(line, code)`` of every fenced block in ``language``; ``line`` is its first code line (1-based)."""
    text = readme_text()
    return [
        (text.count("\n", 0, m.start(1)) + 1, m.group(1))
        for m in re.finditer(rf"^```{re.escape(language)}\n(.*?)^```", text, re.S | re.M)
    ]


def inline_code() -> list[str]:
    """The README's inline code spans (single backticks), outside fenced blocks, whitespace folded."""
    prose = re.sub(r"^```.*?^```", "", readme_text(), flags=re.S | re.M)
    spans = re.findall(r"`([^`]+)`", prose)  # a span may wrap onto the next line, never over a paragraph
    return [" ".join(span.split()) for span in spans if "\n\n" not in span]


@dataclass(frozen=True)
class Command:
    """One shell command of a ```bash block: continuation lines joined, its trailing comment apart."""

    words: tuple[str, ...]
    comment: str  # the text after `#`, stripped ("" when none)
    line: int  # where it starts in README.md
    block: int  # which ```bash block (0-based, in README order)

    @property
    def text(self) -> str:
        return shlex.join(self.words)


def _split_comment(line: str) -> tuple[str, str]:
    """``(command, comment)``: the comment starts at the first ``#`` that opens a shell word."""
    for m in re.finditer(r"(?:^|(?<=\s))#", line):
        head = line[: m.start()]
        try:
            shlex.split(head)
        except ValueError:  # the `#` sits inside quotes
            continue
        return head, line[m.end() :].strip()
    return line, ""


def shell_commands() -> list[Command]:
    """Every command of every ```bash block, in README order (comment-only lines are not commands)."""
    found = []
    for block, (first, code) in enumerate(code_blocks("bash")):
        offset = 0
        for physical in code.replace("\\\n", " \x00").splitlines():
            line = first + offset
            offset += 1 + physical.count("\x00")
            command, comment = _split_comment(physical.replace("\x00", ""))
            words = shlex.split(command)
            if words:
                found.append(Command(tuple(words), comment, line, block))
    return found


def python_snippets() -> list[tuple[int, str]]:
    """``(line, code)`` of every ```python block."""
    return code_blocks("python")
