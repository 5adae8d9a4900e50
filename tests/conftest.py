"""Shared fixtures: tiny models built in-process (no network, ever), one torch thread for the files
that ask for it, and the child pytest that runs Triton kernels under the interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("INTERP_PNG", "0")  # PNG export is tested on its own (tests/test_browser.py)

import pytest  # noqa: E402
import torch  # noqa: E402

from interp.models import load_model  # noqa: E402
from tests.helpers import ROOT, child_env, one_thread, save_tiny_bert, save_tiny_gpt2  # noqa: E402


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


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one CPU thread for a whole test file (``pytestmark = pytest.mark.usefixtures(...)``):
    tiny tensors run as fast, and far faster when other jobs share the CPU."""
    with one_thread():
        yield


@pytest.fixture
def forwards(toy):
    """Count the forward passes through the first block of the module's ``toy`` fixture (a bundled
    toy each file that counts forwards loads itself)."""
    seen = [0]
    handle = toy.blocks[0].register_forward_pre_hook(lambda *a: seen.__setitem__(0, seen[0] + 1))
    yield seen
    handle.remove()


@pytest.fixture
def triton_interpreter():
    """Runs the ``interp_*`` tests of a test file in a child pytest with ``TRITON_INTERPRET=1``.

    The interpreter must be switched on before triton is first imported, so it cannot be turned on
    in this process without leaking into every other test file; the child's tests are skipped here
    (``tests.helpers.INTERPRETING`` is false) and must all pass there, none skipped.
    """

    def run(test_file: str) -> None:
        env = child_env(TRITON_INTERPRET="1", OMP_NUM_THREADS="1")  # small ops: threads only wait
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "interp_", str(Path(test_file))],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-3000:]
        last = child.stdout.splitlines()[-1]
        assert " passed" in child.stdout and "skipped" not in last, child.stdout[-2000:]

    return run
