"""The tidy tables of a sink report, built from the pass's statistics."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.adapters import HookedModel
from interp.models import ModelInfo, describe
from interp.probes import TokenProbe, ordinary_vocab
from interp.scores import HeadScores, bootstrap_ratio, interval_notes
from interp.sinks.stats import SinkStatistics, queries_per_key_rows, scored_queries, uniform_mass, uniform_mass_rows
from interp.texts import shown_text


def first_label(info: ModelInfo, probe: TokenProbe) -> str:
    if probe.body_start == 0:
        return "first token"
    return "BOS" if info.is_causal else "[CLS]"


def sep_position(info: ModelInfo, probe: TokenProbe) -> int | None:
    """The encoder's trailing ``[SEP]`` position, when the probe is framed with one."""
    if info.is_causal or info.sep_token_id is None or probe.body_end >= probe.seq_len:
        return None
    if probe.padded:  # each row's [SEP] sits elsewhere: its token's role says it (see _role)
        return None
    return probe.body_end


def head_table(
    stats: SinkStatistics,
    alpha: Tensor,
    sep: int | None,
    eligible: Tensor,
    probe: TokenProbe,
    causal: bool,
    n_boot: int,
    level: float,
    seed: int,
) -> HeadScores:
    T = probe.seq_len
    num = stats.received[..., 0]
    n_first = queries_per_key_rows(probe)[:, 0]  # each text's queries on its first token
    den = n_first[:, None, None].expand_as(num).clone()
    ci = bootstrap_ratio(num, den, n_boot=n_boot, level=level, seed=seed)
    point, lo, hi = ci
    unit = "text" if probe.meta.get("kind") == "texts" else "sequence"
    meta: dict = {"ci_sequences": {"first_mass": ci.units}}
    if notes := interval_notes("first_mass", ci, unit=unit):
        meta["notes"] = notes
    if eligible.ndim == 2:  # padded: a position counts where any text has it eligible
        eligible = eligible.any(0)
    grids: dict[str, Tensor] = {"first_mass": point, "first_mass_lo": lo, "first_mass_hi": hi}
    if sep is not None:
        grids["sep_mass"] = alpha[..., sep]
    other = alpha.clone()
    other[..., 0] = -1.0
    other[..., ~eligible] = -1.0
    other = other.nan_to_num(-1.0)
    if other.shape[-1] > 1:
        grids["top_other_mass"], grids["top_other_pos"] = other.max(-1)
        grids["top_other_mass"] = grids["top_other_mass"].clamp_min(0)
    vn = stats.value_norm  # [B, L, T, H]
    vn_first = vn[:, :, 0].mean(0)  # [L, H]
    if probe.padded:  # each text's own scored queries and body (the statistics are aligned)
        lengths = probe.lengths().cpu().float()
        n_scored = (lengths - 1 if causal else lengths).clamp_min(1)[:, None, None]
        grids["confidence"] = (stats.confidence / n_scored).mean(0)
        grids["confidence_no_first"] = (stats.confidence_no_first / n_scored).mean(0)
        rows = probe.body_mask().cpu() & (torch.arange(T)[None] >= 1)  # [B, T]
        w = rows[:, None, :, None].float()
        vn_other = (vn.nan_to_num(0.0) * w).sum((0, 2)) / w.sum((0, 2)).clamp_min(1)
        if not bool(rows.any()):
            vn_other = torch.full_like(vn_first, float("nan"))
    else:
        n_scored = len(range(T)[scored_queries(T, causal)])
        grids["confidence"] = stats.confidence.mean(0) / max(n_scored, 1)
        grids["confidence_no_first"] = stats.confidence_no_first.mean(0) / max(n_scored, 1)
        body = torch.zeros(T, dtype=torch.bool)
        body[max(probe.body_start, 1) : probe.body_end] = True
        if sep is not None:
            body[sep] = False
        vn_other = vn[:, :, body].mean((0, 2)) if body.any() else torch.full_like(vn_first, float("nan"))
    grids["value_norm_first"] = vn_first
    grids["value_norm_other"] = vn_other
    grids["value_norm_ratio"] = vn_first / vn_other.clamp_min(1e-30)
    if sep is not None:
        grids["sep_value_norm_ratio"] = vn[:, :, sep].mean(0) / vn_other.clamp_min(1e-30)
    grids["first_mass_by_norm"] = point * grids["value_norm_ratio"]
    if stats.learned_sink is not None:  # mean over queries of the share a learned sink logit absorbs
        grids["learned_sink_mass"] = stats.learned_sink.mean(0) / T
    if stats.gate is not None and bool(torch.isfinite(stats.gate).any()):  # gated attention (Qwen3-Next)
        grids["output_gate"] = stats.gate.nanmean(0)  # mean sigmoid gate on each head's output
    return HeadScores.from_grids(grids, meta)


LEARNED_SINK = "<learned sink>"


def learned_sink_row(stats: SinkStatistics, T: int, causal: bool, epsilon: float, sink_ratio: float) -> pd.DataFrame:
    """The token table's row for a learned sink logit (GPT-OSS): a "token" every query row attends
    to without it being a key. ``mass`` is the mean share it absorbs over heads and queries,
    ``attention_ratio`` that over the mean mass a key position draws from a uniform head,
    ``sink_head_share`` the share of heads where it absorbs more than ``epsilon``."""
    share = stats.learned_sink.mean(0) / T  # [L, H]
    uniform = float(uniform_mass(T, causal).mean())
    row = {
        "token": LEARNED_SINK,
        "token_id": -1,
        "role": "learned sink",
        "occurrences": int(stats.learned_sink.shape[0]),
        "mean_position": float("nan"),
        "attention_ratio": float(share.mean()) / uniform,
        "mass": float(share.mean()),
        "sink_head_share": float((share > epsilon).float().mean()),
    }
    row["is_sink"] = row["attention_ratio"] >= sink_ratio or row["sink_head_share"] > 0
    return pd.DataFrame([row])


_PUNCT = lambda s: bool(s) and all(unicodedata.category(c).startswith(("P", "S")) for c in s)  # noqa: E731


def token_texts(model: HookedModel, probe: TokenProbe, ids: Sequence[int]) -> dict[int, str]:
    """A readable string per token id: the tokenizer's, or the byte a byte-mapped text probe used."""
    tok = getattr(model, "tokenizer", None)
    if tok is not None:
        return {i: tok.decode([i]) for i in ids}
    info = describe(model)
    names = {info.bos_token_id: "<bos>"} if info.bos_token_id is not None else {}
    if str(probe.meta.get("tokenization", "")).startswith("utf-8 bytes"):
        index = {int(t): j for j, t in enumerate(ordinary_vocab(info).tolist())}
        for i in ids:
            j = index.get(i)
            if i not in names and j is not None and j < 256:
                names[i] = chr(j) if j < 128 else f"\\x{j:02x}"
    return {i: names.get(i, f"<{i}>") for i in ids}


def _role(token: int, text: str, position: int, info: ModelInfo) -> str:
    if position == 0:
        return "first"
    if token == info.sep_token_id:
        return "[SEP]"
    if token == info.cls_token_id:
        return "[CLS]"
    if token == info.bos_token_id:
        return "BOS"
    if token in info.special_token_ids:
        return "special"
    if "\n" in text:
        return "newline"
    if not text.strip():
        return "space"
    return "punctuation" if _PUNCT(text.strip()) else "word"


def occurrences(
    alpha_seq: Tensor,
    probe: TokenProbe,
    info: ModelInfo,
    model: HookedModel,
    eligible: Tensor,
    epsilon: float,
    sink_ratio: float,
) -> pd.DataFrame:
    """A row per eligible (sequence, position): its token, role and the attention it draws."""
    uniform = uniform_mass_rows(probe)  # [B, T]: each text's own
    ratio = alpha_seq.mean((1, 2)) / uniform  # [B, T]
    share = ((alpha_seq > epsilon) & (alpha_seq >= sink_ratio * uniform[:, None, None, :])).float().mean((1, 2))
    mass = alpha_seq.mean((1, 2))
    tokens = probe.tokens.cpu()
    b, k = torch.meshgrid(torch.arange(probe.batch), torch.arange(probe.seq_len), indexing="ij")
    keep = eligible.expand(probe.batch, -1)
    ids = tokens[keep].tolist()
    texts = token_texts(model, probe, sorted(set(ids)))
    pos = k[keep].tolist()
    return pd.DataFrame(
        {
            "sequence": b[keep].numpy(),
            "position": pos,
            "token_id": ids,
            "token": [shown_text(texts[i]) for i in ids],
            "role": [_role(i, texts[i], p, info) for i, p in zip(ids, pos)],
            "attention_ratio": ratio[keep].numpy(),
            "mass": mass[keep].numpy(),
            "sink_head_share": share[keep].numpy(),
        }
    )


def sink_positions(hit: pd.DataFrame, probe: TokenProbe, sep: int | None) -> Tensor:
    """``[batch, pos]``: the first position, an encoder's [SEP], and the sink occurrences ``hit``."""
    mask = torch.zeros(probe.batch, probe.seq_len, dtype=torch.bool)
    mask[:, 0] = True
    if sep is not None:
        mask[:, sep] = True
    mask[
        torch.tensor(hit["sequence"].tolist(), dtype=torch.long),
        torch.tensor(hit["position"].tolist(), dtype=torch.long),
    ] = True
    return mask


MIN_OCCURRENCES = 3  # a token seen fewer times is never called a sink: one draw of a rare token is noise
FIRST_ROLES = ("first", "BOS", "[CLS]")


def token_table(
    occ: pd.DataFrame, is_sink: Callable[[pd.DataFrame], pd.Series], min_occurrences: int = MIN_OCCURRENCES
) -> pd.DataFrame:
    """A row per (token, role): how often it occurs and the attention it draws (x uniform).

    A token seen fewer than ``min_occurrences`` times is never a sink and is ranked after every token
    seen often enough; the first token (BOS, [CLS]) comes first when it is a sink."""
    cols = [
        "token",
        "token_id",
        "role",
        "occurrences",
        "mean_position",
        "attention_ratio",
        "mass",
        "sink_head_share",
        "is_sink",
    ]
    if occ.empty:
        return pd.DataFrame(columns=cols)
    g = (
        occ.groupby(["token_id", "role"], sort=False)
        .agg(
            token=("token", "first"),
            occurrences=("position", "size"),
            mean_position=("position", "mean"),
            attention_ratio=("attention_ratio", "mean"),
            mass=("mass", "mean"),
            sink_head_share=("sink_head_share", "mean"),
        )
        .reset_index()
    )
    enough = g["occurrences"] >= min_occurrences
    g["is_sink"] = is_sink(g) & enough
    g["_rank"] = np.where(g["is_sink"] & g["role"].isin(FIRST_ROLES), 0, np.where(enough, 1, 2))
    g = g.sort_values(["_rank", "attention_ratio", "occurrences"], ascending=[True, False, False], kind="mergesort")
    return g[cols].reset_index(drop=True)


def massive_table(
    stats: SinkStatistics, probe: TokenProbe, model: HookedModel, info: ModelInfo, sink_pos: Tensor
) -> pd.DataFrame:
    cols = ["layer", "sequence", "position", "token", "role", "dim", "value", "magnitude_ratio", "on_sink"]
    if not stats.massive:
        return pd.DataFrame(columns=cols)
    frame = pd.DataFrame(stats.massive, columns=["layer", "sequence", "position", "dim", "value", "magnitude_ratio"])
    seq, pos = frame["sequence"].tolist(), frame["position"].tolist()
    ids = probe.tokens.cpu()[seq, pos].tolist()
    texts = token_texts(model, probe, sorted(set(ids)))
    frame["token"] = [shown_text(texts[i]) for i in ids]
    frame["role"] = [_role(i, texts[i], p, info) for i, p in zip(ids, pos)]
    frame["on_sink"] = sink_pos[seq, pos].numpy()
    return frame[cols]


def layer_table(
    alpha: Tensor,
    stats: SinkStatistics,
    sep: int | None,
    sink_pos: Tensor,
    massive: pd.DataFrame,
    epsilon: float,
    info: ModelInfo,
) -> pd.DataFrame:
    L, H = alpha.shape[:2]
    first = (alpha[:, :, 0] > epsilon).sum(1)
    data: dict[str, Any] = {
        "layer": np.arange(L),
        "n_heads": H,
        "sink_heads": first.numpy(),
        "sink_share": first.numpy() / H,
    }
    if sep is not None:
        s = (alpha[:, :, sep] > epsilon).sum(1)
        data.update(sep_sink_heads=s.numpy(), sep_sink_share=s.numpy() / H)
    top = stats.resid_top.mean(0)  # [L, 3]
    for j in range(3):
        data[f"resid_top{j + 1}"] = top[:, j].numpy()
    data["resid_median"] = stats.resid_seq_median.mean(0).numpy()
    # each position's largest |x| over the layer output's median |x| (the scale massive activations use)
    ratio = stats.resid_max / stats.resid_seq_median[..., None].clamp_min(1e-30)  # [B, L, T]
    sink = sink_pos[:, None, :].expand_as(ratio)
    data["outlier_ratio_sink"] = _masked_mean(ratio, sink).numpy()
    data["outlier_ratio_other"] = _masked_mean(ratio, ~sink).numpy()
    counts = massive.groupby("layer").size() if len(massive) else pd.Series(dtype=int)
    data["n_massive"] = [int(counts.get(layer, 0)) for layer in range(L)]
    return pd.DataFrame(data)


def _masked_mean(x: Float[Tensor, "batch layer pos"], mask: Tensor) -> Float[Tensor, " layer"]:
    mask = mask & ~x.isnan()  # padded slots (NaN) are left out
    m = mask.float()
    total = m.sum((0, 2))
    return torch.where(total > 0, (x.nan_to_num(0.0) * m).sum((0, 2)) / total.clamp_min(1), torch.tensor(float("nan")))


def position_table(alpha: Tensor, epsilon: float, sep: int | None, n_k: Tensor, first: str) -> pd.DataFrame:
    L, H, T = alpha.shape
    layer, pos = np.meshgrid(np.arange(L), np.arange(T), indexing="ij")
    best, best_head = alpha.max(1)  # [L, T]
    role = np.array(["body"] * T, dtype=object)
    role[0] = first
    if sep is not None:
        role[sep] = "[SEP]"
    return pd.DataFrame(
        {
            "layer": layer.ravel(),
            "position": pos.ravel(),
            "role": np.tile(role, L),
            "n_queries": np.tile(n_k.numpy().astype(int), L),
            "mean_mass": alpha.mean(1).numpy().ravel(),
            "max_mass": best.numpy().ravel(),
            "max_head": best_head.numpy().ravel(),
            "sink_share": (alpha > epsilon).float().mean(1).numpy().ravel(),
        }
    )
