"""Heads over training (issue 24): checkpoint sweeps over folders, Hub revisions (local stand-ins in a
Hugging Face cache of our own) and the toy trained from scratch; duplicates, roles over time,
handoffs, the phase change, kill -9 then --resume, eviction and the disk check."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp.checkpoints import (
    CheckpointScores,
    Revision,
    ToyTraining,
    checkpoint_scores,
    hub,
    icl_positions,
    parse_revisions,
    sweep,
    train_checkpoints,
    weights_fingerprint,
)
from interp.checkpoints.sweep import sweep_sizes
from interp.cli import checkpoints as cli_checkpoints
from interp.errors import UsageError
from interp.models import load_model
from interp.toy import ToyConfig, ToyTransformer, load_toy
from tests.helpers import ROOT, child_env, save_tiny_gpt2

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PROG = "python -m interp.checkpoints"
SMALL = dict(sizes=sweep_sizes(batch=4, seq_len=8, icl_len=40, icl_batch=4))  # the sweeps' sizes here
SMALL_FLAGS = ["--batch", "4", "--seq-len", "8", "--icl-len", "40", "--icl-batch", "4", "--no-progress"]


def _cli(argv, capsys):
    try:
        code = cli_checkpoints.cli(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------------
# revisions and the in-context score's tokens


def test_revisions_are_read_from_lists_and_ranges_with_the_stop_included():
    assert parse_revisions("step0, step1000") == ["step0", "step1000"]
    assert parse_revisions("0:3000:1000,step512") == ["step0", "step1000", "step2000", "step3000", "step512"]
    assert parse_revisions([0, "step8"]) == ["step0", "step8"]
    with pytest.raises(UsageError, match=r"^cannot read the revision range '0:10': write start:stop:stride"):
        parse_revisions("0:10")
    with pytest.raises(UsageError, match="is empty: it needs start <= stop and a stride >= 1"):
        parse_revisions("10:0:1")


def test_the_in_context_score_reads_olssons_tokens_or_their_scaled_places():
    assert icl_positions(512) == (50, 500) and icl_positions(2048) == (50, 500)
    assert icl_positions(91) == (9, 88)  # 500/512 and a tenth of it, of a 91-token context
    assert icl_positions(256) == (25, 250)


def test_load_model_reads_a_toy_checkpoint_folder_and_refuses_a_revision_of_a_local_or_bundled_model(tmp_path):
    toy = load_toy()
    toy.save_pretrained(tmp_path / "step5")
    back = load_model(tmp_path / "step5", device="cpu")
    assert isinstance(back, ToyTransformer) and weights_fingerprint(back) == weights_fingerprint(toy)
    with pytest.raises(UsageError, match=r"^a revision \('step1'\) names a Hub model's version: .*step5 is a local"):
        load_model(tmp_path / "step5", revision="step1")
    with pytest.raises(UsageError, match=r"^a revision \('step1'\) names a Hub model's version: 'toy' is bundled$"):
        load_model("toy", revision="step1")


# --------------------------------------------------------------------------------------------
# hand-set checkpoints: the induction role moves from head 1.0 to head 1.2


def only_head(layer: int, keep: int) -> ToyTransformer:
    """The bundled toy with the queries of every head of ``layer`` but ``keep`` zeroed: those heads
    attend uniformly, and only ``keep`` stays an induction head."""
    model = load_toy()
    cfg, w = model.cfg, model.blocks[layer].attn.W_qkv.weight
    with torch.no_grad():
        for head in range(cfg.n_heads):
            if head != keep:
                w[head * cfg.d_head : (head + 1) * cfg.d_head] = 0.0
    return model


def save_steps(folder: Path, models: dict[int, ToyTransformer]) -> list[Path]:
    for step, model in models.items():
        model.save_pretrained(folder / f"step{step}")
    return [folder / f"step{s}" for s in models]


@pytest.fixture(scope="module")
def handoff(tmp_path_factory):
    folder = tmp_path_factory.mktemp("handoff")
    models = {0: only_head(1, 0), 10: only_head(1, 0), 20: only_head(1, 2), 30: only_head(1, 2)}
    with torch.no_grad():  # other weights, the same attention: a changed unembedding bias
        models[10].unembed.bias += 0.01
        models[30].unembed.bias += 0.01
    save_steps(folder, models)
    return checkpoint_scores(str(folder / "step*"), **SMALL)


def test_handoff_names_the_step_range_where_the_induction_role_moves_from_1_0_to_1_2(handoff):
    held = handoff.holders()
    induction = held[held["role"] == "induction"]
    assert induction["step"].tolist() == [0, 10, 20, 30]
    assert induction["head"].tolist() == ["1.0", "1.0", "1.2", "1.2"]
    moves = handoff.handoffs()
    assert moves[["role", "from_step", "to_step", "from_head", "to_head"]].values.tolist() == [
        ["induction", 10, 20, "1.0", "1.2"]
    ]
    row = moves.iloc[0]
    table = handoff.table.set_index(["step", "label"])
    assert row["from_head_before"] == table.loc[(10, "1.0"), "induction"] > 0.5
    assert row["to_head_after"] == table.loc[(20, "1.2"), "induction"] > 0.5
    assert row["from_head_after"] < 0.1 and row["to_head_before"] < 0.1  # a silenced head attends uniformly
    firsts = handoff.first_passes()
    induction_firsts = firsts[firsts["role"] == "induction"]
    assert induction_firsts[["head", "step"]].values.tolist() == [["1.0", 0], ["1.2", 20]]
    # layer 0 is untouched: its previous-token head holds its role throughout, with no handoff
    prev = held[held["role"] == "previous-token"]
    assert prev["head"].tolist() == ["0.1"] * 4 and "previous-token" not in set(moves["role"])


def _heads(scores: dict[int, dict[str, tuple[float, float, float]]]) -> pd.DataFrame:
    """A sweep's long table by hand: {step: {head label: (induction, lo, hi)}}."""
    rows = []
    for step, heads in scores.items():
        for label, (score, lo, hi) in heads.items():
            layer, head = map(int, label.split("."))
            rows.append(dict(revision=f"step{step}", step=step, layer=layer, head=head, label=label,
                             induction=score, induction_lo=lo, induction_hi=hi))  # fmt: skip
    return pd.DataFrame(rows)


def test_a_near_tie_inside_the_holders_ci_is_not_a_handoff_a_clear_lead_is():
    from interp.checkpoints import roles

    heads = _heads(
        {
            0: {"1.0": (0.50, 0.45, 0.55), "1.2": (0.49, 0.44, 0.54)},
            10: {"1.0": (0.51, 0.46, 0.56), "1.2": (0.52, 0.47, 0.57)},  # 1.2 leads inside 1.0's CI
            20: {"1.0": (0.50, 0.45, 0.55), "1.2": (0.70, 0.65, 0.75)},  # a clear lead
        }
    )
    base = {"induction": 0.05}
    held = roles.holders(heads, base)
    assert held[held["role"] == "induction"]["head"].tolist() == ["1.0", "1.0", "1.2"]
    moves = roles.handoffs(heads, held)
    assert moves[["from_step", "to_step", "from_head", "to_head"]].values.tolist() == [[10, 20, "1.0", "1.2"]]


def test_every_revision_is_scored_on_the_same_probe_with_cis_and_an_icl_score(handoff):
    t = handoff.table
    assert len(t) == 4 * 8 and set(t["revision"]) == {"step0", "step10", "step20", "step30"}
    for name in ("prev_token", "current", "duplicate", "induction"):
        assert (t[f"{name}_lo"] <= t[name]).all() and (t[name] <= t[f"{name}_hi"]).all()
    assert handoff.meta["probe"] == {"batch": 4, "seq_len": 17, "block_len": 8, "n_repeats": 2}
    assert handoff.meta["icl"]["description"] == (
        "loss at token 39 minus loss at token 4 (Olsson et al.'s 500 and 50 scaled to a 40-token context; "
        "repeated, 4 sequences)"
    )
    icl = handoff.revisions["icl"]
    assert (icl < -2).all()  # the bundled toy's induction heads predict the repeats: a large drop
    revs = handoff.revisions
    assert (revs["icl"] == revs["icl_loss_late"] - revs["icl_loss_early"]).all()


def test_one_revisions_scores_are_a_head_scores_table(handoff):
    grid = handoff.grid("induction", "step20")
    assert grid.shape == (2, 4) and grid[1, 2] > 0.5 > grid[1, 0]
    assert (handoff.at(20).grid("induction") == grid).all()
    with pytest.raises(UsageError, match=r"^no revision 'step5' in this sweep; it has step0, step10, step20, step30$"):
        handoff.at("step5")


def test_the_sink_role_is_read_as_the_atlas_reads_it_and_can_be_left_out(handoff, tmp_path):
    from interp.probes import random_tokens
    from interp.sinks import sink_scores

    model = only_head(1, 2)  # step20's weights
    report = sink_scores(model, random_tokens(model, batch=16, seq_len=64, seed=0))
    at20 = handoff.table[handoff.table["step"] == 20].reset_index(drop=True)
    for column in ("first_mass", "first_mass_lo", "first_mass_hi"):
        assert at20[column].tolist() == report.heads.table[column].tolist()
    assert handoff.baselines["first_mass"] == report.meta["uniform_first_mass"]
    assert "sink" in set(handoff.holders()["role"])
    folders = save_steps(tmp_path, {0: only_head(1, 0)})
    plain = checkpoint_scores([str(f) for f in folders], parts=(), **SMALL)
    assert "first_mass" not in plain.table and "first_mass" not in plain.baselines


def test_save_and_load_give_back_the_same_tables(handoff, tmp_path):
    written = handoff.save(tmp_path)
    assert [p.name for p in written] == ["checkpoints.csv", "checkpoints_revisions.csv", "checkpoints.json"]
    back = CheckpointScores.load(tmp_path)
    pd.testing.assert_frame_equal(back.table, handoff.table, check_exact=True)  # every float bit for bit
    pd.testing.assert_frame_equal(back.revisions, handoff.revisions, check_exact=True)
    pd.testing.assert_frame_equal(back.handoffs(), handoff.handoffs())
    blob = json.loads((tmp_path / "checkpoints.json").read_text())
    assert blob["handoffs"][0]["to_head"] == "1.2"


def test_figure_plots_the_role_holders_over_steps_with_the_icl_score_on_a_shared_axis(handoff):
    fig = handoff.figure()
    names = [trace.name for trace in fig.data]
    roles = [f"{head} {role}" for role, head in handoff.role_heads()]
    assert names == [*roles, "in-context learning score"]
    assert roles[:3] == ["1.0 induction", "1.2 induction", "0.1 previous-token"]
    assert list(fig.data[0].x) == [0, 10, 20, 30] and fig.layout.xaxis.type == "linear"
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"  # one step axis for both rows


def test_steps_spanning_decades_are_log_scaled_with_step_0_at_half_the_first(handoff):
    steps = {0: 0, 10: 10, 20: 1000, 30: 10000}
    table, revisions = handoff.table.copy(), handoff.revisions.copy()
    table["step"], revisions["step"] = table["step"].map(steps), revisions["step"].map(steps)
    fig = CheckpointScores(table, revisions, handoff.meta).figure()
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.type == "log"
    assert list(fig.data[-1].x) == [5, 10, 1000, 10000]
    assert fig.layout.xaxis2.title.text == "training step (log scale; step 0 drawn at half the first step)"


# --------------------------------------------------------------------------------------------
# duplicates


def test_two_checkpoint_folders_holding_the_same_weights_are_flagged_and_left_out(tmp_path):
    toy = only_head(1, 0)
    other = only_head(1, 2)
    folders = save_steps(tmp_path, {100: toy, 200: other, 300: only_head(1, 0)})
    assert weights_fingerprint(toy) == weights_fingerprint(load_model(folders[2], device="cpu"))
    result = checkpoint_scores([str(f) for f in folders], **SMALL)
    revs = result.revisions
    assert revs["duplicate_of"].tolist() == ["step300", "", ""]
    assert revs["weights"][0] == revs["weights"][2] != revs["weights"][1]
    assert result.duplicates[["revision", "duplicate_of"]].values.tolist() == [["step100", "step300"]]
    # left out of the roles: a fake step, not a change (else 1.0 -> 1.2 -> 1.0 would be two handoffs)
    assert result.holders()["step"].unique().tolist() == [200, 300]
    assert result.handoffs()[["from_head", "to_head"]].values.tolist() == [["1.2", "1.0"]]
    assert 100 not in list(result.figure().data[-1].x)


def test_one_model_is_in_memory_at_a_time(tmp_path, monkeypatch):
    import gc
    import weakref

    folders = save_steps(tmp_path, {0: only_head(1, 0), 10: only_head(1, 1), 20: only_head(1, 2)})
    alive_at_load, loaded = [], []
    real = Revision.load

    def load(self, **kw):
        gc.collect()
        alive_at_load.append(sum(ref() is not None for ref in loaded))
        model = real(self, **kw)
        loaded.append(weakref.ref(model))
        return model

    monkeypatch.setattr(Revision, "load", load)
    checkpoint_scores([str(f) for f in folders], **SMALL)
    assert alive_at_load == [0, 0, 0]  # each revision's model is gone before the next one loads


# --------------------------------------------------------------------------------------------
# Hub revisions: local stand-ins in a Hugging Face cache of our own, loaded by load_model(revision=)


def stand_in_cache(cache: Path, name: str, seeds: dict[str, int]) -> Path:
    """A Hugging Face cache holding ``name`` at the revisions ``seeds`` names (refs -> snapshots,
    files as symlinks into blobs, as the Hub client leaves them); equal seeds, equal weights."""
    repo = cache / f"models--{name.replace('/', '--')}"
    for revision, seed in seeds.items():
        commit = hashlib.sha1(revision.encode()).hexdigest()
        staged = save_tiny_gpt2(cache / "staging" / revision, seed=seed)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (repo / "blobs").mkdir(exist_ok=True)
        for file in staged.iterdir():
            blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
            if not blob.exists():
                shutil.copyfile(file, blob)
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / revision).write_text(commit)
    shutil.rmtree(cache / "staging")
    return repo


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("built") / "hub"
    stand_in_cache(cache, "interp-test/tiny", {"step0": 0, "step10": 1, "step20": 0})
    return cache


@pytest.fixture
def hub_cache(built_cache, tmp_path, monkeypatch):
    """A copy of the stand-in cache (a test may evict from it), made the Hugging Face cache."""
    from huggingface_hub import constants

    cache = shutil.copytree(built_cache, tmp_path / "hub", symlinks=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_hub_revisions_load_through_the_cache_one_at_a_time_and_a_served_copy_is_flagged(hub_cache):
    result = checkpoint_scores(model="interp-test/tiny", revisions="0:20:10", **SMALL)
    revs = result.revisions
    assert revs["revision"].tolist() == ["step0", "step10", "step20"] and revs["step"].tolist() == [0, 10, 20]
    # step20 serves step0's weights (as some Pythia revisions serve the final model's): flagged
    assert revs["duplicate_of"].tolist() == ["step20", "", ""]
    direct = load_model("interp-test/tiny", device="cpu", revision="step10")
    assert revs["weights"][1] == weights_fingerprint(direct) != revs["weights"][0]
    assert result.meta["icl"]["data"] == "text"  # a model with a tokenizer: natural text, as Olsson


def test_offline_with_a_revision_not_in_the_cache_is_one_line_and_exit_1(hub_cache, tmp_path, capsys):
    argv = ["--model", "interp-test/tiny", "--revisions", "step0,step30", "--out", str(tmp_path / "o"), *SMALL_FLAGS]
    code, out, err = _cli(argv, capsys)
    assert code == 1
    assert err == (
        f"{PROG}: error: revision 'step30' of model 'interp-test/tiny' is not in the local Hugging Face cache and "
        "HF_HUB_OFFLINE is set. Download it once with network access (e.g. run this command online), or set "
        "HF_HUB_OFFLINE=1 with a cache that holds it, or pass a local directory holding the model and its "
        "tokenizer. Check the spelling too.\n"
    )
    assert "[1/2] step0" in out  # the cached revision was scored (and journaled) before


def test_evict_deletes_each_downloaded_revision_after_scoring(hub_cache, monkeypatch):
    downloaded = {"step10"}  # what this run "downloads": the other revisions were cached before
    monkeypatch.setattr(hub, "is_cached", lambda name, revision: revision not in downloaded)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "download_size", lambda name, revision: 1000)
    repo = hub_cache / "models--interp-test--tiny"
    commit = (repo / "refs" / "step10").read_text()
    result = checkpoint_scores(model="interp-test/tiny", revisions="step0,step10", evict=True, **SMALL)
    assert len(result.revisions) == 2
    assert not (repo / "snapshots" / commit).exists() and not (repo / "refs" / "step10").exists()
    assert (repo / "refs" / "step0").exists()  # cached before the run: kept
    live = {p.resolve() for p in (repo / "snapshots").rglob("*") if p.is_symlink()}
    assert set((repo / "blobs").iterdir()) == live  # step10's own blobs are gone, the shared ones stay


def test_too_little_disk_for_a_download_is_one_line_before_it(hub_cache, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(hub, "is_cached", lambda name, revision: revision != "step10")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(hub, "download_size", lambda name, revision: 3 * 2**30)
    monkeypatch.setattr(hub, "free_bytes", lambda path: 2**30)
    loads = []
    real = Revision.load
    monkeypatch.setattr(Revision, "load", lambda self, **kw: loads.append(self.label) or real(self, **kw))
    argv = ["--model", "interp-test/tiny", "--revisions", "step0,step10", "--out", str(tmp_path / "o"), *SMALL_FLAGS]
    code, _, err = _cli(argv, capsys)
    assert code == 1 and loads == ["step0"]
    assert err == (
        f"{PROG}: error: not enough disk for revision 'step10' of 'interp-test/tiny': it needs 3.0 GiB and "
        f"{hub_cache} has 1.0 GiB free; free some space, point HF_HUB_CACHE at a larger disk, or pass evict=True "
        "(command line: --evict)\n"
    )


# --------------------------------------------------------------------------------------------
# the command line


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model", "gpt2"], "which revisions of gpt2? pass --revisions (step0,step1000 or 0:143000:1000), "
         "or --checkpoints folders, or --model toy-training"),  # fmt: skip
        (["--revisions", "step0"], "--revisions name versions of a Hub model: pass --model NAME (not toy-training)"),
        (["--evict"], "--evict deletes downloaded Hub revisions: it does nothing for local folders"),
        (["--checkpoints", "a", "--every", "5"], "--every sets how toy-training trains: it does nothing for other revisions"),
        (["--n-devices", "2"], "a checkpoint sweep loads one revision at a time on one device: drop --n-devices/--device-map"),
    ],
)  # fmt: skip
def test_flags_that_do_not_go_together_are_refused_with_one_line(flags, message, tmp_path, capsys):
    code, _, err = _cli([*flags, "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and err == f"{PROG}: error: {message}\n"
    assert not (tmp_path / "o").exists()


def test_the_readmes_pythia_command_parses_and_offline_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    import shlex

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # whatever this machine holds

    text = (ROOT / "README.md").read_text()
    start = text.index("interp checkpoints --model EleutherAI/pythia-70m")
    line = text[start : text.index("\n```", start)].replace("\\\n", " ")
    argv = shlex.split(line)[2:]
    args = cli_checkpoints.build_parser().parse_args(argv)
    cli_checkpoints.check(args)
    names = parse_revisions(args.revisions)
    assert len(names) == 154 and names[:3] == ["step0", "step1", "step2"] and names[-1] == "step143000"
    code, _, err = _cli([*argv, "--out", str(tmp_path / "o")], capsys)  # tests never reach the network
    assert code == 1 and err.startswith(f"{PROG}: error: revision 'step0' of model 'EleutherAI/pythia-70m' is not")
    assert len(err.splitlines()) == 1


def test_the_command_is_registered():
    from interp.cli import COMMANDS

    assert COMMANDS.get("checkpoints") == "interp.cli.checkpoints"


# --------------------------------------------------------------------------------------------
# kill -9 in the middle of a sweep, then --resume


def test_kill_9_in_the_middle_of_a_sweep_then_resume_computes_only_the_rest_and_equals_a_whole_run(
    tmp_path, capsys, monkeypatch
):
    folders = save_steps(tmp_path / "ck", {0: only_head(1, 0), 10: only_head(1, 1), 20: only_head(1, 2)})
    flags = ["--checkpoints", str(tmp_path / "ck" / "step*"), *SMALL_FLAGS]
    whole, out = tmp_path / "whole", tmp_path / "out"
    assert _cli([*flags, "--out", str(whole)], capsys)[0] == 0
    journal = out / ".journal" / "checkpoints.jsonl"
    cmd = [sys.executable, "-m", "tests.checkpoints_worker", str(journal), *flags, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("blocked"):
                break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert line == "blocked with 1 revision(s) journaled\n"
    assert sorted(p.name for p in out.iterdir()) == [".interp-checkpoints.lock", ".journal"]

    code, _, err = _cli([*flags, "--out", str(out)], capsys)  # without --resume: refused
    assert code == 2 and err.splitlines()[-1] == (
        f"{PROG}: error: {journal} holds 1 finished unit(s) of an unfinished run with the same arguments, model "
        "and probe: pass --resume to continue it, or --fresh to start over"
    )
    scored = []
    real = sweep._score_revision
    monkeypatch.setattr(sweep, "_score_revision", lambda rev, *a: scored.append(rev.label) or real(rev, *a))
    code, out_text, err = _cli([*flags, "--out", str(out), "--resume"], capsys)
    assert code == 0, err
    assert scored == ["step10", "step20"] and "resuming: 1 of 3 revision(s) already scored" in out_text
    for name in ("checkpoints.csv", "checkpoints_revisions.csv"):
        assert (out / name).read_bytes() == (whole / name).read_bytes()
    a, b = (json.loads((d / "checkpoints.json").read_text()) for d in (whole, out))
    for key in ("rows", "revisions", "handoffs", "first_passes", "phase_change", "meta"):
        assert a[key] == b[key], key
    assert not (out / ".journal").exists() and not (out / ".interp-checkpoints.lock").exists()
    assert len(folders) == 3


# --------------------------------------------------------------------------------------------
# the toy trainer's checkpoints, and the phase change


def test_the_trainer_saves_a_checkpoint_every_few_steps_that_load_model_reads(tmp_path):
    tiny = ToyConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=24, d_vocab=20, attn_only=True)
    plan = ToyTraining(tiny, replace(ToyTraining().train, steps=4, seq_len=24, min_period=3, max_period=8,
                                     probe_half=5, eval_every=4), every=2)  # fmt: skip
    revisions = train_checkpoints(tmp_path, plan)
    assert [r.label for r in revisions] == ["step0", "step2", "step4"]
    first, last = (load_model(r.spec, device="cpu") for r in (revisions[0], revisions[-1]))
    assert isinstance(first, ToyTransformer) and first.cfg.flash_impl == "auto"
    torch.manual_seed(plan.train.seed)
    assert weights_fingerprint(first) == weights_fingerprint(ToyTransformer(tiny))  # the seeded init
    assert weights_fingerprint(first) != weights_fingerprint(last)
    stamp = (tmp_path / "step4" / "model.safetensors").stat().st_mtime_ns
    assert train_checkpoints(tmp_path, plan) == revisions  # a finished training is reused, not redone
    assert (tmp_path / "step4" / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_the_toy_trained_from_scratch_shows_the_phase_change_and_the_detector_names_it(tmp_path):
    result = checkpoint_scores(train_checkpoints(tmp_path / "training"), sizes=sweep_sizes(batch=10, seq_len=20))
    window = result.phase_change()
    assert window is not None
    best = result.table.groupby("step")["induction"].max()
    assert best.loc[window["start"]] < 0.1 < 0.5 < best.loc[window["end"]]
    assert (best.loc[: window["start"]] < 0.1).all()  # flat before the window
    assert window["icl_improvement"] >= 0.5 * abs(window["icl_final"])  # half the in-context gain, in it
    assert (window["start"], window["end"]) == (350, 540)  # seeded: the same window every run
    assert "Phase change (shaded): steps 350-540." in result.page()  # the page over revisions names it too


def test_roles_over_time_use_the_atlas_rule_with_each_roles_own_bar():
    """A positional score of 0.5 clears the common 0.3 but not Voita's 0.9: no holder, no first pass."""
    from interp.checkpoints import roles

    heads = pd.DataFrame(
        {
            "step": [0, 0],
            "revision": ["step0", "step0"],
            "layer": [0, 0],
            "head": [0, 1],
            "label": ["0.0", "0.1"],
            "positional": [0.5, 0.95],
            "positional_lo": [0.45, 0.92],
            "positional_hi": [0.55, 0.97],
        }
    )
    held = roles.holders(heads, {"positional": 0.1})
    assert held.loc[held["role"] == "positional", "head"].tolist() == ["0.1"]
    firsts = roles.first_passes(heads, {"positional": 0.1})
    assert firsts["head"].tolist() == ["0.1"]


@pytest.mark.parametrize("while_stopping", [False, True])
def test_ctrl_c_marks_what_was_written_partial_and_exits_130(tmp_path, capsys, monkeypatch, while_stopping):
    out = tmp_path / "out"

    def interrupted_main(args, out_dir):
        (out_dir / "checkpoints.csv").write_text("half of a table\n")
        if not while_stopping:
            raise KeyboardInterrupt
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("a cleanup failed on the way out")  # noqa: B904 (raised while stopping, on purpose)

    monkeypatch.setattr(cli_checkpoints, "main", interrupted_main)
    code, got, err = _cli(["--model", "toy-training", "--out", str(out), "--no-progress"], capsys)
    assert code == 130
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["checkpoints.partial.csv"]
    assert f"{PROG}: these files were written before the interrupt, marked partial:" in got
    lines = err.strip().splitlines()
    assert lines[0] == f"{PROG}: no revision was scored yet: nothing is journaled, and a rerun starts the sweep over"
    assert lines[-1] == f"{PROG}: interrupted" and "Traceback" not in err
    if while_stopping:
        assert lines[1] == f"{PROG}: while stopping: OSError: a cleanup failed on the way out"


# --------------------------------------------------------------------------------------------
# reruns, other schedules, journals and probes (issue 28)

TINY_TRAINING = ["--train-steps", "4", "--every", "2"]
SWEEP_FLAGS = ["--batch", "2", "--seq-len", "8", "--icl-len", "40", "--icl-batch", "2", "--no-sinks", "--no-progress"]


def test_a_rerun_says_it_reuses_the_checkpoints_and_each_log_names_its_probe(tmp_path, capsys):
    out = tmp_path / "o"
    code, first, _ = _cli(["--out", str(out), *TINY_TRAINING, *SWEEP_FLAGS], capsys)
    assert code == 0
    assert f"training the toy from scratch (seed 0, 4 steps, a checkpoint every 2) into {out / 'training'}" in first
    lines = first.splitlines()
    assert (
        "the training log scores induction on its own probe: BOS + 20 random tokens + the same again, batch 32, seed 2"
        in lines
    )
    sweep_probe = "the sweep scores every revision on one probe: 2 sequences of 17 tokens (1 of framing, then 2 x a block of 8 random tokens), seed 0"  # fmt: skip
    assert lines[lines.index(sweep_probe) + 1].startswith("[1/3] step0 (step 0): best induction score")
    code, again, _ = _cli(["--out", str(out), *TINY_TRAINING, *SWEEP_FLAGS], capsys)
    assert code == 0
    assert f"reusing the toy's checkpoints trained earlier (seed 0, 4 steps, a checkpoint every 2) in {out / 'training'}" in again  # fmt: skip
    assert "training the toy" not in again and "trained in" not in again


def test_another_schedule_replaces_the_step_folders_of_the_last_one(tmp_path):
    """Chosen: the training folder holds this run's schedule only; step folders of another are removed."""
    tiny = ToyConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=24, d_vocab=20, attn_only=True)
    train = replace(ToyTraining().train, steps=4, seq_len=24, min_period=3, max_period=8, probe_half=5, eval_every=4)
    train_checkpoints(tmp_path, ToyTraining(tiny, train, every=2))
    (tmp_path / "notes").mkdir()  # not a step folder: left alone
    train_checkpoints(tmp_path, ToyTraining(tiny, replace(train, steps=3), every=3))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["notes", "step0", "step3"]


def _journal_with(out, n):
    from interp.journal import _line

    journal = out / ".journal" / "checkpoints.jsonl"
    journal.parent.mkdir(parents=True)
    lines = [_line({"journal": 1, "kind": "checkpoints", "fingerprint": {}})]
    journal.write_bytes(b"".join(lines + [_line({"unit": f"step{i}", "payload": {}}) for i in range(n)]))
    return journal


def test_an_unfinished_journal_is_refused_before_the_toy_trains(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    journal = _journal_with(out, 2)
    monkeypatch.setattr(cli_checkpoints, "train_checkpoints", lambda *a, **k: pytest.fail("trained first"))
    code, _, err = _cli(["--out", str(out), *TINY_TRAINING, *SWEEP_FLAGS], capsys)
    assert code == 2
    assert err == (
        f"{PROG}: error: {journal} holds 2 finished unit(s) of an unfinished run: pass --resume to continue it, "
        "or --fresh to start over\n"
    )


@pytest.mark.parametrize("journaled", [0, 2])
def test_ctrl_c_while_training_says_what_the_journal_holds(journaled, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    if journaled:
        _journal_with(out, journaled)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_checkpoints, "train_checkpoints", interrupted)
    code, _, err = _cli(["--out", str(out), *TINY_TRAINING, *SWEEP_FLAGS, "--resume"], capsys)
    assert code == 130
    said = (
        f"2 revision(s) scored so far are journaled in {out / '.journal'}: --resume continues"
        if journaled
        else "no revision was scored yet: nothing is journaled, and a rerun starts the sweep over"
    )
    assert err.splitlines() == [f"{PROG}: {said}", f"{PROG}: interrupted"]


def test_the_library_and_the_command_share_one_default_probe_that_fits_the_trained_toy(tmp_path, capsys):
    assert [sweep.default_block_len(room, 2) for room in (1023, 100, 95, 30)] == [50, 50, 20, 15]
    plan = ToyTraining(train=replace(ToyTraining().train, steps=2), every=2)  # the 96-token toy
    train_checkpoints(tmp_path / "training", plan)
    folders = str(tmp_path / "training" / "step*")
    small = dict(sizes=sweep_sizes(batch=2, icl_len=40, icl_batch=2), parts=())
    result = checkpoint_scores(folders, **small)  # no seq_len: the default rule
    assert result.meta["probe"] == {"batch": 2, "seq_len": 41, "block_len": 20, "n_repeats": 2}
    assert result.meta["settings"]["seq_len"] == 20
    flags = ["--batch", "2", "--icl-len", "40", "--icl-batch", "2", "--no-sinks", "--no-progress"]
    code, _, err = _cli(["--checkpoints", folders, "--out", str(tmp_path / "o"), *flags], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "o" / "checkpoints.json").read_text())["meta"]["probe"] == result.meta["probe"]
