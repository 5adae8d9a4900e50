"""The one spelling of a model's components, in memory, in prints and in saved files.

In memory and in prints (what a table holds, what a summary prints, what ``heads=`` and ``edges=``
take):

- a head: ``1.2`` (layer 1, head 2); a key/value head of a grouped layer (GQA/MQA): ``1.kv0``;
- an MLP: ``mlp.0``; the embeddings: ``input``; the final residual the unembedding reads: ``logits``;
- a receiver: a head and the input it reads, ``1.2<q>``, ``1.2<k>``, ``1.kv0<v>`` (an MLP and the
  logits read one input each, and are named as they are);
- an edge: ``sender->receiver``, as ``0.1->1.2<k>`` or ``mlp.0->logits``.

Saved files write a head ``L1H2`` and a key/value head ``L1KV0``, so that no spreadsheet or
``pd.read_csv`` takes a name for a number (``"0.10"`` would become ``0.1``, head 1's name):
:func:`file_name` and :func:`memory_name` turn one spelling into the other, inside receivers and
edges too. EAP-IG's spelling (``a1.h2``, ``m0``; ``a1.kv0`` for a key/value head, which EAP-IG has
not) is read wherever a name is given, and written only into its JSON (:func:`eapig_name`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

INPUT, LOGITS = "input", "logits"
SITES = ("q", "k", "v")  # the inputs of a head a receiver reads

# a component in each spelling: (memory, file, EAP-IG) patterns of a head, a key/value head, an MLP
_SPELLINGS = {
    "head": (r"(\d+)\.(\d+)", r"L(\d+)H(\d+)", r"a(\d+)\.h(\d+)"),
    "kv": (r"(\d+)\.kv(\d+)", r"L(\d+)KV(\d+)", r"a(\d+)\.kv(\d+)"),
    "mlp": (r"mlp\.(\d+)", r"mlp\.(\d+)", r"m(\d+)"),
}
_PATTERNS = [
    (kind, re.compile(rf"^{pattern}(?:<([qkv])>)?$"))
    for kind, patterns in _SPELLINGS.items()
    for pattern in dict.fromkeys(patterns)
]


def head_name(layer: int, head: int) -> str:
    """A head's name: ``"1.2"``."""
    return f"{int(layer)}.{int(head)}"


def kv_name(layer: int, index: int) -> str:
    """A key/value head's name (a grouped layer's, shared by a group of query heads): ``"1.kv0"``."""
    return f"{int(layer)}.kv{int(index)}"


def mlp_name(layer: int) -> str:
    """An MLP's name: ``"mlp.0"``."""
    return f"mlp.{int(layer)}"


def receiver_name(node: str, site: str) -> str:
    """A receiver's name: a head's (or key/value head's) input ``node<site>``; an MLP or the logits as they are."""
    return f"{node}<{site}>" if site in SITES else node


def edge_name(sender: str, receiver: str) -> str:
    """An edge's name: ``"sender->receiver"``."""
    return f"{sender}->{receiver}"


@dataclass(frozen=True)
class Part:
    """A component read from any spelling: its kind (``input``, ``head``, ``kv``, ``mlp``,
    ``logits``), layer and index (0 where it has none), and the input a receiver reads (``q``,
    ``k``, ``v``; ``""`` for a node)."""

    kind: str
    layer: int = 0
    index: int = 0
    site: str = ""

    @property
    def node(self) -> str:
        """The component's name in memory, without the input it reads."""
        if self.kind == "head":
            return head_name(self.layer, self.index)
        if self.kind == "kv":
            return kv_name(self.layer, self.index)
        return mlp_name(self.layer) if self.kind == "mlp" else self.kind

    @property
    def name(self) -> str:
        """The name in memory: the node and, for a head's input, ``<site>``."""
        return receiver_name(self.node, self.site)

    def spelled(self, style: str) -> str:
        """The name as ``style`` writes it: ``"memory"``, ``"file"`` or ``"eapig"``."""
        if self.kind in (INPUT, LOGITS) or style == "memory":
            return self.name
        if self.kind == "mlp":
            return self.name if style == "file" else f"m{self.layer}"
        if style == "file":
            node = f"L{self.layer}{'H' if self.kind == 'head' else 'KV'}{self.index}"
        else:
            node = f"a{self.layer}.{'h' if self.kind == 'head' else 'kv'}{self.index}"
        return receiver_name(node, self.site)


def parse(name: str) -> Part | None:
    """The component ``name`` spells in any of the three spellings (a node or a receiver), ``None``
    when it spells none."""
    if name in (INPUT, LOGITS):
        return Part(name)
    for kind, pattern in _PATTERNS:
        m = pattern.match(name)
        if m:
            layer, *index = m.groups()[:-1]
            return Part(kind, int(layer), int(index[0]) if index else 0, m.groups()[-1] or "")
    return None


def respell(name: Any, style: str) -> Any:
    """``name`` (a component, a receiver or an edge, in any spelling) as ``style`` writes it; a value
    that names no component (a number, a token, ``None``) as it is."""
    if not isinstance(name, str):
        return name
    ends = name.split("->")
    spelled = [_spelled(end, style) for end in ends]
    if len(ends) > 2 or any(s is None for s in spelled):
        return name
    return "->".join(spelled)  # type: ignore[arg-type]


@lru_cache(maxsize=1 << 16)
def _spelled(end: str, style: str) -> str | None:
    """One component as ``style`` writes it (``None``: it names none), each spelled once: an edge
    table names a few thousand components over tens of thousands of rows."""
    part = parse(end)
    return None if part is None else part.spelled(style)


def memory_name(name: Any) -> Any:
    """A name as memory holds it (``"L0H10"``, ``"a0.h10"`` -> ``"0.10"``; ``"m0->logits"`` -> ``"mlp.0->logits"``)."""
    return respell(name, "memory")


def file_name(name: Any) -> Any:
    """A name as saved files write it (``"0.10"`` -> ``"L0H10"``, ``"0.1->1.kv0<k>"`` -> ``"L0H1->L1KV0<k>"``)."""
    return respell(name, "file")


def eapig_name(name: Any) -> Any:
    """A name as EAP-IG's JSON writes it (``"0.10"`` -> ``"a0.h10"``, ``"mlp.0"`` -> ``"m0"``)."""
    return respell(name, "eapig")
