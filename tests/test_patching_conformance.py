"""Exact activation patching equals a plain loop on the Hugging Face model itself, on every family of
the conformance suite (tests/conformance.py), per head and per position, in both directions.

The reference never goes through interp: it captures the input of each layer's attention output
projection on the donor prompts (a forward pre-hook), then runs the Hugging Face model once per
patch with that head's slice (at that position) of the projection's input taken from the donor.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from interp.models import from_hf_model
from interp.patching import patch_heads
from interp.probes.task import TaskProbe
from tests.conformance import FAMILIES, N_HEADS, _n_heads, _proj_in_features, _submodule, build

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL = 1e-5
N_PAIRS, BODY = 2, 6


def family_task(model: Any, causal: bool, seed: int = 0) -> TaskProbe:
    """Pairs of random ids that differ in two body positions; the metric reads the last body token."""
    gen = torch.Generator().manual_seed(seed)
    clean, corrupted = [], []
    for _ in range(N_PAIRS):
        ids = (torch.randperm(200, generator=gen)[: BODY + 2] + 10).tolist()
        c = ids[:BODY]
        k = list(c)
        k[1], k[3] = ids[BODY], ids[BODY + 1]
        clean.append(c)
        corrupted.append(k)
    return TaskProbe.from_pairs(model, clean, corrupted, [5] * N_PAIRS, [[7, 8]] * N_PAIRS, name="pairs")


def hf_patch_loop(hf: Any, family: Any, task: TaskProbe, direction: str, by: str) -> torch.Tensor:
    """The raw logit difference (answer minus the wrong answers' mean) per (layer, head[, position]),
    averaged over pairs, by one Hugging Face forward per patch."""
    run, donor = (task.corrupted, task.clean) if direction == "denoise" else (task.clean, task.corrupted)
    L = family.n_layers
    projs = {
        l: _submodule(_submodule(hf, family.attn_path.format(l=l)), family.o_proj) for l in family.attention_layers
    }
    d = _proj_in_features(projs[family.attention_layers[0]]) // _n_heads(hf.config)
    kept: dict[int, torch.Tensor] = {}
    handles = [
        p.register_forward_pre_hook(lambda m, a, l=l: kept.__setitem__(l, a[0].detach().clone()))
        for l, p in projs.items()
    ]
    with torch.no_grad():
        hf(donor)
    for h in handles:
        h.remove()
    pos = task.read_position
    T = run.shape[1]

    def metric(logits: torch.Tensor) -> float:
        last = logits[:, pos].float()
        wrong = last[:, task.wrong[0]].mean(-1)
        return float((last[:, int(task.answer[0, 0])] - wrong).mean())

    out = torch.full((L, N_HEADS, *([T] if by == "position" else [])), float("nan"))
    for l, proj in projs.items():
        for head in range(N_HEADS):
            for p in range(T) if by == "position" else [None]:

                def swap(module: Any, args: tuple, l: int = l, head: int = head, p: int | None = p) -> tuple:
                    x = args[0].clone()
                    cols = slice(head * d, (head + 1) * d)
                    rows = slice(None) if p is None else slice(p, p + 1)
                    x[:, rows, cols] = kept[l][:, rows, cols]
                    return (x, *args[1:])

                handle = proj.register_forward_pre_hook(swap)
                try:
                    with torch.no_grad():
                        value = metric(hf(run).logits)
                finally:
                    handle.remove()
                out[(l, head) if p is None else (l, head, p)] = value
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_exact_patching_equals_the_hugging_face_loop(family):
    fam = FAMILIES[family]
    ref, _ = build(fam, 0)
    hf, tokenizer = build(fam, 0)
    model = from_hf_model(hf, tokenizer, name=family)
    task = family_task(model, not fam.is_encoder)
    layers = list(fam.attention_layers)
    for by in ("head", "position"):
        for direction in ("denoise", "noise"):
            got = torch.as_tensor(
                patch_heads(model, task, direction=direction, by=by, metric="raw-logit-diff").grid("metric_patched")
            ).float()
            want = hf_patch_loop(ref, fam, task, direction, by)
            if by == "position" and not fam.is_encoder:  # after the read position: 0 change, not run
                after = slice(task.read_position + 1, None)
                want[..., after] = got[..., after]
            err = float((got[layers] - want[layers]).abs().max())
            spread = float((want[layers] - want[layers].mean()).abs().max())
            assert err <= TOL, f"{family} {direction} by {by}: max error {err:.2e}"
            assert spread > 100 * TOL, f"{family} {direction} by {by}: the patches do not differ ({spread:.2e})"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_attributions_baselines_are_the_hugging_face_models_own(family):
    """Attribution reads the clean and corrupted metric off its own passes, unembedding the read
    position alone where that gives the model's own logits (Gemma 2's final softcap, BERT's
    masked-LM head included): both equal the Hugging Face model's forward."""
    fam = FAMILIES[family]
    hf, tokenizer = build(fam, 0)
    model = from_hf_model(hf, tokenizer, name=family)
    task = family_task(model, not fam.is_encoder)
    got = patch_heads(model, task, method="attribution", metric="raw-logit-diff").meta
    pos = task.read_position
    for prompts, key in ((task.clean, "clean_metric"), (task.corrupted, "corrupted_metric")):
        with torch.no_grad():
            last = hf(prompts).logits[:, pos].float()
        want = float((last[:, 5] - last[:, [7, 8]].mean(-1)).mean())
        assert abs(got[key] - want) <= TOL, f"{family} {key}: {got[key]} against {want}"
    assert got["unembedded"] == f"positions [{pos}]", f"{family}: {got['unembedded']}"
