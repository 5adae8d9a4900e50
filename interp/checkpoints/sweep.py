"""The sweep: load each revision in turn, score every head and the in-context learning, move on.

One model is in memory at a time: a revision is loaded, fingerprinted, scored and dropped before
the next is loaded. The probe is built once from the first revision scored and is the same tokens
for every revision (each revision's probe is checked against it). With ``out`` each finished
revision is journaled (:mod:`interp.journal`), so a run killed anywhere continues with
``resume=True`` after the last finished revision, and its outputs equal an uninterrupted run's.
"""

from __future__ import annotations

import gc
import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from interp.adapters import describe
from interp.checkpoints import hub
from interp.checkpoints.icl import icl_score
from interp.checkpoints.result import PAGE, STEM, CheckpointScores
from interp.checkpoints.sources import Revision, hub_revisions, local_revisions
from interp.config import RunConfig
from interp.errors import UsageError
from interp.journal import Journal, fingerprint, tokens_hash
from interp.parts import PARTS, Given, PartResult, check_sizes, in_order, in_place, sizes_of
from interp.parts import fingerprint as fingerprint_of
from interp.parts.attention import ScoreSizes, SinkSizes
from interp.parts.probing import RETRIEVAL_COLUMNS, RetrievalSizes, retrieval_fits
from interp.parts.shape import BLOCK_LENS, default_block_len
from interp.probes import TokenProbe
from interp.saving import claim

KIND = "checkpoints"
OUTPUTS = [f"{STEM}.csv", f"{STEM}_revisions.csv", f"{STEM}.json", f"{STEM}.html", f"{PAGE}.html"]
SWEEP_PARTS = ("sinks",)  # the parts a sweep runs beside the head scores unless parts= says otherwise
__all__ = [
    "BLOCK_LENS",
    "KIND",
    "RETRIEVAL_COLUMNS",
    "IclSizes",
    "SweepOut",
    "checkpoint_scores",
    "default_block_len",
    "retrieval_fits",
    "sweep_sizes",
    "write_outputs",
]


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A hash of every tensor of the state dict (names, dtypes, shapes and bytes): equal weights,
    equal fingerprints."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().to("cpu").contiguous()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:20]


def resolve(
    checkpoints: str | os.PathLike | Sequence[str | os.PathLike | Revision] | None = None,
    model: str | None = None,
    revisions: str | Sequence[str | int] | None = None,
) -> list[Revision]:
    """The revisions a sweep runs over: checkpoint folders (a glob or a list), a list of
    :class:`Revision`, or a Hub ``model`` with its ``revisions``."""
    if (checkpoints is None) == (revisions is None):
        raise UsageError("give either checkpoint folders or a Hub model's revisions (not both, not neither)")
    if revisions is not None:
        if not model:
            raise UsageError("revisions name versions of a Hub model: give the model too (e.g. EleutherAI/pythia-70m)")
        return hub_revisions(model, revisions)
    if isinstance(checkpoints, Sequence) and not isinstance(checkpoints, str) and checkpoints:
        if all(isinstance(c, Revision) for c in checkpoints):
            return list(checkpoints)  # type: ignore[arg-type]
    return local_revisions(checkpoints)  # type: ignore[arg-type]


@dataclass(frozen=True)
class IclSizes:
    """The in-context learning score's probe (:func:`interp.checkpoints.icl.icl_score`): ``data``,
    ``length`` and ``batch``."""

    data: str | None = None
    length: int | None = None
    batch: int = 16


@dataclass(frozen=True)
class SweepOut:
    """Where a sweep journals and writes (``folder``): ``resume=True`` continues a run stopped
    anywhere, ``fresh=True`` discards its journal, ``overwrite=True`` replaces earlier outputs;
    ``arguments`` are further settings a resumed run must share."""

    folder: str | os.PathLike
    resume: bool = False
    fresh: bool = False
    overwrite: bool = False
    arguments: Mapping[str, Any] | None = None


def sweep_sizes(
    *,
    batch: int = 10,
    seq_len: int | None = None,
    repeats: int = 2,
    icl_data: str | None = None,
    icl_len: int | None = None,
    icl_batch: int = 16,
    sink_batch: int = 16,
    sink_seq_len: int = 64,
    retrieval_len: int | None = None,
) -> dict[str, Any]:
    """The sizes of a sweep's parts (``sizes=`` of :func:`checkpoint_scores`) from its usual knobs."""
    return {
        "scores": ScoreSizes(batch=batch, seq_len=seq_len, repeats=repeats),
        "icl": IclSizes(data=icl_data, length=icl_len, batch=icl_batch),
        "sinks": SinkSizes(batch=sink_batch, seq_len=sink_seq_len),
        "retrieval": RetrievalSizes(seq_len=retrieval_len),
    }


def checkpoint_scores(
    checkpoints: str | os.PathLike | Sequence[str | os.PathLike | Revision] | None = None,
    *,
    model: str | None = None,
    revisions: str | Sequence[str | int] | None = None,
    config: RunConfig | None = None,
    sizes: Mapping[str, Any] | None = None,
    parts: Sequence[str] = SWEEP_PARTS,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    evict: bool = False,
    out: str | os.PathLike | SweepOut | None = None,
    name: str | None = None,
    log: Callable[[str], None] | None = None,
) -> CheckpointScores:
    """Every registered head score (with CIs) and the in-context learning score at each revision.

    Revisions: ``checkpoints`` (folders: a glob such as ``"runs/step*"`` or a list; or a list of
    :class:`Revision`) or a Hub ``model`` with ``revisions`` (``["step0", "step1000"]``,
    ``"step0,step1000"`` or a range ``"0:143000:1000"``, the stop included). Hub revisions are
    fetched one at a time through the Hugging Face cache; ``evict=True`` deletes each one this run
    downloaded once it is scored (the free disk is checked before each download).

    The sweep is a loop over parts (:mod:`interp.parts`): the head scores, then ``parts`` (default:
    the sink report), each with its ``sizes`` (:func:`sweep_sizes` builds them; ``"icl"``: the
    in-context score's :class:`IclSizes`). The head scores are :func:`interp.heads.head_scores` on
    ``repeated_tokens(batch, seq_len, repeats, seed)``, the same tokens for every revision
    (``seq_len=None``: 50 tokens per block, or 20 where the context cannot hold ``repeats`` blocks
    of 50, else the longest block that fits: :func:`default_block_len`, which the command line's
    ``--seq-len`` default reads); the in-context learning score is
    :func:`interp.checkpoints.icl.icl_score`. With ``"sinks"`` each head's first-token attention
    mass ``first_mass`` (with its CI, as the atlas reads it) joins the table, and with it the sink
    role. With ``"retrieval"``, each head's retrieval score (Wu et al. 2024, with its CI), retrieval
    mass and streaming share (:func:`interp.retrieval.retrieval_scores`) join it too, read on one
    needle probe for every revision: 3 needles of 8 tokens in 2 sequences of ``seq_len`` tokens
    (default: ``min(1024, the context)``, as ``interp retrieval``). The sweep's policy: a part a
    revision cannot have, or a probe its context cannot hold, is refused in one line before
    anything of it is scored (the sweep compares revisions column by column). Each revision loads
    on ``device`` (``None``: CUDA when present, as :func:`interp.models.load_model`).

    With ``out`` (a folder, or a :class:`SweepOut`), each finished revision is journaled there, the
    outputs are written there at the end (:func:`write_outputs`, listed in the result's ``written``)
    and the journal is deleted. ``name`` titles the result (default: the Hub model, or the folders'
    parent); ``log`` gets a line per revision scored.
    """
    cfg = RunConfig.of(config)
    chosen, icl = _chosen(sizes, parts)
    todo = resolve(checkpoints, model, revisions)
    say = log or (lambda line: None)
    settings = _settings(chosen, icl, cfg, dtype)
    where = out if isinstance(out, SweepOut) or out is None else SweepOut(out)
    journal, done = _journal(where, todo, {"parts": chosen, "icl": icl, **settings})
    if done:
        say(f"resuming: {len(done)} of {len(todo)} revision(s) already scored")
    try:
        payloads = []
        for i, rev in enumerate(todo):
            if rev.label in done:
                payloads.append(done[rev.label])
                continue
            payload = _score_revision(rev, chosen, icl, cfg, (device, dtype, evict), payloads or list(done.values()))
            if i == next(j for j, r in enumerate(todo) if r.label not in done):  # what the lines score on, once
                say(probe_line(payload["probe_meta"], cfg.seed))
            say(
                f"[{i + 1}/{len(todo)}] {rev.label} (step {rev.step}): best induction score "
                f"{max(r['induction'] for r in payload['rows']):.3f}, in-context score {payload['icl']['score']:.3f}"
            )
            if journal is not None:
                journal.append(rev.label, payload)
            payloads.append(payload)
        result = assemble(todo, payloads, settings, name or model)
        if where is not None:
            result.written = write_outputs(result, Path(where.folder), overwrite=where.overwrite)
    except BaseException:
        if journal is not None:
            journal.close()
        raise
    if journal is not None:
        journal.finish()  # the outputs are written: a finished folder holds no journal
    return result


def _journal(where: SweepOut | None, todo: list[Revision], marks: dict[str, Any]) -> tuple[Journal | None, dict]:
    """The sweep's journal under ``where`` (None: no journal) and the revisions it already holds; its
    fingerprint: each part's sizes, the in-context score's, the settings and ``where.arguments``."""
    if where is None:
        return None, {}
    claim(Path(where.folder), OUTPUTS, overwrite=where.overwrite)  # refuse before the work, not after it
    identity = hashlib.sha256(repr([r.as_dict() for r in todo]).encode()).hexdigest()[:16]
    marks = {**marks, "parts": {n: fingerprint_of(s) for n, s in marks["parts"].items()}, "icl": asdict(marks["icl"])}
    journal = Journal(where.folder, KIND, fingerprint({**marks, **(where.arguments or {})}, identity, ""))
    return journal, journal.open(where.resume, fresh=where.fresh)


def _chosen(sizes: Mapping[str, Any] | None, parts: Sequence[str]) -> tuple[dict[str, Any], IclSizes]:
    """The parts a sweep runs (the head scores first) with their sizes, and the in-context score's."""
    parts = PARTS.check_all([parts] if isinstance(parts, str) else parts)
    given = dict(sizes or {})
    icl = given.pop("icl", None) or IclSizes()
    if not isinstance(icl, IclSizes):
        raise UsageError(f"sizes={{'icl': ...}} must be an IclSizes, got {type(icl).__name__}", params="sizes")
    score = given.get("scores") or ScoreSizes(seq_len=None)  # the sweep's default block: the rule of BLOCK_LENS
    given["scores"] = score
    check_sizes(given)
    chosen = {n: sizes_of(n, given) for n in in_order({"scores", *parts})}
    if "retrieval" in chosen:  # the sweep follows the scores over revisions: no copy-distance curves
        chosen["retrieval"] = replace(chosen["retrieval"], distances=False)
    return chosen, icl


def _settings(chosen: Mapping[str, Any], icl: IclSizes, cfg: RunConfig, dtype: Any) -> dict[str, Any]:
    """The sweep's settings as its result's meta records them."""
    score, sink = chosen["scores"], chosen.get("sinks") or SinkSizes()
    retrieval = chosen.get("retrieval")
    return {
        "batch": score.batch,
        "seq_len": score.seq_len,
        "repeats": score.repeats,
        "icl_data": icl.data,
        "icl_len": icl.length,
        "icl_batch": icl.batch,
        "sinks": "sinks" in chosen,
        "sink_batch": sink.batch,
        "sink_seq_len": sink.seq_len,
        **({"retrieval": True, "retrieval_len": retrieval.seq_len} if retrieval is not None else {}),
        "seed": cfg.seed,
        "n_boot": cfg.n_boot,
        "level": cfg.level,
        "dtype": str(dtype),
    }


def write_outputs(result: CheckpointScores, out: Path, *, overwrite: bool = False) -> list[Path]:
    """``checkpoints.{csv,json}``, ``checkpoints_revisions.csv``, the figure (``.html``, ``.png``) and
    the page over revisions (``checkpoints_atlas.html``)."""
    from interp.plots import save_figure

    written = result.save(out, STEM, overwrite=overwrite)
    figure = result.figure()
    written += save_figure(figure, out, STEM, overwrite=overwrite)
    return written + result.save_page(out, PAGE, figure=figure, overwrite=overwrite)


def _score_revision(
    rev: Revision, chosen: Mapping[str, Any], icl: IclSizes, cfg: RunConfig, load: tuple, earlier: list[dict]
) -> dict[str, Any]:
    """One revision loaded, every chosen part run on it (quietly), the in-context score read, dropped."""
    device, dtype, evict = load
    downloaded = False
    if rev.hub:
        downloaded = hub.prepare(rev.spec, rev.revision)  # one line and no download when the disk is short
    t0 = time.perf_counter()
    model = rev.load(device=device, dtype=dtype)
    try:
        info, given, quiet = describe(model), Given(label=rev.label), replace(cfg, progress=False)
        for part, sizes in chosen.items():  # the sweep's policy: a part that cannot run here is refused, first
            check = PARTS.get(part).applicable
            why = check(info, sizes, given) if check is not None else None
            if why is not None:
                raise UsageError(f"the {part} part cannot run on {rev.label}: {why.reason}")
        got = {part: PARTS.get(part).run(model, sizes, quiet, given) for part, sizes in chosen.items()}
        scores, needles = got["scores"], got.get("retrieval")
        probe_hash = _same_tokens(rev, earlier, "probe", "probe", scores.probe)
        needles_hash = _same_tokens(rev, earlier, "needles", "needle-probe", needles.probe) if needles else None
        table, baselines = _tracked(got)
        icl_got = icl_score(model, length=icl.length, data=icl.data, batch=icl.batch, seed=cfg.seed)
        payload = {
            "revision": rev.label,
            "step": rev.step,
            "source": rev.as_dict(),
            "weights": weights_fingerprint(model),
            "probe": probe_hash,
            "probe_meta": _probe_meta(scores.probe),
            **({"needles": needles_hash, "needle_meta": _needle_meta(needles.probe)} if needles else {}),
            "baselines": baselines,
            "columns": list(table.columns),
            "rows": table.to_dict(orient="records"),
            "icl": icl_got.as_dict(),
            "icl_description": icl_got.describe(),
            "seconds": None,  # filled below; not part of the compared outputs
        }
        payload["seconds"] = round(time.perf_counter() - t0, 3)
    finally:
        del model
        gc.collect()
    if rev.hub and evict and downloaded:
        hub.evict(rev.spec, rev.revision)
    return payload


def _tracked(got: Mapping[str, PartResult]) -> tuple[pd.DataFrame, dict[str, float]]:
    """The head scores' table with the columns each other part's sweep follows (its ``tracked``
    columns, else all), in their place, and the baselines of them all."""
    table = got["scores"].columns
    baselines = {k: float(v) for k, v in got["scores"].baselines.items()}
    for part in in_place(n for n in got if n != "scores"):
        columns = got[part].columns
        if columns is None:
            continue
        keep = list(PARTS.get(part).tracked) or [c for c in columns.columns if c not in ("layer", "head", "label")]
        table = table.merge(columns[["layer", "head", *keep]], on=["layer", "head"], how="left")
        baselines.update({k: float(v) for k, v in got[part].baselines.items()})
    return table, baselines


def _same_tokens(rev: Revision, earlier: list[dict], key: str, what: str, probe: Any) -> str:
    """The hash of ``probe``'s tokens; a one-line :class:`UsageError` when the first revision
    scored (``earlier[0]``) drew other tokens under ``key``."""
    digest = tokens_hash(probe.tokens)
    if earlier and earlier[0][key] != digest:
        raise UsageError(
            f"{rev.label} draws other {what} tokens than {earlier[0]['revision']} (another vocabulary or "
            "BOS?): a sweep compares revisions of one model on one probe"
        )
    return digest


def _needle_meta(probe: Any) -> dict[str, Any]:
    m = probe.meta
    return {"batch": probe.batch, "seq_len": m["seq_len"], "n_needles": m["n_needles"], "needle_len": m["needle_len"]}


def probe_line(meta: dict[str, Any], seed: int) -> str:
    """What the sweep's head scores (its "best induction score" lines) are read on, sizes and seed."""
    framing = meta["seq_len"] - meta["block_len"] * meta["n_repeats"]
    return (
        f"the sweep scores every revision on one probe: {meta['batch']} sequences of {meta['seq_len']} tokens "
        f"({framing} of framing, then {meta['n_repeats']} x a block of {meta['block_len']} random tokens), seed {seed}"
    )


def _probe_meta(probe: TokenProbe) -> dict[str, Any]:
    return {"batch": probe.batch, "seq_len": probe.seq_len, "block_len": probe.block_len, "n_repeats": probe.n_repeats}


def assemble(
    todo: list[Revision], payloads: list[dict], settings: dict[str, Any], model: str | None
) -> CheckpointScores:
    """The result from the revisions' payloads (fresh or read back from the journal): equal
    payloads give equal results, so a resumed sweep equals an uninterrupted one."""
    keeper: dict[str, str] = {}
    for p in payloads:  # the last revision (in step order) of each group of equal weights is kept
        keeper[p["weights"]] = p["revision"]
    frames, rows = [], []
    for p in payloads:
        duplicate_of = "" if keeper[p["weights"]] == p["revision"] else keeper[p["weights"]]
        frame = pd.DataFrame.from_records(p["rows"], columns=p["columns"])  # a journal sorts the keys
        frame.insert(0, "revision", p["revision"])
        frame.insert(1, "step", p["step"])
        frame["duplicate_of"] = duplicate_of
        frames.append(frame)
        icl = p["icl"]
        rows.append(
            {
                "revision": p["revision"],
                "step": p["step"],
                "weights": p["weights"],
                "duplicate_of": duplicate_of,
                "icl": icl["score"],
                "icl_loss_early": icl["loss_early"],
                "icl_loss_late": icl["loss_late"],
            }
        )
    table = pd.concat(frames, ignore_index=True)
    revisions = pd.DataFrame(rows)
    first = payloads[0]
    name = model or _model_name(todo)
    meta = {
        "model": name,
        "sources": [r.as_dict() for r in todo],
        "settings": {**settings, "seq_len": first["probe_meta"]["block_len"]},  # None: the default rule's
        "probe": first["probe_meta"],
        "baselines": first["baselines"],
        "icl": {
            **{k: first["icl"][k] for k in ("early", "late", "length", "data", "batch")},
            "description": first["icl_description"],
        },  # fmt: skip
        "threshold": 0.3,
        **({"needles": first["needle_meta"]} if "needle_meta" in first else {}),
    }
    return CheckpointScores(table, revisions, meta)


def _model_name(todo: list[Revision]) -> str:
    parents = {str(Path(r.spec).parent.name) for r in todo}
    return parents.pop() if len(parents) == 1 else "checkpoints"
