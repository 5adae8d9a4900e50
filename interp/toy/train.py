"""Grow induction heads: `python -m interp.toy.train`.

A 2-layer attention-only toy is trained on sequences that repeat a block of random tokens with a
random period (BOS, then the block tiled to the end), so the next token can only be predicted by
content -- find the previous occurrence of the current token and copy what came after it -- and
not by position. The classic two-head circuit appears: a layer-0 previous-token head and a layer-1
induction head that attends to the token after the current token's earlier occurrence.

Logged over steps: the in-context loss (loss on tokens whose whole context is a repeat, i.e.
predictable by induction) and the best induction score on a fixed probe (BOS + 50 random tokens
+ the same 50 again): the mean attention from each second-repeat query to the position right
after its token's earlier occurrence, read straight from the pattern. The phase change -- the
in-context loss falling off a cliff while the induction score jumps -- shows in the log and in
`training.html` (and `training.png` when a plotly image exporter works).

Writes into data/toy/ (or --out): model.safetensors + config.json, card.json (configs, seed, steps,
final losses, the induction and previous-token heads with their scores), and the plot. Training is
deterministic for a seed (one torch thread by default, so the thread count cannot change the sums).
While training, the flash path runs on torch's fused SDPA kernel, the fastest on a CPU; the saved
model uses the default path choice. Recipe notes, from a handful of CPU runs: with d_head 16 or a
normal-initialised position table the induction heads formed much later or not within budget;
d_head 32, sinusoid-initialised (still learned) positions and no weight decay grew them in ~1,500
steps.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm import tqdm

from interp._io import atomic_write
from interp.hooks import pattern_hook, z_hook
from interp.toy import ToyConfig, ToyTransformer, toy_dir

# Small enough for a CPU, d_head large enough to tell 511 tokens apart, n_ctx fitting 2 x 100 + BOS.
TOY = ToyConfig(n_layers=2, d_model=64, n_heads=4, d_head=32, n_ctx=256, d_vocab=512, attn_only=True)


@dataclass
class TrainConfig:
    seed: int = 0
    steps: int = 2500
    batch_size: int = 16
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 30
    final_lr_fraction: float = 0.5  # cosine decay from lr to lr * this
    grad_clip: float = 1.0
    seq_len: int | None = None  # training sequence length; None: the model's n_ctx
    min_period: int = 20  # periods 20..100 cover the probe's 50 (the bundled toy was grown so)
    max_period: int = 100
    probe_half: int = 50  # the probe: BOS + probe_half random tokens + the same again
    probe_batch: int = 32
    eval_every: int = 100
    flash_impl: str = "sdpa"  # attention kernel while training (torch's fused one is fastest on CPU)
    induction_threshold: float = 0.5  # card lists heads scoring above this
    prev_token_threshold: float = 0.5


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def repeated_blocks(
    batch: int,
    n_ctx: int,
    d_vocab: int,
    min_period: int,
    max_period: int,
    generator: torch.Generator,
    bos: int = 0,
) -> tuple[Int[Tensor, "batch n_ctx"], Int[Tensor, " batch"]]:
    """BOS, then a block of `period` random tokens (1..d_vocab-1) tiled to length n_ctx.

    Returns (tokens, period per sequence); period ~ uniform on [min_period, max_period].
    """
    periods = torch.randint(min_period, max_period + 1, (batch,), generator=generator)
    blocks = torch.randint(1, d_vocab, (batch, max_period), generator=generator)
    where_in_block = torch.arange(n_ctx - 1)[None, :] % periods[:, None]
    tokens = torch.cat([torch.full((batch, 1), bos), blocks.gather(1, where_in_block)], dim=1)
    return tokens, periods


def induction_targets(periods: Int[Tensor, " batch"], n_ctx: int) -> Bool[Tensor, "batch n_ctx_minus_1"]:
    """Which next-token predictions (index i predicts token i + 1) induction can make.

    Token t (t >= 1) repeats token t - period once t > period; induction predicts it from the token
    before it, whose earlier occurrence needs t - 1 > period. So: i + 1 >= period + 2.
    """
    i = torch.arange(n_ctx - 1)[None, :]
    return i >= periods[:, None] + 1


def induction_probe(
    batch: int, half: int, d_vocab: int, generator: torch.Generator, bos: int = 0
) -> Int[Tensor, "batch pos"]:
    """BOS + `half` random tokens (1..d_vocab-1) + the same tokens again: [batch, 1 + 2 * half]."""
    first = torch.randint(1, d_vocab, (batch, half), generator=generator)
    return torch.cat([torch.full((batch, 1), bos), first, first], dim=1)


# ---------------------------------------------------------------------------------------------
# scores read from the pattern
# ---------------------------------------------------------------------------------------------


def circuit_scores(
    model: ToyTransformer, probe: Int[Tensor, "batch pos"], half: int
) -> dict[str, Float[Tensor, "layer head"]]:
    """Induction and previous-token scores of every head on a repeated-token probe.

    induction: mean attention from each second-repeat query i (tokens 1+half .. 2*half) to
    i - half + 1, the position right after the earlier occurrence of its token.
    previous_token: mean attention from each position i >= 1 to i - 1.
    """
    patterns: dict[str, Tensor] = {}

    def keep(pattern: Tensor, hook) -> None:
        patterns[hook.name] = pattern.detach()

    hooks = [(pattern_hook(layer), keep) for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        model.run_with_hooks(probe, return_type=None, fwd_hooks=hooks)
    pattern = torch.stack([patterns[name] for name, _ in hooks]).float()  # layer batch head q k
    queries = torch.arange(1 + half, 1 + 2 * half)
    induction = pattern[:, :, :, queries, queries - half + 1].mean(dim=(1, 3))
    positions = torch.arange(1, probe.shape[1])
    previous = pattern[:, :, :, positions, positions - 1].mean(dim=(1, 3))
    return {"induction": induction, "previous_token": previous}


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup, then cosine decay to lr * final_lr_fraction."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    progress = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    floor = tc.final_lr_fraction
    return tc.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def evaluate(model: ToyTransformer, cfg: ToyConfig, tc: TrainConfig, generator: torch.Generator) -> dict:
    """Losses on held-out repeated-block data, split by predictable-by-induction or not."""
    seq_len = tc.seq_len or cfg.n_ctx
    tokens, periods = repeated_blocks(
        tc.probe_batch, seq_len, cfg.d_vocab, tc.min_period, tc.max_period, generator, cfg.bos_token_id
    )
    with torch.no_grad():
        loss = model(tokens, return_type="loss", loss_per_token=True)
    in_context = induction_targets(periods, seq_len)
    return {
        "loss": loss.mean().item(),
        "in_context_loss": loss[in_context].mean().item(),
        "first_occurrence_loss": loss[~in_context].mean().item(),
    }


OnStep = Callable[[int, ToyTransformer], None]


def train(
    cfg: ToyConfig, tc: TrainConfig, progress: bool = True, on_step: OnStep | None = None
) -> tuple[ToyTransformer, list[dict]]:
    """Train from scratch; returns the model (eval mode) and the evaluation history.

    ``on_step(step, model)``, when given, sees the model after ``step`` updates (0 .. steps), in eval
    mode with the saved model's attention path, before the next update: the hook for checkpoints.
    """
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return _train(cfg, tc, progress, on_step)
    finally:
        torch.use_deterministic_algorithms(deterministic)


def _train(
    cfg: ToyConfig, tc: TrainConfig, progress: bool, on_step: OnStep | None = None
) -> tuple[ToyTransformer, list[dict]]:
    torch.manual_seed(tc.seed)
    model = ToyTransformer(replace(cfg)).train().set_flash_impl(tc.flash_impl)
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(0.9, 0.98), weight_decay=tc.weight_decay)
    data = torch.Generator().manual_seed(tc.seed + 1)
    probe = induction_probe(tc.probe_batch, tc.probe_half, cfg.d_vocab, torch.Generator().manual_seed(tc.seed + 2))

    history: list[dict] = []
    tqdm.write(f"the training log scores induction on its own probe: {probe_text(tc, tc.seed + 2)}")
    bar = tqdm(range(tc.steps + 1), disable=not progress, desc="training the toy")
    for step in bar:
        if step % tc.eval_every == 0 or step == tc.steps:
            model.eval()
            scores = circuit_scores(model, probe, tc.probe_half)
            row = {"step": step, **evaluate(model, cfg, tc, torch.Generator().manual_seed(tc.seed + 3))}
            row["best_induction_score"] = scores["induction"].max().item()
            row["best_previous_token_score"] = scores["previous_token"].max().item()
            history.append(row)
            tqdm.write(
                f"step {step:5d}  loss {row['loss']:.3f}  in-context loss {row['in_context_loss']:.3f}  "
                f"best induction score {row['best_induction_score']:.3f}  "
                f"best prev-token score {row['best_previous_token_score']:.3f}"
            )
            model.train()
        if on_step is not None:
            model.eval().set_flash_impl(cfg.flash_impl)
            on_step(step, model)
            model.train().set_flash_impl(tc.flash_impl)
        if step == tc.steps:
            break
        tokens, _ = repeated_blocks(
            tc.batch_size, tc.seq_len or cfg.n_ctx, cfg.d_vocab, tc.min_period, tc.max_period, data, cfg.bos_token_id
        )
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, tc)
        loss = model(tokens, return_type="loss")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    return model.set_flash_impl(cfg.flash_impl).eval(), history


# ---------------------------------------------------------------------------------------------
# outputs: checkpoint, card, plot
# ---------------------------------------------------------------------------------------------


def head_table(scores: Float[Tensor, "layer head"], threshold: float) -> list[dict]:
    """Heads scoring above `threshold`, best first (the single best head if none does)."""
    rows = [
        {"layer": layer, "head": head, "score": round(scores[layer, head].item(), 4)}
        for layer in range(scores.shape[0])
        for head in range(scores.shape[1])
    ]
    rows.sort(key=lambda r: -r["score"])
    return [r for r in rows if r["score"] > threshold] or rows[:1]


def second_repeat_loss(
    model: ToyTransformer, probe: Int[Tensor, "batch pos"], half: int, silence: tuple[int, int] | None = None
) -> float:
    """Mean loss on the probe's second-repeat tokens that induction can predict (2nd .. last).

    silence=(layer, head) zeroes that head's hook_z first.
    """
    hooks = []
    if silence is not None:
        layer, head = silence

        def zero_head(z: Tensor, hook) -> Tensor:
            z = z.clone()
            z[:, :, head] = 0.0
            return z

        hooks = [(z_hook(layer), zero_head)]
    with torch.no_grad():
        loss = model.run_with_hooks(probe, return_type="loss", loss_per_token=True, fwd_hooks=hooks)
    return loss[:, half + 1 :].mean().item()  # index i predicts token i + 1


def probe_text(tc: TrainConfig, seed: int) -> str:
    """The trainer's induction probe (its log's "best induction score"), sizes and seed."""
    return f"BOS + {tc.probe_half} random tokens + the same again, batch {tc.probe_batch}, seed {seed}"


def make_card(model: ToyTransformer, tc: TrainConfig, history: list[dict], seconds: float, probe_seed: int) -> dict:
    cfg = model.cfg
    probe = induction_probe(tc.probe_batch, tc.probe_half, cfg.d_vocab, torch.Generator().manual_seed(probe_seed))
    scores = circuit_scores(model, probe, tc.probe_half)
    phase_change = next((r["step"] for r in history if r["best_induction_score"] > tc.induction_threshold), None)
    induction_heads = head_table(scores["induction"], tc.induction_threshold)
    top = (induction_heads[0]["layer"], induction_heads[0]["head"])
    clean, ablated = (
        second_repeat_loss(model, probe, tc.probe_half),
        second_repeat_loss(model, probe, tc.probe_half, top),
    )
    return {
        "model": "interp toy: attention-only induction model",
        "config": cfg.to_dict(),
        "train": asdict(tc),
        "seed": tc.seed,
        "steps": tc.steps,
        "train_seconds": round(seconds, 1),
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "data": (
            f"BOS + a block of period ~ U[{tc.min_period}, {tc.max_period}] random tokens (1..{cfg.d_vocab - 1}) "
            f"tiled to {cfg.n_ctx} tokens"
        ),
        "final": {k: round(v, 4) for k, v in history[-1].items() if k != "step"},
        "probe": probe_text(tc, probe_seed),
        "induction_heads": induction_heads,
        "previous_token_heads": head_table(scores["previous_token"], tc.prev_token_threshold),
        "scores": {name: [[round(x, 4) for x in row] for row in s.tolist()] for name, s in scores.items()},
        "ablation": {
            "head": {"layer": top[0], "head": top[1]},
            "second_repeat_loss": round(clean, 4),
            "second_repeat_loss_head_zeroed": round(ablated, 4),
            "ratio": round(ablated / clean, 2),
        },
        "phase_change_step": phase_change,
        "history": history,
    }


def plot_history(history: list[dict], directory: Path) -> list[Path]:
    """training.html always (plotly from a CDN, to stay small); training.png if export works."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from interp.plots import save_png

    steps = [r["step"] for r in history]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=steps, y=[r["in_context_loss"] for r in history], name="in-context loss"))
    fig.add_trace(go.Scatter(x=steps, y=[r["loss"] for r in history], name="loss (all tokens)", line={"dash": "dot"}))
    fig.add_trace(
        go.Scatter(x=steps, y=[r["best_induction_score"] for r in history], name="best induction score"),
        secondary_y=True,
    )
    fig.add_trace(
        go.Scatter(x=steps, y=[r["best_previous_token_score"] for r in history], name="best prev-token score"),
        secondary_y=True,
    )
    fig.update_layout(title="Induction heads forming in the toy: the phase change", xaxis_title="step")
    fig.update_yaxes(title_text="loss (nats)", secondary_y=False)
    fig.update_yaxes(title_text="attention score", range=[0, 1], secondary_y=True)

    written = [directory / "training.html"]
    atomic_write(written[0], fig.to_html(include_plotlyjs=True, full_html=True))  # offline, like every page
    fig.update_layout(width=900, height=500)
    png = save_png(fig, directory / "training.png")  # through a Chrome/Chromium, when one is found
    return written + ([png] if png else [])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--lr", type=float, default=TrainConfig.lr)
    parser.add_argument("--d-model", type=int, default=TOY.d_model)
    parser.add_argument("--n-heads", type=int, default=TOY.n_heads)
    parser.add_argument("--d-head", type=int, default=TOY.d_head)
    parser.add_argument("--d-vocab", type=int, default=TOY.d_vocab)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: no thread-order noise in the sums). Retraining need not reproduce\n"
        "the bundled checkpoint bit for bit: a retrain with the card's settings came out up to 0.15\n"
        "per weight apart from it",
    )
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: data/toy)")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar (the log lines stay)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    cfg = replace(TOY, d_model=args.d_model, n_heads=args.n_heads, d_head=args.d_head, d_vocab=args.d_vocab)
    tc = TrainConfig(seed=args.seed, steps=args.steps, batch_size=args.batch_size, lr=args.lr)
    out = args.out or toy_dir()
    out.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    model, history = train(cfg, tc, progress=not args.no_progress)
    seconds = time.perf_counter() - start
    model.save_pretrained(out)
    card = make_card(model, tc, history, seconds, probe_seed=tc.seed + 1000)
    atomic_write(out / "card.json", json.dumps(card, indent=1) + "\n")
    written = plot_history(history, out)

    ind, prev, ablation = card["induction_heads"][0], card["previous_token_heads"][0], card["ablation"]
    print(f"trained in {seconds:.0f} s; final in-context loss {card['final']['in_context_loss']:.3f}")
    print(f"top induction head L{ind['layer']}H{ind['head']} {ind['score']:.3f}; "
          f"top previous-token head L{prev['layer']}H{prev['head']} {prev['score']:.3f}; "
          f"zeroing the induction head multiplies the second-repeat loss by {ablation['ratio']:.1f}")  # fmt: skip
    print(
        "wrote",
        ", ".join(str(p) for p in [out / "model.safetensors", out / "config.json", out / "card.json", *written]),
    )


if __name__ == "__main__":
    main()
