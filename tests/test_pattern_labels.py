"""Token labels in the pattern viewers: a byte-level token that holds part of one character (a curly
quote, an emoji) shows its bytes, never U+FFFD."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from interp.report.patterns import _byte_alphabet, token_bytes, token_labels

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
            assert label == text
    pieces = [label for label in labels if "\\x" in label]
    assert "".join(pieces).replace(" ", "") == "\\xe2\\x80\\x9c\\xe2\\x80\\x9d\\xf0\\x9f\\x98\\x80"


def test_sentencepiece_byte_pieces_are_read_too():
    class Pieces:  # a SentencePiece tokenizer with byte fallback, as far as the labels look
        def convert_ids_to_tokens(self, i):
            return {1: "<0xE2>", 2: "\u2581cat"}[i]

        def decode(self, ids):
            return {1: "\ufffd", 2: " cat"}[ids[0]]

    assert token_labels(SimpleNamespace(tokenizer=Pieces()), [1, 2]) == ["\\xe2", " cat"]


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
