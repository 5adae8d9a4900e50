"""What the analyses need from a model, as one typed interface, and the behaviour both adapters share.

:class:`HookedModel` is the shape every public function takes as ``model``: a TransformerLens 4
``TransformerBridge`` or the bundled toy (both expose ``cfg``, ``blocks`` and ``run_with_hooks``).
:class:`Adapter` is what an analysis asks *of* such a model: describe it, run it with reducers
(stopping early), capture each layer's attention inputs while attention runs fused, name a head's
output, and what the ablation replay does to its modules (record and re-run its blocks, read logits
from the final residual, its stacked ``W_O``, the two exact shortcuts). :class:`HookedAdapter` implements all of it
through TransformerLens hook points and public torch APIs; the toy and bridge adapters add only what
their model does differently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.adapters.info import describe_model
from interp.adapters.surgery import logits_from_resid, recorded_blocks, reused_attention, run_blocks, trimmed_mlp
from interp.hooks import z_hook

if TYPE_CHECKING:
    from interp.adapters.info import ModelInfo

Hook = Callable[[Tensor, Any], Any]
HookList = list[tuple[str, Hook]]


@runtime_checkable
class HookedModel(Protocol):
    """A model with TransformerLens hook points: a ``TransformerBridge`` or the toy."""

    cfg: Any
    blocks: Any

    def run_with_hooks(self, *args: Any, **kwargs: Any) -> Any: ...

    def parameters(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclass
class AttentionInputs:
    """One layer's attention inputs as the model attends with them.

    The logit of query ``q`` for key ``k`` is, in this order (``interp.stream.blockwise.logits_tile``
    is the one function that applies it):

    1. ``s = scale * q . k``;
    2. ``s = softcap * tanh(s / softcap)`` when ``softcap`` is set (Gemma 2);
    3. ``s += bias_slopes[h] * (k - q)`` when ``bias_slopes`` is set (ALiBi; a per-row constant
       shift of Bloom's ``slope * k`` form, which the softmax does not see);
    4. ``-inf`` where the key is masked: right of the diagonal when ``causal``, at or before
       ``q - window`` when ``window`` is set (Hugging Face's band ``q - window < k <= q``), and at
       padded keys where ``key_mask`` is False.

    ``sink`` (GPT-OSS) is one learned logit per head that joins every row's softmax denominator
    without being a key: ``lse = logaddexp(lse over keys, sink[h])``, so the weights on real keys
    sum to ``1 - exp(sink[h] - lse)``, the share the sink absorbs.
    """

    layer: int
    q: Float[Tensor, "batch head pos d_head"]
    k: Float[Tensor, "batch kv_head pos d_head"]  # after rotary, grouped heads not repeated
    v: Float[Tensor, "batch kv_head pos d_head"]
    scale: float
    causal: bool
    window: int | None = None  # sliding window: keys q - window < k <= q
    softcap: float | None = None  # logit softcapping
    bias_slopes: Float[Tensor, " head"] | None = None  # ALiBi slopes
    sink: Float[Tensor, " head"] | None = None  # learned sink logits, in the denominator only
    key_mask: Bool[Tensor, "batch pos"] | None = None  # False at padded keys

    @property
    def plain(self) -> bool:
        """No window, softcap, bias, sink or padding: the fused kernels' fast case."""
        return (
            self.window is None
            and self.softcap is None
            and self.bias_slopes is None
            and self.sink is None
            and self.key_mask is None
        )


OnAttention = Callable[[AttentionInputs], None]
# the stream engine's own attention for what SDPA cannot do: (inputs with grad, inputs the callback
# gets, the callback) -> the output [batch, head, pos, d_v]; it calls the callback itself
Attend = Callable[[AttentionInputs, AttentionInputs, OnAttention], Tensor]


@runtime_checkable
class Adapter(Protocol):
    """Everything the analyses need from a model, whatever its architecture."""

    model: HookedModel

    def describe(self) -> ModelInfo:
        """Shape, special tokens, causality and device (see :class:`interp.adapters.info.ModelInfo`)."""
        ...

    def run_with_reducers(
        self,
        tokens: Int[Tensor, "batch pos"],
        fwd_hooks: Sequence[tuple[str, Hook]],
        *,
        stop_after: str | None = None,
        grad: bool = False,
        attention_mask: Bool[Tensor, "batch pos"] | None = None,
    ) -> Any:
        """Run with ``fwd_hooks``, ending the pass right after ``stop_after`` fires (``None`` then).

        ``attention_mask`` (False at padding) masks padded keys, and each token gets the position it
        has in its text alone (``cumsum(mask) - 1``), whichever side the rows are padded on."""
        ...

    def capture_attention(
        self, on_attention: OnAttention, attend: Attend | None = None
    ) -> AbstractContextManager[HookList]:
        """Within the block every attention layer calls ``on_attention`` and runs fused; yields the
        hooks the run must add. ``attend`` computes the layers whose attention SDPA cannot (a window,
        softcap, sink logits, padded keys); without it such a layer is refused."""
        ...

    def check_capture(self) -> None:
        """Raise :class:`~interp.errors.UsageError` unless :meth:`capture_attention` can work."""
        ...

    def release_patterns(self, layer: int) -> None:
        """Drop any attention pattern the model keeps for ``layer`` after its forward."""
        ...

    def head_output_hook(self, layer: int) -> str:
        """The hook that reads or replaces each head's output of ``layer`` (``[batch, pos, head, d_head]``)."""
        ...

    def reuse_attention(
        self,
        layer: int,
        clean: Float[Tensor, "batch pos d_model"],
        n_outputs: int | None,
        per_head: Float[Tensor, "batch pos head d_model"],
        ablate: Bool[Tensor, "rep head"] | Bool[Tensor, "rep head pos"],
    ) -> AbstractContextManager[None]:
        """Layer ``layer``'s attention returns the clean output plus the ablated heads' change."""
        ...

    def trim_mlp(self, layer: int, keep: Tensor, T: int) -> AbstractContextManager[None]:
        """Layer ``layer``'s MLP runs on positions ``keep`` only."""
        ...

    def block_count(self) -> int | None:
        """How many blocks the model has to replay (``None``: no ``blocks``)."""
        ...

    def record_blocks(
        self, n_layers: int, *, keep_attention: bool, detach_call: Callable[[tuple, dict], Any]
    ) -> AbstractContextManager[tuple[list, list]]:
        """Within the block every forward records each block's call and (``keep_attention``) its
        attention output: see :func:`interp.adapters.surgery.recorded_blocks`."""
        ...

    def run_blocks(
        self, hidden: Float[Tensor, "batch pos d_model"], start: int, calls: list[tuple[tuple, dict]]
    ) -> Float[Tensor, "batch pos d_model"]:
        """Blocks ``start, start + 1, ...`` on ``hidden``, one per recorded call: the final residual."""
        ...

    def can_unembed(self) -> bool:
        """Can :meth:`unembed` read logits from the final residual?"""
        ...

    def unembed(self, hidden: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos vocab"]:
        """Logits from the final residual, as the model's own forward makes them."""
        ...

    def stacked_W_O(self) -> Tensor | None:
        """``W_O`` of every layer, ``[layer, head, d_head, d_model]``, ``None`` where it cannot be read."""
        ...

    def can_trim_mlp(self, layer: int) -> bool:
        """Does block ``layer`` have an MLP module that :meth:`trim_mlp` can trim?"""
        ...


def padded_positions(attention_mask: Bool[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"]:
    """Each token's position in its text alone: ``cumsum(mask) - 1``, 0 at left padding.

    Hugging Face models given a mask but no position ids count positions from the row's first slot,
    so a left-padded text would be shifted by its padding.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


class _StopForward(Exception):
    """Raised from a hook to end a forward pass that has given all it was asked for."""


class HookedAdapter:
    """The shared implementation: TransformerLens hook points and public torch APIs only."""

    def __init__(self, model: HookedModel) -> None:
        self.model = model

    def describe(self) -> ModelInfo:
        return describe_model(self)

    @property
    def n_layers(self) -> int:
        return len(getattr(self.model, "blocks", []))

    # ---- running --------------------------------------------------------------------------------

    def cleanup_hooks(self) -> HookList:
        """Hooks added to every run (none here; the bridge frees the patterns it keeps)."""
        return []

    def release_patterns(self, layer: int) -> None:
        return None

    def after_run(self) -> None:
        """Called when a run ends, however it ends."""

    def run_with_reducers(
        self,
        tokens: Int[Tensor, "batch pos"],
        fwd_hooks: Sequence[tuple[str, Hook]],
        *,
        stop_after: str | None = None,
        grad: bool = False,
        attention_mask: Bool[Tensor, "batch pos"] | None = None,
    ) -> Any:
        hooks = [*fwd_hooks, *self.cleanup_hooks()]
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs, padding_hooks = self.padding_inputs(tokens, attention_mask)
            hooks = [*padding_hooks, *hooks]
        if stop_after is not None:

            def stop(_: Tensor, hook: Any) -> None:
                raise _StopForward

            hooks.append((stop_after, stop))  # registered last: fires after the reducers on that point
        with torch.set_grad_enabled(grad):
            try:
                return self.model.run_with_hooks(tokens, fwd_hooks=hooks, **kwargs)
            except _StopForward:
                return None
            finally:
                self.after_run()

    def padding_inputs(
        self, tokens: Int[Tensor, "batch pos"], attention_mask: Bool[Tensor, "batch pos"]
    ) -> tuple[dict[str, Any], HookList]:
        """What a padded run adds: keyword arguments of the forward, and hooks (the bridge's forward
        takes the mask and the position ids; see :func:`padded_positions`)."""
        mask = attention_mask.to(tokens.device)
        return {"attention_mask": mask.long(), "position_ids": padded_positions(mask)}, []

    # ---- capture (each adapter its own) -----------------------------------------------------------

    def capture_attention(
        self, on_attention: OnAttention, attend: Attend | None = None
    ) -> AbstractContextManager[HookList]:
        raise NotImplementedError

    def check_capture(self) -> None:
        with self.capture_attention(lambda _: None):
            pass

    # ---- heads and the replay's shortcuts --------------------------------------------------------

    def head_output_hook(self, layer: int) -> str:
        return z_hook(layer)

    @contextmanager
    def reuse_attention(
        self,
        layer: int,
        clean: Float[Tensor, "batch pos d_model"],
        n_outputs: int | None,
        per_head: Float[Tensor, "batch pos head d_model"],
        ablate: Bool[Tensor, "rep head"] | Bool[Tensor, "rep head pos"],
    ) -> Iterator[None]:
        with reused_attention(self.model.blocks[layer].attn, clean, n_outputs, per_head, ablate):
            yield

    @contextmanager
    def trim_mlp(self, layer: int, keep: Tensor, T: int) -> Iterator[None]:
        with trimmed_mlp(self.model.blocks[layer].mlp, keep, T):
            yield

    def can_trim_mlp(self, layer: int) -> bool:
        blocks = getattr(self.model, "blocks", None)
        return bool(blocks) and isinstance(getattr(blocks[layer], "mlp", None), torch.nn.Module)

    # ---- the replay: blocks, logits, W_O ----------------------------------------------------------

    def block_count(self) -> int | None:
        blocks = getattr(self.model, "blocks", None)
        return None if blocks is None else len(blocks)

    def record_blocks(
        self, n_layers: int, *, keep_attention: bool, detach_call: Callable[[tuple, dict], Any]
    ) -> AbstractContextManager[tuple[list, list]]:
        return recorded_blocks(
            getattr(self.model, "blocks", None), n_layers, keep_attention=keep_attention, detach_call=detach_call
        )

    def run_blocks(
        self, hidden: Float[Tensor, "batch pos d_model"], start: int, calls: list[tuple[tuple, dict]]
    ) -> Float[Tensor, "batch pos d_model"]:
        # the bridge would keep [rep * batch, head, T, T] alive: free each layer's pattern after it
        return run_blocks(self.model.blocks, hidden, start, calls, self.release_patterns)

    def can_unembed(self) -> bool:
        return hasattr(self.model, "ln_final") and hasattr(self.model, "unembed")

    def unembed(self, hidden: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos vocab"]:
        return logits_from_resid(self.model, hidden)

    def stacked_W_O(self) -> Tensor | None:
        try:
            W_O = getattr(self.model, "W_O", None)
        except (NotImplementedError, RuntimeError):  # TransformerLens refuses weights it cannot materialise
            return None
        info = self.describe()
        if isinstance(W_O, Tensor) and W_O.ndim == 4 and W_O.shape[0] == len(info.attention_layers) < info.n_layers:
            # a hybrid model: TransformerLens stacks its attention layers only; zeros elsewhere
            full = W_O.new_zeros(info.n_layers, *W_O.shape[1:])
            full[list(info.attention_layers)] = W_O
            return full
        return W_O


__all__ = [
    "padded_positions",
    "Adapter",
    "Attend",
    "AttentionInputs",
    "Hook",
    "HookList",
    "HookedAdapter",
    "HookedModel",
    "OnAttention",
]
