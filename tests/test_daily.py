"""A researcher's daily use: the current-token score, clear messages and refusals, metrics that
state their direction, threads, progress lines, Ctrl-C during imports and partial outputs."""

from __future__ import annotations

import ast
import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import interp
import interp.cli.common
from interp._io import mark_partial
from interp.ablation.gradient import ZERO_GRADIENT_WARNING
from interp.ablation.metrics import UNWRAPPED
from interp.cli.ablate import build_parser
from interp.cli.ablate import cli as ablate_cli
from interp.cli.induction import cli as induction_cli
from interp.cli.sinks import cli as sinks_cli
from interp.config import RunConfig
from interp.errors import InterpError, UsageError
from interp.heads import head_scores
from interp.parts.patterns import attention_patterns
from interp.parts.table import role_table
from interp.probes import TokenProbe, repeated_tokens
from interp.progress import Lines, lines, tqdm
from interp.threads import choose_threads

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def toy():
    return interp.load_model("toy")


# ---- the current-token score --------------------------------------------------------------------


def test_current_token_score_is_the_diagonal_of_the_pattern(toy):
    """Against an independent reading of the patterns: the mean of A[q, q] over body queries."""
    probe = repeated_tokens(toy, batch=3, block_len=12, seed=1)
    scores = head_scores(toy, probe, copying=False, config=RunConfig(n_boot=50))
    diag = torch.stack([attention_patterns(toy, probe.tokens[b]).diagonal(dim1=-2, dim2=-1) for b in range(3)])
    body = diag[..., probe.body_start : probe.body_end].mean((0, -1))  # [layer, head]
    assert torch.allclose(torch.tensor(scores.grid("current")).float(), body, atol=1e-5)
    stream = head_scores(toy, probe, copying=False, config=RunConfig(n_boot=50, engine="stream"))
    assert torch.allclose(torch.tensor(stream.grid("current")), torch.tensor(scores.grid("current")), atol=1e-5)


def test_toy_head_0_3_is_the_current_token_head(toy):
    probe = repeated_tokens(toy, seed=0)
    scores = head_scores(toy, probe, config=RunConfig(n_boot=200))
    roles = role_table(scores, interp.heads.uniform_baselines(probe)).set_index("label")
    assert "current-token" in roles.loc["0.3", "role"]
    assert roles.loc["0.3", "current"] > 0.6  # about 0.68 on repeated random tokens
    assert [label for label, r in roles["role"].items() if "current-token" in r] == ["0.3"]
    from interp.report.atlas import HEATMAP_SCORES

    assert "current" in HEATMAP_SCORES


def test_a_score_with_no_targets_is_nan_with_a_note(toy):
    """A natural prompt with no repeated token: duplicate and induction are NaN, not an error."""
    probe = TokenProbe.from_tokens(toy, torch.arange(5, 25).reshape(2, 10))
    for engine in ("pattern", "stream"):
        scores = head_scores(toy, probe, copying=False, config=RunConfig(n_boot=20, engine=engine))
        assert scores.table["induction"].isna().all() and scores.table["duplicate"].isna().all()
        assert scores.table["prev_token"].notna().all() and scores.table["current"].notna().all()
        assert scores.meta["notes"] == [
            "duplicate: no query of this probe has a target for this score (e.g. no token occurs twice), so it is NaN",
            "induction: no query of this probe has a target for this score (e.g. no token occurs twice), so it is NaN",
        ]


# ---- library messages ----------------------------------------------------------------------------


def test_swapped_arguments_say_so(toy):
    probe = repeated_tokens(toy, batch=2)
    with pytest.raises(UsageError) as e:
        head_scores(probe, toy)
    assert str(e.value) == (
        "head_scores takes the model first and the probe second: head_scores(model, probe), "
        "got (TokenProbe, ToyTransformer)"
    )


def test_unknown_score_is_an_interp_error(toy):
    scores = head_scores(toy, repeated_tokens(toy, batch=2), copying=False, config=RunConfig(n_boot=10))
    with pytest.raises(InterpError) as e:
        scores.grid("nope")
    assert isinstance(e.value, KeyError)  # old `except KeyError` code still works
    assert str(e.value) == "no score 'nope'; have ['prev_token', 'current', 'duplicate', 'induction']"
    fig = interp.heatmap(scores, "induction")  # a string is one score, not a list of letters
    assert [a.text for a in fig.layout.annotations][0].startswith("induction")


def test_atlas_skip_string_is_one_part(toy):
    with pytest.raises(UsageError) as e:
        interp.head_atlas(toy, skip="nope")
    assert str(e.value) == (
        "cannot skip nope: choose from sinks, exact, gradient, pruning, patterns, retrieval, composition, ov, "
        "encoder, qk, cards, headmap, task"
    )


def test_empty_text_file(toy, tmp_path):
    for text in ("", "\n  \n"):
        path = tmp_path / "empty.txt"
        path.write_text(text)
        with pytest.raises(interp.errors.DatasetLoadError) as e:
            interp.text_probe(toy, dataset=path)
        assert str(e.value) == f"{path} is empty: put some text in it (one or more lines), or pass another file"


def test_library_errors_name_cli_flags_only_as_the_command_line_spelling():
    """Outside interp/cli (and the toy trainer, a command itself; the browser's own flags), a message
    that names a flag also gives the library's spelling and puts the flag in "(command line: ...)"."""
    skip = {"browser.py", "toy/train.py", "journal.py"}
    flag = re.compile(r"--[a-z][a-z-]*")
    found = []
    for path in (ROOT / "interp").rglob("*.py"):
        rel = path.relative_to(ROOT / "interp").as_posix()
        if rel.startswith("cli/") or rel in skip:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
            else:
                continue
            outside = re.sub(r"\(command line: [^()]*\)", "", text)
            if flag.search(outside):
                found.append(f"{rel}:{node.lineno}: {text}")
    assert not found, "\n".join(found)


# ---- metrics ---------------------------------------------------------------------------------------


def test_a_plain_function_must_state_its_direction(toy):
    probe = repeated_tokens(toy, batch=2, block_len=8)

    def logit(logits, tokens):
        return logits[:, -1, 0]

    assert UNWRAPPED == (
        "a plain function does not say which way is better: wrap it as "
        "interp.as_metric(fn, higher_is_better=True) for a score such as a logit difference, or "
        "interp.as_metric(fn, higher_is_better=False) for a loss"
    )
    for call in (lambda: interp.as_metric(logit), lambda: interp.exact_sweep(toy, probe, logit)):
        with pytest.raises(interp.errors.MetricError) as e:
            call()
        assert str(e.value) == UNWRAPPED
    up = interp.as_metric(logit, higher_is_better=True)
    down = interp.as_metric(logit, higher_is_better=False)
    assert isinstance(up, interp.Metric) and up.higher_is_better and not down.higher_is_better
    a = interp.exact_sweep(toy, probe, up, ablation="zero").table["importance"]
    b = interp.exact_sweep(toy, probe, down, ablation="zero").table["importance"]
    assert a.abs().max() > 0.01 and torch.allclose(torch.tensor(a.values), -torch.tensor(b.values))


def test_gradient_under_zero_ablation_warns(toy):
    probe = repeated_tokens(toy, batch=2, block_len=8)
    metric = interp.incontext_loss(probe)
    with pytest.warns(UserWarning) as seen:
        interp.gradient_importance(toy, probe, metric, ablation="zero")
    assert [str(w.message) for w in seen] == [ZERO_GRADIENT_WARNING]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interp.gradient_importance(toy, probe, metric, ablation="mean")


# ---- the ablate command's flags ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--method", "exact", "--normalize"],
            "--method exact does not read --normalize (it applies to --method gradient): drop it, or choose "
            "the method that reads it",
        ),
        (
            ["--method", "exact", "--lambdas", "0.1"],
            "--method exact does not read --lambdas (it applies to --method gates): drop it, or choose the "
            "method that reads it",
        ),
        (
            ["--method", "gradient", "--replay", "fast"],
            "--method gradient does not read --replay (it applies to --method exact or prune or gates): drop "
            "it, or choose the method that reads it",
        ),
        (
            ["--method", "gates", "--normalize", "--step", "0.2"],
            "--method gates does not read --normalize (it applies to --method gradient); --step (it applies "
            "to --method prune): drop them, or choose the method that reads them",
        ),
        (
            ["--method", "prune", "--ablated", "0.1"],
            "--method prune does not read --ablated (it applies to --method exact or gradient): drop it, or "
            "choose the method that reads it",
        ),
    ],
)
def test_flags_the_method_ignores_are_refused(argv, message, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:
        ablate_cli(["--out", str(tmp_path / "o"), *argv])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"python -m interp.ablate: error: {message}\n"


def test_ablated_naming_every_head_is_refused(capsys, tmp_path):
    heads = ",".join(f"{l}.{h}" for l in range(2) for h in range(4))
    with pytest.raises(SystemExit) as e:
        ablate_cli(["--out", str(tmp_path / "o"), "--batch", "2", "--seq-len", "8", "--ablated", heads])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "python -m interp.ablate: error: --ablated names every head (8): nothing would be left to rank; "
        "keep at least one head out of it\n"
    )


def test_ablate_defaults_to_mean_and_warns_in_one_line_under_zero(capsys, tmp_path):
    assert build_parser().get_default("ablation") == "mean"
    out = tmp_path / "g"
    argv = ["--out", str(out), "--batch", "2", "--seq-len", "8", "--method", "gradient", "--ablation", "zero"]
    assert ablate_cli(argv) == 0
    err = capsys.readouterr().err
    line = f"python -m interp.ablate: warning: {ZERO_GRADIENT_WARNING}"
    assert err.splitlines().count(line) == 1


# ---- models without a tokenizer ---------------------------------------------------------------------


def test_model_folder_without_tokenizer_is_a_model_load_error(tmp_path, capsys):
    from tests.helpers import gpt2_model

    folder = tmp_path / "notok"
    gpt2_model().save_pretrained(folder)
    capsys.readouterr()
    assert induction_cli(["--model", str(folder), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == (
        f"python -m interp.induction: error: {folder} has a model but no tokenizer (none of tokenizer.json, "
        "tokenizer_config.json, vocab.json, tokenizer.model, spiece.model): save it beside the model with "
        "tokenizer.save_pretrained(dir), or wrap the model yourself with interp.from_hf_model(hf_model, "
        "tokenizer)\n"
    )


# ---- threads and progress ---------------------------------------------------------------------------


def test_threads_default_never_oversubscribes():
    assert choose_threads(150_000, cpus=16, load=0.0) == (
        1,
        "a small model, 0.15M parameters, runs as fast on one thread",
    )
    assert choose_threads(100_000_000, cpus=2, load=1.5) == (1, "the machine is busy: load 1.5 on 2 CPUs, 0 free")
    assert choose_threads(100_000_000, cpus=16, load=3.2) == (12, "12 of 16 CPUs free, load 3.2")
    # a nearly idle 2-CPU machine is not busy: one CPU is free, so one thread, and the line says so
    assert choose_threads(100_000_000, cpus=2, load=0.6) == (1, "1 of 2 CPUs free, load 0.6")
    assert choose_threads(100_000_000, cpus=16, load=9.5) == (6, "the machine is busy: load 9.5 on 16 CPUs, 6 free")
    assert choose_threads(100_000_000, cpus=1, load=0.0) == (1, "this machine has one CPU")


def test_the_first_line_says_what_threads_were_picked(capsys, tmp_path):
    before = torch.get_num_threads()
    try:
        assert induction_cli(["--out", str(tmp_path / "a"), "--batch", "2", "--seq-len", "8"]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert first == "threads: 1 (a small model, 0.15M parameters, runs as fast on one thread)"
        assert induction_cli(["--out", str(tmp_path / "b"), "--batch", "2", "--seq-len", "8", "--threads", "2"]) == 0
        assert capsys.readouterr().out.splitlines()[0] == "threads: 2 (--threads)"
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_progress_off_a_terminal_is_occasional_lines():
    out = io.StringIO()
    assert isinstance(tqdm(range(3), file=out), Lines)  # a StringIO is not a terminal
    for _ in tqdm(range(20), desc="work", file=out, every=1e9):
        pass
    printed = out.getvalue().splitlines()
    assert len(printed) == 10  # each tenth of the way (9 lines) and the end
    assert printed[0].startswith("work: 2/20 (10%), ") and "s left" in printed[0]
    assert re.fullmatch(r"work: 20/20 \(100%\), \d+s elapsed", printed[-1])
    silent = io.StringIO()
    for _ in tqdm(range(5), file=silent, disable=True):
        pass
    assert silent.getvalue() == ""


def test_no_progress_forces_lines_even_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert not isinstance(tqdm(range(2), file=Terminal(), disable=True), Lines)
    with lines():
        assert isinstance(tqdm(range(2), file=Terminal()), Lines)


# ---- Ctrl-C ------------------------------------------------------------------------------------------

SITE = """
import os, signal, sys

class Interrupt:
    # sends SIGINT to this process the moment torch starts importing
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
"""


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["-m", "interp.induction"], "python -m interp.induction"),
        (["-m", "interp.ablate"], "python -m interp.ablate"),
        (["-m", "interp.sinks"], "python -m interp.sinks"),
        (["-m", "interp.report"], "python -m interp.report"),
        (["-m", "interp", "report"], "interp report"),
    ],
)
def test_ctrl_c_while_torch_imports(argv, prog, tmp_path):
    """SIGINT arrives while ``import torch`` runs: one line, exit 130, no traceback."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(SITE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, *argv, "--out", str(tmp_path / "o")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == f"{prog}: interrupted\n"
    assert not (tmp_path / "o").exists()


def test_files_written_before_an_interrupt_are_marked_partial(monkeypatch, capsys, tmp_path):
    """Ctrl-C while sinks writes its figures: what it wrote is renamed *.partial.*, nothing passes for complete."""
    out = tmp_path / "s"
    out.mkdir()
    (out / "old_notes.txt").write_text("from an earlier day")
    os.utime(out / "old_notes.txt", (1, 1))
    calls = []
    real = interp.cli.sinks.save_figure

    def interrupting(fig, folder, stem, **kw):
        calls.append(stem)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(fig, folder, stem, png=False)

    monkeypatch.setattr(interp.cli.sinks, "save_figure", interrupting)
    assert sinks_cli(["--out", str(out), "--batch", "2", "--seq-len", "8"]) == 130
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert "old_notes.txt" in names  # older files are left alone
    fresh = [n for n in names if n != "old_notes.txt"]
    assert fresh and all(".partial." in n for n in fresh), names
    assert f"{calls[0]}.partial.html" in names
    printed = capsys.readouterr()
    assert "these files were written before the interrupt, marked partial:" in printed.out
    assert printed.err.endswith("python -m interp.sinks: interrupted\n")


def test_mark_partial_leaves_hidden_and_marked_files(tmp_path):
    for name in ("a.csv", ".interp-x.lock", "b.partial.json"):
        (tmp_path / name).write_text("x")
    assert mark_partial(tmp_path, since=0) == [tmp_path / "a.partial.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".interp-x.lock", "a.partial.csv", "b.partial.json"]


def test_sigint_is_the_default_again_after_the_import():
    from interp.cli import import_interruptibly

    before = signal.getsignal(signal.SIGINT)
    import_interruptibly("interp.cli.induction", "x")
    assert signal.getsignal(signal.SIGINT) is before
