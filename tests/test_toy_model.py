"""The toy decoder: TransformerLens hook API, weight views, save/load, and SDPA equivalence."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from einops import einsum
from transformer_lens import HookedRootModule

from interp.toy import ToyConfig, ToyTransformer
from interp.toy.model import lm_cross_entropy

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


SMALL = dict(n_layers=2, d_model=32, n_heads=4, n_ctx=64, d_vocab=50)


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return ToyTransformer(ToyConfig(**{**SMALL, **overrides})).eval()


def tokens(batch=3, n=40, d_vocab=50, seed=0):
    t = torch.randint(1, d_vocab, (batch, n), generator=torch.Generator().manual_seed(seed))
    t[:, 0] = 0  # BOS
    return t


def test_is_a_hooked_root_module_with_transformer_lens_names():
    model = build(attn_only=False, d_mlp=64)
    assert isinstance(model, HookedRootModule) and model.tokenizer is None
    names = set(model.hook_dict)
    for name in ["hook_embed", "hook_pos_embed", "ln_final.hook_normalized"]:
        assert name in names
    for layer in range(2):
        for suffix in [
            "hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post",
            "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern",
            "attn.hook_z", "attn.hook_result", "mlp.hook_pre", "mlp.hook_post", "ln1.hook_normalized",
        ]:  # fmt: skip
            assert f"blocks.{layer}.{suffix}" in names
    assert "blocks.0.hook_mlp_out" not in build().hook_dict  # attention-only: no MLP hooks


def test_run_with_cache_shapes_and_residual_bookkeeping():
    model = build(n_key_value_heads=2)
    toks = tokens()
    logits, cache = model.run_with_cache(toks)
    assert logits.shape == (3, 40, 50)
    torch.testing.assert_close(logits, model(toks))  # the cache run took the reference path: same numbers
    assert cache["blocks.1.attn.hook_pattern"].shape == (3, 4, 40, 40)
    assert cache["blocks.1.attn.hook_attn_scores"].shape == (3, 4, 40, 40)
    assert cache["blocks.0.attn.hook_q"].shape == (3, 40, 4, 8)
    assert cache["blocks.0.attn.hook_k"].shape == (3, 40, 2, 8)  # GQA: key/value heads
    assert cache["blocks.0.attn.hook_z"].shape == (3, 40, 4, 8)
    assert cache["blocks.0.attn.hook_result"].shape == (3, 40, 4, 32)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], cache["hook_embed"] + cache["hook_pos_embed"])
    torch.testing.assert_close(
        cache["blocks.1.hook_resid_post"], cache["blocks.1.hook_resid_pre"] + cache["blocks.1.hook_attn_out"]
    )
    torch.testing.assert_close(cache["blocks.0.attn.hook_result"].sum(2), cache["blocks.0.hook_attn_out"])


def test_names_filter_captures_only_what_is_asked():
    model = build()
    _, cache = model.run_with_cache(tokens(), names_filter=lambda name: name.endswith("hook_z"))
    assert sorted(cache.keys()) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]


def test_zeroing_hook_z_silences_a_head():
    model = build()
    toks = tokens()

    def zero_head_1(z, hook):
        z = z.clone()
        z[:, :, 1] = 0
        return z

    _, clean = model.run_with_cache(toks, names_filter="blocks.0.attn.hook_result")
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", zero_head_1)]):
        _, ablated = model.run_with_cache(toks, names_filter=["blocks.0.attn.hook_result", "blocks.0.hook_attn_out"])
    assert ablated["blocks.0.attn.hook_result"][:, :, 1].abs().max() == 0
    torch.testing.assert_close(
        ablated["blocks.0.attn.hook_result"][:, :, 0], clean["blocks.0.attn.hook_result"][:, :, 0]
    )
    torch.testing.assert_close(
        ablated["blocks.0.hook_attn_out"],
        clean["blocks.0.attn.hook_result"].sum(2) - clean["blocks.0.attn.hook_result"][:, :, 1],
    )
    assert not torch.allclose(
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_z", zero_head_1)]), model(toks)
    )
    assert all(not hp.has_hooks() for hp in model.hook_dict.values())  # temporary hooks are gone


def test_editing_the_pattern_changes_the_output():
    model = build()
    toks = tokens()

    def attend_to_bos(pattern, hook):
        new = torch.zeros_like(pattern)
        new[..., 0] = 1
        return new

    edited = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_pattern", attend_to_bos)], return_type=None)
    assert edited is None
    _, cache = model.run_with_cache(toks)
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", attend_to_bos)]):
        _, edited_cache = model.run_with_cache(toks, names_filter="blocks.0.attn.hook_z")
    z = edited_cache["blocks.0.attn.hook_z"]
    torch.testing.assert_close(z, cache["blocks.0.attn.hook_v"][:, :1].expand_as(z))  # every query reads BOS's value


@pytest.mark.parametrize(
    "overrides", [dict(), dict(n_key_value_heads=2), dict(n_key_value_heads=1)], ids=["MHA", "GQA", "MQA"]
)
def test_attention_output_equals_sdpa_on_the_same_weights(overrides):
    """From the cached LayerNorm output and the TL-shaped weights alone: SDPA reproduces hook_attn_out."""
    model = build(**overrides)
    toks = tokens()
    _, cache = model.run_with_cache(toks)
    for layer in range(model.cfg.n_layers):
        x = cache[f"blocks.{layer}.ln1.hook_normalized"]
        q, k, v = (einsum(x, w[layer], "b p m, h m d -> b h p d") for w in (model.W_Q, model.W_K, model.W_V))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = einsum(z, model.W_O[layer], "b h p d, h d m -> b p m") + model.b_O[layer]
        torch.testing.assert_close(out, cache[f"blocks.{layer}.hook_attn_out"], atol=1e-5, rtol=1e-5)


def test_logits_from_tl_shaped_weights():
    model = build()
    toks = tokens()
    _, cache = model.run_with_cache(toks, names_filter="ln_final.hook_normalized")
    logits = cache["ln_final.hook_normalized"] @ model.W_U + model.b_U
    torch.testing.assert_close(logits, model(toks), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.W_E[toks] + model.W_pos[:40], model(toks, stop_at_layer=0))


def test_weight_shapes():
    model = build(n_key_value_heads=2)
    assert model.W_Q.shape == model.W_K.shape == model.W_V.shape == (2, 4, 32, 8)
    assert model.W_O.shape == (2, 4, 8, 32) and model.b_O.shape == (2, 32)
    assert model.W_U.shape == (32, 50) and model.W_E.shape == (50, 32) and model.W_pos.shape == (64, 32)


def test_stop_and_start_at_layer_compose():
    model = build()
    toks = tokens()
    resid_1 = model(toks, stop_at_layer=1)
    _, cache = model.run_with_cache(toks, names_filter="blocks.1.hook_resid_pre")
    torch.testing.assert_close(resid_1, cache["blocks.1.hook_resid_pre"])
    torch.testing.assert_close(model(resid_1, start_at_layer=1), model(toks))
    loss = model(resid_1, start_at_layer=1, tokens=toks, return_type="loss")
    torch.testing.assert_close(loss, model(toks, return_type="loss"))


def test_loss_is_next_token_cross_entropy():
    model = build()
    toks = tokens()
    logits, loss = model(toks, return_type="both")
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 50), toks[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, expected)
    per_token = model(toks, return_type="loss", loss_per_token=True)
    assert per_token.shape == (3, 39)
    torch.testing.assert_close(per_token.mean(), expected)
    torch.testing.assert_close(lm_cross_entropy(logits, toks), expected)


def test_too_long_input_is_refused():
    with pytest.raises(ValueError, match="n_ctx"):
        build()(tokens(n=65))


def test_save_and_load_round_trip(tmp_path):
    model = build(attn_only=False, d_mlp=48, n_key_value_heads=2)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["dtype"] == "float32" and saved["n_key_value_heads"] == 2 and saved["d_mlp"] == 48
    loaded = ToyTransformer.from_pretrained(tmp_path)
    assert not loaded.training and loaded.cfg == model.cfg
    torch.testing.assert_close(loaded(tokens()), model(tokens()))
    half = ToyTransformer.from_pretrained(tmp_path, dtype=torch.float64)
    assert half.W_E.dtype == torch.float64 and half.cfg.dtype == torch.float64


def test_config_json_round_trip_and_tl_fields():
    cfg = ToyConfig(**SMALL, dtype=torch.float16, n_key_value_heads=2)
    again = ToyConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.dtype is torch.float16
    assert cfg.d_head == 8 and cfg.d_mlp is None and cfg.attn_only
    assert cfg.tokenizer_prepends_bos and cfg.default_prepend_bos and cfg.bos_token_id == 0
    assert cfg.attention_dir == "causal" and ToyConfig(causal=False).attention_dir == "bidirectional"
    assert cfg.original_architecture == "ToyTransformer" and cfg.positional_embedding_type == "standard"


def test_bidirectional_and_latent_variants_run():
    encoder = build(causal=False)
    toks = tokens()
    changed = toks.clone()
    changed[:, -1] = (changed[:, -1] % 49) + 1
    assert not torch.allclose(encoder(toks)[:, 0], encoder(changed)[:, 0])  # sees the future
    torch.testing.assert_close(build()(toks)[:, 0], build()(changed)[:, 0])  # causal: does not
    mla = build(d_kv_latent=8)
    _, cache = mla.run_with_cache(toks, names_filter=lambda n: "kv_latent" in n or n.endswith("hook_pattern"))
    assert cache["blocks.0.attn.hook_kv_latent"].shape == (3, 40, 8)
    flash = mla(toks)
    torch.testing.assert_close(
        flash, mla.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: p)])
    )


def test_pattern_hook_from_softmax_matches_manual_scores():
    model = build()
    toks = tokens(batch=1)
    _, cache = model.run_with_cache(toks)
    q, k = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_k"]
    scores = einsum(q, k, "b q h d, b k h d -> b h q k") / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"], scores.softmax(-1))


def test_same_weights_as_a_gpt2_on_the_transformer_lens_bridge():
    """A tiny random HF GPT-2 (attention biases zeroed: the toy has none), its weights copied into
    the toy: the bridge and the toy agree on logits and on the hooks analyses read."""
    from transformer_lens.model_bridge.sources import build_bridge_from_module
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf_cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=64, attn_implementation="eager")
    hf = GPT2LMHeadModel(hf_cfg).eval()
    toy = build(attn_only=False, d_mlp=128, act_fn="gelu_new")
    with torch.no_grad():
        gpt = hf.transformer
        toy.embed.weight.copy_(gpt.wte.weight)
        toy.pos_embed.weight.copy_(gpt.wpe.weight)
        for block, h in zip(toy.blocks, gpt.h):
            h.attn.c_attn.bias.zero_()
            h.attn.c_proj.bias.zero_()
            block.attn.W_qkv.weight.copy_(h.attn.c_attn.weight.T)  # HF Conv1D: [in, out]; [q | k | v]
            block.attn.W_out.weight.copy_(h.attn.c_proj.weight.T)
            for ours, theirs in ((block.ln1, h.ln_1), (block.ln2, h.ln_2)):
                ours.w.copy_(theirs.weight)
                ours.b.copy_(theirs.bias)
            block.mlp.W_in.copy_(h.mlp.c_fc.weight)
            block.mlp.b_in.copy_(h.mlp.c_fc.bias)
            block.mlp.W_out.copy_(h.mlp.c_proj.weight)
            block.mlp.b_out.copy_(h.mlp.c_proj.bias)
        toy.ln_final.w.copy_(gpt.ln_f.weight)
        toy.ln_final.b.copy_(gpt.ln_f.bias)
        toy.unembed.weight.copy_(gpt.wte.weight)  # GPT-2 ties the unembedding to the embedding
        toy.unembed.bias.zero_()
    bridge = build_bridge_from_module(
        hf, "GPT2LMHeadModel", hf_config=hf.config, tokenizer=None, model_name="tiny-gpt2"
    )
    bridge.eval()

    toks = tokens(batch=2, n=20)
    names = ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z", "blocks.1.hook_attn_out", "blocks.1.hook_resid_post"]
    with torch.no_grad():
        bridge_logits, bridge_cache = bridge.run_with_cache(toks, names_filter=names)
        toy_logits, toy_cache = toy.run_with_cache(toks, names_filter=names)
        flash_logits = toy(toks)  # no hooks: the toy's flash path
    torch.testing.assert_close(toy_logits, bridge_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flash_logits, bridge_logits, atol=1e-5, rtol=1e-5)
    for name in names:
        torch.testing.assert_close(toy_cache[name], bridge_cache[name], atol=1e-5, rtol=1e-5)
