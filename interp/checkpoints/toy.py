"""The phase change on the toy, offline: train it from scratch, saving a checkpoint every few steps.

``toy-training`` (the model name the command takes) trains a small attention-only toy on the
bundled trainer's task (:mod:`interp.toy.train`: BOS, then a block of random tokens tiled to the
end) from a fixed seed on the CPU, and saves the model every ``every`` steps as a toy checkpoint
folder ``step<N>`` that :func:`interp.models.load_model` loads. The sweep then runs over those
folders like over any others. The settings below grow the induction heads within a few hundred
steps: a 96-token context and a 128-token vocabulary keep each step cheap, at the bundled toy's
width, head size and learning rate.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from interp._io import atomic_write
from interp.checkpoints.sources import Revision
from interp.errors import UsageError
from interp.toy import ToyConfig, ToyTransformer
from interp.toy.train import TOY, TrainConfig, train

NAME = "toy-training"
PHASE_MODEL = replace(TOY, n_ctx=96, d_vocab=128)
PHASE_TRAIN = TrainConfig(
    seed=0, steps=600, batch_size=16, seq_len=96, min_period=8, max_period=40, probe_half=20, eval_every=100
)
DONE = "training.json"


@dataclass(frozen=True)
class ToyTraining:
    """What ``toy-training`` trains: the model shape, the trainer's settings, and the checkpoint stride."""

    model: ToyConfig = field(default_factory=lambda: replace(PHASE_MODEL))
    train: TrainConfig = field(default_factory=lambda: replace(PHASE_TRAIN))
    every: int = 10

    def steps(self) -> list[int]:
        return sorted({*range(0, self.train.steps + 1, self.every), self.train.steps})

    def as_dict(self) -> dict:
        return {"model": self.model.to_dict(), "train": asdict(self.train), "every": self.every}


def trained(folder: str | Path, plan: ToyTraining | None = None) -> bool:
    """Does ``folder`` hold this ``plan``'s finished training (its ``training.json`` and every
    checkpoint)? :func:`train_checkpoints` then reuses it instead of training again."""
    plan, folder = plan or ToyTraining(), Path(folder)
    done = folder / DONE
    if not done.is_file() or json.loads(done.read_text()).get("plan") != json.loads(json.dumps(plan.as_dict())):
        return False
    return all((folder / f"step{s}" / "model.safetensors").is_file() for s in plan.steps())


def train_checkpoints(folder: str | Path, plan: ToyTraining | None = None, *, progress: bool = False) -> list[Revision]:
    """Train the toy as ``plan`` says and save ``folder/step<N>`` every ``plan.every`` steps; the
    revisions, in step order. A folder already holding this plan's finished training is reused
    (:func:`trained`). Step folders of another schedule (an earlier run with other steps or another
    stride) are removed first: ``folder/step*`` is always this plan's checkpoints and no others."""
    plan = plan or ToyTraining()
    if plan.every < 1:
        raise UsageError(f"checkpoints every {plan.every} steps: it must be at least 1")
    folder = Path(folder)
    steps = plan.steps()
    revisions = [Revision(f"step{s}", s, str(folder / f"step{s}")) for s in steps]
    wanted = set(steps)
    for old in folder.glob("step*"):
        if old.is_dir() and re.fullmatch(r"step\d+", old.name) and int(old.name[4:]) not in wanted:
            shutil.rmtree(old)
    if trained(folder, plan):
        return revisions

    def save(step: int, model: ToyTransformer) -> None:
        if step in wanted:
            model.save_pretrained(folder / f"step{step}")

    threads = torch.get_num_threads()
    model, history = train(plan.model, plan.train, progress=progress, on_step=save)
    done = folder / DONE
    atomic_write(done, json.dumps({"plan": plan.as_dict(), "threads": threads, "history": history}, indent=1) + "\n")
    return revisions
