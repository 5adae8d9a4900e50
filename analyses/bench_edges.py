"""Benchmark: edge attribution (EAP, EAP-IG) against EAP-IG and auto-circuit, on the same weights.

GPT-2 small's architecture with random weights (``GPT2Config()``, seed 0; ``--small``: 2 layers x 4
heads, d_model 64, same vocabulary), saved once with GPT-2's real tokenizer to a temporary folder that
every side loads: ours through ``interp.load_model`` (a TransformerLens 4 bridge), the peers into
TransformerLens 2.16's ``HookedTransformer`` by hand, offline (a ``HookedTransformerConfig`` built from
the folder's ``config.json``, since TransformerLens 2.16's own reader asks for ``GPT2Config.n_ctx``, which
transformers 5 dropped; the weights through TransformerLens's own GPT-2 conversion, unprocessed: the
settings of its ``from_pretrained_no_processing``). The last-position logits of every side are compared first.

The task: 50 IOI pairs (``--pairs``) of 15 tokens from ``interp``'s ``ioi`` generator (its template
"After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to": BOS + 14 tokens), the corrupted
prompt three other names; the metric is the logit difference (answer minus wrong answer) at the last
position, not normalised; the clean prompt runs and the corrupted one is the donor (EAP-IG's
convention, our ``direction="noise"``); batches of 10 (``--batch``). The same token ids reach every
side: EAP-IG gets the texts and tokenises them itself (``model.to_tokens(prepend_bos=True)``); the
worker checks that it gets our ids back.

Each (side, method) runs in a fresh process, one thread (``torch.set_num_threads(1)``,
``OMP_NUM_THREADS=1``): wall and CPU seconds of the attribution call alone (the model loaded and one
warm-up forward before it); the process's peak resident set (``ru_maxrss``, loading included) and the
peak above the loaded model (the high-water mark reset just before the call, minus the resident set
then). The sides:

- ours: ``interp.edge_scores(model, task, method="eap" | "eap-ig-inputs", steps=5, direction="noise",
  metric="raw-logit-diff", config=RunConfig(minibatch=10))`` (bootstrap CIs and stability included);
- EAP-IG: ``attribute(model, Graph.from_model(model), dataloader, metric, method="EAP" |
  "EAP-IG-inputs", ig_steps=5)``; its metric here is the logit difference summed over the batch, so
  that its score (summed over batches, divided by the number of items) is the mean over pairs, ours.
  EAP-IG's own notebooks pass ``logit_diff(mean=True, loss=True)``: scores -1/batch times these
  (the same ranking). EAP-IG writes ``device='cuda'`` into its allocations; this script replaces that
  literal in the installed copy with ``device=model.cfg.device`` (idempotent, said in the output);
- auto-circuit: ``mask_gradient_prune_scores(patchable_model(model, factorized=True,
  slice_output="last_seq", separate_qkv=True), dataloader, None, grad_function="logit",
  answer_function="avg_diff", mask_val=0.0)``, its EAP. Its loss is minus the batch's mean logit
  difference and the mask gradients add up over batches, so its score is -(pairs / batch) times ours
  (:func:`autocircuit_to_ours`), converted before the comparison.

Agreement: edge by edge by name (EAP-IG's names; ours and auto-circuit's converted), the largest difference
relative to the largest |score| of ours, and the share of edges within 1e-4 of it.

The circuit evaluation at MIB's 10 edge fractions (0.1% .. 100% of the edges by |score|): EAP-IG's
``Graph.apply_topn`` + ``evaluate_graph`` called 10 times on its EAP scores, timed in its own process
beside ours, ``faithfulness_curve`` on our EAP scores at the same fractions (:func:`bench_evaluation`).

The peers' virtualenvs (each beside a TransformerLens < 4, which ``interp`` cannot share):

    python tests/fetch_gpt2_bpe.py                    # GPT-2's tokenizer files into .cache/gpt2-bpe
    # EAP-IG (not on PyPI: a checkout of the GitHub repository hannamw/EAP-IG in .cache/peers/EAP-IG-src)
    python -m venv .cache/peers/eapig
    .cache/peers/eapig/bin/pip install torch==2.13.0 "transformer-lens==2.16.1" "datasets<3" "pyarrow<16" \\
        "fsspec<2024.10" matplotlib
    .cache/peers/eapig/bin/pip install --no-deps -e .cache/peers/EAP-IG-src
    # auto-circuit
    python -m venv .cache/peers/auto-circuit
    .cache/peers/auto-circuit/bin/pip install torch==2.13.0 "transformer-lens==2.16.1" "numpy<2" "datasets<3" \\
        "pyarrow<16" "fsspec<2024.10" auto-circuit==1.0.1

    OMP_NUM_THREADS=1 python analyses/bench_edges.py --out analyses/results/bench_edges.txt   # the headline
    python analyses/bench_edges.py --small --pairs 10                                        # a quick run
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / ".cache" / "peers"
BPE = Path(os.environ.get("INTERP_GPT2_BPE", ROOT / ".cache" / "gpt2-bpe"))
SEQ_LEN = 15  # BOS + the ioi template below
IOI_TEMPLATE = 2  # interp.probes.task.IOI_TEMPLATES[2]: "After [B] and [A] went to the [PLACE], ..."
RUNS = (  # (side, method), in the order they run
    ("ours", "eap"),
    ("ours", "eap-ig-inputs"),
    ("eapig", "EAP"),
    ("eapig", "EAP-IG-inputs"),
    ("autocircuit", "EAP"),
)
SAME = {"EAP": "eap", "EAP-IG-inputs": "eap-ig-inputs", "eap": "eap", "eap-ig-inputs": "eap-ig-inputs"}
LABEL = {"ours": "interp", "eapig": "EAP-IG", "autocircuit": "auto-circuit"}
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
WITHIN = 1e-4  # the agreement's relative tolerance
EAPIG_FILES = ("attribute.py", "attribute_node.py", "evaluate.py", "utils.py")
CUDA_LITERAL, DEVICE_EXPR = "device='cuda'", "device=model.cfg.device"
INSTALL = {
    "eapig": (
        "python -m venv .cache/peers/eapig && .cache/peers/eapig/bin/pip install torch==2.13.0 "
        '"transformer-lens==2.16.1" "datasets<3" "pyarrow<16" "fsspec<2024.10" matplotlib && '
        ".cache/peers/eapig/bin/pip install --no-deps -e <a checkout of GitHub's hannamw/EAP-IG>"
    ),
    "autocircuit": (
        "python -m venv .cache/peers/auto-circuit && .cache/peers/auto-circuit/bin/pip install torch==2.13.0 "
        '"transformer-lens==2.16.1" "numpy<2" "datasets<3" "pyarrow<16" "fsspec<2024.10" auto-circuit==1.0.1'
    ),
}
DEFAULT_PYTHON = {"eapig": PEERS / "eapig" / "bin" / "python", "autocircuit": PEERS / "auto-circuit" / "bin" / "python"}


# ---- measuring, in the worker (standard library only: the peers' venvs run this too) -------------


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def measured(fn):
    """``fn()`` and its costs: wall and CPU seconds; the process's peak RSS (``ru_maxrss``, everything
    before the call included) and the call's own peak above the resident set just before it (Linux's
    ``VmHWM``, reset through ``/proc/self/clear_refs``; without that, ``ru_maxrss`` minus the baseline)."""
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    resettable = os.path.exists("/proc/self/clear_refs")
    if resettable:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    base = _status_bytes("VmRSS") if os.path.exists("/proc/self/status") else peak_before
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    call_peak = _status_bytes("VmHWM") if resettable else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = max(peak_before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, call_peak)
    return out, {
        "seconds": wall,
        "cpu_seconds": cpu,
        "peak_bytes": peak,
        "base_bytes": base,
        "above_bytes": call_peak - base,
    }


# ---- the workers: one (side, method) each, in a fresh process ------------------------------------


def _pairs(work: Path) -> dict:
    return json.loads((work / "pairs.json").read_text())


def _save(work: Path, side: str, method: str, names: list[str], scores, logits, stats: dict, **extra) -> None:
    """The worker's scores and last-position logits to ``work``, its costs as JSON on stdout's last line."""
    import numpy as np

    np.savez(
        work / f"{side}-{method}.npz",
        names=np.array(names, dtype=str),
        scores=np.asarray(scores, dtype=np.float64),
        logits=np.asarray(logits, dtype=np.float32),
    )
    print(json.dumps({"side": side, "method": method, "edges": len(names), **stats, **extra}))


def _our_task(args):
    """Our side's work folder, model (one thread) and task, from the pairs every side reads."""
    import torch

    import interp
    from interp.probes.task import TaskProbe

    torch.set_num_threads(args.threads)
    work = Path(args._work)
    p = _pairs(work)
    model = interp.load_model(work / "model", device="cpu")
    task = TaskProbe.from_pairs(
        model, p["clean_ids"], p["corrupted_ids"], p["answer"], p["wrong"], framed=True, name="ioi", seed=0
    )
    return work, model, task


def worker_ours(args) -> None:
    import torch

    import interp
    from interp.names import eapig_name

    work, model, task = _our_task(args)
    with torch.no_grad():  # the warm-up forward, and the logits the sides compare
        logits = model(task.clean[: args.batch])[:, -1].float().numpy()
    ig = args._method != "eap"
    config = interp.RunConfig(minibatch=args.batch, **({} if args.n_boot is None else {"n_boot": args.n_boot}))
    run = lambda: interp.edge_scores(  # noqa: E731
        model,
        task,
        method=args._method,
        steps=args.steps if ig else None,
        direction="noise",
        metric="raw-logit-diff",
        config=config,
    )
    result, stats = measured(run)
    table = result.table
    names = [eapig_name(e) for e in table["edge"]]  # compared with the peers' by EAP-IG's names
    _save(work, "ours", args._method, names, table["score"].to_numpy(), logits, stats)


def worker_ours_evaluate(args) -> None:
    """Our circuit evaluation at MIB's fractions of the edges (by |EAP score|, our own EAP run's), timed
    as one call: :func:`interp.circuits.circuit.faithfulness_curve` without the refinement, every
    circuit extracted, pruned and evaluated by exact patching in batched replays."""
    import numpy as np
    import torch

    import interp
    from interp.circuits.circuit import faithfulness_curve

    work, model, task = _our_task(args)
    with torch.no_grad():
        model(task.clean[: args.batch])  # the warm-up forward
    saved = np.load(work / "ours-eap.npz")
    config = interp.RunConfig(minibatch=args.batch, **({} if args.n_boot is None else {"n_boot": args.n_boot}))
    run = lambda: faithfulness_curve(  # noqa: E731
        model, task, saved["scores"], fractions=MIB_FRACTIONS, refine=False, metric="raw-logit-diff", config=config
    )
    curve, stats = measured(run)
    rows = [
        {"fraction": float(r.fraction), "asked": int(r.size), "edges": int(r.n_edges), "metric": float(r.metric)}
        for r in curve.table.itertuples()
    ]
    out = {"side": "ours", "method": "evaluate", "rows": rows, "clean_metric": curve.meta["clean_metric"]}
    print(json.dumps({**out, **stats}))


def _tl_model(work: Path, threads: int):
    """GPT-2 from ``work/model`` in TransformerLens 2's ``HookedTransformer``, offline: the config read from
    the folder, the weights through TransformerLens's GPT-2 conversion, unprocessed; EAP-IG's flags set."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import AutoTokenizer, GPT2LMHeadModel

    torch.set_num_threads(threads)
    folder = str(work / "model")
    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    c = hf.config  # TransformerLens 2.16's own reader wants GPT2Config.n_ctx, gone from transformers 5
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_head=c.n_embd // c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        n_ctx=c.n_positions,
        d_vocab=c.vocab_size,
        eps=c.layer_norm_epsilon,
        act_fn=c.activation_function,
        normalization_type="LN",
        use_attn_scale=True,
        scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx,
        original_architecture="GPT2LMHeadModel",
        tokenizer_name=folder,
        default_prepend_bos=True,
        device="cpu",
        dtype=torch.float32,
    )
    model = HookedTransformer(cfg, AutoTokenizer.from_pretrained(folder), move_to_device=True)
    model.load_and_process_state_dict(
        convert_gpt2_weights(hf, cfg),
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    del hf
    model.eval()
    model.cfg.use_split_qkv_input = True
    model.cfg.use_attn_result = True
    model.cfg.use_hook_mlp_in = True
    return model


def _tl_logits(model, ids) -> object:
    import torch

    with torch.no_grad():
        return model(torch.tensor(ids))[:, -1].float().numpy()


def _eapig_loader(model, p: dict, batch: int):
    """EAP-IG's input: batches of (clean texts, corrupted texts, [answer, wrong] ids); its own
    tokenisation must give our token ids back."""
    import torch
    from torch.utils.data import DataLoader

    for what in ("clean", "corrupted"):
        got = model.to_tokens(p[what], prepend_bos=True, padding_side="right").tolist()
        if got != p[f"{what}_ids"]:
            bad = next(i for i, (a, b) in enumerate(zip(got, p[f"{what}_ids"])) if a != b)
            raise SystemExit(f"EAP-IG tokenises {what} prompt {bad} as {got[bad]}, not as ours {p[f'{what}_ids'][bad]}")
    rows = [(c, k, [a, w]) for c, k, a, w in zip(p["clean"], p["corrupted"], p["answer"], p["wrong"])]

    def collate(xs):
        clean, corrupted, labels = zip(*xs)
        return list(clean), list(corrupted), torch.tensor(labels)

    return DataLoader(rows, batch_size=batch, shuffle=False, collate_fn=collate)


def _logit_diff(logits, input_lengths, labels):
    """Answer minus wrong-answer logit at each prompt's last position: ``[batch]``."""
    import torch

    last = logits[torch.arange(logits.size(0)), input_lengths - 1]
    picked = torch.gather(last, -1, labels.to(last.device))
    return picked[:, 0] - picked[:, 1]


def worker_eapig(args) -> None:
    import torch
    from eap.attribute import attribute
    from eap.graph import Graph

    work = Path(args._work)
    p = _pairs(work)
    model = _tl_model(work, args.threads)
    loader = _eapig_loader(model, p, args.batch)
    logits = _tl_logits(model, p["clean_ids"][: args.batch])  # also the warm-up forward
    metric = lambda logits, clean_logits, input_lengths, labels: _logit_diff(logits, input_lengths, labels).sum()  # noqa: E731
    graph, graph_stats = measured(lambda: Graph.from_model(model))
    ig = args._method != "EAP"
    run = lambda: attribute(  # noqa: E731
        model, graph, loader, metric, method=args._method, ig_steps=args.steps if ig else None, quiet=True
    )
    _, stats = measured(run)
    if not ig:  # the scores the evaluation reads
        torch.save(graph.scores.detach().clone(), work / "eapig-EAP-scores.pt")
    scores = graph.scores.double()
    names = list(graph.edges)
    values = [float(scores[edge.matrix_index]) for edge in graph.edges.values()]
    _save(work, "eapig", args._method, names, values, logits, stats, graph_seconds=graph_stats["seconds"])


def worker_eapig_evaluate(args) -> None:
    """EAP-IG's circuit evaluation at MIB's fractions of the edges (by |EAP score|), timed as one call."""
    import torch
    from eap.evaluate import evaluate_baseline, evaluate_graph
    from eap.graph import Graph

    work = Path(args._work)
    p = _pairs(work)
    model = _tl_model(work, args.threads)
    loader = _eapig_loader(model, p, args.batch)
    _tl_logits(model, p["clean_ids"][: args.batch])  # the warm-up forward
    graph = Graph.from_model(model)
    graph.scores[:] = torch.load(work / "eapig-EAP-scores.pt")
    n_edges = len(graph.edges)
    metric = lambda logits, clean_logits, input_lengths, labels: _logit_diff(logits, input_lengths, labels)  # noqa: E731

    def evaluate_all():
        out = []
        for fraction in MIB_FRACTIONS:
            n = max(1, round(fraction * n_edges))
            graph.apply_topn(n, absolute=True)
            value = evaluate_graph(model, graph, loader, metric, quiet=True).mean().item()
            out.append({"fraction": fraction, "asked": n, "edges": int(graph.count_included_edges()), "metric": value})
        return out

    rows, stats = measured(evaluate_all)
    clean = evaluate_baseline(model, loader, metric).mean().item()
    print(json.dumps({"side": "eapig", "method": "evaluate", "rows": rows, "clean_metric": clean, **stats}))


AC_SRC = {"Resid Start": "input"}
AC_DEST = {"Resid End": "logits"}


def ac_name(name: str, dest: bool) -> str:
    """auto-circuit's node name as EAP-IG's: ``A3.7`` -> ``a3.h7``, ``A3.7.Q`` -> ``a3.h7<q>``, ``MLP 3`` ->
    ``m3``, ``Resid Start`` -> ``input``, ``Resid End`` -> ``logits``."""
    fixed = (AC_DEST if dest else AC_SRC).get(name)
    if fixed:
        return fixed
    if name.startswith("MLP "):
        return f"m{name[4:]}"
    parts = name[1:].split(".")
    return f"a{parts[0]}.h{parts[1]}" + (f"<{parts[2].lower()}>" if len(parts) == 3 else "")


def autocircuit_to_ours(score: float, pairs: int, batch: int) -> float:
    """auto-circuit's mask gradient of ``-mean over the batch`` of the logit difference, added up over
    ``pairs / batch`` batches, as our mean over pairs: ``-score * batch / pairs``."""
    return -score * batch / pairs


def worker_autocircuit(args) -> None:
    import torch
    from auto_circuit.data import PromptDataLoader, PromptDataset
    from auto_circuit.prune_algos.mask_gradient import mask_gradient_prune_scores
    from auto_circuit.utils.graph_utils import patchable_model

    work = Path(args._work)
    p = _pairs(work)
    model = _tl_model(work, args.threads)
    logits = _tl_logits(model, p["clean_ids"][: args.batch])  # also the warm-up forward
    clean, corrupted = torch.tensor(p["clean_ids"]), torch.tensor(p["corrupted_ids"])
    answers = [torch.tensor([a]) for a in p["answer"]]
    wrong = [torch.tensor([w]) for w in p["wrong"]]
    loader = PromptDataLoader(
        PromptDataset(clean, corrupted, answers, wrong), seq_len=None, diverge_idx=0, batch_size=args.batch
    )
    wrapped, graph_stats = measured(
        lambda: patchable_model(
            model, factorized=True, slice_output="last_seq", separate_qkv=True, device=torch.device("cpu")
        )
    )
    run = lambda: mask_gradient_prune_scores(  # noqa: E731
        wrapped, loader, None, grad_function="logit", answer_function="avg_diff", mask_val=0.0
    )
    scores, stats = measured(run)
    used = len(loader) * args.batch  # auto-circuit's loader drops a last partial batch
    names, values = [], []
    for e in wrapped.edges:
        names.append(f"{ac_name(e.src.name, False)}->{ac_name(e.dest.name, True)}")
        values.append(autocircuit_to_ours(float(scores[e.dest.module_name][e.patch_idx]), used, args.batch))
    _save(
        work,
        "autocircuit",
        args._method,
        names,
        values,
        logits,
        stats,
        pairs_used=used,
        graph_seconds=graph_stats["seconds"],
    )


WORKERS = {"ours": worker_ours, "eapig": worker_eapig, "autocircuit": worker_autocircuit}


# ---- the driver ---------------------------------------------------------------------------------


class Out:
    """Prints to stdout, and to ``path`` when given (the results file)."""

    def __init__(self, path: str | None):
        self.lines: list[str] = []
        self.path = path

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def save(self) -> None:
        if self.path:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            Path(self.path).write_text("\n".join(self.lines) + "\n")


def rel(path: Path | str) -> str:
    """``path`` relative to the repository where it lies inside it (no machine paths in the output)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def build_model(folder: Path, small: bool) -> dict:
    """GPT-2 small's shape (or the small one) with random weights, seed 0, and GPT-2's tokenizer, in ``folder``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Tokenizer

    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64) if small else GPT2Config()
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).eval().save_pretrained(folder)
    GPT2Tokenizer(str(BPE / "encoder.json"), str(BPE / "vocab.bpe")).save_pretrained(folder)
    shutil.copyfile(BPE / "encoder.json", folder / "vocab.json")  # the files GPT-2's own folder holds
    shutil.copyfile(BPE / "vocab.bpe", folder / "merges.txt")
    return {"layers": cfg.n_layer, "heads": cfg.n_head, "d_model": cfg.n_embd, "vocab": cfg.vocab_size}


def make_pairs(work: Path, n_pairs: int, seed: int) -> dict:
    """IOI pairs from ``interp``'s generator as token ids and as texts (without the BOS), to ``pairs.json``."""
    import interp
    from interp.probes.task import task_probe

    model = interp.load_model(work / "model", device="cpu")
    task = task_probe(model, "ioi", n_pairs=n_pairs, seed=seed, template=IOI_TEMPLATE)
    if task.seq_len != SEQ_LEN:
        raise SystemExit(f"the ioi template gave {task.seq_len} tokens, not {SEQ_LEN}")
    tok = model.tokenizer
    p = {
        "clean_ids": task.clean.tolist(),
        "corrupted_ids": task.corrupted.tolist(),
        "clean": [tok.decode(ids[1:]) for ids in task.clean.tolist()],
        "corrupted": [tok.decode(ids[1:]) for ids in task.corrupted.tolist()],
        "answer": task.answer[:, 0].tolist(),
        "wrong": task.wrong[:, 0].tolist(),
    }
    (work / "pairs.json").write_text(json.dumps(p))
    return p


def patch_eapig(python: str, out: Out) -> None:
    """Replace EAP-IG's ``device='cuda'`` with the model's device in the installed copy (idempotent)."""
    found = subprocess.run(
        [python, "-c", "import eap, os; print(os.path.dirname(eap.__file__))"], capture_output=True, text=True
    )
    if found.returncode != 0:
        raise SystemExit(
            f"EAP-IG does not import in {rel(python)}: {(found.stderr.strip().splitlines() or ['?'])[-1]}; "
            f"create its venv: {INSTALL['eapig']}"
        )
    where = Path(found.stdout.strip().splitlines()[-1])
    done = []
    for name in EAPIG_FILES:
        f = where / name
        text = f.read_text()
        n = text.count(CUDA_LITERAL)
        if n:
            f.write_text(text.replace(CUDA_LITERAL, DEVICE_EXPR))
        done.append(f"{name} {n}")
    total = sum(int(d.split()[-1]) for d in done)
    out(
        f"EAP-IG patched in its installed copy ({rel(where)}): {CUDA_LITERAL} -> {DEVICE_EXPR}, replaced "
        + (f"{total} ({', '.join(done)})" if total else "none (already patched)")
    )


def run_worker(python: str, args, side: str, method: str, work: Path, evaluate: bool = False) -> dict:
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1"}
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [python, __file__, "--_side", side, "--_method", "evaluate" if evaluate else method, "--_work", str(work)]
    cmd += ["--batch", str(args.batch), "--steps", str(args.steps), "--threads", threads]
    cmd += [] if args.n_boot is None else ["--n-boot", str(args.n_boot)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"side": side, "method": method, "error": " | ".join(tail)}
    return json.loads(done.stdout.strip().splitlines()[-1])


def agreement(work: Path, side: str, method: str) -> dict:
    """A peer's scores against ours, edge by edge by name."""
    import numpy as np

    ours = np.load(work / f"ours-{SAME[method]}.npz")
    theirs = np.load(work / f"{side}-{method}.npz")
    a = dict(zip(ours["names"].tolist(), ours["scores"].tolist()))
    b = dict(zip(theirs["names"].tolist(), theirs["scores"].tolist()))
    common = [k for k in a if k in b]
    x, y = np.array([a[k] for k in common]), np.array([b[k] for k in common])
    scale = float(np.abs(x).max())
    diff = np.abs(x - y) / scale
    fit = float(x @ y / (y @ y)) if float(y @ y) > 0 else float("nan")  # ours ~ fit * theirs
    return {
        "only_ours": len(a) - len(common),
        "only_theirs": len(b) - len(common),
        "max_rel": float(diff.max()),
        "within": float((diff <= WITHIN).mean()),
        "fit": fit,
        "scale": scale,
        "worst": common[int(diff.argmax())],
    }


def logits_check(work: Path, runs: dict) -> str:
    import numpy as np

    mine = np.load(work / "ours-eap.npz")["logits"]
    parts = []
    for (side, method), r in runs.items():
        if side != "ours" and "error" not in r:
            theirs = np.load(work / f"{side}-{method}.npz")["logits"]
            parts.append(f"{LABEL[side]} {method}: {float(np.abs(mine - theirs).max()):.1e}")
    return (
        f"largest |logit difference| from ours (last position, the first batch; logits of order {float(np.abs(mine).max()):.1f}): "
        + ("; ".join(parts) or "no peer ran")
    )


def bench_evaluation(args, python: str | None, work: Path, out: Out) -> dict:
    """Circuit evaluation at MIB's 10 edge fractions: EAP-IG's ``apply_topn`` + ``evaluate_graph`` on its EAP
    scores, 10 calls in one process, beside ours on our EAP scores (one ``faithfulness_curve`` call without
    the refinement), each in a fresh process; the CPU ratio is ours over EAP-IG's."""
    runs = {}
    if (work / "ours-eap.npz").exists():
        runs["ours"] = run_worker(sys.executable, args, "ours", "eap", work, evaluate=True)
    if python is not None and (work / "eapig-EAP-scores.pt").exists():
        runs["eapig"] = run_worker(python, args, "eapig", "EAP", work, evaluate=True)
    out()
    out(f"Circuit evaluation at MIB's {len(MIB_FRACTIONS)} edge fractions (by |EAP score|), logit difference")
    for side, r in runs.items():
        if "error" in r:
            out(f"  {LABEL[side]} evaluation: failed: {r['error']}")
    ok = {side: r for side, r in runs.items() if "error" not in r}
    if not ok:
        return runs
    head = f"{'fraction':>10}" + "".join(f"{LABEL[s] + ' edges':>16}{LABEL[s] + ' metric':>16}" for s in ok)
    out(head)
    for i, fraction in enumerate(MIB_FRACTIONS):
        cells = "".join(f"{r['rows'][i]['edges']:>16,}{r['rows'][i]['metric']:>16.4f}" for r in ok.values())
        out(f"{fraction:>10.1%}{cells}")
    for side, r in ok.items():
        ratio = ""
        if side == "ours" and "eapig" in ok and ok["eapig"]["cpu_seconds"] > 0:
            ratio = f" ({r['cpu_seconds'] / ok['eapig']['cpu_seconds']:.2f}x EAP-IG's CPU)"
        out(
            f"{LABEL[side]}: {r['cpu_seconds']:.1f} s CPU ({r['seconds']:.1f} s wall){ratio}; peak RSS "
            f"{r['peak_bytes'] / 1e9:.2f} GB, {r['above_bytes'] / 1e9:.2f} GB above the model; clean metric "
            f"{r['clean_metric']:.4f}"
        )
    out(
        "(edges: kept after pruning, ours of floor(f x edges) asked, EAP-IG's of round(f x edges); "
        "EAP-IG's metric on its EAP scores, ours on ours)"
    )
    return runs


def table(out: Out, runs: dict, agree: dict) -> None:
    ref = {m: runs.get(("eapig", m)) for m in ("EAP", "EAP-IG-inputs")}
    head = (
        f"{'side':<14}{'method':<15}{'edges':>8}{'CPU (s)':>10}{'wall (s)':>10}{'x EAP-IG':>10}"
        f"{'peak (GB)':>11}{'x':>7}{'above model':>13}{'x':>7}  agreement with ours"
    )
    out(head)
    out("-" * len(head))
    for (side, method), r in runs.items():
        if "error" in r:
            out(f"{LABEL[side]:<14}{method:<15}  failed: {r['error']}")
            continue
        base = ref.get("EAP" if SAME[method] == "eap" else "EAP-IG-inputs")
        ok = base is not None and "error" not in base
        ratio = lambda key: f"{r[key] / base[key]:.2f}" if ok and base[key] > 0 else "-"  # noqa: E731
        ag = agree.get((side, method))
        ag_text = (
            "-"
            if ag is None
            else f"max rel diff {ag['max_rel']:.1e}, {ag['within']:.1%} within {WITHIN:g}"
            + (
                f" (names: {ag['only_ours']} ours only, {ag['only_theirs']} theirs only)"
                if ag["only_ours"] or ag["only_theirs"]
                else ""
            )
        )
        out(
            f"{LABEL[side]:<14}{method:<15}{r['edges']:>8,}{r['cpu_seconds']:>10.1f}{r['seconds']:>10.1f}"
            f"{ratio('cpu_seconds'):>10}{r['peak_bytes'] / 1e9:>11.2f}{ratio('peak_bytes'):>7}"
            f"{r['above_bytes'] / 1e9:>13.2f}{ratio('above_bytes'):>7}  {ag_text}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=50, help="IOI pairs")
    p.add_argument("--batch", type=int, default=10, help="pairs per forward/backward (every side)")
    p.add_argument("--steps", type=int, default=5, help="EAP-IG-inputs' steps m")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per side")
    p.add_argument(
        "--n-boot", type=int, default=None, help="our bootstrap resamples (CIs and stability; default RunConfig's)"
    )
    p.add_argument("--seed", type=int, default=0, help="the IOI pairs' seed")
    p.add_argument("--small", action="store_true", help="a 2-layer d_model 64 random GPT-2 (a quick run)")
    p.add_argument("--peer-python-eapig", default=None, help="EAP-IG's venv's python (.cache/peers/eapig)")
    p.add_argument("--peer-python-autocircuit", default=None, help="auto-circuit's venv's python")
    p.add_argument("--skip-peers", action="store_true", help="run our side only")
    p.add_argument("--no-evaluation", action="store_true", help="skip the circuit evaluation timings")
    p.add_argument("--out", default=None, help="also write the output here (e.g. analyses/results/bench_edges.txt)")
    p.add_argument("--_side", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_method", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_work", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._side:
        if args._method == "evaluate":
            (worker_ours_evaluate if args._side == "ours" else worker_eapig_evaluate)(args)
        else:
            WORKERS[args._side](args)
        return

    if not all((BPE / f).is_file() for f in ("encoder.json", "vocab.bpe")):
        sys.exit(f"GPT-2's tokenizer files are not in {rel(BPE)}: run python tests/fetch_gpt2_bpe.py")
    python = {}
    if not args.skip_peers:
        for side, flag in (("eapig", args.peer_python_eapig), ("autocircuit", args.peer_python_autocircuit)):
            path = Path(flag) if flag else DEFAULT_PYTHON[side]
            if not path.exists():
                sys.exit(f"{LABEL[side]}'s venv is missing ({rel(path)}): create it with: {INSTALL[side]}")
            python[side] = str(path)

    import interp  # the driver makes the pairs with interp's generator; the peers' workers never import it

    out = Out(args.out)
    full = not args.small and (args.pairs, args.batch, args.steps, args.threads, args.n_boot) == (50, 10, 5, 1, None)
    out(f"bench_edges, {datetime.date.today().isoformat()}")
    if "eapig" in python:
        patch_eapig(python["eapig"], out)
    with tempfile.TemporaryDirectory(prefix="bench-edges-") as tmp:
        work = Path(tmp)
        (work / "model").mkdir()
        shape = build_model(work / "model", args.small)
        pairs = make_pairs(work, args.pairs, args.seed)
        default_boot = interp.RunConfig().n_boot
        L, H = shape["layers"], shape["heads"]
        edges = 0  # counted by the runs
        out(
            f"model: {'SMALL random GPT-2 (--small)' if args.small else 'GPT-2 small architecture'}, random weights "
            f"(seed 0): {L} layers x {H} heads, d_model {shape['d_model']}, vocab {shape['vocab']}"
        )
        out(
            f"task: {args.pairs} IOI pairs of {SEQ_LEN} tokens (BOS included), e.g. {pairs['clean'][0]!r} -> "
            f"{pairs['corrupted'][0]!r}; batch {args.batch}; EAP-IG-inputs steps {args.steps}; {args.threads} "
            "thread(s) per side; logit difference at the last position, clean run, corrupted donor"
            + (
                ""
                if full
                else "\nREDUCED setting (the headline: no --small, --pairs 50 --batch 10 --steps 5 --threads 1, no --n-boot)"
            )
        )
        out(f"load average (1 min) before: {os.getloadavg()[0]:.2f}")
        runs: dict = {}
        for side, method in RUNS:
            if side != "ours" and side not in python:
                continue
            r = run_worker(python.get(side, sys.executable), args, side, method, work)
            runs[(side, method)] = r
            if "error" in r:
                out(f"  {LABEL[side]} {method}: failed: {r['error']}")
            else:
                edges = r["edges"]
                built = f" (its graph built before, in {r['graph_seconds']:.1f} s)" if "graph_seconds" in r else ""
                out(
                    f"  {LABEL[side]} {method}: {r['cpu_seconds']:.1f} s CPU, {r['peak_bytes'] / 1e9:.2f} GB peak{built}"
                )
        agree = {}
        if ("ours", "eap") in runs and "error" not in runs[("ours", "eap")]:
            for (side, method), r in runs.items():
                if (
                    side != "ours"
                    and "error" not in r
                    and "error" not in runs.get(("ours", SAME[method]), {"error": 1})
                ):
                    agree[(side, method)] = agreement(work, side, method)
            out(logits_check(work, runs))
        out()
        out(
            f"sizes: {L} layers x {H} heads, {args.pairs} pairs x {SEQ_LEN} tokens, batch {args.batch}, "
            f"{args.threads} thread(s) per side, {edges:,} edges; our bootstrap resamples (CIs, stability): "
            f"{args.n_boot or f'{default_boot} (RunConfig default)'}"
        )
        table(out, runs, agree)
        out(
            "(time: the attribution call alone, CPU seconds, model loading excluded; x EAP-IG: the ratio to EAP-IG's "
            "same method; peak: the process's peak RSS, model included; above model: the call's peak above the RSS "
            "just before it)"
        )
        for (side, method), ag in agree.items():
            if ag["max_rel"] > WITHIN:
                out(
                    f"{LABEL[side]} {method} does not match ours: largest relative difference {ag['max_rel']:.1e} at "
                    f"{ag['worst']}; least-squares ours ~ {ag['fit']:.4f} x theirs"
                )
        if not args.no_evaluation:
            bench_evaluation(args, python.get("eapig"), work, out)
        out(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")
    out.save()


if __name__ == "__main__":
    main()
