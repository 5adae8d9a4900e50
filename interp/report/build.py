""":func:`head_atlas`: run every per-head analysis of a model and gather them into an :class:`Atlas`.

The atlas runs, on seeded probes: the head scores with their CIs on repeated random tokens
(:func:`interp.heads.head_scores`), the sink report on random tokens
(:func:`interp.sinks.sink_scores`), the exact single-head ablation sweep and Michel et al.'s
gradient importance on the in-context loss of the repeated probe, pruning curves, and every
head's attention pattern on one short repeated sequence. What heads write and read
(:mod:`interp.roles`): each head's strongest Q/K/V composition into it and out of it (weights,
z against random heads), the OV roles copy suppression and successor (weights), Clark et al.'s
encoder-head scores with entropy and Voita et al.'s positional and rare-word heads (a text probe),
a map of heads by the Jensen-Shannon distance between their patterns (:func:`interp.roles.head_map`,
on the encoder part's text probe), and a card per head (:func:`interp.roles.card.head_card`). Given
a task (``task=``: :mod:`interp.probes.task`), the task part patches every head exactly
(:func:`interp.patching.patch_heads`, denoising, the task's normalised metric) and attributes the
logit difference to each head directly (:func:`interp.roles.logit_attribution`), both on the
task's pairs. The optional parts are registered in
:data:`PARTS`; those named in ``skip`` are left out. A part a model cannot have (composition on
latent attention, successor heads without ordinal tokens) is left out with a note in
``meta["notes"]`` naming why; the rest run.

This module sits above the atlas and its page: it builds the :class:`Atlas` (data) and hands it
the page's renderer, so ``atlas.save(dir)`` writes the HTML without the atlas importing it.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pandas as pd

import interp.distributed as distributed
from interp.adapters import HookedModel
from interp.roles.composition import composition_work
from interp.roles.encoder import encoder_work, head_map_work
from interp.roles.ov import ov_work
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.heads import head_scores, uniform_baselines
from interp.models import ModelInfo, describe
from interp.probes import TokenProbe, random_tokens, repeated_tokens
from interp.probes.draw import frame_tokens
from interp.probes.needle import default_distances
from interp.probes.task import N_PAIRS
from interp.progress import Plan, announcer, forward_work, plan_note
from interp.registry import Registry
from interp.report.atlas import Atlas
from interp.report.page import render_atlas
from interp.report.patterns import attention_patterns
from interp.report.roles import THRESHOLD, role_columns, role_table
from interp.scores import HeadScores, join_scores

# the encoder part's text probe; of its scores, previous and own token are left to the head scores
# (the repeated probe's prev_token and current), and a column no head of the model can have (no
# [CLS], [SEP] or punctuation token; next token on a causal model) is left out with its reason
ENCODER_BATCH, ENCODER_LEN = 8, 32

# The parts of the atlas a run may leave out (``skip=``, ``--skip``); the head scores are always there.
PARTS: Registry[str] = Registry("atlas part")
PARTS.add("sinks", "the sink report on random tokens (first-token mass, Sink^eps per layer)")
PARTS.add("exact", "the exact single-head ablation sweep")
PARTS.add("gradient", "Michel et al.'s gradient importance")
PARTS.add("pruning", "pruning curves (gradient, exact and random orders)")
PARTS.add("patterns", "the attention-pattern viewer")
PARTS.add(
    "retrieval",
    "retrieval and streaming heads on a needle probe, and copy-distance curves (run on min(1024, the "
    "context) tokens when the context holds at least 512, or at the length asked for)",
)
PARTS.add("composition", "each head's strongest Q/K/V composition in and out (weights; z against random heads)")
PARTS.add("ov", "OV roles from weights: copy suppression (McDougall et al.) and successor heads (Gould et al.)")
PARTS.add(
    "encoder",
    f"encoder-head scores and entropy on {ENCODER_BATCH} x {ENCODER_LEN} tokens of text (Clark et al.; Voita "
    "et al.'s positional and rare-word heads)",
)
PARTS.add("cards", "a card per head (click a head): scores, the tokens its OV writes and suppresses, compositions")
PARTS.add(
    "headmap",
    "the map of heads by the Jensen-Shannon distance between their patterns (laid out in 2D; on the encoder "
    "part's text probe)",
)
PARTS.add(
    "task",
    "with a task, task= (command line: --task): each head patched exactly (denoising, the task's normalised metric) and direct "
    "logit attribution on its pairs",
)

# the needle probe the atlas runs unasked: min(RETRIEVAL_LEN, the context), and only when the context
# holds RETRIEVAL_MIN tokens (shorter probes say little about long-range copying: the streaming
# window and the copy distances scale with the probe). GPT-2 (1024 positions, one of them BOS) gets 1023.
RETRIEVAL_LEN = 1024
RETRIEVAL_MIN = 512

ABLATION_PARTS = ("exact", "gradient", "pruning")
CARD_TOP = 8  # tokens written / suppressed and compositions in / out on each head card
ENCODER_DROP = ("prev", "own")
TASK_PAIRS = N_PAIRS  # a bundled task's pairs unless task_pairs= (--task-pairs) says otherwise, as interp patch's
SKIP_HINT = "skip={parts!r} leaves {them} out (command line: --skip {flag})"  # after the note on long parts


def head_atlas(
    model: HookedModel,
    *,
    config: RunConfig | None = None,
    batch: int = 10,
    seq_len: int = 50,
    repeats: int = 2,
    sink_batch: int = 16,
    sink_seq_len: int = 64,
    ablation: str = "mean",
    threshold: float = THRESHOLD,
    view_len: int = 12,
    view_heads: list[str] | None = None,
    skip: tuple[str, ...] | list[str] = (),
    seed: int | None = None,
    progress: bool | None = None,
    journals: Any = None,
    retrieval_len: int | None = None,
    task: Any = None,
    task_pairs: int | None = None,
) -> Atlas:
    """Run every per-head analysis of ``model`` and gather them into an :class:`Atlas`.

    ``config`` (a :class:`~interp.config.RunConfig`; ``seed=`` and ``progress=`` override it) sets
    the bootstrap, seed, minibatch, progress and engine of the head scores and the sink report; the
    ablation parts take its seed and progress. ``journals`` (a :class:`~interp.journal.Journals`,
    as ``--resume`` opens them): the exact sweep and the pruning curves record their finished units
    in the journals ``atlas-exact`` and ``atlas-pruning``, and a resumed run takes them from there.

    The ``retrieval`` part (:func:`interp.retrieval.retrieval_scores` and
    :func:`~interp.retrieval.copy_distance_scores`) runs on a needle probe of ``retrieval_len`` body
    tokens when given; left at None it runs at ``min(1024, the context)`` tokens (:data:`RETRIEVAL_LEN`;
    1023 on GPT-2, whose BOS takes one of its 1024 positions) when the context holds at least
    :data:`RETRIEVAL_MIN` (512), and is otherwise left out with a note (``meta["notes"]``): on the
    bundled toy (context 256) the default atlas stays a matter of seconds.

    ``task`` (a :class:`~interp.probes.task.TaskProbe`, a bundled task's name, ``repeat``, ``ioi``,
    ``greater-than``, of ``task_pairs`` pairs seeded by the seed (default :data:`TASK_PAIRS`), or a
    JSONL/CSV task file, its first ``task_pairs`` pairs, default every pair) adds the
    task part, run first so that a task the model cannot run stops the atlas before the long parts:
    the role table gains ``patch_effect`` (exact per-head patching, denoising: the fraction of the
    clean-corrupted gap of the task's normalised metric that patching the head's clean output into
    the corrupted run restores, with a bootstrap CI over pairs) and ``dla`` (the head's direct
    logit attribution to the answer-minus-wrong logit on the clean prompts, with its CI), and
    ``meta["task"]`` says how they were read. A model direct logit attribution refuses keeps the
    patching, with a note. Without a task nothing of it runs.

    With ``progress`` on, it says up front (on stderr) which parts will clearly take much longer
    than the head scores, from their work sizes (:func:`atlas_work`), and which ``skip`` leaves them
    out; each part then says its sizes as it starts and shows its progress.
    """
    cfg = RunConfig.of(config, **{k: v for k, v in {"seed": seed, "progress": progress}.items() if v is not None})
    skip = [skip] if isinstance(skip, str) else list(skip)  # skip="exact" is one part, not five letters
    unknown = sorted(set(skip) - set(PARTS))
    if unknown:
        raise UsageError(f"cannot skip {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    if not 0 < threshold < 1:
        raise UsageError(f"the role threshold must be between 0 and 1, got {threshold}")
    info = describe(model)
    bad = [h for h in view_heads or [] if h not in set(info.head_labels())]
    if bad:
        raise UsageError(
            f"no head {', '.join(bad)} in this model: heads are LAYER.HEAD, up to {info.head_labels()[-1]}"
        )
    run_task = task is not None and "task" not in skip
    if task is not None and not run_task:
        raise UsageError("task= is read by the task part, and skip= leaves it out: drop one of them")
    if task is None and task_pairs is not None:
        raise UsageError("task_pairs= sizes the task part, which runs only with a task: give task= or drop it")
    pairs = _task(model, task, task_pairs, cfg.seed) if run_task else None  # a bad task ends the run here
    plan = atlas_work(
        model,
        task=(pairs.n_pairs, pairs.seq_len) if pairs is not None else None,
        batch=batch,
        seq_len=seq_len,
        repeats=repeats,
        sink_batch=sink_batch,
        sink_seq_len=sink_seq_len,
        retrieval_len=retrieval_len,
        view_len=view_len,
        skip=skip,
    )
    loud = cfg.progress and distributed.is_main()
    note = long_work_note(plan)
    if loud and note:
        print(note, file=sys.stderr, flush=True)
    say = announcer("atlas", plan, loud)
    say("scores")
    probe = repeated_tokens(model, batch=batch, block_len=seq_len, n_repeats=repeats, seed=cfg.seed)
    scores = head_scores(model, probe, config=cfg)
    baselines = uniform_baselines(probe)
    extra: dict[str, HeadScores] = {}
    meta = run_header(
        info,
        probe,
        ci_level=scores.meta["ci_level"],
        seed=cfg.seed,
        threshold=threshold,
        skipped=sorted(set(skip)),
    )
    atlas = Atlas(roles=pd.DataFrame(), baselines=baselines, meta=meta, render=render_atlas)
    task_columns = None
    if pairs is not None:  # first: a task the model cannot run ends the atlas before the long parts
        say("task")
        task_columns = _task_part(atlas, model, pairs, cfg, journals)
    if "sinks" not in skip:
        from interp.sinks import sink_scores

        say("sinks")
        sink_probe = random_tokens(model, batch=sink_batch, seq_len=sink_seq_len, seed=cfg.seed)
        atlas.sinks = sink_scores(model, sink_probe, config=cfg)
        extra[""] = HeadScores(
            atlas.sinks.heads.table[["layer", "head", "first_mass", "first_mass_lo", "first_mass_hi"]]
        )
        baselines["first_mass"] = float(atlas.sinks.meta["uniform_first_mass"])
        meta.update(sink_probe=sink_probe.meta, epsilon=atlas.sinks.meta["epsilon"], sink_rate=atlas.sinks.sink_rate)
    if set(ABLATION_PARTS) - set(skip):
        _ablations(atlas, model, probe, ablation, skip, cfg.seed, cfg.progress, extra, journals, say)
    written: list[HeadScores] = []
    if "ov" not in skip:
        say("ov")
        written += _ov(atlas, model, cfg)
    if "encoder" not in skip:
        say("encoder")
        written += _encoder(atlas, model, info, cfg)
    if written:  # unprefixed, beside the sink report's first_mass
        extra[""] = join_scores([*([extra[""]] if "" in extra else []), *written])
    atlas.roles = role_table(scores, baselines, threshold=threshold, extra=extra)
    if task_columns is not None:
        atlas.roles = atlas.roles.merge(task_columns, on=["layer", "head"], how="left")
    if "composition" not in skip:
        say("composition")
        _composition(atlas, model, cfg.seed, cfg.progress)
    if "retrieval" not in skip:
        say("retrieval")
        _retrieval(atlas, model, info, retrieval_len, cfg)
    if "patterns" not in skip:
        say("patterns")
        atlas.pattern = _pattern_view(model, atlas.roles, view_len, view_heads, cfg.seed, set(scores.score_names))
    if "headmap" not in skip:
        say("headmap")
        _head_map(atlas, model, info, cfg)
    if "cards" not in skip:
        say("cards")
        _cards(atlas, model, info)
    return atlas


def _task(model: HookedModel, task: Any, n_pairs: int | None, seed: int) -> Any:
    """The task's pairs: a :class:`~interp.probes.task.TaskProbe` as given, else built by name or read from a file."""
    from interp.probes.task import TaskProbe, task_probe

    if n_pairs is not None and (isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or n_pairs < 1):
        raise UsageError(f"task_pairs must be an integer >= 1, got {n_pairs!r}")
    return task if isinstance(task, TaskProbe) else task_probe(model, task, n_pairs=n_pairs, seed=seed)


def _task_part(atlas: Atlas, model: HookedModel, task: Any, cfg: RunConfig, journals: Any) -> pd.DataFrame:
    """Exact per-head patching (denoising, the task's own normalised metric) and direct logit
    attribution on the task's pairs: the columns ``patch_effect[_lo, _hi]`` and ``dla[_lo, _hi]``
    for the role table; how they were read goes to ``meta["task"]``. A model that direct logit
    attribution refuses keeps the patching, with a note."""
    from interp.roles import logit_attribution
    from interp.patching import patch_heads

    journal = journals("atlas-patch", task.clean) if journals is not None else None
    patched = patch_heads(model, task, direction="denoise", config=cfg, journal=journal)
    if patched.meta.get("partial"):  # Ctrl-C: no atlas from part of a sweep (the journal keeps it)
        raise KeyboardInterrupt
    keep = {c: c.replace("effect", "patch_effect") for c in ("effect", "effect_lo", "effect_hi")}
    columns = patched.table[["layer", "head", *keep]].rename(columns=keep)
    m = patched.meta
    atlas.meta["task"] = {
        "name": task.name,
        "n_pairs": task.n_pairs,
        "seq_len": task.seq_len,
        "read_position": task.read_position,
        "direction": m["direction"],
        "metric": m["metric"],
        "clean_metric": m["clean_metric"],
        "corrupted_metric": m["corrupted_metric"],
        "noise_floor": m["noise_floor"],
        "task_meta": m["task_meta"],
    }
    try:
        dla = logit_attribution(model, task, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
    except UsageError as e:
        _left_out(atlas, "task: direct logit attribution", str(e))
        return columns
    atlas.meta["task"].update(dla_direction=dla.meta["direction"], dla_max_error=dla.meta["max_error"])
    if dla.meta["softcap"]:
        atlas.meta["task"]["dla_softcap"] = dla.meta["softcap"]
    return columns.merge(dla.heads.table[["layer", "head", "dla", "dla_lo", "dla_hi"]], on=["layer", "head"])


def _head_map(atlas: Atlas, model: HookedModel, info: ModelInfo, cfg: RunConfig) -> None:
    """The map of heads (:func:`~interp.roles.head_map`) on the encoder part's text probe."""
    from interp.roles import head_map

    try:
        probe = _encoder_probe(model, info, cfg.seed)
        atlas.head_map = head_map(model, probe, seed=cfg.seed)
    except UsageError as e:
        _left_out(atlas, "headmap", str(e))


def _left_out(atlas: Atlas, part: str, why: str) -> None:
    atlas.meta.setdefault("notes", []).append(f"{part}: left out: {why}")


def _ov(atlas: Atlas, model: HookedModel, cfg: RunConfig) -> list[HeadScores]:
    """Copy suppression and successor scores, each left out (with a note) where the model cannot have it."""
    from interp.roles.ov import OV_SCORES, ov_scores

    done = []
    for name in OV_SCORES:
        try:
            got = ov_scores(model, [name], n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed, progress=cfg.progress)
        except UsageError as e:  # the atlas takes no sequences of its own: `interp roles --sequences` does
            why = str(e).split(": pass sequences=")[0]
            _left_out(
                atlas,
                name,
                why
                + (
                    "; ov_scores(sequences=) scores it on yours (command line: interp roles --sequences)"
                    if why != str(e)
                    else ""
                ),
            )
            continue
        atlas.baselines.update(got.meta["baselines"])
        atlas.meta.setdefault("ov", {})[name] = {"notes": got.meta["notes"], "units": got.meta["ci_units"][name]}
        done.append(got)
    return done


def _encoder(atlas: Atlas, model: HookedModel, info: ModelInfo, cfg: RunConfig) -> list[HeadScores]:
    """Clark et al.'s encoder-head scores, entropy, positional and rare-word heads on a text probe;
    a column no head can have here is dropped, its reason noted."""
    from interp.roles.encoder import encoder_scores

    try:
        probe = _encoder_probe(model, info, cfg.seed)
        got = encoder_scores(model, probe, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed)
    except UsageError as e:
        _left_out(atlas, "encoder", str(e))
        return []
    t = got.table
    empty = [c for c in got.score_names if not c.endswith(("_lo", "_hi")) and t[c].isna().all()]
    drop = [f"{c}{end}" for c in (*ENCODER_DROP, *empty) for end in ("", "_lo", "_hi") if f"{c}{end}" in t]
    for note in got.meta.get("notes", []):
        if note.split(":")[0] in empty:
            atlas.meta.setdefault("notes", []).append(f"encoder: {note}")
    atlas.baselines.update({k: v for k, v in got.meta["baselines"].items() if k not in ENCODER_DROP})
    atlas.meta["encoder_probe"] = probe.meta
    return [HeadScores(t.drop(columns=drop))]


def _composition(atlas: Atlas, model: HookedModel, seed: int, progress: bool = False) -> None:
    """Each head's strongest composition into it (``comp_in``: source and kind, ``comp_in_z``) and out
    of it (``comp_out``, ``comp_out_z``), by z against random heads; the scores stay for the cards."""
    from interp.roles import composition_scores

    try:
        comp = composition_scores(model, seed=seed, progress=progress)
    except UsageError as e:
        _left_out(atlas, "composition", str(e))
        return
    atlas.compositions = comp
    atlas.meta["composition"] = {"n_random": comp.meta["n_random"], "notes": comp.meta["notes"]}
    t = comp.table.dropna(subset=["z"]) if len(comp.table) else comp.table  # a zero head scores NaN
    frame = atlas.roles[["layer", "head"]].copy()
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
        frame = frame.merge(best, on=["layer", "head"], how="left")
    atlas.roles = atlas.roles.merge(frame, on=["layer", "head"], how="left")


def _cards(atlas: Atlas, model: HookedModel, info: ModelInfo) -> None:
    """A card per head (:func:`~interp.roles.card.head_card`): its role-table row, the tokens its
    mean OV write raises and lowers most (where the weights can be read), its strongest compositions
    in and out (with the composition part). The page draws each card's pattern thumbnail from the
    viewer's sequence (the patterns part), which it already holds."""
    from interp.roles.card import head_card, mean_writes

    writes: dict[tuple[int, int], Any] = {}
    try:
        for layer, w in mean_writes(model):
            writes.update({(layer, h): w[h] for h in range(info.n_heads)})
    except UsageError as e:
        _left_out(atlas, "cards' OV tokens", str(e))
    cards = {}
    for layer, head in zip(atlas.roles["layer"].tolist(), atlas.roles["head"].tolist()):
        write = writes.get((layer, head))
        card = head_card(
            layer,
            head,
            roles=atlas.roles,
            model=model if write is not None else None,
            compositions=atlas.compositions,
            write=write,
            top=CARD_TOP,
        )
        cards[card["head"]] = card
    atlas.cards = cards


def _ablations(
    atlas: Atlas,
    model: HookedModel,
    probe: Any,
    ablation: str,
    skip: Any,
    seed: int,
    progress: bool,
    extra: dict,
    journals: Any = None,
    say: Any = lambda part: None,
) -> None:
    from interp.ablation import builtin_metric, exact_sweep, gradient_importance, pruning_curves

    # decoders: the loss on the repeated half; encoders (no next token): the pooled output's cosine to the clean one
    metric = builtin_metric("incontext" if probe.causal else "pooled-cos", probe)
    common = dict(ablation=ablation, config=RunConfig(seed=seed, progress=progress))
    atlas.meta.update(metric=metric.name, ablation=ablation)
    if "exact" not in skip:
        say("exact")
        journal = journals("atlas-exact", probe.tokens) if journals is not None else None
        atlas.exact = exact_sweep(model, probe, metric, journal=journal, **common)
        if atlas.exact.meta.get("partial"):  # Ctrl-C: no atlas from part of a sweep (the journal keeps it)
            raise KeyboardInterrupt
        extra["exact_"] = HeadScores(atlas.exact.table[["layer", "head", "importance"]])
        atlas.meta["clean_metric"] = atlas.exact.meta.get("clean_metric")
    if "gradient" not in skip:
        say("gradient")
        atlas.gradient = gradient_importance(model, probe, metric, **common)
        extra["gradient_"] = HeadScores(atlas.gradient.table[["layer", "head", "importance"]])
    if "pruning" not in skip:
        say("pruning")
        orders = [o for o in ("gradient", "exact") if o not in skip] + ["random"]
        journal = journals("atlas-pruning", probe.tokens) if journals is not None else None
        # the orders rank by the importances the atlas has just computed (a partial sweep is no order)
        done = {"exact": atlas.exact, "gradient": atlas.gradient}
        given = {k: v for k, v in done.items() if v is not None and not v.meta.get("partial")}
        curves = pruning_curves(
            model, probe, metric, orders=orders, random_seeds=(seed,), importances=given, journal=journal, **common
        )
        if curves.partial:
            raise KeyboardInterrupt
        atlas.pruning = curves.table


def _retrieval(atlas: Atlas, model: HookedModel, info: ModelInfo, seq_len: int | None, cfg: RunConfig) -> None:
    """The retrieval part: scores on a needle probe, copy distance up to the probe's length; their
    columns join the role table (``retrieval_role``: retrieval / streaming / neither)."""
    from interp.probes.needle import copy_distance_probe, default_distances, needle_probe
    from interp.retrieval import copy_distance_scores, retrieval_scores
    from interp.retrieval.figures import layer_windows

    notes = atlas.meta.setdefault("notes", [])
    if not info.is_causal:
        notes.append("retrieval: left out: needle probes read a copy teacher-forced, which needs a causal model")
        return
    seq_len = retrieval_length(info, seq_len)
    if seq_len is None:
        notes.append(
            f"retrieval: left out: the model's context holds {_room(info)} tokens, fewer than the {RETRIEVAL_MIN} "
            "the atlas needs to run its needle probe unasked; ask for a shorter one with retrieval_len= "
            "(command line: --retrieval-len)"
        )
        return
    probe = needle_probe(model, seq_len=seq_len, batch=2, seed=cfg.seed)
    scores = retrieval_scores(model, probe, config=cfg)
    span = 8
    distances = default_distances(seq_len, span)
    dist_probe = copy_distance_probe(model, distances, span=span, batch=2, seed=cfg.seed)
    distance = copy_distance_scores(model, dist_probe, config=cfg)
    table = scores.table.rename(columns={"role": "retrieval_role"})
    keep = [c for c in table.columns if c != "label"]
    atlas.roles = atlas.roles.merge(table[keep], on=["layer", "head"], how="left")
    atlas.retrieval = {
        "scores": scores.table,
        "distance": distance,
        "windows": layer_windows(model),
        "meta": {k: scores.meta[k] for k in ("seq_len", "n_needles", "sink", "window", "engine", "ci_level")},
    }
    atlas.meta["retrieval_probe"] = {**probe.meta, "distances": distances}


def _encoder_len(info: ModelInfo) -> int:
    """Body tokens of each sequence of the encoder part's text probe (the map of heads reads it too)."""
    return min(ENCODER_LEN, _room(info))


def _encoder_probe(model: HookedModel, info: ModelInfo, seed: int) -> TokenProbe:
    """The encoder part's text probe, which the map of heads reads too."""
    from interp.probes import text_probe

    return text_probe(model, batch=ENCODER_BATCH, seq_len=_encoder_len(info), seed=seed)


def _room(info: ModelInfo) -> int:
    """Body tokens the model's context holds once a probe is framed (BOS, or [CLS] ... [SEP])."""
    return info.n_ctx - sum(len(f) for f in frame_tokens(info)[:2])


def retrieval_length(info: ModelInfo, asked: int | None) -> int | None:
    """The retrieval part's needle-probe length: ``asked``, else ``min(RETRIEVAL_LEN, room)`` when
    the room is at least :data:`RETRIEVAL_MIN`, else None (left out)."""
    if asked is not None:
        return asked
    room = _room(info)
    return min(RETRIEVAL_LEN, room) if room >= RETRIEVAL_MIN else None


def atlas_work(
    model: HookedModel | ModelInfo,
    *,
    batch: int = 10,
    seq_len: int = 50,
    repeats: int = 2,
    sink_batch: int = 16,
    sink_seq_len: int = 64,
    retrieval_len: int | None = None,
    view_len: int = 12,
    skip: Any = (),
    task: tuple[int, int] | None = None,
) -> dict[str, tuple[str, float]]:
    """Each part the atlas will run, ``part -> (what, with its sizes; work)``, ``"scores"`` first.

    Work is multiply-adds (:func:`interp.progress.forward_work`): the head scores one forward of the
    score probe; the exact sweep a replay from each head's layer up plus the metric's unembedding,
    per head; gradient importance a forward and a backward (three forwards); each pruning curve a
    forward per step; the retrieval part the needle probe and the copy-distance probe. Estimates to
    compare parts by, not timings. ``model`` may be its :class:`~interp.models.ModelInfo`. ``task``:
    ``(pairs, tokens)`` of the task part's pairs, which then runs (exact patching per head on the
    corrupted prompts, the metric read at one position, and a forward for the attribution), second."""
    info = model if isinstance(model, ModelInfo) else describe(model)
    skip = set([skip] if isinstance(skip, str) else skip)
    frame = sum(len(f) for f in frame_tokens(info)[:2])
    L, H, d = info.n_layers, info.n_heads, info.d_model
    vocab = info.d_vocab if info.is_causal else 0
    T = seq_len * repeats + frame
    tokens = batch * T
    probe = f"{batch} sequences of {T} tokens"
    layers = info.attention_layers
    n_heads = H * len(layers)
    plan = {"scores": (f"the head scores ({n_heads} heads x {probe})", forward_work(tokens, L, d))}
    if task is not None and "task" not in skip:
        n_pairs, T_task = task
        replayed = sum(H * (L - l) for l in layers)
        work = forward_work(n_pairs * T_task, replayed + 3 * L, d) + forward_work(n_pairs * n_heads, 0, d, vocab)
        plan["task"] = (f"the task part ({n_heads} heads patched x {n_pairs} pairs of {T_task} tokens)", work)
    if "sinks" not in skip:
        n = sink_batch * (sink_seq_len + frame)
        plan["sinks"] = (f"the sink report ({sink_batch} x {sink_seq_len + frame} tokens)", forward_work(n, L, d))
    if "exact" not in skip:
        replayed = sum(H * (L - l) for l in layers)
        work = forward_work(tokens, replayed, d) + forward_work(tokens * n_heads, 0, d, vocab)
        plan["exact"] = (f"the exact sweep ({n_heads} heads x {probe})", work)
    if "gradient" not in skip:
        plan["gradient"] = (f"gradient importance ({probe})", 3 * forward_work(tokens, L, d, vocab))
    if "pruning" not in skip:
        curves = 1 + sum(o not in skip for o in ("gradient", "exact"))
        steps = math.ceil(L * H / max(1, round(0.1 * L * H)))
        work = curves * steps * forward_work(tokens, L, d, vocab)
        plan["pruning"] = (f"the pruning curves ({curves} orders x {steps} steps x {probe})", work)
    if "ov" not in skip:
        plan["ov"] = ov_work(info)
    if "encoder" not in skip:
        plan["encoder"] = encoder_work(info, ENCODER_BATCH, _encoder_len(info) + frame)
    if "composition" not in skip:
        plan["composition"] = composition_work(info)
    length = retrieval_length(info, retrieval_len) if info.is_causal else None
    if "retrieval" not in skip and length is not None:
        distances = default_distances(length, 8)
        n = 2 * (length + frame) + 2 * len(distances) * (max(distances) + 16 + frame)
        plan["retrieval"] = (
            f"the retrieval part (needle probe 2 x {length} tokens, copy distances)",
            forward_work(n, L, d),
        )
    if "patterns" not in skip:
        n = 2 * view_len + frame
        plan["patterns"] = (f"the attention-pattern viewer (1 x {n} tokens)", forward_work(n, L, d))
    if "headmap" not in skip:
        plan["headmap"] = head_map_work(info, ENCODER_BATCH, _encoder_len(info) + frame)
    if "cards" not in skip:
        plan["cards"] = (
            f"the head cards ({n_heads} heads)",
            forward_work(info.d_vocab, 1, d) + n_heads * d * info.d_vocab,
        )
    return plan


def long_work_note(plan: Plan) -> str | None:
    """The up-front note of an :func:`atlas_work` plan whose parts will clearly take much longer than
    its head scores (:func:`interp.progress.plan_note`), naming the ``--skip`` that leaves them out."""

    def hint(parts: list[str]) -> str:
        return SKIP_HINT.format(parts=parts, them="it" if len(parts) == 1 else "them", flag=",".join(parts))

    return plan_note(plan, hint)


def _pattern_view(
    model: HookedModel,
    roles: pd.DataFrame,
    view_len: int,
    view_heads: list[str] | None,
    seed: int,
    on_probe: set[str] | None = None,
) -> dict:
    from interp.report.patterns import token_labels

    probe = repeated_tokens(model, batch=1, block_len=view_len, n_repeats=2, seed=seed + 1)
    ids = probe.tokens[0]
    patterns = attention_patterns(model, ids).numpy()
    labels = set(roles["label"])
    if view_heads:
        bad = [h for h in view_heads if h not in labels]
        if bad:
            raise UsageError(
                f"no head {', '.join(bad)} in this model: heads are LAYER.HEAD, e.g. {roles['label'].iloc[-1]}"
            )
        selected = list(dict.fromkeys(view_heads))
    else:
        # the strongest head of each role scored on the repeated probe the viewer shows (``on_probe``:
        # every role when None); of the other roles (weights, text), the strongest head named for it
        selected = []
        for col, role in role_columns().items():
            if col in roles and roles[col].notna().any():
                pool = (
                    roles
                    if on_probe is None or col in on_probe
                    else roles[roles["role"].str.split(", ").map(lambda r, role=role: role in r)]
                )
                if pool.empty:
                    continue
                best = pool.sort_values([col, "layer", "head"], ascending=[False, True, True], kind="mergesort")
                selected.append(best["label"].iloc[0])
        selected = list(dict.fromkeys(selected))
    return {
        "tokens": token_labels(model, ids.tolist(), probe),  # partial characters as their bytes
        "patterns": np.round(patterns, 3),
        "selected": selected,
        "probe": probe.meta,
    }


__all__ = [
    "CARD_TOP",
    "PARTS",
    "RETRIEVAL_LEN",
    "RETRIEVAL_MIN",
    "TASK_PAIRS",
    "atlas_work",
    "head_atlas",
    "long_work_note",
    "retrieval_length",
]
