"""interp: what does each attention head of a model do, and which heads matter?

One import for a notebook::

    import interp

    model = interp.load_model("toy")                      # or "gpt2", a local HF directory
    probe = interp.repeated_tokens(model, batch=10, block_len=50, seed=0)
    scores = interp.head_scores(model, probe)             # HeadScores: .table, .grid(name), .save(dir)
    interp.heatmap(scores, ["prev_token", "induction"]).show()

Names are imported on first use (``import interp`` itself loads neither torch nor the models), so
the package is cheap to import; ``interp.__all__`` lists the public API and where each name lives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from interp._lazy import lazy
from interp._version import __version__ as __version__

# public name -> the module that defines it
_API = {
    # models
    "load_model": "interp.models",
    "from_hf_model": "interp.models",
    "describe": "interp.models",
    "ModelInfo": "interp.models",
    # one run configuration for every analysis
    "RunConfig": "interp.config",
    # probes
    "TokenProbe": "interp.probes",
    "repeated_tokens": "interp.probes",
    "random_tokens": "interp.probes",
    "text_probe": "interp.probes",
    "TaskProbe": "interp.probes.task",
    "task_probe": "interp.probes.task",
    # head scores
    "head_scores": "interp.heads",
    "uniform_baseline": "interp.heads",
    "uniform_baselines": "interp.heads",
    "HeadScores": "interp.scores",
    # every saved result, read back by the one loader
    "load_result": "interp.results",
    # sinks
    "sink_scores": "interp.sinks",
    "SinkReport": "interp.sinks",
    # retrieval and streaming heads
    "retrieval_scores": "interp.retrieval",
    # what heads write and read
    "composition_scores": "interp.roles",
    "ov_scores": "interp.roles",
    "encoder_scores": "interp.roles",
    "head_map": "interp.roles",
    "logit_attribution": "interp.roles",
    "qk_attribution": "interp.roles",
    # ablation
    "ablated": "interp.ablation",
    "exact_sweep": "interp.ablation",
    "loop_sweep": "interp.ablation",
    "gradient_importance": "interp.ablation",
    "pruning_curve": "interp.ablation",
    "pruning_curves": "interp.ablation",
    "heads_prunable": "interp.ablation",
    "train_gates": "interp.ablation",
    "largest_lambda_within": "interp.ablation",
    "GateSweep": "interp.ablation",
    "PruningCurves": "interp.ablation",
    "WindowAblation": "interp.ablation",
    "incontext_loss": "interp.ablation",
    "lm_loss": "interp.ablation",
    "logit_diff": "interp.ablation",
    "Metric": "interp.ablation",
    "as_metric": "interp.ablation",
    # activation patching on a task
    "patch_heads": "interp.patching",
    "PatchScores": "interp.patching",
    # circuits: the graph of edges and their attribution scores
    "edge_scores": "interp.circuits",
    "EdgeScores": "interp.circuits",
    "Circuit": "interp.circuits",
    "FaithfulnessCurve": "interp.circuits",
    "faithfulness_curve": "interp.circuits",
    # heads over training
    "checkpoint_scores": "interp.checkpoints",
    "CheckpointScores": "interp.checkpoints",
    # figures and the atlas
    "heatmap": "interp.plots",
    "save_figure": "interp.plots",
    "save_png": "interp.plots",
    "view_patterns": "interp.report.patterns_view",
    "head_atlas": "interp.report",
    "atlas_sizes": "interp.report",
    "Atlas": "interp.report",
    "pattern_heatmap": "interp.report.pattern_figure",
    # errors
    "InterpError": "interp.errors",
}

__getattr__, __dir__, __all__ = lazy(__name__, _API)

if TYPE_CHECKING:  # what editors and type checkers see; at run time the names load on first use
    from interp.ablation import GateSweep as GateSweep
    from interp.ablation import Metric as Metric
    from interp.ablation import PruningCurves as PruningCurves
    from interp.ablation import WindowAblation as WindowAblation
    from interp.ablation import ablated as ablated
    from interp.ablation import as_metric as as_metric
    from interp.ablation import exact_sweep as exact_sweep
    from interp.ablation import gradient_importance as gradient_importance
    from interp.ablation import heads_prunable as heads_prunable
    from interp.ablation import incontext_loss as incontext_loss
    from interp.ablation import largest_lambda_within as largest_lambda_within
    from interp.ablation import lm_loss as lm_loss
    from interp.ablation import logit_diff as logit_diff
    from interp.ablation import loop_sweep as loop_sweep
    from interp.ablation import pruning_curve as pruning_curve
    from interp.ablation import pruning_curves as pruning_curves
    from interp.ablation import train_gates as train_gates
    from interp.checkpoints import CheckpointScores as CheckpointScores
    from interp.checkpoints import checkpoint_scores as checkpoint_scores
    from interp.circuits import Circuit as Circuit
    from interp.circuits import EdgeScores as EdgeScores
    from interp.circuits import FaithfulnessCurve as FaithfulnessCurve
    from interp.circuits import edge_scores as edge_scores
    from interp.circuits import faithfulness_curve as faithfulness_curve
    from interp.config import RunConfig as RunConfig
    from interp.errors import InterpError as InterpError
    from interp.heads import head_scores as head_scores
    from interp.heads import uniform_baseline as uniform_baseline
    from interp.heads import uniform_baselines as uniform_baselines
    from interp.models import ModelInfo as ModelInfo
    from interp.models import describe as describe
    from interp.models import from_hf_model as from_hf_model
    from interp.models import load_model as load_model
    from interp.patching import PatchScores as PatchScores
    from interp.patching import patch_heads as patch_heads
    from interp.plots import heatmap as heatmap
    from interp.plots import save_figure as save_figure
    from interp.plots import save_png as save_png
    from interp.probes import TokenProbe as TokenProbe
    from interp.probes import random_tokens as random_tokens
    from interp.probes import repeated_tokens as repeated_tokens
    from interp.probes import text_probe as text_probe
    from interp.probes.task import TaskProbe as TaskProbe
    from interp.probes.task import task_probe as task_probe
    from interp.report import Atlas as Atlas
    from interp.report import atlas_sizes as atlas_sizes
    from interp.report import head_atlas as head_atlas
    from interp.report.pattern_figure import pattern_heatmap as pattern_heatmap
    from interp.report.patterns_view import view_patterns as view_patterns
    from interp.results import load_result as load_result
    from interp.retrieval import retrieval_scores as retrieval_scores
    from interp.roles import composition_scores as composition_scores
    from interp.roles import encoder_scores as encoder_scores
    from interp.roles import head_map as head_map
    from interp.roles import logit_attribution as logit_attribution
    from interp.roles import ov_scores as ov_scores
    from interp.roles import qk_attribution as qk_attribution
    from interp.scores import HeadScores as HeadScores
    from interp.sinks import SinkReport as SinkReport
    from interp.sinks import sink_scores as sink_scores
