"""Head sets and what an ablated head outputs: the ablation kinds (zero, mean, resample, window), registered once.

:data:`ABLATIONS` maps each kind's name to its class; a new kind is one registered subclass of
:class:`HeadAblation` with ``fit`` and ``replacement``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from einops import rearrange
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.ablation.settings import checked
from interp.adapters import HookedModel, run_with_reducers
from interp.adapters.surgery import by_head
from interp.errors import AblationError
from interp.hooks import k_hook, pattern_hook, q_hook, v_hook, z_hook
from interp.models import ModelInfo, describe
from interp.probes import TokenProbe
from interp.registry import Registry


def head_mask(model: HookedModel | ModelInfo, heads: Any, *, allow_empty: bool = False) -> Bool[Tensor, "layer head"]:
    """A ``[n_layers, n_heads]`` boolean mask (True = ablate) from heads named any usual way.

    ``heads`` may be a boolean mask of that shape, an iterable of ``(layer, head)`` pairs or
    ``"layer.head"`` strings, or one comma-separated string (``"1.2,0.3"``). Raises :class:`AblationError` for a head out of range or, unless
    ``allow_empty``, for an empty set.
    """
    info = model if isinstance(model, ModelInfo) else describe(model)
    L, H = info.n_layers, info.n_heads
    if isinstance(heads, str):
        heads = [h for h in heads.split(",") if h.strip()]
    if isinstance(heads, (Tensor, np.ndarray)) and str(heads.dtype).endswith("bool"):
        mask = torch.as_tensor(heads.detach().cpu() if isinstance(heads, Tensor) else heads)
        if tuple(mask.shape) != (L, H):
            raise AblationError(f"a head mask must have shape [{L}, {H}] (layers x heads), got {list(mask.shape)}")
    else:
        mask = torch.zeros(L, H, dtype=torch.bool)
        for item in heads:
            layer, head = _parse_head(item)
            if not (0 <= layer < L and 0 <= head < H):
                raise AblationError(
                    f"head {layer}.{head} is out of range: the model has {L} layers x {H} heads "
                    f"(layers 0..{L - 1}, heads 0..{H - 1})"
                )
            mask[layer, head] = True
    absent = [l for l in getattr(info, "absent_layers", ()) if bool(mask[l].any())]
    if absent:
        raise AblationError(
            f"layer {absent[0]} has no softmax attention (a linear-attention layer), so it has no heads to "
            f"ablate: name heads of layers {', '.join(map(str, info.attention_layers))}"
        )
    if not allow_empty and not bool(mask.any()):
        raise AblationError("the head set is empty: name at least one head to ablate")
    return mask


def parse_heads(text: str) -> list[tuple[int, int]]:
    """Heads named in one comma-separated string (``"1.2,0.3"``), read without a model (the range is
    checked by :func:`head_mask` once one is loaded)."""
    return [_parse_head(h) for h in text.split(",") if h.strip()]


def _parse_head(item: Any) -> tuple[int, int]:
    if isinstance(item, str):
        parts = item.strip().split(".")
        if len(parts) == 2 and all(p.lstrip("-").isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
        raise AblationError(f"cannot read head {item!r}: write heads as 'layer.head', e.g. '1.3'")
    try:
        layer, head = item
        return int(layer), int(head)
    except (TypeError, ValueError):
        raise AblationError(f"cannot read head {item!r}: give (layer, head) pairs or 'layer.head' strings") from None


def head_labels(mask: Bool[Tensor, "layer head"]) -> list[str]:
    return [f"{l}.{h}" for l, h in mask.nonzero().tolist()]


class HeadAblation:
    """What an ablated head's ``hook_z`` is replaced by, for every layer: the base of the ablation kinds.

    Each kind (:data:`ABLATIONS`: :class:`ZeroAblation`, :class:`MeanAblation`,
    :class:`ResampleAblation`) is a small class with :meth:`fit` (take what it needs from the model
    on a probe) and :meth:`replacement` (the value for one layer); replacing heads, mixing and the forward
    hooks are shared here. ``HeadAblation.fit(model, "mean", probe)`` fits the kind named (as
    :func:`as_ablation` does); ``kind`` is the registered name.
    """

    kind: ClassVar[str] = ""
    paired: ClassVar[bool] = False  # takes its replacement from a paired prompt (a task probe only)
    site: ClassVar[str] = "z"  # the activation replaced (see SITES); the replay's shortcuts need "z"

    @classmethod
    def fit(
        cls,
        model: HookedModel,
        kind: str = "zero",
        probe: TokenProbe | Tensor | None = None,
        *,
        seed: int = 0,
        minibatch: int | None = None,
    ) -> HeadAblation:
        """The ablation of kind ``kind`` fitted on ``probe`` (the kinds' own ``fit`` take no kind)."""
        return ABLATIONS.get(checked(ABLATIONS, kind)).fit(model, probe, seed=seed, minibatch=minibatch)

    def replacement(self, layer: int, rows: Tensor | slice | None = None) -> Tensor:
        """What replaces ``hook_z`` of ``layer``: a scalar, ``[head, d_head]`` or ``[batch, pos, head, d_head]``."""
        raise NotImplementedError

    def replace_heads(
        self,
        z: Float[Tensor, "batch pos head d_head"],
        layer: int,
        ablate: Bool[Tensor, "rep head"] | Bool[Tensor, "rep head pos"],
        rows: Tensor | slice | None = None,
    ) -> Tensor:
        """``z`` with the heads in ``ablate`` replaced; the batch is ``rep`` copies of ``rows``. A mask
        with a position axis (``[rep, head, pos]``) replaces those heads at those positions only."""
        rep, heads = ablate.shape[:2]
        zh = by_head(z, heads)  # latent attention: TransformerLens's hook_z has the wrong head axis
        zz = zh.reshape(rep, z.shape[0] // rep, *zh.shape[1:])
        r = self.replacement(layer, rows).to(device=z.device, dtype=z.dtype)
        self._check_batch(r, zz.shape[1])
        return torch.where(_where(ablate.to(z.device)), r, zz).reshape(z.shape)

    def mix(
        self, z: Float[Tensor, "batch pos head d_head"], layer: int, gate: Tensor, rows: Tensor | slice | None = None
    ) -> Tensor:
        """``r + gate * (z - r)``: gate 1 keeps the head, 0 ablates it (gates broadcast over ``z``)."""
        r = self.replacement(layer, rows).to(device=z.device, dtype=z.dtype)
        self._check_batch(r, z.shape[0])
        zh = by_head(z, gate.shape[-2]) if gate.ndim >= 2 else z
        return (r + gate * (zh - r)).reshape(z.shape)

    def _check_batch(self, r: Tensor, batch: int) -> None:
        if r.ndim == 4 and r.shape[0] != batch:
            raise AblationError(
                f"resample ablation was fitted on {r.shape[0]} sequences but this run has "
                f"{batch}: run it on the probe it was fitted on"
            )

    def hook_name(self, layer: int) -> str:
        """The hook point whose activation this kind replaces (``hook_z`` unless the kind says)."""
        return z_hook(layer)

    def hooks(self, mask: Bool[Tensor, "layer head"], rows: Tensor | slice | None = None) -> list:
        """Forward hooks that ablate the heads in ``mask`` (for ``run_with_hooks`` / ``model.hooks``)."""
        return [
            (self.hook_name(l), self.layer_hook(l, mask[l][None], rows))
            for l in range(mask.shape[0])
            if bool(mask[l].any())
        ]

    def layer_hook(self, layer: int, ablate: Bool[Tensor, "rep head"], rows: Any) -> Callable:
        def hook(z: Tensor, hook: Any) -> Tensor:
            return self.replace_heads(z, layer, ablate, rows)

        return hook


def _where(ablate: Bool[Tensor, "rep head"] | Bool[Tensor, "rep head pos"]) -> Tensor:
    """``ablate`` broadcast against ``[rep, batch, pos, head, d_head]``."""
    if ablate.ndim == 3:
        return rearrange(ablate, "r h p -> r 1 p h 1")
    return rearrange(ablate, "r h -> r 1 1 h 1")


# runs one minibatch of a capture: (tokens, the capturing hooks, their rows in the probe)
Forward = Callable[[Tensor, list, Tensor], None]

ABLATIONS: Registry[type[HeadAblation]] = Registry("ablation")

# the activations a patch may replace: name -> (hook of a layer, what it holds)
SITES: Registry[Callable[[int], str]] = Registry("patching site")
SITES.add("z", "each head's output before W_O (hook_z)", z_hook)
SITES.add("q", "each head's queries (hook_q, before rotary)", q_hook)
SITES.add("k", "the keys (hook_k, before rotary; on GQA/MQA a key head serves a group of query heads)", k_hook)
SITES.add("v", "the values (hook_v; on GQA/MQA a value head serves a group of query heads)", v_hook)
SITES.add("pattern", "each head's attention pattern (hook_pattern; per position: a query's row)", pattern_hook)


def unpaired_ablations() -> tuple[str, ...]:
    """The kinds that run on any probe (not :attr:`HeadAblation.paired`): the ablation commands' choices."""
    return ABLATIONS.select(lambda e: not e.value.paired)


def _probe_tokens(kind: str, probe: TokenProbe | Tensor | None) -> Tensor:
    if probe is None:
        raise AblationError(f"{kind} ablation needs a probe to take the heads' outputs from")
    return probe.tokens if isinstance(probe, TokenProbe) else probe


@ABLATIONS.register("zero", "the head outputs 0 (Michel et al.'s head mask)")
@dataclass
class ZeroAblation(HeadAblation):
    """The head's output is set to 0; nothing to fit."""

    kind: ClassVar[str] = "zero"

    @classmethod
    def fit(  # type: ignore[override]
        cls,
        model: HookedModel,
        probe: TokenProbe | Tensor | None = None,
        *,
        seed: int = 0,
        minibatch: int | None = None,
    ) -> ZeroAblation:
        return cls()

    def replacement(self, layer: int, rows: Tensor | slice | None = None) -> Tensor:
        return torch.zeros(())


@ABLATIONS.register("mean", "the head outputs its mean over the probe (every sequence and position)")
@dataclass
class MeanAblation(HeadAblation):
    """The head's output is set to its mean over the probe: ``mean`` is ``[layer, head, d_head]``."""

    mean: Float[Tensor, "layer head d_head"]
    kind: ClassVar[str] = "mean"

    @classmethod
    def fit(  # type: ignore[override]
        cls,
        model: HookedModel,
        probe: TokenProbe | Tensor | None = None,
        *,
        seed: int = 0,
        minibatch: int | None = None,
    ) -> MeanAblation:
        zs = _captured_z(model, _probe_tokens(cls.kind, probe), minibatch)
        return cls(torch.stack([cls._reduce(z).to(zs[0].device) for z in zs]))  # layers may sit on several devices

    @staticmethod
    def _reduce(z: Float[Tensor, "batch pos head d_head"]) -> Tensor:
        return _mean_output(z)

    def replacement(self, layer: int, rows: Tensor | slice | None = None) -> Tensor:
        return self.mean[layer]


@dataclass
class PositionMeanAblation(MeanAblation):
    """The head's output at each position is set to its mean at that position over the prompts (a
    task's corrupted prompts, whose positions line up): ``mean`` is ``[layer, pos, head, d_head]``.
    It is what ``mean`` means on a task, for heads as for circuit evaluation's senders."""

    kind: ClassVar[str] = "position-mean"

    @staticmethod
    def _reduce(z: Float[Tensor, "batch pos head d_head"]) -> Tensor:
        return z.double().mean(0).to(z.dtype)


@ABLATIONS.register("resample", "the head outputs its clean output on another probe sequence (a seeded derangement)")
@dataclass
class ResampleAblation(HeadAblation):
    """The head's output is set to its clean output on a donor sequence of the probe.

    ``source`` holds, per layer, ``[batch, pos, head, d_head]``: for each probe sequence the clean
    output of its donor; ``donors[i]`` is sequence ``i``'s donor (a seeded derangement).
    """

    source: list[Float[Tensor, "batch pos head d_head"]]
    donors: list[int]
    kind: ClassVar[str] = "resample"

    @classmethod
    def fit(  # type: ignore[override]
        cls,
        model: HookedModel,
        probe: TokenProbe | Tensor | None = None,
        *,
        seed: int = 0,
        minibatch: int | None = None,
    ) -> ResampleAblation:
        tokens = _probe_tokens(cls.kind, probe)
        if tokens.shape[0] < 2:
            raise AblationError("resample ablation needs a probe of at least 2 sequences (one is the donor)")
        zs = _captured_z(model, tokens, minibatch)
        donors = derangement(tokens.shape[0], seed)
        return cls([z[donors] for z in zs], donors.tolist())

    def replacement(self, layer: int, rows: Tensor | slice | None = None) -> Tensor:
        return _donor_rows(self.source[layer], rows)


@ABLATIONS.register(
    "patch",
    "the head outputs its output on each sequence's paired prompt (activation patching: a task probe)",
)
@dataclass
class PatchAblation(HeadAblation):
    """The head's output is set to its output on the sequence's paired prompt: activation patching.

    ``source`` holds, per layer, ``[batch, pos, head, d_head]``: each sequence's donor run (its own
    pair's other prompt, e.g. the clean prompt when the corrupted one runs). Fitted on a probe that
    carries its donors (:meth:`interp.probes.task.TaskProbe.run_probe`).
    """

    source: list[Tensor]
    site: str = "z"  # type: ignore[misc]  # an instance's site (SITES), where the other kinds have "z"
    kind: ClassVar[str] = "patch"
    paired: ClassVar[bool] = True

    @classmethod
    def fit(  # type: ignore[override]
        cls,
        model: HookedModel,
        probe: TokenProbe | Tensor | None = None,
        *,
        seed: int = 0,
        minibatch: int | None = None,
        site: str = "z",
        forward: Forward | None = None,
    ) -> PatchAblation:
        """The donor run's activations at ``site`` (:data:`SITES`; default the head outputs). The
        queries, keys and values of latent attention come from a shared latent, not per head: refused.
        ``forward``: how each minibatch of donors runs with the capturing hooks (:func:`capture_site`)."""
        donor = getattr(probe, "donor", None)
        if donor is None:
            raise AblationError(
                "patch ablation takes each sequence's head outputs from its paired prompt: run it on a "
                "task probe (interp.probes.task.TaskProbe.run_probe), e.g. with interp.patch_heads"
            )
        refuse_site(model, site, donor[:1])
        return cls(capture_site(model, donor, minibatch, site, forward), site)

    def hook_name(self, layer: int) -> str:
        return SITES.get(self.site)(layer)

    def replacement(self, layer: int, rows: Tensor | slice | None = None) -> Tensor:
        return _donor_rows(self.source[layer], rows)

    def replace_heads(
        self,
        z: Tensor,
        layer: int,
        ablate: Bool[Tensor, "rep head"] | Bool[Tensor, "rep head pos"],
        rows: Tensor | slice | None = None,
    ) -> Tensor:
        """The site's activation with the masked heads' (at the masked positions) taken from the donor.
        Keys and values of a grouped model have fewer heads: a group's key/value head is patched when
        any query head of the group is masked."""
        if self.site == "z":
            return super().replace_heads(z, layer, ablate, rows)
        rep = ablate.shape[0]
        zz = z.reshape(rep, z.shape[0] // rep, *z.shape[1:])
        r = self.replacement(layer, rows).to(device=z.device, dtype=z.dtype)
        ablate = ablate.to(z.device)
        if self.site == "pattern":  # [batch, head, q, k]; a position is a query's row
            where = (
                rearrange(ablate, "r h p -> r 1 h p 1") if ablate.ndim == 3 else rearrange(ablate, "r h -> r 1 h 1 1")
            )
        else:  # [batch, pos, head, d]: query heads, or key/value heads on a grouped model
            n = z.shape[2]
            if ablate.shape[1] != n:
                ablate = ablate.reshape(rep, n, -1, *ablate.shape[2:]).any(2)
            where = _where(ablate)
        return torch.where(where, r, zz).reshape(z.shape)


@ABLATIONS.register(
    "window",
    "the head attends only to its first sink keys and its last window keys (StreamingLLM), its pattern "
    "renormalised over them; pattern engine: runs wherever a layer's whole pattern fits",
)
@dataclass
class WindowAblation(HeadAblation):
    """The head keeps only the sink + recent window of its KV cache: query ``q`` may attend to keys
    ``k < sink`` and ``q - window < k <= q``; its pattern is renormalised over them.

    It acts on ``hook_pattern`` (the softmax output, before it weights the values): the restricted
    heads' rows are multiplied by the allowed-key mask and divided by their remaining sum, which
    equals the softmax of the logits with every other key at ``-inf``. So it runs wherever the model
    forms its pattern (the pattern engine; the toy and the bridge form it when it is hooked), and its
    largest ``T`` is the pattern engine's: one layer's ``[batch, head, T, T]`` pattern must fit in
    memory. The sweep's fast replay and gradient importance replace head outputs, not patterns: they
    refuse it (use ``ablated(...)`` or ``replay="loop"``). Build it as ``WindowAblation(sink, window)``;
    fitted by name it takes ``sink`` 4 and ``window`` ``min(1024, T // 4)`` of the probe.
    """

    sink: int = 4
    window: int = 1024
    kind: ClassVar[str] = "window"

    def __post_init__(self) -> None:
        for name, low in (("sink", 0), ("window", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise AblationError(f"window ablation: {name} must be an integer >= {low}, got {value!r}")

    @classmethod
    def fit(  # type: ignore[override]
        cls,
        model: HookedModel,
        probe: TokenProbe | Tensor | None = None,
        *,
        seed: int = 0,
        minibatch: int | None = None,
    ) -> WindowAblation:
        if probe is None:
            return cls()
        T = probe.seq_len if isinstance(probe, TokenProbe) else probe.shape[-1]
        return cls(window=max(1, min(1024, T // 4)))

    def allowed(self, T: int, device: Any = None) -> Bool[Tensor, "q k"]:
        """Keys each query keeps: the first ``sink`` and the last ``window`` up to itself."""
        q = torch.arange(T, device=device)[:, None]
        k = torch.arange(T, device=device)[None, :]
        return (k <= q) & ((k < self.sink) | (k > q - self.window))

    def restrict(self, pattern: Float[Tensor, "batch head q k"], heads: Bool[Tensor, " head"]) -> Tensor:
        """``pattern`` with the rows of ``heads`` cut to the allowed keys and renormalised."""
        keep = self.allowed(pattern.shape[-1], pattern.device).to(pattern.dtype)
        cut = pattern * keep
        cut = cut / cut.sum(-1, keepdim=True).clamp_min(torch.finfo(pattern.dtype).tiny)
        return torch.where(heads.to(pattern.device)[None, :, None, None], cut, pattern)

    def replacement(self, layer: int, rows: Tensor | slice | None = None) -> Tensor:
        raise AblationError(
            "window ablation changes a head's attention pattern, not its output: run it with "
            "interp.ablated(...) or the sweep's replay='loop'"
        )

    def hooks(self, mask: Bool[Tensor, "layer head"], rows: Tensor | slice | None = None) -> list:
        """Hooks on ``hook_pattern`` of each layer with a restricted head."""

        def layer_hook(heads: Tensor) -> Callable:
            def hook(pattern: Tensor, hook: Any) -> Tensor:
                return self.restrict(pattern, heads)

            return hook

        return [(pattern_hook(l), layer_hook(mask[l])) for l in range(mask.shape[0]) if bool(mask[l].any())]


def as_ablation(
    ablation: str | HeadAblation,
    model: HookedModel,
    probe: TokenProbe | Tensor | None = None,
    *,
    seed: int = 0,
    minibatch: int | None = None,
) -> HeadAblation:
    """``ablation`` itself if already fitted, else the kind it names fitted on ``probe``."""
    if isinstance(ablation, HeadAblation):
        return ablation
    return HeadAblation.fit(model, ablation, probe, seed=seed, minibatch=minibatch)


def _donor_rows(source: Tensor, rows: Tensor | slice | None) -> Tensor:
    """A layer's donor activations, for the sequences ``rows`` of the probe (all of them for ``None``)."""
    return source if rows is None else source[rows]


def _mean_output(z: Float[Tensor, "batch pos head d_head"]) -> Float[Tensor, "head d_head"]:
    """A head's mean output over every sequence and position."""
    return z.double().mean(dim=(0, 1)).to(z.dtype)


def derangement(n: int, seed: int = 0) -> Int[Tensor, " n"]:
    """A seeded permutation of ``range(n)`` without fixed points (one random cycle)."""
    cycle = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    out = torch.empty(n, dtype=torch.long)
    out[cycle] = cycle.roll(-1)
    return out


def refuse_site(model: HookedModel, site: str, tokens: Tensor) -> None:
    """Refuse a site the model has no per-head activation at (the queries, keys and values of latent
    attention come from one shared latent), or whose hook the model's attention does not read back:
    a value written into it on one of ``tokens`` must change the output (BERT's bridge forms its
    pattern for the hook but attends with its own)."""
    checked(SITES, site)
    info = describe(model)
    if site in ("q", "k", "v") and info.latent_attention:
        raise AblationError(
            f"latent attention computes its keys and values from one latent shared by every head: there is "
            f"no per-head {site} to patch; patch the head outputs (site z) or patterns (site pattern)"
        )
    if site == "z":
        return
    first = info.attention_layers[0]

    def scramble(x: Tensor, hook: Any) -> Tensor:
        return x.flip(-1) * 2 + 1  # any other value: a model that reads it back changes its output

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a bridge warns that it discards the edit: what is tested here
        plain = run_with_reducers(model, tokens, [])
        written = run_with_reducers(model, tokens, [(SITES.get(site)(first), scramble)])
    if torch.equal(plain, written):
        raise AblationError(
            f"this model's attention does not read back what is written into {SITES.get(site)(first)} (the "
            f"hook shows the value but the attention uses its own): patching {site} cannot be done here; "
            "patch the head outputs (site z)"
        )


def _captured_z(model: HookedModel, tokens: Tensor, minibatch: int | None) -> list[Tensor]:
    """Every layer's ``hook_z`` on ``tokens``, unablated; the pass stops after the last layer's."""
    return capture_site(model, tokens, minibatch, "z")


def capture_site(
    model: HookedModel, tokens: Tensor, minibatch: int | None, site: str, forward: Forward | None = None
) -> list[Tensor]:
    """Every layer's activation at ``site`` (:data:`SITES`) on ``tokens``, unablated (whatever prompts
    they are: a probe, a task's clean or corrupted prompts); the pass stops after
    the last layer's, or, with ``forward``, is ``forward(batch, hooks, rows)`` with the capturing hooks
    (a caller that reads more of the same pass: the donor run's metric)."""
    info = describe(model)
    layers = info.attention_layers
    parts: dict[int, list[Tensor]] = {l: [] for l in layers}
    name = SITES.get(site)

    def grab(layer: int) -> Callable:
        def hook(x: Tensor, hook: Any) -> None:
            parts[layer].append((by_head(x.detach(), info.n_heads) if site == "z" else x.detach()).clone())

        return hook

    step = minibatch or tokens.shape[0]
    for start in range(0, tokens.shape[0], step):
        hooks = [(name(l), grab(l)) for l in layers]
        if forward is None:
            run_with_reducers(model, tokens[start : start + step], hooks, stop_after=name(layers[-1]))
        else:
            forward(tokens[start : start + step], hooks, torch.arange(start, min(start + step, tokens.shape[0])))
    # a layer without attention gets zeros: no head of it can be named (see head_mask)
    shape = torch.cat(parts[layers[0]]).shape
    return [
        torch.cat(parts[l]) if l in parts else torch.zeros(shape, device=parts[layers[0]][0].device)
        for l in range(info.n_layers)
    ]


@contextmanager
def ablated(
    model: HookedModel,
    heads: Any,
    *,
    ablation: str | HeadAblation = "zero",
    probe: TokenProbe | Tensor | None = None,
    seed: int = 0,
) -> Iterator[HeadAblation]:
    """Run ``model`` with ``heads`` silenced inside the ``with`` block::

        with ablated(model, ["1.2", "0.3"], ablation="mean", probe=probe):
            logits = model(probe.tokens)

    Mean and resample ablation take the heads' outputs from ``probe``; resample needs each run to
    be on the probe's own sequences.
    """
    mask = head_mask(model, heads)
    abl = as_ablation(ablation, model, probe, seed=seed)
    with model.hooks(fwd_hooks=abl.hooks(mask)):
        yield abl
