"""Patching queries, keys, values and patterns: exact patching equals a plain hook loop (one forward
per patch, written here) on the toy with grouped keys and values, tiny GPT-2, Llama (GQA) and BERT,
per head and per position, in both directions; on GQA a key or value head is one unit."""

from __future__ import annotations

import pytest
import torch

from interp.errors import AblationError, UsageError
from interp.hooks import k_hook, pattern_hook, q_hook, v_hook, z_hook
from interp.models import from_hf_model
from interp.patching import patch_heads
from interp.probes.task import TaskProbe
from interp.toy import ToyConfig, ToyTransformer
from tests.helpers import bert_model, gpt2_model, llama_model, word_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HOOKS = {"z": z_hook, "q": q_hook, "k": k_hook, "v": v_hook, "pattern": pattern_hook}
TOL = 1e-5


def _toy_gqa():
    torch.manual_seed(0)
    cfg = ToyConfig(
        n_layers=2, d_model=32, n_heads=4, n_key_value_heads=2, n_ctx=16, d_vocab=60, attn_only=False, d_mlp=64
    )
    return ToyTransformer(cfg).eval()


def _sharp_llama():
    """Llama (GQA: 4 query heads, 2 key/value heads) with larger query and key weights: patterns far
    from uniform, so patching one moves the answer well above the tolerance."""
    hf = llama_model()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(6)
            layer.self_attn.k_proj.weight.mul_(6)
    return from_hf_model(hf, word_tokenizer(), name="llama")


MODELS = {
    "toy-gqa": _toy_gqa,
    "gpt2": lambda: from_hf_model(gpt2_model(initializer_range=0.2), word_tokenizer(), name="gpt2"),
    "llama": _sharp_llama,
    "bert": lambda: from_hf_model(bert_model(initializer_range=0.2), word_tokenizer(bert=True), name="bert"),
}


def pairs(model) -> TaskProbe:
    gen = torch.Generator().manual_seed(0)
    clean, corrupted = [], []
    for _ in range(2):
        ids = (torch.randperm(40, generator=gen)[:7] + 10).tolist()
        clean.append(ids[:5])
        corrupted.append([ids[5], ids[1], ids[6], *ids[3:5]])
    return TaskProbe.from_pairs(model, clean, corrupted, [5, 5], [[7, 8], [7, 8]], name="pairs")


def site_loop(model, task: TaskProbe, site: str, direction: str, by: str) -> torch.Tensor:
    """The raw logit difference per (layer, unit[, position]) averaged over pairs: the donor's
    activation at ``site`` captured, then one ``run_with_hooks`` per patch."""
    run, donor = (task.corrupted, task.clean) if direction == "denoise" else (task.clean, task.corrupted)
    L = 2
    kept = {}  # by layer: on the bridge a hook's own name is its alias's target (attn.q.hook_out)
    with torch.no_grad():
        model.run_with_hooks(
            donor, fwd_hooks=[(HOOKS[site](l), lambda x, hook, l=l: kept.__setitem__(l, x.clone())) for l in range(L)]
        )
    first = kept[0]
    units = first.shape[1] if site == "pattern" else first.shape[2]
    T = run.shape[1]
    out = torch.zeros(L, units, *([T] if by == "position" else []))
    pos = task.read_position
    for l in range(L):
        for u in range(units):
            for p in range(T) if by == "position" else [None]:

                def swap(x, hook, l=l, u=u, p=p):
                    x = x.clone()
                    rows = slice(None) if p is None else p
                    donor_x = kept[l]
                    if site == "pattern":  # [batch, head, q, k]: a query's row
                        x[:, u, rows] = donor_x[:, u, rows]
                    else:  # [batch, pos, head, d]
                        x[:, rows, u] = donor_x[:, rows, u]
                    return x

                with torch.no_grad():
                    logits = model.run_with_hooks(run, fwd_hooks=[(HOOKS[site](l), swap)])
                last = logits[:, pos].float()
                value = (last[:, 5] - last[:, [7, 8]].mean(-1)).mean()
                out[(l, u) if p is None else (l, u, p)] = value
    return out


@pytest.mark.parametrize("site", ["q", "k", "v", "pattern"])
@pytest.mark.parametrize("name", ["toy-gqa", "gpt2", "llama"])
def test_site_patching_equals_a_hook_loop(name, site):
    check_site(name, site)


@pytest.mark.parametrize("site", ["q", "k", "v"])
def test_site_patching_on_bert_equals_a_hook_loop(site):
    check_site("bert", site)


def check_site(name: str, site: str) -> None:
    model = MODELS[name]()
    task = pairs(model)
    for by in ("head", "position"):
        for direction in ("denoise", "noise"):
            s = patch_heads(model, task, site=site, direction=direction, by=by, metric="raw-logit-diff")
            got = torch.as_tensor(s.grid("metric_patched")).float()
            want = site_loop(model, task, site, direction, by)
            if by == "position" and name != "bert":  # after the read position: no change, not run
                want[..., task.read_position + 1 :] = got[..., task.read_position + 1 :]
            assert got.shape == want.shape, (got.shape, want.shape)
            err = float((got - want).abs().max())
            spread = float((want - want.mean()).abs().max())
            assert err <= TOL, f"{name} {site} {direction} by {by}: max error {err:.2e}"
            assert spread > 100 * TOL, f"{name} {site} {direction} by {by}: the patches do not differ"
            assert s.meta["site"] == site and s.meta["replay"] == "fast"


def test_bert_does_not_read_back_its_pattern_hook_so_pattern_patching_is_refused():
    model = MODELS["bert"]()
    with pytest.raises(AblationError, match=r"does not read back what is written into blocks.0.attn.hook_pattern"):
        patch_heads(model, pairs(model), site="pattern", metric="raw-logit-diff")


def test_gqa_keys_are_patched_per_group_and_the_table_says_who_shares_them():
    model = MODELS["llama"]()
    s = patch_heads(model, pairs(model), site="k", metric="raw-logit-diff")
    assert s.kind == "patch_k_head" and s.meta["query_heads_per_unit"] == 2
    assert s.table[["layer", "head", "query_heads"]].values.tolist() == [
        [0, 0, "0 1"],
        [0, 1, "2 3"],
        [1, 0, "0 1"],
        [1, 1, "2 3"],
    ]


def test_sites_are_refused_where_they_do_not_apply(gpt2_tiny):
    model = MODELS["gpt2"]()
    with pytest.raises(
        UsageError, match=r"^method=attribution gates the head outputs \(site z\) and does not read site= \(it applies"
    ):
        patch_heads(model, pairs(model), site="k", method="attribution")
    with pytest.raises(UsageError, match=r"unknown patching site 'o'"):
        patch_heads(model, pairs(model), site="o")


def test_latent_attention_has_no_per_head_keys_to_patch():
    from tests.conformance import build

    hf, tok = build("deepseek_v3", 0)
    model = from_hf_model(hf, tok, name="deepseek_v3")
    with pytest.raises(AblationError, match=r"latent attention computes its keys and values from one latent"):
        patch_heads(model, pairs(model), site="v", metric="raw-logit-diff")
