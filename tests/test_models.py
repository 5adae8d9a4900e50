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
