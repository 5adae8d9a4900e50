"""Circuits as graphs: the edges between a model's components, their scores, and the circuits they make.

The graph (:mod:`interp.patching.graph`) has EAP-IG's and MIB's nodes, spelled as every table here
spells a component (:mod:`interp.names`: ``input``, ``{l}.{h}`` with its ``<q>``, ``<k>``, ``<v>``
inputs, ``mlp.{l}``, ``logits``; EAP-IG's ``a{l}.h{h}`` and ``m{l}`` in its JSON) and the edges between
them (:class:`Graph`, :func:`count_edges`, :func:`graph_of`, which refuses a model the graph cannot
describe exactly). :mod:`~interp.circuits.edges` scores every edge on a task (:func:`edge_scores`,
by the methods of :data:`METHODS`: attribution, or exact edge patching on the one intervention
replay, :mod:`interp.patching.edge_patch`) into an :class:`EdgeScores`;
:mod:`~interp.circuits.circuit` extracts a :class:`Circuit` from them and evaluates circuits exactly
(:func:`faithfulness_curve`, MIB's CPR and CMD); :mod:`~interp.circuits.eapig` reads and writes
EAP-IG's graph JSON; :mod:`~interp.circuits.figure` draws a circuit. What heads write and read is
:mod:`interp.roles`.
"""

from interp.circuits.circuit import (
    HOWS,
    MIB_FRACTIONS,
    Circuit,
    evaluate_circuits,
    faithfulness_curve,
    validate_circuit,
)
from interp.circuits.curve import FaithfulnessCurve
from interp.circuits.edges import METHODS, EdgeScores, edge_scores, stability, validate_edge_scores
from interp.patching.graph import Graph, Shape, count_edges, graph_of

__all__ = [
    "HOWS",
    "METHODS",
    "MIB_FRACTIONS",
    "Circuit",
    "EdgeScores",
    "FaithfulnessCurve",
    "Graph",
    "Shape",
    "count_edges",
    "edge_scores",
    "evaluate_circuits",
    "faithfulness_curve",
    "graph_of",
    "stability",
    "validate_circuit",
    "validate_edge_scores",
]
