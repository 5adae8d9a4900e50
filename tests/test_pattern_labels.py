"""Token labels in the pattern viewers: a byte-level token that holds part of one character (a curly
quote, an emoji) shows its bytes, never U+FFFD; a leading space shows as "␣" and a newline as "\\n",
never as byte-level BPE's "Ġ" and "Ċ", in every label, table and error (one function)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from interp.config import RunConfig
from interp.report.patterns import token_labels
from interp.texts import _byte_alphabet, token_bytes

TEXT = "She said \u201cyes\u201d \U0001f600."


@pytest.fixture(scope="module")
def bpe():
    from tests.test_text_probe import byte_bpe

    return byte_bpe(300)  # learnt on plain English: curly quotes and emoji stay split into single bytes


def test_the_byte_alphabet_is_byte_level_bpes():
    from tokenizers import pre_tokenizers

    table = _byte_alphabet()
    assert set(table) == set(pre_tokenizers.ByteLevel.alphabet()) and sorted(table.values()) == list(range(256))
    assert table["\u0120"] == ord(" ") and table["a"] == ord("a")


def test_partial_characters_show_their_bytes(bpe):
    ids = bpe(TEXT)["input_ids"]
    decoded = [bpe.decode([i]) for i in ids]
    assert sum("\ufffd" in d for d in decoded) >= 7  # what the viewer showed: 3 + 3 + 4 pieces, each U+FFFD
    labels = token_labels(SimpleNamespace(tokenizer=bpe), ids)
    assert not any("\ufffd" in label for label in labels)
    assert b"".join(token_bytes(bpe, i) for i in ids) == TEXT.encode("utf-8")  # every byte accounted for
    for i, label, text in zip(ids, labels, decoded):
        raw = token_bytes(bpe, i)
        if "\ufffd" in text:  # bytes written out, text around them kept
            assert label == "".join(chr(b) if b < 128 else f"\\x{b:02x}" for b in raw)
        else:
            assert label == text.replace(" ", "\u2423")  # this text's only spaces lead a token
    pieces = [label for label in labels if "\\x" in label]
    assert "".join(pieces).replace("\u2423", "") == "\\xe2\\x80\\x9c\\xe2\\x80\\x9d\\xf0\\x9f\\x98\\x80"


def test_sentencepiece_byte_pieces_are_read_too():
    class Pieces:  # a SentencePiece tokenizer with byte fallback, as far as the labels look
        def convert_ids_to_tokens(self, i):
            return {1: "<0xE2>", 2: "\u2581cat"}[i]

        def decode(self, ids):
            return {1: "\ufffd", 2: " cat"}[ids[0]]

    assert token_labels(SimpleNamespace(tokenizer=Pieces()), [1, 2]) == ["\\xe2", "\u2423cat"]


def test_the_pattern_page_and_figure_label_byte_tokens(bpe, tmp_path):
    from interp.models import load_model
    from interp.report.pattern_figure import pattern_heatmap
    from interp.report.patterns_view import view_patterns
    from tests.helpers import gpt2_model, one_thread

    gpt2_model(vocab=300).save_pretrained(tmp_path)
    bpe.save_pretrained(tmp_path)
    with one_thread():
        model = load_model(str(tmp_path), device="cpu")
        page = view_patterns(model, TEXT, heads=["0.0"])
        ids = model.tokenizer(TEXT, return_tensors="pt")["input_ids"][0]
        fig = pattern_heatmap(model, ids, ["0.0"])
    tokens = page.texts[0]["tokens"]
    assert "\\xe2" in tokens and not any("\ufffd" in t for t in tokens) and "\ufffd" not in page.html
    assert "\\xe2" in "".join(fig.data[0].x) and not any("\ufffd" in x for x in fig.data[0].x)


LINES = "Mary and John went to the store.\nJohn gave a drink to Mary."


def test_spaces_and_newlines_show_as_marks_not_bpe_pieces(bpe):
    from interp.texts import shown_text, token_label, token_list

    assert shown_text(" Mary") == "\u2423Mary" and shown_text("  ") == "\u2423\u2423" and shown_text("a b") == "a b"
    assert shown_text("\n") == "\\n" and shown_text(" \t") == "\u2423\\t"
    ids = bpe(LINES)["input_ids"]
    pieces = bpe.convert_ids_to_tokens(ids)
    assert any(p.startswith("\u0120") for p in pieces) and "\u010a" in "".join(pieces)  # what was shown before
    labels = [token_label(bpe, i) for i in ids]
    assert not any("\u0120" in x or "\u010a" in x for x in labels)
    assert "\u2423and" in labels and "\\n" in "".join(labels)
    assert "".join(labels).replace("\u2423", " ").replace("\\n", "\n") == LINES
    assert token_list(bpe, ids[:2]) == f"['{labels[0]}', '{labels[1]}']"


@pytest.fixture(scope="module")
def bpe_model(bpe, tmp_path_factory):
    from interp.models import load_model
    from tests.helpers import gpt2_model

    folder = tmp_path_factory.mktemp("bpe_model")
    gpt2_model(vocab=300).save_pretrained(folder)
    bpe.save_pretrained(folder)
    return load_model(str(folder), device="cpu")


def test_patching_sinks_and_task_errors_show_the_marks(bpe_model):
    import torch

    from interp.errors import UsageError
    from interp.patching.core import _token_labels
    from interp.probes import TokenProbe
    from interp.probes.task import TaskProbe
    from interp.sinks import sink_scores
    from tests.helpers import one_thread

    ids = bpe_model.tokenizer(LINES)["input_ids"]
    labels = _token_labels(bpe_model, torch.tensor(ids))
    assert "\u2423and" in labels and not any("\u0120" in x or "\u010a" in x for x in labels)
    with one_thread():
        report = sink_scores(
            bpe_model, TokenProbe(torch.tensor([ids, ids]), 0, len(ids), True), config=RunConfig(n_boot=10)
        )
    shown = set(report.tokens["token"])
    assert "\u2423the" in shown and "\\n" in shown and not any("\u0120" in x or "\u010a" in x for x in shown)
    newline = report.tokens[report.tokens["token"] == "\\n"]
    assert newline["role"].tolist() == ["newline"]  # roles still read the text itself
    with pytest.raises(UsageError) as e:
        TaskProbe.from_pairs(bpe_model, ["the store and"], ["the store to"], [" and the"], [" to"])
    assert "the tokenizer splits it as ['\u2423and', '\u2423the']" in str(e.value)
