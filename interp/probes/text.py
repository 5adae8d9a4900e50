"""Text probes: seeded windows of natural text (the bundled English text, a local file or a Hub
data set), framed for the model."""

from __future__ import annotations

import os

import torch

from interp.adapters import HookedModel
from interp.errors import UsageError
from interp.models import describe
from interp.probes.draw import check_fits, check_positive, framed_probe, ordinary_vocab
from interp.probes.probe import TokenProbe
from interp.texts import ENCODING, bytes_to_ids, text_rows, tokenize_rows

_MIN_TEXT_TOKENS = 50_000  # a Hub data set is tokenized up to max(this, 8 x batch x seq_len) tokens


def text_probe(
    model: HookedModel,
    *,
    batch: int = 8,
    seq_len: int = 64,
    seed: int = 0,
    dataset: str | os.PathLike | None = None,
    split: str = "train",
    text_column: str = "text",
    encoding: str = ENCODING,
) -> TokenProbe:
    """``batch`` seeded windows of ``seq_len`` tokens of natural English text, framed for ``model``.

    The text is the bundled ``data/text/sentences.txt`` (self-written, see its README), read with
    ``datasets.load_dataset("text", ...)``; or ``dataset``: a local ``.txt``/``.json``/``.jsonl``/
    ``.csv`` file or folder, or a Hub data set name, optionally ``"name:config"``
    (``"wikitext:wikitext-2-raw-v1"``), of which ``split`` and ``text_column`` are used; a local file
    is read in ``encoding`` (UTF-8 unless given; one that is not valid in it is a one-line
    :class:`DatasetLoadError` naming the byte, see :func:`interp.texts.decode_file`). A Hub data
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
    check_positive(batch=batch, seq_len=seq_len)
    info = describe(model)
    check_fits(
        info,
        seq_len,
        str(seq_len),
        lambda room: f"the longest window is {room}; pass seq_len={room} or less",
        params="seq_len",
    )
    rows, source = text_rows(dataset, split, text_column, encoding)
    tokenizer = getattr(model, "tokenizer", None)
    budget = max(_MIN_TEXT_TOKENS, 8 * batch * seq_len)
    if tokenizer is not None:
        stream, how = tokenize_rows(tokenizer, rows, budget), "tokenizer"
        bad = stream[(stream < 0) | (stream >= info.d_vocab)]
        if len(bad):
            raise UsageError(
                f"the tokenizer produced id {int(bad[0])}, outside the model's vocabulary "
                f"of {info.d_vocab}: model and tokenizer do not match"
            )
    else:
        vocab = ordinary_vocab(info)
        stream, how = bytes_to_ids(rows, vocab, budget), f"utf-8 bytes mod {len(vocab)} ordinary ids"
    if len(stream) < seq_len:
        raise UsageError(
            f"the text from {source} has only {len(stream)} tokens, fewer than "
            f"seq_len={seq_len}: pass seq_len={len(stream)} or less, or a larger data set (dataset=)",
            params=("seq_len", "dataset"),
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
