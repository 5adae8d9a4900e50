""":func:`head_atlas`: every per-head analysis of a model in one :class:`Atlas`, ready to render.

The atlas runs, on seeded probes: the head scores with their CIs on repeated random tokens
(:func:`interp.heads.head_scores`), the sink report on random tokens
(:func:`interp.sinks.sink_scores`), the exact single-head ablation sweep and Michel et al.'s
gradient importance on the in-context loss of the repeated probe, pruning curves, and every
head's attention pattern on one short repeated sequence. Parts named in ``skip`` are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from interp._io import atomic_write, atomic_write_json
from interp.errors import UsageError
from interp.heads import head_scores
from interp.models import describe
from interp.probes import random_tokens, repeated_tokens
from interp.report.patterns import attention_patterns
from interp.report.roles import ROLES, THRESHOLD, role_table, uniform_baselines
from interp.scores import HeadScores

PARTS = ("sinks", "exact", "gradient", "pruning", "patterns")


@dataclass
class Atlas:
    """What :func:`head_atlas` found; :meth:`save` writes the page and its tables.

    ``roles`` is the tidy per-head table (every score with its CI, importances, ``role``);
    ``pattern`` holds the viewer's sequence: ``tokens`` (strings), ``patterns``
    (``[layer, head, q, k]``) and ``selected`` (head labels shown first).
    """

    roles: pd.DataFrame
    baselines: dict[str, float]
    meta: dict[str, Any]
    sinks: Any = None
    exact: HeadScores | None = None
    gradient: HeadScores | None = None
    pruning: pd.DataFrame | None = None
    pattern: dict[str, Any] = field(default_factory=dict)

    def named(self, role: str) -> list[str]:
        """Head labels named ``role`` ("induction", "previous-token", ...), strongest first."""
        col = next(c for c, r in ROLES.items() if r == role)
        hit = self.roles[self.roles["role"].str.split(", ").map(lambda rs: role in rs)]
        return hit.sort_values(col, ascending=False, kind="mergesort")["label"].tolist()

    def save(self, out: str | Path, stem: str = "atlas") -> list[Path]:
        """Write ``<stem>.html`` (self-contained, offline), ``<stem>_roles.csv`` and ``<stem>.json``."""
        from interp.report.page import render_atlas

        out = Path(out)
        records = lambda f: json.loads(f.to_json(orient="records"))  # noqa: E731
        blob = {"meta": self.meta, "baselines": self.baselines, "roles": records(self.roles)}
        if self.pruning is not None:
            blob["pruning"] = records(self.pruning)
        return [
            atomic_write(out / f"{stem}.html", render_atlas(self)),
            atomic_write(out / f"{stem}_roles.csv", self.roles.to_csv(index=False)),
            atomic_write_json(out / f"{stem}.json", blob),
        ]


def head_atlas(
    model: Any,
    *,
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
    seed: int = 0,
    progress: bool = False,
) -> Atlas:
    """Run every per-head analysis of ``model`` and gather them into an :class:`Atlas`."""
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
    probe = repeated_tokens(model, batch=batch, block_len=seq_len, n_repeats=repeats, seed=seed)
    scores = head_scores(model, probe, seed=seed, progress=progress)
    baselines = uniform_baselines(probe)
    extra: dict[str, HeadScores] = {}
    meta: dict[str, Any] = {
        "model": info.name,
        "n_layers": info.n_layers,
        "n_heads": info.n_heads,
        "causal": info.is_causal,
        "probe": probe.meta,
        "ci_level": scores.meta["ci_level"],
        "seed": seed,
        "threshold": threshold,
        "skipped": sorted(set(skip)),
    }
    atlas = Atlas(roles=pd.DataFrame(), baselines=baselines, meta=meta)
    if "sinks" not in skip:
        from interp.sinks import sink_scores

        sink_probe = random_tokens(model, batch=sink_batch, seq_len=sink_seq_len, seed=seed)
        atlas.sinks = sink_scores(model, sink_probe, seed=seed, progress=progress)
        extra[""] = HeadScores(
            atlas.sinks.heads.table[["layer", "head", "first_mass", "first_mass_lo", "first_mass_hi"]]
        )
        baselines["first_mass"] = float(atlas.sinks.meta["uniform_first_mass"])
        meta.update(sink_probe=sink_probe.meta, epsilon=atlas.sinks.meta["epsilon"], sink_rate=atlas.sinks.sink_rate)
    if {"exact", "gradient", "pruning"} - set(skip):
        _ablations(atlas, model, probe, ablation, skip, seed, progress, extra)
    atlas.roles = role_table(scores, baselines, threshold=threshold, extra=extra)
    if "patterns" not in skip:
        atlas.pattern = _pattern_view(model, atlas.roles, view_len, view_heads, seed)
    return atlas


def _ablations(
    atlas: Atlas, model: Any, probe: Any, ablation: str, skip: Any, seed: int, progress: bool, extra: dict
) -> None:
    from interp.ablation import builtin_metric, exact_sweep, gradient_importance, pruning_curves

    # decoders: the loss on the repeated half; encoders (no next token): the pooled output's cosine to the clean one
    metric = builtin_metric("incontext" if probe.causal else "pooled-cos", probe)
    common = dict(ablation=ablation, seed=seed, progress=progress)
    atlas.meta.update(metric=metric.name, ablation=ablation)
    if "exact" not in skip:
        atlas.exact = exact_sweep(model, probe, metric, **common)
        extra["exact_"] = HeadScores(atlas.exact.table[["layer", "head", "importance"]])
        atlas.meta["clean_metric"] = atlas.exact.meta.get("clean_metric")
    if "gradient" not in skip:
        atlas.gradient = gradient_importance(model, probe, metric, **common)
        extra["gradient_"] = HeadScores(atlas.gradient.table[["layer", "head", "importance"]])
    if "pruning" not in skip:
        orders = [o for o in ("gradient", "exact") if o not in skip] + ["random"]
        atlas.pruning = pruning_curves(model, probe, metric, orders=orders, random_seeds=(seed,), **common).table


def _pattern_view(model: Any, roles: pd.DataFrame, view_len: int, view_heads: list[str] | None, seed: int) -> dict:
    from interp.sinks import token_texts

    probe = repeated_tokens(model, batch=1, block_len=view_len, n_repeats=2, seed=seed + 1)
    ids = probe.tokens[0]
    patterns = attention_patterns(model, ids).numpy()
    names = token_texts(model, probe, sorted(set(ids.tolist())))
    labels = set(roles["label"])
    if view_heads:
        bad = [h for h in view_heads if h not in labels]
        if bad:
            raise UsageError(
                f"no head {', '.join(bad)} in this model: heads are LAYER.HEAD, e.g. {roles['label'].iloc[-1]}"
            )
        selected = list(dict.fromkeys(view_heads))
    else:
        selected = []
        for col in ROLES:
            if col in roles and roles[col].notna().any():
                best = roles.sort_values([col, "layer", "head"], ascending=[False, True, True], kind="mergesort")
                selected.append(best["label"].iloc[0])
        selected = list(dict.fromkeys(selected))
    return {
        "tokens": [names[int(t)] for t in ids.tolist()],
        "patterns": np.round(patterns, 3),
        "selected": selected,
        "probe": probe.meta,
    }
