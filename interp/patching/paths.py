"""Path patching, exact (Wang et al. 2022's definition): how much of the answer flows from a sender
head to a receiver, through that path alone.

For each sender head, the prompts a patched run reads (the clean ones when noising) run once with
the sender's output (``hook_z``) taken from the paired prompt and *every other head's* output
frozen at its own run's value (MLPs and norms recompute). To the logits: that run's metric. To a
receiver head's queries, keys or values: the receiver's ``hook_q`` / ``hook_k`` / ``hook_v`` is
recorded in that run, and a second run, otherwise free, patches only it in. Plain hooked forwards,
``1 + receivers`` per sender (not the batched replay). On GQA/MQA a key or value receiver is its
key/value head, shared by its group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from interp import memory
from interp.ablation.metrics import Metric
from interp.ablation.modes import SITES, capture_site, head_mask, parse_heads
from interp.ablation.replay import read_out
from interp.adapters import HookedModel, run_with_reducers
from interp.config import RunConfig
from interp.errors import InterpError, UsageError
from interp.models import ModelInfo, describe
from interp.patching.core import (
    FEWER_PAIRS,
    Setup,
    gap_meta,
    gap_moved,
    own_metric,
    pooled_ratio,
    setup,
    validate_setup,
)
from interp.patching.metrics import refuse_raw
from interp.patching.result import effect_scale, warned
from interp.probes.task import DEFAULT_DIRECTION, TaskProbe
from interp.registry import Registry
from interp.scores import NOISE_FLOOR_FRACTION, Shown, load_table, save_table

if TYPE_CHECKING:
    import plotly.graph_objects as go

LOGITS = "logits"
STEM = "path_patching"
PATH_SITES: Registry[str] = Registry("path patching site")  # a receiver head's input the path reaches
for _site in ("q", "k", "v"):
    PATH_SITES.add(_site, SITES.doc(_site))


@dataclass(repr=False)
class PathScores(Shown):
    """A row per (sender, receiver): ``effect`` (the fraction of the clean-corrupted gap the path
    moves) with its bootstrap CI over pairs; ``.grid()`` is the sender x receiver matrix."""

    table: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
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

    def save(self, out_dir: str | Path, stem: str = STEM, *, overwrite: bool = False) -> list[Path]:
        return save_table(out_dir, stem, STEM, self.table, self.meta, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | Path, stem: str = STEM) -> PathScores:
        return cls(*load_table(path, stem, "path patching"))


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
) -> PathScores:
    """Path patching from each sender head to each receiver (see the module docstring).

    ``senders``: heads named any usual way (default every head); ``receivers``: ``"logits"`` or
    heads, whose ``site`` (``q``, ``k`` or ``v``) receives the path. A sender must sit in an earlier
    layer than every receiver head it is paired with: named explicitly, a later one is refused; by
    default, such pairs are left out of the grid (NaN)."""
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
    run = setup(model, task, metric=metric, direction=direction, by="head", config=config)
    tokens, donor = run.probe.tokens, run.probe.donor
    mb = run.config.minibatch
    B, T = tokens.shape
    # both prompts' head outputs, and one sender's frozen copy of every layer's
    z = 3 * B * T * len(info.attention_layers) * info.n_heads * info.d_head * memory.Shape.of(model, info).itemsize
    kept = "the head outputs of both prompts and a frozen copy, kept"
    # its frozen forwards run every pair at once: the estimate is the whole batch's, whatever the minibatch
    whole = memory.forward_memory(model, info, B, T, run.metric, "path patching", kept=z, kept_is=kept)(B)
    memory.check(lambda _: whole, B, info.device, fewer=FEWER_PAIRS)
    own_z, donor_z = capture_site(model, tokens, mb, "z"), capture_site(model, donor, mb, "z")
    columns = [LOGITS] if recv == LOGITS else [f"{l}.{h}" for l, h in recv]
    values = torch.full((len(send), len(columns), tokens.shape[0]), float("nan"))
    for i, (sl, sh) in enumerate(send):
        frozen = [_freeze(l, own_z[l], donor_z[l] if l == sl else None, sh) for l in info.attention_layers]
        if recv == LOGITS:
            values[i, 0] = _metric(run, tokens, frozen)
            continue
        later = [(j, r) for j, r in enumerate(recv) if r[0] > sl]
        if not later:
            continue
        seen: dict[int, Tensor] = {}
        layers = sorted({r[0] for _, r in later})
        grab = [(SITES.get(site)(l), _keep(seen, l)) for l in layers]
        with torch.no_grad():
            run_with_reducers(model, tokens, frozen + grab, stop_after=SITES.get(site)(layers[-1]))
        for j, (rl, rh) in later:
            values[i, j] = _metric(run, tokens, [(SITES.get(site)(rl), _swap(seen[rl], rh, info.n_heads))])
    return _scores(run, send, columns, values, site if recv != LOGITS else LOGITS)


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


def _freeze(layer: int, own: Tensor, donor: Tensor | None, head: int) -> tuple[str, Callable]:
    """``hook_z`` of ``layer`` set to its own run's value, the sender's head (if here) to the donor's."""
    value = own.clone()
    if donor is not None:
        value[:, :, head] = donor[:, :, head]

    def hook(z: Tensor, hook: Any) -> Tensor:
        return value.to(device=z.device, dtype=z.dtype).reshape(z.shape)

    return SITES.get("z")(layer), hook


def _keep(seen: dict[int, Tensor], layer: int) -> Callable:
    def hook(x: Tensor, hook: Any) -> None:
        seen[layer] = x.detach().clone()

    return hook


def _swap(recorded: Tensor, head: int, n_heads: int) -> Callable:
    """Replace one head's (or, on a grouped model, its key/value head's) activation by the recorded one."""

    def hook(x: Tensor, hook: Any) -> Tensor:
        unit = head // (n_heads // x.shape[2])
        x = x.clone()
        x[:, :, unit] = recorded[:, :, unit].to(x.dtype)
        return x

    return hook


def _metric(run: Setup, tokens: Tensor, hooks: Sequence) -> Tensor:
    with torch.no_grad():
        out = read_out(run.model, tokens, run.metric, list(hooks), run.info.n_layers)
    return run.metric(out, tokens, None, torch.arange(tokens.shape[0])).cpu()


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
