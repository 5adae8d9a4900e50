"""QK attribution on every conformance family it describes: the terms of random (query, key) pairs add
up to the model's own pre-softmax score, and the pattern computed from them equals Hugging Face's own
eager pattern, on a left-padded batch; the families it cannot describe are refused before any work,
in one line.

The pattern is the independent reference: the decomposed scores of every key of a few query rows,
put through the family's own softcap, window, padding and sink logits, against
``output_attentions=True`` of a second copy of the model that interp never touched.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from packaging.version import Version

from interp.adapters.base import padded_positions
from interp.errors import UsageError
from interp.roles.qk import qk_attribution, qk_terms
from tests.conformance import FAMILIES, TOL, build

DESCRIBED = "gpt2 gptj gpt_neox opt llama mistral mixtral qwen2 phi3 gemma2 gpt_oss qwen3 gemma3 olmo2".split()
REFUSED = {
    "bloom": "Hugging Face's attention interface",
    "qwen3_next": "sigmoid gate",
    "deepseek_v3": "latent attention",
    "bert": "post-LayerNorm",
    "roberta": "post-LayerNorm",
}
# Falcon's attention calls Hugging Face's attention interface from transformers 5.25 on
if Version(transformers.__version__) >= Version("5.25"):
    DESCRIBED.append("falcon")
else:
    REFUSED["falcon"] = "Hugging Face's attention interface"
pytestmark = pytest.mark.usefixtures("one_torch_thread")
T, PAD = 24, 5  # row 1 is left-padded by PAD positions


def test_every_family_is_either_described_or_refused():
    assert set(DESCRIBED) | set(REFUSED) >= set(FAMILIES) - {"gpt_oss_128", "gemma2_wide"}


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 200, (2, T), generator=gen)
    mask = torch.ones(2, T, dtype=torch.bool)
    mask[1, :PAD] = False
    tokens[1, :PAD] = 0
    return tokens, mask


def _rows(mask: torch.Tensor, window: int | None, queries: list[tuple[int, int]]) -> torch.Tensor:
    """Every key each query sees: ``(batch, query, key)`` rows."""
    rows = []
    for b, i in queries:
        lo = 0 if window is None else max(0, i - window + 1)
        rows += [(b, i, j) for j in range(lo, i + 1) if mask[b, j]]
    return torch.tensor(rows)


@pytest.mark.parametrize("family", DESCRIBED)
def test_terms_add_up_to_the_score_and_give_the_models_own_pattern(family):
    from interp.models import from_hf_model

    fam = FAMILIES[family]
    ref, _ = build(fam)
    hf, tok = build(fam)
    model = from_hf_model(hf, tok, name=family)
    tokens, mask = _batch()
    layer = fam.n_layers - 1
    with torch.no_grad():
        out = ref(tokens, attention_mask=mask.long(), position_ids=padded_positions(mask), output_attentions=True)
    want = out.attentions[layer].double()  # [batch, head, q, k]
    gen = torch.Generator().manual_seed(2)
    queries = [(b, int(i)) for b in (0, 1) for i in torch.randint(PAD + 2, T, (3,), generator=gen)]
    rows = _rows(mask, fam.windows[layer], queries)
    terms = qk_terms(model, tokens, layer, rows, attention_mask=mask)
    assert len(terms.components) >= 6  # embeddings, four heads, the rest: a real split
    summed = terms.score.sum((-1, -2))  # [n, head]
    # float32 rounding of the model's own q . k grows with the score: within TOL of each score's size
    assert ((summed - terms.model_score).abs() / terms.model_score.abs().clamp_min(1.0)).max() <= TOL
    assert terms.model_score.abs().max() > 1.0  # scores far from zero: the check has teeth
    # the pattern from the decomposed scores, through the family's own cap and sink
    capped = fam.softcap * torch.tanh(summed / fam.softcap) if fam.softcap else summed
    sink = _sinks(model, layer)
    for b, i in queries:
        at = (rows[:, 0] == b) & (rows[:, 1] == i)
        logits = capped[at]  # [keys, head]
        lse = torch.logsumexp(logits, 0)
        if sink is not None:
            lse = torch.logaddexp(lse, sink)
        got = torch.exp(logits - lse)
        ref_row = want[b, :, i, rows[at, 2]].T
        # both sides' logits carry float32 error within TOL of their size (the reference's too: qk-norm
        # families reach scores near 50), and a softmax moves no weight by more than its largest logit error
        size = max(1.0, float(terms.model_score[at].abs().max()))
        assert (got - ref_row).abs().max() <= TOL * size, (family, b, i)
        assert ref_row.max() > 0.2  # attention far from uniform


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3"])
def test_key_side_streamed_in_blocks_gives_the_contrast_of_every_key(family, monkeypatch):
    """Keys read 4 positions at a time, queries only where the targets are: no replay sees the
    whole sequence, and each target's contrast equals its score minus the mean of the model's own
    scores of the other keys its query sees (each key's score decomposed on its own)."""
    import interp.roles.qk_parts as qk_parts
    from interp.models import from_hf_model

    fam = FAMILIES[family]
    hf, tok = build(fam)
    model = from_hf_model(hf, tok, name=family)
    tokens, mask = _batch()
    layer = fam.n_layers - 1
    targets = torch.tensor([[0, 20, 3], [1, 22, 21], [1, 17, PAD]])
    seen, replayer = [], qk_parts.replayer

    def spy(*args):
        replay = replayer(*args)
        return lambda x, pos: (seen.append(x.shape[1]), replay(x, pos))[1]

    monkeypatch.setattr(qk_parts, "replayer", spy)
    monkeypatch.setattr(qk_parts, "KEY_BLOCK", 4)
    terms = qk_terms(model, tokens, layer, targets, attention_mask=mask)
    assert seen and max(seen) <= 2 * len(targets) < T  # the targets' positions, or a block of keys
    every = _rows(mask, fam.windows[layer], [(int(b), int(i)) for b, i, _ in targets])
    scores = qk_terms(model, tokens, layer, every, attention_mask=mask).model_score
    for n, (b, i, j) in enumerate(targets.tolist()):
        row = (every[:, 0] == b) & (every[:, 1] == i)
        own = row & (every[:, 2] == j)
        want = scores[own][0] - scores[row & ~own].mean(0)
        assert torch.allclose(terms.model_contrast[n], want, atol=1e-6), (family, n)
        assert torch.allclose(terms.contrast[n].sum((-1, -2)), want, atol=1e-4 * (1 + float(want.abs().max())))


def _sinks(model, layer: int) -> torch.Tensor | None:
    attn = model.blocks[layer].attn.original_component
    sinks = getattr(attn, "sinks", None)
    return None if sinks is None else sinks.detach().double()


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_refused_before_any_work_in_one_line(family):
    from interp.models import from_hf_model

    fam = FAMILIES[family]
    hf, tok = build(fam)
    model = from_hf_model(hf, tok, name=family)
    calls = [0]

    def count(module, args, kwargs):  # work: a block run on the batch (not the 2-token interface check)
        hidden = args[0] if args else next(iter(kwargs.values()), None)
        if not isinstance(hidden, torch.Tensor) or hidden.shape[0] == 2:
            calls[0] += 1

    for block in model.blocks:
        block.register_forward_pre_hook(count, with_kwargs=True)
    tokens, _ = _batch()
    with pytest.raises(UsageError) as e:
        qk_attribution(model, tokens, heads=f"{fam.attention_layers[-1]}.0", at="previous")
    message = str(e.value)
    assert REFUSED[family] in message and "refused" in message and "\n" not in message
    assert calls[0] == 0, message
