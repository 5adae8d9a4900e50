"""What ``interp retrieval`` runs beside the scores: the window-ablation check of the roles, the
copy-distance profile, and the plan that sizes each part before any work.

- :func:`window_check`: restrict each role's heads to the sink + recent window
  (:class:`~interp.ablation.WindowAblation`) and measure the needle-copy loss against the
  unrestricted model's (a streaming head should lose nothing, a retrieval head should break the copy);
- :func:`copy_distance_profile`: :func:`~interp.retrieval.copy_distance_scores` on a copy-distance
  probe, and :func:`distance_leaders`, its strongest heads as a head x distance table;
- :func:`retrieval_plan`: the parts, ``part -> (what, with its sizes; work)`` (:func:`interp.progress.forward_work`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from interp.ablation import WindowAblation, ablated
from interp.adapters import HookedModel
from interp.config import RunConfig
from interp.probes.needle import NeedleProbe, copy_distance_probe
from interp.progress import forward_work, tqdm
from interp.retrieval.scores import copy_distance_scores, needle_copy_loss
from interp.stream.budget import PATTERN_BUDGET, choose_engine

CHECKED = ("streaming", "retrieval")  # the roles the check restricts, in this order


def window_check(
    model: HookedModel, probe: NeedleProbe, table: pd.DataFrame, *, sink: int, window: int, config: RunConfig
) -> dict[str, Any]:
    """The needle-copy loss of ``probe`` unrestricted (``clean``) and with each role's heads (the
    ``role`` column of ``table``, a retrieval score table) restricted to the first ``sink`` + last
    ``window`` keys: ``{"clean", "sink", "window", role: {"heads", "loss"}}``, a role without heads
    left out. The ablation edits the pattern, so it runs only where the pattern engine fits its
    budget (as ``engine="auto"`` decides for ``config.minibatch`` sequences); beyond, the check is
    ``{"skipped": why}``. ``config.minibatch``: sequences per forward; ``config.progress``: a bar."""
    n_seqs = min(config.minibatch or probe.batch, probe.batch)
    engine, why = choose_engine("auto", model, n_seqs, probe.seq_len, PATTERN_BUDGET)
    if engine != "pattern":
        return {"skipped": why}
    roles = [r for r in CHECKED if (table["role"] == r).any()]
    bar = tqdm(total=1 + len(roles), desc="ablation check", unit="pass", disable=not config.progress)
    loss_config = RunConfig(minibatch=config.minibatch)
    clean = needle_copy_loss(model, probe, config=loss_config)
    bar.update()
    check: dict[str, Any] = {"clean": clean, "sink": sink, "window": window}
    for role in roles:
        heads = table.loc[table["role"] == role, "label"].tolist()
        with ablated(model, heads, ablation=WindowAblation(sink=sink, window=window)):
            check[role] = {"heads": heads, "loss": needle_copy_loss(model, probe, config=loss_config)}
        bar.update()
    bar.close()
    return check


def copy_distance_profile(
    model: HookedModel, distances: Sequence[int], *, span: int, config: RunConfig
) -> tuple[pd.DataFrame, NeedleProbe]:
    """Each head's copy-distance scores (:func:`~interp.retrieval.copy_distance_scores`) on 2
    sequences of a copy-distance probe seeded by ``config.seed`` (copies of ``span`` tokens at
    each of ``distances``), and the probe."""
    probe = copy_distance_probe(model, distances, span=span, batch=2, seed=config.seed)
    return copy_distance_scores(model, probe, config=config), probe


def distance_leaders(table: pd.DataFrame, n: int) -> pd.DataFrame:
    """The ``n`` heads of ``table`` (:func:`copy_distance_profile`'s) with the most induction mass
    over the distances: a row per head (``layer.head``), a column per distance."""
    best = table.groupby(["layer", "head"])["induction"].mean().nlargest(n)
    wide = table.set_index(["layer", "head", "distance"])["induction"].unstack("distance").loc[best.index]
    wide.index = [f"{layer}.{head}" for layer, head in wide.index]
    return wide


def retrieval_plan(info: Any, probe: NeedleProbe, distances: Any, span: int) -> dict[str, tuple[str, float]]:
    """The parts of a retrieval run on ``probe`` (the copy-distance profile unless ``distances`` is
    ``"none"``), ``part -> (what, with its sizes; work)``."""
    L, d = info.n_layers, info.d_model
    T, body = probe.seq_len, probe.meta["seq_len"]  # framed, and as asked
    needle = probe.batch * T
    plan = {
        "needle": (
            f"the needle probe's scores ({probe.batch} x {body} tokens, {probe.n_needles // probe.batch} needle(s) "
            f"of {probe.needle_len} tokens)",
            forward_work(needle, L, d, context=T),
        ),
        # the clean run and one per role, each with its logits
        "check": (
            "the ablation check (up to 3 passes of the needle probe)",
            3 * forward_work(needle, L, d, info.d_vocab, T),
        ),
    }
    if distances != "none":
        n = max(distances) + 2 * span
        what = f"the copy-distance profile ({len(distances)} distance(s) of {', '.join(map(str, distances))} tokens, 2 x {n} tokens each)"
        plan["distance"] = (what, forward_work(2 * len(distances) * (n + T - body), L, d, context=n + T - body))
    return plan


__all__ = ["copy_distance_profile", "distance_leaders", "retrieval_plan", "window_check"]
