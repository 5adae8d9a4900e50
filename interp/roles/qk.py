"""Why a head attends where it does: its pre-softmax score split exactly into pairs of upstream
components, one on the query side and one on the key side.

Layer ``l``'s query at position ``i`` and key at position ``j`` are each a sum of one part per
upstream component (:mod:`interp.roles.qk_parts`: the embeddings, every earlier head and MLP, the
norm's bias and the attention's own query/key biases, with the input norm frozen at the run's
scale, and so are the query and key norms of the QK-norm families: Qwen 3, Gemma 3, OLMo 2). The
score ``scale * q_i . k_j`` is then exactly ``sum over (c, c') of scale * q_i[c] . k_j[c']``
(rotary acts linearly on each side, so the pairs stay exact; on grouped-query attention the key
side is the head's key/value group). ALiBi's ``slope * (j - i)`` is a pair of its own, ``(alibi,
alibi)``. Under a logit softcap (Gemma 2) the score decomposed is the one *before* the cap
(``meta["softcap"]`` says so); learned sink logits (GPT-OSS) join the softmax's denominator and are
no part of any score.

What is averaged, per head, over the targets ``(sequence, query i, key j)`` of a probe:

- ``score``: each pair's term of the score at ``(i, j)``;
- ``contrast``: each pair's term of the score at ``j`` minus the mean score over the other keys the
  query may see (causal, in its window, not padding): "why this key wins". The query side is read
  at the targets' queries only, and the key side's window sums are streamed in blocks of keys
  (each part's keys for a block of positions at a time), so no ``[T, T]`` tensor is formed at any
  length, nor any part at every position.

Each mean comes with a bootstrap CI over sequences (:func:`interp.scores.bootstrap_ratio`: the
targets of a sequence pooled). The targets (``at``, :data:`TARGETS`): the induction targets of a
repeated-token probe, the previous token, the first token (sinks), the needles of a needle probe
(retrieval), the positions of a task's answer token seen from its read position, or your own
``(batch, query, key)`` rows. Components can be grouped (:data:`GROUPS`) by layer or by kind, some
heads kept by name.

The terms of each target add up to the model's own score and contrast (from the query and key it
attended with): ``meta["max_error"]`` holds the largest difference, and a difference above the
float tolerance is refused as "not a sum of parts".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp.adapters import HookedModel, describe
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.probes import TokenProbe
from interp.probes.needle import NeedleProbe
from interp.probes.task import TaskProbe
from interp.progress import tqdm
from interp.registry import Registry
from interp.results import plural
from interp.roles.qk_layer import LayerSides, QKTerms, layer_sides, layer_terms, sequence_terms
from interp.roles.qk_parts import (
    WHAT,
    CleanRun,
    Component,
    LayerParts,
    check_decomposable,
    check_interface,
    clean_run,
    visible_keys,
)
from interp.roles.qk_result import STEM, VALUES, QKAttribution, head_totals
from interp.scores import bootstrap_ratio

# ``role``: the head role (:data:`interp.report.roles.ROLES`) whose attention the target is, read on a
# repeated-token probe (the atlas's head card shows each named head's pairs at its role's targets)
TARGETS: Registry[str] = Registry("target")
TARGETS.add(
    "induction",
    "the induction targets of a repeated-token probe: the token after the previous occurrence",
    role="induction",
)
TARGETS.add("previous", "the previous token, from every query after the first", role="previous-token")
TARGETS.add("sink", "the first token, from every query after it", role="sink")
TARGETS.add("retrieval", "the needle token a needle probe's copy is generating")
TARGETS.add("task", "the positions of a task's answer token in its prompt, from its read position")

GROUPS: Registry[str] = Registry("grouping")
GROUPS.add("component", "every component on its own: embeddings, each head, each MLP, the biases")
GROUPS.add("layer", "the embeddings, then one group per earlier layer, then the biases")
GROUPS.add("kind", "the embeddings, all heads, all MLPs, the rest of the attention writes, the biases")


def parse_heads(heads: str | Sequence[Any], param: str = "heads") -> list[tuple[int, int]]:
    """``"1.2"``, ``(1, 2)``, ``"1.2,0.1"`` or a list of either, as ``(layer, head)`` pairs (a
    refusal names the parameter ``param`` they came as)."""
    items: list[Any] = heads.split(",") if isinstance(heads, str) else list(heads)
    if items and isinstance(items[0], int):
        items = [tuple(items)]
    out = []
    for item in items:
        try:
            layer, head = (int(x) for x in (item.strip().split(".") if isinstance(item, str) else item))
        except (TypeError, ValueError):
            raise UsageError(
                f"{param}= names each head as layer.head (1.2) or (layer, head), got {item!r}", params=param
            ) from None
        out.append((layer, head))
    if not out:
        raise UsageError(f"{param}= must name at least one head, e.g. {param}='1.2'", params=param)
    return list(dict.fromkeys(out))


def validate_qk_attribution(
    *,
    heads: str | Sequence[Any],
    at: str | Tensor = "induction",
    group: str = "component",
    keep: Sequence[str] = (),
    top: int | None = None,
) -> None:
    """The model-free checks of :func:`qk_attribution`."""
    parse_heads(heads)
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise UsageError(
            f"top= keeps each head's top pairs: a whole number of at least 1 (or None), got {top!r}", params="top"
        )
    if isinstance(at, str):
        if at not in TARGETS:
            raise UsageError(
                f"unknown target at={at!r}: choose from {list(TARGETS)}, or pass (batch, query, key) rows", params="at"
            )
    else:
        rows = torch.as_tensor(at)
        if rows.ndim != 2 or rows.shape[1] != 3 or rows.shape[0] == 0 or bool((rows < 0).any()):
            raise UsageError(
                f"at= rows are (batch, query, key) positions, [n, 3] with n >= 1, got shape {list(rows.shape)}",
                params="at",
            )
    if group not in GROUPS:
        raise UsageError(f"unknown grouping group={group!r}: choose from {list(GROUPS)}", params="group")
    if keep:
        kept = parse_heads(list(keep), "keep")
        if group == "component":
            raise UsageError(
                f"keep={list(keep)} names heads that stay themselves under a grouping: pass group='layer' or "
                "group='kind' (under group='component' every head is its own already)",
                params="keep",
            )
        top = max(l for l, _ in parse_heads(heads))
        late = [(l, h) for l, h in kept if l >= top]
        if late:
            l, h = late[0]
            raise UsageError(
                f"keep= names {l}.{h}, which writes to no head decomposed here (their inputs come from layers "
                f"below {top}): keep names upstream heads whose writes stay apart from their group",
                params="keep",
            )


def text_positions(n_tokens: int, query: int | None, key: int, causal: bool = True) -> tuple[int, int]:
    """``query`` (default: the last position) and ``key`` as positions of a text of ``n_tokens``
    tokens, refused where they lie outside it or (``causal``) the key comes after the query; no
    index wraps."""
    q = n_tokens - 1 if query is None else query
    for name, pos in (("query", q), ("key", key)):
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos < n_tokens:
            raise UsageError(
                f"{name}={pos!r}: your text has {n_tokens} tokens, so a position is 0 to {n_tokens - 1}", params=name
            )
    if causal and key > q:
        raise UsageError(f"key {key} is after query {q}: a query attends to keys at or before it", params="key")
    return q, key


# ---- targets ----------------------------------------------------------------------------------


@dataclass
class _Input:
    tokens: Int[Tensor, "batch pos"]
    attention_mask: Bool[Tensor, "batch pos"] | None
    pairs: Int[Tensor, "n 3"]
    meta: dict[str, Any]
    probe: TokenProbe | None = None


def _targets(model: HookedModel, source: Any, at: str | Tensor) -> _Input:
    """Tokens, padding mask and ``(batch, query, key)`` targets from a probe (or tokens) and ``at``."""
    if isinstance(source, TaskProbe):
        if isinstance(at, str) and at != "task":
            raise UsageError(f"a task probe is read at its read position (at='task'), got at={at!r}", params="at")
        return (
            _task_targets(source) if isinstance(at, str) else _Input(source.clean, None, torch.as_tensor(at).long(), {})
        )
    if isinstance(source, TokenProbe):
        probe, tokens, mask = source, source.tokens, source.attention_mask
    else:  # token ids as they are: no framing added
        probe, tokens, mask = None, _token_rows(source), None
    if not isinstance(at, str):
        return _Input(tokens, mask, torch.as_tensor(at).long(), {}, probe)
    if at in ("retrieval", "induction") and probe is None:
        raise UsageError(
            f"at={at!r} reads the structure of a probe: pass one, or (batch, query, key) rows as at=", params="at"
        )
    if at == "retrieval":
        if not isinstance(probe, NeedleProbe):
            raise UsageError(
                "at='retrieval' reads a needle probe's needles: pass a NeedleProbe (interp.probes.needle_probe)",
                params="at",
            )
        pairs = probe.retrieval_pairs()
    elif at == "induction":
        if probe.block_len is None:
            raise UsageError(
                "at='induction' reads the repeats of a repeated-token probe: pass one (interp.probes.repeated_tokens)",
                params="at",
            )
        pairs = probe.induction_pairs()
    else:  # previous, sink: from every real query after the first real token
        real = (mask if mask is not None else torch.ones(tokens.shape, dtype=torch.bool)).cpu().bool()
        first = real.long().argmax(-1)
        b, q = (real & (torch.arange(real.shape[1])[None] > first[:, None])).nonzero().unbind(-1)
        pairs = torch.stack([b, q, q - 1 if at == "previous" else first[b]], -1)
    return _Input(tokens, mask, pairs.long().cpu(), {}, probe)


def _token_rows(tokens: Any) -> Int[Tensor, "batch pos"]:
    t = torch.as_tensor(tokens).long()
    t = t[None] if t.ndim == 1 else t
    if t.ndim != 2 or t.numel() == 0:
        raise UsageError(f"tokens must be [batch, pos] ids, got shape {list(t.shape)}", params="probe_or_tokens")
    return t


def _task_targets(task: TaskProbe) -> _Input:
    read = task.read_position
    clean = task.clean.cpu()
    rows = []
    for b in range(task.n_pairs):
        answers = [int(a) for a in task.answer[b].tolist() if a >= 0]
        rows += [(b, read, k) for k in range(read) if int(clean[b, k]) in answers]
    if not rows:
        raise UsageError(
            f"the {task.name} task's answer tokens never occur before its read position: no key to attribute; "
            "pass (batch, query, key) rows as at=",
            params="at",
        )
    meta = {"task": {"name": task.name, "read_position": read, **task.meta}}
    return _Input(clean, None, torch.tensor(rows, dtype=torch.long), meta)


def qk_terms(
    model: HookedModel,
    tokens: Int[Tensor, "batch pos"],
    layer: int,
    pairs: Int[Tensor, "n 3"],
    *,
    heads: Sequence[int] | None = None,
    attention_mask: Bool[Tensor, "batch pos"] | None = None,
) -> QKTerms:
    """The terms of single targets: ``pairs`` holds ``(batch, query, key)`` rows, each a key its query
    sees (beside at least one other); ``heads`` are heads of ``layer`` (default: all)."""
    info = check_decomposable(model, [layer])
    heads = list(range(info.n_heads)) if heads is None else [int(h) for h in heads]
    pairs = torch.as_tensor(pairs).long().cpu()
    check_interface(model, tokens, [layer])
    run = clean_run(model, tokens, [layer], attention_mask)
    _, _, ok = visible_keys(run.inputs[layer], pairs)
    if not bool(ok.all()):
        raise UsageError(f"target {pairs[~ok][0].tolist()} is not a key its query sees beside another", params="pairs")
    return layer_terms(layer_sides(model, info, run, layer, heads, pairs))


# ---- grouping ---------------------------------------------------------------------------------


def group_of(comp: Component, group: str, keep: set[str]) -> str:
    """The group a component falls in under ``group`` (heads in ``keep`` stay themselves)."""
    if group == "component" or comp.name in keep or comp.kind in ("embed", "pos_embed", "bias"):
        return comp.name
    if group == "layer":
        return f"layer.{comp.layer}"
    return {"head": "heads", "mlp": "mlps", "attn_other": "attn_other", "block": "blocks"}[comp.kind]


def _grouping(components: list[Component], group: str, keep: set[str]) -> tuple[list[str], list[str], Tensor]:
    names = [group_of(c, group, keep) for c in components]
    order = list(dict.fromkeys(names))
    kinds = {n: c.kind if n == c.name else "group" for n, c in zip(names, components)}
    matrix = torch.zeros(len(components), len(order), dtype=torch.float64)
    for row, name in enumerate(names):
        matrix[row, order.index(name)] = 1.0
    return order, [kinds[n] for n in order], matrix


# ---- the analysis -----------------------------------------------------------------------------


def qk_attribution(
    model: HookedModel,
    probe_or_tokens: TokenProbe | TaskProbe | Tensor | Sequence[Sequence[int]],
    *,
    heads: str | Sequence[Any],
    at: str | Tensor = "induction",
    group: str = "component",
    keep: Sequence[str] = (),
    top: int | None = None,
    config: RunConfig | None = None,
) -> QKAttribution:
    """Each head's score and contrast at the targets ``at`` split into (query component, key
    component) pairs, averaged over the targets with a CI over sequences (see the module docstring).

    ``heads``: ``"1.2"``, ``"1.2,0.1"`` or ``[(1, 2), ...]``. ``probe_or_tokens``: a probe
    (repeated tokens for ``at="induction"``, a needle probe for ``"retrieval"``, a
    :class:`~interp.probes.task.TaskProbe` for ``"task"``) or token ids (framed as the model
    expects), with ``at`` a target name or ``[n, 3]`` ``(batch, query, key)`` rows.
    ``group``: :data:`GROUPS`; ``keep``: heads that stay themselves under a grouping. ``top``: keep
    only each head's ``top`` pairs by |contrast| (only they are resampled for their CIs; the totals
    are the heads' own either way); None keeps every pair."""
    validate_qk_attribution(heads=heads, at=at, group=group, keep=keep, top=top)
    cfg = RunConfig.of(config)
    wanted = parse_heads(heads)
    layers = sorted({l for l, _ in wanted})
    info = describe(model)
    bad = [f"{l}.{h}" for l, h in wanted if not (0 <= l < info.n_layers and 0 <= h < info.n_heads)]
    if bad:
        raise UsageError(
            f"head(s) {bad} are not in {info.name} ({info.n_layers} layers x {info.n_heads} heads)", params="heads"
        )
    absent = [
        f"{l}.{h}"
        for l, h in (parse_heads(list(keep)) if keep else [])
        if not (0 <= l < info.n_layers and 0 <= h < info.n_heads)
    ]
    if absent:
        raise UsageError(
            f"keep= names head(s) {absent} that are not in {info.name} ({info.n_layers} layers x {info.n_heads} heads)",
            params="keep",
        )
    check_decomposable(model, layers)
    src = _targets(model, probe_or_tokens, at)
    B, T = src.tokens.shape
    if T > info.n_ctx:
        raise UsageError(f"sequences of {T} tokens are longer than {info.name}'s context of {info.n_ctx}")
    bad_rows = src.pairs[(src.pairs[:, 0] >= B) | (src.pairs[:, 1] >= T) | (src.pairs[:, 2] >= T)]
    if len(bad_rows):
        raise UsageError(f"target {bad_rows[0].tolist()} is outside the {B} sequences of {T} tokens", params="at")
    late = src.pairs[src.pairs[:, 2] > src.pairs[:, 1]]
    if info.is_causal and len(late):
        b, q, k = late[0].tolist()
        raise UsageError(
            f"target {[b, q, k]}: key {k} is after query {q}: a query attends to keys at or before it", params="at"
        )
    check_interface(model, src.tokens, layers)
    run = clean_run(model, src.tokens, layers, src.attention_mask)
    keep_set = {f"{l}.{h}" for l, h in parse_heads(list(keep))} if keep else set()
    tables, totals, notes, dropped, worst = [], {}, [], 0, 0.0
    sizes = (
        f"{plural(len(wanted), 'head')} in {plural(len(layers), 'layer')}, {plural(B, 'sequence')} of {T} tokens, "
        f"{plural(len(src.pairs), 'target')}, every upstream block's parts replayed through each layer"
    )
    with tqdm(
        total=sum(l + 1 for l in layers), desc="QK attribution", unit="block", disable=not cfg.progress, sizes=sizes
    ) as bar:
        for layer in layers:
            pairs = _layer_targets(run.inputs[layer], src.pairs, at, layer)
            dropped = max(dropped, len(src.pairs) - len(pairs))
            hs = [h for l, h in wanted if l == layer]
            table, layer_totals, report, err = _layer_table(
                model, info, run, layer, hs, pairs, (group, keep_set), cfg, top
            )
            tables.append(table)
            totals.update(layer_totals)
            worst = max(worst, err)
            norms = report.qk_norms
            extra = f" and query/key norms ({', '.join(norms)}), each scale" if norms else ", its scale"
            notes.append(f"layer {layer}: input norm {report.norm}{extra} frozen at the run's own")
            bar.update(layer + 1)  # the embeddings and each earlier block: what the layer's parts are read from
    a0 = run.inputs[layers[0]]
    meta = run_header(info, src.probe, kind=STEM, n_boot=cfg.n_boot, ci_level=cfg.level, seed=cfg.seed, **src.meta)
    meta.update(
        at=at if isinstance(at, str) else "rows",
        group=group,
        keep=sorted(keep_set),
        n_sequences=B,
        ci_sequences={v: B for v in ("contrast", "score")},  # what the CIs resample
        seq_len=T,
        n_targets=int(len(src.pairs)) - dropped,
        dropped_targets=dropped,
        totals=totals,
        max_error=worst,
        softcap=(
            f"the scores are capped, {a0.softcap} * tanh(score / {a0.softcap}): what is decomposed is the score before the cap"
            if a0.softcap
            else None
        ),
        notes=notes,
        top=top,
    )
    return QKAttribution(pd.concat(tables, ignore_index=True), meta)


def _layer_targets(a: Any, targets: Tensor, at: Any, layer: int) -> Tensor:
    """The targets whose query sees their key beside another in ``layer`` (refused where none does)."""
    _, _, ok = visible_keys(a, targets)
    if not bool(ok.any()):
        named = (
            f"no target of at={at!r}" if isinstance(at, str) else f"none of the {plural(len(targets), 'target')} given"
        )
        b, q, k = targets[0].tolist()
        raise UsageError(
            f"{named} is a key its query sees beside another in layer {layer} (target "
            f"{[b, q, k]}: query {q} of sequence {b} does not see key {k} beside another: a padded key, one "
            "outside the layer's window, or a query with one key to see)",
            params="at",
        )
    return targets[ok]


def _layer_table(
    model: HookedModel,
    info: Any,
    run: CleanRun,
    layer: int,
    heads: list[int],
    pairs: Tensor,
    grouped: tuple[str, set[str]],
    cfg: RunConfig,
    top: int | None,
) -> tuple[pd.DataFrame, dict[str, Any], LayerParts, float]:
    """``heads`` of ``layer``: their rows, totals, how the layer's input was split and the largest
    difference between the terms' sums and the model's own scores (refused above float tolerance)."""
    sides = layer_sides(model, info, run, layer, heads, pairs)
    err, scale = sides.error()
    if not err <= 1e-4 * (1.0 + scale):
        raise UsageError(
            f"{WHAT}: layer {layer}'s scores are not the sum of their upstream parts here (off by {err:.2g}): "
            f"{info.name}'s query/key inputs are not a sum of parts the adapter reads: refused"
        )
    grouping = _grouping(sides.components, *grouped)
    sums = sequence_terms(sides, grouping[2], pairs[:, 0], run.inputs[layer].q.shape[0])
    table = _head_rows(sums, layer, heads, pairs, grouping, cfg, top)
    return table, _totals(sides, layer, heads, len(pairs)), sides.report, err


def _head_rows(
    sums: dict[str, Tensor],
    layer: int,
    heads: list[int],
    pairs: Tensor,
    grouping: tuple[list[str], list[str], Tensor],
    cfg: RunConfig,
    top: int | None,
) -> pd.DataFrame:
    """The table's rows for ``heads`` of ``layer`` from each sequence's summed terms (means over
    targets, CIs over sequences): every pair, or each head's ``top`` by |contrast| (only they are
    resampled)."""
    names, kinds, _ = grouping
    G, B = len(names), sums["contrast"].shape[0]
    count = torch.bincount(pairs[:, 0], minlength=B).double()
    flat = {v: sums[v].flatten(2) for v in VALUES}  # [B, head, G * G], query-major
    if top is None:
        keep = torch.arange(G * G).expand(len(heads), -1)
    else:
        point = flat["contrast"].sum(0) / count.sum()
        keep = point.abs().sort(dim=-1, descending=True, stable=True).indices[:, :top]
    cols: dict[str, Any] = {"head": np.repeat([f"{layer}.{h}" for h in heads], keep.shape[1]), "layer": layer}
    x, y = (keep // G).flatten().numpy(), (keep % G).flatten().numpy()
    cols.update(query=np.array(names, dtype=object)[x], key=np.array(names, dtype=object)[y])
    cols.update(query_kind=np.array(kinds, dtype=object)[x], key_kind=np.array(kinds, dtype=object)[y])
    for v in VALUES:
        num = flat[v].gather(2, keep[None].expand(B, -1, -1))
        got = bootstrap_ratio(
            num, count[:, None, None].expand_as(num), n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed
        )
        for end, t in zip(("", "_lo", "_hi"), got):
            cols[f"{v}{end}"] = t.double().flatten().numpy()  # the float32 values, as float64 columns
    return pd.DataFrame(cols)


def _totals(sides: LayerSides, layer: int, heads: list[int], n_targets: int) -> dict[str, Any]:
    """Each head's own mean contrast and score (from the query and key it attended with)."""
    return {
        f"{layer}.{h}": {
            "contrast": float(sides.model_contrast[:, n_h].mean()),
            "score": float(sides.model_score[:, n_h].mean()),
            "n_targets": n_targets,
        }
        for n_h, h in enumerate(heads)
    }


# sequences; a task file gives every pair, a bundled task its own default
DEFAULT_BATCH = {"induction": 10, "previous": 10, "sink": 10, "retrieval": 4}


def qk_source(
    model: HookedModel,
    *,
    at: str | None = None,
    text: str | None = None,
    query: int | None = None,
    key: int | None = None,
    task: str | None = None,
    batch: int | None = None,
    seq_len: int | None = None,
    seed: int = 0,
    framed: bool = False,
) -> tuple[Any, Any, str]:
    """What :func:`qk_attribution` reads for a target set, built from its options, its targets, and
    a line saying what it is: ``text`` read at one ``query`` (default: the last position) and ``key``
    position; a task's pairs (``at="task"``, ``task``, ``batch`` of them); a needle probe
    (``"retrieval"``); else ``batch`` repeated-token sequences of ``seq_len`` tokens a block (default
    20) for ``at``. ``batch`` defaults to :data:`DEFAULT_BATCH` of the target (a task: every pair
    of its file, or a bundled task's own number)."""
    from interp.probes import repeated_tokens
    from interp.probes.needle import needle_probe
    from interp.probes.task import task_probe

    if text is not None:
        if key is None:
            raise UsageError("text= is read at one key position: pass key=", params="key")
        probe = TokenProbe.from_texts(model, text)
        T = probe.seq_len
        q, k = text_positions(T, query, key, describe(model).is_causal)
        return probe, torch.tensor([[0, q, k]]), f"your text ({T} tokens), query {q}, key {k}"
    if at == "task":
        pairs = task_probe(model, task, n_pairs=batch, seed=seed, framed=framed)  # None: a file's every pair
        return (
            pairs,
            "task",
            f"the {pairs.name} task ({plural(pairs.n_pairs, 'pair')}), read at position {pairs.read_position}",
        )
    batch = batch or DEFAULT_BATCH[at or "induction"]
    if at == "retrieval":
        probe = needle_probe(model, seq_len=seq_len, batch=batch, seed=seed)
        return probe, "retrieval", f"{batch} needle sequences of {probe.seq_len} tokens"
    block = seq_len or 20
    probe = repeated_tokens(model, batch=batch, block_len=block, n_repeats=2, seed=seed)
    return probe, at, f"{batch} sequences of a {block}-token block repeated twice"


__all__ = [
    "DEFAULT_BATCH",
    "GROUPS",
    "STEM",
    "TARGETS",
    "QKAttribution",
    "QKTerms",
    "group_of",
    "head_totals",
    "parse_heads",
    "qk_attribution",
    "qk_source",
    "qk_terms",
    "validate_qk_attribution",
]
