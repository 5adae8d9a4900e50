"""``interp circuit`` on the toy: what it prints equals what it saves and what the library gives, the
files it writes, EAP-IG's JSON export read back, a resumed exact run, and bad input refused before
the model loads (exit 2, one line, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import interp
from interp.circuits import Circuit, EdgeScores, FaithfulnessCurve
from interp.cli.circuit import cli
from interp.models import describe
from interp.patching.edge_patch import EdgeSweeper

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = ["--device", "cpu", "--no-progress", "--n-boot", "200"]


def test_the_toy_repeat_circuit_prints_its_top_edges_the_faithful_size_and_the_areas(tmp_path, capsys):
    out = tmp_path / "out"
    export = tmp_path / "eapig.json"
    assert cli([*BASE, "--task", "repeat", "--direction", "noise", "--out", str(out), "--export", str(export)]) == 0
    text = capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert [n for n in names if not n.endswith(".png")] == [
        "circuit.csv", "circuit.html", "circuit.json", "circuit_faithfulness.csv", "circuit_faithfulness.html",
        "circuit_faithfulness.json", "edge_scores.csv", "edge_scores.json",
    ]  # fmt: skip
    scores = EdgeScores.load(out)
    assert "toy: 9 senders, 25 receivers, 81 edges (2 layers x 4 heads, 0 MLPs); task repeat: 20 pairs" in text
    # the printed top edges are the saved table's, in order, with their CIs
    top = scores.top(10)
    at = text.splitlines().index("top 10 edges by |score| (logit-diff units, 95% CI over pairs):")
    printed = [line.split()[0] for line in text.splitlines()[at + 1 : at + 11]]
    assert printed == list(top.edge)
    assert printed[:2] == ["1.2->logits", "1.1->logits"]  # as the README says (EAP, noising)
    curve = FaithfulnessCurve.load(out)
    reach = curve.meta["smallest_faithful"]
    assert (
        f"smallest circuit reaching faithfulness 0.8: {reach['n_edges']} edges "
        f"({reach['n_edges'] / curve.meta['graph_edges']:.2%} of the graph, after pruning)" in text
    )
    assert f"CPR {curve.meta['cpr']:.3f} (area under the curve), CMD {curve.meta['cmd']:.3f}" in text
    circuit = Circuit.load(out)
    assert circuit.n_edges == reach["n_edges"] and circuit.meta["faithfulness"] >= 0.8
    assert (
        f"circuit: {circuit.n_edges} edges of 81 ({circuit.n_edges / 81:.2%} of the graph; the smallest found reaching faithfulness 0.8)"
        in text
    )
    assert f"circuit of {circuit.n_edges} of 81 edges" in circuit.figure().layout.title.text
    # the library, called as a notebook would, gives the same curve
    model = interp.load_model("toy")
    config = interp.RunConfig(n_boot=200)
    direct = interp.edge_scores(model, "repeat", direction="noise", config=config)
    np.testing.assert_allclose(direct.table.score, scores.table.score, rtol=1e-6, atol=1e-7)
    again = direct.faithfulness_curve(model, "repeat", config=config)
    np.testing.assert_allclose(again.table.faithfulness, curve.table.faithfulness, rtol=1e-6, atol=1e-7)
    # the export is EAP-IG's graph JSON of that circuit
    blob = json.loads(export.read_text())
    assert set(blob) == {"cfg", "nodes", "edges"}
    assert sum(e["in_graph"] for e in blob["edges"].values()) == circuit.n_edges  # the toy's heads are not grouped
    assert Circuit.from_eapig(export, model).edges == circuit.edges
    width = describe(model).d_model  # EAP-IG sizes its neuron tensors by it: never 0
    assert blob["cfg"]["d_model"] == width and Circuit.from_eapig(export, model).to_json()["cfg"]["d_model"] == width
    assert f"  {export}" in text.splitlines()


def test_a_named_circuit_and_no_evaluation(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [*BASE, "--direction", "noise", "--greedy", "6", "--evaluate", "none", "--out", str(out)]
    assert cli(argv) == 0
    text = capsys.readouterr().out
    assert "circuit: " in text and "6 greedily from the logits" in text and "CPR" not in text
    assert not (out / "circuit_faithfulness.json").exists()
    circuit = Circuit.load(out)
    assert circuit.meta["how"] == "greedy" and circuit.n_edges <= 6


def test_position_specific_edges_print_and_save_their_pairs_and_the_curve_of_their_circuits(tmp_path, capsys):
    """--by position: the top (edge, position) pairs printed are the saved table's, the curve's summary
    counts pairs among the graph's pairs, no circuit of edges is written, and the library gives the same."""
    out = tmp_path / "out"
    argv = [*BASE, "--by", "position", "--direction", "noise", "--batch", "6", "--out", str(out)]
    assert cli(argv) == 0
    text = capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith(".") and not p.name.endswith(".png"))
    assert names == [
        "circuit_faithfulness.csv", "circuit_faithfulness.html", "circuit_faithfulness.json", "edge_scores.csv",
        "edge_scores.json",
    ]  # fmt: skip
    scores, curve = EdgeScores.load(out), FaithfulnessCurve.load(out)
    assert scores.by == "position" and len(scores.table) == 81 * 21 and curve.meta["graph_units"] == 81 * 21
    top = scores.top(10)
    at = text.splitlines().index("top 10 (edge, position) pairs by |score| (logit-diff units, 95% CI over pairs):")
    printed = [line.split()[0] for line in text.splitlines()[at + 1 : at + 11]]
    assert printed == [f"{e}@{p}" for e, p in zip(top.edge, top.position)]
    assert printed[0] == "1.2->logits@20"  # the induction head's write at the read position
    for line in curve.summary():
        assert f"  {line}" in text.splitlines()
    assert " (edge, position) pairs (" in curve.summary()[-1] and "circuit: " not in text
    model = interp.load_model("toy")
    config = interp.RunConfig(n_boot=200)
    direct = interp.edge_scores(model, "repeat", by="position", direction="noise", n_pairs=6, config=config)
    np.testing.assert_allclose(direct.table.score, scores.table.score, rtol=1e-6, atol=1e-7)
    again = direct.faithfulness_curve(model, "repeat", n_pairs=6, config=config)
    np.testing.assert_allclose(again.table.faithfulness, curve.table.faithfulness, rtol=1e-6, atol=1e-7)
    assert np.ptp(curve.table.faithfulness) > 0.5


def test_exact_edges_resume_from_their_journal_without_a_patched_forward(tmp_path, capsys, monkeypatch):
    from interp.journal import Journal

    model = interp.load_model("toy")
    config = interp.RunConfig(n_boot=200)
    journal = Journal(tmp_path, "edges", {"run": "exact"})
    journal.open()
    first = interp.edge_scores(model, "repeat", method="exact", n_pairs=6, config=config, journal=journal)
    journal.close()  # as a run that stopped before writing its files leaves it
    again = Journal(tmp_path, "edges", {"run": "exact"})
    again.open(resume=True)
    ran = []
    monkeypatch.setattr(EdgeSweeper, "_evaluate_group", lambda self, start, codes: ran.append(1))
    resumed = interp.edge_scores(model, "repeat", method="exact", n_pairs=6, config=config, journal=again)
    assert "resumed: 81 of 81 interventions of exact edge patching from" in capsys.readouterr().out
    assert not ran and resumed.table.equals(first.table)


def _refused(capsys, tmp_path, argv):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        cli(["--out", str(out), "--no-progress", "--model", "no/such-model", *argv])  # loading it would fail otherwise
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]
    return err[0]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--export", "c.txt"], "--export c.txt: EAP-IG's graph is a .json file; name one, e.g. circuit.json"),
        (["--evaluate", "none"], "--evaluate none leaves no faithfulness to choose the circuit by: pass --top N, --greedy N, --threshold T or --nodes N"),
        (["--steps", "3"], "python -m interp.circuit would ignore --steps (it applies to --method eap-ig-*): drop it"),
        (["--threshold", "-1"], "--threshold -1.0: the least |score| an edge keeps, a number >= 0"),
        (["--by", "position", "--top", "5"], "python -m interp.circuit would ignore --top (it applies to --by edge: circuits of (edge, position) pairs are the curve's top pairs): drop it"),
        (["--by", "position", "--export", "c.json"], "python -m interp.circuit would ignore --export (it applies to --by edge: circuits of (edge, position) pairs are the curve's top pairs): drop it"),
        (["--by", "position", "--method", "exact"], "--method exact patches each edge at every position at once; --by position takes an attribution method (eap, eap-ig-inputs, eap-ig-activations, clean-corrupted)"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line_before_the_model_loads(tmp_path, capsys, argv, said):
    assert _refused(capsys, tmp_path, argv) == f"python -m interp.circuit: error: {said}"


def test_cis_over_two_pairs_are_flagged_as_patch_flags_them(tmp_path, capsys):
    assert cli([*BASE, "--task", "repeat", "--batch", "2", "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.splitlines()
    note = "! CIs from 2 pairs: fewer than 5, so an interval says little about the spread; use a larger batch"
    top = lines.index(next(line for line in lines if line.startswith("top 10 edges by |score|")))
    assert all(" stability " in line and "]!  stability" in line for line in lines[top + 1 : top + 11])
    assert lines[top + 11] == note
    chosen = next(i for i, line in enumerate(lines) if line.startswith("circuit: "))
    assert lines[chosen].endswith("]!") and lines[chosen + 1] == note


def test_cis_over_enough_pairs_are_not_flagged(tmp_path, capsys):
    assert cli([*BASE, "--task", "repeat", "--batch", "6", "--out", str(tmp_path / "out")]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("! CIs from")]


def test_the_circuit_keeps_its_edges_cis_and_stability(tmp_path, capsys):
    """circuit.csv/json (and so the figure's hover) dropped the scores' CIs and stability."""
    out = tmp_path / "out"
    assert cli([*BASE, "--task", "repeat", "--batch", "6", "--out", str(out)]) == 0
    scores, circuit = EdgeScores.load(out / "edge_scores.json"), Circuit.load(out / "circuit.json")
    for column in ("score", "score_lo", "score_hi", "stability"):
        np.testing.assert_array_equal(circuit.table[column].to_numpy(), scores.table[column].to_numpy())
    assert (circuit.table["score_lo"] < circuit.table["score_hi"]).any()
    hover = [t.hovertext[0] for t in circuit.figure().data if t.hovertext is not None and len(t.hovertext)]
    edges = [text for text in hover if "<br>score " in text]  # an edge's hover (a node's says other things)
    assert edges and all("<br>stability " in text and "] (CI)" in text for text in edges), edges[:2]


def test_draw_caps_the_circuits_figure_and_says_so(tmp_path, capsys):
    """``--draw N`` draws the circuit's N strongest edges and says so; ``--draw all`` every one;
    ``--draw 0`` is refused before the model loads."""
    out = tmp_path / "out"
    args = [*BASE, "--task", "repeat", "--evaluate", "none", "--top", "40", "--out", str(out)]
    assert cli([*args, "--draw", "10"]) == 0
    circuit = Circuit.load(out)
    assert circuit.n_edges > 10
    assert "circuit.html draws its 10 edges of largest |score| (--draw all: every one)" in capsys.readouterr().out
    page = (out / "circuit.html").read_text()
    assert f"circuit of {circuit.n_edges} of 81 edges, its 10 of largest |score| drawn" in page
    assert cli([*args, "--draw", "all"]) == 0
    assert "draws its" not in capsys.readouterr().out
    assert ", its " not in (out / "circuit.html").read_text().split("circuit of ", 1)[1][:60]
    with pytest.raises(SystemExit) as stop:
        cli([*args, "--draw", "0"])
    assert (
        stop.value.code == 2 and "argument --draw: a number of edges >= 1, or all; got '0'\n" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "source, said", [("zero", "zero, a zero ablation"), ("resample", "another pair's prompt, a resample ablation")]
)
def test_evaluate_zero_and_resample_read_their_source_outside_each_circuit_and_say_so(tmp_path, capsys, source, said):
    out = tmp_path / "out"
    assert cli([*BASE, "--task", "repeat", "--evaluate", source, "--top", "30", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"circuits at MIB's sizes (top; outside each circuit, edges read {said}), " in text
    curve = FaithfulnessCurve.load(out)
    assert curve.meta["source"] == source and curve.meta["empty_metric"] != curve.meta["corrupted_metric"]


def test_nodes_names_a_node_circuit_evaluated_on_its_own(tmp_path, capsys):
    """``--nodes N``: every edge out of the N senders of largest |node score|, its faithfulness that of
    its own evaluation (the curve's circuits are edge circuits, never taken for it)."""
    out = tmp_path / "out"
    assert cli([*BASE, "--task", "repeat", "--direction", "noise", "--nodes", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    scores, circuit = EdgeScores.load(out), Circuit.load(out)
    want = scores.node_circuit(3)
    assert (
        circuit.meta["level"] == "node" and circuit.meta["nodes"] == want.meta["nodes"] and circuit.edges == want.edges
    )
    model, config = interp.load_model("toy"), interp.RunConfig(n_boot=200)
    own = want.evaluate(model, "repeat", config=config).table.iloc[0]
    assert circuit.meta["faithfulness"] == pytest.approx(own.faithfulness, rel=1e-6)
    assert (
        f"circuit: {circuit.n_edges} edges of 81 ({circuit.n_edges / 81:.2%} of the graph; out of the 3 nodes of "
        f"largest |node score|), " in text
    )
    with pytest.raises(SystemExit) as stop:
        cli([*BASE, "--task", "repeat", "--nodes", "3", "--top", "5", "--out", str(tmp_path / "two")])
    assert stop.value.code == 2 and "error: --top and --nodes each choose the circuit: pass one of them\n" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as stop:
        cli([*BASE, "--task", "repeat", "--nodes", "10", "--out", str(tmp_path / "many")])
    assert (
        stop.value.code == 2 and "--nodes 10: the graph has 9 senders; ask for at most 9\n" in capsys.readouterr().err
    )
    assert not (tmp_path / "many" / "edge_scores.csv").exists()  # refused before any file


@pytest.mark.parametrize("by", ["edge", "position"])
@pytest.mark.parametrize("stage", ["sizes", "refine1", "refine2"])
def test_ctrl_c_in_any_pass_of_the_curve_ends_the_run_marked_partial(tmp_path, capsys, monkeypatch, stage, by):
    """An interrupt during MIB's sizes or either refinement round ends the command: exit 130, the
    curve marked partial, no circuit written as if complete, and no later pass runs (by edge and by
    position)."""
    evaluate, group = EdgeSweeper.evaluate, EdgeSweeper._evaluate_group
    passes: list[str] = []

    def evaluate_named(self, units, *, desc="patching edges", scope=None, named=None):
        passes.append(desc)
        return evaluate(self, units, desc=desc, scope=scope, named=named)

    def stopping(self, start, codes):
        if stage in passes[-1]:
            raise KeyboardInterrupt
        return group(self, start, codes)

    monkeypatch.setattr(EdgeSweeper, "evaluate", evaluate_named)
    monkeypatch.setattr(EdgeSweeper, "_evaluate_group", stopping)
    out = tmp_path / "out"
    assert cli([*BASE, "--task", "repeat", "--direction", "noise", "--by", by, "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert captured.err.endswith("\npython -m interp.circuit: interrupted\n")
    assert passes[-1] == f"evaluating circuits ({stage})"  # nothing ran after the interrupted pass
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert "circuit_faithfulness.partial.json" in names and "circuit.json" not in names, names
    assert not [n for n in names if n.endswith(".tmp")]
