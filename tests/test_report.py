"""The head atlas: roles named only where a score clears the uniform baseline beyond its CI."""

import json
import os
import re

import numpy as np
import pandas as pd
import pytest
from plotly.offline import get_plotlyjs

from interp.config import RunConfig
from interp.errors import OutputError, UsageError
from interp.heads import uniform_baseline
from interp.models import load_model
from interp.probes import repeated_tokens
from interp.report import attention_patterns, head_atlas, role_table, uniform_baselines
from interp.report.build import atlas_sizes
from interp.results import load_result
from interp.scores import HeadScores
from tests.helpers import one_thread


@pytest.fixture(scope="module")
def toy():
    return load_model("toy", device="cpu")


@pytest.fixture(scope="module")
def toy_atlas(toy):
    with one_thread():
        return head_atlas(toy, skip=["pruning"], config=RunConfig(seed=0))


def test_toy_atlas_names_the_known_circuit(toy_atlas):
    assert sorted(toy_atlas.named("induction")) == ["1.0", "1.1", "1.2", "1.3"]
    assert toy_atlas.named("previous-token") == ["0.1"]
    assert toy_atlas.named("duplicate-token") == []
    roles = toy_atlas.roles.set_index("label")["role"]
    assert roles["0.0"] == "" and roles["0.2"] == ""  # 3x the uniform previous-token share, yet under 0.3


def test_random_weight_model_gets_no_role(gpt2_tiny, gpt2_dir, tmp_path):
    with one_thread():
        atlas = head_atlas(
            gpt2_tiny,
            skip=["exact", "gradient", "pruning"],
            sizes=atlas_sizes(batch=6, seq_len=20),
            config=RunConfig(seed=0),
        )
    assert (atlas.roles["role"] == "").all(), atlas.roles[["label", "role"]]
    # the scores are there, near their uniform values: the rule, not missing data, names nothing
    assert abs(atlas.roles["induction"].mean() - atlas.baselines["induction"]) < 0.05
    # a model loaded from a folder is titled by the folder's name, not its full path
    page = atlas.save(tmp_path)[0].read_text()
    assert f"<h1>Head atlas: {gpt2_dir.name}</h1>" in page and f"Head atlas: {gpt2_dir}" not in page


def test_uniform_baselines_match_independent_computations(toy):
    probe = repeated_tokens(toy, batch=3, block_len=20, n_repeats=2, seed=0)
    base = uniform_baselines(probe)
    assert base["induction"] == pytest.approx(uniform_baseline(probe), abs=1e-6)
    # BOS + 40 body tokens, causal: query q (1..40) spreads 1/(q+1) over its keys
    assert base["prev_token"] == pytest.approx(np.mean([1 / (q + 1) for q in range(1, 41)]), abs=1e-6)
    # second repeat (q = 21..40): exactly one earlier copy of its token
    assert base["duplicate"] == pytest.approx(np.mean([1 / (q + 1) for q in range(21, 41)]), abs=1e-6)


def test_role_needs_the_ci_above_the_baseline_not_just_the_point():
    grid = lambda *v: np.array([v])  # noqa: E731
    scores = HeadScores.from_grids(
        {
            "induction": grid(0.5, 0.5, 0.2),
            "induction_lo": grid(0.45, 0.05, 0.15),
            "induction_hi": grid(0.55, 0.9, 0.25),
        }
    )
    table = role_table(scores, {"induction": 0.1})
    assert table["role"].tolist() == ["induction", "", ""]  # wide CI; under the 0.3 floor
    assert role_table(scores, {"induction": 0.1}, threshold=0.1)["role"].tolist() == ["induction", "", "induction"]


def test_patterns_are_the_models_own(toy):
    probe = repeated_tokens(toy, batch=1, block_len=8, n_repeats=2, seed=3)
    pat = attention_patterns(toy, probe.tokens[0])
    _, cache = toy.run_with_cache(probe.tokens)
    for layer in range(pat.shape[0]):
        ref = cache[f"blocks.{layer}.attn.hook_pattern"][0]
        assert np.allclose(pat[layer].numpy(), ref.detach().float().numpy(), atol=1e-6)


def test_atlas_page_is_self_contained_and_preselects_role_heads(toy_atlas, tmp_path):
    paths = toy_atlas.save(tmp_path)
    assert sorted(p.name for p in paths) == ["atlas.html", "atlas.json", "atlas_roles.csv"]
    page = (tmp_path / "atlas.html").read_text()
    js = get_plotlyjs()
    assert page.count(js) == 1  # offline: plotly.js inlined once, and nothing loaded from elsewhere
    assert not re.search(r"<(script|link|img)[^>]*(src|href)=", page.replace(js, ""))
    blob = json.loads(page.split('id="atlas-patterns">', 1)[1].split("</script>", 1)[0])
    assert blob["selected"][:2] == ["1.2", "0.1"] and len(blob["tokens"]) == 25
    table = pd.read_csv(tmp_path / "atlas_roles.csv", dtype={"label": str})
    assert {"exact_importance", "gradient_importance", "first_mass_lo"} <= set(table)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_atlas_loads_back_and_draws_its_figure(toy_atlas, tmp_path):
    from interp.report import Atlas, render_atlas

    toy_atlas.save(tmp_path)
    back = Atlas.load(tmp_path)
    pd.testing.assert_frame_equal(back.roles, toy_atlas.roles, check_dtype=False)
    assert back.table is back.roles and back.baselines == pytest.approx(toy_atlas.baselines)
    assert back.meta == json.loads(json.dumps(toy_atlas.meta)) and back.named("induction") == toy_atlas.named(
        "induction"
    )
    np.testing.assert_allclose(back.grid("induction"), toy_atlas.grid("induction"))
    assert Atlas.load(tmp_path / "atlas.json").named("previous-token") == ["0.1"]
    via = load_result(tmp_path / "atlas.json")
    assert type(via) is Atlas and via.roles.equals(back.roles) and via.named("induction") == back.named("induction")
    panels = [t for t in toy_atlas.figure().data if t.type == "heatmap"]
    assert len(panels) == 7 and np.allclose(panels[3].z, toy_atlas.grid("induction"))  # + copy suppression
    # a loaded atlas has no renderer of its own: its page is drawn when one is passed
    again = tmp_path / "again"
    assert sorted(p.name for p in back.save(again)) == ["atlas.json", "atlas_roles.csv"]
    with pytest.raises(OutputError, match="already holds a saved result: pass overwrite=True"):
        back.save(again, render=render_atlas)  # the library never replaces a saved result unasked
    page = back.save(again, render=render_atlas, overwrite=True)[0].read_text()
    assert page.startswith("<!DOCTYPE html>") and "Scores of every head" in page
    with pytest.raises(UsageError, match="no saved atlas in"):
        Atlas.load(tmp_path / "nowhere")


def test_roles_and_parts_are_registries():
    from interp.parts.table import role_columns
    from interp.report import PARTS, ROLES

    attention = ("induction", "previous-token", "current-token", "duplicate-token", "sink")
    assert ROLES.names()[:5] == attention
    assert ROLES.names()[5:] == ("copy-suppression", "successor", "[CLS]", "[SEP]", "punctuation", "next-token",
                                 "positional", "rare-word")  # fmt: skip
    assert list(role_columns().items())[:5] == [("induction", "induction"), ("prev_token", "previous-token"),
        ("current", "current-token"), ("duplicate", "duplicate-token"), ("first_mass", "sink")]  # fmt: skip
    assert PARTS.names() == (
        "sinks", "exact", "gradient", "pruning", "patterns", "retrieval", "composition", "ov", "encoder", "qk",
        "cards", "headmap", "task",
    )  # fmt: skip
    with pytest.raises(UsageError, match="unknown role 'nope'"):
        ROLES.check("nope")


# ---- what heads write and read: composition, OV roles, encoder heads, head cards -------------------


def test_toy_atlas_reads_what_heads_write_and_read(toy_atlas):
    roles = toy_atlas.roles.set_index("label")
    # every induction head's strongest composition in is K-composition from the previous-token head
    assert all(
        roles.loc[h, "comp_in"] == "0.1 (K)" and roles.loc[h, "comp_in_z"] > 10 for h in toy_atlas.named("induction")
    )
    assert roles.loc["0.1", "comp_out"].endswith("(K)") and pd.isna(
        roles.loc["1.0", "comp_out"]
    )  # the last layer feeds none
    assert {"copy_suppression", "copy_suppression_lo", "entropy", "positional", "rare_word"} <= set(roles.columns)
    assert {"cls", "sep", "punct", "next", "prev", "own", "successor"}.isdisjoint(roles.columns)
    assert toy_atlas.baselines["copy_suppression"] == pytest.approx(10 / 512)
    notes = toy_atlas.meta["notes"]
    assert any(n.startswith("successor: left out: the successor score needs ordinal sequences") for n in notes)
    assert (
        "encoder: next: no query of this probe sees such a key (a causal model never sees the next token), so it is NaN"
        in notes
    )
    card = toy_atlas.cards["1.2"]
    assert card["scores"]["induction"] == roles.loc["1.2", "induction"] and card["composes_in"][0]["src"] == "0.1"
    assert len(card["writes"]) == len(card["suppresses"]) == 8


def test_the_head_card_says_why_each_named_head_attends(toy, toy_atlas):
    """The qk part's pairs on each named head's card: the same numbers qk_attribution gives on the
    part's probe, the toy's known mechanism on top (see the README's QK section)."""
    from interp.parts.roles import QKSizes
    from interp.roles.qk import head_totals, qk_attribution

    sizes = QKSizes()
    probe = repeated_tokens(toy, batch=sizes.batch, block_len=sizes.block_len, n_repeats=2, seed=0)
    for head in toy_atlas.named("induction"):
        why = [r for r in toy_atlas.cards[head]["why_attends"] if r["role"] == "induction"]
        assert [r["rank"] for r in why] == [1, 2, 3] and all(r["at"] == "induction" for r in why)
        assert (why[0]["query"], why[0]["key"]) == ("0.3", "0.1") and (why[1]["query"], why[1]["key"]) == (
            "embed",
            "0.1",
        )
        assert all(r["contrast_lo"] <= r["contrast"] <= r["contrast_hi"] for r in why)
    own = qk_attribution(toy, probe, heads="1.2", at="induction", config=RunConfig(seed=0))
    top = own.top(3)
    got = [r for r in toy_atlas.cards["1.2"]["why_attends"] if r["role"] == "induction"]
    assert [(r["query"], r["key"]) for r in got] == list(zip(top["query"], top["key"]))
    assert [r["contrast"] for r in got] == pytest.approx(top["contrast"].tolist(), rel=1e-9)
    assert got[0]["total"] == pytest.approx(head_totals(own, "1.2")["contrast"], rel=1e-9)
    previous = toy_atlas.cards["0.1"]["why_attends"]
    assert previous[0]["role"] == "previous-token" and (previous[0]["query"], previous[0]["key"]) == (
        "pos_embed",
        "pos_embed",
    )
    assert toy_atlas.cards["0.0"]["why_attends"] == []  # named for no role a target reads


def test_the_qk_part_decomposes_the_strongest_heads_of_a_role_and_says_so(toy, toy_atlas):
    """heads=2: of the toy's 4 induction heads the 2 of highest induction score get pairs, the
    others' cards none, and a note names the cap and how to lift it."""
    from interp.parts.roles import QKSizes

    skip = ["sinks", "exact", "gradient", "pruning", "patterns", "retrieval", "composition", "ov", "encoder"]
    with one_thread():
        capped = head_atlas(toy, skip=skip, sizes={"qk": QKSizes(heads=2)})
    induction = toy_atlas.roles.set_index("label").loc[toy_atlas.named("induction"), "induction"]
    assert len(induction) == 4
    strongest = set(induction.sort_values(ascending=False).index[:2])
    with_pairs = {h for h, c in capped.cards.items() if any(r["role"] == "induction" for r in c["why_attends"])}
    assert with_pairs == strongest
    assert (
        "qk: the 2 strongest of the 4 induction heads (by induction) are decomposed; QKSizes(heads=None) "
        "takes every one (command line: --qk-heads all)" in capped.meta["notes"]
    )
    assert capped.meta["qk"]["heads"] == 2


def test_each_new_part_can_be_skipped(toy):
    with one_thread():
        atlas = head_atlas(
            toy, skip=["sinks", "exact", "gradient", "pruning", "patterns", "composition", "ov", "encoder", "cards"]
        )
    assert {"comp_in", "copy_suppression", "entropy"}.isdisjoint(atlas.roles.columns) and atlas.cards is None
    assert not [n for n in atlas.meta.get("notes", []) if not n.startswith("retrieval:")]
    with one_thread():
        only = head_atlas(toy, skip=["sinks", "exact", "gradient", "pruning", "patterns", "ov", "encoder"])
    assert "comp_in" in only.roles and "copy_suppression" not in only.roles and only.cards["0.0"]["writes"]
    assert only.cards["1.2"]["why_attends"]
    with one_thread():
        without = head_atlas(toy, skip=["sinks", "exact", "gradient", "pruning", "patterns", "ov", "encoder", "qk"])
    assert "why_attends" not in without.cards["1.2"] and without.cards["1.2"]["writes"]


def test_a_model_without_composition_scores_gets_the_rest_and_a_note():
    import interp
    from tests.conformance import build

    hf, tok = build("deepseek_v3")
    model = interp.models.from_hf_model(hf, tok)
    with one_thread():
        atlas = head_atlas(
            model,
            skip=["sinks", "exact", "gradient", "pruning", "patterns", "retrieval", "encoder"],
            sizes=atlas_sizes(batch=2, seq_len=8),
        )
    note = next(n for n in atlas.meta["notes"] if n.startswith("composition: left out: "))
    assert "multi-head latent attention: keys and values come out of one shared" in note
    assert "comp_in" not in atlas.roles and atlas.compositions is None
    assert atlas.cards is not None and all(c.get("composes_in") is None for c in atlas.cards.values())


def test_cards_load_back_and_the_page_holds_them(toy_atlas, tmp_path):
    from interp.report import Atlas

    toy_atlas.save(tmp_path)
    back = Atlas.load(tmp_path)
    assert back.cards["1.2"]["composes_in"][0]["src"] == "0.1"
    assert back.cards["1.2"]["scores"]["induction"] == pytest.approx(toy_atlas.cards["1.2"]["scores"]["induction"])
    page = (tmp_path / "atlas.html").read_text()
    blob = json.loads(page.split('id="atlas-cards">')[1].split("</script>")[0])  # strict JSON: no NaN
    assert set(blob["cards"]) == set(toy_atlas.roles["label"])
    assert "<tr data-head='1.2' tabindex='0'>" in page and 'id="circuits"' in page


# ---- the task part: exact patching and direct logit attribution per head --------------------------

TASK_ONLY = ["sinks", "exact", "gradient", "pruning", "retrieval", "ov", "encoder", "composition", "headmap"]


@pytest.fixture(scope="module")
def task_atlas(toy):
    with one_thread():
        return head_atlas(toy, task="repeat", skip=TASK_ONLY, config=RunConfig(seed=0))


def test_the_task_part_is_patch_heads_and_logit_attribution(toy, task_atlas):
    import interp
    from interp.probes.task import task_probe

    task = task_probe(toy, "repeat", n_pairs=20, seed=0)
    with one_thread():
        patched = interp.patch_heads(toy, task, direction="denoise")
        dla = interp.logit_attribution(toy, task)
    roles = task_atlas.roles.set_index(["layer", "head"])
    for col in ("effect", "effect_lo", "effect_hi"):
        want = patched.table.set_index(["layer", "head"])[col]
        np.testing.assert_allclose(roles[f"patch_{col}"].loc[want.index], want, rtol=1e-6)
    for col in ("dla", "dla_lo", "dla_hi"):
        want = dla.heads.table.set_index(["layer", "head"])[col]
        np.testing.assert_allclose(roles[col].loc[want.index], want, rtol=1e-6)
    t = task_atlas.meta["task"]
    assert (t["name"], t["n_pairs"], t["seq_len"], t["read_position"], t["direction"], t["metric"]) == (
        "repeat", 20, 21, 20, "denoise", "logit-diff"
    )  # fmt: skip
    assert t["clean_metric"] == pytest.approx(patched.meta["clean_metric"]) and t["clean_metric"] > 1


def test_on_the_repeat_task_the_induction_circuit_carries_the_patching_effect(task_atlas):
    """Per head (every position patched at once, denoising): the previous-token head 0.1, whose
    clean output rebuilds the keys every induction head reads, restores the most alone; next come
    the four induction heads, and layer 1 restores more than layer 0. Direct logit attribution puts
    the answer on the induction heads alone: layer 0 writes nothing onto it directly."""
    roles = task_atlas.roles.set_index("label")
    induction = task_atlas.named("induction")
    assert sorted(induction) == ["1.0", "1.1", "1.2", "1.3"] and task_atlas.named("previous-token") == ["0.1"]
    ranked = roles["patch_effect"].sort_values(ascending=False).index.tolist()
    assert ranked[0] == "0.1" and set(ranked[1:5]) == set(induction)
    assert all(roles.loc[h, "patch_effect_lo"] > 0.02 for h in induction)  # each CI clear of 0
    by_layer = task_atlas.roles.groupby("layer")["patch_effect"].sum()
    assert by_layer[1] > by_layer[0] + 0.1
    assert set(roles["dla"].sort_values(ascending=False).index[:4]) == set(induction)
    assert roles.loc[induction, "dla"].min() > 0.3 and roles.loc[["0.0", "0.1", "0.2", "0.3"], "dla"].abs().max() < 0.05
    assert (roles.loc[["0.0", "0.1", "0.2", "0.3"], "dla_lo"] < 0).all()  # CIs reach 0 in layer 0


def test_each_heads_card_holds_its_patching_effect_and_attribution(task_atlas, tmp_path):
    from interp.report import Atlas

    card = task_atlas.cards["1.2"]["scores"]
    row = task_atlas.roles.set_index("label").loc["1.2"]
    assert {k: card[k] for k in ("patch_effect", "patch_effect_lo", "dla", "dla_hi")} == {
        k: row[k] for k in ("patch_effect", "patch_effect_lo", "dla", "dla_hi")
    }
    task_atlas.save(tmp_path)
    page = (tmp_path / "atlas.html").read_text()
    assert 'id="task"' in page and "Which heads matter for the task: repeat" in page and 'id="atlas-task"' in page
    back = Atlas.load(tmp_path)
    np.testing.assert_allclose(back.grid("patch_effect"), task_atlas.grid("patch_effect"))
    assert back.meta["task"] == json.loads(json.dumps(task_atlas.meta["task"]))
    again = tmp_path / "again"
    from interp.report import render_atlas

    assert 'id="atlas-task"' in back.save(again, render=render_atlas)[0].read_text()  # drawn from the table


def test_without_a_task_nothing_of_it_runs(toy, toy_atlas, tmp_path):
    from interp.report.build import atlas_work

    assert "patch_effect" not in toy_atlas.roles and "dla" not in toy_atlas.roles and "task" not in toy_atlas.meta
    assert "patch_effect" not in toy_atlas.cards["1.2"]["scores"]
    assert 'id="task"' not in toy_atlas.save(tmp_path)[0].read_text()
    assert "task" not in atlas_work(toy)
    plan = atlas_work(toy, task=(20, 21))
    assert list(plan)[:2] == ["scores", "task"] and "20 pairs of 21 tokens" in plan["task"][0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"task": "repeat", "skip": ["task"]}, "task= is read by the task part, and skip= leaves it out: drop one"),
        ({"task_pairs": 5}, "task_pairs= sizes the task part, which runs only with a task: give task= or drop it"),
        ({"task": "repeat", "task_pairs": 0}, "task_pairs must be an integer >= 1, got 0"),
        ({"task": "nope"}, "unknown task 'nope'"),
    ],
)
def test_task_arguments_are_checked_before_anything_runs(toy, kwargs, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        head_atlas(toy, **kwargs)


# ---- the map of heads ------------------------------------------------------------------------------


def test_the_head_map_part_is_head_map_on_the_encoder_probe(toy, toy_atlas, tmp_path):
    from interp.probes import text_probe
    from interp.report import Atlas
    from interp.roles import head_map

    want = head_map(toy, text_probe(toy, batch=8, seq_len=32, seed=0), config=RunConfig(seed=0))
    np.testing.assert_allclose(toy_atlas.head_map.distance, want.distance)
    np.testing.assert_allclose(toy_atlas.head_map.coords, want.coords)
    # the four induction heads sit together, apart from layer 0 (as the README says)
    xy = toy_atlas.head_map.coords
    gaps = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
    assert gaps[4:, 4:].max() < 0.5 * gaps[:4, 4:].min()
    toy_atlas.save(tmp_path)
    assert 'id="atlas-headmap"' in (tmp_path / "atlas.html").read_text()
    back = Atlas.load(tmp_path)
    np.testing.assert_allclose(back.head_map.coords, want.coords)
    assert np.isnan(back.head_map.distance).all()  # the distances are not saved
    with one_thread():
        skipped = head_atlas(toy, skip=[p for p in TASK_ONLY if p != "composition"] + ["patterns", "cards"])
    assert skipped.head_map is None
    assert 'id="atlas-headmap"' not in skipped.save(tmp_path / "skipped")[0].read_text()


def test_head_map_labels_never_overlap():
    from interp.roles.encoder import label_room

    x, y = np.array([0.0, 0.001, 1.0, 0.0]), np.array([0.0, 0.0, 1.0, 0.5])
    # 2.2 sits on 0.0's label; 1.0 and the point above are far enough away
    assert label_room(x, y, ["0.0", "2.2", "1.0", "0.3"], [-0.1, 1.1], [-0.1, 1.1], (600, 400)) == [
        True, False, True, True
    ]  # fmt: skip
    assert label_room(np.array([np.nan]), np.array([0.0]), ["0.0"], [0, 1], [0, 1], (100, 100)) == [False]


def test_the_page_shows_the_roles_at_a_glance_apart_from_what_heads_write(toy_atlas, tmp_path):
    page = toy_atlas.save(tmp_path)[0].read_text()
    roles = page.split('<section id="roles">')[1].split("</section>")[0]
    writes = page.split('<section id="circuits">')[1].split("</section>")[0]
    assert "<b>induction heads</b><span>1.2, 1.3, 1.0, 1.1</span>" in roles
    assert "Copy suppression (McDougall et al.)" not in roles and "Copy suppression (McDougall et al.)" in writes
