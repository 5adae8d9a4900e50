"""Direct logit attribution: what each head writes onto the answer-minus-wrong logit direction.

For each prompt, at its answer position ``q``, the logit difference ``logit[answer] - logit[wrong]``
(or the answer's logit alone when no wrong token is given) is read from the final residual
``x = sum of parts`` through the final norm with its scale *frozen at the clean run's value*:
``N(x) = P(x) / s * w + b`` (``P``: centering for LayerNorm, identity for RMSNorm) is then linear in
``x``, so the difference splits exactly into one term per part plus a constant:

- ``embed``: the residual entering block 0 (token and position embeddings);
- each head ``layer.head``: its output ``z W_O`` at ``q``; through a post-attention norm (Gemma 2)
  that norm's scale is frozen too. Per head x source position: ``A[q, k] v_k W_O``, which sums
  over ``k`` to the head's term;
- ``attn_other`` per layer: the attention's write to the residual minus its heads' (the output
  bias ``b_O``, a post-norm's bias; a linear-attention layer's whole write);
- ``mlp`` per layer: the MLP's write (``resid_post - resid_mid``; in a parallel block, where
  attention and MLP read the same input, the block's write minus the attention's);

Attention with a sigmoid output gate per head (Qwen3-Next) is refused: the head's output is not
its pattern times its values through ``W_O``. Encoders are refused: post-LayerNorm blocks and a
masked-LM head with a dense layer and an activation make no head's write a term of the logits.
- ``rest``: the final residual minus the last block's output (zero for these architectures);
- ``bias``: the final norm's bias and the unembedding bias on the direction.

The parts add up to the model's own logit difference (to float rounding). Gemma 2 caps its final
logits, ``c * tanh(logit / c)``: the attribution is of the *pre-cap* logit difference (the cap is
not linear); ``meta["softcap"]`` says so and the table gives both.

The norm's gain and bias are read from the clean run itself (a least-squares fit of the hooked
output on ``P(input) / scale`` over every position, exact for an elementwise affine map), so no
architecture's parameter convention (Gemma's ``1 + w``) needs knowing.

Inputs are plain token ids, answer ids and wrong ids (one each, or several, per prompt), or a
:class:`~interp.probes.task.TaskProbe` (the task probes of :mod:`interp.patching`): its clean
prompts, read at its position, with its answers and wrong answers. Where a prompt has several
answers (or wrong answers), the difference attributed is the *mean* answer logit minus the mean
wrong logit, the task's ``logit-diff`` metric: linear in the logits, so it splits exactly. The
greater-than task's own metric, P(year > YY) - P(year <= YY), is a difference of softmax sums and
does not split into terms; what is attributed there is the mean logit of the later years minus the
mean logit of the earlier ones (``meta["direction"]`` says so). The per-head table carries a
bootstrap CI over prompts (:func:`interp.scores.bootstrap_mean`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp._io import atomic_write, atomic_write_json
from interp.adapters import HookedModel, describe, gated_attention_modules, run_with_reducers
from interp.adapters.info import has_hook
from interp.adapters.weights import (
    NormSite,
    final_norm_site,
    final_softcap,
    gain_and_bias,
    post_attention_norm_site,
    read_head_weights,
)
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.hooks import attn_out_hook, pattern_hook, resid_mid_hook, resid_post_hook, resid_pre_hook, v_hook
from interp.probes.task import TaskProbe
from interp.results import Shown, plural, read_csv
from interp.scores import HeadScores, bootstrap_mean, format_table

if TYPE_CHECKING:
    import plotly.graph_objects as go

STEM = "logit_attribution"


@dataclass(repr=False)
class LogitAttribution(Shown):
    """Per prompt, each part's share of the logit difference; per head with CIs, per head x position.

    The shape every result has: :attr:`table` (the per-head table of :attr:`heads`), :attr:`meta`,
    :meth:`grid`, :meth:`figure`, :meth:`save` and :meth:`load`."""

    heads: HeadScores  # columns dla, dla_lo, dla_hi: mean over prompts
    per_position: Float[np.ndarray, "batch layer head pos"]  # each head's term split by source position
    parts: pd.DataFrame  # a row per prompt: every non-head part, the heads' sum, the total, the model's
    meta: dict[str, Any] = field(default_factory=dict)
    shown_by = "dla"

    @property
    def table(self) -> pd.DataFrame:
        """The per-head table (a row per (layer, head): ``dla`` and its CI), as every result has."""
        return self.heads.table

    def summary(self, top: int = 10) -> str:
        """The ``top`` heads by the size of their term, with CIs, under a line saying what was attributed."""
        t = self.heads.table
        ranked = t.reindex(t["dla"].abs().sort_values(ascending=False).index).head(top)
        task, n = self.meta.get("task"), self.meta["n_prompts"]
        on = f"task {task['name']}, read at position {task['read_position']}; " if task else ""
        lines = [
            f"\ndirect logit attribution ({on}{self.meta['direction']}, {plural(n, 'prompt')}; "
            f"parts add up to the model's difference within {self.meta['max_error']:.1e}):",
            format_table(ranked, ["dla"], ci=["dla"], fmt=".3g", n_sequences=n),
        ]
        return "\n".join(lines + ([f"  note: {self.meta['softcap']}"] if self.meta["softcap"] else []))

    def grid(self, score: str = "dla") -> np.ndarray:
        """The ``[n_layers, n_heads]`` matrix of ``dla`` (or of its CI bounds, ``dla_lo``, ``dla_hi``)."""
        return self.heads.grid(score)

    def figure(self, title: str | None = None, **kwargs: Any) -> go.Figure:
        """The layer x head heatmap of each head's mean direct logit attribution."""
        return self.heads.figure(
            ["dla"], title=title or f"direct logit attribution: {self.meta.get('model', '')}", **kwargs
        )

    @classmethod
    def load(cls, path: str | Path, stem: str = STEM) -> LogitAttribution:
        """Read back what :meth:`save` wrote, from its ``<stem>.json`` or the folder holding it."""
        path = Path(path)
        path = path / f"{stem}.json" if path.is_dir() else path
        if not path.is_file():
            raise UsageError(f"no saved logit attribution at {path}: pass the {stem}.json that save() wrote")
        blob = json.loads(path.read_text(encoding="utf-8"))
        if "per_position" not in blob:
            raise UsageError(f"{path} holds no per-position terms (it was saved by an older version): run it again")
        stem = path.name[: -len(".json")]
        heads = HeadScores.load(path.with_name(f"{stem}_heads.json"))
        parts = read_csv(path.with_name(f"{stem}_parts.csv"))
        per_position = np.array(blob["per_position"], dtype=float)  # null (past a prompt's end) reads as NaN
        return cls(heads, per_position, parts, blob["meta"])

    def save(self, out_dir: str | Path, stem: str = STEM, *, overwrite: bool = False) -> list[Path]:
        """``<stem>_heads.csv/json`` (the head table), ``<stem>_parts.csv`` and ``<stem>.json``
        (parts, per-position means and meta), each written atomically."""
        from interp.saving import claim, provenance

        out = Path(out_dir)
        files = self.heads.save(out, f"{stem}_heads", overwrite=overwrite)
        parts_path, js_path = claim(out, [f"{stem}_parts.csv", f"{stem}.json"], overwrite=overwrite)
        files.append(atomic_write(parts_path, self.parts.to_csv(index=False)))
        blob = {
            "kind": STEM,
            **provenance(),
            "meta": self.meta,
            "parts": json.loads(self.parts.to_json(orient="records")),
            "per_position_mean": np.nanmean(self.per_position, 0).tolist(),
            "per_position": np.where(np.isnan(self.per_position), None, self.per_position).tolist(),
        }
        files.append(atomic_write_json(js_path, blob))
        return files


@dataclass
class _FrozenNorm:
    """A norm with its scale frozen at each prompt's answer position: ``x -> P(x) / s * w + b``."""

    scale: Tensor  # [batch]
    w: Tensor  # [d_model]
    b: Tensor  # [d_model]
    centered: bool

    def pullback(self, v: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch d_model"]:
        """The vector ``u`` with ``N(x) . v = x . u + b . v`` (the norm's linear part, transposed)."""
        u = v * self.w / self.scale[:, None]
        return u - u.mean(-1, keepdim=True) if self.centered else u


def _frozen(site: NormSite, grabbed: dict[str, Tensor], at: Tensor) -> _FrozenNorm:
    w, b = gain_and_bias(site, grabbed)
    s = grabbed[site.scale].double()
    return _FrozenNorm(s[torch.arange(s.shape[0]), at, 0], w, b, site.centered)


def logit_attribution(
    model: HookedModel,
    tokens: Int[Tensor, "batch pos"] | Sequence[Sequence[int]] | TaskProbe,
    answers: Int[Tensor, " batch"] | Int[Tensor, "batch k"] | Sequence[int] | None = None,
    wrongs: Int[Tensor, " batch"] | Int[Tensor, "batch k"] | Sequence[int] | None = None,
    *,
    positions: Int[Tensor, " batch"] | Sequence[int] | None = None,
    config: RunConfig | None = None,
) -> LogitAttribution:
    """Direct logit attribution of every head (and every other part of the residual) to each
    prompt's ``logit[answer] - logit[wrong]`` at ``positions`` (default: each prompt's last), see
    the module docstring. ``wrongs=None`` attributes the answer's logit itself. ``tokens`` is
    ``[batch, pos]`` or a list of prompts of any lengths (each length runs as its own batch;
    ``per_position`` is NaN past a prompt's end). ``answers`` and ``wrongs`` hold one id per prompt
    or ``[batch, k]`` ids (``-1`` pads): the mean logit of a prompt's answers minus that of its
    wrong ones. ``tokens`` may be a :class:`~interp.probes.task.TaskProbe` instead (with no
    ``answers``, ``wrongs`` or ``positions``): its clean prompts, answers and read position."""
    info = describe(model)
    task = None
    if isinstance(tokens, TaskProbe):
        task = tokens
        if answers is not None or wrongs is not None or positions is not None:
            raise UsageError("a task brings its own answers, wrong answers and positions: give the task alone")
        tokens, answers, wrongs = task.clean.cpu(), task.answer.cpu(), task.wrong.cpu()
        positions = [task.read_position] * task.n_pairs
    elif answers is None:
        raise UsageError("give the answer token of each prompt (answers=), or a TaskProbe")
    rows = _rows(tokens, info.d_vocab)
    B = len(rows)
    answers = _ids(answers, B, info.d_vocab, "answers")
    wrongs = None if wrongs is None else _ids(wrongs, B, info.d_vocab, "wrongs")
    lengths = torch.tensor([len(r) for r in rows])
    at = lengths - 1 if positions is None else torch.as_tensor(positions).long().flatten()
    if len(at) != B or bool(((at < 0) | (at >= lengths)).any()):
        raise UsageError(
            f"positions must hold one position per prompt ({B}), each inside its prompt "
            f"(lengths {lengths.tolist()}), got {at.tolist()}"
        )
    if int(lengths.max()) > info.n_ctx:
        raise UsageError(f"a prompt of {int(lengths.max())} tokens is longer than the model's context of {info.n_ctx}")
    w = _weights(model, info)
    T = int(lengths.max())
    per_pos = torch.full((B, info.n_layers, info.n_heads, T), float("nan"), dtype=torch.float64)
    columns: dict[str, Tensor] = {}
    for n in sorted(set(lengths.tolist())):
        idx = torch.nonzero(lengths == n).flatten()
        group = torch.tensor([rows[i] for i in idx.tolist()], dtype=torch.long)
        got = _attribute(model, info, w, group, answers[idx], None if wrongs is None else wrongs[idx], at[idx])
        per_pos[idx, :, :, :n] = got.pop("per_position")
        for name, values in got.items():
            columns.setdefault(name, torch.full((B,), float("nan"), dtype=torch.float64))[idx] = values
    head_terms = per_pos.nansum(-1)
    head_terms[:, list(info.absent_layers)] = float("nan")
    frame = pd.DataFrame({k: v.numpy() for k, v in columns.items()})
    frame.insert(0, "prompt", np.arange(B))
    softcap = final_softcap(model)
    cfg = RunConfig.of(config)
    n_boot, level, seed = cfg.n_boot, cfg.level, cfg.seed
    point, lo, hi = bootstrap_mean(head_terms, n_boot=n_boot, level=level, seed=seed)
    final = final_norm_site(model)
    meta = run_header(info, kind="logit_attribution", n_boot=n_boot, ci_level=level, seed=seed)
    meta.update(
        n_prompts=B,
        direction=_direction(answers, wrongs, task),
        softcap=(
            f"the final logits are capped, {softcap} * tanh(logit / {softcap}); the attribution is of the "
            "pre-cap logit difference (column 'model'; the capped one is 'model_capped')"
            if softcap
            else None
        ),
        max_error=float((columns["total"] - columns["model"]).abs().max()),
        notes=[f"final norm: {_norm_name(final)}, its scale frozen at the clean run"],
    )
    if task is not None:
        meta["task"] = {"name": task.name, "metric": task.metric, "read_position": task.read_position, **task.meta}
    heads = HeadScores.from_grids({"dla": point, "dla_lo": lo, "dla_hi": hi}, {**meta, "ci_sequences": {"dla": B}})
    return LogitAttribution(heads, per_pos.numpy(), frame, meta)


def _attribute(
    model: HookedModel,
    info: Any,
    w: Any,
    tokens: Int[Tensor, "batch pos"],
    answers: Int[Tensor, "batch k"],
    wrongs: Int[Tensor, "batch k"] | None,
    at: Int[Tensor, " batch"],
) -> dict[str, Tensor]:
    """One batch of prompts of one length: every part's term per prompt, the heads' terms per
    source position (``per_position``), the total and the model's own difference."""
    B, T = tokens.shape
    final = final_norm_site(model)
    posts = {l: post_attention_norm_site(model, l) for l in info.attention_layers}
    L, H = info.n_layers, info.n_heads
    batch = torch.arange(B)
    parallel = not has_hook(model, resid_mid_hook(0))  # attention and MLP read the same input
    logits, grabbed = _capture(model, info, tokens, posts, final, parallel)

    # the direction on the final residual, pulled back through the frozen final norm
    mix = _mean_weights(answers, info.d_vocab)  # [batch, vocab]: the mean over each prompt's answers
    if wrongs is not None:
        mix = mix - _mean_weights(wrongs, info.d_vocab)
    d = mix @ w.W_U.cpu().T.double()  # [batch, d_model]
    const = mix @ w.b_U.cpu().double()
    if final is not None:
        norm = _frozen(final, grabbed, at)
        const = const + d @ norm.b
        u = norm.pullback(d)
    else:
        u = d
    resid = lambda name: grabbed[name][batch, at]  # noqa: E731  [batch, d_model] at the answer position
    dot = lambda x: (x * u).sum(-1)  # noqa: E731

    parts: dict[str, Tensor] = {"embed": dot(resid(resid_pre_hook(0)))}
    per_pos = torch.full((B, L, H, T), float("nan"), dtype=torch.float64)
    for l in range(L):
        before = resid(resid_pre_hook(0)) if l == 0 else resid(resid_post_hook(l - 1))
        mid = before + resid(attn_out_hook(l)) if parallel else resid(resid_mid_hook(l))
        write = mid - before
        if l not in posts:  # a layer without softmax attention (linear attention): its whole write
            parts[f"attn_other.{l}"] = dot(write)
        else:
            head_u = u if posts[l] is None else _frozen(posts[l], grabbed, at).pullback(u)
            A = grabbed[pattern_hook(l)][batch, :, at]  # [batch, head, key]
            v = grabbed[v_hook(l)]
            v = v.repeat_interleave(H // v.shape[2], dim=2) if v.shape[2] != H else v  # [batch, key, head, d]
            ov = torch.einsum("bkhd,hde,be->bhk", v, w.W_O[l].cpu(), head_u)  # each key's value, projected
            per_pos[:, l] = A * ov
            parts[f"attn_other.{l}"] = dot(write) - per_pos[:, l].sum((-1, -2))
        parts[f"mlp.{l}"] = dot(resid(resid_post_hook(l)) - mid)
    final_resid = resid(final.input) if final is not None else resid(resid_post_hook(L - 1))
    parts["rest"] = dot(final_resid - resid(resid_post_hook(L - 1)))
    parts["bias"] = const
    parts["heads"] = torch.nan_to_num(per_pos).sum((1, 2, 3))
    parts["total"] = sum(parts.values())

    softcap = final_softcap(model)
    own = logits[batch, at]  # [batch, vocab]
    raw = softcap * torch.atanh(own / softcap) if softcap else own
    parts["model"] = (raw * mix).sum(-1)
    if softcap:
        parts["model_capped"] = (own * mix).sum(-1)
    parts["per_position"] = per_pos
    return parts


def _weights(model: HookedModel, info: Any) -> Any:
    """The head weights the attribution reads, or a refusal of a model whose heads' writes are not
    terms of the logits (an encoder) or that it cannot read (gated attention)."""
    if info.is_encoder:
        raise UsageError(
            f"direct logit attribution splits a decoder's residual stream into terms of the logits, and {info.name} "
            "is an encoder: its blocks normalise after adding (post-LayerNorm) and its masked-LM head has a dense "
            "layer and an activation before the unembedding, so a head's write is not a term of the logits: refused"
        )
    w = read_head_weights(model, info, "direct logit attribution")
    gated = sorted(gated_attention_modules(model))
    if gated:
        raise UsageError(
            f"direct logit attribution reads each head's output as its pattern times its values through W_O, and "
            f"{info.name}'s attention in layers {gated} multiplies each head's output by a sigmoid gate first, "
            "which it does not read: refused"
        )
    return w


def _capture(
    model: HookedModel, info: Any, tokens: Tensor, posts: dict, final: Any, parallel: bool
) -> tuple[Tensor, dict[str, Tensor]]:
    """One forward of ``tokens``: its logits, and the residual stream, patterns, values and norm
    sites the attribution reads (float64, on the CPU), by hook name."""
    grabbed: dict[str, Tensor] = {}

    def grab(name: str) -> Any:  # keyed by the name asked for: a bridge's hook may carry its alias's
        def keep(t: Tensor, hook: Any) -> None:
            grabbed[name] = t.detach().double().cpu()

        return keep

    names = [resid_pre_hook(0)]
    for l in range(info.n_layers):
        names += [
            attn_out_hook(l) if parallel else resid_mid_hook(l),
            resid_post_hook(l),
        ]
    for l in info.attention_layers:
        names += [pattern_hook(l), v_hook(l)]
        if posts[l] is not None:
            names += [posts[l].input, posts[l].scale, posts[l].output]
    if final is not None:
        names += [final.input, final.scale, final.output]
    logits = run_with_reducers(model, tokens.to(info.device), [(n, grab(n)) for n in dict.fromkeys(names)])
    return logits.detach().double().cpu(), grabbed


def _rows(tokens: Any, vocab: int) -> list[list[int]]:
    """The prompts as lists of ids: a ``[batch, pos]`` (or ``[pos]``) tensor or a list of sequences."""
    if isinstance(tokens, Tensor):
        t = tokens.long().cpu()
        rows = (t[None] if t.ndim == 1 else t).tolist()
    else:
        rows = [list(map(int, r)) for r in tokens]
    if not rows or any(len(r) == 0 for r in rows):
        raise UsageError("tokens must hold at least one non-empty prompt")
    bad = [t for r in rows for t in r if not 0 <= t < vocab]
    if bad:
        raise UsageError(f"token id {bad[0]} is outside the model's vocabulary of {vocab}")
    return rows


def _norm_name(site: NormSite | None) -> str:
    return "none" if site is None else "LayerNorm" if site.centered else "RMSNorm"


def _ids(ids: Any, n: int, vocab: int, what: str) -> Int[Tensor, "batch k"]:
    """One id per prompt, or ``[batch, k]`` ids (``-1`` pads), as ``[batch, k]``."""
    t = torch.as_tensor(ids).long()
    t = t[:, None] if t.ndim <= 1 else t
    if t.ndim != 2 or len(t) != n:
        raise UsageError(
            f"{what} must hold one token id per prompt ({n}), got {len(t)} (several per prompt: [prompts, k] ids, -1 pads)"
        )
    bad = t[(t < -1) | (t >= vocab)]
    if len(bad):
        raise UsageError(f"{what}: token id {int(bad[0])} is outside the model's vocabulary of {vocab}")
    empty = torch.nonzero(~(t >= 0).any(-1)).flatten()
    if len(empty):
        raise UsageError(f"{what}: prompt {int(empty[0])} has no token id (only -1 pads)")
    return t


def _mean_weights(ids: Int[Tensor, "batch k"], vocab: int) -> Float[Tensor, "batch vocab"]:
    """Per prompt, weight ``1/k`` on each of its ``k`` real ids (``-1`` pads carry none)."""
    real = (ids >= 0).double()
    out = torch.zeros(ids.shape[0], vocab, dtype=torch.float64)
    return out.scatter_add_(1, ids.clamp_min(0), real / real.sum(-1, keepdim=True))


def _direction(answers: Tensor, wrongs: Tensor | None, task: TaskProbe | None) -> str:
    """What is attributed, in words."""
    several = answers.shape[1] > 1 or (wrongs is not None and wrongs.shape[1] > 1)
    text = (
        ("mean answer logit - mean wrong logit" if several else "answer - wrong")
        if wrongs is not None
        else ("mean answer logit" if several else "answer")
    )
    if task is not None and task.metric == "prob-diff":
        text += (
            f" (the {task.name} task's own metric, the answers' probability minus the wrong answers', is a "
            "difference of softmax sums that does not split into terms: its logit counterpart is attributed)"
        )
    return text


__all__ = ["STEM", "LogitAttribution", "logit_attribution"]
