"""Every engine on every architecture family equals Hugging Face's own attention, or refuses first.

One tiny random model per family (:mod:`tests.conformance`), built once per family and shared by
its checks. Each cell is one engine or analysis against an independent reference computed from the
Hugging Face model alone: its result must be within ``TOL`` (1e-5) of the reference, or an
:class:`interp.errors.InterpError` raised before any block ran, with one line that says what to
use instead. A raw library exception, a silent mismatch or a refusal after work fails.

:data:`KNOWN_STREAM_GAPS` lists the stream cells that fail today (strict xfail: when the stream
engine learns these features each must be switched on here, or the suite fails).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp.config import RunConfig
from tests.conformance import CHECKS, FAMILIES, TOL, prepare, run_check

KNOWN_STREAM_GAPS: dict[tuple[str, str], str] = {}  # none left: every stream cell is exact or refused first
# the families the issue names, plus the shipped windows that go silent or raw on the stream engine
REQUIRED = (
    "gpt2 gptj gpt_neox opt bloom falcon llama mistral mixtral qwen2 qwen3 qwen3_next gemma2 gemma3 phi3 "
    "olmo2 gpt_oss deepseek_v3 bert roberta"
).split()


def test_the_suite_covers_the_families_the_issue_names():
    assert set(REQUIRED) <= set(FAMILIES)
    assert all(f in FAMILIES and c in CHECKS for f, c in KNOWN_STREAM_GAPS)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one thread is fastest, and spares the other processes sharing the machine."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module", params=list(FAMILIES))
def setup(request, one_thread):
    torch.manual_seed(0)
    return prepare(request.param, block_len=10)


def _cell(setup, check):
    gap = KNOWN_STREAM_GAPS.get((setup.family.name, check))
    outcome = run_check(setup, check)
    if gap is not None:
        ok = outcome.status == "exact" or (outcome.status == "refused" and outcome.work == 0)
        if not ok:
            pytest.xfail(f"known stream gap: {gap} ({outcome})")
        pytest.fail(f"{setup.family.name} {check} now passes ({outcome}): remove it from KNOWN_STREAM_GAPS")
    return outcome


@pytest.mark.parametrize("check", CHECKS)
def test_engine_matches_hugging_face_or_refuses_first(setup, check):
    outcome = _cell(setup, check)
    if outcome.status == "refused":
        assert outcome.work == 0, f"refused after {outcome.work} block calls: {outcome.message}"
        assert "\n" not in outcome.message and " use " in f" {outcome.message}", outcome.message
        return
    assert outcome.status == "exact", f"{setup.family.name} {check}: {outcome}"
    assert outcome.error <= TOL
    fallbacks = [w for w in outcome.warnings if "falling back" in w]
    assert not fallbacks, f"the fast replay fell back: {fallbacks}"


# ---- the architecture facts behind the cells ------------------------------------------------------


def _bridge(family):
    from interp.models import from_hf_model
    from tests.conformance import build

    hf_model, tokenizer = build(family)
    return from_hf_model(hf_model, tokenizer, name=family)


def test_an_in_memory_tokenizer_with_a_bos_is_accepted():
    """TransformerLens reloads a tokenizer with a BOS from its name_or_path; an in-memory one has none."""
    from interp.models import describe
    from tests.conformance import build

    _, tokenizer = build("llama")
    assert tokenizer.bos_token is not None and "name_or_path" not in tokenizer.init_kwargs
    info = describe(_bridge("llama"))
    assert info.bos_token_id == tokenizer.bos_token_id


def test_hybrid_and_latent_attention_are_described():
    from interp.models import describe

    nxt = describe(_bridge("qwen3_next"))
    assert (nxt.attention_layers, nxt.absent_layers) == ((1,), (0,))
    mla = describe(_bridge("deepseek_v3"))
    assert (mla.d_head, mla.d_head_qk, mla.latent_attention, mla.v_layout) == (16, 24, True, "b h p d")


def test_a_head_of_a_linear_attention_layer_cannot_be_named():
    from interp.ablation import head_mask
    from interp.errors import AblationError

    model = _bridge("qwen3_next")
    with pytest.raises(AblationError, match="layer 0 has no softmax attention .*: name heads of layers 1"):
        head_mask(model, ["0.1"])
    assert head_mask(model, ["1.1"])[1, 1]


def test_latent_attention_has_no_copying_score():
    from interp.errors import UsageError
    from interp.heads import copying_scores, head_scores
    from interp.probes import repeated_tokens

    model = _bridge("deepseek_v3")
    with pytest.raises(UsageError, match="multi-head latent attention .*: pass copying=False"):
        copying_scores(model)
    with pytest.warns(UserWarning, match="copying column is NaN"):
        hs = head_scores(model, repeated_tokens(model, batch=2, block_len=6), config=RunConfig(n_boot=10))
    assert np.isnan(hs.grid("copying")).all() and not np.isnan(hs.grid("induction")).any()


def test_hybrid_copying_scores_sit_on_their_layers():
    from interp.heads import copying_scores

    grid = copying_scores(_bridge("qwen3_next"))
    assert grid.shape == (2, 4) and torch.isnan(grid[0]).all() and not torch.isnan(grid[1]).any()
