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

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_API = {
    # models
    "load_model": "interp.models",
    "from_hf_model": "interp.models",
    "describe": "interp.models",
    "ModelInfo": "interp.models",
    # probes
    "TokenProbe": "interp.probes",
    "repeated_tokens": "interp.probes",
    "random_tokens": "interp.probes",
    "text_probe": "interp.probes",
    # head scores
    "head_scores": "interp.heads",
    "uniform_baseline": "interp.heads",
    "HeadScores": "interp.scores",
    # sinks
    "sink_scores": "interp.sinks",
    "SinkReport": "interp.sinks",
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
    "incontext_loss": "interp.ablation",
    "lm_loss": "interp.ablation",
    "logit_diff": "interp.ablation",
    # figures and the atlas
    "heatmap": "interp.plots",
    "head_atlas": "interp.report",
    # errors
    "InterpError": "interp.errors",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'interp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
