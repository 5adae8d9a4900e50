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
on the encoder part's text probe), why each induction, previous-token and sink head attends where it
does (:func:`interp.roles.qk.qk_attribution`, its top pairs at its role's targets), and a card per
head (:func:`interp.roles.card.head_card`). Given
a task (``task=``: :mod:`interp.probes.task`), the task part patches every head exactly
(:func:`interp.patching.patch_heads`, denoising, the task's normalised metric) and attributes the
logit difference to each head directly (:func:`interp.roles.logit_attribution`), both on the
task's pairs. Every part is registered once in :data:`interp.parts.PARTS` (its sizes, work and
run); the atlas is a loop over them, and :data:`PARTS` here lists those a run may leave out
(``skip``). A part a model cannot have (composition on
latent attention, successor heads without ordinal tokens) is left out with a note in
``meta["notes"]`` naming why; the rest run.

This module sits above the atlas and its page: it builds the :class:`Atlas` (data) and hands it
the page's renderer, so ``atlas.save(dir)`` writes the HTML without the atlas importing it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import asdict, replace
from typing import Any

import pandas as pd

import interp.distributed as distributed
from interp.adapters import HookedModel
from interp.config import RunConfig, run_header
from interp.errors import UsageError
from interp.models import ModelInfo, describe
from interp.parts import PARTS as ALL_PARTS
from interp.parts import Given, NotApplicable, PartResult, in_order, in_place, left_out, sizes_of
from interp.parts.ablation import AblationSizes, PruningSizes
from interp.parts.attention import ScoreSizes, SinkSizes
from interp.parts.probing import PatternSizes, RetrievalSizes
from interp.parts.roles import CARD_TOP, QKSizes
from interp.parts.shape import body_room
from interp.parts.table import THRESHOLD, role_table
from interp.parts.task import TaskSizes
from interp.probes.task import N_PAIRS
from interp.progress import Plan, announcer, plan_note
from interp.registry import Registry
from interp.report.atlas import Atlas
from interp.report.page import render_atlas
from interp.scores import HeadScores

# The parts of the atlas a run may leave out (``skip=``, ``--skip``): every part but the head scores,
# read from the one registry of parts.
PARTS: Registry[str] = Registry("atlas part")
for _name in ALL_PARTS:
    if not ALL_PARTS.info(_name, "base"):
        PARTS.add(_name, ALL_PARTS.doc(_name))

# the needle probe the atlas runs unasked: min(RETRIEVAL_LEN, the context), and only when the context
# holds RETRIEVAL_MIN tokens (shorter probes say little about long-range copying: the streaming
# window and the copy distances scale with the probe). GPT-2 (1024 positions, one of them BOS) gets 1023.
RETRIEVAL_LEN = 1024
RETRIEVAL_MIN = 512

ABLATION_PARTS = ("exact", "gradient", "pruning")
TASK_PAIRS = N_PAIRS  # a bundled task's pairs unless task_pairs= (--task-pairs) says otherwise, as interp patch's
SKIP_HINT = "skip={parts!r} leaves {them} out (command line: --skip {flag})"  # after the note on long parts
# where a part the atlas leaves out can be had instead, by the parameter that would let it run
ELSEWHERE = {"sequences": "; ov_scores(sequences=) scores it on yours (command line: interp roles --sequences)"}


def atlas_sizes(
    *,
    batch: int = 10,
    seq_len: int = 50,
    repeats: int = 2,
    sink_batch: int = 16,
    sink_seq_len: int = 64,
    ablation: str = "mean",
    view_len: int = 12,
    view_heads: list[str] | tuple[str, ...] | None = None,
    retrieval_len: int | None = None,
    qk_heads: int | None = QKSizes.heads,
) -> dict[str, Any]:
    """The sizes of the atlas's parts from its usual knobs (``sizes=`` of :func:`head_atlas`): the
    score probe (which the ablation parts share), the sink probe, the ablation, the viewer, the
    needle probe and the heads of each role the QK part decomposes (None: every one)."""
    probe = dict(batch=batch, seq_len=seq_len, repeats=repeats)
    return {
        "scores": ScoreSizes(**probe),
        "sinks": SinkSizes(batch=sink_batch, seq_len=sink_seq_len),
        **{name: AblationSizes(**probe, ablation=ablation) for name in ("exact", "gradient")},
        "pruning": PruningSizes(**probe, ablation=ablation),
        "patterns": PatternSizes(view_len=view_len, heads=tuple(view_heads) if view_heads else None),
        "retrieval": RetrievalSizes(seq_len=retrieval_len),
        "qk": QKSizes(heads=qk_heads),
    }


def validate_head_atlas(
    *,
    sizes: Mapping[str, Any] | None = None,
    skip: tuple[str, ...] | list[str] = (),
    threshold: float = THRESHOLD,
    task: Any = None,
    task_pairs: int | None = None,
) -> list[str]:
    """The atlas's options checked without a model (each part's sizes by its own ``validate``);
    ``skip`` as a list of parts (a string is one part)."""
    from interp.parts import base

    skip = [skip] if isinstance(skip, str) else list(skip)  # skip="exact" is one part, not five letters
    unknown = sorted(set(skip) - set(PARTS))
    if unknown:
        raise UsageError(f"cannot skip {', '.join(unknown)}: choose from {', '.join(PARTS)}", params="skip")
    if not 0 < threshold < 1:
        raise UsageError(f"the role threshold must be between 0 and 1, got {threshold}", params="threshold")
    if task is not None and "task" in skip:
        raise UsageError("task= is read by the task part, and skip= leaves it out: drop one of them", params="task")
    if task is None and task_pairs is not None:
        raise UsageError(
            "task_pairs= sizes the task part, which runs only with a task: give task= or drop it", params="task_pairs"
        )
    if task_pairs is not None and (isinstance(task_pairs, bool) or not isinstance(task_pairs, int) or task_pairs < 1):
        raise UsageError(f"task_pairs must be an integer >= 1, got {task_pairs!r}", params="task_pairs")
    base.check_sizes(sizes, [n for n in ALL_PARTS if n != "task"])
    return skip


def head_atlas(
    model: HookedModel,
    *,
    config: RunConfig | None = None,
    sizes: Mapping[str, Any] | None = None,
    skip: tuple[str, ...] | list[str] = (),
    threshold: float = THRESHOLD,
    journals: Any = None,
    task: Any = None,
    task_pairs: int | None = None,
) -> Atlas:
    """Run every per-head analysis of ``model`` and gather them into an :class:`Atlas`.

    ``config`` (a :class:`~interp.config.RunConfig`) sets the bootstrap, seed, minibatch, progress
    and engine of the head scores and the sink report; the ablation parts take its seed and
    progress. ``sizes`` maps a part to its sizes (:func:`atlas_sizes` builds them from the usual
    knobs; a part not named keeps its defaults; the ablation parts run on the score probe's sizes).
    ``journals`` (a :class:`~interp.journal.Journals`, as ``--resume`` opens them): the exact sweep
    and the pruning curves record their finished units in the journals ``atlas-exact`` and
    ``atlas-pruning``, and a resumed run takes them from there.

    The ``retrieval`` part (:func:`interp.retrieval.retrieval_scores` and
    :func:`~interp.retrieval.copy_distance_scores`) runs on a needle probe of its ``seq_len`` body
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

    A part the model cannot have is left out with a note naming why (the atlas's policy); a part
    whose sizes cannot be met is refused before anything runs. With ``progress`` on, it says up
    front (on stderr) which parts will clearly take much longer than the head scores, from their
    work sizes (:func:`atlas_work`), and which ``skip`` leaves them out; each part then says its
    sizes as it starts and shows its progress.
    """
    cfg = RunConfig.of(config)
    skip = validate_head_atlas(sizes=sizes, skip=skip, threshold=threshold, task=task, task_pairs=task_pairs)
    info = describe(model)
    pairs = _task(model, task, task_pairs, cfg.seed) if task is not None else None  # a bad task ends the run here
    given = Given(journals=journals, task=pairs)
    chosen, out = _chosen(info, sizes, skip, pairs, given)
    plan = {name: ALL_PARTS.get(name).work(info, chosen[name]) for name in chosen if name not in out}
    loud = cfg.progress and distributed.is_main()
    note = long_work_note(plan)
    if loud and note:
        print(note, file=sys.stderr, flush=True)
    say = announcer("atlas", plan, loud, timed=True)
    atlas: Atlas | None = None
    for name in chosen:
        say(name)
        got = out[name] if name in out else ALL_PARTS.get(name).run(model, chosen[name], cfg, given)
        given.done[name] = got
        if atlas is None:  # the head scores: the atlas's probe, baselines and run header
            atlas = _started(info, got, cfg, threshold, skip)
            given.roles = lambda: _roles(given.done, atlas.baselines, threshold)
        else:
            _gather(atlas, name, got)
    say.finish()
    assert atlas is not None
    atlas.roles = given.roles()
    return atlas


def _started(info: ModelInfo, scores: PartResult, cfg: RunConfig, threshold: float, skip: list[str]) -> Atlas:
    meta = run_header(
        info,
        scores.probe,
        ci_level=scores.result.meta["ci_level"],
        seed=cfg.seed,
        threshold=threshold,
        skipped=sorted(set(skip)),
    )
    return Atlas(roles=pd.DataFrame(), baselines=dict(scores.baselines), meta=meta, render=render_atlas)


def _gather(atlas: Atlas, name: str, got: PartResult | NotApplicable) -> None:
    """One part's outcome into the atlas: its meta, notes, baselines and its result's field (a part
    left out: its note)."""
    if isinstance(got, NotApplicable):
        atlas.meta.setdefault("notes", []).append(_left_out_note(name, got))
        return
    atlas.meta.update(got.meta)
    atlas.baselines.update(got.baselines)
    notes = [_left_out_note(what, why) for what, why in got.left_out.items()] + got.notes
    if notes:
        atlas.meta.setdefault("notes", []).extend(notes)
    field = ALL_PARTS.info(name, "atlas")
    if field is not None:
        setattr(atlas, field, got.result)


def _left_out_note(what: str, why: NotApplicable) -> str:
    return left_out(what, why.reason) + "".join(ELSEWHERE.get(p, "") for p in why.params)


def _roles(done: Mapping[str, Any], baselines: Mapping[str, float], threshold: float) -> pd.DataFrame:
    """The role table of the parts done: the head scores, then each part's columns in its place."""
    scores = done["scores"].result
    frame = scores.table[["layer", "head"]]
    for name in in_place(n for n in done if n != "scores"):
        got = done[name]
        if isinstance(got, PartResult) and got.columns is not None:
            keep = [c for c in got.columns.columns if c not in frame.columns or c in ("layer", "head")]
            frame = frame.merge(got.columns[keep], on=["layer", "head"], how="left")
    extra = {"": HeadScores(frame)} if len(frame.columns) > 2 else None
    return role_table(scores, baselines, threshold=threshold, extra=extra)


def _chosen(
    info: ModelInfo, sizes: Mapping[str, Any] | None, skip: list[str], pairs: Any, given: Given
) -> tuple[dict[str, Any], dict[str, NotApplicable]]:
    """The parts this atlas runs, in order, with their sizes, and those among them it leaves out with
    a note: the model cannot have them, or (the retrieval part, unasked) its context is too short.
    A part whose sizes the model cannot meet is refused here, before anything runs."""
    sizes = dict(sizes or {})
    score = sizes_of("scores", sizes)
    probe = asdict(score)
    for name in ABLATION_PARTS:  # the ablation parts run on the score probe unless given sizes of their own
        sizes.setdefault(name, (PruningSizes if name == "pruning" else AblationSizes)(**probe))
    pruning = sizes_of("pruning", sizes)  # its orders: the importances of the ablation parts that run
    sizes["pruning"] = replace(pruning, orders=tuple(o for o in pruning.orders if o not in skip))
    if pairs is not None:
        sizes["task"] = TaskSizes(pairs=pairs.n_pairs, tokens=pairs.seq_len)
    names = [n for n in ALL_PARTS if n not in skip and (n != "task" or pairs is not None)]
    chosen = {n: sizes_of(n, sizes) for n in in_order(names)}
    out = {}
    for name, s in chosen.items():
        check = ALL_PARTS.get(name).applicable
        why = check(info, s, given) if check is not None else None
        if why is None and name == "retrieval" and s.seq_len is None:
            why = _unasked_retrieval(info)
        if why is not None:
            out[name] = why
    return chosen, out


def _unasked_retrieval(info: ModelInfo) -> NotApplicable | None:
    """The atlas's rule for a needle probe no one asked for: ``min(1024, the context)`` when the
    context holds :data:`RETRIEVAL_MIN` tokens, else left out."""
    if body_room(info) >= RETRIEVAL_MIN:
        return None
    return NotApplicable(
        f"the model's context holds {body_room(info)} tokens, fewer than the {RETRIEVAL_MIN} the atlas needs to "
        "run its needle probe unasked; ask for a shorter one with retrieval_len= (command line: --retrieval-len)"
    )


def _task(model: HookedModel, task: Any, n_pairs: int | None, seed: int) -> Any:
    """The task's pairs: a :class:`~interp.probes.task.TaskProbe` as given, else built by name or read from a file."""
    from interp.probes.task import TaskProbe, task_probe

    return task if isinstance(task, TaskProbe) else task_probe(model, task, n_pairs=n_pairs, seed=seed)


def retrieval_length(info: ModelInfo, asked: int | None) -> int | None:
    """The retrieval part's needle-probe length: ``asked``, else ``min(RETRIEVAL_LEN, room)`` when
    the room is at least :data:`RETRIEVAL_MIN`, else None (left out)."""
    if asked is not None:
        return asked
    room = body_room(info)
    return min(RETRIEVAL_LEN, room) if room >= RETRIEVAL_MIN else None


def atlas_work(
    model: HookedModel | ModelInfo,
    *,
    sizes: Mapping[str, Any] | None = None,
    skip: Any = (),
    task: tuple[int, int] | None = None,
) -> dict[str, tuple[str, float]]:
    """Each part the atlas will run, ``part -> (what, with its sizes; work)``, ``"scores"`` first:
    each part's own ``work`` (:mod:`interp.parts`), in multiply-adds
    (:func:`interp.progress.forward_work`). Estimates to compare parts by, not timings. ``model``
    may be its :class:`~interp.models.ModelInfo`. ``task``: ``(pairs, tokens)`` of the task part's
    pairs, which then runs, second."""
    info = model if isinstance(model, ModelInfo) else describe(model)
    skip = [skip] if isinstance(skip, str) else list(skip)
    pairs = None
    if task is not None and "task" not in skip:
        from types import SimpleNamespace

        pairs = SimpleNamespace(n_pairs=task[0], seq_len=task[1])
    chosen, out = _chosen(info, sizes, skip, pairs, Given(task=pairs))
    return {name: ALL_PARTS.get(name).work(info, chosen[name]) for name in chosen if name not in out}


def long_work_note(plan: Plan) -> str | None:
    """The up-front note of an :func:`atlas_work` plan whose parts will clearly take much longer than
    its head scores (:func:`interp.progress.plan_note`), naming the ``--skip`` that leaves them out."""

    def hint(parts: list[str]) -> str:
        return SKIP_HINT.format(parts=parts, them="it" if len(parts) == 1 else "them", flag=",".join(parts))

    return plan_note(plan, hint)


__all__ = [
    "CARD_TOP",
    "PARTS",
    "RETRIEVAL_LEN",
    "RETRIEVAL_MIN",
    "TASK_PAIRS",
    "atlas_sizes",
    "atlas_work",
    "head_atlas",
    "long_work_note",
    "retrieval_length",
    "validate_head_atlas",
]
