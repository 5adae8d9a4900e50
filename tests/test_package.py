"""The package as users meet it: one lazy public API, the `interp` command, clear refusals of bad
output folders (before any model loads), bugs that keep their traceback, and result objects that
save and load back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import interp
import interp.cli.common
from interp.cli import main as interp_main
from interp.cli.induction import cli as induction_cli
from interp.errors import InterpError, ModelLoadError, UsageError

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_import_interp_is_lazy_and_gives_the_public_api():
    child = _python(
        "import sys, interp\n"
        "assert 'torch' not in sys.modules, 'import interp loaded torch'\n"
        "interp.head_scores, interp.exact_sweep\n"
        "assert 'torch' in sys.modules\n"
    )
    assert child.returncode == 0, child.stderr
    import interp.ablation
    import interp.heads

    assert interp.head_scores is interp.heads.head_scores
    assert interp.exact_sweep is interp.ablation.exact_sweep
    for name in interp.__all__:
        assert getattr(interp, name) is not None, name
    wanted = {"load_model", "from_hf_model", "repeated_tokens", "random_tokens", "text_probe", "TokenProbe",
              "head_scores", "HeadScores", "sink_scores", "ablated", "exact_sweep", "gradient_importance",
              "pruning_curve", "pruning_curves", "train_gates", "heatmap"}  # fmt: skip
    assert wanted <= set(interp.__all__)
    with pytest.raises(AttributeError, match="module 'interp' has no attribute 'no_such_name'"):
        interp.no_such_name  # noqa: B018


def test_every_error_shares_one_base():
    from interp.errors import AblationError, DatasetLoadError, MetricError, NonFiniteAttentionError, OutputError

    for error in (UsageError, ModelLoadError, OutputError, DatasetLoadError, NonFiniteAttentionError, AblationError,
                  MetricError):  # fmt: skip
        assert issubclass(error, InterpError)


def test_console_command_lists_and_dispatches(tmp_path, capsys):
    assert interp_main(["--help"]) == 0
    assert "commands:" in capsys.readouterr().out
    assert interp_main(["nope"]) == 2
    assert "interp: error: unknown command 'nope': choose from induction, sinks, ablate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        interp_main(["induction", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: interp induction")
    out = tmp_path / "toy"
    assert interp_main(["induction", "--out", str(out), "--batch", "2", "--no-progress"]) == 0
    assert (out / "induction.csv").is_file()


@pytest.mark.parametrize(
    "make_out, message",
    [
        (lambda tmp: tmp / "file", "--out {out} exists and is not a directory: pass a folder path"),
        (lambda tmp: tmp / "file" / "x", "cannot create output folder {out}: {tmp}/file is a file; pass another --out"),
    ],
    ids=["is-a-file", "under-a-file"],
)
def test_bad_out_is_refused_before_the_model_loads(make_out, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("x")
    out = make_out(tmp_path)
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:
        induction_cli(["--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"python -m interp.induction: error: {message.format(out=out, tmp=tmp_path)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (a folder no one can write in)")
def test_unwritable_out_is_refused_even_for_root(monkeypatch, capsys):
    """Permission bits are no proof (root passes access()): the folder is really tried."""
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:
        induction_cli(["--out", "/proc/interp-nope/x"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith("python -m interp.induction: error: cannot write to output folder /proc/interp-nope/x: ")
    assert err.endswith("; pass a writable --out\n") and err.count("\n") == 1


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    """Only InterpError means bad input (exit 2); anything else is a bug and must not look like one."""
    import interp.cli.induction as command

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(command, "head_scores", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        induction_cli(["--out", str(tmp_path / "o"), "--batch", "2", "--no-progress"])
    assert not (tmp_path / "o").exists()


# ---- probes from the user's own tokens and texts ---------------------------------------------------


@pytest.fixture(scope="module")
def toy():
    return interp.load_model("toy", device="cpu")


def test_probe_from_tokens_scores_like_the_builtin_probe(toy):
    builtin = interp.repeated_tokens(toy, batch=4, block_len=20, seed=3)
    mine = interp.TokenProbe.from_tokens(toy, builtin.tokens[:, 1:])  # the body; the BOS is added
    assert torch.equal(mine.tokens, builtin.tokens)
    framed = interp.TokenProbe.from_tokens(toy, builtin.tokens, framed=True)
    assert torch.equal(framed.tokens, builtin.tokens)
    a = interp.head_scores(toy, builtin, copying=False).table
    b = interp.head_scores(toy, mine, copying=False).table
    for col in ("prev_token", "duplicate", "induction"):
        np.testing.assert_allclose(a[col], b[col], atol=1e-6)
    assert b.loc[b["layer"] == 1, "induction"].max() > 0.8  # the toy's induction heads, on the user's ids


def test_probe_from_tokens_refuses_bad_ids(toy):
    body = torch.arange(1, 9)
    with pytest.raises(UsageError, match="tokens must be integer token ids, got dtype torch.float32"):
        interp.TokenProbe.from_tokens(toy, body.float())
    with pytest.raises(
        UsageError, match=r"tokens must be \[batch, pos\] \(or \[pos\]\) token ids, got shape \(1, 2, 8\)"
    ):
        interp.TokenProbe.from_tokens(toy, body[None, None].expand(1, 2, 8))
    vocab = interp.describe(toy).d_vocab
    with pytest.raises(UsageError, match=f"token id {vocab} is outside the model's vocabulary of {vocab}"):
        interp.TokenProbe.from_tokens(toy, torch.tensor([1, 2, vocab]))
    with pytest.raises(
        UsageError, match=r"framed=True, but the sequences are not framed as this model expects \(BOS\)"
    ):
        interp.TokenProbe.from_tokens(toy, body, framed=True)


def test_probe_from_texts_on_a_tokenizer_model(gpt2_tiny):
    texts = ["w5 w6 w7 w8 w5 w6 w7 w8", "w9 w10 w11 w12 w9 w10 w11 w12 w13"]
    with pytest.warns(UserWarning, match=r"the texts have 8 to 9 tokens; each is cut to the shortest \(8\)"):
        probe = interp.TokenProbe.from_texts(gpt2_tiny, texts)
    assert probe.tokens.tolist() == [[0, 5, 6, 7, 8, 5, 6, 7, 8], [0, 9, 10, 11, 12, 9, 10, 11, 12]]
    # the second half repeats the first: every second-half query has an induction target
    assert probe.induction_mask()[:, 5:].any(-1).all() and not probe.induction_mask()[:, :5].any()
    with pytest.raises(UsageError, match="text 0 has 8 tokens, fewer than seq_len=9"):
        interp.TokenProbe.from_texts(gpt2_tiny, texts, seq_len=9)


# ---- result objects ------------------------------------------------------------------------------


def test_results_save_and_load_back(toy, tmp_path):
    probe = interp.repeated_tokens(toy, batch=3, block_len=10, seed=0)
    scores = interp.head_scores(toy, probe, copying=False)
    scores.save(tmp_path)
    again = interp.HeadScores.load(tmp_path)
    pd.testing.assert_frame_equal(scores.table, again.table, check_dtype=False)
    assert again.grid("induction").shape == (2, 4) and again.meta == scores.meta
    report = interp.sink_scores(toy, interp.random_tokens(toy, batch=2, seq_len=16))
    report.save(tmp_path / "sinks")
    back = interp.SinkReport.load(tmp_path / "sinks")
    np.testing.assert_allclose(back.grid("first_mass"), report.grid("first_mass"))
    pd.testing.assert_frame_equal(back.layers, report.layers, check_dtype=False)
    assert back.table.shape == report.table.shape and back.sink_rate == report.sink_rate
    with pytest.raises(UsageError, match="no saved sink report in"):
        interp.SinkReport.load(tmp_path)
    gates = interp.train_gates(toy, probe, interp.incontext_loss(probe), [0.0, 1.0], steps=5)
    gates.save(tmp_path)
    loaded = interp.GateSweep.load(tmp_path)
    pd.testing.assert_frame_equal(loaded.table, gates.table, check_dtype=False)
    np.testing.assert_allclose(loaded.grid(1.0), gates.grid("lambda=1"))
    rows = gates.table[gates.table["lambda"] == 1.0]
    assert gates.grid(1.0).shape == (2, 4)
    np.testing.assert_allclose(gates.grid(1.0)[rows["layer"], rows["head"]], rows["gate"])


def test_describe_follows_the_model_to_another_device():
    model = interp.load_model("toy", device="cpu")
    assert interp.describe(model).device.type == "cpu"
    model.to("meta")
    assert interp.describe(model).device.type == "meta"
