"""The computational graph that edge attribution scores and circuits are subgraphs of.

The nodes are EAP-IG's and MIB's, so scores and circuits compare with theirs; they are spelled as
every table here spells a component (:mod:`interp.names`; EAP-IG's own names go into its JSON):

- ``input``: the embeddings (token and position), the stream entering block 0;
- ``{l}.{h}``: attention head ``h`` of layer ``l``, a *sender* through its output (``z_h W_O_h``)
  and a *receiver* through each of its inputs ``{l}.{h}<q>``, ``<k>``, ``<v>`` separately (the
  residual stream before the block's norm, as that head's queries, keys or values read it); on
  GQA/MQA a key or value receiver is its key/value head, ``{l}.kv{j}<k>``, shared by the query
  heads ``j * group .. (j + 1) * group - 1``;
- ``mlp.{l}``: layer ``l``'s MLP, a sender through its output and a receiver through its input;
- ``logits``: a receiver (the final residual, before the final norm).

An edge ``sender -> receiver`` exists wherever the sender writes the residual stream upstream of
where the receiver reads it: a head reads what the layers below it wrote; an MLP also reads its own
layer's heads, except in a parallel block (GPT-J, NeoX), where it reads the same residual as
attention. :func:`count_edges` is the count from the shape alone (GPT-2 small: 32,491, as EAP-IG's
``Graph.from_model``); :func:`graph_of` reads a model's graph, refusing, before any work, a model the
graph cannot describe exactly (:func:`refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool
from torch import Tensor

from interp.adapters import HookedModel, gated_attention_modules
from interp.adapters.info import is_parallel, mlp_layers
from interp.adapters.weights import post_attention_norm_site
from interp.errors import UsageError
from interp.models import ModelInfo, describe
from interp.names import INPUT, LOGITS, edge_name, head_name, kv_name, mlp_name, receiver_name

MLP_SITE = "mlp"
HEAD_SITES = ("q", "k", "v")


@dataclass(frozen=True)
class Node:
    """One sender or receiver: its name, kind (input, head, mlp, logits), layer (-1 for the input,
    ``n_layers`` for the logits), index (head or key/value head), the site it is read at (a
    receiver's ``q``/``k``/``v``/``mlp``/``logits``; ``""`` for a sender) and its stream stage: a
    sender writes at its stage, a receiver reads every stage below its own."""

    name: str
    kind: str
    layer: int
    index: int
    site: str
    stage: int
    query_heads: tuple[int, ...] = ()


@dataclass(frozen=True)
class Shape:
    """What a graph is built from: layers, query and key/value heads, which layers have an MLP, and
    whether attention and MLP read the same residual (a parallel block)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlp_layers: tuple[int, ...]
    parallel: bool = False

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    def as_dict(self) -> dict[str, Any]:
        """The shape as a result's meta holds it (:meth:`of_dict` reads it back)."""
        return {
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "mlp_layers": list(self.mlp_layers),
            "parallel": self.parallel,
        }

    @classmethod
    def of_dict(cls, d: Any) -> Shape:
        if not isinstance(d, dict):
            raise UsageError(
                "this result's meta holds no graph shape (meta['shape']): score the edges again to get one"
            )
        return cls(d["n_layers"], d["n_heads"], d["n_kv_heads"], tuple(d["mlp_layers"]), bool(d["parallel"]))


class Graph:
    """Senders, receivers and the edges between them (``edges[s, r]``: sender ``s`` reaches receiver ``r``)."""

    def __init__(self, shape: Shape):
        if shape.n_kv_heads < 1 or shape.n_heads % shape.n_kv_heads:
            raise UsageError(f"{shape.n_heads} query heads and {shape.n_kv_heads} key/value heads: not a grouping")
        self.shape = shape
        s, L = shape, shape.n_layers
        mlp = set(s.mlp_layers)
        senders = [Node(INPUT, "input", -1, 0, "", -1)]
        receivers: list[Node] = []
        for l in range(L):
            senders += [Node(head_name(l, h), "head", l, h, "", 2 * l) for h in range(s.n_heads)]
            receivers += [
                Node(receiver_name(head_name(l, h), "q"), "head", l, h, "q", 2 * l, (h,)) for h in range(s.n_heads)
            ]
            for site in ("k", "v"):
                receivers += [_kv_receiver(l, j, site, s.group) for j in range(s.n_kv_heads)]
            if l in mlp:
                senders.append(Node(mlp_name(l), MLP_SITE, l, 0, "", 2 * l + 1))
                receivers.append(Node(mlp_name(l), MLP_SITE, l, 0, MLP_SITE, 2 * l if s.parallel else 2 * l + 1))
        receivers.append(Node(LOGITS, LOGITS, L, 0, LOGITS, 2 * L))
        self.senders, self.receivers = senders, receivers

    @cached_property
    def edges(self) -> Bool[Tensor, "sender receiver"]:
        send = torch.tensor([n.stage for n in self.senders])
        read = torch.tensor([n.stage for n in self.receivers])
        return send[:, None] < read[None, :]

    @property
    def n_edges(self) -> int:
        return int(self.edges.sum())

    def edge_index(self) -> Tensor:
        """``[edge, 2]``: each edge's (sender, receiver) index, in :meth:`table` order."""
        return self.edges.T.nonzero().flip(1)

    def receivers_of(self, layer: int) -> list[int]:
        """The indices of the receivers read in ``layer`` (``n_layers``: the logits)."""
        return [i for i, n in enumerate(self.receivers) if n.layer == layer]

    def upstream(self, receiver: int) -> int:
        """How many senders (a prefix of :attr:`senders`) reach ``receiver``."""
        return int(self.edges[:, receiver].sum())

    def table(self) -> pd.DataFrame:
        """One row per edge, in receiver order (layer by layer, then the logits), then sender order:
        ``edge`` (``sender->receiver``), ``sender``, ``receiver``, ``site``, the layers,
        and ``query_heads`` (the query heads a receiver serves: one, or a key/value head's group)."""
        pairs = self.edges.T.nonzero().tolist()  # receiver-major
        rows = []
        for r, s in pairs:
            snd, rcv = self.senders[s], self.receivers[r]
            rows.append(
                {
                    "edge": edge_name(snd.name, rcv.name),
                    "sender": snd.name,
                    "receiver": rcv.name,
                    "site": rcv.site,
                    "sender_layer": snd.layer,
                    "receiver_layer": rcv.layer,
                    "query_heads": " ".join(map(str, rcv.query_heads)),
                }
            )
        return pd.DataFrame(rows)

    def describe(self) -> str:
        s = self.shape
        kv = f", {s.n_kv_heads} key/value heads" if s.group > 1 else ""
        block = ", parallel blocks" if s.parallel else ""
        return (
            f"{len(self.senders)} senders, {len(self.receivers)} receivers, {self.n_edges:,} edges "
            f"({s.n_layers} layers x {s.n_heads} heads{kv}, {len(s.mlp_layers)} MLPs{block})"
        )


def _kv_receiver(layer: int, j: int, site: str, group: int) -> Node:
    """A key or value receiver: head ``j`` on multi-head attention, key/value head ``j`` of a group."""
    name = receiver_name(head_name(layer, j) if group == 1 else kv_name(layer, j), site)
    return Node(name, "head", layer, j, site, 2 * layer, tuple(range(j * group, (j + 1) * group)))


def count_edges(
    n_layers: int, n_heads: int, *, n_kv_heads: int | None = None, mlp: bool = True, parallel: bool = False
) -> int:
    """The number of edges of a model of this shape (every layer with an MLP when ``mlp``)."""
    layers = tuple(range(n_layers)) if mlp else ()
    return Graph(Shape(n_layers, n_heads, n_kv_heads or n_heads, layers, parallel)).n_edges


def refusal(model: HookedModel, info: ModelInfo) -> str | None:
    """Why the graph cannot describe ``model`` exactly (``None``: it can)."""
    if info.latent_attention or getattr(model.cfg, "d_kv_latent", None):  # DeepSeek's, or the toy's
        return "its keys and values come out of one shared latent projection (latent attention), not per head"
    if len(info.attention_layers) != info.n_layers:
        return f"layers {list(info.absent_layers)} have no softmax attention, so their heads are not nodes"
    if gated_attention_modules(model):
        return "each head's output is multiplied by a gate computed from the residual, which is not an edge"
    if info.is_encoder:
        return (
            "an encoder's blocks normalise the residual after adding to it, so no sender reaches a receiver unchanged"
        )
    if any((site := post_attention_norm_site(model, l)) is not None and site.centered for l in range(info.n_layers)):
        return (
            "its attention output passes through a LayerNorm before the residual; edges freeze only an RMSNorm "
            "there (Gemma 2 and 3), where each head's write is its output over the norm's scale"
        )
    blocks = getattr(model, "blocks", None)
    if blocks is None or any(not isinstance(getattr(b, "ln1", None), torch.nn.Module) for b in blocks):
        return "its blocks do not expose the attention's input norm (ln1), where the head receivers read"
    return None


def shape_of(model: HookedModel, info: ModelInfo) -> Shape:
    """The graph's shape read off the model (key/value heads from its stacked ``W_K``)."""
    n_kv = int(getattr(model.cfg, "n_key_value_heads", None) or info.n_heads)
    return Shape(info.n_layers, info.n_heads, n_kv, mlp_layers(model), is_parallel(model))


def graph_of(model: HookedModel, what: str = "edge attribution") -> Graph:
    """The graph of ``model``, or a refusal saying why ``what`` cannot run on it."""
    info = describe(model)
    why = refusal(model, info)
    if why is not None:
        raise UsageError(f"{what} cannot describe {info.name} as a graph of edges: {why}")
    return Graph(shape_of(model, info))
