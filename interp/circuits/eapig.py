"""EAP-IG's graph JSON (``hannamw/EAP-IG``, ``Graph.to_json`` / ``Graph.from_json``): edge scores and
circuits exchanged with EAP-IG and with the tools that read its files.

The file is one JSON object with three keys:

- ``cfg``: what EAP-IG's ``Graph.from_model`` builds the graph from: ``n_layers``, ``n_heads`` (query
  heads), ``parallel_attn_mlp`` and ``d_model`` (read only to size its neuron-level tensors, which an
  edge graph leaves empty: :func:`to_eapig` writes 0 when it is not given). Keys it does not know
  travel through its ``from_json``/``to_json`` unchanged; on GQA/MQA we add TransformerLens's
  ``n_key_value_heads``, and :func:`from_eapig` checks it where present;
- ``nodes``: ``{name: {"in_graph": bool}}`` for ``input``, every ``a{l}.h{h}``, every ``m{l}`` and
  ``logits``, in the order EAP-IG builds them (``logits`` is always in the graph). These are EAP-IG's
  names; :meth:`Graph.table` spells the same nodes ``{l}.{h}`` and ``mlp.{l}`` (:mod:`interp.names`);
- ``edges``: ``{"sender->receiver": {"score": float, "in_graph": bool}}`` for every edge, named as
  EAP-IG names them (``a0.h1->a1.h2<k>``, ``m0->logits``, ``input->a0.h0<q>``; in our tables
  ``0.1->1.2<k>``, ``mlp.0->logits``, ``input->0.0<q>``), in
  EAP-IG's order: layer by layer the heads' inputs (sender, then head, then ``q``/``k``/``v``), then
  the MLP's (in a parallel block the MLP's inputs come with the heads', sender by sender), then the
  logits'.

What differs from our graph, and how it is carried:

- **GQA/MQA.** EAP-IG has one ``<k>`` and one ``<v>`` receiver per *query* head: it asks for
  TransformerLens's ``ungroup_grouped_query_attention``, which gives each query head its own copy of
  the key/value head's input. Our key/value receiver ``{l}.kv{j}<k>`` is written as one edge per
  query head it serves. The gradient at a shared input is the sum of the gradients at its copies, so
  the kv edge's score is the *sum* of its copies' scores: :func:`to_eapig` writes ``score / group``
  on each copy (the last copy takes the rounding remainder, so that the sum in query-head order gives
  the score back bit for bit), and :func:`from_eapig` adds the copies in query-head order. A kv edge
  is in the graph if any of its copies is (:func:`to_eapig` writes the kv edge's ``in_graph`` on every
  copy). The round trip is exact.
- **Layers without an MLP.** EAP-IG's graph has an MLP in every layer. An MLP our graph lacks is
  written with its edges out of the graph and scored 0 (and its node out of the graph);
  :func:`from_eapig` accepts such edges only when they are so, and refuses them otherwise.
- **Precision.** EAP-IG holds scores in a float32 tensor: a JSON it reads and writes back keeps
  float32 scores exactly (on GQA, for a group size that is a power of two), and rounds others.
- **Node and neuron scores** (``score``, ``neurons``, ``neurons_scores`` on a node) are not read: a
  circuit here is a set of edges.

A node's ``in_graph`` follows EAP-IG's rule (``apply_topn``/``apply_threshold`` on edges, then
``prune``): a node is in the graph when one of its outgoing edges is and one of its incoming edges is
(the input counts as having incoming edges; the logits are always in).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from jaxtyping import Bool, Float

from interp._io import atomic_write
from interp.errors import UsageError
from interp.names import INPUT, LOGITS, eapig_name, edge_name, head_name, receiver_name
from interp.patching.graph import MLP_SITE, Graph, Shape

KEYS = ("cfg", "nodes", "edges")  # what EAP-IG's from_json asserts
CFG_KEYS = ("n_layers", "n_heads", "parallel_attn_mlp")  # what a graph's shape is read from
KV_KEY = "n_key_value_heads"  # ours (TransformerLens's name), where key/value heads are grouped
_FORMAT = "pass what EAP-IG's Graph.to_json writes"


@dataclass(frozen=True)
class _Layout:
    """EAP-IG's edges of a graph's shape, in its order, and where each one is in ours.

    ``names``: EAP-IG's edge names; ``ours``: the :meth:`Graph.table` row of the edge each one
    carries, -1 for an edge of an MLP our graph lacks; ``kv``: whether it is one query head's copy of
    a key/value receiver's edge, ``part`` which copy (0 for every other edge); ``sender`` and
    ``receiver``: its nodes' indices in ``nodes`` (EAP-IG's node names, in its order);
    ``absent_mlp``: for each edge with ``ours == -1``, the layer of the missing MLP it touches."""

    names: list[str]
    ours: np.ndarray
    part: np.ndarray
    kv: np.ndarray
    sender: np.ndarray
    receiver: np.ndarray
    nodes: list[str]
    absent_mlp: dict[int, int]


@lru_cache(maxsize=8)
def _layout(shape: Shape) -> _Layout:
    graph = Graph(shape)
    L, H = shape.n_layers, shape.n_heads
    # EAP-IG's graph: every query head has its own k/v receivers, every layer an MLP
    full = Graph(Shape(L, H, H, tuple(range(L)), shape.parallel))
    mask = full.edges.numpy()
    s_idx, r_idx = np.nonzero(mask)
    rcv = full.receivers

    def block(r: int) -> int:  # the heads' inputs of a layer, then its MLP's (with the heads' when parallel)
        n = rcv[r]
        return 2 * n.layer + (n.site == MLP_SITE and not shape.parallel)

    def within(r: int) -> int:  # head, then q/k/v; the MLP after every head
        n = rcv[r]
        return 3 * n.index + "qkv".index(n.site) if n.kind == "head" else 3 * H

    order = np.lexsort(
        (
            np.array([within(r) for r in range(len(rcv))])[r_idx],
            s_idx,
            np.array([block(r) for r in range(len(rcv))])[r_idx],
        )
    )
    s_idx, r_idx = s_idx[order], r_idx[order]
    nodes = [eapig_name(n.name) for n in full.senders] + [LOGITS]
    node_of = {name: i for i, name in enumerate(nodes)}
    receiver_node = np.array([node_of[eapig_name(n.name).split("<")[0]] for n in rcv])
    names = [eapig_name(edge_name(full.senders[s].name, rcv[r].name)) for s, r in zip(s_idx.tolist(), r_idx.tolist())]

    # where each of EAP-IG's edge names is among ours: a key/value receiver's copies by query head
    ours_of: dict[str, tuple[int, int, bool]] = {}
    index = _edge_index(graph)
    for r, node in enumerate(graph.receivers):
        kv = node.site in ("k", "v") and shape.group > 1
        copies = [receiver_name(head_name(node.layer, q), node.site) for q in node.query_heads] if kv else [node.name]
        for s in np.nonzero(index[:, r] >= 0)[0].tolist():
            for part, name in enumerate(copies):
                ours_of[eapig_name(edge_name(graph.senders[s].name, name))] = (int(index[s, r]), part, kv)
    where = [ours_of.get(n, (-1, 0, False)) for n in names]
    ours = np.array([w[0] for w in where], dtype=np.int64)
    part = np.array([w[1] for w in where], dtype=np.int64)
    kv = np.array([w[2] for w in where], dtype=bool)
    mlps = set(shape.mlp_layers)
    absent: dict[int, int] = {}
    for i in np.nonzero(ours < 0)[0].tolist():
        ends = (full.senders[s_idx[i]], rcv[r_idx[i]])
        layers = [n.layer for n in ends if n.kind == MLP_SITE and n.layer not in mlps]
        assert layers, f"{names[i]} is in EAP-IG's graph and not in ours, yet touches no absent MLP"
        absent[i] = layers[0]
    assert len(ours_of) == int((ours >= 0).sum()), "some of our edges have no EAP-IG name"
    return _Layout(names, ours, part, kv, s_idx, receiver_node[r_idx], nodes, absent)


def _edge_index(graph: Graph) -> np.ndarray:
    """``[sender, receiver]``: the :meth:`Graph.table` row of each edge (receiver-major), -1 where none."""
    mask_t = graph.edges.numpy().T
    index_t = np.full(mask_t.shape, -1, dtype=np.int64)
    index_t[mask_t] = np.arange(int(mask_t.sum()))
    return index_t.T


def _cfg(graph: Graph, d_model: int | None) -> dict[str, Any]:
    s = graph.shape
    cfg: dict[str, Any] = {
        "n_layers": s.n_layers,
        "n_heads": s.n_heads,
        "parallel_attn_mlp": s.parallel,
        "d_model": int(d_model or 0),
    }
    if s.group > 1:
        cfg[KV_KEY] = s.n_kv_heads
    return cfg


def _per_edge(values: Any, graph: Graph, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != (graph.n_edges,):
        raise UsageError(
            f"{name}= has shape {tuple(array.shape)}, the graph has {graph.n_edges:,} edges: pass one value per "
            "row of graph.table(), in its order",
            params=name,
        )
    return array


def _split(scores: Float[np.ndarray, " edge"], group: int) -> tuple[np.ndarray, np.ndarray]:
    """Each score as ``group`` copies that add up to it in order: ``score / group`` on all but the
    last copy, and on the last the remainder ``score - (sum of the others)``. The others' sum lies
    between half the score and the score, so the subtraction is exact (Sterbenz), and so is the sum.
    Zero, inf and NaN are written as they are on every copy."""
    share = scores / group
    others = share.copy()
    for _ in range(group - 2):
        others = others + share
    last = scores - others
    plain = ~np.isfinite(scores) | (scores == 0)
    return np.where(plain, scores, share), np.where(plain, scores, last)


def to_eapig(
    graph: Graph,
    in_graph: Bool[np.ndarray, " edge"] | None = None,
    scores: Float[np.ndarray, " edge"] | None = None,
    *,
    nodes_in_graph: Mapping[str, bool] | Bool[np.ndarray, " sender"] | None = None,
    d_model: int | None = None,
) -> dict[str, Any]:
    """EAP-IG's graph JSON (a dict, ready for ``json.dumps`` or :func:`write_eapig_json`) of ``graph``.

    ``in_graph`` (bool) and ``scores`` (float) hold one value per edge in :meth:`Graph.table` order
    (``EdgeScores.table["score"]`` is one); without them every edge is out of the graph and scored 0,
    as EAP-IG's fresh graph is. A node's ``in_graph`` follows EAP-IG's rule (the module docstring)
    unless ``nodes_in_graph`` gives it: a mapping from node names, or one bool per ``graph.senders``.
    ``d_model``: the model's width, for the ``cfg`` (EAP-IG reads it only to size neuron-level
    tensors; 0 when not given). A key/value receiver's edge is written once per query head it
    serves, its score split so that the copies add up to it (the module docstring)."""
    layout = _layout(graph.shape)
    E = graph.n_edges
    inside = np.zeros(E, dtype=bool) if in_graph is None else _per_edge(in_graph, graph, "in_graph")
    if inside.dtype != np.bool_:
        raise UsageError(
            f"in_graph= holds {inside.dtype} values, not booleans: pass e.g. np.abs(scores) >= threshold",
            params="in_graph",
        )
    values = np.zeros(E) if scores is None else _per_edge(scores, graph, "scores").astype(np.float64)

    kept = layout.ours >= 0
    edge_in = np.zeros(len(layout.names), dtype=bool)
    edge_in[kept] = inside[layout.ours[kept]]
    edge_score = np.zeros(len(layout.names))
    edge_score[kept] = values[layout.ours[kept]]
    g = graph.shape.group
    if g > 1:  # the copies of a key/value receiver's edge share its score
        share, last = _split(edge_score, g)
        edge_score = np.where(layout.kv, np.where(layout.part == g - 1, last, share), edge_score)

    node_in = _nodes_in_graph(layout, edge_in)
    if nodes_in_graph is not None:
        node_in = _given_nodes(graph, layout, nodes_in_graph, node_in)
    return {
        "cfg": _cfg(graph, d_model),
        "nodes": {name: {"in_graph": flag} for name, flag in zip(layout.nodes, node_in.tolist())},
        "edges": {
            name: {"score": score, "in_graph": flag}
            for name, score, flag in zip(layout.names, edge_score.tolist(), edge_in.tolist())
        },
    }


def _nodes_in_graph(layout: _Layout, edge_in: Bool[np.ndarray, " eapig_edge"]) -> Bool[np.ndarray, " node"]:
    """EAP-IG's rule: in the graph when an outgoing and an incoming edge are (the input needs only
    the outgoing one; the logits are always in)."""
    n = len(layout.nodes)
    outgoing = np.zeros(n, dtype=bool)
    outgoing[layout.sender[edge_in]] = True
    incoming = np.zeros(n, dtype=bool)
    incoming[layout.receiver[edge_in]] = True
    incoming[layout.nodes.index(INPUT)] = True
    node_in = outgoing & incoming
    node_in[layout.nodes.index(LOGITS)] = True
    return node_in


def _given_nodes(
    graph: Graph, layout: _Layout, given: Mapping[str, bool] | np.ndarray, derived: np.ndarray
) -> np.ndarray:
    """``derived`` with the nodes ``given`` (by name, or one bool per ``graph.senders``) set as given."""
    node_in = derived.copy()
    if isinstance(given, Mapping):
        named = dict(given)
    else:
        flags = np.asarray(given)
        if flags.shape != (len(graph.senders),) or flags.dtype != np.bool_:
            raise UsageError(
                f"nodes_in_graph= has shape {tuple(flags.shape)} and dtype {flags.dtype}: pass one bool per "
                f"graph.senders ({len(graph.senders)}) or a mapping from node names",
                params="nodes_in_graph",
            )
        named = {node.name: bool(flag) for node, flag in zip(graph.senders, flags.tolist())}
    position = {name: i for i, name in enumerate(layout.nodes)}
    unknown = [name for name in named if eapig_name(name) not in position]
    if unknown:
        raise UsageError(
            f"nodes_in_graph= names {len(unknown)} node(s) EAP-IG's graph of this shape lacks (first: {unknown[0]!r}): "
            f"name nodes as graph.senders does ({INPUT!r}, '0.0', 'mlp.0', {LOGITS!r}) or as EAP-IG does ('a0.h0', 'm0')",
            params="nodes_in_graph",
        )
    named = {eapig_name(name): flag for name, flag in named.items()}
    if named.get(LOGITS, True) is not True:
        raise UsageError(
            f"nodes_in_graph= takes {LOGITS!r} out of the graph: EAP-IG's logits are always in it; drop that entry",
            params="nodes_in_graph",
        )
    for name, flag in named.items():
        node_in[position[name]] = bool(flag)
    return node_in


def _check_keys(data: Any, where: str) -> None:
    """Refuse what is not EAP-IG's graph JSON: not an object, or without ``cfg``/``nodes``/``edges``."""
    if not isinstance(data, dict):
        raise UsageError(
            f"{where} is not an EAP-IG graph: a JSON {type(data).__name__}, not an object with keys "
            f"{', '.join(map(repr, KEYS))}: {_FORMAT}"
        )
    missing = [k for k in KEYS if k not in data]
    if missing:
        raise UsageError(
            f"{where} is not an EAP-IG graph: it lacks {', '.join(map(repr, missing))} (EAP-IG writes "
            f"{', '.join(map(repr, KEYS))}): {_FORMAT}"
        )
    for key in KEYS:
        if not isinstance(data[key], dict):
            raise UsageError(
                f"{where} is not an EAP-IG graph: its {key!r} is a JSON {type(data[key]).__name__}, not an object: "
                f"{_FORMAT}"
            )


def _check_cfg(cfg: dict[str, Any], graph: Graph) -> None:
    """Refuse a ``cfg`` whose shape is not ``graph``'s, naming every difference."""
    missing = [k for k in CFG_KEYS if k not in cfg]
    if missing:
        raise UsageError(
            f"the EAP-IG graph's cfg lacks {', '.join(map(repr, missing))} (EAP-IG's graph is built from "
            f"{', '.join(CFG_KEYS)}): {_FORMAT}"
        )
    s = graph.shape
    ours = {"n_layers": s.n_layers, "n_heads": s.n_heads, "parallel_attn_mlp": s.parallel}
    if KV_KEY in cfg:  # absent in what EAP-IG writes from a model (it ungroups GQA); ours writes it
        ours[KV_KEY] = s.n_kv_heads
    differ = [
        f"{k} {cfg[k]!r} in the JSON, {v!r} here" for k, v in ours.items() if type(cfg[k]) is not type(v) or cfg[k] != v
    ]
    if differ:
        raise UsageError(
            f"the EAP-IG graph is not this graph's: {'; '.join(differ)}: read it with the graph of the model it "
            "was made for"
        )


def _first(names: list[str]) -> str:
    return f"{names[0]!r}" + (f" and {len(names) - 1:,} more" if len(names) > 1 else "")


def from_eapig(data: dict[str, Any], graph: Graph) -> tuple[Bool[np.ndarray, " edge"], Float[np.ndarray, " edge"]]:
    """``(in_graph, scores)``, one per edge of ``graph`` in :meth:`Graph.table` order, from EAP-IG's
    graph JSON (``json.load`` of what its ``Graph.to_json`` writes, or :func:`to_eapig`'s dict).

    A key/value receiver's edge gathers its query heads' copies: it is in the graph if any copy is,
    and its score is their sum in query-head order (the module docstring). Node values are not read
    (they follow from the edges). Refused, naming what differs: a JSON without EAP-IG's keys, a cfg
    of another shape, an edge of ours it lacks, an edge our graph lacks (an edge of an MLP our graph
    has not is accepted only out of the graph and scored 0), an edge value that is not
    ``{"score": number, "in_graph": bool}``."""
    _check_keys(data, "the JSON")
    _check_cfg(data["cfg"], graph)
    layout = _layout(graph.shape)
    edges: dict[str, Any] = data["edges"]
    missing = [name for name in layout.names if name not in edges]
    if missing:
        raise UsageError(
            f"the EAP-IG graph lacks edge {_first(missing)} of the {len(layout.names):,} its graph of this shape has: "
            f"it was cut short or made for another model; {_FORMAT}"
        )
    if len(edges) != len(layout.names):
        known = set(layout.names)
        extra = [name for name in edges if name not in known]
        raise UsageError(
            f"the EAP-IG graph has edge {_first(extra)} that this graph lacks: read it with the graph of the model "
            "it was made for"
        )
    node_names = set(layout.nodes)
    unknown_nodes = [name for name in data["nodes"] if name not in node_names]
    if unknown_nodes:
        raise UsageError(
            f"the EAP-IG graph has node {_first(unknown_nodes)} that this graph lacks: read it with the graph of the "
            "model it was made for"
        )

    n = len(layout.names)
    edge_in = np.zeros(n, dtype=bool)
    edge_score = np.zeros(n)
    for i, name in enumerate(layout.names):
        value = edges[name]
        score = value.get("score") if isinstance(value, dict) else None
        flag = value.get("in_graph") if isinstance(value, dict) else None
        if type(flag) is not bool or type(score) not in (float, int):
            raise UsageError(
                f"the EAP-IG graph's edge {name!r} is {value!r}, not {{'score': number, 'in_graph': bool}}: {_FORMAT}"
            )
        edge_in[i], edge_score[i] = flag, score
    for i, layer in layout.absent_mlp.items():
        if edge_in[i] or edge_score[i] != 0:
            raise UsageError(
                f"the EAP-IG graph keeps edge {layout.names[i]!r} (in the graph: {bool(edge_in[i])}, score "
                f"{float(edge_score[i])!r}) but this graph has no MLP in layer {layer}: read it with the graph of the "
                "model it was made for"
            )

    inside = np.zeros(graph.n_edges, dtype=bool)
    scores = np.zeros(graph.n_edges)
    kept = layout.ours >= 0
    for part in range(graph.shape.group):  # the copies of a key/value edge, added in query-head order
        at = kept & (layout.part == part)
        rows = layout.ours[at]
        if part == 0:
            scores[rows] = edge_score[at]
        else:
            scores[rows] += edge_score[at]
        inside[rows] |= edge_in[at]
    return inside, scores


def write_eapig_json(path: str | os.PathLike, data: dict[str, Any]) -> Path:
    """Write EAP-IG's graph JSON to ``path`` atomically (:func:`interp._io.atomic_write`), as EAP-IG's
    ``to_json`` lays it out (``json.dumps``' default separators, no indent); returns the path written."""
    _check_keys(data, "the data to write")
    return atomic_write(path, json.dumps(data))


def read_eapig_json(path: str | os.PathLike) -> dict[str, Any]:
    """EAP-IG's graph JSON read from ``path``; refused when the file is missing, is not UTF-8 JSON,
    or lacks EAP-IG's keys (``cfg``, ``nodes``, ``edges``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(
            f"cannot read {path}: {(e.strerror or type(e).__name__).lower()}: pass the path of a JSON file EAP-IG's "
            "Graph.to_json wrote"
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"{path} is not UTF-8 text (byte {e.start}): pass a JSON file EAP-IG's Graph.to_json wrote"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(
            f"{path} is not JSON ({e.msg} at line {e.lineno} column {e.colno}): pass a JSON file EAP-IG's "
            "Graph.to_json wrote"
        ) from None
    _check_keys(data, str(path))
    return data
