"""The parts of what heads write and read (:mod:`interp.roles`): composition between heads, the OV
roles, the encoder-head scores, a card per head, and the map of heads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from interp.adapters import HookedModel, ModelInfo
from interp.config import RunConfig
from interp.errors import UsageError
from interp.parts.base import Given, NotApplicable, PartResult, part
from interp.parts.shape import body_room, frame, info_of, n_heads
from interp.parts.table import ROLES
from interp.progress import forward_work
from interp.roles.composition import N_RANDOM, composition_work
from interp.roles.encoder import encoder_work, head_map_work
from interp.roles.ov import K_LOWEST, MAX_TOKENS, ov_work

# of the encoder part's scores, previous and own token are left to the head scores (the repeated
# probe's prev_token and current), and a column no head of the model can have (no [CLS], [SEP] or
# punctuation token; next token on a causal model) is left out with its reason
ENCODER_DROP = ("prev", "own")
CARD_TOP = 8  # tokens written / suppressed and compositions in / out on each head card


def _reason(e: UsageError) -> NotApplicable:
    """An analysis's refusal of this model, as the part's reason."""
    return NotApplicable(str(e), params=e.params)


# ---- composition ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompositionSizes:
    """``n_random`` random heads of the same shapes per baseline."""

    n_random: int = N_RANDOM


@part(
    "composition",
    "each head's strongest Q/K/V composition in and out (weights; z against random heads)",
    CompositionSizes,
    work=lambda info, sizes: composition_work(info),
    order=8,
    place=3,
    atlas="compositions",
)
def _composition(model: HookedModel, sizes: CompositionSizes, cfg: RunConfig, given: Given) -> Any:
    """Each head's strongest composition into it (``comp_in``: source and kind, ``comp_in_z``) and out
    of it (``comp_out``, ``comp_out_z``), by z against random heads; the scores stay for the cards."""
    from interp.roles import composition_scores

    try:
        comp = composition_scores(model, n_random=sizes.n_random, config=cfg)
    except UsageError as e:
        return _reason(e)
    info = info_of(model)
    t = comp.table.dropna(subset=["z"]) if len(comp.table) else comp.table  # a zero head scores NaN
    heads = [(layer, head) for layer in range(info.n_layers) for head in range(info.n_heads)]
    frame_ = pd.DataFrame(heads, columns=["layer", "head"])
    for side, own, other in (("in", "dst", "src"), ("out", "src", "dst")):
        best = t.loc[t.groupby([f"{own}_layer", f"{own}_head"])["z"].idxmax()] if len(t) else t
        best = pd.DataFrame(
            {
                "layer": best[f"{own}_layer"],
                "head": best[f"{own}_head"],
                f"comp_{side}": [f"{h} ({k})" for h, k in zip(best[other], best["kind"])],
                f"comp_{side}_z": best["z"],
            }
        )
        frame_ = frame_.merge(best, on=["layer", "head"], how="left")
    meta = {"composition": {"n_random": comp.meta["n_random"], "notes": comp.meta["notes"]}}
    return PartResult(frame_, meta=meta, result=comp)


# ---- the OV roles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class OVSizes:
    """Copy suppression's ``k`` lowest logits over ``max_tokens`` sampled tokens; ``sequences``
    (``{name: [token ids in order]}``) for the successor score instead of the tokenizer's ordinals."""

    k: int = K_LOWEST
    max_tokens: int = MAX_TOKENS
    sequences: Mapping[str, Sequence[int]] | None = None


def _validate_ov(sizes: OVSizes) -> None:
    if sizes.k < 1:
        raise UsageError(f"k must be at least 1, got {sizes.k}", params="k")


@part(
    "ov",
    "OV roles from weights: copy suppression (McDougall et al.) and successor heads (Gould et al.)",
    OVSizes,
    work=lambda info, sizes: ov_work(info, sizes.max_tokens),
    validate=_validate_ov,
    order=6,
    place=1,
)
def _ov(model: HookedModel, sizes: OVSizes, cfg: RunConfig, given: Given) -> Any:
    """Copy suppression and successor scores, each left out (in ``left_out``, with its reason) where
    the model cannot have it: the successor score where its ordinal sequences cannot be had."""
    from interp.roles.ov import OV_SCORES, ov_scores, successor_refusal
    from interp.scores import join_scores

    done, left_out, meta, baselines = [], {}, {}, {}
    for name in OV_SCORES:
        refused = None
        if name == "successor":
            refused = successor_refusal(info_of(model), getattr(model, "tokenizer", None), sizes.sequences)
        if refused is not None:
            left_out[name] = NotApplicable(refused[0], refused[1], params=("sequences",))
            continue
        try:
            got = ov_scores(
                model, [name], k=sizes.k, max_tokens=sizes.max_tokens, sequences=sizes.sequences, config=cfg
            )
        except UsageError as e:
            left_out[name] = _reason(e)
            continue
        baselines.update(got.meta["baselines"])
        meta.setdefault("ov", {})[name] = {"notes": got.meta["notes"], "units": got.meta["ci_units"][name]}
        done.append(got)
    if not done:
        return PartResult(left_out=left_out)
    joined = join_scores(done)
    return PartResult(joined.table, baselines, meta=meta, result=joined, left_out=left_out)


# ---- the encoder heads ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TextSizes:
    """The text probe: ``batch`` windows of ``seq_len`` body tokens of the bundled text (at most
    what the context holds)."""

    batch: int = 8
    seq_len: int = 32

    def length(self, info: ModelInfo) -> int:
        return min(self.seq_len, body_room(info))

    def probe(self, model: HookedModel, seed: int) -> Any:
        from interp.probes import text_probe

        return text_probe(model, batch=self.batch, seq_len=self.length(info_of(model)), seed=seed)


@dataclass(frozen=True)
class EncoderSizes(TextSizes):
    """The text probe, and ``frequencies`` (``{token id: count}``) for the rare-word score (None: the
    bundled text's counts)."""

    frequencies: Mapping[int, float] | None = None


@part(
    "encoder",
    f"encoder-head scores and entropy on {TextSizes.batch} x {TextSizes.seq_len} tokens of text (Clark et al.; "
    "Voita et al.'s positional and rare-word heads)",
    EncoderSizes,
    work=lambda info, sizes: encoder_work(info, sizes.batch, sizes.length(info) + frame(info)),
    order=7,
    place=1,
)
def _encoder(model: HookedModel, sizes: EncoderSizes, cfg: RunConfig, given: Given) -> Any:
    """Clark et al.'s encoder-head scores, entropy, positional and rare-word heads on a text probe.
    Its role-table columns leave out previous and own token (the head scores have them) and a
    column no head can have here, its reason noted; ``result`` keeps every column."""
    from interp.roles.encoder import encoder_scores

    try:
        probe = sizes.probe(model, cfg.seed)
        got = encoder_scores(model, probe, frequencies=sizes.frequencies, config=cfg)
    except UsageError as e:
        return _reason(e)
    t = got.table
    empty = [c for c in got.score_names if not c.endswith(("_lo", "_hi")) and t[c].isna().all()]
    drop = [f"{c}{end}" for c in (*ENCODER_DROP, *empty) for end in ("", "_lo", "_hi") if f"{c}{end}" in t]
    notes = [f"encoder: {note}" for note in got.meta.get("notes", []) if note.split(":")[0] in empty]
    baselines = {k: v for k, v in got.meta["baselines"].items() if k not in ENCODER_DROP}
    return PartResult(t.drop(columns=drop), baselines, notes, {"encoder_probe": probe.meta}, result=got)


# ---- why heads attend (QK attribution) ------------------------------------------------------------

QK_COLUMNS = ("head", "role", "at", "rank", "query", "key", "contrast", "contrast_lo", "contrast_hi", "total")


@dataclass(frozen=True)
class QKSizes:
    """The repeated probe the pairs are read on (``batch`` sequences of a ``block_len``-token block,
    repeated twice: shorter where the context holds less), the ``top`` pairs kept per head, and
    the ``heads`` of each role decomposed: its strongest by the role's own score (None: every head
    of the role; each layer a head is in costs a replay of its upstream parts, and on a trained model
    most heads are sinks)."""

    batch: int = 8
    block_len: int = 20
    top: int = 3
    heads: int | None = 12

    def block(self, info: ModelInfo) -> int:
        return min(self.block_len, body_room(info) // 2)


def _validate_qk(sizes: QKSizes) -> None:
    for name in ("batch", "block_len", "top", "heads"):
        if getattr(sizes, name) is not None and getattr(sizes, name) < 1:
            raise UsageError(f"{name} must be at least 1, got {getattr(sizes, name)}", params=name)


def _qk_work(info: ModelInfo, sizes: QKSizes) -> tuple[str, float]:
    n = sizes.batch * (2 * sizes.block(info) + frame(info))
    replays = info.n_layers * (info.n_heads + 3)  # each earlier component through the layer's attention, per layer
    what = f"why heads attend (QK attribution, {sizes.batch} x {2 * sizes.block(info) + frame(info)} tokens per role)"
    return what, 3 * forward_work(n, info.n_layers + replays / 4, info.d_model)


@part(
    "qk",
    "why each induction, previous-token and sink head attends where it does: its top (query component, key "
    "component) pairs at its role's targets (exact QK attribution, on the card)",
    QKSizes,
    work=_qk_work,
    validate=_validate_qk,
    order=12,
    reads_roles=True,
)
def _qk(model: HookedModel, sizes: QKSizes, cfg: RunConfig, given: Given) -> Any:
    """Each head named for a role a QK target reads (:data:`interp.roles.qk.TARGETS`: induction,
    previous-token, sink) gets its ``top`` pairs of the contrast at that role's targets, with CIs
    over sequences, on one repeated probe: a tidy table (:data:`QK_COLUMNS`, ``total`` the head's
    own mean contrast) for the head cards."""
    from interp.probes import repeated_tokens
    from interp.roles.qk import TARGETS, qk_attribution

    roles, rows = given.roles(), []
    named = {TARGETS.info(t, "role"): t for t in TARGETS if TARGETS.info(t, "role") is not None}
    probe = repeated_tokens(model, batch=sizes.batch, block_len=sizes.block(info_of(model)), n_repeats=2, seed=cfg.seed)
    for role, at in named.items():
        heads = _strongest(roles, role, sizes.heads)
        if not heads:
            continue
        try:
            got = qk_attribution(model, probe, heads=",".join(heads), at=at, top=sizes.top, config=cfg)
        except UsageError as e:
            return _reason(e)
        for head, top in got.top(sizes.top).groupby("head", sort=False):
            total = got.meta["totals"][head]["contrast"]
            for rank, r in enumerate(top.to_dict("records"), 1):
                rows.append(
                    {**{c: r[c] for c in QK_COLUMNS if c in r}, "role": role, "at": at, "rank": rank, "total": total}
                )
    notes = [] if rows else [f"qk: no head is named {', '.join(named)}: no pair to show"]
    for role in named:
        n = sum(role in r.split(", ") for r in roles["role"])
        if sizes.heads is not None and n > sizes.heads:
            notes.append(
                f"qk: the {sizes.heads} strongest of the {n} {role} heads (by {ROLES.info(role, 'column')}) are "
                "decomposed; QKSizes(heads=None) takes every one (command line: --qk-heads all)"
            )
    meta = {"qk": {"probe": probe.meta, "top": sizes.top, "heads": sizes.heads, "roles": named}}
    return PartResult(notes=notes, meta=meta, result=pd.DataFrame(rows, columns=list(QK_COLUMNS)))


def _strongest(roles: pd.DataFrame, role: str, n: int | None) -> list[str]:
    """The labels of the heads named ``role``, their strongest ``n`` by the role's score column
    (every one for None), in the table's order."""
    named = roles[[role in r.split(", ") for r in roles["role"]]]
    if n is not None and len(named) > n:
        named = named.loc[named[ROLES.info(role, "column")].sort_values(ascending=False, kind="mergesort").index[:n]]
        named = named.sort_index()
    return named["label"].tolist()


# ---- the head cards -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CardSizes:
    """``top`` tokens written and suppressed, and compositions in and out, on each card."""

    top: int = CARD_TOP


def _cards_work(info: ModelInfo, sizes: CardSizes) -> tuple[str, float]:
    work = forward_work(info.d_vocab, 1, info.d_model) + n_heads(info) * info.d_model * info.d_vocab
    return f"the head cards ({n_heads(info)} heads)", work


@part(
    "cards",
    "a card per head (click a head): scores, the tokens its OV writes and suppresses, compositions",
    CardSizes,
    work=_cards_work,
    order=13,
    atlas="cards",
    reads_roles=True,
)
def _cards(model: HookedModel, sizes: CardSizes, cfg: RunConfig, given: Given) -> PartResult:
    """A card per head (:func:`~interp.roles.card.head_card`): its role-table row, the tokens its
    mean OV write raises and lowers most (where the weights can be read), its strongest compositions
    in and out (with the composition part), why it attends (with the qk part). The page draws each
    card's pattern thumbnail from the viewer's sequence (the patterns part), which it already holds."""
    from interp.roles.card import head_card, mean_writes

    info, roles, notes = info_of(model), given.roles(), []
    writes: dict[tuple[int, int], Any] = {}
    try:
        for layer, w in mean_writes(model):
            writes.update({(layer, h): w[h] for h in range(info.n_heads)})
    except UsageError as e:
        notes.append(f"cards' OV tokens: left out: {e}")
    cards = {}
    for layer, head in zip(roles["layer"].tolist(), roles["head"].tolist()):
        write = writes.get((layer, head))
        card = head_card(
            layer,
            head,
            roles=roles,
            model=model if write is not None else None,
            compositions=given.result("composition"),
            why=given.result("qk"),
            write=write,
            top=sizes.top,
        )
        cards[card["head"]] = card
    return PartResult(notes=notes, result=cards)


# ---- the map of heads -----------------------------------------------------------------------------


@part(
    "headmap",
    "the map of heads by the Jensen-Shannon distance between their patterns (laid out in 2D; on the encoder "
    "part's text probe)",
    TextSizes,
    work=lambda info, sizes: head_map_work(info, sizes.batch, sizes.length(info) + frame(info)),
    order=11,
    atlas="head_map",
)
def _head_map(model: HookedModel, sizes: TextSizes, cfg: RunConfig, given: Given) -> Any:
    """The map of heads (:func:`~interp.roles.head_map`) on the text probe."""
    from interp.roles import head_map

    try:
        return PartResult(result=head_map(model, sizes.probe(model, cfg.seed), config=cfg))
    except UsageError as e:
        return _reason(e)


__all__ = [
    "CARD_TOP",
    "ENCODER_DROP",
    "QK_COLUMNS",
    "CardSizes",
    "CompositionSizes",
    "EncoderSizes",
    "OVSizes",
    "QKSizes",
    "TextSizes",
]
