"""Natural text for probes: read rows from the bundled text, a local file or a Hub data set, and
turn them into token ids (the model's tokenizer, or UTF-8 bytes mapped onto a tokenizer-less model's
ordinary vocabulary).

Every local text file is read through :func:`decode_file`: in ``encoding`` (UTF-8 unless asked
otherwise: ``encoding=``), and a file that is not valid in it is one clear error
naming the file, the byte and the parameter to pass, not a decoder's traceback.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from interp._io import bundled
from interp.errors import DatasetLoadError, UsageError

TEXT_FILE = "sentences.txt"
ENCODING = "utf-8"  # how text files are read unless the caller says otherwise
SPACE_MARK = "\u2423"  # "␣": a token's leading space, wherever a token is shown (labels, tables, errors)


def check_encoding(encoding: str) -> str:
    """``encoding``'s canonical name (``"latin1"`` -> ``"iso8859-1"``), or :class:`UsageError` for
    a name Python does not know."""
    try:
        return codecs.lookup(encoding).name
    except (LookupError, TypeError):
        raise UsageError(
            f"unknown text encoding {encoding!r}: give one Python knows, e.g. utf-8, latin-1, cp1252, utf-16"
        ) from None


def decode_file(
    path: str | os.PathLike, encoding: str = ENCODING, *, data: bytes | None = None, kind: str | None = None
) -> str:
    """The text of the file at ``path`` (its bytes ``data``, when already read), decoded with ``encoding``.

    A file that is not valid ``encoding`` text raises :class:`DatasetLoadError` in one line naming
    the file, where decoding failed and what to pass instead (``encoding=``); an unknown encoding is a :class:`UsageError`. ``kind`` names a file whose format
    is UTF-8 by definition (``"task file"``: JSON is UTF-8): its error says to save it as UTF-8.
    A leading byte-order mark is dropped.
    Every text file a command reads goes through here.
    """
    codec = check_encoding(encoding)
    raw = Path(path).read_bytes() if data is None else data
    try:  # a byte-order mark ("CSV UTF-8" in a spreadsheet) is the file's, not its first character
        return raw.decode(codec).removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        bad = raw[e.start : min(e.end, e.start + 4)].hex(" ")
        fix = (
            f"save the {kind} as UTF-8"
            if kind is not None
            else "pass the file's encoding with encoding=, e.g. latin-1 or cp1252, or save the file as UTF-8"
        )
        shown = "UTF-8" if kind is not None else encoding
        raise DatasetLoadError(
            f"{path} is not {shown} text: byte(s) {bad} at offset {e.start} (line {line}) cannot be decoded; {fix}",
            params=() if kind is not None else "encoding",
        ) from None


# said wherever a user gives text (command-line help, docstrings): the toy has no tokenizer
BYTES_NOTE = "a model without a tokenizer (the bundled toy) reads text as its UTF-8 bytes, one token a byte"


def text_dir() -> Path:
    """The bundled text probe: $INTERP_DATA_DIR/text, else the installed ``interp.data/text``
    (``data/text`` in a source checkout)."""
    return bundled("text")


KINDS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".csv": "csv"}
"""The local files a data set can be read from: suffix -> the loader's name."""


def check_dataset(dataset: str | os.PathLike | None) -> None:
    """The checks on a data set that need neither a model nor the data set library: a local file
    that is missing, empty or of a kind that cannot be read is a :class:`DatasetLoadError`. A name
    that is not a local path is a Hub data set, checked when it is loaded. The commands call this
    before they load the model; :func:`text_rows` calls it too."""
    if dataset is None:
        return
    spec = os.fspath(dataset)
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file() and not path.read_bytes().strip():
            raise DatasetLoadError(f"{path} is empty: put some text in it (one or more lines), or pass another file")
        if path.is_file() and path.suffix.lower() not in KINDS:
            raise DatasetLoadError(
                f"{path}: cannot read a {path.suffix or 'suffix-less'} file; use .txt, .json, .jsonl or .csv"
            )
    elif spec.startswith((".", "/", "~")) or path.suffix.lower() in KINDS:
        raise DatasetLoadError(f"data set {spec}: no such file")


def text_rows(
    dataset: str | os.PathLike | None, split: str, text_column: str, encoding: str = ENCODING
) -> tuple[Iterator[str], str]:
    """The non-empty text rows of the bundled probe, a local file or folder, or a Hub data set.

    A local file is read in ``encoding`` (a file not valid in it: :func:`decode_file`'s error)."""
    import datasets

    codec = check_encoding(encoding)
    datasets.disable_progress_bars()  # ours are the progress bars that matter
    if dataset is None:
        path = text_dir() / TEXT_FILE
        if not path.is_file():
            raise DatasetLoadError(
                f"the bundled text probe {path} is missing: restore data/text/ from the repository, or pass a data set (dataset=)",
                params="dataset",
            )
        ds = datasets.load_dataset("text", data_files=str(path), split="train")
        return _column(ds, "text", "data/text/" + TEXT_FILE), "data/text/" + TEXT_FILE
    check_dataset(dataset)
    spec = os.fspath(dataset)
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file():  # of a kind in KINDS: check_dataset refused the others
            decode_file(path, encoding)  # one clear line, before the loader's traceback
        extra = {} if codec == "utf-8" else {"encoding": codec}
        try:
            if path.is_dir():
                ds = datasets.load_dataset(str(path), split=split, **extra)
            else:
                ds = datasets.load_dataset(KINDS[path.suffix.lower()], data_files=str(path), split="train", **extra)
        except Exception as e:
            raise DatasetLoadError(f"could not read the data set {path}: {_first_line(e)}") from None
        column = "text" if KINDS.get(path.suffix.lower()) == "text" else text_column
        return _column(ds, column, str(path)), str(path)
    name, _, config = spec.partition(":")
    ds = _load_hub_dataset(name, config or None, split)
    return _column(ds, text_column, spec), f"{spec} ({split})"


def _load_hub_dataset(name: str, config: str | None, split: str) -> Any:
    """``datasets.load_dataset(name, config, split=split)``, failing fast when it cannot be had.

    When the Hub cannot be reached, the load runs in offline mode, so a cached copy still loads
    and a missing one fails at once instead of after network retries.
    """
    import datasets

    from interp.models import hub_offline, hub_reachable

    offline = hub_offline()
    reachable = not offline and hub_reachable()
    try:
        with contextlib.nullcontext() if reachable else _offline_mode():
            return datasets.load_dataset(name, config, split=split)
    except Exception as e:  # the loader raises ConnectionError, FileNotFoundError, ValueError, ...
        why = (
            "HF_HUB_OFFLINE is set"
            if offline
            else "the Hugging Face Hub cannot be reached"
            if not reachable
            else "loading failed"
        )
        raise DatasetLoadError(
            f"could not load the data set {name!r}{f' (config {config!r})' if config else ''}, split "
            f"{split!r}: {why}: {type(e).__name__}: {_first_line(e)}. Download it once with network "
            "access, pass a local .txt/.json/.csv file instead, or leave out dataset= to use "
            "the bundled English text; name a config as NAME:CONFIG.",
            params="dataset",
        ) from None


@contextlib.contextmanager
def _offline_mode() -> Iterator[None]:
    """Make ``datasets`` and ``huggingface_hub`` act as under HF_HUB_OFFLINE=1 (they read these flags
    at import, so the environment variable alone would come too late)."""
    import datasets.config
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def _column(ds: Any, column: str, source: str) -> Iterator[str]:
    if column not in ds.column_names:
        raise DatasetLoadError(
            f"{source} has no column {column!r}; its columns are {ds.column_names}: pass one of them as text_column= instead",
            params="text_column",
        )
    return (row for row in ds[column] if isinstance(row, str) and row.strip())


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def tokenize_rows(tokenizer: Any, rows: Iterable[str], budget: int, chunk: int = 256) -> Int[Tensor, " n"]:
    """Token ids of the rows joined by newlines, up to about ``budget`` tokens."""
    ids: list[int] = []
    pending: list[str] = []

    def flush() -> None:
        enc = tokenizer([r.rstrip("\n") + "\n" for r in pending], add_special_tokens=False, verbose=False)
        for row in enc["input_ids"]:
            ids.extend(row)
        pending.clear()

    for row in rows:
        pending.append(row)
        if len(pending) == chunk:
            flush()
            if len(ids) >= budget:
                break
    if pending:
        flush()
    return torch.tensor(ids[:budget], dtype=torch.long)


def byte_ids(data: bytes, vocab: Int[Tensor, " n"]) -> Int[Tensor, " n"]:
    """How a model without a tokenizer (the toy) reads text: byte ``b`` -> ``vocab[b % len(vocab)]``."""
    return vocab[torch.tensor(list(data), dtype=torch.long) % len(vocab)]


def bytes_to_ids(rows: Iterable[str], vocab: Int[Tensor, " n"], budget: int) -> Int[Tensor, " n"]:
    """UTF-8 bytes of the rows joined by newlines, each byte read by :func:`byte_ids`."""
    data = bytearray()
    for row in rows:
        data += (row.rstrip("\n") + "\n").encode("utf-8")
        if len(data) >= budget:
            break
    return byte_ids(bytes(data[:budget]), vocab)


# ---- tokens as people read them ----------------------------------------------------------


@cache
def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2, Llama 3): the printable Latin-1 bytes stand for themselves;
    every other byte, in order, is drawn as the character 256, 257, ..."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    table = {chr(b): b for b in shown}
    others = sorted(set(range(256)) - set(shown))
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


def token_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    """The bytes a token stands for, read from its piece: a byte-level BPE piece (``"\u0120cat"``) or a
    SentencePiece byte (``"<0xE2>"``); ``None`` for any other piece."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if not isinstance(piece, str) or not piece:
        return None
    byte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if byte:
        return bytes([int(byte.group(1), 16)])
    table = _byte_alphabet()
    return bytes(table[c] for c in piece) if all(c in table for c in piece) else None


def shown_text(text: str) -> str:
    """A token's text as every label, table and error shows it: each leading space as
    :data:`SPACE_MARK` (``" Mary"`` is ``"␣Mary"``), newlines, carriage returns and tabs as ``\\n``,
    ``\\r``, ``\\t``; the rest as it is. (Byte-level BPE's own pieces, ``"ĠMary"``, ``"Ċ"``, are
    never shown.)"""
    body = text.lstrip(" ")
    text = SPACE_MARK * (len(text) - len(body)) + body
    return text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def token_label(tokenizer: Any, token_id: int) -> str:
    """The label of one token: its decoded text through :func:`shown_text`; a token holding part of
    one character (a byte of a curly quote or an emoji), which decodes to U+FFFD, shows its bytes
    instead (``"\\xe2\\x80"``, text before them kept)."""
    text = tokenizer.decode([int(token_id)])
    raw = token_bytes(tokenizer, token_id) if "\ufffd" in text else None
    return shown_text(raw.decode("utf-8", errors="backslashreplace") if raw is not None else text)


def token_list(tokenizer: Any, ids: Iterable[int]) -> str:
    """Tokens as an error names them: ``['␣Mary', 's']``."""
    return "[" + ", ".join(f"'{token_label(tokenizer, i)}'" for i in ids) + "]"
