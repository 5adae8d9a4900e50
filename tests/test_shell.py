"""The command shell (interp.cli.common.Command): one context manager parses, checks before the model,
takes the out-folder lock, sets the threads and turns every ending into its exit code, for the commands
that load one model and for the checkpoint sweep, which loads its revisions itself."""

from __future__ import annotations

import pytest

import interp.cli.common
from interp.cli import checkpoints
from interp.cli.common import Command
from interp.cli.flags import base_parser
from interp.errors import UsageError


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    monkeypatch.setattr(interp.cli.common, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def test_a_command_that_loads_no_model_runs_in_the_shell(tmp_path, capsys):
    out = tmp_path / "o"
    with Command(base_parser("p", "a test"), ["--out", str(out), "--device", "cpu"], "t") as cmd:
        cmd.threads(None, "one is enough here")
        (cmd.out / "a.csv").write_text("x")
        cmd.done([cmd.out / "a.csv"])
    assert cmd.code == 0
    assert capsys.readouterr().out == f"threads: 1 (one is enough here)\n\nwrote:\n  {out / 'a.csv'}\n"
    assert sorted(p.name for p in out.iterdir()) == ["a.csv"]  # the lock is gone


def test_a_check_names_the_flag_of_a_parameter_through_the_command_s_aliases(tmp_path, capsys):
    def check(args):
        raise UsageError("the file holds 3 pairs: pass n_pairs=3 or less", params="n_pairs")

    argv = ["--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as e:
        with Command(base_parser("p", "a test"), argv, "t", check=check, aliases={"n_pairs": "batch"}):
            pytest.fail("the body ran after a failed check")
    assert e.value.code == 2
    assert capsys.readouterr().err == "p: error: the file holds 3 pairs: pass --batch 3 or less\n"
    assert not (tmp_path / "o").exists()


def test_the_checkpoint_sweep_out_of_memory_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    """The sweep runs in the same shell as every command: running out of memory is one line, exit 1,
    and the advice names only flags the command has (it has no --minibatch)."""

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(checkpoints, "checkpoint_scores", out_of_memory)
    argv = ["--checkpoints", str(tmp_path / "step*"), "--out", str(tmp_path / "o"), "--device", "cpu"]
    assert checkpoints.cli(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        "python -m interp.checkpoints: error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB): "
        "run fewer sequences (--batch)\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ablate", "--orders", "gradient,nope"], "--orders: unknown order(s) nope: choose from gradient, exact, "),
        (["patch", "--faithfulness", "exact,x"], "--faithfulness: unknown method(s) x: choose from exact, attribution"),
        (["report", "--skip", "sinks,foo"], "--skip: unknown part(s) foo: choose from sinks, exact, gradient, "),
        (["roles", "--analyses", "ov,x"], "--analyses: unknown analysis(s) x: choose from composition, ov, "),
        (["patch", "--faithfulness", ","], "--faithfulness: no method given: choose from exact, attribution, eap-ig"),
    ],
)
def test_a_list_of_names_is_read_from_its_registry_by_one_parser(argv, message, capsys):
    from interp.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert f"interp {argv[0]}: error: argument {message}" in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_run_settings_of_a_command_s_flags():
    from interp.cli import induction, patch
    from interp.cli.flags import run_config
    from interp.config import RunConfig

    args = induction.build_parser().parse_args(["--ci", "0.9", "--seed", "3", "--engine", "stream"])
    args.progress = False
    assert run_config(args) == RunConfig(level=0.9, seed=3, engine="stream")
    args = patch.build_parser().parse_args(["--minibatch", "2"])
    args.progress = True
    assert run_config(args) == RunConfig(minibatch=2, progress=True)
