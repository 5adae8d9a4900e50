"""Voita et al.'s Hard-Concrete head gates with an L0 penalty."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

import interp.distributed as distributed
from interp._io import atomic_write, atomic_write_json
from interp.ablation.gradient import frozen, gated_forward
from interp.ablation.metrics import Metric, as_metric
from interp.ablation.modes import HeadAblation, as_ablation
from interp.ablation.replay import REPLAYS, Sweeper
from interp.ablation.settings import checked
from interp.ablation.sweep import scores_meta
from interp.adapters import HookedModel
from interp.config import RunConfig
from interp.errors import AblationError
from interp.journal import Journal
from interp.models import describe
from interp.probes import TokenProbe
from interp.progress import tqdm
from interp.results import Shown, file_frame, memory_frame
from interp.scores import HeadScores

if TYPE_CHECKING:
    import plotly.graph_objects as go

# Voita et al. 2019 (after Louizos et al. 2018): Hard-Concrete temperature and stretch interval.
GATE_TEMPERATURE = 0.33
GATE_STRETCH = (-0.1, 1.1)


def gate_sample(log_alpha: Tensor, shape: Sequence[int], generator: torch.Generator | None = None) -> Tensor:
    """A stochastic Hard-Concrete gate in [0, 1] per head, for every leading index in ``shape``."""
    lo, hi = GATE_STRETCH
    u = torch.rand(*shape, *log_alpha.shape, generator=generator).clamp(1e-6, 1 - 1e-6).to(log_alpha.device)
    s = torch.sigmoid((u.log() - (1 - u).log() + log_alpha) / GATE_TEMPERATURE)
    return (s * (hi - lo) + lo).clamp(0, 1)


def gate_open_probability(log_alpha: Tensor) -> Tensor:
    """``P(gate != 0)``, the summands of Voita et al.'s L_C penalty."""
    lo, hi = GATE_STRETCH
    return torch.sigmoid(log_alpha - GATE_TEMPERATURE * math.log(-lo / hi))


def gate_value(log_alpha: Tensor) -> Tensor:
    """The deterministic gate used at evaluation (before binarising)."""
    lo, hi = GATE_STRETCH
    return (torch.sigmoid(log_alpha) * (hi - lo) + lo).clamp(0, 1)


@dataclass(repr=False)
class GateSweep(Shown):
    """Gates trained for each lambda: ``summary`` a row per lambda, ``gates`` a row per (lambda, head)."""

    summary: pd.DataFrame
    gates: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def kept(self, lam: float) -> list[str]:
        part = self.gates[(self.gates["lambda"] == lam) & self.gates["kept"]]
        return part["label"].tolist()

    @property
    def table(self) -> pd.DataFrame:
        """The tidy per-head table: a row per (lambda, layer, head) with its gate and whether it is kept."""
        return self.gates

    def grids(self) -> HeadScores:
        """The binarised-before gate values as one HeadScores column per lambda (for a heatmap)."""
        grids = {}
        for lam, part in self.gates.groupby("lambda", sort=True):
            grid = np.zeros((int(part["layer"].max()) + 1, int(part["head"].max()) + 1))
            grid[part["layer"], part["head"]] = part["gate"]
            grids[f"lambda={lam:g}"] = grid
        return HeadScores.from_grids(grids, self.meta)

    def grid(self, lam: float | str) -> np.ndarray:
        """The ``[n_layers, n_heads]`` gate values trained with one lambda (``0.1`` or ``"lambda=0.1"``)."""
        return self.grids().grid(lam if isinstance(lam, str) else f"lambda={lam:g}")

    def save(
        self, out_dir: str | Path, stem: str = "gates", *, meta: dict[str, Any] | None = None, overwrite: bool = False
    ) -> list[Path]:
        """Write ``<stem>.csv`` (a row per lambda), ``<stem>_heads.csv`` (a row per lambda and head)
        and ``<stem>.json`` (``meta``, updated with ``meta``, and both tables), each atomically."""
        from interp.saving import claim, provenance

        names = [f"{stem}.csv", f"{stem}_heads.csv", f"{stem}.json"]
        csv, heads, js = claim(Path(out_dir), names, overwrite=overwrite)
        return [
            atomic_write(csv, self.summary.to_csv(index=False)),
            atomic_write(heads, file_frame(self.gates).to_csv(index=False)),
            atomic_write_json(
                js,
                {
                    "kind": "gates",
                    **provenance(),
                    "probe": self.meta.get("probe"),
                    "baselines": None,
                    "meta": {**self.meta, **(meta or {})},
                    "summary": self.summary.to_dict(orient="records"),
                    "gates": self.gates.to_dict(orient="records"),
                },
            ),
        ]

    def figure(self, which: Literal["gates", "curves"] = "gates") -> go.Figure:
        """``"gates"``: a heatmap of the gates per lambda (0..1); ``"curves"``: heads kept against
        lambda beside the metric against heads kept."""
        from interp.plots import Scale, heatmap, short_name

        if which == "curves":
            return _gate_curves(self.summary, self.meta.get("metric", "metric"))
        if which != "gates":
            raise AblationError(f"a gate sweep draws 'gates' or 'curves', not which={which!r}", params="which")
        return heatmap(
            self.grids(),
            title=f"{short_name(self.meta.get('model', 'model'))}: Hard-Concrete gates per lambda",
            scale=Scale("gate", "Viridis", 0, 1),
        )

    @classmethod
    def load(cls, path: str | Path, stem: str = "gates") -> GateSweep:
        """Read back what :meth:`save` wrote: its ``.json``, or the folder (then ``<stem>.json``)."""
        path = Path(path)
        path = path / f"{stem}.json" if path.is_dir() else path
        if not path.is_file():
            raise AblationError(f"no saved gate sweep at {path}: pass the .json that save() wrote")
        blob = json.loads(path.read_text(encoding="utf-8"))
        gates = memory_frame(pd.DataFrame.from_records(blob["gates"]))
        return cls(pd.DataFrame.from_records(blob["summary"]), gates, blob["meta"])


def _gate_curves(summary: pd.DataFrame, metric: str) -> go.Figure:
    """Heads kept against lambda, and the metric against heads kept, side by side."""
    from plotly.subplots import make_subplots

    from interp.plots import curves, styled

    left = curves(summary, "lambda", "heads_kept")
    right = curves(summary.sort_values("heads_kept"), "heads_kept", "metric")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["heads kept vs lambda", f"{metric} vs heads kept"])
    fig.add_trace(left.data[0], row=1, col=1)
    fig.add_trace(right.data[0], row=1, col=2)
    fig.update_xaxes(type="log", title_text="lambda", row=1, col=1)
    fig.update_xaxes(title_text="heads kept", row=1, col=2)
    fig.update_yaxes(title_text="heads kept", row=1, col=1)
    fig.update_yaxes(title_text=metric, row=1, col=2)
    fig.update_layout(showlegend=False, height=460, width=980)
    fig.update_xaxes(tickformat="d", dtick=max(1, int(summary["heads_kept"].max() // 10) or 1), row=1, col=2)
    fig.update_yaxes(tickformat="d", row=1, col=1)
    return styled(fig)


# the columns of a gate sweep's summary (a row per lambda) and of its gates (a row per lambda and head)
SUMMARY_COLUMNS = ["lambda", "heads_kept", "metric", "degradation", "clean_metric", "l0_penalty"]
HEAD_COLUMNS = ["lambda", "layer", "head", "label", "log_alpha", "p_open", "gate", "kept"]


def validate_train_gates(*, lambdas: Sequence[float], steps: int = 200, replay: str = "auto") -> None:
    """Refuse options :func:`train_gates` cannot run with, before any model is touched."""
    checked(REPLAYS, replay)
    lambdas = [float(x) for x in lambdas]
    if not lambdas:
        raise AblationError("give at least one lambda (lambdas=)", params="lambdas")
    bad = [x for x in lambdas if not x >= 0 or not math.isfinite(x)]
    if bad:
        raise AblationError(f"lambda must be a finite number >= 0, got {bad[0]} (in lambdas=)", params="lambdas")
    if steps < 1:
        raise AblationError(f"steps must be >= 1, got steps={steps}", params="steps")


@dataclass(frozen=True)
class _GateTraining:
    """What training the gates for one lambda needs: the frozen model, the metric and the ablation,
    each minibatch's rows, tokens and unablated read-out, and the optimiser's settings."""

    model: HookedModel
    metric: Metric
    ablation: HeadAblation
    refs: list[tuple[Tensor, Tensor, Tensor]]
    steps: int
    lr: float
    init: float
    seed: int

    def log_alpha(self, lam: float, bar: Any) -> Tensor:
        """The gates' ``log_alpha`` after ``steps`` Adam steps at ``lam``, the samples' generator
        seeded afresh (a lambda trains the same whatever ran before it)."""
        info = describe(self.model)
        L, H = info.n_layers, info.n_heads
        gen = torch.Generator().manual_seed(self.seed)
        log_alpha = torch.full((L, H), self.init, device=self.refs[0][1].device, requires_grad=True)
        opt = torch.optim.Adam([log_alpha], lr=self.lr)
        none = torch.zeros(L, H, dtype=torch.bool)
        with frozen(self.model):
            for it in range(self.steps):
                rows, tokens, reference = self.refs[it % len(self.refs)]
                g = gate_sample(log_alpha, (tokens.shape[0],), gen)  # [batch, layer, head]
                gates = [g[:, l] for l in range(L)]
                value = gated_forward(self.model, tokens, self.metric, self.ablation, gates, none, rows, reference)
                loss = self.metric.badness(value).mean() + lam * gate_open_probability(log_alpha).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
                bar.update()
        return log_alpha.detach().cpu()


def train_gates(
    model: HookedModel,
    probe: TokenProbe,
    metric: Metric | Callable,
    lambdas: Iterable[float],
    *,
    ablation: str | HeadAblation = "zero",
    steps: int = 200,
    lr: float = 0.05,
    init: float = 3.0,
    replay: str = "auto",
    config: RunConfig | None = None,
    journal: Journal | None = None,
) -> GateSweep:
    """Train Voita et al.'s input-independent Hard-Concrete head gates, once per lambda.

    Every head's output is mixed as ``r + g (z - r)`` (``r`` the ablated value, 0 for zero
    ablation), ``g`` a Hard-Concrete gate (temperature 0.33, stretch (-0.1, 1.1)) with one learnt
    ``log_alpha`` per head and a fresh sample per sequence. The loss is the metric's loss (mean over
    sequences) plus ``lambda * L_C``, ``L_C = sum_h P(g_h != 0)``; only the gates train (Adam,
    ``lr``, ``steps`` steps over the probe's minibatches), the model is frozen. At evaluation a head
    is kept when its deterministic gate exceeds 0.5, and the metric is measured with the other heads
    ablated (evaluated by ``replay``, one of :data:`~interp.ablation.replay.REPLAYS`). ``config``
    (its ``minibatch``, ``seed`` of the gate samples and a resample ablation, ``progress``) sets the
    run. On Ctrl-C the lambdas finished are returned (``meta["partial"] = True``).

    ``journal`` (an opened :class:`~interp.journal.Journal`): each lambda finished is recorded there
    (its summary row and its per-head rows); a resumed run takes the lambdas recorded from it and
    trains only the others. The gate samples' generator is seeded afresh for every lambda, so a
    lambda trained after others were skipped is trained exactly as in an uninterrupted run.
    """
    lambdas = [float(x) for x in lambdas]
    validate_train_gates(lambdas=lambdas, steps=steps, replay=replay)
    config = RunConfig.of(config)
    metric = as_metric(metric)
    abl = as_ablation(ablation, model, probe, seed=config.seed, minibatch=config.minibatch)
    # the binarised gates are evaluated by the replay, without progress bars of its own
    sweeper = Sweeper(model, probe, metric, ablation=abl, replay=replay, config=RunConfig(minibatch=config.minibatch))
    clean = float(sweeper.unpatched.mean())
    training = _GateTraining(
        model, metric, abl, [(b.rows, b.tokens, b.reference) for b in sweeper.batches], steps, lr, init, config.seed
    )
    summary, per_head = [], []
    partial = False
    found = distributed.from_main(journal.done, "reading the journal") if journal is not None else {}
    n_found = sum(lam in found for lam in lambdas)
    sizes = f"{len(lambdas)} lambda(s) x {steps} steps, each a forward and backward of up to "
    sizes += f"{sweeper.minibatch} x {probe.seq_len} tokens" + (
        f"; {n_found} lambda(s) already in the journal" if found else ""
    )
    shown = config.progress and distributed.is_main()
    bar = tqdm(total=len(lambdas) * steps, desc="gates", unit="step", disable=not shown, sizes=sizes)
    if journal is not None:
        journal.resumed(n_found, len(lambdas), "lambdas of the gate sweep")
    try:
        for lam in lambdas:
            if lam in found:
                summary.append(found[lam]["summary"])
                per_head.extend(found[lam]["heads"])
                bar.update(steps)
                continue
            row, heads = _binarised(lam, training.log_alpha(lam, bar), sweeper, clean)
            summary.append(row)
            per_head.extend(heads)
            if journal is not None:
                journal.append(lam, {"summary": row, "heads": heads})
    except KeyboardInterrupt:
        partial = True
    finally:
        bar.close()
    meta = scores_meta(model, probe, metric, abl, method="gates", clean_metric=clean, steps=steps, lr=lr, init=init)
    meta.update(temperature=GATE_TEMPERATURE, stretch=list(GATE_STRETCH), partial=partial)
    return GateSweep(pd.DataFrame(summary, columns=SUMMARY_COLUMNS), pd.DataFrame(per_head, columns=HEAD_COLUMNS), meta)


def _binarised(lam: float, la: Tensor, sweeper: Sweeper, clean: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Gates trained at ``lam`` (``log_alpha`` ``la``) binarised, the metric measured with the heads
    they drop ablated: the lambda's summary row and its per-head rows. A Ctrl-C in the evaluation
    raises :class:`KeyboardInterrupt`."""
    gate, p_open = gate_value(la), gate_open_probability(la)
    kept = gate > 0.5
    dropped = ~kept
    v = float(sweeper.evaluate(dropped[None]).mean()) if bool(dropped.any()) else clean
    if sweeper.interrupted:
        raise KeyboardInterrupt
    row = dict(
        **{"lambda": lam},
        heads_kept=int(kept.sum()),
        metric=v,
        degradation=float(sweeper.metric.degradation(v, clean)),
        clean_metric=clean,
        l0_penalty=float(p_open.sum()),
    )
    L, H = la.shape
    heads = [
        {
            "lambda": lam,
            "layer": l,
            "head": h,
            "label": f"{l}.{h}",
            "log_alpha": float(la[l, h]),
            "p_open": float(p_open[l, h]),
            "gate": float(gate[l, h]),
            "kept": bool(kept[l, h]),
        }
        for l in range(L)
        for h in range(H)
    ]
    return row, heads


def largest_lambda_within(sweep: GateSweep, tolerance: float = 0.1) -> float | None:
    """The largest lambda whose binarised gates keep the metric within ``tolerance`` of unpruned."""
    ok = sweep.summary[sweep.summary["degradation"] <= tolerance]
    return float(ok["lambda"].max()) if len(ok) else None
