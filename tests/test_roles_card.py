"""A head's card: its role-table row, the tokens its OV circuit writes and suppresses (known for a
hand-set head), its strongest compositions in and out, and its pattern on one sequence."""

from __future__ import annotations

import pytest
import torch

from interp.config import RunConfig
from interp.errors import UsageError
from interp.heads import head_scores
from interp.probes import probe_from_tokens
from interp.report.roles import role_table
from interp.roles import composition_scores
from interp.roles.card import head_card, mean_write
from tests.test_roles_composition import induction_pair
from tests.test_roles_ov import SEQUENCE, roles_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_successor_head_writes_the_sequence_and_the_suppressor_suppresses_everything_evenly():
    model = roles_model()  # W_E = W_U = I: 0.0 has W_OV = -I, 0.1 the shift on SEQUENCE
    succ = mean_write(model, 0, 1)
    # the mean one-hot over the 63 ordinary tokens, shifted: 1/63 on SEQUENCE[1:], 0 elsewhere, centered
    want = torch.zeros(64, dtype=torch.float64)
    want[SEQUENCE[1:]] = 1 / 63
    torch.testing.assert_close(succ, want - want.mean())
    card = head_card(0, 1, model=model, top=3)
    assert {int(t) for t, _ in card["writes"]} <= set(SEQUENCE[1:])
    supp = mean_write(model, 0, 0)  # -mean one-hot: BOS (never averaged in) is the one token not pushed down
    assert int(torch.argmax(supp)) == 0


def test_card_gathers_scores_compositions_and_the_pattern():
    model = induction_pair()
    comp = composition_scores(model, n_random=50)
    probe = probe_from_tokens(model, torch.arange(1, 9)[None])
    scores = role_table(head_scores(model, probe, config=RunConfig(n_boot=20), copying=False), {})
    card = head_card(1, 0, roles=scores, model=model, compositions=comp, probe=probe, top=2)
    assert card["head"] == "1.0" and "prev_token" in card["scores"]
    strongest = card["composes_in"][0]
    assert (strongest["kind"], strongest["src"], strongest["dst"]) == ("K", "0.0", "1.0")
    assert card["composes_out"] == []  # the last layer feeds no later head
    assert len(card["pattern"]) == 9 and all(abs(sum(row) - 1) < 1e-2 for row in card["pattern"])


def test_unknown_head_is_refused():
    with pytest.raises(UsageError, match=r"no head 5.0 in toy: heads are LAYER.HEAD with layer < 2, head < 2"):
        mean_write(roles_model(), 5, 0)
