"""Shared fixtures: tiny models built in-process (no network, ever)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("INTERP_PNG", "0")  # PNG export is tested on its own (tests/test_browser.py)

import pytest  # noqa: E402
import torch  # noqa: E402

from interp.models import load_model  # noqa: E402
from tests.helpers import save_tiny_bert, save_tiny_gpt2  # noqa: E402


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    return save_tiny_gpt2(tmp_path_factory.mktemp("gpt2-tiny"))


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert-tiny"))


@pytest.fixture(scope="session")
def gpt2_tiny(gpt2_dir):
    return load_model(gpt2_dir, device="cpu")


@pytest.fixture(scope="session")
def bert_tiny(bert_dir):
    return load_model(bert_dir, device="cpu")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
