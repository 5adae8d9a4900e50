"""Circuits as graphs: the graph of edges between a model's components and their attribution scores.

:mod:`~interp.patching.graph` names the nodes as EAP-IG and MIB do (``input``, ``a{l}.h{h}`` with its
``<q>``, ``<k>``, ``<v>`` inputs, ``m{l}``, ``logits``) and the edges between them (:class:`Graph`,
:func:`count_edges`, :func:`graph_of`, which refuses a model the graph cannot describe exactly);
:mod:`~interp.circuits.edges` scores every edge on a task (:func:`edge_scores`, by the methods of
:data:`METHODS`) into an :class:`EdgeScores`. What heads write and read is :mod:`interp.roles`.
"""

from interp.circuits.edges import METHODS, EdgeScores, edge_scores, stability, validate_edge_scores
from interp.patching.graph import Graph, Shape, count_edges, graph_of

__all__ = [
    "METHODS",
    "EdgeScores",
    "Graph",
    "Shape",
    "count_edges",
    "edge_scores",
    "graph_of",
    "stability",
    "validate_edge_scores",
]
