"""Natural text for probes: read rows from the bundled text, a local file or a Hub data set, and
turn them into token ids (the model's tokenizer, or UTF-8 bytes mapped onto a tokenizer-less model's
ordinary vocabulary)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from interp._io import bundled
from interp.errors import DatasetLoadError

TEXT_FILE = "sentences.txt"
# said wherever a user gives text (command-line help, docstrings): the toy has no tokenizer
BYTES_NOTE = "a model without a tokenizer (the bundled toy) reads text as its UTF-8 bytes, one token a byte"


def text_dir() -> Path:
    """The bundled text probe: $INTERP_DATA_DIR/text, else the installed ``interp.data/text``
    (``data/text`` in a source checkout)."""
    return bundled("text")


def text_rows(dataset: str | os.PathLike | None, split: str, text_column: str) -> tuple[Iterator[str], str]:
    """The non-empty text rows of the bundled probe, a local file or folder, or a Hub data set."""
    import datasets

    datasets.disable_progress_bars()  # ours are the progress bars that matter
    if dataset is None:
        path = text_dir() / TEXT_FILE
        if not path.is_file():
            raise DatasetLoadError(
                f"the bundled text probe {path} is missing: restore data/text/ from the repository, or pass a data set (command line: --dataset)"
            )
        ds = datasets.load_dataset("text", data_files=str(path), split="train")
        return _column(ds, "text", "data/text/" + TEXT_FILE), "data/text/" + TEXT_FILE
    spec = os.fspath(dataset)
    path = Path(spec).expanduser()
    if path.exists():
        kind = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".csv": "csv"}
        if path.is_file() and not path.read_bytes().strip():
            raise DatasetLoadError(f"{path} is empty: put some text in it (one or more lines), or pass another file")
        try:
            if path.is_dir():
                ds = datasets.load_dataset(str(path), split=split)
            elif path.suffix.lower() in kind:
                ds = datasets.load_dataset(kind[path.suffix.lower()], data_files=str(path), split="train")
            else:
                raise DatasetLoadError(
                    f"{path}: cannot read a {path.suffix or 'suffix-less'} file; use .txt, .json, .jsonl or .csv"
                )
        except DatasetLoadError:
            raise
        except Exception as e:
            raise DatasetLoadError(f"could not read the data set {path}: {_first_line(e)}") from None
        column = "text" if kind.get(path.suffix.lower()) == "text" else text_column
        return _column(ds, column, str(path)), str(path)
    if spec.startswith((".", "/", "~")) or path.suffix.lower() in (".txt", ".text", ".json", ".jsonl", ".csv"):
        raise DatasetLoadError(f"data set {spec}: no such file")
    name, _, config = spec.partition(":")
    ds = _load_hub_dataset(name, config or None, split)
    return _column(ds, text_column, spec), f"{spec} ({split})"


def _load_hub_dataset(name: str, config: str | None, split: str) -> Any:
    """``datasets.load_dataset(name, config, split=split)``, failing fast when it cannot be had.

    When the Hub cannot be reached, the load runs in offline mode, so a cached copy still loads
    and a missing one fails at once instead of after network retries.
    """
    import datasets

    from interp.models import hub_reachable

    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
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
            "access, pass a local .txt/.json/.csv file instead, or leave the data set out to use "
            "the bundled English text (command line: --dataset); name a config as NAME:CONFIG."
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
            f"{source} has no column {column!r}; its columns are {ds.column_names}: name one as text_column (command line: --text-column)"
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


def bytes_to_ids(rows: Iterable[str], vocab: Int[Tensor, " n"], budget: int) -> Int[Tensor, " n"]:
    """UTF-8 bytes of the rows joined by newlines, byte ``b`` -> ``vocab[b % len(vocab)]``."""
    data = bytearray()
    for row in rows:
        data += (row.rstrip("\n") + "\n").encode("utf-8")
        if len(data) >= budget:
            break
    raw = torch.tensor(list(data[:budget]), dtype=torch.long)
    return vocab[raw % len(vocab)]
