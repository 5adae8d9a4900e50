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
from collections.abc import Callable, Sequence
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
from interp.heads import head_scores, uniform_baselines
from interp.journal import Journal, fingerprint, tokens_hash
from interp.parts.probing import DEPTHS, NEEDLE_BATCH, NEEDLE_LEN, RETRIEVAL_COLUMNS, retrieval_fits
from interp.parts.shape import BLOCK_LENS, body_room, default_block_len
from interp.probes import TokenProbe, random_tokens, repeated_tokens
from interp.saving import claim

KIND = "checkpoints"
OUTPUTS = [f"{STEM}.csv", f"{STEM}_revisions.csv", f"{STEM}.json", f"{STEM}.html", f"{PAGE}.html"]
__all__ = ["BLOCK_LENS", "KIND", "checkpoint_scores", "default_block_len", "retrieval_fits", "write_outputs"]


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


def checkpoint_scores(
    checkpoints: str | os.PathLike | Sequence[str | os.PathLike | Revision] | None = None,
    *,
    model: str | None = None,
    revisions: str | Sequence[str | int] | None = None,
    batch: int = 10,
    seq_len: int | None = None,
    repeats: int = 2,
    icl_data: str | None = None,
    icl_len: int | None = None,
    icl_batch: int = 16,
    sinks: bool = True,
    sink_batch: int = 16,
    sink_seq_len: int = 64,
    retrieval: bool = False,
    retrieval_len: int | None = None,
    config: RunConfig | None = None,
    seed: int | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    out: str | os.PathLike | None = None,
    resume: bool = False,
    fresh: bool = False,
    overwrite: bool = False,
    evict: bool = False,
    name: str | None = None,
    arguments: dict[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
) -> CheckpointScores:
    """Every registered head score (with CIs) and the in-context learning score at each revision.

    Revisions: ``checkpoints`` (folders: a glob such as ``"runs/step*"`` or a list; or a list of
    :class:`Revision`) or a Hub ``model`` with ``revisions`` (``["step0", "step1000"]``,
    ``"step0,step1000"`` or a range ``"0:143000:1000"``, the stop included). Hub revisions are
    fetched one at a time through the Hugging Face cache; ``evict=True`` deletes each one this run
    downloaded once it is scored (the free disk is checked before each download).

    The head scores are :func:`interp.heads.head_scores` on ``repeated_tokens(batch, seq_len,
    repeats, seed)``, the same tokens for every revision (``seq_len=None``: 50 tokens per block, or
    20 where the context cannot hold ``repeats`` blocks of 50, else the longest block that fits:
    :func:`default_block_len`, which the command line's ``--seq-len`` default reads); the in-context learning score is
    :func:`interp.checkpoints.icl.icl_score` (``icl_data``, ``icl_len``, ``icl_batch``). With
    ``sinks`` (the default) each head's first-token attention mass ``first_mass`` (with its CI, on
    ``sink_batch`` x ``sink_seq_len`` random tokens, as the atlas reads it) joins the table, and
    with it the sink role. With ``retrieval``, each head's retrieval score (Wu et al. 2024, with its
    CI), retrieval mass and streaming share (:func:`interp.retrieval.retrieval_scores`) join it too,
    read on one needle probe for every revision: 3 needles of 8 tokens in 2 sequences of
    ``retrieval_len`` tokens (default: ``min(1024, the context)``, as ``interp retrieval``); a context
    that cannot hold it is refused in one line before anything is scored. Each
    revision loads on ``device`` (``None``: CUDA when present, as :func:`interp.models.load_model`).

    With ``out``, each finished revision is journaled under ``out`` (``resume=True`` continues a run
    stopped anywhere; ``fresh=True`` discards its journal), the outputs are written there at the end
    (:func:`write_outputs`, listed in the result's ``written``; ``overwrite=True`` replaces earlier
    ones) and the journal is deleted. ``name`` titles the result (default: the Hub model, or the
    folders' parent); ``arguments`` are further settings a resumed run must share; ``log`` gets a
    line per revision scored.
    """
    cfg = RunConfig.of(config, **({"seed": seed} if seed is not None else {}))
    todo = resolve(checkpoints, model, revisions)
    say = log or (lambda line: None)
    settings = {
        "batch": batch,
        "seq_len": seq_len,
        "repeats": repeats,
        "icl_data": icl_data,
        "icl_len": icl_len,
        "icl_batch": icl_batch,
        "sinks": sinks,
        "sink_batch": sink_batch,
        "sink_seq_len": sink_seq_len,
        **({"retrieval": True, "retrieval_len": retrieval_len} if retrieval else {}),
        "seed": cfg.seed,
        "n_boot": cfg.n_boot,
        "level": cfg.level,
        "dtype": str(dtype),
    }
    journal = None
    done: dict[Any, Any] = {}
    if out is not None:
        claim(Path(out), OUTPUTS, overwrite=overwrite)  # refuse before the work, not after it
        identity = hashlib.sha256(repr([r.as_dict() for r in todo]).encode()).hexdigest()[:16]
        journal = Journal(out, KIND, fingerprint({**settings, **(arguments or {})}, identity, ""))
        done = journal.open(resume, fresh=fresh)
        if done:
            say(f"resuming: {len(done)} of {len(todo)} revision(s) already scored")
    try:
        payloads = []
        for i, rev in enumerate(todo):
            if rev.label in done:
                payloads.append(done[rev.label])
                continue
            payload = _score_revision(rev, settings, cfg, device, dtype, evict, payloads or list(done.values()))
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
        if out is not None:
            result.written = write_outputs(result, Path(out), overwrite=overwrite)
    except BaseException:
        if journal is not None:
            journal.close()
        raise
    if journal is not None:
        journal.finish()  # the outputs are written: a finished folder holds no journal
    return result


def write_outputs(result: CheckpointScores, out: Path, *, overwrite: bool = False) -> list[Path]:
    """``checkpoints.{csv,json}``, ``checkpoints_revisions.csv``, the figure (``.html``, ``.png``) and
    the page over revisions (``checkpoints_atlas.html``)."""
    from interp.plots import save_figure

    written = result.save(out, STEM, overwrite=overwrite)
    figure = result.figure()
    written += save_figure(figure, out, STEM, overwrite=overwrite)
    return written + result.save_page(out, PAGE, figure=figure, overwrite=overwrite)


def _score_revision(
    rev: Revision,
    settings: dict[str, Any],
    cfg: RunConfig,
    device: Any,
    dtype: Any,
    evict: bool,
    earlier: list[dict],
) -> dict[str, Any]:
    downloaded = False
    if rev.hub:
        downloaded = hub.prepare(rev.spec, rev.revision)  # one line and no download when the disk is short
    t0 = time.perf_counter()
    model = rev.load(device=device, dtype=dtype)
    try:
        needles = _needle_probe(model, rev, settings, cfg) if settings.get("retrieval") else None
        needles_hash = _same_tokens(rev, earlier, "needles", "needle-probe", needles) if needles is not None else None
        block = settings["seq_len"] or default_block_len(body_room(describe(model)), settings["repeats"])
        probe = repeated_tokens(
            model, batch=settings["batch"], block_len=block, n_repeats=settings["repeats"], seed=cfg.seed
        )
        probe_hash = _same_tokens(rev, earlier, "probe", "probe", probe)
        scores = head_scores(model, probe, config=cfg, progress=False)
        baselines = {k: float(v) for k, v in uniform_baselines(probe).items()}
        table = scores.table
        if settings["sinks"]:
            table, baselines["first_mass"] = _with_sinks(model, table, settings, cfg)
        if needles is not None:
            table = _with_retrieval(model, table, needles, cfg)
        icl = icl_score(
            model, length=settings["icl_len"], data=settings["icl_data"], batch=settings["icl_batch"], seed=cfg.seed
        )
        payload = {
            "revision": rev.label,
            "step": rev.step,
            "source": rev.as_dict(),
            "weights": weights_fingerprint(model),
            "probe": probe_hash,
            "probe_meta": _probe_meta(probe),
            **({"needles": needles_hash, "needle_meta": _needle_meta(needles)} if needles else {}),
            "baselines": baselines,
            "columns": list(table.columns),
            "rows": table.to_dict(orient="records"),
            "icl": icl.as_dict(),
            "icl_description": icl.describe(),
            "seconds": None,  # filled below; not part of the compared outputs
        }
        payload["seconds"] = round(time.perf_counter() - t0, 3)
    finally:
        del model
        gc.collect()
    if rev.hub and evict and downloaded:
        hub.evict(rev.spec, rev.revision)
    return payload


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


def _with_sinks(
    model: Any, table: pd.DataFrame, settings: dict[str, Any], cfg: RunConfig
) -> tuple[pd.DataFrame, float]:
    """``table`` with each head's first-token mass and its CI (the atlas's sink columns), and the
    uniform head's first-token mass on the same random tokens."""
    from interp.sinks import sink_scores

    length = min(settings["sink_seq_len"], describe(model).n_ctx - 1)
    probe = random_tokens(model, batch=settings["sink_batch"], seq_len=length, seed=cfg.seed)
    report = sink_scores(model, probe, config=cfg, progress=False)
    columns = ["layer", "head", "first_mass", "first_mass_lo", "first_mass_hi"]
    merged = table.merge(report.heads.table[columns], on=["layer", "head"], how="left")
    return merged, float(report.meta["uniform_first_mass"])


def _needle_probe(model: Any, rev: Revision, settings: dict[str, Any], cfg: RunConfig) -> Any:
    """The retrieval score's needle probe (the same tokens for every revision of one model), or a
    one-line :class:`UsageError` when ``rev``'s context cannot hold it."""
    from interp.probes.needle import needle_probe

    info = describe(model)
    if not info.is_causal:
        raise UsageError(
            f"the retrieval score reads a copy teacher-forced, which needs a causal model; {rev.label} is an encoder"
        )
    room = body_room(info)
    length = retrieval_fits(rev.label, room, settings.get("retrieval_len"))
    return needle_probe(model, seq_len=length, depths=DEPTHS, needle_len=NEEDLE_LEN, batch=NEEDLE_BATCH, seed=cfg.seed)


def _with_retrieval(model: Any, table: pd.DataFrame, needles: Any, cfg: RunConfig) -> pd.DataFrame:
    """``table`` with each head's retrieval score and CI, retrieval mass and streaming share."""
    from interp.retrieval import retrieval_scores

    got = retrieval_scores(model, needles, n_boot=cfg.n_boot, level=cfg.level, seed=cfg.seed, progress=False)
    return table.merge(got.table[["layer", "head", *RETRIEVAL_COLUMNS]], on=["layer", "head"], how="left")


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
