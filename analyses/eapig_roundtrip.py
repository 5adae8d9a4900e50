"""EAP-IG's graph JSON both ways, with EAP-IG's own code (``hannamw/EAP-IG``, in its own venv).

1. Ours to EAP-IG and back: for GPT-2 small's shape (32,491 edges), a GQA shape and a parallel-block
   shape, random scores and a random ``in_graph`` are written by :func:`interp.circuits.eapig.to_eapig`;
   EAP-IG's ``Graph.from_json`` reads each file and its ``to_json`` writes it again; our
   :func:`~interp.circuits.eapig.from_eapig` reads that back, and the scores and ``in_graph`` must be
   equal (EAP-IG keeps scores in float32, so the scores drawn are float32 values), the file text too.
2. EAP-IG to ours: EAP-IG's ``Graph.from_model`` builds the graph of a random-weight
   ``HookedTransformer`` of GPT-2 small's shape (no download), random scores and its ``apply_topn``
   (then its ``prune``) choose the circuit, ``to_json`` writes it; ours must read it with the same edge
   count and names, the same scores and ``in_graph``, and write back the same nodes and file text.

The peer's work runs in one child process of the peer's Python (TransformerLens < 4 beside EAP-IG).

    python analyses/eapig_roundtrip.py                          # the peer venv at .cache/peers/eapig
    python analyses/eapig_roundtrip.py --peer-python PATH       # another one
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from _common import ROOT

from interp.circuits import Graph, Shape
from interp.circuits.eapig import from_eapig, read_eapig_json, to_eapig, write_eapig_json
from interp.names import eapig_name

DEFAULT_PEER = Path(".cache/peers/eapig/bin/python")
INSTALL = (
    "python3 -m venv .cache/peers/eapig && .cache/peers/eapig/bin/pip install torch 'transformer-lens==2.16.1' "
    "'datasets<3' 'pyarrow<16' 'fsspec<2024.10' matplotlib, then .cache/peers/eapig/bin/pip install --no-deps -e "
    "<a checkout of github.com/hannamw/EAP-IG>"
)
GPT2 = Shape(12, 12, 12, tuple(range(12)))
CASES = {  # name: (shape, d_model written in the cfg)
    "gpt2-small": (GPT2, 768),
    "gqa": (Shape(2, 4, 2, (0, 1)), 64),
    "parallel": (Shape(3, 4, 4, (0, 1, 2), parallel=True), 64),
}
TOP_N = 2000  # EAP-IG's apply_topn in the reverse direction (its prune then drops the unconnected ones)

# run by the peer's Python: argv[1] the folder, argv[2] the cases (comma-separated), argv[3] top-n
PEER = r"""
import json, sys
from pathlib import Path
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from eap.graph import Graph

folder, cases, top_n = Path(sys.argv[1]), sys.argv[2].split(","), int(sys.argv[3])
report = {}
for case in cases:  # ours -> EAP-IG -> file
    g = Graph.from_json(str(folder / f"{case}.ours.json"))
    g.to_json(str(folder / f"{case}.peer.json"))
    report[case] = {"edges": len(g.edges), "in_graph": int(g.count_included_edges())}

cfg = HookedTransformerConfig(n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072, n_ctx=1024,
                              d_vocab=50257, act_fn="gelu_new", normalization_type="LN")
torch.manual_seed(0)
model = HookedTransformer(cfg)  # random weights, no download
model.cfg.use_split_qkv_input = model.cfg.use_attn_result = model.cfg.use_hook_mlp_in = True
g = Graph.from_model(model)
g.scores[:] = torch.randn(g.scores.shape) * g.real_edge_mask
g.apply_topn(top_n)
g.to_json(str(folder / "from_model.peer.json"))
report["from_model"] = {"edges": len(g.edges), "in_graph": int(g.count_included_edges()),
                        "nodes_in_graph": int(g.count_included_nodes()), "nodes": len(g.nodes)}
print(json.dumps(report))
"""


def float32_scores(n: int, rng: np.random.Generator) -> np.ndarray:
    """Random scores that float32 holds exactly (EAP-IG's score tensor is float32), as float64."""
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 3, n)).astype(np.float32).astype(np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", type=Path, default=DEFAULT_PEER, help="the EAP-IG venv's python")
    args = parser.parse_args()
    peer = args.peer_python if args.peer_python.is_absolute() else ROOT / args.peer_python
    if not peer.is_file():
        raise SystemExit(f"no EAP-IG peer Python at {args.peer_python}: install it ({INSTALL}) or pass --peer-python")

    rng = np.random.default_rng(0)
    sent: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for case, (shape, d_model) in CASES.items():
            graph = Graph(shape)
            scores = float32_scores(graph.n_edges, rng)
            in_graph = rng.random(graph.n_edges) < 0.1
            write_eapig_json(folder / f"{case}.ours.json", to_eapig(graph, in_graph, scores, d_model=d_model))
            sent[case] = in_graph, scores
        child = subprocess.run(
            [str(peer), "-c", PEER, str(folder), ",".join(CASES), str(TOP_N)],
            cwd=folder, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if child.returncode != 0:
            raise SystemExit(f"the EAP-IG peer failed (exit {child.returncode}):\n{child.stderr[-4000:]}")
        report = json.loads(child.stdout.strip().splitlines()[-1])

        print("ours -> EAP-IG Graph.from_json -> to_json -> ours")
        for case, (shape, _) in CASES.items():
            graph = Graph(shape)
            back = read_eapig_json(folder / f"{case}.peer.json")
            in_graph, scores = from_eapig(back, graph)
            assert np.array_equal(in_graph, sent[case][0]), f"{case}: in_graph differs"
            assert np.array_equal(scores, sent[case][1]), f"{case}: scores differ"
            same_text = (folder / f"{case}.peer.json").read_text() == (folder / f"{case}.ours.json").read_text()
            assert same_text, f"{case}: EAP-IG wrote another text than it read"
            copies = " (a key/value edge once per query head)" if shape.group > 1 else ""
            print(
                f"  {case:<11} {graph.describe()}; EAP-IG: {report[case]['edges']:,} edges{copies}, "
                f"{report[case]['in_graph']:,} in the graph; ours: {int(in_graph.sum()):,} in the graph; "
                "round trip: equal, file text identical"
            )

        print(f"EAP-IG Graph.from_model(HookedTransformer of GPT-2 small's shape) + apply_topn({TOP_N}) -> ours")
        graph = Graph(GPT2)
        theirs = read_eapig_json(folder / "from_model.peer.json")
        names = [eapig_name(e) for e in graph.table()["edge"]]  # ours spelled as EAP-IG spells them
        assert len(theirs["edges"]) == graph.n_edges == report["from_model"]["edges"], "edge counts differ"
        assert set(theirs["edges"]) == set(names), "edge names differ"
        in_graph, scores = from_eapig(theirs, graph)
        assert np.array_equal(scores, [theirs["edges"][n]["score"] for n in names]), "scores differ"
        assert np.array_equal(in_graph, [theirs["edges"][n]["in_graph"] for n in names]), "in_graph differs"
        ours = to_eapig(graph, in_graph, scores, d_model=768)
        assert ours["nodes"] == theirs["nodes"], "node in_graph differs from EAP-IG's"
        same_text = json.dumps(ours) == (folder / "from_model.peer.json").read_text()
        assert same_text, "our JSON of EAP-IG's graph is not its text"
        r = report["from_model"]
        ours_nodes = sum(v["in_graph"] for k, v in ours["nodes"].items() if k != "logits")
        print(
            f"  EAP-IG: {r['edges']:,} edges ({r['in_graph']:,} in the graph after its prune), {r['nodes']} nodes "
            f"({r['nodes_in_graph']} in the graph besides the logits); ours: {graph.n_edges:,} edges "
            f"({int(in_graph.sum()):,} in the graph), {ours_nodes} nodes in the graph besides the logits by our rule"
        )
        print("  names, scores, in_graph and node in_graph agree; our export is EAP-IG's file text")
    print("round trip: equal")


if __name__ == "__main__":
    sys.exit(main())
