"""Token probes: seeded repeated-random-token batches that know where their structure lies.

A repeated-token probe is ``[frame] b_1 ... b_n  b_1 ... b_n  ...  [frame]``: a block of ``n``
random tokens drawn from the model's ordinary vocabulary (special tokens excluded), repeated
``n_repeats`` times, framed as the model expects (a BOS for decoders that want one, [CLS] ... [SEP]
for encoders). Within a block tokens are drawn without replacement when the vocabulary allows, so
the only duplicates are the planted repeats and every score has a clean known answer.

The probe knows, for every query position ``q``:

- its previous token ``q - 1``;
- its *duplicates*: other positions holding the same token (earlier ones only, for causal models);
- its *induction targets*: positions ``k`` right after an earlier occurrence of the current token
  (``tokens[k - 1] == tokens[q]``, ``k - 1 < q``); for encoders any other occurrence counts.

These are returned as boolean masks that analyses reduce attention patterns against.

A *text probe* (:func:`text_probe`) is seeded windows of natural English text (the bundled
``data/text/`` or a Hub data set), framed the same way; it has no repeat structure.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp.errors import DatasetLoadError, UsageError
from interp.models import ModelInfo, describe


@dataclass
class TokenProbe:
    """A batch of token sequences plus where their body (non-framing tokens) lies."""

    tokens: Int[Tensor, "batch pos"]
    body_start: int  # first position after the framing prefix (BOS / [CLS])
    body_end: int  # one past the last body position (a trailing [SEP] sits at body_end)
    causal: bool
    special_token_ids: frozenset[int] = frozenset()
    block_len: int | None = None
    n_repeats: int | None = None
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def to(self, device: torch.device | str) -> TokenProbe:
        self.tokens = self.tokens.to(device)
        return self

    def select(self, rows: Sequence[int] | Tensor) -> TokenProbe:
        """The same probe restricted to the sequences ``rows`` (in that order)."""
        index = torch.as_tensor(list(rows) if not isinstance(rows, Tensor) else rows, dtype=torch.long)
        return replace(self, tokens=self.tokens[index.to(self.tokens.device)], meta=dict(self.meta))

    # ---- structural masks -------------------------------------------------------------------

    def _body(self) -> Bool[Tensor, " pos"]:
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        return (pos >= self.body_start) & (pos < self.body_end)

    def _ordinary(self) -> Bool[Tensor, "batch pos"]:
        ordinary = torch.ones_like(self.tokens, dtype=torch.bool)
        for t in self.special_token_ids:
            ordinary &= self.tokens != t
        return ordinary & self._body()

    def prev_query_mask(self) -> Bool[Tensor, "batch pos"]:
        """Queries that have a previous token: every body position (position 0 never)."""
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        return (self._body() & (pos >= 1)).expand(self.batch, -1)

    def duplicate_mask(self) -> Bool[Tensor, "batch q k"]:
        """``[b, q, k]`` is True when ``k != q`` holds the same ordinary token (``k < q`` if causal)."""
        ordinary = self._ordinary()
        same = self.tokens[:, :, None] == self.tokens[:, None, :]
        same &= ordinary[:, :, None] & ordinary[:, None, :]
        n = self.seq_len
        allowed = torch.ones(n, n, dtype=torch.bool, device=self.tokens.device)
        allowed = (
            torch.tril(allowed, diagonal=-1)
            if self.causal
            else allowed & ~torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        )
        return same & allowed

    def induction_mask(self) -> Bool[Tensor, "batch q k"]:
        """``[b, q, k]`` is True when ``k - 1`` is another occurrence of the token at ``q``.

        Equivalently the duplicate mask shifted one key to the right: the head should attend to
        the token that *followed* the earlier occurrence, which is what it will predict.
        """
        dup = self.duplicate_mask()
        target = torch.zeros_like(dup)
        target[:, :, 1:] = dup[:, :, :-1]
        target &= self._ordinary()[:, None, :]  # the target itself must be a body token
        return target

    def second_repeat_mask(self) -> Bool[Tensor, "batch pos"]:
        """Positions whose token already occurred earlier in the sequence (the in-context part)."""
        return self.duplicate_mask().any(-1) if self.causal else self._repeat_index() >= 1

    def _repeat_index(self) -> Int[Tensor, "batch pos"]:
        pos = torch.arange(self.seq_len, device=self.tokens.device)
        if self.block_len is None:
            raise UsageError("this probe has no repeat structure")
        idx = torch.where(self._body(), (pos - self.body_start) // self.block_len, -1)
        return idx.expand(self.batch, -1)


def _check_positive(**kwargs: int) -> None:
    for name, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{name} must be an integer >= 1, got {value!r}")


def ordinary_vocab(info: ModelInfo, tokenizer: Any = None) -> Int[Tensor, " n"]:
    """Token ids a probe may draw: the model's vocabulary less its special tokens."""
    size = info.d_vocab
    if tokenizer is not None:
        size = min(size, len(tokenizer))
    keep = torch.ones(size, dtype=torch.bool)
    for t in info.special_token_ids:
        if 0 <= t < size:
            keep[t] = False
    return keep.nonzero().squeeze(-1)


def frame_tokens(info: ModelInfo) -> tuple[list[int], list[int], list[str]]:
    """The framing a probe body gets: ``(prefix ids, suffix ids, names)``.

    A BOS for decoders that expect one; ``[CLS] ... [SEP]`` for encoders; nothing otherwise.
    """
    if info.is_causal:
        return ([info.bos_token_id], [], ["BOS"]) if info.bos_token_id is not None else ([], [], [])
    prefix, suffix, names = [], [], []
    if info.cls_token_id is not None:
        prefix, names = [info.cls_token_id], ["[CLS]"]
    if info.sep_token_id is not None:
        suffix = [info.sep_token_id]
        names.append("[SEP]")
    return prefix, suffix, names


def repeated_tokens(
    model: Any,
    *,
    batch: int = 10,
    block_len: int = 50,
    n_repeats: int = 2,
    seed: int = 0,
) -> TokenProbe:
    """A seeded batch of ``n_repeats`` copies of ``block_len`` random tokens, framed for ``model``.

    Defaults follow ARENA (batch 10, 50 tokens repeated twice); Olsson et al. used 4 x 25.
    The same seed gives the same tokens on every device.
    """
    _check_positive(batch=batch, block_len=block_len, n_repeats=n_repeats)
    if n_repeats < 2:
        raise UsageError(f"n_repeats must be at least 2 (a block must repeat to be copied), got {n_repeats}")
    info = describe(model)
    _check_fits(
        info,
        block_len * n_repeats,
        f"{n_repeats} x {block_len}",
        lambda room: f"the longest block for {n_repeats} repeats is {room // n_repeats}; lower --seq-len or --repeats",
    )
    block = _draw_blocks(model, info, batch, block_len, seed)
    body = block.repeat(1, n_repeats)
    return framed_probe(
        info,
        body,
        seed=seed,
        block_len=block_len,
        n_repeats=n_repeats,
        meta={"kind": "repeated_tokens", "batch": batch, "block_len": block_len, "n_repeats": n_repeats, "seed": seed},
    )


def random_tokens(model: Any, *, batch: int = 16, seq_len: int = 64, seed: int = 0) -> TokenProbe:
    """Gu et al. (2024)'s sink probe: ``seq_len`` random ordinary tokens per sequence, framed.

    Tokens are drawn uniformly from the ordinary vocabulary, without replacement within a sequence
    when the vocabulary allows (so no token repeats); ``seq_len`` counts body tokens.
    """
    _check_positive(batch=batch, seq_len=seq_len)
    info = describe(model)
    _check_fits(info, seq_len, str(seq_len), lambda room: f"the longest body is {room}; lower --seq-len")
    body = _draw_blocks(model, info, batch, seq_len, seed)
    return framed_probe(
        info, body, seed=seed, meta={"kind": "random_tokens", "batch": batch, "seq_len": seq_len, "seed": seed}
    )


def _check_fits(info: ModelInfo, n_body: int, body: str, longest: Callable[[int], str]) -> None:
    """Raise when ``n_body`` tokens plus the framing exceed the context; ``longest(room)`` is the hint."""
    prefix, suffix, framing = frame_tokens(info)
    total = len(prefix) + n_body + len(suffix)
    if total > info.n_ctx:
        raise UsageError(
            f"probe of {total} tokens ({' + '.join(framing + [body])}) is longer than the model's "
            f"context of {info.n_ctx} tokens: {longest(info.n_ctx - len(prefix) - len(suffix))}"
        )


def _draw_blocks(model: Any, info: ModelInfo, batch: int, n: int, seed: int) -> Int[Tensor, "batch n"]:
    """``batch`` seeded rows of ``n`` ordinary tokens, distinct within a row when the vocabulary allows."""
    vocab = ordinary_vocab(info, getattr(model, "tokenizer", None))
    if len(vocab) < 2:
        raise UsageError("the model's vocabulary has fewer than 2 ordinary tokens to draw from")
    gen = torch.Generator().manual_seed(seed)
    if len(vocab) >= n:
        picks = torch.stack([torch.randperm(len(vocab), generator=gen)[:n] for _ in range(batch)])
    else:  # tiny vocabularies: duplicates inside a block are unavoidable
        picks = torch.randint(len(vocab), (batch, n), generator=gen)
    return vocab[picks]


def framed_probe(info: ModelInfo, body: Int[Tensor, "batch n"], *, meta: dict[str, Any], **fields: Any) -> TokenProbe:
    """Wrap body tokens in the model's framing (:func:`frame_tokens`) as a :class:`TokenProbe`.

    ``meta`` gains ``"framing"`` (the framing's names); ``fields`` are further TokenProbe fields.
    """
    prefix, suffix, framing = frame_tokens(info)
    batch = body.shape[0]
    tokens = torch.cat(
        [
            torch.tensor(prefix, dtype=torch.long).expand(batch, -1),
            body.long().cpu(),
            torch.tensor(suffix, dtype=torch.long).expand(batch, -1),
        ],
        dim=1,
    ).to(info.device)
    return TokenProbe(
        tokens=tokens,
        body_start=len(prefix),
        body_end=len(prefix) + body.shape[1],
        causal=info.is_causal,
        special_token_ids=info.special_token_ids,
        meta={"kind": meta.get("kind"), "framing": framing, **meta},
        **fields,
    )


# --------------------------------------------------------------------------------------------
# natural-text probes

TEXT_FILE = "sentences.txt"
_MIN_TEXT_TOKENS = 50_000  # a Hub data set is tokenized up to max(this, 8 x batch x seq_len) tokens


def text_dir() -> Path:
    """The bundled text probe: $INTERP_DATA_DIR/text, else data/text in this repository."""
    data_dir = os.environ.get("INTERP_DATA_DIR")
    return (Path(data_dir) if data_dir else Path(__file__).resolve().parents[1] / "data") / "text"


def text_probe(
    model: Any,
    *,
    batch: int = 8,
    seq_len: int = 64,
    seed: int = 0,
    dataset: str | os.PathLike | None = None,
    split: str = "train",
    text_column: str = "text",
) -> TokenProbe:
    """``batch`` seeded windows of ``seq_len`` tokens of natural English text, framed for ``model``.

    The text is the bundled ``data/text/sentences.txt`` (self-written, see its README), read with
    ``datasets.load_dataset("text", ...)``; or ``dataset``: a local ``.txt``/``.json``/``.jsonl``/
    ``.csv`` file or folder, or a Hub data set name, optionally ``"name:config"``
    (``"wikitext:wikitext-2-raw-v1"``), of which ``split`` and ``text_column`` are used. A Hub data
    set that is neither cached nor reachable (or not cached while ``HF_HUB_OFFLINE`` is set) raises
    :class:`DatasetLoadError` (a ``ValueError``) at once, without network retries.

    Non-empty rows are joined with newlines into one stream and tokenized with the model's
    tokenizer (no special tokens added). A model without a tokenizer (the toy) gets the UTF-8 bytes
    of the text mapped deterministically onto its ordinary vocabulary: byte ``b`` becomes the
    ``(b mod n)``-th ordinary token id, ``n`` the number of ordinary ids. That keeps the text's
    statistics (frequent letters, spaces, newlines, full stops) though not its meaning.

    ``seq_len`` counts body tokens; the framing (BOS, or ``[CLS] ... [SEP]``) is added around each
    window as :func:`repeated_tokens` does. Window starts are drawn uniformly with a generator
    seeded by ``seed`` (windows may overlap). ``meta`` records ``kind="text"``, the ``source``, the
    tokenization and the window starts.
    """
    _check_positive(batch=batch, seq_len=seq_len)
    info = describe(model)
    _check_fits(info, seq_len, str(seq_len), lambda room: f"the longest window is {room}; lower --seq-len")
    rows, source = _text_rows(dataset, split, text_column)
    tokenizer = getattr(model, "tokenizer", None)
    budget = max(_MIN_TEXT_TOKENS, 8 * batch * seq_len)
    if tokenizer is not None:
        stream, how = _tokenize_rows(tokenizer, rows, budget), "tokenizer"
        bad = stream[(stream < 0) | (stream >= info.d_vocab)]
        if len(bad):
            raise UsageError(
                f"the tokenizer produced id {int(bad[0])}, outside the model's vocabulary "
                f"of {info.d_vocab}: model and tokenizer do not match"
            )
    else:
        vocab = ordinary_vocab(info)
        stream, how = _bytes_to_ids(rows, vocab, budget), f"utf-8 bytes mod {len(vocab)} ordinary ids"
    if len(stream) < seq_len:
        raise UsageError(
            f"the text from {source} has only {len(stream)} tokens, fewer than "
            f"--seq-len {seq_len}: lower --seq-len or use a larger --dataset"
        )
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(stream) - seq_len + 1, (batch,), generator=gen)
    body = stream[starts[:, None] + torch.arange(seq_len)]
    return framed_probe(
        info,
        body,
        seed=seed,
        meta={
            "kind": "text",
            "source": source,
            "split": split,
            "text_column": text_column,
            "tokenization": how,
            "batch": batch,
            "seq_len": seq_len,
            "seed": seed,
            "stream_tokens": len(stream),
            "starts": starts.tolist(),
        },
    )


def _text_rows(dataset: str | os.PathLike | None, split: str, text_column: str) -> tuple[Iterator[str], str]:
    """The non-empty text rows of the bundled probe, a local file or folder, or a Hub data set."""
    import datasets

    datasets.disable_progress_bars()  # ours are the progress bars that matter
    if dataset is None:
        path = text_dir() / TEXT_FILE
        if not path.is_file():
            raise DatasetLoadError(
                f"the bundled text probe {path} is missing: restore data/text/ from the repository, or pass --dataset"
            )
        ds = datasets.load_dataset("text", data_files=str(path), split="train")
        return _column(ds, "text", "data/text/" + TEXT_FILE), "data/text/" + TEXT_FILE
    spec = os.fspath(dataset)
    path = Path(spec).expanduser()
    if path.exists():
        kind = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".csv": "csv"}
        try:
            if path.is_dir():
                ds = datasets.load_dataset(str(path), split=split)
            elif path.suffix.lower() in kind:
                ds = datasets.load_dataset(kind[path.suffix.lower()], data_files=str(path), split="train")
            else:
                raise DatasetLoadError(
                    f"--dataset {path}: cannot read a {path.suffix or 'suffix-less'} "
                    "file; use .txt, .json, .jsonl or .csv"
                )
        except DatasetLoadError:
            raise
        except Exception as e:
            raise DatasetLoadError(f"could not read --dataset {path}: {_first_line(e)}") from None
        column = "text" if kind.get(path.suffix.lower()) == "text" else text_column
        return _column(ds, column, str(path)), str(path)
    if spec.startswith((".", "/", "~")) or path.suffix.lower() in (".txt", ".text", ".json", ".jsonl", ".csv"):
        raise DatasetLoadError(f"--dataset {spec}: no such file")
    name, _, config = spec.partition(":")
    ds = _load_hub_dataset(name, config or None, split)
    return _column(ds, text_column, spec), f"{spec} ({split})"


def _load_hub_dataset(name: str, config: str | None, split: str) -> Any:
    """``datasets.load_dataset(name, config, split=split)``, failing fast when it cannot be had.

    When the Hub cannot be reached, the load runs in offline mode, so a cached copy still loads
    and a missing one fails at once instead of after network retries.
    """
    import datasets

    from interp.models import _hub_reachable

    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    reachable = not offline and _hub_reachable()
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
            "access, pass a local .txt/.json/.csv file as --dataset, or leave --dataset out to use "
            "the bundled English text; name a config as NAME:CONFIG."
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
            f"{source} has no column {column!r}; its columns are {ds.column_names}: pass --text-column"
        )
    return (row for row in ds[column] if isinstance(row, str) and row.strip())


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _tokenize_rows(tokenizer: Any, rows: Iterable[str], budget: int, chunk: int = 256) -> Int[Tensor, " n"]:
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


def _bytes_to_ids(rows: Iterable[str], vocab: Int[Tensor, " n"], budget: int) -> Int[Tensor, " n"]:
    """UTF-8 bytes of the rows joined by newlines, byte ``b`` -> ``vocab[b % len(vocab)]``."""
    data = bytearray()
    for row in rows:
        data += (row.rstrip("\n") + "\n").encode("utf-8")
        if len(data) >= budget:
            break
    raw = torch.tensor(list(data[:budget]), dtype=torch.long)
    return vocab[raw % len(vocab)]
