"""Encoder heads (Clark et al. 2019), attention entropy, Voita et al.'s positional and rare-word
heads, and a map of heads by the Jensen-Shannon distance between their patterns.

Every score averages over the probe's real query positions (all of them, as Clark et al. do; a
padded row's padding never counts), each query over the keys it may see:

- **attention on a kind of key** (one registration each in :data:`ENCODER_SCORES`, reduced by
  :func:`interp.heads.attention_scores` as the attention scores are): ``cls``, ``sep`` (the
  model's [CLS] / [SEP] tokens), ``punct`` (tokens the tokenizer decodes to punctuation only),
  ``prev``, ``own`` and ``next`` (the key one position before, at, or after the query). Mean
  attention mass on those keys over the queries that see one; the uniform baseline is what a head
  attending uniformly scores (``interp.heads.HeadScore.uniform_baseline``).
- **entropy**: mean entropy (nats) of a query's attention row; its baseline is the entropy of the
  uniform row, ``log(keys seen)``, averaged over the same queries.
- **positional** (Voita et al. 2019): for each relative offset in ``-3..3`` other than 0, the share of
  queries whose largest attention weight falls on the key at that offset; the head's score is the
  largest share and ``positional_offset`` its offset. Voita's positional head has this >= 0.9.
- **rare_word** (Voita et al. 2019): the share of queries whose largest weight falls on the rarest
  ordinary token they see, by a frequency table (token counts of the bundled text through the
  model's tokenizer, or the user's).

A row's largest weight may be tied (a uniform row ties everywhere): a tie counts as the share of the
tied keys that are targets, so a uniform head scores exactly its baseline. Each score carries a
bootstrap interval over probe sequences.

:func:`head_map` gives every pair of heads the Jensen-Shannon distance (base 2, in ``[0, 1]``)
between their attention rows, averaged over the probe's real queries, and a 2-D embedding of it
(classical multidimensional scaling) whose figure colours heads by layer.
"""

from __future__ import annotations

import json
import math
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from interp._io import atomic_write_json
from interp.adapters import HookedModel, ModelInfo, describe, run_with_reducers
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.heads import HeadScore, attention_scores
from interp.hooks import layer_of, pattern_hook
from interp.probes import TokenProbe
from interp.progress import forward_work
from interp.registry import Registry
from interp.results import Shown
from interp.scores import HeadScores, bootstrap_ratio, interval_notes

if TYPE_CHECKING:
    import plotly.graph_objects as go

OFFSETS = (-3, -2, -1, 1, 2, 3)
POSITIONAL = 0.9  # Voita et al.'s threshold: a positional head's argmax is on one offset this often
MAP_BUDGET = 1 << 30  # bytes of patterns the head map may hold at once
MAP_WIDTH, MAP_HEIGHT = 720, 520  # the map's figure: fits a 1280-pixel window beside nothing else
LABEL_PX = (6.5, 14.0)  # a head label's width per character and its height, in pixels (11 px type)


@dataclass(frozen=True)
class KeyTokens:
    """The model's token ids a score looks for among the keys."""

    cls: int | None
    sep: int | None
    punct: frozenset[int]


# each registration builds its HeadScore from the model's key tokens
ENCODER_SCORES: Registry[Callable[[KeyTokens], HeadScore]] = Registry("encoder head score")


def visible(probe: TokenProbe) -> Bool[Tensor, "batch q k"]:
    """Which keys each real query sees: real keys, at or before the query on a causal model."""
    real = probe.real_mask().cpu()
    seen = real[:, :, None] & real[:, None, :]
    if probe.causal:
        seen &= torch.ones(probe.seq_len, probe.seq_len, dtype=torch.bool).tril()
    return seen


def _score(mask_of: Callable[[TokenProbe], Bool[Tensor, "batch q k"]]) -> HeadScore:
    def mask(probe: TokenProbe, _: str) -> Bool[Tensor, "batch q k"]:
        return (mask_of(probe) & visible(probe)).to(probe.tokens.device)

    return HeadScore(pairs=lambda probe, q: mask(probe, q).cpu().nonzero(), mask=mask)


def _on_tokens(ids: Callable[[KeyTokens], Sequence[int]]) -> Callable[[KeyTokens], HeadScore]:
    def build(keys: KeyTokens) -> HeadScore:
        wanted = torch.tensor(sorted(ids(keys)), dtype=torch.long)
        return _score(lambda probe: torch.isin(probe.tokens.cpu(), wanted)[:, None, :].expand(-1, probe.seq_len, -1))

    return build


def _at_offset(offset: int) -> Callable[[KeyTokens], HeadScore]:
    def mask(probe: TokenProbe) -> Bool[Tensor, "batch q k"]:
        n = probe.seq_len
        eye = torch.eye(n, dtype=torch.bool).roll(offset, dims=1)
        if offset > 0:
            eye[n - offset :] = False
        elif offset < 0:
            eye[:-offset] = False
        return eye.expand(probe.batch, n, n)

    return lambda keys: _score(mask)


ENCODER_SCORES.add("cls", "attention on [CLS]", _on_tokens(lambda k: [] if k.cls is None else [k.cls]))
ENCODER_SCORES.add("sep", "attention on [SEP]", _on_tokens(lambda k: [] if k.sep is None else [k.sep]))
ENCODER_SCORES.add("punct", "attention on punctuation tokens", _on_tokens(lambda k: k.punct))
ENCODER_SCORES.add("prev", "attention on the previous token (every query)", _at_offset(-1))
ENCODER_SCORES.add("own", "attention on the query's own token (every query)", _at_offset(0))
ENCODER_SCORES.add("next", "attention on the next token (encoders)", _at_offset(1))
KEY_SCORES = ENCODER_SCORES.names()


def key_tokens(model: HookedModel, info: ModelInfo) -> KeyTokens:
    """[CLS], [SEP] and the punctuation tokens of ``model`` (none without a tokenizer)."""
    tok = getattr(model, "tokenizer", None)
    punct: set[int] = set()
    if tok is not None:
        texts = tok.batch_decode([[i] for i in range(info.d_vocab)])
        punct = {
            i
            for i, t in enumerate(texts)
            if t.strip() and all(c in string.punctuation for c in t.strip()) and i not in info.special_token_ids
        }
    return KeyTokens(info.cls_token_id, info.sep_token_id, frozenset(punct))


# --------------------------------------------------------------------------------------------
# frequency tables


def bundled_frequencies(model: HookedModel, budget: int = 200_000) -> Float[Tensor, " d_vocab"]:
    """Token counts of the bundled text through the model's tokenizer (the toy: its UTF-8 bytes
    mapped onto the ordinary ids, as :func:`interp.probes.text_probe` reads it)."""
    from interp.probes.draw import ordinary_vocab
    from interp.texts import bytes_to_ids, text_rows, tokenize_rows

    info = describe(model)
    rows, _ = text_rows(None, "train", "text")
    tok = getattr(model, "tokenizer", None)
    ids = tokenize_rows(tok, rows, budget) if tok is not None else bytes_to_ids(rows, ordinary_vocab(info), budget)
    ids = ids[(ids >= 0) & (ids < info.d_vocab)]
    return torch.bincount(ids, minlength=info.d_vocab).double()


def rarest_keys(
    probe: TokenProbe, frequencies: Float[Tensor, " d_vocab"], special: frozenset[int]
) -> Bool[Tensor, "batch q k"]:
    """For each query, the ordinary keys it sees whose token is the rarest it sees (ties: all)."""
    seen = visible(probe) & ~torch.isin(probe.tokens.cpu(), torch.tensor(sorted(special), dtype=torch.long))[:, None]
    freq = frequencies.double().cpu()[probe.tokens.cpu()][:, None, :].expand_as(seen)
    least = torch.where(seen, freq, math.inf).amin(-1, keepdim=True)
    return seen & (freq == least)


# --------------------------------------------------------------------------------------------
# the pattern pass: entropy, argmax offsets, rare words, and (for the map) the patterns


@dataclass
class _Sums:
    """Per-sequence sums over real queries, ``[batch, layer, head]`` (offsets: ``[..., offset]``)."""

    entropy: Tensor
    offsets: Tensor
    rare: Tensor


def _argmax_share(pattern: Tensor, targets: Tensor) -> Tensor:
    """Per query row, the share of its tied largest weights that fall on ``targets`` ([b, h, q])."""
    top = pattern >= pattern.amax(-1, keepdim=True) * (1 - 1e-5)
    return (top & targets[:, None]).sum(-1) / top.sum(-1).clamp_min(1)


def _pattern_pass(
    model: HookedModel, probe: TokenProbe, info: ModelInfo, rare: Tensor, keep: bool
) -> tuple[_Sums, list[Tensor | None]]:
    B, L, H, T = probe.batch, info.n_layers, info.n_heads, probe.seq_len
    sums = _Sums(torch.zeros(B, L, H), torch.zeros(B, L, H, len(OFFSETS)), torch.zeros(B, L, H))
    for t in (sums.entropy, sums.rare):
        t[:, list(info.absent_layers)] = float("nan")
    seen = visible(probe)
    real = probe.real_mask().cpu()
    idx = torch.arange(T)
    at_offset = [(idx[None, :] - idx[:, None] == r)[None] & seen for r in OFFSETS]  # [b, q, k] each
    kept: list[Tensor | None] = [None] * L

    def reduce(pattern: Float[Tensor, "batch head q k"], hook: Any) -> None:
        layer = layer_of(hook)
        p = pattern.detach().float().cpu() * seen[:, None]
        rows = real[:, None, :].float()  # [b, 1, q]
        ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
        sums.entropy[:, layer] = (ent * rows).sum(-1)
        for i, target in enumerate(at_offset):
            sums.offsets[:, layer, :, i] = (_argmax_share(p, target) * rows).sum(-1)
        sums.rare[:, layer] = (_argmax_share(p, rare) * rows).sum(-1)
        if keep:
            kept[layer] = p

    run_with_reducers(
        model,
        probe.tokens,
        [(pattern_hook(l), reduce) for l in info.attention_layers],
        stop_after=pattern_hook(info.attention_layers[-1]),
        attention_mask=probe.attention_mask,
    )
    return sums, kept


# --------------------------------------------------------------------------------------------
# the table


def encoder_scores(
    model: HookedModel,
    probe: TokenProbe | None = None,
    *,
    scores: Sequence[str] = KEY_SCORES,
    frequencies: Float[Tensor, " d_vocab"] | Mapping[int, float] | None = None,
    config: RunConfig | None = None,
) -> HeadScores:
    """Clark et al.'s key scores, attention entropy, and Voita et al.'s positional and rare-word
    scores of every head (see the module docstring), each with a bootstrap CI over sequences and
    its uniform baseline in ``meta["baselines"]``.

    ``probe`` defaults to 8 windows of 32 tokens of the bundled text; ``frequencies`` (a
    ``[d_vocab]`` count tensor or ``{token id: count}``) defaults to :func:`bundled_frequencies`;
    ``config``: the bootstrap and seed."""
    cfg = RunConfig.of(config)
    n_boot, level, seed = cfg.n_boot, cfg.level, cfg.seed
    scores = ENCODER_SCORES.check_all(scores)
    info = describe(model)
    if probe is None:
        from interp.probes import text_probe

        probe = text_probe(model, batch=8, seq_len=min(32, info.n_ctx - 2), seed=seed)
    if probe.seq_len > info.n_ctx:
        raise UsageError(f"probe of {probe.seq_len} tokens is longer than the model's context of {info.n_ctx}")
    freq = _frequency_table(model, info, frequencies)
    keys = key_tokens(model, info)
    bound: Registry[HeadScore] = Registry("encoder head score")
    for name in scores:
        bound.add(name, ENCODER_SCORES.doc(name), ENCODER_SCORES.get(name)(keys))
    num, den = attention_scores(model, probe, scores=scores, registry=bound)
    grids: dict[str, Tensor] = {}
    notes: list[str] = []
    baselines: dict[str, float] = {}
    for name in scores:
        ci = bootstrap_ratio(num[name], den[name], n_boot=n_boot, level=level, seed=seed)
        if float(den[name].sum()) == 0:
            notes.append(f"{name}: no query of this probe sees such a key {_why_none(name, keys, info)}, so it is NaN")
        else:
            notes.extend(interval_notes(name, ci))
            baselines[name] = bound.get(name).uniform_baseline(probe)
        grids.update({name: ci.point, f"{name}_lo": ci.lo, f"{name}_hi": ci.hi})

    rare = rarest_keys(probe, freq, info.special_token_ids)
    sums, _ = _pattern_pass(model, probe, info, rare, keep=False)
    seen = visible(probe)
    real = probe.real_mask().cpu()
    queries = real.sum(-1).double()[:, None, None].expand(-1, info.n_layers, info.n_heads)
    n_keys = seen.sum(-1).clamp_min(1).double()
    ci = bootstrap_ratio(sums.entropy, queries, n_boot=n_boot, level=level, seed=seed)
    grids.update({"entropy": ci.point, "entropy_lo": ci.lo, "entropy_hi": ci.hi})
    baselines["entropy"] = float(torch.log(n_keys)[real].mean())

    positional, baselines["positional"] = _positional(sums, probe, info, queries, n_keys, (n_boot, level, seed))
    grids.update(positional)

    has_rare = rare.any(-1) & real
    rare_den = has_rare.sum(-1).double()[:, None, None].expand(-1, info.n_layers, info.n_heads)
    ci = bootstrap_ratio(sums.rare, rare_den, n_boot=n_boot, level=level, seed=seed)
    grids.update({"rare_word": ci.point, "rare_word_lo": ci.lo, "rare_word_hi": ci.hi})
    if bool(has_rare.any()):
        baselines["rare_word"] = float((rare.sum(-1) / n_keys)[has_rare].mean())
    else:
        notes.append("rare_word: no query of this probe sees an ordinary (non-special) token, so it is NaN")

    meta = run_header(info, probe, kind="encoder_heads", ci_level=level, n_boot=n_boot, seed=seed)
    meta.update(baselines=baselines, positional_threshold=POSITIONAL, offsets=list(OFFSETS))
    meta["ci_sequences"] = {name: probe.batch for name in grids if not name.endswith(("_lo", "_hi"))}
    meta["frequencies"] = "user" if frequencies is not None else "bundled text"
    if notes:
        meta["notes"] = notes
    return HeadScores.from_grids(grids, meta)


def _positional(
    sums: _Sums, probe: TokenProbe, info: ModelInfo, queries: Tensor, n_keys: Tensor, boot: tuple[int, float, int]
) -> tuple[dict[str, Tensor], float]:
    """Voita et al.'s positional score (the share of queries whose largest weight falls on the
    head's most frequent relative position) with its CI and offset, and its uniform baseline."""
    n_boot, level, seed = boot
    pooled = sums.offsets.sum(0) / queries.sum(0)[..., None]  # [layer, head, offset]
    best = torch.nan_to_num(pooled, nan=-1).argmax(-1)
    chosen = sums.offsets.gather(-1, best[None, ..., None].expand(probe.batch, -1, -1, 1))[..., 0]
    chosen[:, list(info.absent_layers)] = float("nan")  # no pattern: no score
    ci = bootstrap_ratio(chosen, queries, n_boot=n_boot, level=level, seed=seed)
    offset = torch.tensor(OFFSETS, dtype=torch.float)[best]
    offset[list(info.absent_layers)] = float("nan")
    idx = torch.arange(probe.seq_len)
    real, seen = probe.real_mask().cpu(), visible(probe)
    shares = [((idx[None, :] - idx[:, None] == r) & seen).sum(-1) / n_keys for r in OFFSETS]
    grids = {"positional": ci.point, "positional_lo": ci.lo, "positional_hi": ci.hi, "positional_offset": offset}
    return grids, max(float(s[real].mean()) for s in shares)


def _why_none(name: str, keys: KeyTokens, info: ModelInfo) -> str:
    if name == "cls" and keys.cls is None or name == "sep" and keys.sep is None:
        return f"({info.name} has no {name.upper()} token)"
    if name == "punct" and not keys.punct:
        return "(the model's tokenizer holds no punctuation token, or it has no tokenizer)"
    if name == "next" and info.is_causal:
        return "(a causal model never sees the next token)"
    return "(no such key in the probe)"


def _frequency_table(model: HookedModel, info: ModelInfo, given: Any) -> Tensor:
    if given is None:
        return bundled_frequencies(model)
    if isinstance(given, Mapping):
        table = torch.zeros(info.d_vocab, dtype=torch.float64)
        for token, count in given.items():
            if not 0 <= int(token) < info.d_vocab:
                raise UsageError(f"frequency table: token id {token} is outside the vocabulary of {info.d_vocab}")
            table[int(token)] = float(count)
        return table
    table = torch.as_tensor(given, dtype=torch.float64).flatten()
    if len(table) != info.d_vocab:
        raise UsageError(f"frequency table has {len(table)} entries; the model's vocabulary has {info.d_vocab}")
    return table


# --------------------------------------------------------------------------------------------
# the map of heads


@dataclass(repr=False)
class HeadMap(Shown):
    """Jensen-Shannon distances between every pair of heads' patterns and a 2-D embedding of them."""

    distance: np.ndarray  # [layer * head, layer * head]
    coords: np.ndarray  # [layer * head, 2]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def labels(self) -> list[str]:
        H, L = int(self.meta["n_heads"]), int(self.meta["n_layers"])
        return [f"{l}.{h}" for l in range(L) for h in range(H)]

    @property
    def table(self) -> pd.DataFrame:
        """A row per head: its label, layer, head and map coordinates ``x``, ``y``."""
        H = int(self.meta["n_heads"])
        n = len(self.labels)
        return pd.DataFrame(
            {
                "label": self.labels,
                "layer": [i // H for i in range(n)],
                "head": [i % H for i in range(n)],
                "x": self.coords[:, 0],
                "y": self.coords[:, 1],
            }
        )

    def figure(self, title: str | None = None, *, width: int = MAP_WIDTH, height: int = MAP_HEIGHT) -> go.Figure:
        """The heads as points (classical MDS of the distances), coloured by layer, ``width`` x
        ``height`` pixels. A point is labelled with its head where the label has room (no two labels
        overlap: :func:`label_room`); every point names its head on hover (its ``customdata``)."""
        import plotly.graph_objects as go

        H = int(self.meta["n_heads"])
        layers = [i // H for i in range(len(self.labels))]
        margin = {"l": 60, "r": 110, "t": 60, "b": 50}
        x, y = self.coords[:, 0], self.coords[:, 1]
        xr, yr = _padded(x), _padded(y)
        box = (width - margin["l"] - margin["r"], height - margin["t"] - margin["b"])
        shown = label_room(x, y, self.labels, xr, yr, box)
        fig = go.Figure(
            go.Scatter(
                x=x,
                y=y,
                mode="markers+text",
                text=[lab if keep else "" for lab, keep in zip(self.labels, shown)],
                customdata=self.labels,
                textposition="top center",
                textfont={"size": 11},
                marker={
                    "color": layers,
                    "colorscale": "Viridis",
                    "colorbar": {"title": {"text": "layer", "side": "right"}, "thickness": 14, "dtick": 1},
                    "size": 10,
                },
                hovertemplate="head %{customdata}<extra></extra>",
            )
        )
        fig.update_layout(
            title=title or f"heads by Jensen-Shannon distance of their patterns: {self.meta.get('model', '')}",
            xaxis={"title": "MDS 1", "range": xr},
            yaxis={"title": "MDS 2", "range": yr},
            width=width,
            height=height,
            margin=margin,
        )
        from interp.plots import styled

        return styled(fig)

    def save(self, out_dir: str | Path, stem: str = "head_map", *, overwrite: bool = False) -> list[Path]:
        from interp.saving import claim, provenance

        (path,) = claim(Path(out_dir), [f"{stem}.json"], overwrite=overwrite)
        blob = {
            "kind": "head_map",
            **provenance(),
            "meta": self.meta,
            "labels": self.labels,
            "distance": self.distance.tolist(),
            "coords": self.coords.tolist(),
        }
        return [atomic_write_json(path, blob)]

    @classmethod
    def load(cls, path: str | Path) -> HeadMap:
        blob = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(np.array(blob["distance"], dtype=float), np.array(blob["coords"], dtype=float), blob["meta"])


def _padded(values: np.ndarray) -> list[float]:
    """An axis range holding ``values`` with 8% to spare on each side (room for the labels above)."""
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    pad = 0.08 * (hi - lo) or 0.5
    return [lo - pad, hi + pad]


def label_room(
    x: np.ndarray, y: np.ndarray, labels: Sequence[str], xr: Sequence[float], yr: Sequence[float], box: tuple[int, int]
) -> list[bool]:
    """Which points get their label: in order, each whose label box (centred above the point, in
    the ``box`` pixels the axes ``xr`` x ``yr`` span) overlaps no label kept before it."""
    kept: list[tuple[float, float, float, float]] = []
    out = []
    for px, py, label in zip(x, y, labels):
        if not (np.isfinite(px) and np.isfinite(py)):
            out.append(False)
            continue
        cx = (px - xr[0]) / (xr[1] - xr[0]) * box[0]
        cy = (yr[1] - py) / (yr[1] - yr[0]) * box[1] - 6 - LABEL_PX[1] / 2  # above the marker
        w, h = LABEL_PX[0] * len(label) + 4, LABEL_PX[1] + 2
        mine = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
        free = all(mine[2] <= k[0] or k[2] <= mine[0] or mine[3] <= k[1] or k[3] <= mine[1] for k in kept)
        if free:
            kept.append(mine)
        out.append(free)
    return out


def js_distance(p: Float[Tensor, "... k"], q: Float[Tensor, "... k"]) -> Float[Tensor, ...]:
    """Jensen-Shannon distance (square root of the divergence, base 2) between rows."""
    m = (p + q) / 2

    def kl(a: Tensor) -> Tensor:
        return torch.where(a > 0, a * (torch.log2(a.clamp_min(1e-30)) - torch.log2(m.clamp_min(1e-30))), 0.0).sum(-1)

    return ((kl(p) + kl(q)) / 2).clamp_min(0).sqrt()


def classical_mds(distance: np.ndarray, dims: int = 2) -> np.ndarray:
    """Points whose Euclidean distances best match ``distance`` (Torgerson's classical scaling)."""
    n = len(distance)
    d2 = np.nan_to_num(distance) ** 2
    J = np.eye(n) - 1.0 / n
    B = -0.5 * J @ d2 @ J
    vals, vecs = np.linalg.eigh(B)
    order = np.argsort(vals)[::-1][:dims]
    return vecs[:, order] * np.sqrt(np.clip(vals[order], 0, None))


def head_map(model: HookedModel, probe: TokenProbe | None = None, *, config: RunConfig | None = None) -> HeadMap:
    """Every pair of heads' Jensen-Shannon distance, averaged over the probe's real queries, and its
    2-D classical-MDS embedding (any model; heads of layers without softmax attention are NaN);
    ``config``: the seed (of the default probe)."""
    seed = RunConfig.of(config).seed
    info = describe(model)
    if probe is None:
        from interp.probes import text_probe

        probe = text_probe(model, batch=8, seq_len=min(32, info.n_ctx - 2), seed=seed)
    need = 4 * info.n_layers * info.n_heads * probe.batch * probe.seq_len**2
    if need > MAP_BUDGET:
        raise UsageError(
            f"the head map keeps every head's pattern ({need / 2**30:.1f} GiB for this probe, over "
            f"{MAP_BUDGET / 2**30:.0f} GiB): pass a probe with fewer or shorter sequences"
        )
    none = torch.zeros_like(probe.tokens, dtype=torch.bool)[:, None, :].expand(-1, probe.seq_len, -1)
    _, kept = _pattern_pass(model, probe, info, none, keep=True)
    real = probe.real_mask().cpu()
    n = info.n_layers * info.n_heads
    rows = [kept[l][:, h] if kept[l] is not None else None for l in range(info.n_layers) for h in range(info.n_heads)]
    distance = np.full((n, n), np.nan)
    for i, p in enumerate(rows):
        if p is None:
            continue
        for j in range(i, n):
            if rows[j] is not None:
                distance[i, j] = distance[j, i] = float(js_distance(p, rows[j])[real].mean())
    present = ~np.isnan(np.diag(distance))
    coords = np.full((n, 2), np.nan)
    coords[present] = classical_mds(distance[np.ix_(present, present)])
    meta = run_header(info, probe, kind="head_map", seed=seed)
    return HeadMap(distance, coords, meta)


def encoder_work(info: ModelInfo, batch: int, seq_len: int) -> tuple[str, float]:
    """What the encoder-head scores are, with their sizes, and their work (a forward of ``batch``
    framed sequences of ``seq_len`` tokens; multiply-adds, :func:`interp.progress.forward_work`)."""
    what = f"the encoder-head scores ({batch} x {seq_len} tokens of text)"
    return what, forward_work(batch * seq_len, info.n_layers, info.d_model)


def head_map_work(info: ModelInfo, batch: int, seq_len: int) -> tuple[str, float]:
    """What the map of heads is, with its sizes, and its work: a forward, and a Jensen-Shannon
    distance between the patterns of every pair of heads (about ten operations a pattern entry)."""
    n_heads = info.n_heads * len(info.attention_layers)
    n = batch * seq_len
    what = f"the map of heads ({n_heads} heads' patterns on {batch} x {seq_len} tokens of text)"
    return what, forward_work(n, info.n_layers, info.d_model) + n_heads * (n_heads + 1) // 2 * 10 * n * seq_len


__all__ = [
    "ENCODER_SCORES",
    "KEY_SCORES",
    "OFFSETS",
    "POSITIONAL",
    "HeadMap",
    "KeyTokens",
    "bundled_frequencies",
    "classical_mds",
    "encoder_scores",
    "encoder_work",
    "head_map",
    "head_map_work",
    "js_distance",
    "key_tokens",
    "label_room",
    "rarest_keys",
]
