"""Ctrl-C at every stage of a command: exit 130, one line, what was written marked ``.partial``, and
no temporary file or browser left behind (issue 25, item 4).

The command runs in a process group of its own. A ``sitecustomize`` planted on its path wraps one
function of the command (chosen by ``INTERRUPT_AT``) so that, when it is called, the process sends
SIGINT to its whole group, as a terminal's Ctrl-C does. For the PNG export the wrap is on the
browser's ``communicate``: the signal goes out once the browser has started writing its profile,
while it is still running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import interp.browser
from interp import interrupts
from interp._io import atomic_write, partial_name, writes_partial
from interp.browser import find_browser
from interp.cli import ablate
from interp.patching import PatchScores

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--device", "cpu", "--batch", "2", "--seq-len", "8", "--no-progress"]

SITE = """
import importlib.abc, importlib.util, os, signal, subprocess, sys, time
from pathlib import Path

AT = os.environ["INTERRUPT_AT"]
REPORT = Path(os.environ["INTERRUPT_REPORT"])


def ctrl_c(what):
    REPORT.write_text(what)
    os.killpg(0, signal.SIGINT)  # a terminal's Ctrl-C: every process of the foreground group
    time.sleep(30)  # the KeyboardInterrupt is raised here


if AT == "browser":
    communicate = subprocess.Popen.communicate

    def interrupted_communicate(self, *args, **kwargs):
        argv = [str(a) for a in self.args]
        if any(a.startswith("--screenshot") for a in argv):
            profile = Path(next(a for a in argv if a.startswith("--user-data-dir=")).split("=", 1)[1])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and self.poll() is None and not any(profile.glob("*/*")):
                time.sleep(0.01)
            ctrl_c("browser running" if self.poll() is None else "browser gone")
        return communicate(self, *args, **kwargs)

    subprocess.Popen.communicate = interrupted_communicate
else:
    MODULE, ATTR, *NTH = AT.split(":")
    NTH = int(NTH[0]) if NTH else 1

    class Wrap(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != MODULE:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                real, calls = getattr(module, ATTR), []

                def wrapped(*args, **kwargs):
                    calls.append(1)
                    if len(calls) == NTH:
                        ctrl_c(f"{ATTR} call {NTH}")
                    return real(*args, **kwargs)

                setattr(module, ATTR, wrapped)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Wrap())
"""

STAGES = {
    "the parser is built": ("interp.cli.sinks:build_parser", "build_parser call 1"),
    "the model loads": ("interp.cli.common:load_model", "load_model call 1"),
    "heads are scored": ("interp.cli.sinks:sink_scores", "sink_scores call 1"),
    "files are written": ("interp.cli.sinks:save_figure:2", "save_figure call 2"),
    "a figure is exported to PNG": ("browser", "browser running"),
}


def _browsers_in(folder: Path) -> list[str]:
    """Command lines of live processes that name ``folder`` (a browser with its profile there)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if str(folder) in cmd and state != "Z":
            found.append(cmd)
    return found


@pytest.mark.slow  # a fresh interpreter per stage: torch is imported five times
@pytest.mark.parametrize("stage", list(STAGES))
def test_ctrl_c_at_every_stage_of_sinks(stage, tmp_path, request):
    at, expected = STAGES[stage]
    if at == "browser" and find_browser() is None:
        pytest.skip("no Chrome or Chromium (Debian: apt-get install chromium, or set BROWSER_PATH)")
    site, out, report = tmp_path / "site", tmp_path / "out", tmp_path / "report"
    site.mkdir()
    # the command's temporary folder: short, as the browser's sockets need (see interp.browser.SOCKET_ROOM)
    tmp = Path(tempfile.mkdtemp(prefix="i25-", dir="/tmp" if os.access("/tmp", os.W_OK) else None))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITE))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
        "TMPDIR": str(tmp),
        "INTERRUPT_AT": at,
        "INTERRUPT_REPORT": str(report),
        "INTERP_PNG": "1" if at == "browser" else "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "interp.sinks", "--out", str(out), *SMALL],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # its own process group: the Ctrl-C it sends reaches nothing here
    )
    assert report.read_text() == expected  # the interrupt came where it was meant to
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert done.stderr.endswith("python -m interp.sinks: interrupted\n"), done.stderr
    files = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert not [n for n in files if n.startswith(".")], files  # no lock, no half-written temporary file
    assert all(".partial." in n for n in files), files  # nothing passes for complete
    if at in ("browser", "interp.cli.sinks:save_figure:2"):
        assert "sinks.partial.csv" in files and "sinks.partial.json" in files and "sinks_heatmap.partial.html" in files
        assert "these files were written before the interrupt, marked partial:" in done.stdout
    else:
        assert files == []
    assert list(tmp.iterdir()) == []  # the browser's page and profile are gone
    assert _browsers_in(tmp) == []  # and so is the browser, helpers included


def test_deferred_holds_ctrl_c_until_the_block_ends():
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("after the signal")  # the step is not cut in half
    assert steps == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupts.deferred():  # no signal: nothing raised
        steps.append("quiet")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored before the block: ignored after it
    try:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_remove_tree_waits_for_a_writer_that_is_dying(tmp_path):
    folder = tmp_path / "profile"
    (folder / "Default").mkdir(parents=True)
    writer = subprocess.Popen(
        [sys.executable, "-c", f"import os\nwhile True: open(os.path.join({str(folder)!r}, 'Default', 'x'), 'w')"],
        start_new_session=True,
    )
    try:
        interrupts.end_process_group(writer)
        assert writer.returncode is not None
        assert interrupts.remove_tree(folder) and not folder.exists()
    finally:
        if writer.poll() is None:
            writer.kill()


def test_partial_names_are_stem_dot_partial_dot_suffix(tmp_path):
    assert partial_name(tmp_path / "ablate_gates_curves.html").name == "ablate_gates_curves.partial.html"
    assert partial_name(tmp_path / "a.partial.csv").name == "a.partial.csv"
    with writes_partial():
        assert atomic_write(tmp_path / "x.csv", "1") == tmp_path / "x.partial.csv"
    with writes_partial(False):
        assert atomic_write(tmp_path / "x.csv", "1") == tmp_path / "x.csv"


def test_an_interrupted_gate_sweep_names_every_file_stem_partial_suffix(monkeypatch, capsys, tmp_path):
    """Ctrl-C during the second lambda: the first lambda's rows are written, every file named
    ``<stem>.partial.<ext>`` (never ``ablate_gates.partial_curves.html``)."""
    from interp.ablation import gates

    real, calls = gates.gate_sample, []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the first step of the second lambda (2 steps each)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(gates, "gate_sample", stopping)
    out = tmp_path / "o"
    argv = ["--out", str(out), *SMALL, "--method", "gates", "--lambdas", "0.01,0.1", "--gate-steps", "2"]
    assert ablate.cli(argv) == 130
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert names == [
        "ablate_gates.partial.csv",
        "ablate_gates.partial.html",
        "ablate_gates.partial.json",
        "ablate_gates_curves.partial.html",
        "ablate_gates_heads.partial.csv",
    ]
    capsys.readouterr()


@pytest.mark.parametrize("part", ["exact", "pruning"])
def test_an_atlas_interrupted_in_an_ablation_part_writes_no_complete_atlas(part, monkeypatch, capsys, tmp_path):
    """Ctrl-C inside the atlas's exact sweep or pruning curves: exit 130 and no complete-looking atlas
    built from part of a sweep (the journal keeps the finished units for --resume)."""
    from interp.ablation.replay import Sweeper
    from interp.cli import report

    real, calls = Sweeper._evaluate_group, []
    stop_at = 2 if part == "exact" else 1  # pruning runs alone: its first evaluation is stopped

    def stopping(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Sweeper, "_evaluate_group", stopping)
    skip = "sinks,gradient,patterns,retrieval" + (",pruning" if part == "exact" else ",exact")
    out = tmp_path / "o"
    argv = ["--out", str(out), "--no-progress", "--batch", "2", "--seq-len", "8", "--skip", skip]
    assert report.cli(argv) == 130
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.exists() else []
    assert all(".partial." in n for n in names), names
    assert "python -m interp.report: interrupted" in capsys.readouterr().err


def test_an_error_met_while_stopping_is_one_line_and_the_run_still_exits_130(tmp_path, capsys):
    """A cleanup that fails on the way out of a Ctrl-C (the browser's profile folder, once) does
    not turn the interrupt into a traceback and exit 1."""
    from interp.cli import common, flags

    def main(args, model, out):
        out.mkdir(exist_ok=True)
        (out / "a.csv").write_text("x")
        try:
            raise KeyboardInterrupt
        finally:
            raise OSError(39, "Directory not empty")

    argv = ["--out", str(tmp_path / "o"), "--device", "cpu"]
    assert common.run_cli(flags.base_parser("p", "a test"), main, argv, "t") == 130
    printed = capsys.readouterr()
    assert printed.err == "p: while stopping: OSError: [Errno 39] Directory not empty\np: interrupted\n"
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.partial.csv"]


def test_a_png_is_exported_under_a_long_temporary_folder_and_nothing_is_left(tmp_path, monkeypatch):
    """The browser aborts when its sockets' paths under ``$TMPDIR`` pass 107 bytes: the scratch
    folder moves to /tmp then, and is removed afterwards."""
    import plotly.graph_objects as go

    from interp.browser import SOCKET_ROOM, screenshot_png

    browser = find_browser()
    if browser is None:
        pytest.skip("no Chrome or Chromium (Debian: apt-get install chromium, or set BROWSER_PATH)")
    long = tmp_path / ("t" * 60)
    long.mkdir()
    assert len(str(long)) > SOCKET_ROOM
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    made = []
    monkeypatch.setattr(
        interp.browser, "scratch_folder", lambda real=interp.browser.scratch_folder: made.append(real()) or made[-1]
    )
    fig = go.Figure(go.Bar(y=[1, 2]), layout={"width": 200, "height": 120})
    assert screenshot_png(fig, browser).startswith(b"\x89PNG")
    assert len(made) == 1 and made[0].parent == Path("/tmp") and not made[0].exists()
    assert list(long.iterdir()) == []


def test_ctrl_c_while_the_lock_is_written_leaves_no_lock(tmp_path, monkeypatch):
    from interp import lock

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lock.json, "dump", interrupted)
    out = tmp_path / "a" / "o"
    with pytest.raises(KeyboardInterrupt):
        with lock.out_lock(out, ".interp-x.lock"):
            pytest.fail("the lock was taken")
    assert not (tmp_path / "a").exists()  # no lock file, and the folders made for it are gone


def test_ctrl_c_right_after_a_temporary_file_is_made_leaves_nothing(tmp_path, monkeypatch):
    """The signal lands as ``mkstemp`` returns: the write stops, and its hidden temporary file goes."""
    from interp import _io

    real = tempfile.mkstemp

    def then_ctrl_c(*args, **kwargs):
        made = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return made

    monkeypatch.setattr(_io.tempfile, "mkstemp", then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "x.csv", "1")
    assert list(tmp_path.iterdir()) == []


def _interrupted_patch(monkeypatch, out):
    """``interp patch --by position`` stopped by Ctrl-C after its first group of patches."""
    from interp.ablation.replay import Sweeper
    from interp.cli import patch

    real, calls = Sweeper._evaluate_group, []

    def stopping(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    argv = ["--out", str(out), "--device", "cpu", "--batch", "3", "--no-progress", "--by", "position"]
    with monkeypatch.context() as m:
        m.setattr(Sweeper, "_evaluate_group", stopping)
        assert patch.cli(argv) == 130
    return argv


def test_an_interrupted_patch_run_names_its_files_once_says_interrupted_once_and_marks_its_top(
    monkeypatch, capsys, tmp_path
):
    out = tmp_path / "o"
    _interrupted_patch(monkeypatch, out)
    printed = capsys.readouterr()
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert names == [  # one name for the pairs file: <stem>_pairs.partial.csv, as a file marked at writing
        "patch_position.partial.csv",
        "patch_position.partial.html",
        "patch_position.partial.json",
        "patch_position_pairs.partial.csv",
    ]
    said = [line for line in (printed.out + printed.err).splitlines() if "interrupted" in line.replace(str(out), "")]
    assert said == ["python -m interp.patch: interrupted"], printed
    assert printed.err.endswith("\npython -m interp.patch: interrupted\n")
    table = pd.read_csv(out / "patch_position.partial.csv")
    missing = int(table["effect"].isna().sum())
    assert 0 < missing < len(table) == 8 * 21  # 8 heads x 21 positions, some done, some not
    (title,) = [line for line in printed.out.splitlines() if line.startswith("top ")]
    assert title.endswith(f"(partial: {missing} of {len(table)} head-positions missing, not yet computed):")
    assert len(PatchScores.load(out / "patch_position.partial.json", "patch_position").pairs)  # read back whole


def test_a_resumed_patch_run_removes_the_partial_files_it_supersedes_and_no_other(monkeypatch, capsys, tmp_path):
    from interp.cli import patch

    out = tmp_path / "o"
    argv = _interrupted_patch(monkeypatch, out)
    (out / "patch_head.partial.csv").write_text("another output's partial file\n")
    capsys.readouterr()
    assert patch.cli([*argv, "--resume"]) == 0
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert names == [
        "patch_head.partial.csv",  # not this output's: left alone
        "patch_position.csv",
        "patch_position.html",
        "patch_position.json",
        "patch_position_pairs.csv",
    ]
    printed = capsys.readouterr().out
    assert f"superseded by the complete ones above):\n  {out / 'patch_position.partial.csv'}\n" in printed


def test_an_interrupt_after_every_file_is_written_keeps_their_names_and_says_they_are_complete(
    tmp_path, capsys, monkeypatch
):
    """Chosen: the run is complete once every file is written; a Ctrl-C while the last lines print
    renames nothing, says so in one line, and exits 130 (the signal was still a Ctrl-C)."""
    from interp.cli import common, flags

    def main(args, model, out):
        (out / "a.csv").write_text("x")
        return [out / "a.csv"]

    def print_then_ctrl_c(written, replaced, removed=()):
        print("\nwrote:")
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "print_written", print_then_ctrl_c)
    argv = ["--out", str(tmp_path / "o"), "--device", "cpu"]
    assert common.run_cli(flags.base_parser("p", "a test"), main, argv, "t") == 130
    printed = capsys.readouterr()
    assert printed.err == "p: interrupted after every file was written: they are complete\n"
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.csv"]
