import json

import pytest
import torch

from interp.models import ModelLoadError, describe, load_model, resolve_device, resolve_dtype


def test_local_directory_loads_a_hooked_bridge(gpt2_tiny):
    info = describe(gpt2_tiny)
    assert (info.n_layers, info.n_heads, info.d_head, info.n_ctx, info.d_vocab) == (2, 4, 16, 256, 300)
    assert info.is_causal and info.bos_token_id == 0
    assert "blocks.1.attn.hook_pattern" in gpt2_tiny.hook_dict


def test_encoder_is_recognised_as_non_causal(bert_tiny):
    info = describe(bert_tiny)
    assert not info.is_causal and info.is_encoder
    assert (info.cls_token_id, info.sep_token_id) == (2, 3)


def test_unknown_hub_name_offline_says_what_to_do():
    with pytest.raises(ModelLoadError) as err:
        load_model("gpt2-definitely-not-cached-xyz")
    msg = str(err.value)
    assert "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in msg
    assert "Download it once with network access" in msg and "pass a local directory" in msg


def test_invalid_name(tmp_path):
    with pytest.raises(ModelLoadError, match="is neither an existing directory nor a valid Hugging Face model name"):
        load_model("gpt 2!")


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory"):
        load_model(str(tmp_path / "nope") + "/")


def test_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="has a config.json but no weights"):
        load_model(tmp_path)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_model(tmp_path)


def test_device_and_dtype_errors():
    with pytest.raises(ValueError, match="unknown device 'gpu7': use cpu, cuda, cuda:N, mps or auto"):
        resolve_device("gpu7")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="this machine has no CUDA device"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve_dtype("float8")
    assert resolve_dtype("bf16") is torch.bfloat16


# --------------------------------------------------------------------------------------------
# GGUF files (the packaged trained models themselves: tests/test_real_models.py)


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        load_model(tmp_path / "absent.gguf", device="cpu")


def _gguf(path, architecture: str) -> None:
    """A tiny valid GGUF file of ``architecture`` holding one float32 tensor."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(str(path), architecture)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("kind", ["architecture", "not a GGUF file"])
def test_gguf_transformers_cannot_read_is_refused_in_one_line(tmp_path, monkeypatch, kind):
    """An architecture transformers' GGUF reader does not know, or bytes that are no GGUF file at all:
    one line that says which file and what to do, and nothing half-written left in the cache."""
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    if kind == "architecture":
        _gguf(path, "rwkv6")
    else:
        pytest.importorskip("gguf")
        path.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError) as e:
        load_model(path, device="cpu")
    msg = str(e.value)
    assert "\n" not in msg and f"transformers cannot read {path}" in msg and "export it again" in msg
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


def test_gguf_without_the_gguf_package_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ModelLoadError, match="needs the gguf package: pip install gguf"):
        load_model(path, device="cpu")


def test_revision_of_a_gguf_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="GGUF file"):
        load_model(tmp_path / "m.gguf", revision="main")
