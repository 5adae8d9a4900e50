"""Path patching, exact (Wang et al. 2022's definition): how much of the answer flows from a sender
head to a receiver, through that path alone.

Wang et al. run the prompts a patched run reads (the clean ones when noising) with the sender's
output taken from the paired prompt and *every other head's* output frozen at its own run's value
(MLPs and norms recompute); to the logits, that run's metric; to a receiver head's queries, keys or
values, they record the receiver's input there and patch it alone into a second, free run.

Here each path is one intervention of the edge replay (:mod:`~interp.patching.edge_patch`), one row
of its batched replay, journaled and self-checked like every other: receivers up to the receiver's
layer read every head at its own run's value (``OWN``: the frozen heads), the MLPs between and the
receiver read the sender at the paired prompt's value (``SOURCE``) and the MLPs as they recompute
(``ACTUAL``); above the receiver's layer everything reads the layers below it at their own run's
values and the rest as it recomputes (the free second run). One replay row stands for the two runs;
the numbers equal theirs to float rounding (the receivers' inputs are recomputed through their norms
rather than recorded). On GQA/MQA a key or value receiver is its key/value head, shared by its group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from interp.ablation.metrics import Metric
from interp.ablation.modes import SITES, head_mask, parse_heads
from interp.adapters import HookedModel
from interp.config import RunConfig
from interp.errors import InterpError, UsageError
from interp.journal import Journal
from interp.models import ModelInfo, describe
from interp.names import LOGITS, edge_name, head_name, kv_name, receiver_name
from interp.patching.core import (
    Setup,
    gap_meta,
    gap_moved,
    own_metric,
    pooled_ratio,
    setup,
    validate_setup,
)
from interp.patching.edge_patch import CodedUnits, EdgeSweeper
from interp.patching.edge_replay import ACTUAL, OWN, SOURCE
from interp.patching.graph import MLP_SITE, Graph, graph_of
from interp.patching.metrics import refuse_raw
from interp.patching.result import effect_scale, warned
from interp.probes.task import DEFAULT_DIRECTION, TaskProbe
from interp.registry import Registry
from interp.results import Result
from interp.scores import NOISE_FLOOR_FRACTION

if TYPE_CHECKING:
    import plotly.graph_objects as go

STEM = "path_patching"
PATH_SITES: Registry[str] = Registry("path patching site")  # a receiver head's input the path reaches
for _site in ("q", "k", "v"):
    PATH_SITES.add(_site, SITES.doc(_site))


@dataclass(repr=False)
class PathScores(Result):
    """A row per (sender, receiver): ``effect`` (the fraction of the clean-corrupted gap the path
    moves) with its bootstrap CI over pairs; ``.grid()`` is the sender x receiver matrix."""

    KIND = STEM
    what = "path patching"
    shown_by = "effect"

    def grid(self, score: str = "effect") -> np.ndarray:
        return (
            self.table.pivot(index="sender", columns="receiver", values=score)
            .loc[self.senders, self.receivers]
            .to_numpy()
        )

    @property
    def senders(self) -> list[str]:
        return list(dict.fromkeys(self.table["sender"]))

    @property
    def receivers(self) -> list[str]:
        return list(dict.fromkeys(self.table["receiver"]))

    def figure(self, title: str | None = None) -> go.Figure:
        """The sender x receiver grid, diverging around 0 on the one fixed scale of effects (-1..1 of
        the gap, :func:`~interp.patching.result.effect_scale`), heads as labels; paths inside the
        noise floor (or whose CI reaches 0) grey."""
        from interp.plots import labelled_heatmap

        site = self.meta.get("site")
        return labelled_heatmap(
            self.grid(),
            self.receivers,
            self.senders,
            effect_scale(self.meta),
            lo=self.grid("effect_lo"),
            hi=self.grid("effect_hi"),
            floor=float(self.meta.get("noise_floor", NOISE_FLOOR_FRACTION)),  # a path's effect is always normalised
            title=warned(
                title or f"{self.meta.get('model', 'model')}: path patching, sender -> receiver {site}", self.meta
            ),
            x_title="receiver",
            y_title="sender",
            x_name="receiver",
            y_name="sender",
        )


def path_patch(
    model: HookedModel,
    task: TaskProbe,
    *,
    senders: Any = None,
    receivers: Any = LOGITS,
    site: str = "q",
    direction: str = DEFAULT_DIRECTION,
    metric: str | Metric | Callable | None = None,
    config: RunConfig | None = None,
    replay: str = "auto",
    journal: Journal | None = None,
) -> PathScores:
    """Path patching from each sender head to each receiver (see the module docstring).

    ``senders``: heads named any usual way (default every head); ``receivers``: ``"logits"`` or
    heads, whose ``site`` (``q``, ``k`` or ``v``) receives the path. A sender must sit in an earlier
    layer than every receiver head it is paired with: named explicitly, a later one is refused; by
    default, such pairs are left out of the grid (NaN). ``replay`` (:data:`~interp.ablation.replay.REPLAYS`)
    and ``journal`` (where each finished path is recorded; a resumed run takes those from it) as for
    the exact sweep. A model the edge replay cannot describe or
    reproduce is refused before any patched run."""
    validate_path_patch(
        senders=senders,
        receivers=receivers,
        site=site,
        direction=direction,
        metric=own_metric(task, metric),
    )
    info = describe(model)
    every = [(l, h) for l in info.attention_layers for h in range(info.n_heads)]
    send = _heads(info, senders) if senders is not None else every
    recv = LOGITS if _to_logits(receivers) else _heads(info, receivers)
    if recv != LOGITS:  # heads named any way, now read against the model: before any forward
        _refuse_unreached(send, recv, receivers, named_senders=senders is not None)
    graph = graph_of(model, "path patching")
    run = setup(model, task, metric=metric, direction=direction, by="head", config=config)
    columns = [LOGITS] if recv == LOGITS else [f"{l}.{h}" for l, h in recv]
    units = PathUnits(graph, send, recv, site)
    sweeper = EdgeSweeper(run, graph, what="path patching", replay=replay, journal=journal)
    values = sweeper.evaluate(units, desc=f"path patching ({site if recv != LOGITS else LOGITS})", scope=units.scope)
    values = values.reshape(len(send), len(columns), -1)
    values[units.unreached.reshape(len(send), len(columns))] = float("nan")
    paths = _scores(run, send, columns, values, site if recv != LOGITS else LOGITS)
    paths.meta["replay"] = sweeper.replay
    if sweeper.interrupted:
        paths.meta["partial"] = True
    return paths


def validate_path_patch(
    *,
    senders: Any = None,
    receivers: Any = LOGITS,
    site: str = "q",
    direction: str = DEFAULT_DIRECTION,
    metric: str | Metric | Callable | None = None,
) -> None:
    """What :func:`path_patch` refuses before any forward, without a model: a ``site`` that is not a
    receiver's input (:data:`PATH_SITES`), a raw ``metric`` (a path's effect is a fraction of the
    gap), a name :func:`~interp.patching.core.setup` refuses, and, among heads named as
    ``"layer.head"`` strings, a named sender not in an earlier layer than a
    named receiver, or a receiver in layer 0 when every head sends (no path reaches it)."""
    if site not in PATH_SITES:
        raise UsageError(
            f"site={site!r}: a receiver head receives a path through its queries, keys or values: "
            f"site={', '.join(PATH_SITES.names()[:-1])} or {PATH_SITES.names()[-1]}, not {site}",
            params="site",
        )
    refuse_raw(metric, "path patching")
    validate_setup(metric=metric, direction=direction)
    send = [(0, 0)] if senders is None else _named(senders, "senders")  # every head sends: the first in layer 0
    recv = None if _to_logits(receivers) else _named(receivers, "receivers")
    if send is not None and recv is not None:
        _refuse_unreached(send, recv, receivers, named_senders=senders is not None)


def _to_logits(receivers: Any) -> bool:
    return isinstance(receivers, str) and receivers.strip() == LOGITS


def _named(heads: Any, param: str) -> list[tuple[int, int]] | None:
    """The heads of a ``"layer.head,..."`` string, read without a model (``None``: heads named
    another way, read once the model is loaded)."""
    if not isinstance(heads, str):
        return None
    try:
        named = parse_heads(heads)
    except InterpError as e:
        raise UsageError(f"{param}=: {e}", params=param) from None
    if not named:
        raise UsageError(
            f"{param}= names no head: write heads as layer.head, comma-separated (e.g. 0.1,1.3)", params=param
        )
    return named


def _refuse_unreached(
    senders: Sequence[tuple[int, int]], receivers: Sequence[tuple[int, int]], given: Any, *, named_senders: bool
) -> None:
    """Refuse the first named sender that is not in an earlier layer than a receiver; when every head
    sends (``named_senders`` false), the first receiver no sender is in an earlier layer than."""
    if named_senders:
        late = [(s, r) for s in senders for r in receivers if s[0] >= r[0]]
        if late:
            (sl, sh), (rl, rh) = late[0]
            raise UsageError(
                f"sender {sl}.{sh} is not in an earlier layer than receiver {rl}.{rh}: a path runs from a head "
                "to the heads of later layers: choose senders= in earlier layers than receivers=",
                params=("senders", "receivers"),
            )
        return
    first = min(l for l, _ in senders)
    alone = [r for r in receivers if r[0] <= first]
    if alone:
        rl, rh = alone[0]
        named = given.strip() if isinstance(given, str) else ",".join(f"{l}.{h}" for l, h in receivers)
        raise UsageError(
            f"receivers={named}: receiver {rl}.{rh} is in layer {rl}, and no sender is in an earlier layer: no path "
            f"reaches it; choose receivers in layer 1 or later, or receivers={LOGITS}",
            params="receivers",
        )


def _heads(info: ModelInfo, heads: Any) -> list[tuple[int, int]]:
    mask = head_mask(info, heads)
    return [tuple(p) for p in mask.nonzero().tolist()]  # type: ignore[misc]


class PathUnits(CodedUnits):
    """Each (sender head, receiver) pair as one intervention (see the module docstring), its codes
    built when its batched forward comes; a receiver not above its sender is marked ``unreached``."""

    def __init__(self, graph: Graph, send: list[tuple[int, int]], recv: Any, site: str):
        self.graph, self.site = graph, site
        self.scope = f"path-{site if recv != LOGITS else LOGITS}"
        g, names = graph.shape.group, {n.name: i for i, n in enumerate(graph.receivers)}
        senders = {n.name: i for i, n in enumerate(graph.senders)}
        targets = [names[LOGITS]] if recv == LOGITS else [names[_receiver_name(l, h, site, g)] for l, h in recv]
        self.pairs = [(senders[head_name(sl, sh)], r) for sl, sh in send for r in targets]
        self.unreached = torch.tensor([graph.receivers[r].layer <= graph.senders[s].layer for s, r in self.pairs])
        self.layer = torch.tensor([n.layer for n in graph.senders])
        self.reads = torch.tensor([n.layer for n in graph.receivers])
        self.mlp_sender = torch.tensor([n.kind == MLP_SITE for n in graph.senders])
        self.head_receiver = torch.tensor([n.kind == "head" for n in graph.receivers])
        self.mlp_receiver = torch.tensor([n.kind == MLP_SITE for n in graph.receivers])

    def __len__(self) -> int:
        return len(self.pairs)

    def codes(self, index: Sequence[int]) -> Tensor:
        g = self.graph
        out = torch.zeros(len(index), len(g.senders), len(g.receivers), dtype=torch.int8)
        for row, i in enumerate(index):
            s, r = self.pairs[i]
            if bool(self.unreached[i]):
                continue  # NaN in the grid: nothing is patched
            top = int(self.reads[r])  # the receiver's layer (n_layers: the logits)
            # the only senders whose run differs from their own: the MLPs from the sender's layer up to the
            # receiver's (every head reads its own run's inputs, so reproduces its own output)
            moved = self.mlp_sender & (self.layer >= self.layer[s]) & (self.layer < top)
            frozen = self.head_receiver & (self.reads <= top)  # heads up to the receiver's layer
            free = (self.reads > top) | (self.mlp_receiver & (self.reads == top))  # the second run, above
            codes = out[row]
            codes[moved[:, None] & (frozen | free)[None]] = OWN
            codes[:, r] = ACTUAL  # the receiver reads the MLPs between as they recompute
            codes[s, self.mlp_receiver & (self.reads < top)] = SOURCE  # and the sender's output, as the MLPs between
            codes[s, r] = SOURCE
            out[row] = codes * g.edges.to(torch.int8)  # only where an edge is
        return out

    def start(self, i: int) -> int:
        s, _ = self.pairs[i]
        return int(self.layer[s]) if not bool(self.unreached[i]) else self.graph.shape.n_layers + 1

    def label(self, i: int) -> str:
        s, r = self.pairs[i]
        return edge_name(self.graph.senders[s].name, self.graph.receivers[r].name)


def _receiver_name(layer: int, head: int, site: str, group: int) -> str:
    """The graph's name of head ``layer.head``'s input ``site`` (a key/value head's on GQA/MQA)."""
    node = head_name(layer, head) if site == "q" or group == 1 else kv_name(layer, head // group)
    return receiver_name(node, site)


def _scores(run: Setup, send: list[tuple[int, int]], columns: list[str], values: Tensor, site: str) -> PathScores:
    num, den = gap_moved(run, values)
    cfg = run.config
    flat_num, flat_den = num.flatten(0, 1).T, den.flatten(0, 1).T  # [pair, sender * receiver]
    point, lo, hi = pooled_ratio(torch.nan_to_num(flat_num), flat_den, cfg)
    missing = torch.isnan(values[..., 0]).flatten()
    rows = []
    for k, ((sl, sh), receiver) in enumerate((s, r) for s in send for r in columns):
        nan = bool(missing[k])
        rows.append(
            {
                "sender": f"{sl}.{sh}",
                "sender_layer": sl,
                "sender_head": sh,
                "receiver": receiver,
                "effect": float("nan") if nan else float(point[k]),
                "effect_lo": float("nan") if nan else float(lo[k]),
                "effect_hi": float("nan") if nan else float(hi[k]),
            }
        )
    meta = {
        "model": run.info.name,
        "task": run.task.name,
        "n_pairs": run.task.n_pairs,
        "direction": run.direction,
        "site": site,
        "metric": run.metric.name,
        "clean_metric": float(run.clean.mean()),
        "corrupted_metric": float(run.corrupted.mean()),
        **gap_meta(run),
        "noise_floor": NOISE_FLOOR_FRACTION,
    }
    return PathScores(pd.DataFrame(rows), meta)
