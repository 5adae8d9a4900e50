"""Long work is never silent and runs the size asked for: every part says its sizes before it starts
and shows its progress, a part that will clearly take much longer than the main part is named up
front (from work sizes, never from timings), the copy distances fit ``--seq-len``, and the atlas's
retrieval part fits GPT-2's context."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import interp.ablation.pruning as pruning_module
from interp.ablation import builtin_metric, pruning_curves
from interp.cli.retrieval import cli as retrieval_cli
from interp.config import RunConfig
from interp.models import ModelInfo, from_hf_model, load_model
from interp.probes import repeated_tokens
from interp.probes.needle import needle_probe
from interp.progress import LONG_WORK, forward_work, lines, long_parts, plan_note
from interp.report import head_atlas
from interp.report.build import atlas_sizes, atlas_work, long_work_note
from interp.retrieval.check import retrieval_plan as _plan
from interp.toy.planted import planted_model
from tests.helpers import GPT2_SMALL, gpt2_model, one_thread, word_tokenizer

NO_ABLATION = ["exact", "gradient", "pruning"]
CIRCUIT_PARTS = ["ov", "encoder", "composition", "qk", "cards", "headmap"]  # what heads write and read


def _gpt2_info(**change) -> ModelInfo:
    """GPT-2 small's shape as :func:`interp.models.describe` reads it (BOS 50256)."""
    shape = dict(
        name="gpt2",
        n_layers=GPT2_SMALL["n_layer"],
        n_heads=GPT2_SMALL["n_head"],
        d_model=GPT2_SMALL["n_embd"],
        d_head=64,
        n_ctx=GPT2_SMALL["n_positions"],
        d_vocab=GPT2_SMALL["vocab"],
        is_causal=True,
        bos_token_id=50256,
        cls_token_id=None,
        sep_token_id=None,
        special_token_ids=frozenset({50256}),
        device=torch.device("cpu"),
    )
    return ModelInfo(**{**shape, **change})


# ---- which parts are clearly much longer: the logic, on work sizes ------------------------------


def test_long_parts_needs_ten_times_the_main_work_and_a_minute_of_work():
    main = LONG_WORK / 10
    work = {"at ten times": 10 * main, "just under": 9.99 * main, "ratio but little work": 1e9}
    assert long_parts(main, work) == {"at ten times": 10.0}
    assert long_parts(1e6, {"ratio but little work": 1e9}) == {}  # 1000x, but far under LONG_WORK


def test_forward_work_counts_weights_attention_and_unembedding():
    assert forward_work(10, 2, 4) == 10 * 2 * 12 * 16
    assert forward_work(10, 2, 4, d_vocab=100, context=50) == 10 * (2 * (12 * 16 + 50 * 4) + 4 * 100)


def test_atlas_on_gpt2_small_names_the_exact_sweep_and_pruning_up_front():
    plan = atlas_work(_gpt2_info())
    assert list(plan) == ["scores", "sinks", "exact", "gradient", "pruning", "ov", "encoder", "composition",
                          "retrieval", "patterns", "headmap", "qk", "cards"]  # fmt: skip
    assert plan["headmap"][0] == "the map of heads (144 heads' patterns on 8 x 33 tokens of text)"
    assert plan["qk"][0] == "why heads attend (QK attribution, 8 x 41 tokens per role)"
    assert "task" not in plan and list(atlas_work(_gpt2_info(), task=(20, 18)))[:2] == ["scores", "task"]
    assert plan["retrieval"][0] == "the retrieval part (needle probe 2 x 1023 tokens, copy distances)"
    assert long_work_note(plan) == (
        "note: the exact sweep (144 heads x 10 sequences of 101 tokens) is about 143x the work of the head "
        "scores (144 heads x 10 sequences of 101 tokens), and the pruning curves (3 orders x 11 steps x 10 "
        "sequences of 101 tokens) about 48x: they will take much longer; skip=['exact', 'pruning'] leaves them "
        "out (command line: --skip exact,pruning)"
    )
    # the OV roles through the factors of F, rows decided early: at most d_head x (d_model + tokens) a column
    assert plan["ov"] == (
        "the OV roles (144 heads x 500 tokens x the vocabulary)",
        144 * 64 * 1268 * 50257 + 500 * 12 * 768**2,
    )
    assert long_work_note(atlas_work(_gpt2_info(), skip=["exact", "pruning", "ov"])) is None
    assert "skip=['exact'] leaves it out (command line: --skip exact)" in long_work_note(
        atlas_work(_gpt2_info(), skip=["pruning", "ov"])
    )


def test_the_toys_atlas_says_nothing_is_long():
    assert long_work_note(atlas_work(load_model("toy", device="cpu"))) is None


def test_retrieval_names_copy_distances_far_beyond_the_probe_up_front():
    model = planted_model(32769)
    probe = needle_probe(model, seq_len=2048, batch=1)
    from interp.models import describe

    info = describe(model)
    hint = lambda parts: "HINT" if parts == ["distance"] else ""  # noqa: E731
    assert plan_note(_plan(info, probe, [16, 64, 256, 1024], 8), hint) is None
    note = plan_note(_plan(info, probe, [16, 64, 256, 1024, 4096, 16384], 8), hint)
    assert note.startswith(
        "note: the copy-distance profile (6 distance(s) of 16, 64, 256, 1024, 4096, 16384 tokens, 2 x 16400 "
        "tokens each) is about "
    )
    assert note.endswith(
        "x the work of the needle probe's scores (1 x 2048 tokens, 3 needle(s) of 8 tokens): it will take much longer; HINT"
    )


# ---- the retrieval command: distances fit --seq-len, every part says its sizes --------------------


def test_copy_distances_default_to_what_fits_seq_len(tmp_path, capsys):
    out = tmp_path / "r"
    with one_thread():
        code = retrieval_cli(
            [
                "--model",
                "planted:4096",
                "--seq-len",
                "300",
                "--batch",
                "1",
                "--engine",
                "stream",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
    assert code == 0
    table = pd.read_csv(out / "retrieval_distance.csv")
    assert sorted(table["distance"].unique()) == [16, 64, 256]  # not 1024, which the context would hold
    err = capsys.readouterr().err
    parts = [line for line in err.splitlines() if line.startswith("retrieval ")]
    assert parts == [
        "retrieval 1/3: the needle probe's scores (1 x 300 tokens, 3 needle(s) of 8 tokens)",
        "retrieval 2/3: the ablation check (up to 3 passes of the needle probe)",
        "retrieval 3/3: the copy-distance profile (3 distance(s) of 16, 64, 256 tokens, 2 x 272 tokens each)",
    ]
    after = err[err.index("retrieval 3/3") :]
    assert "scoring retrieval heads (stream): 6 sequences of 273 tokens, 1 chunk(s) x 2 layers" in after
    assert "scoring retrieval heads (stream): 2/2 (100%)" in after  # its progress, as lines
    assert "note:" not in err


def test_pattern_engine_counts_show_progress(capsys):
    from interp.retrieval import retrieval_counts

    model = planted_model(300)
    with lines():
        retrieval_counts(
            model,
            needle_probe(model, seq_len=200, batch=2),
            window=None,
            config=RunConfig(engine="pattern", progress=True),
        )
    assert "scoring retrieval heads (pattern): 2/2 (100%)" in capsys.readouterr().err


# ---- pruning shows progress, and the atlas ranks by what it has computed ---------------------------


def test_pruning_by_the_exact_order_shows_its_sweep(capsys):
    toy = load_model("toy", device="cpu")
    probe = repeated_tokens(toy, batch=2, block_len=8, seed=0)
    metric = builtin_metric("incontext", probe)
    with one_thread(), lines():
        pruning_curves(toy, probe, metric, orders=["exact"], ablation="mean", config=RunConfig(progress=True))
    err = capsys.readouterr().err
    assert "exact sweep: 8 head set(s) x 2 sequences of 17 tokens" in err  # the order's own sweep
    assert "exact sweep: 2/2 (100%)" in err
    assert "pruning (exact): 8 head set(s) x 2 sequences of 17 tokens" in err


def test_the_atlas_prunes_by_its_own_sweep_without_running_it_again(monkeypatch, capsys):
    toy = load_model("toy", device="cpu")
    skip = ["sinks", "retrieval", "patterns", *CIRCUIT_PARTS]
    with one_thread():
        reference = head_atlas(toy, skip=skip, sizes=atlas_sizes(batch=2, seq_len=8), config=RunConfig(seed=0)).pruning
        monkeypatch.setattr(pruning_module, "exact_sweep", lambda *a, **k: pytest.fail("the exact sweep ran twice"))
        with lines():
            atlas = head_atlas(
                toy, skip=skip, sizes=atlas_sizes(batch=2, seq_len=8), config=RunConfig(seed=0, progress=True)
            )
    pd.testing.assert_frame_equal(atlas.pruning, reference)
    probe = repeated_tokens(toy, batch=2, block_len=8, seed=0)
    metric = builtin_metric("incontext", probe)
    monkeypatch.undo()
    with one_thread():
        alone = pruning_curves(
            toy,
            probe,
            metric,
            orders=["gradient", "exact", "random"],
            random_seeds=(0,),
            ablation="mean",
            config=RunConfig(seed=0),
        )
    pd.testing.assert_frame_equal(atlas.pruning, alone.table)  # the same curves as computed alone
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("atlas ")] == [
        "atlas 1/4: the head scores (8 heads x 2 sequences of 17 tokens)",
        "atlas 2/4: the exact sweep (8 heads x 2 sequences of 17 tokens)",
        "atlas 3/4: gradient importance (2 sequences of 17 tokens)",
        "atlas 4/4: the pruning curves (3 orders x 8 steps x 2 sequences of 17 tokens)",
    ]
    assert "pruning (exact): 8 head set(s) x 2 sequences of 17 tokens" in err
    took = [line for line in err.splitlines() if line.startswith("atlas: ")]  # each part's time as it ends
    assert [line.rsplit(" ", 1)[0] for line in took] == [f"atlas: part {k}/4 took" for k in range(1, 5)]
    assert all(line.endswith("s") and line.rsplit(" ", 1)[1][:-1].isdigit() for line in took)
    assert err.index("atlas: part 1/4 took") < err.index("atlas 2/4:")


# ---- the atlas's retrieval part fits GPT-2's context ----------------------------------------------


def test_the_atlas_runs_retrieval_on_a_1024_position_gpt2():
    hf = gpt2_model(n_layer=1, n_head=2, n_embd=16, n_positions=1024)
    model = from_hf_model(hf, word_tokenizer(), name="gpt2-1024")
    with one_thread():
        atlas = head_atlas(
            model,
            skip=[*NO_ABLATION, "sinks", "patterns", *CIRCUIT_PARTS],
            sizes=atlas_sizes(batch=2, seq_len=8),
            config=RunConfig(seed=0),
        )
    assert not atlas.meta.get("notes")
    assert atlas.retrieval["meta"]["seq_len"] == 1 + 1023  # BOS + the 1023 tokens left
    assert sorted(atlas.retrieval["distance"]["distance"].unique()) == [16, 64, 256]


def test_gates_show_progress_step_by_step_and_say_their_sizes(capsys):
    from interp.ablation import train_gates

    toy = load_model("toy", device="cpu")
    probe = repeated_tokens(toy, batch=2, block_len=8, seed=0)
    with one_thread(), lines():
        train_gates(
            toy,
            probe,
            builtin_metric("incontext", probe),
            lambdas=[0.0, 0.1],
            steps=5,
            ablation="mean",
            config=RunConfig(progress=True),
        )
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "gates: 2 lambda(s) x 5 steps, each a forward and backward of up to 2 x 17 tokens"
    assert err[-1].startswith("gates: 10/10 (100%)")
    assert "gates: 5/10 (50%)" in "\n".join(err)  # a line within a lambda, not only between them


def test_scoring_in_chunks_says_its_sizes(capsys):
    from interp.heads import head_scores

    toy = load_model("toy", device="cpu")
    probe = repeated_tokens(toy, batch=4, block_len=8, seed=0)
    with one_thread(), lines():
        head_scores(toy, probe, config=RunConfig(minibatch=2, progress=True, n_boot=10))
    assert capsys.readouterr().err.splitlines()[0] == "scoring heads: 8 heads x 4 sequences of 17 tokens, 2 chunks"


def test_a_bar_whose_last_update_printed_its_end_does_not_print_it_again():
    import io

    from interp.progress import Lines

    out = io.StringIO()
    bar = Lines(total=2, desc="work", every=0.0, file=out)  # every update prints, the last one too
    bar.update()
    bar.update()
    bar.close()
    assert [line.split(",")[0] for line in out.getvalue().splitlines()] == ["work: 1/2 (50%)", "work: 2/2 (100%)"]


# ---- the OV roles and the roles command: sizes first, then progress --------------------------------


def test_the_ov_roles_say_their_sizes_and_show_progress(capsys):
    from interp.roles import ov_scores

    toy = load_model("toy", device="cpu")
    with one_thread(), lines():
        ov_scores(toy, ["copy_suppression"], config=RunConfig(n_boot=10, progress=True))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "copy suppression: 8 heads x 500 tokens x 512 vocabulary, in blocks of 1024"
    assert err[-1].startswith("copy suppression: 2/2 (100%)")


def test_roles_names_each_part_with_its_sizes_as_it_starts(tmp_path, capsys):
    from interp.cli.roles import cli as roles_cli

    argv = ["--out", str(tmp_path / "r"), "--task", "repeat", "--batch", "2", "--n-random", "10", "--device", "cpu"]
    with one_thread():
        assert roles_cli([*argv, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("roles ")] == [
        "roles 1/5: direct logit attribution (task repeat: 2 prompts of 21 tokens)",
        "roles 2/5: the composition scores (8 x 8 head pairs, Q/K/V)",
        "roles 3/5: the OV roles (8 heads x 500 tokens x the vocabulary)",
        "roles 4/5: the encoder-head scores (2 x 33 tokens of text)",
        "roles 5/5: the map of heads (8 heads' patterns on 2 x 33 tokens of text)",
    ]
    after = err[err.index("roles 2/5") :]
    assert "composition: 8 x 8 head pairs x 3 kind(s), 10 random pairs per baseline" in after
    assert "composition: 3/3 (100%)" in after
    assert "copy suppression: 8 heads x 500 tokens x 512 vocabulary, in blocks of 1024" in after
    assert "copy suppression: 2/2 (100%)" in err[err.index("roles 3/5") :]
