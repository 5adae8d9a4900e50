"""Tiny models for tests, built in-process with random weights (and a word-level tokenizer)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import torch

VOCAB = 300
ROOT = Path(__file__).resolve().parents[1]  # the repository: what a child process must import from
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"  # this is the Triton interpreter's child run
# GPT2Config's defaults: GPT-2 small (12 layers x 12 heads, d_model 768, vocabulary 50257)
GPT2_SMALL = dict(
    n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab=50257, bos_token_id=50256, eos_token_id=50256
)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment plus ``extra``, with the repository first on ``PYTHONPATH``: a child
    Python started anywhere imports this checkout's ``interp`` and ``tests``."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def word_tokenizer(vocab: int = VOCAB, *, bert: bool = False, special_id: int = 0):
    """A whitespace word-level tokenizer over ``w0 ... w{vocab-1}`` (plus special tokens); for GPT-2
    ``<|endoftext|>`` (BOS, EOS and unknown) takes the id ``special_id`` in place of its word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if bert:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        words = {s: i for i, s in enumerate(specials)}
        words.update({f"w{i}": i for i in range(len(specials), vocab)})
        tk = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
        tk.pre_tokenizer = pre_tokenizers.Whitespace()
        return PreTrainedTokenizerFast(
            tokenizer_object=tk,
            pad_token="[PAD]",
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    words = {"<|endoftext|>": special_id, **{f"w{i}": i for i in range(vocab) if i != special_id}}
    tk = Tokenizer(models.WordLevel(words, unk_token="<|endoftext|>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )


def gpt2_model(
    n_layer: int = 2,
    n_head: int = 4,
    n_embd: int = 64,
    n_positions: int = 256,
    vocab: int = VOCAB,
    seed: int = 0,
    **config,
):
    """A random-weight GPT-2; ``config`` sets further GPT2Config fields (e.g. ``initializer_range``;
    BOS and EOS are token 0 unless it says otherwise)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = {"bos_token_id": 0, "eos_token_id": 0, **config}
    cfg = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions, vocab_size=vocab, **config)
    return GPT2LMHeadModel(cfg).eval()


def gpt2_small(n_layer: int = 12, seed: int = 0):
    """GPT-2 small's architecture (:data:`GPT2_SMALL`) with random weights, ``n_layer`` blocks deep."""
    return gpt2_model(**{**GPT2_SMALL, "n_layer": n_layer}, seed=seed)


def bert_model(vocab: int = VOCAB, seed: int = 0, **config):
    """A random-weight 2-layer BERT; ``config`` sets further BertConfig fields."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_size=64,
        intermediate_size=128,
        max_position_embeddings=256,
        vocab_size=vocab,
        **config,
    )
    return BertForMaskedLM(cfg).eval()


def save_tiny_gpt2(directory: Path, **kw) -> Path:
    """A random-weight 2-layer GPT-2 and its tokenizer, saved as a Hugging Face model directory."""
    gpt2_model(**kw).save_pretrained(directory)
    word_tokenizer(kw.get("vocab", VOCAB)).save_pretrained(directory)
    return Path(directory)


def save_tiny_bert(directory: Path) -> Path:
    bert_model().save_pretrained(directory)
    word_tokenizer(bert=True).save_pretrained(directory)
    return Path(directory)


@contextmanager
def one_thread():
    """Run torch on one CPU thread inside the block: as fast for tiny models, and many times faster
    when other jobs share the CPU (idle threads of a parallel op wait on the busiest core)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def llama_model(
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    n_positions: int = 2048,
    vocab: int = VOCAB,
    seed: int = 0,
):
    """A random-weight Llama-style decoder: rotary positions, grouped K/V heads, RMSNorm, gated MLP."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        num_hidden_layers=n_layers,
        hidden_size=d_model,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        intermediate_size=2 * d_model,
        max_position_embeddings=n_positions,
        vocab_size=vocab,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def save_tiny_llama(directory: Path, **kw) -> Path:
    """:func:`llama_model` and a word-level tokenizer, saved as a Hugging Face model directory."""
    llama_model(**kw).save_pretrained(directory)
    word_tokenizer(kw.get("vocab", VOCAB)).save_pretrained(directory)
    return Path(directory)


def ov_only_model(n_heads: int, name: str = "ov", seed: int = 0):
    """A stand-in with just what the copying score reads: one layer, ``n_heads`` heads, d_model 8,
    d_head 4, vocab 10, ``W_E`` random and ``W_U = W_E^T``; the test sets ``W_V`` and ``W_O``."""

    class Cfg:
        n_layers, d_model, d_head, n_ctx, d_vocab = 1, 8, 4, 16, 10
        causal = True
        bos_token_id = None

    Cfg.n_heads, Cfg.model_name = n_heads, name

    class OV:
        cfg = Cfg()
        tokenizer = None

        def parameters(self):
            return iter([torch.zeros(1)])

    torch.manual_seed(seed)
    m = OV()
    m.W_E = torch.randn(10, 8)
    m.W_U = m.W_E.T.clone()  # unembedding = embedding transposed
    return m
