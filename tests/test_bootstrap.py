"""Bootstrap intervals of pooled ratios: units without targets take no part, degenerate resamples
are dropped and counted, the interval covers a known score, and few units are flagged everywhere."""

import json

import pandas as pd
import pytest
import torch

import interp
from interp.scores import bootstrap_ratio, expanded_alpha, format_table

TRUE = 0.3


def synthetic(reps: int, n_seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``reps`` independent probes (columns) of ``n_seq`` sequences whose pooled score is ``TRUE``:
    each sequence holds 1-20 targets, its own mean mass drawn around TRUE (sequences differ), each
    target's mass drawn around that mean."""
    torch.manual_seed(seed)
    seq_mean = torch.distributions.Beta(3.0, 7.0).sample((n_seq, reps))  # mean 0.3
    n_targets = torch.randint(1, 21, (n_seq, reps)).double()
    mass = torch.distributions.Beta(seq_mean * 10, (1 - seq_mean) * 10).sample((20,)).double()
    taken = torch.arange(20)[:, None, None] < n_targets[None]
    return (mass * taken).sum(0), n_targets


def test_intervals_cover_a_known_score_at_their_level():
    num, den = synthetic(reps=2000, n_seq=50, seed=0)
    ci = bootstrap_ratio(num, den, n_boot=1000, seed=1)
    covered = float(((ci.lo <= TRUE) & (ci.hi >= TRUE)).double().mean())
    assert 0.93 <= covered <= 0.97, covered
    assert ci.units == 50 and ci.empty == () and ci.dropped == 0


def test_sequences_without_targets_leave_the_interval_as_it_was():
    num, den = synthetic(reps=500, n_seq=50, seed=2)
    alone = bootstrap_ratio(num, den, n_boot=1000, seed=3)
    # 20 target-less sequences (no target: nothing on either side of the ratio) mixed in among them
    where = torch.randperm(70, generator=torch.Generator().manual_seed(4))[:20].sort().values
    keep = torch.ones(70, dtype=torch.bool)
    keep[where] = False
    mixed_num, mixed_den = torch.zeros(70, 500, dtype=torch.float64), torch.zeros(70, 500, dtype=torch.float64)
    mixed_num[keep], mixed_den[keep] = num, den
    mixed = bootstrap_ratio(mixed_num, mixed_den, n_boot=1000, seed=3)
    for a, b in zip(alone, mixed):
        assert torch.equal(a, b)
    assert mixed.empty == tuple(where.tolist()) and mixed.units == 50 and mixed.dropped == 0
    covered = float(((mixed.lo <= TRUE) & (mixed.hi >= TRUE)).double().mean())
    assert 0.93 <= covered <= 0.97, covered


def test_a_resample_without_a_target_is_dropped_and_counted():
    # unit 0 has targets for column 0 only, unit 1 for column 1 only: a quarter of the resamples of
    # column 0 draw unit 1 twice and hold no target there
    num = torch.tensor([[0.8, 0.0], [0.0, 0.4]])
    den = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    ci = bootstrap_ratio(num, den, n_boot=1000, seed=0)
    assert 180 < ci.dropped < 320, ci.dropped
    assert ci.point.tolist() == pytest.approx([0.4, 0.4]) and ci.lo.tolist() == pytest.approx([0.4, 0.4])
    assert ci.hi.tolist() == pytest.approx([0.4, 0.4])  # not 0: the empty resamples count for nothing


def test_columns_without_targets_are_nan_and_the_expansion_shrinks_to_the_plain_quantile():
    ci = bootstrap_ratio(torch.zeros(3, 2), torch.tensor([[1.0, 0.0], [2.0, 0.0], [1.0, 0.0]]))
    assert ci.point[0] == 0 and torch.isnan(ci.point[1]) and torch.isnan(ci.lo[1]) and torch.isnan(ci.hi[1])
    assert expanded_alpha(0.95, 1) == pytest.approx(0.025)
    assert expanded_alpha(0.95, 10) < expanded_alpha(0.95, 50) < expanded_alpha(0.95, 5000) < 0.025
    assert expanded_alpha(0.95, 5000) == pytest.approx(0.025, abs=1e-4)


@pytest.fixture(scope="module")
def two_texts():
    model = interp.load_model("toy")
    texts = ["The cat sat on the mat. The cat sat on the mat.", "Dogs bark."]
    probe = interp.TokenProbe.from_texts(model, texts, padding="left")
    return interp.head_scores(model, probe)


def test_a_text_without_targets_does_not_drag_the_interval_to_zero(two_texts):
    row = two_texts.table.set_index("label").loc["1.2"]
    assert row["induction"] > 0.9 and row["induction_lo"] > 0.9, row  # was [0.0, 0.933]
    assert (two_texts.table["induction_lo"] > 0).all()
    assert (
        "induction: text 1 (of 2) has no target for this score and adds nothing to it or its interval, "
        "which rests on 1 text"
    ) in two_texts.meta["notes"]


def test_few_sequences_are_flagged_on_padded_probes_in_table_json_and_figure(two_texts, tmp_path):
    assert two_texts.n_sequences == 1 and two_texts.few_sequences  # 1 text holds induction targets
    text = format_table(two_texts.table, ["induction"], ci=["induction"], n_sequences=two_texts.n_sequences)
    assert text.splitlines()[-1].startswith("! CIs from 1 sequence: fewer than 5")
    _, js = two_texts.save(tmp_path)
    assert json.loads(js.read_text())["ci_warning"].startswith("! CIs from 1 sequence")
    titles = " ".join(a.text for a in two_texts.figure(["induction"]).layout.annotations)
    assert "CIs from 1 sequence (&lt; 5)" in titles


def signed_gaps(reps: int, n_pairs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``reps`` independent tasks (columns) of ``n_pairs`` pairs whose pooled effect is ``TRUE``: each
    pair's gap (its denominator) drawn around 1 with spread 1, so about one pair in six has a gap of
    the other sign and sizes differ; its numerator moves a share of its own gap drawn around TRUE."""
    g = torch.Generator().manual_seed(seed)
    gap = 1.0 + torch.randn(n_pairs, reps, generator=g, dtype=torch.float64)
    share = TRUE + 0.3 * torch.randn(n_pairs, reps, generator=g, dtype=torch.float64)
    return share * gap + 0.05 * torch.randn(n_pairs, reps, generator=g, dtype=torch.float64), gap


def test_pairs_whose_gaps_differ_in_sign_and_size_are_covered_at_their_level():
    num, den = signed_gaps(reps=2000, n_pairs=20, seed=0)
    assert 0.1 < float((den < 0).double().mean()) < 0.2  # the case under test: gaps of both signs
    # one task at a time, as patching pools it: every column (head) of a task shares the pairs' gaps
    lo, point, hi = torch.empty(2000), torch.empty(2000), torch.empty(2000)
    for task in range(2000):
        ci = bootstrap_ratio(num[:, task : task + 1], den[:, task : task + 1], n_boot=1000, seed=task)
        assert ci.units == 20 and ci.empty == () and ci.dropped == 0
        point[task], lo[task], hi[task] = ci.point[0], ci.lo[0], ci.hi[0]
    covered = float(((lo <= TRUE) & (hi >= TRUE)).double().mean())
    assert 0.93 <= covered <= 0.97, covered  # 0.9385
    # every estimate inside its own interval (resampling the pairs with a positive gap alone: 5 outside)
    assert bool(((lo <= point) & (point <= hi)).all())


def test_interval_bounds_print_with_the_values_decimals():
    frame = pd.DataFrame(
        {
            "label": ["0.1", "1.2", "2.3"],
            "effect": [0.0982, 12.5, 1.2e-05],
            "effect_lo": [0.07031, 3.217, 1e-06],
            "effect_hi": [0.1329, 20.01, 3.4e-05],
        }
    )
    lines = format_table(frame, ["effect"], ci=["effect"], fmt=".4g").splitlines()
    assert lines[1].split(None, 1)[1] == "0.0982 [0.0703, 0.1329]"  # was "0.0982 [0.07031, 0.1329]"
    assert lines[2].split(None, 1)[1].strip() == "12.5 [3.2, 20.0]"
    assert lines[3].split(None, 1)[1].strip() == "1.2e-05 [1e-06, 3.4e-05]"  # exponent form keeps fmt
    fixed = format_table(frame.head(1), ["effect"], ci=["effect"]).splitlines()[1]
    assert fixed.split(None, 1)[1] == "0.098 [0.070, 0.133]"


@pytest.mark.parametrize("n", [2, 3, 40, 1000])
def test_quantiles_from_the_tails_alone_equal_nanquantile_to_the_bit(n):
    from interp.scores import _quantiles, _tail_quantile

    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, 300, generator=gen, dtype=torch.float64)
    x[:, :100] = torch.randint(0, 4, (n, 100), generator=gen).double()  # ties
    alpha = expanded_alpha(0.95, 50)
    for q in (alpha, 1 - alpha, 0.0, 1.0, 0.1, 0.9):
        want = torch.nanquantile(x, q, dim=0)
        assert torch.equal(_tail_quantile(x, q), want), q
        assert torch.equal(_quantiles(x, [q])[0], want), q
    # a column with NaN takes the sort: NaN left out of its quantiles, as nanquantile has them
    x[: n // 2, 7] = float("nan")
    x[:, 8] = float("nan")
    lo, hi = _quantiles(x, (alpha, 1 - alpha))
    torch.testing.assert_close(lo, torch.nanquantile(x, alpha, dim=0), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(hi, torch.nanquantile(x, 1 - alpha, dim=0), rtol=0, atol=0, equal_nan=True)


def test_a_mean_skips_the_ratios_denominators_and_gives_the_same_interval_to_the_bit():
    # denominators of one (a mean, as bootstrap_mean asks) take the short path; of two, the ratio's
    # own: every pooled quotient is the same number, so the intervals are equal bit for bit
    num, _ = synthetic(reps=300, n_seq=40, seed=5)
    mean = bootstrap_ratio(num, torch.ones_like(num), n_boot=500, seed=2)
    ratio = bootstrap_ratio(2 * num, 2 * torch.ones_like(num), n_boot=500, seed=2)
    for a, b in zip(mean, ratio):
        assert torch.equal(a, b)
    assert mean.units == 40 and mean.dropped == 0 and bool((mean.hi > mean.lo).all())
