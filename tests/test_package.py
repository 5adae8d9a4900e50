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
from interp.config import RunConfig
from interp.errors import InterpError, ModelLoadError, UsageError

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_import_interp_is_lazy_and_gives_the_public_api():
    child = _python(
        "import sys, interp\n"
        "assert 'torch' not in sys.modules, 'import interp loaded torch'\n"
        "assert dir(interp) == interp.__all__, dir(interp)\n"  # the public API, not _API, lazy, TYPE_CHECKING
        "interp.head_scores, interp.exact_sweep\n"
        "assert 'torch' in sys.modules\n"
        "assert dir(interp) == interp.__all__, dir(interp)\n"  # loaded names and submodules add nothing
        "assert interp.sinks.sink_scores is interp.sink_scores\n"  # a submodule, after a bare `import interp`
        "assert interp.report.Atlas is interp.Atlas and 'Atlas' in dir(interp)\n"
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
    # the result classes and the window ablation the README shows as interp.X (issue 25)
    assert {"Atlas", "PruningCurves", "WindowAblation", "HeadScores", "SinkReport", "GateSweep"} <= set(interp.__all__)
    assert (
        interp.WindowAblation is interp.ablation.WindowAblation
        and interp.PruningCurves is interp.ablation.PruningCurves
    )


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
        (lambda tmp: tmp / "file", "{out} exists and is not a directory: pass a folder path (--out)"),
        (
            lambda tmp: tmp / "file" / "x",
            "cannot create output folder {out}: {tmp}/file is a file; pass another output folder (--out)",
        ),
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
    assert err.endswith("; pass a writable output folder (--out)\n") and err.count("\n") == 1


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
    probe = interp.TokenProbe.from_texts(gpt2_tiny, texts, seq_len=8)  # seq_len cuts to one length
    assert probe.attention_mask is None
    assert probe.tokens.tolist() == [[0, 5, 6, 7, 8, 5, 6, 7, 8], [0, 9, 10, 11, 12, 9, 10, 11, 12]]
    # the second half repeats the first: every second-half query has an induction target
    assert probe.induction_mask()[:, 5:].any(-1).all() and not probe.induction_mask()[:, :5].any()
    # texts of different lengths are padded (the model's pad token, here its EOS 0), not cut
    padded = interp.TokenProbe.from_texts(gpt2_tiny, texts)
    assert padded.tokens.tolist() == [[0, 5, 6, 7, 8, 5, 6, 7, 8, 0], [0, 9, 10, 11, 12, 9, 10, 11, 12, 13]]
    assert padded.attention_mask.tolist() == [[True] * 9 + [False], [True] * 10]


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
    whole = interp.load_result(tmp_path / "sinks" / "sinks_summary.json")  # the report, not its head table
    assert type(whole) is interp.SinkReport and whole.layers.equals(back.layers) and whole.massive.equals(back.massive)
    assert type(interp.load_result(tmp_path / "sinks" / "sinks.json")) is interp.HeadScores
    gates = interp.train_gates(toy, probe, interp.incontext_loss(probe), [0.0, 1.0], steps=5)
    gates.save(tmp_path)
    loaded = interp.GateSweep.load(tmp_path)
    pd.testing.assert_frame_equal(loaded.table, gates.table, check_dtype=False)
    via = interp.load_result(tmp_path / "gates.json")
    assert type(via) is interp.GateSweep and via.table.equals(loaded.table)
    np.testing.assert_allclose(loaded.grid(1.0), gates.grid("lambda=1"))
    rows = gates.table[gates.table["lambda"] == 1.0]
    assert gates.grid(1.0).shape == (2, 4)
    np.testing.assert_allclose(gates.grid(1.0)[rows["layer"], rows["head"]], rows["gate"])


def test_saved_tables_read_back_bit_for_bit(toy, tmp_path):
    """Floats are saved so that they read back exactly, from the JSON and the CSV (issue 25: the JSON
    kept 10 digits, so a reloaded table differed by ~5e-11 and ``table.equals`` was False)."""
    probe = interp.repeated_tokens(toy, batch=3, block_len=10, seed=0)
    scores = interp.head_scores(toy, probe, copying=False)
    rng = np.random.default_rng(0)
    scores.table["tiny"] = rng.random(8) * 1e-7 + 1 / 3  # digits far below any printed precision
    scores.table["nothing"] = np.nan  # a score with no target: null in the JSON, NaN again on load
    scores.save(tmp_path)
    for saved in (tmp_path, tmp_path / "head_scores.csv"):
        back = interp.HeadScores.load(saved).table
        assert back.equals(scores.table), (
            saved,
            (back.compare(scores.table) if back.shape == scores.table.shape else back),
        )
    report = interp.sink_scores(toy, interp.random_tokens(toy, batch=2, seq_len=16))
    report.save(tmp_path / "sinks")
    back = interp.SinkReport.load(tmp_path / "sinks")
    assert back.heads.table.equals(report.heads.table)
    for name in ("layers", "positions", "tokens"):
        assert getattr(back, name).equals(getattr(report, name)), name


def test_describe_follows_the_model_to_another_device():
    model = interp.load_model("toy", device="cpu")
    assert interp.describe(model).device.type == "cpu"
    model.to("meta")
    assert interp.describe(model).device.type == "meta"


# ---- one lazy mechanism, one result shape, imports that only go down -----------------------------


def test_one_lazy_helper_serves_the_package_and_the_atlas():
    import ast

    import interp.report
    from interp._lazy import lazy

    assert interp.RunConfig is interp.config.RunConfig and "RunConfig" in interp.__all__
    assert {"Atlas", "PARTS", "ROLES", "head_atlas", "render_atlas"} <= set(interp.report.__all__)
    assert "head_atlas" in dir(interp.report)
    with pytest.raises(AttributeError, match="module 'interp.report' has no attribute 'nope'"):
        interp.report.nope  # noqa: B018
    getattr_, dir_, all_ = lazy("interp", {"describe": "interp.models"})
    assert all_ == ["describe"] and getattr_("describe") is interp.models.describe and "describe" in dir_()
    # editors and type checkers see exactly the lazy API: the TYPE_CHECKING imports name every public name
    for package in (interp, interp.report):
        tree = ast.parse(Path(package.__file__).read_text())
        block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
        seen = {a.asname or a.name for n in block.body for a in n.names}
        assert seen == set(package.__all__), package.__name__


def _imports(module_file: Path) -> set[str]:
    """The interp modules a file imports at run time (function-local imports included, TYPE_CHECKING not)."""
    import ast

    tree = ast.parse(module_file.read_text())
    typing_only = {
        id(sub) for n in ast.walk(tree) if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"
        for sub in ast.walk(n)
    }  # fmt: skip
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("interp"):
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("interp")}
    return found


def test_results_probes_and_atlas_import_only_downward():
    """The circles probe -> user -> draw -> probe and atlas <-> page are gone, and no library module
    imports a command (only the ``python -m`` entry points, which nothing imports, do)."""
    root = ROOT / "interp"
    graph = {}
    for f in root.rglob("*.py"):
        name = ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = f
    deps = {m: {d for d in _imports(f) if d in graph and d != m} for m, f in graph.items()}

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            m = todo.pop()
            for d in deps[m] - seen:
                if d == b:
                    return True
                seen.add(d)
                todo.append(d)
        return False

    for low, high in [
        ("interp.probes.probe", "interp.probes.user"),
        ("interp.probes.probe", "interp.probes.draw"),
        ("interp.report.atlas", "interp.report.page"),
        ("interp.report.atlas", "interp.report.build"),
        ("interp.report.page", "interp.report.build"),
        ("interp.plots", "interp.scores"),  # HeadScores.figure draws with plots; plots know results by type only
    ]:
        assert reaches(high, low), (high, low)
        assert not reaches(low, high), f"{low} imports {high}, which sits above it"
    from interp.cli import COMMANDS

    # `python -m interp.<command>`: a package's __main__, or a module (not a package) named after the command
    commands = {f"interp.{c}" for c in COMMANDS}
    entry_points = {m for m in graph if m.endswith("__main__") or (m in commands and graph[m].name != "__init__.py")}
    library = [m for m in graph if not m.startswith("interp.cli") and m not in entry_points]
    assert not [(m, d) for m in library for d in deps[m] if d.startswith("interp.cli")]


def test_every_result_draws_its_figure(toy):
    import plotly.graph_objects as go

    probe = interp.repeated_tokens(toy, batch=2, block_len=8, seed=0)
    scores = interp.head_scores(toy, probe, config=RunConfig(n_boot=50))
    fig = scores.figure(["induction", "copying"])
    # two panels; the notebook figure takes its baselines (and role-rule marks) from the scores' meta
    assert isinstance(fig, go.Figure) and len([t for t in fig.data if t.type == "heatmap"]) == 2
    assert [a.text for a in fig.layout.annotations][:1] == [
        interp.heatmap(scores, ["induction"]).layout.annotations[0].text
    ]
    report = interp.sink_scores(toy, interp.random_tokens(toy, batch=2, seq_len=16), config=RunConfig(n_boot=50))
    assert isinstance(report.figure(), go.Figure) and list(report.figures()) == ["heatmap", "layers", "residual"]
    np.testing.assert_allclose(report.figure().data[0].z, report.grid("first_mass"))


def test_sink_scores_takes_a_run_config(toy):
    probe = interp.random_tokens(toy, batch=3, seq_len=16)
    by_keyword = interp.sink_scores(toy, probe, config=RunConfig(n_boot=40, level=0.9, seed=3, engine="pattern"))
    config = interp.RunConfig(n_boot=40, level=0.9, seed=3, engine="pattern")
    by_config = interp.sink_scores(toy, probe, config=config)
    pd.testing.assert_frame_equal(by_keyword.table, by_config.table)
    assert by_config.meta["n_boot"] == 40 and by_config.meta["ci_level"] == 0.9 and by_config.meta["seed"] == 3
    # another config's level gives other intervals; the run header leads the meta
    other = interp.sink_scores(toy, probe, config=interp.RunConfig(n_boot=40, level=0.5, seed=3, engine="pattern"))
    assert other.meta["ci_level"] == 0.5 and not np.allclose(
        other.grid("first_mass_lo"), by_config.grid("first_mass_lo")
    )
    assert list(other.meta)[:5] == ["model", "n_layers", "n_heads", "causal", "probe"]
    with pytest.raises(UsageError, match="config must be an interp.RunConfig"):
        interp.sink_scores(toy, probe, config={"n_boot": 5})


def test_commands_are_registered_once():
    from interp.cli import COMMANDS, usage

    assert COMMANDS.names() == (
        "induction", "sinks", "ablate", "patterns", "retrieval", "patch", "circuit", "qk", "roles", "checkpoints",
        "report",
    )  # fmt: skip
    assert all(COMMANDS.doc(name) in usage() for name in COMMANDS)
