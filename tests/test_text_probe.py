"""The natural-text probe: bundled English text read with `datasets`, seeded windows, framing."""

import json

import pytest
import torch

from interp.errors import DatasetLoadError
from interp.models import load_model
from interp.probes import TokenProbe, text_probe
from interp.texts import text_dir
from tests.helpers import gpt2_model


def byte_bpe(vocab: int = 300):
    """A byte-level BPE tokenizer learnt in-process from the bundled text (a GPT-2-like tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train([str(text_dir() / "sentences.txt")], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )


@pytest.fixture(scope="module")
def gpt2_text(tmp_path_factory):
    """A tiny GPT-2 whose tokenizer actually covers English text."""
    d = tmp_path_factory.mktemp("gpt2-bpe")
    gpt2_model().save_pretrained(d)
    byte_bpe().save_pretrained(d)
    return load_model(d, device="cpu")


def test_bundled_text_is_small_and_sourced():
    d = text_dir()
    text = (d / "sentences.txt").read_text(encoding="utf-8")
    assert (d / "sentences.txt").stat().st_size < 100_000
    assert sum(text.count(c) for c in ".?!") >= 300  # a few hundred sentences
    assert "written for this project" in (d / "README.md").read_text(encoding="utf-8")


def test_windows_are_seeded_framed_and_real_text(gpt2_text):
    a = text_probe(gpt2_text, batch=4, seq_len=24, seed=3)
    b = text_probe(gpt2_text, batch=4, seq_len=24, seed=3)
    c = text_probe(gpt2_text, batch=4, seq_len=24, seed=4)
    assert isinstance(a, TokenProbe)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)
    assert a.tokens.shape == (4, 1 + 24)
    assert (a.tokens[:, 0] == 0).all() and (a.tokens[:, 1:] != 0).all()  # BOS, then text only
    assert (a.body_start, a.body_end, a.causal) == (1, 25, True)
    assert a.meta["kind"] == "text" and a.meta["source"] == "data/text/sentences.txt"
    assert a.meta["tokenization"] == "tokenizer" and len(a.meta["starts"]) == 4
    text = (text_dir() / "sentences.txt").read_text(encoding="utf-8")
    for row in a.tokens[:, 2:-1]:  # interior tokens decode to a substring of the source text
        assert gpt2_text.tokenizer.decode(row.tolist()) in text


def test_encoder_windows_are_cls_sep_framed(bert_tiny):
    p = text_probe(bert_tiny, batch=2, seq_len=10, seed=0)
    assert not p.causal and p.tokens.shape == (2, 12)
    assert (p.tokens[:, 0] == 2).all() and (p.tokens[:, -1] == 3).all()  # [CLS] ... [SEP]
    assert (p.body_start, p.body_end) == (1, 11)
    assert p.meta["framing"] == ["[CLS]", "[SEP]"]


def test_tokenizer_less_model_maps_bytes_onto_ordinary_ids():
    toy = pytest.importorskip("interp.toy")
    model = toy.ToyTransformer(toy.ToyConfig(n_layers=1, d_model=32, n_heads=2, d_vocab=100, n_ctx=64)).eval()
    p = text_probe(model, batch=3, seq_len=20, seed=1)
    assert p.tokens.shape == (3, 21) and (p.tokens[:, 0] == 0).all()
    assert ((p.tokens[:, 1:] >= 1) & (p.tokens[:, 1:] < 100)).all()  # ordinary ids only
    assert p.meta["tokenization"] == "utf-8 bytes mod 99 ordinary ids"
    # the mapping is the documented one: byte b -> ordinary id number (b mod 99), i.e. 1 + b % 99
    text = (text_dir() / "sentences.txt").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    start = p.meta["starts"][0]
    want = [1 + byte % 99 for byte in data[start : start + 20]]
    assert p.tokens[0, 1:].tolist() == want


def test_local_files_as_dataset(gpt2_text, tmp_path):
    txt = tmp_path / "mine.txt"
    txt.write_text("the cat sat on the mat. " * 20 + "\n\n" + "a dog ran. " * 20 + "\n", encoding="utf-8")
    p = text_probe(gpt2_text, batch=2, seq_len=8, dataset=txt)
    assert p.meta["source"] == str(txt) and p.tokens.shape == (2, 9)
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps({"body": "plain words here. " * 10, "id": i}) for i in range(5)), encoding="utf-8"
    )
    p = text_probe(gpt2_text, batch=2, seq_len=8, dataset=jsonl, text_column="body")
    assert p.tokens.shape == (2, 9)
    with pytest.raises(DatasetLoadError, match=r"has no column 'text'; its columns are \['body', 'id'\]"):
        text_probe(gpt2_text, dataset=jsonl)
    with pytest.raises(DatasetLoadError, match="cannot read a .xyz file"):
        bad = tmp_path / "x.xyz"
        bad.write_text("hello")
        text_probe(gpt2_text, dataset=bad)


def test_hub_dataset_offline_fails_fast_and_clearly(gpt2_text, monkeypatch):
    with pytest.raises(
        ValueError,
        match=r"could not load the data set 'wikitext' \(config 'wikitext-2-raw-v1'\)"
        r", split 'train': HF_HUB_OFFLINE is set",
    ):
        text_probe(gpt2_text, dataset="wikitext:wikitext-2-raw-v1")
    # not offline, but the Hub is unreachable: loads in offline mode (cache only), same clear error
    import interp.models

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(interp.models, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DatasetLoadError, match="the Hugging Face Hub cannot be reached"):
        text_probe(gpt2_text, dataset="someone/no-such-set")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch=0), "batch must be an integer >= 1, got 0"),
        (dict(seq_len=0), "seq_len must be an integer >= 1, got 0"),
        (
            dict(seq_len=300),
            "probe of 301 tokens (BOS + 300) is longer than the model's context of 256 "
            "tokens: the longest window is 255; pass seq_len=255 or less",
        ),
    ],
)
def test_bad_arguments(gpt2_text, kwargs, message):
    with pytest.raises(ValueError) as e:
        text_probe(gpt2_text, **kwargs)
    assert str(e.value) == message


def test_missing_local_file_is_not_taken_for_a_hub_name(gpt2_text, tmp_path):
    with pytest.raises(DatasetLoadError, match="no such file"):
        text_probe(gpt2_text, dataset=tmp_path / "absent.txt")
    with pytest.raises(DatasetLoadError, match="no such file"):
        text_probe(gpt2_text, dataset="notes.jsonl")


def test_text_shorter_than_window(gpt2_text, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("tiny.\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has only .* tokens, fewer than seq_len=64"):
        text_probe(gpt2_text, dataset=short)


def test_every_way_to_give_text_says_the_toy_reads_utf8_bytes():
    """Wherever a user gives text (a command's text flags, the library calls that take texts), the
    help says that the toy, which has no tokenizer, reads it as UTF-8 bytes (issue 25)."""
    import importlib

    import interp
    from interp.cli import COMMANDS

    flags = set()
    for name in COMMANDS:
        for action in importlib.import_module(COMMANDS.get(name)).build_parser()._actions:
            if {"--text", "--text-file", "--dataset"} & set(action.option_strings) or "text" in (action.choices or ()):
                flags.add((name, action.option_strings[0]))
                assert "UTF-8 bytes" in action.help, (name, action.option_strings, action.help)
    assert {("patterns", "--text"), ("patterns", "--text-file"), ("sinks", "--probe"), ("sinks", "--dataset"),
            ("ablate", "--probe"), ("ablate", "--dataset")} <= flags  # fmt: skip
    for call in (TokenProbe.from_texts, interp.probes.probe_from_texts, interp.view_patterns, text_probe):
        assert "UTF-8 bytes" in " ".join(call.__doc__.split()), call.__qualname__
