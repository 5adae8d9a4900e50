"""EAP edge scores equal a plain gradient loop, and exact edge scores a plain forward per edge, on the
Hugging Face model itself, on conformance families the graph describes (tests/conformance.py), on
randomly picked edges.

The reference never goes through interp. Per edge: the sender's output difference (donor - own) is
read off the Hugging Face modules (a head's: the output projection of its slice of the projection's
input; an MLP's: its output; the input: what enters layer 0); then one forward with the receiver
alone given ``input + e * difference`` (a head's queries, keys or values recomputed from its norm of
the moved input, a pre-rotary projection of its slice; an MLP's input from its norm; the final
norm's input for the logits) and one backward give ``d metric / d e`` at 0.
"""

from __future__ import annotations

import dataclasses
import random
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from interp.circuits import edge_scores, evaluate_circuits, graph_of
from interp.config import RunConfig
from interp.errors import UsageError
from interp.models import from_hf_model
from interp.patching.metrics import task_metric
from tests.conformance import N_HEADS, _submodule, build
from tests.test_patching_conformance import family_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@dataclass(frozen=True)
class Spec:
    """Where a family keeps what the reference moves (paths below one decoder layer, and the model)."""

    layers: str
    norm1: str
    norm2: str | None  # None: the MLP reads attention's norm (a parallel block sharing it)
    q: str
    k: str
    v: str
    o: str
    mlp: str  # the MLP's input module; its output module is ``mlp_out`` (default the same)
    final: str
    layout: str = "separate"  # one projection each; "blocks": one, [q heads | k heads | v heads];
    # "interleaved": one, [head][q, k, v] (NeoX, Bloom)
    mlp_out: str = ""
    post: str = ""  # the norm the attention output passes through before the residual (Gemma 2 and 3)

    def cols(self, site: str, j: int, n_heads: int, n_kv: int, d: int) -> slice:
        """Head (or key/value head) ``j``'s columns of ``site``'s projection output."""
        s = "qkv".index(site)
        if self.layout == "interleaved":
            start = (3 * j + s) * d
        elif self.layout == "blocks":
            start = ((0, n_heads, n_heads + n_kv)[s] + j) * d
        else:
            start = j * d
        return slice(start, start + d)


LLAMA = Spec(
    "model.layers",
    "input_layernorm",
    "post_attention_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp",
    "model.norm",
)
GEMMA = dataclasses.replace(  # the MLP reads its own pre-norm; what each sublayer adds is its post-norm's output
    LLAMA, norm2="pre_feedforward_layernorm", mlp_out="post_feedforward_layernorm", post="post_attention_layernorm"
)
SPECS = {
    "gpt2": Spec(
        "transformer.h", "ln_1", "ln_2", *["attn.c_attn"] * 3, "attn.c_proj", "mlp", "transformer.ln_f", "blocks"
    ),
    "gptj": Spec(
        "transformer.h",
        "ln_1",
        None,
        "attn.q_proj",
        "attn.k_proj",
        "attn.v_proj",
        "attn.out_proj",
        "mlp",
        "transformer.ln_f",
    ),
    "gpt_neox": Spec(
        "gpt_neox.layers",
        "input_layernorm",
        "post_attention_layernorm",
        *["attention.query_key_value"] * 3,
        "attention.dense",
        "mlp",
        "gpt_neox.final_layer_norm",
        "interleaved",
    ),
    "falcon": Spec(
        "transformer.h",
        "input_layernorm",
        None,
        *["self_attention.query_key_value"] * 3,
        "self_attention.dense",
        "mlp",
        "transformer.ln_f",
        "blocks",
    ),
    "opt": Spec(
        "model.decoder.layers",
        "self_attn_layer_norm",
        "final_layer_norm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.out_proj",
        "fc1",
        "model.decoder.final_layer_norm",
        mlp_out="fc2",
    ),
    "bloom": Spec(
        "transformer.h",
        "input_layernorm",
        "post_attention_layernorm",
        *["self_attention.query_key_value"] * 3,
        "self_attention.dense",
        "mlp.dense_h_to_4h",
        "transformer.ln_f",
        "interleaved",
        mlp_out="mlp.dense_4h_to_h",  # Bloom's MLP adds the residual itself
    ),
    "gpt_oss": LLAMA,
    "llama": LLAMA,
    "mistral": LLAMA,
    "mixtral": LLAMA,
    "qwen2": LLAMA,
    "qwen3": LLAMA,
    "gemma2": GEMMA,
    "gemma3": GEMMA,
    "phi3": Spec(
        "model.layers",
        "input_layernorm",
        "post_attention_layernorm",
        *["self_attn.qkv_proj"] * 3,
        "self_attn.o_proj",
        "mlp",
        "model.norm",
        "blocks",
    ),
}


class _Once:
    """A hook body that does not run again inside itself (it calls the module it hooks)."""

    def __init__(self) -> None:
        self.inside = False


def _senders(hf: Any, spec: Spec, tokens: torch.Tensor, n_heads: int) -> dict[str, torch.Tensor]:
    """Every sender's output on ``tokens`` (d_model each), from the Hugging Face modules."""
    layers = _submodule(hf, spec.layers)
    seen: dict[str, Any] = {}
    with ExitStack() as stack:

        def pre(name: str):
            def hook(module, args, kwargs):
                seen[name] = (args[0] if args else kwargs["hidden_states"]).detach()

            return hook

        def post(name: str):
            def hook(module, args, out):
                # a copy: Falcon adds the attention output into its MLP's output in place
                seen[name] = (out[0] if isinstance(out, tuple) else out).detach().clone()

            return hook

        stack.enter_context(_handle(layers[0].register_forward_pre_hook(pre("input"), with_kwargs=True)))
        for l, layer in enumerate(layers):
            stack.enter_context(
                _handle(_submodule(layer, spec.o).register_forward_pre_hook(pre(f"z{l}"), with_kwargs=True))
            )
            mlp_out = _submodule(layer, spec.mlp_out or spec.mlp)
            stack.enter_context(_handle(mlp_out.register_forward_hook(post(f"mlp.{l}"))))
            if spec.post:
                stack.enter_context(
                    _handle(_submodule(layer, spec.post).register_forward_pre_hook(pre(f"n{l}"), with_kwargs=True))
                )
                stack.enter_context(_handle(_submodule(layer, spec.post).register_forward_hook(post(f"p{l}"))))
        with torch.no_grad():
            hf(tokens)
    out = {"input": seen["input"]}
    for l, layer in enumerate(layers):
        o, z = _submodule(layer, spec.o), seen[f"z{l}"]
        d = z.shape[-1] // n_heads
        # a post-normed layer: each head's share of the norm's output, the norm's per-position,
        # per-dimension factor (output over input) applied to what the head adds to its input
        factor = seen[f"p{l}"] / seen[f"n{l}"] if spec.post else 1.0
        with torch.no_grad():
            base = o(torch.zeros_like(z))
            for h in range(n_heads):
                alone = torch.zeros_like(z)
                alone[..., h * d : (h + 1) * d] = z[..., h * d : (h + 1) * d]
                out[f"{l}.{h}"] = (o(alone) - base) * factor
        out[f"mlp.{l}"] = seen[f"mlp.{l}"].reshape(out["input"].shape)  # OPT: [batch * pos, d_model]
    return out


class _handle:
    def __init__(self, h):
        self.h = h

    def __enter__(self):
        return self.h

    def __exit__(self, *exc):
        self.h.remove()


def reference_eap(
    hf: Any,
    spec: Spec,
    task: Any,
    edge: str,
    n_heads: int,
    n_kv: int,
    d_head: int,
    *,
    exact: bool = False,
    noise: bool = False,
    point: list | None = None,
) -> float:
    """``d metric / d e`` at 0 (``exact``: the metric's change at ``e = 1``, the edge patched), the
    corrupted prompts run with the clean sender's output (``noise``: the other way round); ``point``:
    hooks moving the run the gradient is taken at (an integrated-gradients point)."""
    sender, receiver = edge.split("->")
    own, donor = (task.clean, task.corrupted) if noise else (task.corrupted, task.clean)
    delta = _senders(hf, spec, donor, n_heads)[sender] - _senders(hf, spec, own, n_heads)[sender]
    e = torch.ones(()) if exact else torch.zeros((), requires_grad=True)
    shift = e * delta
    layers = _submodule(hf, spec.layers)
    hooks: list = list(point or [])
    if receiver == "logits":
        hooks.append(
            (_submodule(hf, spec.final), "pre", lambda m, args, kwargs: ((args[0] + shift, *args[1:]), kwargs))
        )
    elif receiver.startswith("mlp."):
        layer = layers[int(receiver[4:])]
        norm = _submodule(layer, spec.norm2 or spec.norm1)
        seen, once = {}, _Once()
        hooks.append((norm, "pre", _keeper(seen, once)))

        def mlp_in(m, args, kwargs):
            once.inside = True
            moved = norm(seen["x"] + shift.reshape(seen["x"].shape))
            once.inside = False
            return (moved, *args[1:]), kwargs

        hooks.append((_submodule(layer, spec.mlp), "pre", mlp_in))
    else:
        head, site = receiver[:-3], receiver[-2]
        l, j = int(head.split(".")[0]), int(head.split(".")[1].lstrip("kv"))
        layer = layers[l]
        norm, proj = _submodule(layer, spec.norm1), _submodule(layer, getattr(spec, site))
        cols = spec.cols(site, j, n_heads, n_kv, d_head)
        seen, once = {}, _Once()
        hooks.append((norm, "pre", _keeper(seen, once)))

        def moved(m, args, out):
            if once.inside:
                return out
            once.inside = True
            change = proj(norm(seen["x"] + shift)) - proj(norm(seen["x"]))
            once.inside = False
            out = out.clone()
            out[..., cols] = out[..., cols] + change[..., cols]
            return out

        hooks.append((proj, "post", moved))
    with ExitStack() as stack:
        for module, kind, fn in hooks:
            h = (
                module.register_forward_pre_hook(fn, with_kwargs=True)
                if kind == "pre"
                else module.register_forward_hook(fn)
            )
            stack.enter_context(_handle(h))
        with torch.set_grad_enabled(not exact):
            logits = hf(own).logits
    metric, _ = task_metric(task)
    value = metric(metric.read(logits), own, None, None).mean()
    if exact:
        with torch.no_grad():
            base = metric(metric.read(hf(own).logits), own, None, None).mean()
        return float(value - base)
    (grad,) = torch.autograd.grad(value, e)
    return float(grad)


def _keeper(seen: dict, once: _Once):
    def hook(m, args, kwargs):
        if not once.inside:
            seen["x"] = args[0] if args else kwargs["hidden_states"]

    return hook


@pytest.mark.parametrize("family", list(SPECS))
def test_eap_equals_the_hugging_face_gradient_loop(family):
    hf_ref, _ = build(family)
    model = from_hf_model(*build(family), name=family)
    task = family_task(model, causal=True)
    r = edge_scores(model, task, metric="raw-logit-diff", config=RunConfig(n_boot=50))
    t = r.table.set_index("edge")
    assert len(t) == graph_of(model).n_edges
    shape = graph_of(model).shape
    d_head = getattr(hf_ref.config, "head_dim", None) or hf_ref.config.hidden_size // N_HEADS
    kv = "kv" if shape.group > 1 else ""
    j = min(1, shape.n_kv_heads - 1)
    picked = random.Random(family).sample(list(t.index), 8)
    picked += [f"0.1->1.{kv}{j}<k>", f"0.2->1.{kv}0<v>", "mlp.0->1.3<q>", "0.0->mlp.1", "input->mlp.0", "mlp.1->logits"]
    # a parallel block's MLP reads the residual its own layer's attention reads: no edge from those heads
    assert ("1.0->mlp.1" in t.index) == (not shape.parallel)
    for edge in picked:
        ref = reference_eap(hf_ref, SPECS[family], task, edge, N_HEADS, shape.n_kv_heads, d_head)
        assert t.loc[edge, "score"] == pytest.approx(ref, rel=1e-3, abs=1e-5), edge
    assert t.score.abs().max() > 1e-3


def _family(family: str) -> tuple[Any, Any, Any, Any]:
    """The family's reference Hugging Face model, the same weights loaded by interp, its task and graph."""
    hf_ref, _ = build(family)
    model = from_hf_model(*build(family), name=family)
    return hf_ref, model, family_task(model, causal=True), graph_of(model)


@pytest.mark.parametrize("family", list(SPECS))
def test_exact_edges_equal_the_hugging_face_loop(family):
    """Exact edge patching (the edge replay) against one plain Hugging Face forward per edge, the
    receiver's input moved by the sender's output difference, on randomly picked edges."""
    hf_ref, model, task, graph = _family(family)
    names, shape = list(graph.table().edge), graph.shape
    kv = "kv" if shape.group > 1 else ""
    picked = random.Random(f"exact {family}").sample(names, 8)
    picked += [f"0.1->1.{kv}{min(1, shape.n_kv_heads - 1)}<k>", "mlp.0->1.3<q>", "input->mlp.0", "mlp.1->logits"]
    r = edge_scores(model, task, method="exact", metric="raw-logit-diff", edges=picked, config=RunConfig(n_boot=50))
    t = r.table.set_index("edge")
    d_head = getattr(hf_ref.config, "head_dim", None) or hf_ref.config.hidden_size // N_HEADS
    for edge in picked:
        ref = reference_eap(hf_ref, SPECS[family], task, edge, N_HEADS, shape.n_kv_heads, d_head, exact=True)
        assert t.loc[edge, "score"] == pytest.approx(ref, rel=1e-3, abs=1e-5), edge
    assert t.loc[picked, "score"].abs().max() > 1e-3
    assert t.score.isna().sum() == len(names) - len(set(picked))


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3"])
def test_a_circuit_missing_one_edge_equals_the_hugging_face_forward_with_that_edge_corrupted(family):
    """Circuit evaluation (the clean prompts run, the corrupted senders read outside the circuit) on
    every edge but one equals one plain Hugging Face forward with that edge alone corrupted; on Gemma
    the sender's output is its share of the post-attention norm's output, that norm's scale the run's."""
    hf_ref, model, task, graph = _family(family)
    names, shape = list(graph.table().edge), graph.shape
    kv = "kv" if shape.group > 1 else ""
    picked = random.Random(f"circuit {family}").sample([n for n in names if n[0].isdigit()], 3)  # from a head
    picked += [f"0.1->1.{kv}{min(1, shape.n_kv_heads - 1)}<k>", "1.2->logits", "0.0->mlp.1"]
    masks = [np.array([n != edge for n in names]) for edge in picked]
    curve = evaluate_circuits(model, task, masks, metric="raw-logit-diff", config=RunConfig(n_boot=50))
    clean = curve.meta["clean_metric"]
    d_head = getattr(hf_ref.config, "head_dim", None) or hf_ref.config.hidden_size // N_HEADS
    moved = []
    for edge, got in zip(picked, curve.table.metric):
        ref = reference_eap(
            hf_ref, SPECS[family], task, edge, N_HEADS, shape.n_kv_heads, d_head, exact=True, noise=True
        )
        assert got - clean == pytest.approx(ref, rel=1e-3, abs=1e-5), edge
        moved.append(abs(ref))
    assert max(moved) > 1e-2


def _gemma_point(hf: Any, donor: torch.Tensor, node: str, alpha: float) -> list:
    """An EAP-IG-activations point on Gemma: one node's output at ``donor + alpha (own - donor)``:
    the input entering layer 0, a layer's post-attention norm's output (``z{l}``, its heads' writes
    together) or its post-feedforward norm's (``mlp.{l}``)."""
    layers = _submodule(hf, GEMMA.layers)
    if node == "input":
        seen = {}
        h = layers[0].register_forward_pre_hook(_keeper(seen, _Once()), with_kwargs=True)
        with torch.no_grad():
            hf(donor)
        h.remove()
        d = seen["x"].detach()

        def move(m, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            x = d + alpha * (x - d)
            return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

        return [(layers[0], "pre", move)]
    site = _submodule(layers[int(node[1:])], GEMMA.post if node[0] == "z" else GEMMA.mlp_out)
    seen = {}
    h = site.register_forward_hook(lambda m, a, out: seen.__setitem__("d", out.detach()))
    with torch.no_grad():
        hf(donor)
    h.remove()
    return [(site, "post", lambda m, a, out: seen["d"] + alpha * (out - seen["d"]))]


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_eap_ig_activations_on_gemma_moves_each_layers_post_normed_write(family):
    """EAP-IG-activations on a post-normed model: each point moves one node's write (the input, a
    layer's post-attention norm output, an MLP's post-feedforward norm output), against the gradient
    loop at each point on the Hugging Face model."""
    hf_ref, _ = build(family)
    model = from_hf_model(*build(family), name=family)
    task = family_task(model, causal=True)
    shape = graph_of(model).shape
    r = edge_scores(
        model, task, method="eap-ig-activations", steps=2, metric="raw-logit-diff", config=RunConfig(n_boot=50)
    )
    t = r.table.set_index("edge")
    d_head = hf_ref.config.head_dim
    nodes = ["input"] + [f"{k}{l}" for l in range(hf_ref.config.num_hidden_layers) for k in "zm"]
    points = [_gemma_point(hf_ref, task.clean, n, k / 2) for n in nodes for k in (1, 2)]
    picked = random.Random(f"ig {family}").sample(list(t.index), 3) + [
        "0.1->1.kv0<v>",
        "1.2->logits",
        "mlp.0->1.3<q>",
    ]
    for edge in picked:
        refs = [
            reference_eap(hf_ref, SPECS[family], task, edge, N_HEADS, shape.n_kv_heads, d_head, point=p) for p in points
        ]
        assert t.loc[edge, "score"] == pytest.approx(sum(refs) / len(refs), rel=1e-3, abs=1e-5), edge
    assert t.loc[picked, "score"].abs().max() > 1e-3


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_the_empty_circuit_on_the_mean_source_holds_every_post_normed_write_at_its_mean(family):
    """With nothing kept and the mean source, each receiver reads every sender at its mean over the
    corrupted prompts: the Hugging Face model with its input and each norm's output that the residual
    adds (post-attention and post-feedforward) held at their means, run on the clean prompts."""
    hf_ref, _ = build(family)
    model = from_hf_model(*build(family), name=family)
    task = family_task(model, causal=True)
    graph = graph_of(model)
    curve = evaluate_circuits(
        model,
        task,
        [np.zeros(graph.n_edges, dtype=bool)],
        source="mean",
        metric="raw-logit-diff",
        config=RunConfig(n_boot=50),
    )
    layers = _submodule(hf_ref, GEMMA.layers)
    sites = [layers[0]] + [_submodule(layer, n) for layer in layers for n in (GEMMA.post, GEMMA.mlp_out)]
    seen: dict[int, torch.Tensor] = {}

    def keep(i):
        def hook(module, args, kwargs, out=None):
            x = args[0] if args else kwargs["hidden_states"]
            seen[i] = (out if i else x).detach().mean(0, keepdim=True)

        return hook

    with ExitStack() as stack, torch.no_grad():
        stack.enter_context(_handle(sites[0].register_forward_pre_hook(keep(0), with_kwargs=True)))
        for i, site in enumerate(sites[1:], 1):
            stack.enter_context(_handle(site.register_forward_hook(keep(i), with_kwargs=True)))
        hf_ref(task.corrupted)
    with ExitStack() as stack, torch.no_grad():

        def hold(m, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            x = seen[0].expand_as(x)
            return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

        stack.enter_context(_handle(sites[0].register_forward_pre_hook(hold, with_kwargs=True)))
        for i, site in enumerate(sites[1:], 1):
            stack.enter_context(_handle(site.register_forward_hook(lambda m, a, out, i=i: seen[i].expand_as(out))))
        logits = hf_ref(task.clean).logits
    metric, _ = task_metric(task)
    want = float(metric(metric.read(logits), task.clean, None, None).mean())
    assert curve.table.metric.iloc[0] == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert abs(want - curve.meta["clean_metric"]) > 1e-2 and abs(want - curve.meta["corrupted_metric"]) > 1e-2


@pytest.mark.parametrize(
    "family, why",
    [
        ("deepseek_v3", "latent projection"),
        ("qwen3_next", "no softmax attention"),
        ("olmo2", "do not expose the attention's input norm"),
    ],
)
def test_families_the_graph_cannot_describe_are_refused_with_the_reason(family, why):
    model = from_hf_model(*build(family), name=family)
    with pytest.raises(UsageError, match=f"cannot describe {family} as a graph of edges: .*{why}"):
        edge_scores(model, family_task(model, causal=True))


def test_eap_runs_attention_fused_where_every_receiver_is_reached_and_gives_the_same_scores():
    """On a bridge whose attention calls Hugging Face's interface (Llama), EAP runs it fused: no
    pattern is ever formed (``hook_pattern`` never fires) and the scores are the eager run's; a joint
    q/k/v projection the bridge splits itself (GPT-2) keeps the model's own attention."""
    model = from_hf_model(*build("llama"), name="llama")
    task = family_task(model, causal=True)
    formed = []
    model.blocks[0].attn.hook_pattern.add_hook(lambda x, hook: formed.append(x.shape), is_permanent=True)
    fused = edge_scores(model, task, metric="raw-logit-diff", config=RunConfig(n_boot=50))
    # the one pattern formed is the check's: an eager forward of one sequence, to compare with
    assert fused.meta["attention"] == "fused (no pattern formed)" and [s[0] for s in formed] == [1] < [task.n_pairs]
    eager = edge_scores(model, task, metric="raw-logit-diff", config=RunConfig(n_boot=50, engine="pattern"))
    assert eager.meta["attention"] == "the model's own" and task.n_pairs in [s[0] for s in formed]
    scale = float(eager.table.score.abs().max())
    np.testing.assert_allclose(fused.table.score, eager.table.score, rtol=1e-4, atol=1e-5 * scale)
    gpt2 = from_hf_model(*build("gpt2"), name="gpt2")
    r = edge_scores(gpt2, family_task(gpt2, causal=True), metric="raw-logit-diff", config=RunConfig(n_boot=50))
    assert r.meta["attention"] == "the model's own"


@pytest.mark.parametrize("family", list(SPECS))
def test_the_receivers_norm_computed_directly_is_the_bridge_norm_bit_for_bit(family):
    """The edge replay forms each receiver's moved input itself and norms it through
    ``ReceiverNorms.computed``: on a bridge in its native mode that is the Hugging Face module, called
    once instead of through the bridge (which works out the statistics its hooks would see, then calls
    it). It must give exactly what the bridge gives, on every receiver norm of every family.
    Called directly, a bridge's LayerNorm (its own from-scratch forward) differs at rounding scale (5e-7
    on GPT-2's here), so the equality below fails if the choice is wrong."""
    from interp.adapters.receivers import ReceiverNorms

    model = from_hf_model(*build(family), name=family)
    graph = graph_of(model)
    norms = ReceiverNorms.of(model, graph.shape.mlp_layers)
    x = torch.randn(3, 5, model.cfg.d_model, generator=torch.Generator().manual_seed(0)) * 4 + 1
    modules = [norms.heads[0], norms.final, *(norms.mlps[l] for l in graph.shape.mlp_layers[:1])]
    with torch.no_grad():
        for module in modules:
            direct = norms.computed(module)
            assert torch.equal(direct(x), module(x)), type(module).__name__
            # the Hugging Face module where the bridge would return its output (RMS norms here); a
            # bridge that computes the norm itself (its LayerNorms) is called as it is
            assert (direct is not module) == module.use_native_layernorm_autograd
